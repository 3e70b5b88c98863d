"""Which family a checkpoint file or folder holds, judged by its contents."""
from __future__ import annotations

import pathlib
from dataclasses import dataclass

import torch

from ..formats.checkpoints import CheckpointError, peek, read_json

REQUIREMENTS = {
    "embedded": "the word 'embedded' or the embedded model's folder (config.json with format 'spec_ar-embedded')",
    "llamagen": "a LlamaGen GPT file (.pt/.pth/.safetensors holding tok_embeddings.weight and "
                "layers.N.attention.wqkv.weight), with its VQ tokenizer file (vq_ds16_*.pt) beside or given",
    "janus": "a Janus / Janus-Pro folder: config.json with model_type 'janus' (converted) or 'multi_modality' "
             "(deepseek-ai original), weights and tokenizer files",
    "lumina": "a Lumina-mGPT folder: config.json with model_type 'chameleon' and architectures "
              "ChameleonXLLMXForConditionalGeneration, weights, tokenizer, and Meta's VQGAN "
              "(tokenizer/vqgan.yaml + vqgan.ckpt) inside or given",
    "emu3": "an Emu3 folder in transformers' format (Emu3-Gen-hf): config.json with model_type 'emu3', weights "
            "(the VQ-VAE included) and tokenizer files",
    "anole": "an Anole / Chameleon folder, in transformers' format (config.json with model_type 'chameleon', "
             "weights, tokenizer) or Meta's (models/7b/consolidated.pth + params.json, tokenizer/text_tokenizer.json), "
             "with Meta's VQGAN (tokenizer/vqgan.yaml + vqgan.ckpt) inside or given",
}


@dataclass(frozen=True)
class Detected:
    family: str  # "llamagen", "janus"; "llamagen-vq" for a tokenizer file
    path: pathlib.Path
    detail: str = ""

    @property
    def condition(self) -> str:
        """What the model is conditioned on, known before loading: "class" or "text"."""
        return "class" if self.family == "llamagen" and self.detail == "c2i" else "text"


def _describe(keys: dict) -> str:
    names = sorted(keys)
    return f"{len(names)} tensors, e.g. {', '.join(names[:4])}" if names else "no tensors"


def classify_file(path: pathlib.Path) -> Detected | None:
    keys = peek(path)
    if "tok_embeddings.weight" in keys and any(k.endswith("attention.wqkv.weight") for k in keys):
        kind = "t2i" if "cls_embedding.uncond_embedding" in keys else "c2i"
        return Detected("llamagen", path, kind)
    if "quantize.embedding.weight" in keys and any(k.startswith("decoder.conv_blocks.") for k in keys):
        return Detected("llamagen-vq", path)
    return None


def detect(path: str | pathlib.Path) -> Detected:
    """The family of ``path``; one clear error listing what was found otherwise."""
    from . import embedded

    if str(path) == "embedded":
        return Detected("embedded", embedded.FOLDER)
    path = pathlib.Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or folder")
    if path.is_dir() and embedded.is_embedded(path):
        return Detected("embedded", path)
    found = ""
    if path.is_dir():
        from .chameleon_meta import is_meta_layout

        if is_meta_layout(path):  # before anything peeks into a 14 GB consolidated.pth
            return Detected("anole", path, "chameleon-meta")
        config = path / "config.json"
        if config.is_file():
            settings = read_json(config)
            model_type = settings.get("model_type")
            if model_type in ("janus", "multi_modality"):
                return Detected("janus", path, model_type)
            if model_type == "emu3":
                return Detected("emu3", path, model_type)
            if model_type == "chameleon":
                from .chameleon import flavour_of

                return Detected(flavour_of(settings), path, model_type)
            found = f"config.json with model_type {model_type!r}"
        else:
            files = sorted(p for p in path.iterdir() if p.suffix in (".pt", ".pth", ".safetensors", ".bin"))
            gpts = [d for p in files if (d := _try(p)) and d.family == "llamagen"]
            if len(gpts) == 1:
                return gpts[0]
            found = f"no config.json; {len(files)} checkpoint files" + (f", {len(gpts)} LlamaGen GPTs" if gpts else "")
    else:
        try:
            hit = classify_file(path)
        except CheckpointError as err:
            raise CheckpointError(f"{path}: not a model this pack recognises ({err}). {_needs()}") from err
        if hit is not None:
            if hit.family == "llamagen-vq":
                raise CheckpointError(f"{path}: this is a LlamaGen VQ tokenizer, not a model; give it as the VQ "
                                      "decoder and point the model at the GPT file")
            return hit
        found = _describe(peek(path))
    raise CheckpointError(f"{path}: not a model this pack recognises (found {found}). {_needs()}")


def _try(p: pathlib.Path) -> Detected | None:
    try:
        return classify_file(p)
    except (CheckpointError, RuntimeError, OSError):
        return None


def _needs() -> str:
    return "Supported: " + "; ".join(f"{family}: {need}" for family, need in REQUIREMENTS.items()) + "."


def find_vq(gpt_path: pathlib.Path) -> pathlib.Path | None:
    """A LlamaGen VQ tokenizer next to a GPT file, if exactly one is there."""
    hits = [p for p in sorted(gpt_path.parent.iterdir())
            if p != gpt_path and p.suffix in (".pt", ".pth", ".safetensors") and (d := _try(p))
            and d.family == "llamagen-vq"]
    return hits[0] if len(hits) == 1 else None


def load_model(path, vq=None, text_encoder=None, resolution=None, device="cpu", dtype=torch.float32,
               width=None, height=None):
    """Detect the family of ``path`` and load it as a :class:`~.base.LoadedModel`."""
    hit = detect(path)
    if hit.family in ("lumina", "anole"):
        from . import chameleon

        return chameleon.load(hit.path, vq, device, dtype, width or resolution, height or resolution)
    if width or height:  # the other families make square images
        if width and height and width != height:
            raise ValueError(f"width and height must be equal for {hit.family} models (got {width}x{height})")
        resolution = width or height
    if hit.family == "emu3":
        from . import emu3

        return emu3.load(hit.path, device, dtype, resolution)
    if hit.family == "llamagen":
        from . import llamagen

        vq = vq or find_vq(hit.path)
        return llamagen.load(hit.path, vq, text_encoder, resolution, device, dtype)
    if hit.family == "embedded":
        from . import embedded

        return embedded.load(hit.path, device, dtype)
    from . import janus

    return janus.load(hit.path, device, dtype)
