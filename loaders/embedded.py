"""The small text-to-image model that ships with the pack (``embedded/weights``).

It is a LlamaGen text-to-image GPT and a LlamaGen VQ tokenizer in a small
configuration, with a word-level text encoder in place of flan-t5-xl, so it runs
through the same loader, adapter and decoder code as the real checkpoints.
``--model embedded`` (or the weights folder) selects it.
"""
from __future__ import annotations

import pathlib

import torch

from ..decoders.vq16 import VQ16Decoder, VQSpec
from ..embedded.recipe import Recipe
from ..formats.checkpoints import CheckpointError, load_file, load_weights, read_json
from .family import Detected, Family
from .llamagen import GPTSpec, LlamaGenAdapter, LlamaGenGPT
from .storage import full_dtype, place

FOLDER = pathlib.Path(__file__).resolve().parent.parent / "embedded" / "weights"
#: its draft head (``spec-ar train-drafter``), which ``--drafter embedded`` selects
DRAFTER = FOLDER / "drafter"
#: its smaller sibling (``spec-ar train-embedded --sibling``), which ``--drafter embedded-sibling`` selects
SIBLING = FOLDER / "sibling"
FORMAT = "spec_ar-embedded"


def is_embedded(path) -> bool:
    path = pathlib.Path(path)
    config = path / "config.json"
    return config.is_file() and read_json(config).get("format") == FORMAT


# The recipe's architectures are built here, beside the GPT and VQ specs they fill
# in: embedded/recipe.py stays free of loaders/, which imports it.
def vq_spec(r: Recipe) -> VQSpec:
    return VQSpec(ch=r.vq_ch, ch_mult=r.vq_mult, enc_blocks=r.vq_enc_blocks, dec_blocks=r.vq_dec_blocks,
                  z_channels=r.vq_z, codebook_size=r.codebook, embed_dim=r.code_dim,
                  dec_mult=None if tuple(r.vq_dec_mult) == tuple(r.vq_mult) else tuple(r.vq_dec_mult))


def gpt_spec(r: Recipe) -> GPTSpec:
    ffn = -(-int(2 * 4 * r.dim / 3) // 256) * 256
    return GPTSpec(dim=r.dim, n_layer=r.layers, n_head=max(1, r.dim // 64), ffn_hidden=ffn, vocab_size=r.codebook,
                   kind="t2i", caption_dim=r.text_dim, cond_tokens=r.words)


def recipe_of(config: dict) -> Recipe:
    """The recipe a model folder's ``config.json`` records."""
    # folders trained before the padding fields existed have LlamaGen's zero padding
    # and decoders trained before cut-together batches and the wider decoder, neither
    values = {"vq_encoder_padding": "zeros", "vq_decoder_padding": "zeros", "vq_decoder_mix": 0.0,
              **config["recipe"]}
    values.setdefault("vq_dec_mult", values.get("vq_mult", Recipe.vq_mult))  # the encoder's
    return Recipe(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def load(folder=FOLDER, device="cpu", dtype=torch.float32):
    from ..embedded.text import TextEncoder
    from .base import LoadedModel

    folder = pathlib.Path(folder)
    if not is_embedded(folder):
        raise CheckpointError(f"{folder}: no embedded model here (config.json with format {FORMAT!r}); "
                              "build it with `spec-ar train-embedded`")
    config = read_json(folder / "config.json")
    recipe = recipe_of(config)
    tensors = load_file(folder / "model.safetensors")
    part = {p: {k[len(p):]: v.float() for k, v in tensors.items() if k.startswith(p)} for p in ("gpt.", "vq.", "text.")}
    gpt = LlamaGenGPT(gpt_spec(recipe))
    load_weights(gpt, part["gpt."], folder / "model.safetensors", "the embedded GPT")
    text = TextEncoder(config["vocabulary"], dim=recipe.text_dim, layers=recipe.text_layers, max_length=recipe.words)
    load_weights(text, part["text."], folder / "model.safetensors", "the embedded text encoder")
    vq = VQ16Decoder.from_state_dict(part["vq."], vq_spec(recipe), device=device, dtype=full_dtype(dtype, device),
                                     source=str(folder))
    vq.model.set_padding("encoder", recipe.vq_encoder_padding).set_padding("decoder", recipe.vq_decoder_padding)
    gpt = place(gpt, dtype, device).eval()
    text = text.to(device=device).eval()
    adapter = LlamaGenAdapter(gpt, recipe.grid, vq.codebook(), text)
    adapter.sampling_defaults = dict(config.get("sampling_defaults", adapter.sampling_defaults))
    return LoadedModel(family="embedded", name="embedded text-to-image (LlamaGen architecture, 64 px)",
                       adapter=adapter, decode=vq.decode, condition="text", resolutions=(recipe.size,),
                       info={"resolution": recipe.size, "grid": recipe.grid, "folder": str(folder), "recipe": recipe,
                             "vocabulary": config["vocabulary"]},
                       decode_bytes_per_image=vq.bytes_per_image((recipe.grid, recipe.grid)),
                       modules={"gpt": gpt, "text": text, "vq": vq.model})


FAMILY = Family(
    "embedded", detect=lambda path: Detected("embedded", path) if path.is_dir() and is_embedded(path) else None,
    needs="the word 'embedded' or the embedded model's folder (config.json with format 'spec_ar-embedded')",
    load=lambda hit, o: load(hit.path, o.device, o.storage or o.dtype))
