"""The small text-to-image model that ships with the pack (``embedded/weights``).

It is a LlamaGen text-to-image GPT and a LlamaGen VQ tokenizer in a small
configuration, with a word-level text encoder in place of flan-t5-xl, so it runs
through the same loader, adapter and decoder code as the real checkpoints.
``--model embedded`` (or the weights folder) selects it.
"""
from __future__ import annotations

import pathlib

import torch

from .checkpoints import CheckpointError, load_file, load_weights, read_json

FOLDER = pathlib.Path(__file__).resolve().parent.parent / "embedded" / "weights"
FORMAT = "spec_ar-embedded"


def is_embedded(path) -> bool:
    path = pathlib.Path(path)
    config = path / "config.json"
    return config.is_file() and read_json(config).get("format") == FORMAT


def load(folder=FOLDER, device="cpu", dtype=torch.float32):
    from ..decoders.vq16 import VQ16Decoder
    from ..embedded.text import TextEncoder
    from ..embedded.train import Recipe, gpt_spec, vq_spec
    from .base import LoadedModel
    from .llamagen import LlamaGenAdapter, LlamaGenGPT

    folder = pathlib.Path(folder)
    if not is_embedded(folder):
        raise CheckpointError(f"{folder}: no embedded model here (config.json with format {FORMAT!r}); "
                              "build it with `spec-ar train-embedded`")
    config = read_json(folder / "config.json")
    # folders trained before the decoder stage have LlamaGen's zero padding
    values = {"vq_decoder_padding": "zeros", **config["recipe"]}
    recipe = Recipe(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
    tensors = load_file(folder / "model.safetensors")
    part = {p: {k[len(p):]: v.float() for k, v in tensors.items() if k.startswith(p)} for p in ("gpt.", "vq.", "text.")}
    gpt = LlamaGenGPT(gpt_spec(recipe))
    load_weights(gpt, part["gpt."], folder / "model.safetensors", "the embedded GPT")
    text = TextEncoder(config["vocabulary"], dim=recipe.text_dim, layers=recipe.text_layers, max_length=recipe.words)
    load_weights(text, part["text."], folder / "model.safetensors", "the embedded text encoder")
    vq = VQ16Decoder.from_state_dict(part["vq."], vq_spec(recipe), device=device, dtype=dtype, source=str(folder))
    vq.model.set_decoder_padding(recipe.vq_decoder_padding)
    gpt = gpt.to(device=device, dtype=dtype).eval()
    text = text.to(device=device).eval()
    adapter = LlamaGenAdapter(gpt, recipe.grid, vq.codebook(), text)
    adapter.sampling_defaults = dict(config.get("sampling_defaults", adapter.sampling_defaults))
    return LoadedModel(family="embedded", name="embedded text-to-image (LlamaGen architecture, 64 px)",
                       adapter=adapter, decode=vq.decode, condition="text", resolutions=(recipe.size,),
                       info={"resolution": recipe.size, "grid": recipe.grid, "folder": str(folder),
                             "vocabulary": config["vocabulary"]},
                       decode_bytes_per_image=vq.bytes_per_image((recipe.grid, recipe.grid)),
                       modules={"gpt": gpt, "text": text, "vq": vq.model})
