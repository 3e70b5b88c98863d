"""SimpleAR (wdrink/SimpleAR, weights Daniel0724/SimpleAR-{0.5B,1.5B}-{SFT,RL}): Qwen2.5 through transformers'
``Qwen2ForCausalLM``, its vocabulary grown by the image tokenizer's codes, and NVIDIA's
Cosmos-1.0-Tokenizer-DV8x16x16 (``decoders/cosmos.py``) as its image tokenizer.

The release is a plain transformers folder (``model_type: qwen2``, ``SimpARForCausalLM``: the repository's copy
of Qwen2 with two generation methods, the same weights and forward) whose tokenizer adds ``<|t2i|>``,
``<|soi|>`` and five more specials to Qwen2.5's; those two and a vocabulary larger than the tokenizer tell it
from Qwen. Image token = ``len(tokenizer)`` + code (64,000 FSQ codes). The Cosmos tokenizer is not in the
release (the script reads ``./checkpoints/Cosmos-1.0-Tokenizer-DV8x16x16/decoder.jit``): it is found in that
folder beside the model or inside it, in the folder itself, or given.

Reference generation (wdrink/SimpleAR @d56b6e5, ``generate.py`` and ``SimpARForCausalLM.generate_visual``):
the prompt ``<|t2i|>A highly realistic image of {prompt}<|soi|>`` (Qwen's tokenizer adds no BOS), the
unconditional row ``<|t2i|>An image of aerial view, overexposed, low quality, ... distortion<|soi|>`` (a fixed
negative prompt: here the user's negative prompt takes its place, ``<|t2i|>{negative}<|soi|>``; an empty one is
the ``<|t2i|><|soi|>`` SimpleAR's training drops conditions to), each its own cache; exactly ``(side / 16)^2``
image tokens, nothing forced, no end token. Guidance ``s (log p_c - log p_u) + log p_u`` on log-softmaxed
logits: the same distribution as ``u + s (c - u)`` on raw logits (each row's log-normaliser is a constant), so
it runs as the linear rule. Then temperature 1, top-k 64000, top-p 1 over the whole vocabulary; codes are
``id - len(tokenizer)`` clamped to 0..63999. The **departure**: here text ids are masked (the reference may
draw one, which decodes as code 0 or 63999). Sizes: the script offers 256, 512, 768 and 1024 px (default);
any multiple of 16 is accepted here.

``generate_visual`` is transformers' ``generate`` with the guidance as a custom logits processor, so the release's
``generation_config.json`` takes part (``generation_config.py``): ``generate.py`` passes ``do_sample``,
``temperature``, ``top_p``, ``top_k``, ``max_new_tokens`` and ``use_cache`` itself, but a ``repetition_penalty``
(Qwen2.5-Instruct ships 1.1) applies, before the guidance, to the conditional logits over the prompt and the image
tokens so far; here too (:class:`~.generation_config.RepetitionPenalty`, on the adapter's conditional branch).
A pad id that is not an end id is masked out of the conditional prompt where it occurs, as ``generate`` infers
an attention mask from it; fields this pack cannot apply are refused when the model loads.  The reference's
other two paths ignore the file: ``--sjd_sampling`` (its own loop) and ``--vllm_serving`` (explicit
``SamplingParams``).
"""
from __future__ import annotations

import pathlib

import torch

from ..formats.checkpoints import CheckpointError, from_pretrained, read_json, tokenizer_from_pretrained
from ..sampling.adapter import TokenLayout
from ..sampling.config import shorten
from .family import Detected, Family, LoadOptions, transformers_config
from .generation_config import ReleaseGeneration, RepetitionPenalty, release_generation
from .hf_cache import TransformersAdapter
from .liquid import tokenizer_names
from .storage import full_dtype, place

TEMPLATE = "<|t2i|>A highly realistic image of {prompt}<|soi|>"
NEGATIVE_TEMPLATE = "<|t2i|>{negative}<|soi|>"
DEFAULT_NEGATIVE = ("An image of aerial view, overexposed, low quality, deformation, a poor composition, bad hands, "
                    "bad teeth, bad eyes, bad limbs, distortion")
MARKERS = ("<|t2i|>", "<|soi|>")  # SimpleAR's added specials: what sets its tokenizer apart from Qwen2.5's
PATCH = 16  # pixels per image token (the Cosmos DV tokenizer's spatial compression)
SIZES = (256, 512, 768, 1024)  # the reference script's choices
DEFAULT_SIZE = 1024
PROMPT_ROOM = 512  # positions kept for the prompt when sizes are checked against the model's positions
DECODER_FOLDERS = ("Cosmos-1.0-Tokenizer-DV8x16x16", "Cosmos-Tokenizer-DV8x16x16", "cosmos", "tokenizer")
SCRIPT = "SimpleAR's generate.py"
#: what ``generate.py`` passes to ``generate_visual`` (so to transformers' ``generate``) itself: the release's
#: generation_config.json values of these are overridden (``max_new_tokens`` sets ``max_length``)
EXPLICIT = ("do_sample", "temperature", "top_p", "top_k", "max_new_tokens", "max_length", "use_cache")


class SimpleARAdapter(TransformersAdapter):
    guidance = "linear"
    sampling_defaults = {"cfg_scale": 6.0, "temperature": 1.0, "top_k": 64000, "top_p": 1.0}

    def __init__(self, model, tokenizer, width: int, height: int, codebook: torch.Tensor | None = None,
                 generation: ReleaseGeneration = ReleaseGeneration()):
        self.model, self.tokenizer = model, tokenizer
        self.generation = generation
        if generation.repetition_penalty != 1.0:
            self.repeats = RepetitionPenalty(generation.repetition_penalty)
        self.inner, self.head = model.model, model.lm_head
        self.device = next(model.parameters()).device
        self.vocab_size = model.config.vocab_size
        self.text_ids = len(tokenizer)  # the reference's offset: code = id - len(tokenizer)
        if self.vocab_size <= self.text_ids:
            raise CheckpointError(f"the vocabulary ({self.vocab_size}) has no ids past the tokenizer's "
                                  f"{self.text_ids}: no image tokens")
        self.image_ids = torch.arange(self.text_ids, self.vocab_size)
        self.bos = tokenizer.eos_token_id  # any id: Qwen adds none, and the left padding is masked
        self.codebook = codebook
        self.width, self.height = width, height
        rows, cols = height // PATCH, width // PATCH
        self.layout = TokenLayout.raster(rows, cols, self.vocab_size, self.image_ids, {}, cols, rows * cols)
        self.cache = None

    def check_conditions(self, conditions, negatives):
        super().check_conditions(conditions, None)
        bad = [n for n in negatives or () if n is not None and not isinstance(n, str)]
        if bad:
            raise ValueError(f"negative prompt must be text for SimpleAR (got {shorten(bad[0])})")

    def prompt_ids(self, prompt: str) -> list[int]:
        ids = self.tokenizer(TEMPLATE.format(prompt=prompt)).input_ids
        # generate masks the release's pad id out of the conditional row where it is no end id
        return [t for t in ids if t != self.generation.masked]

    def negative_ids(self, negative: str | None) -> list[int]:
        text = DEFAULT_NEGATIVE if negative is None else negative
        return self.tokenizer(NEGATIVE_TEMPLATE.format(negative=text)).input_ids

    def unconditional_ids(self) -> list[int]:
        return self.negative_ids(None)

    def condition_rows(self, conditions, negatives, guided):
        rows = [self.prompt_ids(p) for p in conditions]
        if guided:  # the unconditional branch: the negative prompt (the reference's fixed one by default)
            negs = list(negatives) if negatives is not None else [None] * len(conditions)
            rows += [self.negative_ids(n) for n in negs]
        return rows

    def token_vectors(self):
        if self.codebook is None:
            return None
        return self.image_ids.clone(), self.codebook.to(self.device)

    def codes_of(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens - self.text_ids


def check_size(width, height, max_positions: int) -> None:
    for name, v in (("width", width), ("height", height)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v % PATCH:
            raise ValueError(f"{name} must be a positive multiple of {PATCH} pixels for SimpleAR (got {v})")
    tokens = (height // PATCH) * (width // PATCH)
    if tokens + PROMPT_ROOM > max_positions:
        raise ValueError(f"{width}x{height} needs {tokens} image tokens, more than SimpleAR's {max_positions} "
                         f"positions leave after a prompt ({max_positions - PROMPT_ROOM})")


def find_cosmos(folder: pathlib.Path, vq=None) -> pathlib.Path | None:
    """The Cosmos DV tokenizer's ``decoder.jit``: given (the file or its folder), or in a Cosmos folder beside
    the model (where the reference script reads it) or inside it, or in the folder itself."""
    from ..decoders.cosmos import find_cosmos_decoder

    if vq:
        vq = pathlib.Path(vq)
        return vq if vq.is_file() else find_cosmos_decoder(vq)
    for base in (folder.parent, folder):
        for d in (*(base / name for name in DECODER_FOLDERS), base):
            found = find_cosmos_decoder(d)
            if found:
                return found
    return None


def load_model(folder, device="cpu", dtype=torch.float32, tokenizer=None):
    """``(Qwen2ForCausalLM, tokenizer)``: read in the files' own dtype (memory-mapped), then converted or
    quantized a tensor at a time (``storage.place``)."""
    from transformers import Qwen2ForCausalLM

    folder = pathlib.Path(folder)
    tokenizer = tokenizer or tokenizer_from_pretrained(folder)
    model = from_pretrained(Qwen2ForCausalLM, folder, "a SimpleAR (Qwen2) model", "auto")
    return place(model, dtype, device).eval(), tokenizer


def load(folder, vq=None, device="cpu", dtype=torch.float32, width=None, height=None):
    """A :class:`~.base.LoadedModel` for a SimpleAR folder and the Cosmos DV tokenizer (``vq``: its
    ``decoder.jit`` or folder; found beside the model or in it when not given)."""
    from ..decoders.cosmos import CosmosDecoder
    from .base import LoadedModel

    folder = pathlib.Path(folder)
    config = read_json(folder / "config.json")
    max_positions = int(config.get("max_position_embeddings") or 32768)
    width = width or height or DEFAULT_SIZE
    height = height or width
    check_size(width, height, max_positions)  # before the weights are read
    where = find_cosmos(folder, vq)
    if where is None:
        raise CheckpointError(f"{folder}: SimpleAR needs NVIDIA's Cosmos-1.0-Tokenizer-DV8x16x16 to make images "
                              "(decoder.jit, not part of the release; its script reads it from "
                              "checkpoints/Cosmos-1.0-Tokenizer-DV8x16x16/): put that folder beside the model or "
                              "give --vq FOLDER" + (f" ({vq} has no decoder.jit)" if vq else ""))
    decoder = CosmosDecoder.load(where, device=device, dtype=full_dtype(dtype, device))
    tokenizer = tokenizer_from_pretrained(folder)
    generation = release_generation(folder, len(tokenizer), SCRIPT, EXPLICIT)  # before the weights are read
    if generation.masked is not None and generation.masked == tokenizer.convert_tokens_to_ids(MARKERS[1]):
        raise CheckpointError(f"{generation.source}: pad_token_id {generation.masked} is {MARKERS[1]}, the prompt's "
                              "last token, which transformers' generate would then mask out of its own prediction: "
                              "this pack does not; set pad_token_id to an end id or remove it")
    vocab = config.get("vocab_size")
    codes = decoder.spec.n_embed
    if not isinstance(vocab, int) or vocab - len(tokenizer) != codes:  # before the weights are read
        raise CheckpointError(f"{where}: the Cosmos tokenizer has {codes} codes but {folder} has "
                              f"{vocab - len(tokenizer) if isinstance(vocab, int) else 'no'} image tokens (config.json "
                              f"vocab_size {vocab} - {len(tokenizer)} ids of the tokenizer)")
    model, tokenizer = load_model(folder, device, dtype, tokenizer)
    limit = max_positions - PROMPT_ROOM
    sizes = tuple(s for s in SIZES if (s // PATCH) ** 2 <= limit)

    def build(size) -> LoadedModel:
        w, h = (size, size) if isinstance(size, int) else size
        check_size(w, h, max_positions)
        adapter = SimpleARAdapter(model, tokenizer, w, h, decoder.codebook(), generation)

        def decode(tokens: torch.Tensor) -> torch.Tensor:
            return decoder.decode(adapter.codes_of(tokens))

        return LoadedModel(family="simplear", name=f"SimpleAR ({folder.name})", adapter=adapter, decode=decode,
                           condition="text", resolutions=tuple(sorted({*sizes, w, h})), resize=build,
                           info={"resolution": w if w == h else None, "width": w, "height": h,
                                 "grid": adapter.layout.grid, "vq": str(where),
                                 "repetition_penalty": generation.repetition_penalty},
                           modules={"simplear": model, "cosmos": decoder.model},
                           decode_bytes_per_image=decoder.bytes_per_image(adapter.layout.grid))

    return build((width, height))


def _detect(path: pathlib.Path) -> Detected | None:
    settings = transformers_config(path) or {}
    if settings.get("model_type") != "qwen2":
        return None
    return Detected("simplear", path, "qwen2") if set(MARKERS) <= tokenizer_names(path) else None


def _load(hit: Detected, o: LoadOptions):
    return load(hit.path, o.vq, o.device, o.storage or o.dtype, o.width or o.resolution, o.height or o.resolution)


FAMILY = Family(
    "simplear", detect=_detect, load=_load, square=False,
    needs="a SimpleAR folder (Daniel0724/SimpleAR-*): config.json with model_type 'qwen2', weights, and the "
          "tokenizer with <|t2i|> and <|soi|>; with NVIDIA's Cosmos-1.0-Tokenizer-DV8x16x16 (decoder.jit) beside it "
          "or given")
