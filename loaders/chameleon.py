"""The Chameleon architecture through transformers (>= 4.43): Lumina-mGPT and Anole.

``ChameleonForConditionalGeneration.forward`` masks every image-token logit, so
the adapter runs the inner model and ``lm_head`` itself, on a
:class:`~.hf_cache.StaticCache`.  Image tokens are the vocabulary entries named
``IMGIMG<letters>Z`` (letters A-J spell the VQ code's digits); the id <-> code
map is read from the checkpoint's ``vocabulary_map``, never assumed.  Pictures
come from Meta's VQGAN (``tokenizer/vqgan.yaml`` + ``vqgan.ckpt``,
``decoders/vqgan.py``), which transformers does not include.

Folders in transformers' format load directly, and so do Lumina-mGPT's own saves (its
releases), whose q/k norms hold one row per model-parallel shard (:func:`norm_repeats`: each
row is repeated over its shard's heads, as Lumina's model does at run time).  Meta's release
layout (``models/7b/consolidated.pth`` + ``params.json``, ``tokenizer/text_tokenizer.json``,
``tokenizer/vqgan.*``: Chameleon, GAIR's Anole) is converted in memory by ``chameleon_meta.py``.

Two token grammars (``ChameleonSpec.flavour``):

* **Lumina-mGPT** (Alpha-VLLM/Lumina-mGPT @104abe45, ``inference_solver.py`` and
  ``generate_examples/generate.py``): BOS, then the turn
  ``Generate an image of {W}x{H} according to the following prompt:\\n{prompt}<reserved08706>``
  encoded as one text (``<reserved08706>``, id 8710, ends the turn).  The reference then lets
  the model write ``<racm3:break>`` (text top-k 10, no CFG), the two size tokens
  ``<reserved{8800 + side / 32}>`` (height, width; image top-k, no CFG), ``H`` rows of ``W``
  image tokens each closed by ``<reserved08799>`` (end of line, constrained) and ``<eoss>``
  (end of image, constrained).  Here ``<racm3:break>`` ends the prompt and the size tokens are
  forced to the requested size: the **departures** from the reference, both where it samples
  what a well-formed image of that size must contain.  End of line and end of image are forced
  as the reference constrains them.  The unconditional branch is the reference's: only the
  tokens from ``<racm3:break>`` on, with its own cache rows (CFG starts at the first image
  token).  CFG 3 on raw logits, image top-k 2000, temperature 1.
* **Anole** (GAIR-NLP/anole @af563fa1, ``text2image.py`` on Meta's ``chameleon/inference``):
  BOS, the prompt, ``<END-OF-TURN>`` (``<reserved08706>``, id 8710), ``<racm3:break>``, then
  1024 image tokens (32 x 32 at 512 px) with no end-of-line, ``<eoss>`` forced last.
  Three-way guidance ``u + 1.2 (img - u) + 3.0 (full - img)`` with ``full`` = the prompt,
  ``img`` = the prompt's images only, ``u`` = BOS + image start.  A text-only prompt has no
  images, so ``img`` is the same sequence as ``u`` (both ``[BOS, <racm3:break>]``): it is
  computed once and returned for both branches (no extra forward).  Meta's image defaults:
  temperature 0.7, top-p 0.9.
"""
from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

import torch

from ..formats.checkpoints import (CheckpointError, assign_weights, checked_weight_files, empty_model, hf_call, peek,
                                   read_json, read_weights, tokenizer_from_pretrained)
from ..sampling.adapter import TokenLayout
from .family import Detected, Family, LoadOptions, transformers_config
from .hf_cache import TransformersAdapter
from .storage import full_dtype, place

IMAGE_START, IMAGE_END = "<racm3:break>", "<eoss>"
END_OF_TURN = "<reserved08706>"  # id 8710: Lumina's conversation separator, Anole's <END-OF-TURN> sentinel
LUMINA_TEMPLATE = "Generate an image of {w}x{h} according to the following prompt:\n{prompt}"
LUMINA_EOL = "<reserved08799>"
LUMINA_SIZES = (512, 768, 1024)
ANOLE_SIZE = 512
PATCH = 16  # pixels per image token
SIZE_UNIT = 32  # Lumina's size tokens count 32-pixel units
LUMINA2_IMAGE_BASE = 155000  # Lumina-mGPT 2.0's first image token (``lumina2.py``), named by no vocabulary entry
NORM_KEY = re.compile(r"model\.layers\.\d+\.self_attn\.([qk])_norm\.(?:weight|bias)")


def size_token(pixels: int) -> str:
    return f"<reserved{8800 + pixels // SIZE_UNIT:05d}>"


def image_code_map(vocabulary_map: dict) -> dict[int, int]:
    """Token id -> VQ code, from the ``IMGIMG<letters>Z`` names (A=0 ... J=9)."""
    out = {}
    for name, tid in vocabulary_map.items():
        if name.startswith("IMGIMG") and name.endswith("Z"):
            digits = "".join(str(ord(c) - ord("A")) for c in name[6:-1])
            out[int(tid)] = int(digits)
    return out


@dataclass(frozen=True)
class ChameleonSpec:
    flavour: str  # "lumina" or "anole"
    width: int  # pixels
    height: int

    @property
    def grid(self) -> tuple[int, int]:
        return self.height // PATCH, self.width // PATCH


def flavour_of(config: dict) -> str:
    """Lumina-mGPT ships its own subclass (``ChameleonXLLMXForConditionalGeneration``)."""
    archs = " ".join(config.get("architectures") or [])
    return "lumina" if "XLLMX" in archs or "Lumina" in archs else "anole"


def is_lumina2(config: dict) -> bool:
    """Lumina-mGPT 2.0's fork of the architecture (``lumina2.py`` loads it): a vocabulary reaching past its fixed
    image ids, where Chameleon's (Lumina-mGPT's, Anole's) has 65536 ids with the image tokens at 4..8195."""
    vocab = config.get("vocab_size")
    return config.get("model_type") == "chameleon" and isinstance(vocab, int) and vocab > LUMINA2_IMAGE_BASE


def check_size(flavour: str, width: int, height: int) -> None:
    unit = SIZE_UNIT if flavour == "lumina" else PATCH
    for name, v in (("width", width), ("height", height)):
        if not isinstance(v, int) or v <= 0 or v % unit:
            raise ValueError(f"{name} must be a positive multiple of {unit} pixels for "
                             f"{'Lumina-mGPT' if flavour == 'lumina' else 'Anole'} (got {v})")
    if flavour == "anole" and (width, height) != (ANOLE_SIZE, ANOLE_SIZE):
        raise ValueError(f"Anole generates {ANOLE_SIZE}x{ANOLE_SIZE} images only (got {width}x{height})")


class ChameleonAdapter(TransformersAdapter):
    no_negative = "Chameleon models (Lumina-mGPT, Anole) have no negative prompt: leave it empty"

    def __init__(self, model, tokenizer, spec: ChameleonSpec, codebook: torch.Tensor | None = None,
                 masked: int | None = None):
        self.model, self.tokenizer, self.spec = model, tokenizer, spec
        self.masked = masked  # Lumina-mGPT: the release's pad id, which the reference's generate masks out
        self.inner, self.head = model.model, model.lm_head
        self.device = next(model.parameters()).device
        self.vocab_size = model.config.vocab_size
        vocab = model.config.vocabulary_map or {}
        self.codes = image_code_map(vocab)
        if not self.codes:
            raise CheckpointError("the Chameleon vocabulary has no image tokens (IMGIMG...Z entries in "
                                  "vocabulary_map): this is not an image-generating checkpoint")
        ids = sorted(self.codes)
        self.image_ids = torch.tensor(ids)
        self.code_of = torch.zeros(self.vocab_size, dtype=torch.long)
        self.code_of[self.image_ids] = torch.tensor([self.codes[i] for i in ids])
        self.codebook = codebook

        def tid(name):
            if name not in vocab:
                raise CheckpointError(f"the Chameleon vocabulary has no {name} token")
            return int(vocab[name])

        self.bos = tokenizer.bos_token_id
        self.start, self.end = tid(IMAGE_START), tid(IMAGE_END)
        self.end_of_turn = tid(END_OF_TURN)
        rows, cols = spec.grid
        if spec.flavour == "lumina":
            self.guidance = "linear"
            self.sampling_defaults = {"cfg_scale": 3.0, "top_k": 2000, "temperature": 1.0}
            eol = tid(LUMINA_EOL)
            stride = cols + 1
            forced = {0: tid(size_token(spec.height)), 1: tid(size_token(spec.width))}
            forced.update({2 + r * stride + cols: eol for r in range(rows)})
            length = 2 + rows * stride + 1
            forced[length - 1] = self.end
            self.layout = TokenLayout.raster(rows, cols, self.vocab_size, self.image_ids, forced, stride, length)
        else:
            self.guidance = "image_text"
            self.sampling_defaults = {"cfg_scale": 3.0, "temperature": 0.7, "top_p": 0.9}
            length = rows * cols + 1
            self.layout = TokenLayout.raster(rows, cols, self.vocab_size, self.image_ids, {length - 1: self.end},
                                             cols, length)
        self.cache = None

    # -- conditions --------------------------------------------------------------------
    def prompt_ids(self, prompt: str) -> list[int]:
        if self.spec.flavour == "lumina":  # the turn and its end-of-turn encoded as one text, as the reference does
            text = LUMINA_TEMPLATE.format(w=self.spec.width, h=self.spec.height, prompt=prompt) + END_OF_TURN
            ids = self.tokenizer(text, add_special_tokens=False).input_ids
            if ids[-1:] != [self.end_of_turn]:
                raise CheckpointError(f"the tokenizer does not keep {END_OF_TURN} whole (got ids {ids[-3:]})")
            ids = [self.bos] + ids + [self.start]  # <racm3:break> forced (the reference samples it)
            return [t for t in ids if t != self.masked]
        return [self.bos] + self.tokenizer(prompt, add_special_tokens=False).input_ids + [self.end_of_turn, self.start]

    def unconditional_ids(self) -> list[int]:
        # Lumina: the tokens from the image start on; Anole: BOS + image start
        return [self.start] if self.spec.flavour == "lumina" else [self.bos, self.start]

    def branches(self, guided: bool) -> int:
        if not guided:
            return 1
        return 3 if self.guidance == "image_text" else 2

    # -- the cache loop ----------------------------------------------------------------
    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, ...] -> [K, B, ..., V]; Anole's image-only branch reuses the unconditional rows."""
        logits = super()._logits(hidden)
        if self.guidance == "image_text" and logits.shape[0] == 2:
            logits = torch.cat([logits, logits[1:]], 0)
        return logits

    def token_vectors(self):
        book = self.codebook
        if book is None:  # the converted checkpoint carries the VQ encoder's codebook
            vq = getattr(self.inner, "vqmodel", None)
            book = vq.quantize.embedding.weight.detach().float() if vq is not None else None
        if book is None:
            return None
        return self.image_ids, book[self.code_of[self.image_ids]].to(self.device)

    def codes_of(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.code_of.to(tokens.device)[tokens]


def norm_repeats(shapes: dict[str, tuple[int, ...]], config, source: str = "the weights") -> dict[str, int]:
    """The q/k norm tensors stored in Lumina-mGPT's layout, each with the head count to repeat it to.

    Lumina's Chameleon copy (Alpha-VLLM/Lumina-mGPT @104abe45, ``ChameleonLayerNorm`` in
    ``lumina_mgpt/model/chameleon/modeling_chameleon.py``) keeps one row per model-parallel shard,
    ``[model_parallel_size, head_dim]`` (``[1, 128]`` in the 7B releases, ``[4, 128]`` in the 34B), and
    repeats each row over its shard's heads at run time; transformers keeps ``[heads, head_dim]``.
    ``shapes`` maps tensor names to shapes; a norm shape that fits neither layout is one error."""
    heads = {"q": config.num_attention_heads, "k": config.num_key_value_heads}
    head_dim = config.hidden_size // config.num_attention_heads
    shards = int(getattr(config, "model_parallel_size", None) or 1)
    out = {}
    for key, shape in shapes.items():
        m = NORM_KEY.fullmatch(key)
        if m is None or tuple(shape) == (heads[m.group(1)], head_dim):
            continue
        n = heads[m.group(1)]
        if tuple(shape) == (shards, head_dim) and n % shards == 0:
            out[key] = n
            continue
        lumina = (f"[{shards}, {head_dim}] (Lumina-mGPT's: one row per model-parallel shard, model_parallel_size "
                  f"{shards} in config.json)" if n % shards == 0 else
                  f"none of Lumina-mGPT's (model_parallel_size {shards} in config.json does not divide {n} heads)")
        raise CheckpointError(f"{source}: {key} has shape {list(shape)}; the layouts that load are [{n}, {head_dim}] "
                              f"(transformers': one row per {'query' if m.group(1) == 'q' else 'key/value'} head) "
                              f"and {lumina}")
    return out


def load_model(folder, device="cpu", dtype=torch.float32):
    """``(ChameleonForConditionalGeneration, tokenizer)`` from a folder in transformers' format or
    Lumina-mGPT's, built with its parameters on the meta device and given the file's tensors, read in
    ``dtype`` one at a time (no second copy of the weights, whatever the dtype asked for).

    transformers' VQ *encoder* (``model.vqmodel``: it reads input images; generating never runs it, the
    pictures come from Meta's VQGAN) is loaded when the folder ships it and not built when it does not
    (Lumina-mGPT's releases): no randomly initialised encoder, and no load report listing its keys."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from . import chameleon_meta

    folder = pathlib.Path(folder)
    if chameleon_meta.is_meta_layout(folder):  # Meta's release layout, converted in memory
        return chameleon_meta.load_model(folder, device, dtype)
    config = hf_call(lambda: ChameleonConfig.from_pretrained(str(folder), local_files_only=True), folder,
                     "a Chameleon configuration")
    files = checked_weight_files(folder)
    repeats = {}
    for f in files:  # tensor headers only (safetensors): the norm shapes decide the layout before any weight is read
        norms = {k: shape for k, shape in peek(f).items() if NORM_KEY.fullmatch(k)}
        repeats.update(norm_repeats(norms, config, str(f)))
    weights = read_weights(files, full_dtype(dtype, device))
    # Lumina-mGPT's own save: each per-shard row repeated per head, as its model does at run time
    weights.update({k: chameleon_meta.repeat_per_head(weights[k], n) for k, n in repeats.items()})
    model = empty_model(ChameleonForConditionalGeneration, config)
    if not any(k.startswith("model.vqmodel.") for k in weights):  # not shipped: not built (it would be random)
        model.model.vqmodel = None
    assign_weights(model, weights, files[0] if len(files) == 1 else folder, "a Chameleon-architecture model")
    tokenizer = tokenizer_from_pretrained(folder)
    return place(model, dtype, device).eval(), tokenizer


def load(folder, vq=None, device="cpu", dtype=torch.float32, width=None, height=None):
    """A :class:`~.base.LoadedModel` for a converted Chameleon-architecture folder
    (Lumina-mGPT or Anole) and Meta's VQGAN (``vq``: the folder holding
    ``vqgan.yaml`` + ``vqgan.ckpt``, or the yaml; found in the model folder or its
    ``tokenizer/`` when not given)."""
    from ..decoders.vqgan import VQGANDecoder, find_vqgan
    from . import chameleon_meta
    from .base import LoadedModel

    folder = pathlib.Path(folder)
    meta = chameleon_meta.is_meta_layout(folder)
    config = chameleon_meta.read_config(folder) if meta else read_json(folder / "config.json")
    flavour = flavour_of(config)
    vocab = config.get("vocabulary_map") or {}
    if not image_code_map(vocab):
        raise CheckpointError(f"{folder}: the vocabulary has no image tokens (IMGIMG...Z entries in config.json's "
                              "vocabulary_map); this checkpoint cannot generate images")
    default = 768 if flavour == "lumina" else ANOLE_SIZE
    width, height = width or height or default, height or width or default
    check_size(flavour, width, height)  # before the weights are read
    if vq:  # the folder, or either of its two files
        vq = pathlib.Path(vq)
        where = find_vqgan(vq if vq.is_dir() else vq.parent)
    elif meta:
        where = chameleon_meta.find_meta_files(folder)["vqgan"]
    else:
        where = find_vqgan(folder) or find_vqgan(folder.parent)
    if where is None:
        name = "Lumina-mGPT" if flavour == "lumina" else "Anole"
        raise CheckpointError(f"{folder}: {name} needs Meta's VQGAN to make images (tokenizer/vqgan.yaml and "
                              f"vqgan.ckpt, not part of transformers' checkpoint): give --vq FOLDER"
                              + (f" ({vq} has neither)" if vq else ""))
    decoder = VQGANDecoder.load(*where, device=device, dtype=full_dtype(dtype, device))
    n_codes = len(image_code_map(vocab))
    if decoder.spec.n_embed != n_codes:
        raise CheckpointError(f"{where[1]}: the VQGAN has {decoder.spec.n_embed} codes but the vocabulary of "
                              f"{folder} has {n_codes} image tokens")
    masked = None
    if flavour == "lumina" and not meta:  # the reference's generate takes the pad id from the release
        from .generation_config import masked_id

        masked = masked_id(folder, int(vocab[END_OF_TURN]) if END_OF_TURN in vocab else -1)
    model, tokenizer = load_model(folder, device, dtype)

    def build(size) -> LoadedModel:
        w, h = (size, size) if isinstance(size, int) else size
        check_size(flavour, w, h)
        adapter = ChameleonAdapter(model, tokenizer, ChameleonSpec(flavour, w, h), decoder.codebook(), masked)

        def decode(tokens: torch.Tensor) -> torch.Tensor:
            return decoder.decode(adapter.codes_of(tokens))

        name = "Lumina-mGPT" if flavour == "lumina" else "Anole"
        return LoadedModel(family=flavour, name=f"{name} ({folder.name})", adapter=adapter, decode=decode,
                           condition="text", resolutions=LUMINA_SIZES if flavour == "lumina" else (ANOLE_SIZE,),
                           resize=build, info={"resolution": w if w == h else None, "width": w, "height": h,
                                               "grid": adapter.layout.grid, "vq": str(where[1])},
                           modules={"chameleon": model, "vqgan": decoder.model},
                           decode_bytes_per_image=decoder.bytes_per_image(adapter.layout.grid))

    return build((width, height))


def _chameleon_flavour(path: pathlib.Path) -> str | None:
    """``lumina`` or ``anole`` for a folder with transformers' Chameleon config.json."""
    settings = transformers_config(path) or {}
    if settings.get("model_type") != "chameleon" or is_lumina2(settings):
        return None
    return flavour_of(settings)


def _detect_lumina(path: pathlib.Path) -> Detected | None:
    return Detected("lumina", path, "chameleon") if _chameleon_flavour(path) == "lumina" else None


def _detect_anole(path: pathlib.Path) -> Detected | None:
    """Meta's release layout, converted in memory, or transformers' format."""
    from . import chameleon_meta

    if chameleon_meta.is_meta_layout(path):
        return Detected("anole", path, "chameleon-meta")
    return Detected("anole", path, "chameleon") if _chameleon_flavour(path) == "anole" else None


def _load(hit: Detected, o: LoadOptions):
    return load(hit.path, o.vq, o.device, o.storage or o.dtype, o.width or o.resolution, o.height or o.resolution)


LUMINA = Family(
    "lumina", detect=_detect_lumina, load=_load, square=False,
    needs="a Lumina-mGPT folder: config.json with model_type 'chameleon' and architectures "
          "ChameleonXLLMXForConditionalGeneration, weights, tokenizer, and Meta's VQGAN "
          "(tokenizer/vqgan.yaml + vqgan.ckpt) inside or given")
ANOLE = Family(
    "anole", detect=_detect_anole, load=_load, square=False,
    needs="an Anole / Chameleon folder, in transformers' format (config.json with model_type 'chameleon', "
          "weights, tokenizer) or Meta's (models/7b/consolidated.pth + params.json, tokenizer/text_tokenizer.json), "
          "with Meta's VQGAN (tokenizer/vqgan.yaml + vqgan.ckpt) inside or given")
