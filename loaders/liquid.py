"""Liquid (FoundationVision, weights Junfeng5/Liquid_V1_7B): Gemma-7B through transformers'
``GemmaForCausalLM``, its vocabulary grown by the VQGAN's codes, and Meta's Chameleon VQGAN.

The release is a plain transformers folder (``model_type: gemma``) whose tokenizer renames three of
Gemma's unused ids ``<boi>`` (7), ``<eoi>`` (8) and ``<unconditional>`` (9); that and the vocabulary
being larger than the tokenizer's tell it from Gemma.  Image token = ``len(tokenizer)`` + VQ code
(256000 + 0..8191); the VQGAN is not in the release (Liquid's script reads ``chameleon/vqgan.yaml`` and
``vqgan.ckpt``): it is found in the folder (``chameleon/``, ``tokenizer/``, ``vqgan/``), beside it, or
given.

Reference generation (FoundationVision/Liquid @4609c47, ``evaluation/inference_t2i.py`` and the ``sample``
of ``evaluation/T2I_Eval/genaibench_generation.py``): the prompt
``{prompt} Generate an image based on this description.<boi>`` tokenized with BOS (Gemma's tokenizer adds
it), the unconditional row ``<unconditional><boi>`` (with BOS), rows left-padded and batched; exactly 1024
image tokens (32 x 32, 512 px), nothing forced, no end token; guidance on raw logits
``u + 7.0 (c - u)``, text ids masked, temperature 0.99, then top-k 4096 and top-p 0.96.

Gemma's activation: transformers since 4.39 runs the tanh approximation of GELU for ``hidden_act: gelu``
unless the config names ``hidden_activation``; Liquid was trained on 4.39.2, which honours
``hidden_activation`` where set, so a config that sets it runs that activation here too.
"""
from __future__ import annotations

import json
import pathlib

import torch

from ..formats.checkpoints import CheckpointError, from_pretrained, read_json, tokenizer_from_pretrained
from ..sampling.adapter import TokenLayout
from .family import Detected, Family, LoadOptions, transformers_config
from .hf_cache import TransformersAdapter
from .storage import full_dtype, place

SUFFIX = " Generate an image based on this description.<boi>"
UNCONDITIONAL = "<unconditional><boi>"
MARKERS = ("<boi>", "<unconditional>")  # Liquid's renamed Gemma specials: what sets its tokenizer apart
SIZE, GRID = 512, 32  # the reference decodes a 32 x 32 grid only
SEARCH = ("chameleon", "tokenizer", "vqgan")  # where the VQGAN is looked for, in the folder and beside it


def tokenizer_names(folder: pathlib.Path) -> set[str]:
    """The added tokens' names in a folder's tokenizer files (``tokenizer.json``'s ``added_tokens``,
    ``tokenizer_config.json``'s ``added_tokens_decoder``), read as JSON only."""
    names = set()
    tokenizer, settings = folder / "tokenizer.json", folder / "tokenizer_config.json"
    if tokenizer.is_file():
        try:
            names |= {t.get("content") for t in json.loads(tokenizer.read_text(encoding="utf-8"))
                      .get("added_tokens", [])}
        except (ValueError, AttributeError):
            pass
    if settings.is_file():
        names |= {t.get("content") for t in (read_json(settings).get("added_tokens_decoder") or {}).values()
                  if isinstance(t, dict)}
    return names


class LiquidAdapter(TransformersAdapter):
    no_negative = "Liquid has no negative prompt (its unconditional row is fixed): leave it empty"
    guidance = "linear"
    sampling_defaults = {"cfg_scale": 7.0, "temperature": 0.99, "top_k": 4096, "top_p": 0.96}

    def __init__(self, model, tokenizer, grid: tuple[int, int] = (GRID, GRID), codebook: torch.Tensor | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.inner, self.head = model.model, model.lm_head
        self.device = next(model.parameters()).device
        self.vocab_size = model.config.vocab_size
        self.text_ids = len(tokenizer)  # the reference's offset: code = id - len(tokenizer)
        if self.vocab_size <= self.text_ids:
            raise CheckpointError(f"the vocabulary ({self.vocab_size}) has no ids past the tokenizer's "
                                  f"{self.text_ids}: no image tokens")
        self.codes = self.vocab_size - self.text_ids
        self.image_ids = torch.arange(self.text_ids, self.vocab_size)
        self.bos = tokenizer.bos_token_id
        self.codebook = codebook
        rows, cols = grid
        self.layout = TokenLayout.raster(rows, cols, self.vocab_size, self.image_ids, {}, cols, rows * cols)
        self.cache = None

    def prompt_ids(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt + SUFFIX).input_ids

    def unconditional_ids(self) -> list[int]:
        return self.tokenizer(UNCONDITIONAL).input_ids

    def token_vectors(self):
        if self.codebook is None:
            return None
        return self.image_ids.clone(), self.codebook.to(self.device)

    def codes_of(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens - self.text_ids


def load_model(folder, device="cpu", dtype=torch.float32, tokenizer=None):
    """``(GemmaForCausalLM, tokenizer)``: read in the files' own dtype (memory-mapped), then converted or
    quantized a tensor at a time (``storage.place``); ``tokenizer``: the folder's, if already loaded."""
    from transformers import GemmaForCausalLM
    from transformers.activations import ACT2FN

    folder = pathlib.Path(folder)
    tokenizer = tokenizer or tokenizer_from_pretrained(folder)
    model = from_pretrained(GemmaForCausalLM, folder, "a Liquid (Gemma) model", "auto")
    activation = read_json(folder / "config.json").get("hidden_activation")
    if activation:  # what transformers 4.39.2 (Liquid's) runs where the config names it
        if activation not in ACT2FN:
            raise CheckpointError(f"{folder}: config.json's hidden_activation {activation!r} is not an activation "
                                  "transformers knows")
        for layer in model.model.layers:
            layer.mlp.act_fn = ACT2FN[activation]
    model = place(model, dtype, device).eval()
    embed = model.model.embed_tokens
    if isinstance(getattr(embed, "embed_scale", None), torch.Tensor):
        # sqrt(hidden) was computed when the model was built in the files' dtype (bfloat16: 5.656 -> 5.656250);
        # Gemma's reference multiplies in the weights' dtype, exact in float32
        embed.embed_scale = torch.tensor(model.config.hidden_size ** 0.5, device=embed.embed_scale.device)
    return model, tokenizer


def find_liquid_vqgan(folder: pathlib.Path, vq=None):
    """``(vqgan.yaml, vqgan.ckpt)``: given (a folder or either file), or in the model folder or beside it."""
    from ..decoders.vqgan import find_vqgan

    if vq:
        vq = pathlib.Path(vq)
        return find_vqgan(vq if vq.is_dir() else vq.parent)
    for base in (folder, folder.parent):
        for where in (base, *(base / name for name in SEARCH)):
            found = find_vqgan(where)
            if found:
                return found
    return None


def load(folder, vq=None, device="cpu", dtype=torch.float32, resolution: int | None = None):
    """A :class:`~.base.LoadedModel` for a Liquid folder and Meta's VQGAN (``vq``: its folder or either file;
    found in the folder's ``chameleon/``, ``tokenizer/`` or ``vqgan/``, or beside the folder, when not given)."""
    from ..decoders.vqgan import VQGANDecoder
    from .base import LoadedModel

    folder = pathlib.Path(folder)
    if resolution not in (None, SIZE):
        raise ValueError(f"Liquid generates {SIZE}x{SIZE} images only (got {resolution})")
    where = find_liquid_vqgan(folder, vq)
    if where is None:
        raise CheckpointError(f"{folder}: Liquid needs Meta's Chameleon VQGAN to make images (vqgan.yaml and "
                              "vqgan.ckpt, not part of the release; Liquid's script reads them from chameleon/): "
                              "put them in the folder's chameleon/ or give --vq FOLDER" + (f" ({vq} has neither)"
                                                                                            if vq else ""))
    decoder = VQGANDecoder.load(*where, device=device, dtype=full_dtype(dtype, device))
    tokenizer = tokenizer_from_pretrained(folder)
    vocab = read_json(folder / "config.json").get("vocab_size")
    if not isinstance(vocab, int) or vocab - len(tokenizer) != decoder.spec.n_embed:  # before the weights are read
        raise CheckpointError(f"{where[1]}: the VQGAN has {decoder.spec.n_embed} codes but {folder} has "
                              f"{vocab - len(tokenizer) if isinstance(vocab, int) else 'no'} image tokens (config.json "
                              f"vocab_size {vocab} - {len(tokenizer)} ids of the tokenizer)")
    model, tokenizer = load_model(folder, device, dtype, tokenizer)

    def build(res: int) -> LoadedModel:
        if res != SIZE:
            raise ValueError(f"Liquid generates {SIZE}x{SIZE} images only (got {res})")
        adapter = LiquidAdapter(model, tokenizer, codebook=decoder.codebook())

        def decode(tokens: torch.Tensor) -> torch.Tensor:
            return decoder.decode(adapter.codes_of(tokens))

        return LoadedModel(family="liquid", name=f"Liquid ({folder.name})", adapter=adapter, decode=decode,
                           condition="text", resolutions=(SIZE,), resize=build,
                           info={"resolution": SIZE, "grid": adapter.layout.grid, "vq": str(where[1])},
                           modules={"liquid": model, "vqgan": decoder.model},
                           decode_bytes_per_image=decoder.bytes_per_image(adapter.layout.grid))

    return build(SIZE)


def _detect(path: pathlib.Path) -> Detected | None:
    settings = transformers_config(path) or {}
    if settings.get("model_type") != "gemma":
        return None
    return Detected("liquid", path, "gemma") if set(MARKERS) <= tokenizer_names(path) else None


def _load(hit: Detected, o: LoadOptions):
    return load(hit.path, o.vq, o.device, o.storage or o.dtype, o.resolution)


FAMILY = Family(
    "liquid", detect=_detect, load=_load,
    needs="a Liquid folder (Junfeng5/Liquid_V1_7B): config.json with model_type 'gemma', weights, and the "
          "tokenizer with <boi> and <unconditional>; with Meta's VQGAN (vqgan.yaml + vqgan.ckpt) in its chameleon/ "
          "or given")
