"""Lumina-mGPT 2.0 (Alpha-VLLM, weights Alpha-VLLM/Lumina-mGPT-2.0): a 7B Chameleon-architecture model
trained from scratch, with SBER-MoVQGAN 270M (``decoders/movqgan.py``) as its image tokenizer.

The release is a folder in the authors' fork of transformers' Chameleon (``model_type: chameleon``, their
q/k norms stored one row per model-parallel shard, as Lumina-mGPT's: read by ``chameleon.load_model``) with
a Qwen2.5-sized tokenizer to which Chameleon's specials were added (``<racm3:break>`` 151665, ``<eoss>``
151666, ``<reserved08799>`` 151670, the size tokens).  Image token = 155000 + MoVQGAN code (16384 codes:
155000..171383), ids no vocabulary entry names: a Chameleon-architecture vocabulary reaching past 155000 tells
it from Lumina-mGPT and Anole (65536 ids).  The MoVQGAN is not in the release: the reference reads
``movqgan/270M/movqgan_270M.ckpt`` (ai-forever/MoVQGAN); it is found there, in the folder, beside it, or given.

Reference generation (Alpha-VLLM/Lumina-mGPT-2.0 @f44a4d7, ``inference_solver.py`` and
``generate_examples/generate.py``, defaults of ``scripts/sample.sh``): BOS (the tokenizer's EOS when it has
none) and the turn ``Generate an image of {w}x{h} according to the following prompt:\\n{prompt}`` +
``<reserved08706>`` encoded as one text (where the pad id the reference's ``generate`` takes from the release's
configuration is the BOS, transformers masks BOS out: so here, ``generation_config.masked_id``); the model then writes
``<racm3:break>`` and the two size tokens ``<reserved{8800 + side / 32}>`` (height, width), ``H = h / 8`` rows
of ``W = w / 8`` codes each closed by ``<reserved08799>`` (forced) and ``<eoss>`` (forced). Here
``<racm3:break>`` ends the prompt and the size tokens are forced to the requested size (the **departure**, as
for Lumina-mGPT: the reference samples them). The unconditional branch is ``<racm3:break>`` and the size tokens
only, its own cache rows. Guidance ``u + s (c - u)`` on raw logits from the first image token, with the
reference's schedule: at the ``n``-th token after ``<racm3:break>`` (the size tokens count) ``s = max(4, s (1 -
n / (H W / 4)))``, carried from token to token; a scale above 4 falls to 4 over the first few dozen tokens, one
below 4 reads as 4, and 1 turns guidance off (:func:`guidance_schedule`). Defaults: cfg 4, image top-k 4096,
temperature 1, 768 px.
"""
from __future__ import annotations

import pathlib

import torch

from ..formats.checkpoints import CheckpointError, read_json, tokenizer_from_pretrained
from ..sampling.adapter import TokenLayout
from .chameleon import (END_OF_TURN, IMAGE_END, IMAGE_START, LUMINA_EOL, LUMINA_TEMPLATE, LUMINA2_IMAGE_BASE,
                        SIZE_UNIT, is_lumina2, size_token)
from .family import Detected, Family, LoadOptions, transformers_config
from .generation_config import masked_id
from .hf_cache import TransformersAdapter
from .storage import full_dtype

PATCH = 8  # pixels per image token (MoVQGAN's downsampling)
SIZES = (512, 768, 1024)
DEFAULT_SIZE = 768
MIN_SCALE = 4.0  # the reference's floor of the guidance schedule
PROMPT_ROOM = 256  # positions kept for the prompt when sizes are checked against the model's positions
MOVQGAN_NAMES = ("movqgan_270M.ckpt", "movqgan_102M.ckpt", "movqgan_67M.ckpt")
SEARCH = ("movqgan/270M", "movqgan", "tokenizer")  # where the MoVQGAN is looked for, in the folder and beside it


def guidance_schedule(scale: float, rows: int, cols: int, length: int) -> torch.Tensor:
    """The scale at each stream position (``[length]``; position 0 and 1 are the size tokens): the
    reference's ``max(4, s (1 - n / (rows / 2 * cols / 2)))`` at the ``n``-th token after the image start,
    computed in the same order and precision (Python floats, carried from token to token)."""
    area = (rows // 2) * (cols // 2)  # the reference's h_grids * 2 * w_grids * 2, grids of 32 px
    out, s = [], float(scale)
    for n in range(length):
        if n >= 2:
            s = max(MIN_SCALE, s * (1 - n / area))
        out.append(s)
    return torch.tensor(out, dtype=torch.float64).float()


def token_id(tokenizer, name: str) -> int:
    tid = tokenizer.convert_tokens_to_ids(name)
    if tid is None or tid == tokenizer.unk_token_id:
        raise CheckpointError(f"the tokenizer has no {name} token (Lumina-mGPT 2.0's has it)")
    return int(tid)


class Lumina2Adapter(TransformersAdapter):
    no_negative = ("Lumina-mGPT 2.0 has no negative prompt (its unconditional row is fixed): "
                   "leave it empty")
    guidance = "linear"
    sampling_defaults = {"cfg_scale": 4.0, "top_k": 4096, "temperature": 1.0}

    def __init__(self, model, tokenizer, width: int, height: int, codes: int, codebook: torch.Tensor | None = None,
                 masked: int | None = None):
        self.model, self.tokenizer, self.masked = model, tokenizer, masked
        self.inner, self.head = model.model, model.lm_head
        self.device = next(model.parameters()).device
        self.vocab_size = model.config.vocab_size
        self.width, self.height = width, height
        if self.vocab_size < LUMINA2_IMAGE_BASE + codes:
            raise CheckpointError(f"the vocabulary ({self.vocab_size} ids) ends before the image tokens "
                                  f"{LUMINA2_IMAGE_BASE}..{LUMINA2_IMAGE_BASE + codes - 1}")
        self.image_ids = torch.arange(LUMINA2_IMAGE_BASE, LUMINA2_IMAGE_BASE + codes)
        self.codebook = codebook
        self.bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id

        def tid(name):
            return token_id(tokenizer, name)

        self.start, self.end, self.end_of_turn = tid(IMAGE_START), tid(IMAGE_END), tid(END_OF_TURN)
        rows, cols = height // PATCH, width // PATCH
        stride = cols + 1
        forced = {0: tid(size_token(height)), 1: tid(size_token(width))}
        forced.update({2 + r * stride + cols: tid(LUMINA_EOL) for r in range(rows)})
        length = 2 + rows * stride + 1
        forced[length - 1] = self.end
        self.layout = TokenLayout.raster(rows, cols, self.vocab_size, self.image_ids, forced, stride, length)
        self.cache = None

    def prompt_ids(self, prompt: str) -> list[int]:
        text = LUMINA_TEMPLATE.format(w=self.width, h=self.height, prompt=prompt) + END_OF_TURN
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if ids[-1:] != [self.end_of_turn]:
            raise CheckpointError(f"the tokenizer does not keep {END_OF_TURN} whole (got ids {ids[-3:]})")
        ids = [self.bos] + ids + [self.start]  # <racm3:break> forced (the reference samples it)
        return [t for t in ids if t != self.masked]

    def unconditional_ids(self) -> list[int]:
        return [self.start]

    def guidance_scales(self, scale):
        rows, cols = self.layout.grid
        return guidance_schedule(scale, rows, cols, self.layout.length)

    def token_vectors(self):
        if self.codebook is None:
            return None
        return self.image_ids.clone(), self.codebook.to(self.device)

    def codes_of(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens - LUMINA2_IMAGE_BASE


def allowed_sizes(max_positions: int) -> range:
    """Sides (pixels, multiples of 32) whose square stream and a prompt fit the model's positions."""
    side = SIZE_UNIT
    while ((side + SIZE_UNIT) // PATCH) * ((side + SIZE_UNIT) // PATCH + 1) + 3 + PROMPT_ROOM <= max_positions:
        side += SIZE_UNIT
    return range(SIZE_UNIT, side + 1, SIZE_UNIT)


def check_size(width, height, max_positions: int) -> None:
    for name, v in (("width", width), ("height", height)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v % SIZE_UNIT:
            raise ValueError(f"{name} must be a positive multiple of {SIZE_UNIT} pixels for Lumina-mGPT 2.0 (got {v})")
    tokens = (height // PATCH) * (width // PATCH + 1) + 3
    if tokens + PROMPT_ROOM > max_positions:
        raise ValueError(f"{width}x{height} needs {tokens} image tokens, more than Lumina-mGPT 2.0's "
                         f"{max_positions} positions leave after a prompt ({max_positions - PROMPT_ROOM})")


def find_movqgan(folder: pathlib.Path, vq=None) -> pathlib.Path | None:
    """The MoVQGAN checkpoint: given (the file, or a folder holding one), or where the reference reads it
    (``movqgan/270M/`` under the folder), in the folder, or beside it."""
    def within(d: pathlib.Path):
        for name in MOVQGAN_NAMES:
            if (d / name).is_file():
                return d / name
        return None

    if vq:
        vq = pathlib.Path(vq)
        if vq.is_file():
            return vq
        return next((f for d in (vq, *(vq / s for s in SEARCH)) if (f := within(d))), None)
    for base in (folder, folder.parent):
        for d in (base, *(base / s for s in SEARCH)):
            found = within(d)
            if found:
                return found
    return None


def load(folder, vq=None, device="cpu", dtype=torch.float32, width=None, height=None):
    """A :class:`~.base.LoadedModel` for a Lumina-mGPT 2.0 folder and its MoVQGAN (``vq``: the checkpoint
    or its folder; found in the folder's ``movqgan/270M/``, the folder, or beside it when not given)."""
    from ..decoders.movqgan import MoVQGANDecoder
    from .base import LoadedModel
    from .chameleon import load_model

    folder = pathlib.Path(folder)
    config = read_json(folder / "config.json")
    max_positions = int(config.get("max_position_embeddings") or 4096)  # ChameleonConfig's default
    if not width and not height:  # the reference's 768, or the largest square the model's positions hold
        allowed = allowed_sizes(max_positions)
        width = height = DEFAULT_SIZE if DEFAULT_SIZE in allowed else allowed[-1]
    width, height = width or height, height or width
    check_size(width, height, max_positions)  # before the weights are read
    where = find_movqgan(folder, vq)
    if where is None:
        raise CheckpointError(f"{folder}: Lumina-mGPT 2.0 needs SBER-MoVQGAN to make images (movqgan_270M.ckpt from "
                              "ai-forever/MoVQGAN, not part of the release; its script reads movqgan/270M/): put it in "
                              "the folder's movqgan/270M/ or give --vq FILE" + (f" ({vq} has none)" if vq else ""))
    decoder = MoVQGANDecoder.load(where, device=device, dtype=full_dtype(dtype, device))
    codes = decoder.spec.n_embed
    vocab = config.get("vocab_size")
    if not isinstance(vocab, int) or vocab < LUMINA2_IMAGE_BASE + codes:  # before the weights are read
        raise CheckpointError(f"{where}: the MoVQGAN has {codes} codes but {folder}'s vocabulary ({vocab} ids) ends "
                              f"before image token {LUMINA2_IMAGE_BASE} + {codes - 1}")
    tokenizer = tokenizer_from_pretrained(folder)
    for name in (IMAGE_START, IMAGE_END, END_OF_TURN, LUMINA_EOL, size_token(width), size_token(height)):
        token_id(tokenizer, name)  # before the weights are read
    masked = masked_id(folder, token_id(tokenizer, IMAGE_END))
    model, tokenizer = load_model(folder, device, dtype)
    sizes = tuple(s for s in SIZES if s in allowed_sizes(max_positions))

    def build(size) -> LoadedModel:
        w, h = (size, size) if isinstance(size, int) else size
        check_size(w, h, max_positions)
        adapter = Lumina2Adapter(model, tokenizer, w, h, codes, decoder.codebook(), masked)

        def decode(tokens: torch.Tensor) -> torch.Tensor:
            return decoder.decode(adapter.codes_of(tokens))

        return LoadedModel(family="lumina2", name=f"Lumina-mGPT 2.0 ({folder.name})", adapter=adapter, decode=decode,
                           condition="text", resolutions=tuple(sorted({*sizes, w, h})), resize=build,
                           info={"resolution": w if w == h else None, "width": w, "height": h,
                                 "grid": adapter.layout.grid, "vq": str(where)},
                           modules={"lumina2": model, "movqgan": decoder.model},
                           decode_bytes_per_image=decoder.bytes_per_image(adapter.layout.grid))

    return build((width, height))


def _detect(path: pathlib.Path) -> Detected | None:
    settings = transformers_config(path) or {}
    return Detected("lumina2", path, "chameleon") if is_lumina2(settings) else None


def _load(hit: Detected, o: LoadOptions):
    return load(hit.path, o.vq, o.device, o.storage or o.dtype, o.width or o.resolution, o.height or o.resolution)


FAMILY = Family(
    "lumina2", detect=_detect, load=_load, square=False,
    needs="a Lumina-mGPT 2.0 folder (Alpha-VLLM/Lumina-mGPT-2.0): config.json with model_type 'chameleon' and a "
          f"vocabulary reaching past image token {LUMINA2_IMAGE_BASE}, weights, tokenizer; with SBER-MoVQGAN "
          "(movqgan_270M.ckpt) in its movqgan/270M/ or given")
