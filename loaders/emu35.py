"""Emu3.5 and Emu3.5-Image (BAAI; weights BAAI/Emu3.5-Image, BAAI/Emu3.5, BAAI/Emu3.5-VisionTokenizer): a 34B
decoder over text and image tokens, with an IBQ image tokenizer (131,072 codes, 16x downsampling:
``decoders/ibq.py``).

**The release.** A folder with ``config.json`` (``model_type "Emu3"``, the authors' own ``Emu3Config``: the
same model type as Emu3 v1's own release, so the contents tell them apart: Emu3.5's attention has per-head
``q_norm`` / ``k_norm`` weights, and ``head_dim`` is a field of its own), safetensors shards and their index,
``generation_config.json``.  The model code is the authors' (baaivision/Emu3.5 @8fcf1da,
``src/emu3p5/modeling_emu3.py``, on transformers 4.48.2), not transformers': a Llama-style decoder whose
attention normalises each query and key head with an RMSNorm of width ``head_dim`` *before* the rotary
embedding (Qwen3's layout), no biases, untied head unless ``tie_word_embeddings``, RoPE with ``rope_theta`` and
the authors' ``rope_scaling`` (none, ``linear``, or ``dynamic``, which changes nothing within
``max_position_embeddings``), every RMSNorm with ``rms_norm_eps``.  That is transformers' ``Qwen3ForCausalLM``
exactly, with the same tensor names: it is built from a :class:`~transformers.Qwen3Config` made of these fields
(:func:`qwen3_config`), so the static cache, CUDA graphs, compiled blocks, quantized storage and offload work on
it as on every transformers family (its ``model.layers`` are the repeated blocks).  Two roundings differ from the
authors' arithmetic, not the model: attention scores are multiplied by ``head_dim ** -0.5`` where the authors
divide by ``sqrt(head_dim)``, and linear RoPE scaling divides the frequencies where the authors divide the
positions (both exact when ``head_dim`` is a power of 4 and no scaling is set; otherwise an ulp apart).  The
authors' eager and FlashAttention-2 paths apply ``q_norm`` / ``k_norm``; their SDPA path (``Emu3SdpaAttention``)
skips them, a bug of that path, not the model: here every attention implementation applies them.

**The text tokenizer** is not in the release: the authors load BAAI's tiktoken files from their repository
(``src/tokenizer_emu3_ibq/emu3.tiktoken`` and ``emu3_vision_tokens.txt``).  Put both in the model folder, or in a
``tokenizer_emu3_ibq`` or ``tokenizer`` folder beside it (:func:`find_tokenizer`, in that order).  They are read
here without the ``tiktoken`` package (:class:`Emu35Tokenizer`: the file format is a base64 token and its rank
per line, and the encoding is tiktoken's byte-pair merge, a few lines), so the family needs no new dependency;
``tests/emu35_reference.py`` checks the ids against the authors' own tokenizer on tiktoken.  As the authors'
``Emu3Tokenizer`` builds it: the BPE ranks are ids 0..151642, then the specials from id 151643 on
(``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ``<|extra_0|>`` ... ``<|extra_204|>``, then the lines of
``emu3_vision_tokens.txt``: ``<|image token|>``, ``<|image start|>``, ``<|image end|>``, ``<|visual token
NNNNNN|>``), text NFC-normalised, special tokens recognised wherever they appear, the rest split by Qwen's
pattern (numbers digit by digit) and each piece byte-pair merged.  Every id used here is looked up by name; a
visual token's code is the number in its name.

**The authors' text-to-image generation** (``inference.py``, ``configs/example_config_t2i.py``,
``src/utils/generation_utils.py``, ``src/utils/logits_processor.py``), reproduced here:

* prompt ``<|extra_203|>You are a helpful assistant for t2i task. USER: {prompt} ASSISTANT: <|extra_100|>``
  (``<|extra_203|>`` is BOS: added in front if the encoded prompt does not start with it); the unconditional
  row ``<|extra_203|>You are a helpful assistant. USER:  ASSISTANT: <|extra_100|>`` (two spaces: an empty user
  turn; a negative prompt given here takes the empty turn's place);
* the model then writes text or ``<|image start|>`` (text top-k 1024, top-p 0.9, no guidance); from
  ``<|image start|>`` on the unconditional row takes every token the conditional one gets;
* with the size set (``target_height`` / ``target_width``), the size header ``{h}*{w}`` (in codes; its digits
  one token each) and ``<|image token|>`` are forced; then ``h`` rows of ``w`` visual tokens with
  ``<|extra_200|>`` (end of line) forced after every row but the last, and ``<|image end|>`` forced after the
  last code: ``h (w + 1)`` stream tokens (1024 px: 64 x 65 = 4,160);
* visual tokens under classifier-free guidance in log-softmax space, ``s (log p_c - log p_u) + log p_u``, over
  the visual ids only (the authors' processor allows every id from the first visual token on: the vocabulary
  ends there in the releases; ids past the tokenizer's, were a vocabulary padded, are masked here), scale 5.0
  (Emu3.5-Image; the authors recommend 2 for Emu3.5, set ``cfg_scale``), then
  image top-k 5120, top-p 1, temperature 1; the default size the config's ``aspect_ratio "default"``,
  ``55*73`` codes: 1168 x 880 pixels.

**The departure.** The authors let the model write text before ``<|image start|>`` (for Emu3.5-Image usually
nothing); here ``<|image start|>``, the size header and ``<|image token|>`` end the prompt, forced.  The
generation_config.json is without effect, as there: the authors pass a ``GenerationConfig`` of their own with
``pad_token_id`` and ``eos_token_id``, and transformers 4.48.2 takes from the release only ``bos_token_id``,
unused with a prompt.
"""
from __future__ import annotations

import base64
import binascii
import pathlib
import re
import unicodedata

import regex  # installed with transformers
import torch

from ..formats.checkpoints import (CheckpointError, assign_weights, checked_weight_files, empty_model, peek, read_json,
                                   read_weights, weight_files)
from ..sampling.adapter import TokenLayout
from ..sampling.config import shorten
from .family import Detected, Family, LoadOptions, transformers_config
from .hf_cache import TransformersAdapter
from .storage import full_dtype, place

# -- the text tokenizer -------------------------------------------------------------------------------------
TIKTOKEN_FILE, VISION_TOKENS_FILE = "emu3.tiktoken", "emu3_vision_tokens.txt"
#: where the tokenizer files are looked for: the model folder, then these folders beside it
TOKENIZER_FOLDERS = ("tokenizer_emu3_ibq", "tokenizer")
#: the id of the first special token (``SPECIAL_START_ID`` of the authors' ``tokenization_emu3.py``): the BPE
#: ranks must be exactly 0 .. 151642, as that tokenizer asserts
SPECIAL_START = 151643
TEXT_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>") + tuple(f"<|extra_{i}|>" for i in range(205))
#: ``PAT_STR`` of the authors' tokenizer (Qwen's): digits one by one
SPLIT = regex.compile(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                      r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
SPECIAL_FORM = regex.compile(r"<\|[^<>|]*\|>")  # every special token's surface form (none holds <, > or |)
VISUAL = re.compile(r"<\|visual token (\d+)\|>")

# -- the authors' t2i grammar (configs/example_config_t2i.py, src/utils/logits_processor.py) -----------------
TEMPLATE = "<|extra_203|>You are a helpful assistant for t2i task. USER: {prompt} ASSISTANT: <|extra_100|>"
#: the unconditional row with a negative prompt in its empty user turn (empty: the authors' row exactly)
NEGATIVE_TEMPLATE = "<|extra_203|>You are a helpful assistant. USER: {negative} ASSISTANT: <|extra_100|>"
UNCONDITIONAL = NEGATIVE_TEMPLATE.format(negative="")
BOS, EOL, IMG, BOI, EOI = "<|extra_203|>", "<|extra_200|>", "<|image token|>", "<|image start|>", "<|image end|>"
PATCH = 16  # pixels per code of the release's IBQ tokenizer
DEFAULT_GRID = (55, 73)  # (rows, columns): the config's aspect_ratio "default", "55*73"
#: the authors' aspect ratios (configs/example_config_t2i.py), rows x columns of codes
ASPECT_RATIOS = {"4:3": (55, 73), "21:9": (41, 97), "16:9": (47, 85), "3:2": (52, 78), "1:1": (64, 64),
                 "3:4": (73, 55), "9:16": (85, 47), "2:3": (78, 52)}
SIZES = (512, 768, 1024)  # square sizes offered besides the one asked for
PROMPT_ROOM = 512  # positions kept for the prompt when sizes are checked against the model's positions
FAMILY_NAME = "emu35"


class Emu35Tokenizer:
    """BAAI's tiktoken tokenizer as the authors' ``Emu3Tokenizer`` builds it (module docstring), read from its two
    files without the ``tiktoken`` package; ``encode`` is ``tokenizer.encode(text, add_special_tokens=False)``."""

    def __init__(self, ranks: dict[bytes, int], vision_tokens: list[str], source: str = ""):
        self.ranks, self.source = ranks, source
        names = TEXT_SPECIALS + tuple(vision_tokens)
        self.specials = {name: SPECIAL_START + i for i, name in enumerate(names)}
        if len(self.specials) != len(names):
            raise CheckpointError(f"{source}: {VISION_TOKENS_FILE} names a special token twice")
        self.codes: dict[int, int] = {}  # visual token id -> its code (the number in its name)
        for name, tid in self.specials.items():
            m = VISUAL.fullmatch(name)
            if m:
                self.codes[tid] = int(m.group(1))

    @classmethod
    def load(cls, folder: str | pathlib.Path) -> "Emu35Tokenizer":
        folder = pathlib.Path(folder)
        bpe, vision = folder / TIKTOKEN_FILE, folder / VISION_TOKENS_FILE
        ranks: dict[bytes, int] = {}
        try:
            for n, line in enumerate(bpe.read_bytes().splitlines(), 1):
                if not line:
                    continue
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error):
            raise CheckpointError(f"{bpe}: line {n} is not a base64 token and its rank (tiktoken's format)") from None
        if sorted(ranks.values()) != list(range(SPECIAL_START)):
            raise CheckpointError(f"{bpe}: {len(ranks)} tokens with ranks {min(ranks.values(), default=None)}.."
                                  f"{max(ranks.values(), default=None)}; the authors' tokenizer needs ranks 0.."
                                  f"{SPECIAL_START - 1}, each once (its special tokens start at {SPECIAL_START})")
        try:
            lines = [t.strip() for t in vision.read_text(encoding="utf-8").splitlines()]
        except UnicodeDecodeError:
            raise CheckpointError(f"{vision}: not UTF-8 text (one special token per line)") from None
        return cls(ranks, [t for t in lines if t], str(folder))

    def __len__(self) -> int:
        return SPECIAL_START + len(self.specials)

    def token_id(self, name: str) -> int:
        if name not in self.specials:
            raise CheckpointError(f"{self.source}: the tokenizer has no {name} token (Emu3.5's has it)")
        return self.specials[name]

    def encode(self, text: str) -> list[int]:
        text = unicodedata.normalize("NFC", text)
        ids, start = [], 0
        for m in SPECIAL_FORM.finditer(text):  # special tokens are recognised anywhere (allowed_special="all")
            if m.group() in self.specials:
                ids += self._ordinary(text[start:m.start()])
                ids.append(self.specials[m.group()])
                start = m.end()
        return ids + self._ordinary(text[start:])

    def _ordinary(self, text: str) -> list[int]:
        out = []
        for piece in SPLIT.findall(text):
            piece = piece.encode("utf-8")
            rank = self.ranks.get(piece)
            out += [rank] if rank is not None else self._merge(piece)
        return out

    def _merge(self, piece: bytes) -> list[int]:
        """tiktoken's byte-pair merge: join the adjacent pair whose bytes have the lowest rank (the leftmost of
        equals) until no pair is a token."""
        parts = [piece[i:i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                rank = self.ranks.get(parts[i] + parts[i + 1])
                if rank is not None and (best is None or rank < best):
                    best, at = rank, i
            if at < 0:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        return [self.ranks[p] for p in parts]


def find_tokenizer(folder: pathlib.Path) -> pathlib.Path | None:
    """The folder holding ``emu3.tiktoken`` and ``emu3_vision_tokens.txt``: the model folder, else a
    ``tokenizer_emu3_ibq`` or ``tokenizer`` folder beside it."""
    for d in (folder, *(folder.parent / name for name in TOKENIZER_FOLDERS)):
        if (d / TIKTOKEN_FILE).is_file() and (d / VISION_TOKENS_FILE).is_file():
            return d
    return None


def load_tokenizer(folder: pathlib.Path) -> Emu35Tokenizer:
    where = find_tokenizer(folder)
    if where is None:
        places = ", ".join(str(folder.parent / name) for name in TOKENIZER_FOLDERS)
        raise CheckpointError(f"{folder}: Emu3.5's text tokenizer is not there: {TIKTOKEN_FILE} and "
                              f"{VISION_TOKENS_FILE} (not part of the release: the authors load them from their "
                              "repository, baaivision/Emu3.5 src/tokenizer_emu3_ibq/) must both be in the model folder "
                              f"or in one of {places}")
    return Emu35Tokenizer.load(where)


# -- the model --------------------------------------------------------------------------------------------------
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "head_dim", "max_position_embeddings")
#: the authors' Emu3Config defaults of the fields a release may leave out
DEFAULTS = {"num_key_value_heads": None, "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
            "rope_scaling": None, "tie_word_embeddings": False, "pretraining_tp": 1}


def qwen3_config(settings: dict, source) -> "transformers.Qwen3Config":  # noqa: F821
    """The authors' ``Emu3Config`` fields as the ``Qwen3Config`` whose model computes what theirs does."""
    from transformers import Qwen3Config
    from transformers.activations import ACT2FN

    missing = [k for k in REQUIRED if not isinstance(settings.get(k), int) or isinstance(settings.get(k), bool)]
    if missing:
        raise CheckpointError(f"{source}: config.json lacks {', '.join(missing)} (integers in Emu3.5's config)")
    s = {**DEFAULTS, **{k: v for k, v in settings.items() if v is not None or k == "rope_scaling"}}
    scaling = s["rope_scaling"]
    if scaling is not None:
        kind, factor = (scaling.get("type"), scaling.get("factor")) if isinstance(scaling, dict) else (None, None)
        if kind not in ("linear", "dynamic") or not isinstance(factor, float) or factor <= 1.0:
            raise CheckpointError(f"{source}: rope_scaling {scaling!r}: the authors' model takes none, or "
                                  "{'type': 'linear' or 'dynamic', 'factor': a float above 1}")
        # dynamic NTK scaling changes the frequencies only past max_position_embeddings, which sizes never reach
        scaling = {"rope_type": "linear", "factor": factor} if kind == "linear" else None
    if s["hidden_act"] not in ACT2FN:
        raise CheckpointError(f"{source}: hidden_act {s['hidden_act']!r} is no activation transformers knows")
    kv = s["num_key_value_heads"] or s["num_attention_heads"]
    if s["num_attention_heads"] % kv:
        raise CheckpointError(f"{source}: num_key_value_heads {kv} does not divide num_attention_heads "
                              f"{s['num_attention_heads']}")
    return Qwen3Config(
        vocab_size=s["vocab_size"], hidden_size=s["hidden_size"], intermediate_size=s["intermediate_size"],
        num_hidden_layers=s["num_hidden_layers"], num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=kv, head_dim=s["head_dim"], hidden_act=s["hidden_act"],
        max_position_embeddings=s["max_position_embeddings"], rms_norm_eps=float(s["rms_norm_eps"]),
        rope_theta=float(s["rope_theta"]), rope_scaling=scaling, tie_word_embeddings=bool(s["tie_word_embeddings"]),
        attention_bias=False, attention_dropout=0.0, use_sliding_window=False,
        pad_token_id=s.get("pad_token_id"), bos_token_id=s.get("bos_token_id"), eos_token_id=s.get("eos_token_id"))


def weight_names(folder: pathlib.Path) -> set[str]:
    """The tensor names of a transformers folder, from its weight index or the safetensors headers."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return set((read_json(index).get("weight_map") or {}).keys())
    names = set()
    for f in weight_files(folder):
        if f.suffix == ".safetensors" and f.is_file():
            names |= set(peek(f))
    return names


QK_NORM = re.compile(r"model\.layers\.\d+\.self_attn\.([qk])_norm\.weight")


def is_emu35(folder: pathlib.Path) -> bool:
    """An Emu3.5 release folder: the authors' ``model_type "Emu3"`` (Emu3 v1's too), per-head query and key
    norms in the weights and a ``head_dim`` field (Emu3 v1 has neither)."""
    settings = transformers_config(folder) or {}
    if str(settings.get("model_type", "")).lower() != "emu3" or "head_dim" not in settings:
        return False
    norms = {m.group(1) for m in map(QK_NORM.fullmatch, weight_names(folder)) if m}
    return norms == {"q", "k"}


def load_model(folder, device="cpu", dtype=torch.float32, tokenizer: Emu35Tokenizer | None = None):
    """``(Qwen3ForCausalLM, Emu35Tokenizer)`` from an Emu3.5 release folder, built with its parameters on the meta
    device and given the shards' tensors in ``dtype`` (no second copy of the weights)."""
    from transformers import Qwen3ForCausalLM

    folder = pathlib.Path(folder)
    settings = read_json(folder / "config.json")
    config = qwen3_config(settings, folder / "config.json")
    tokenizer = tokenizer or load_tokenizer(folder)  # before the weights are read
    check_vocabulary(tokenizer, config.vocab_size, folder)
    files = checked_weight_files(folder)
    weights = read_weights(files, full_dtype(dtype, device))
    model = empty_model(Qwen3ForCausalLM, config)
    if config.tie_word_embeddings and "model.embed_tokens.weight" in weights:  # the head is the embedding, as there
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    assign_weights(model, weights, files[0] if len(files) == 1 else folder, "an Emu3.5 model")
    return place(model, dtype, device).eval(), tokenizer


def check_vocabulary(tokenizer: Emu35Tokenizer, vocab_size: int, folder) -> None:
    """The tokenizer's ids must fit the model's vocabulary, and its visual tokens name each code once."""
    codes = sorted(tokenizer.codes.values())
    if not codes or codes != list(range(len(codes))):
        raise CheckpointError(f"{tokenizer.source}: {VISION_TOKENS_FILE} must name <|visual token NNNNNN|> for codes "
                              f"0..n-1, each once ({len(codes)} visual tokens found)")
    if len(tokenizer) > vocab_size:
        raise CheckpointError(f"{folder}: the tokenizer ({tokenizer.source}) has {len(tokenizer)} ids, more than the "
                              f"model's vocabulary (config.json vocab_size {vocab_size}): another model's tokenizer")


class Emu35Vocabulary:
    """The ids of the grammar (looked up by name) and the visual id <-> code map of a tokenizer."""

    def __init__(self, tokenizer: Emu35Tokenizer, vocab_size: int):
        self.bos, self.eol, self.img, self.boi, self.eoi = map(tokenizer.token_id, (BOS, EOL, IMG, BOI, EOI))
        self.pad = tokenizer.token_id("<|endoftext|>")
        ids = torch.tensor(sorted(tokenizer.codes), dtype=torch.long)
        self.image_ids = ids
        self.id2code = torch.full((vocab_size,), -1, dtype=torch.long)
        self.id2code[ids] = torch.tensor([tokenizer.codes[int(i)] for i in ids])
        self.code2id = torch.empty(len(ids), dtype=torch.long)
        self.code2id[self.id2code[ids]] = ids


class Emu35Adapter(TransformersAdapter):
    guidance = "log_softmax"
    sampling_defaults = {"cfg_scale": 5.0, "top_k": 5120, "top_p": 1.0, "temperature": 1.0}

    def __init__(self, model, tokenizer: Emu35Tokenizer, rows: int, cols: int, codebook: torch.Tensor | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.inner, self.head = model.model, model.lm_head
        self.device = next(model.parameters()).device
        self.vocab_size = model.config.vocab_size
        self.vocab = v = Emu35Vocabulary(tokenizer, self.vocab_size)
        self.rows, self.cols = rows, cols
        stride = cols + 1
        forced = {r * stride + cols: v.eol for r in range(rows - 1)}  # a row token after every row but the last
        forced[rows * stride - 1] = v.eoi
        self.layout = TokenLayout.raster(rows, cols, self.vocab_size, v.image_ids, forced, stride, rows * stride)
        self.id2code = v.id2code.to(self.device)
        self.codebook = codebook
        self.cache = None

    def check_conditions(self, conditions, negatives):
        super().check_conditions(conditions, None)
        bad = [n for n in negatives or () if n is not None and not isinstance(n, str)]
        if bad:
            raise ValueError(f"negative prompt must be text for Emu3.5 (got {shorten(bad[0])})")

    def header(self) -> list[int]:
        """``<|image start|>{rows}*{cols}<|image token|>``: what the authors' processor forces once the model has
        written ``<|image start|>`` (the size digits encoded as their ``tokenizer.encode`` does)."""
        v = self.vocab
        return [v.boi] + self.tokenizer.encode(f"{self.rows}*{self.cols}") + [v.img]

    def prompt_ids(self, prompt: str) -> list[int]:
        ids = self.tokenizer.encode(TEMPLATE.format(prompt=prompt))
        if ids[:1] != [self.vocab.bos]:  # inference.py puts BOS in front when the prompt does not start with it
            ids = [self.vocab.bos] + ids
        return ids + self.header()

    def negative_ids(self, negative: str | None) -> list[int]:
        return self.tokenizer.encode(NEGATIVE_TEMPLATE.format(negative=negative or "")) + self.header()

    def unconditional_ids(self) -> list[int]:
        return self.negative_ids(None)

    def condition_rows(self, conditions, negatives, guided):
        rows = [self.prompt_ids(p) for p in conditions]
        if guided:
            negs = list(negatives) if negatives is not None else [None] * len(conditions)
            rows += [self.negative_ids(n) for n in negs]
        return rows

    def pad_id(self) -> int:
        return self.vocab.pad  # any id: the left padding is masked

    def token_vectors(self):
        if self.codebook is None:
            return None
        return self.vocab.code2id.clone(), self.codebook.to(self.device)

    def codes_of(self, tokens: torch.Tensor) -> torch.Tensor:
        codes = self.id2code[tokens.to(self.device)]
        if bool((codes < 0).any()):
            raise ValueError("Emu3.5 decode: the tokens include ids that are not visual tokens")
        return codes


# -- sizes, the vision tokenizer, loading -------------------------------------------------------------------------
def stream_length(width: int, height: int, patch: int = PATCH) -> int:
    return (height // patch) * (width // patch + 1)


def check_size(width, height, max_positions: int, patch: int = PATCH) -> None:
    for name, v in (("width", width), ("height", height)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v % patch:
            raise ValueError(f"{name} must be a positive multiple of {patch} pixels for Emu3.5 (got {v})")
    tokens = stream_length(width, height, patch)
    if tokens + PROMPT_ROOM > max_positions:
        raise ValueError(f"{width}x{height} needs {tokens} image tokens, more than Emu3.5's {max_positions} "
                         f"positions leave after a prompt ({max_positions - PROMPT_ROOM})")


def default_size(max_positions: int, patch: int = PATCH) -> tuple[int, int]:
    """The authors' default (``55*73`` codes) where the positions hold it, else the largest square that fits."""
    rows, cols = DEFAULT_GRID
    if rows * (cols + 1) + PROMPT_ROOM <= max_positions:
        return cols * patch, rows * patch
    side = 1
    while (side + 1) * (side + 2) + PROMPT_ROOM <= max_positions:
        side += 1
    return side * patch, side * patch


def load(folder, vq=None, device="cpu", dtype=torch.float32, width=None, height=None):
    """A :class:`~.base.LoadedModel` for an Emu3.5 folder and its IBQ vision tokenizer (``vq``: its folder; found
    beside the model or in it when not given)."""
    from ..decoders.ibq import IBQDecoder, IBQSpec, find_ibq, release_files
    from .base import LoadedModel

    folder = pathlib.Path(folder)
    settings = read_json(folder / "config.json")
    max_positions = settings.get("max_position_embeddings")
    if not isinstance(max_positions, int):
        raise CheckpointError(f"{folder / 'config.json'}: no max_position_embeddings (an integer in Emu3.5's config)")
    where = find_ibq(folder, vq)  # beside the model (where the authors' configs put it: weights/Emu3.5 and
    if where is None:  # weights/Emu3.5-VisionTokenizer), in it, or given
        raise CheckpointError(f"{folder}: Emu3.5 needs its IBQ vision tokenizer to make images (BAAI/Emu3.5-"
                              "VisionTokenizer: config.yaml and model.ckpt, not part of the model's release): put "
                              "that folder beside the model (as Emu3.5-VisionTokenizer) or give --vq FOLDER"
                              + (f" ({vq} holds no config.yaml and model.ckpt)" if vq else ""))
    spec = IBQSpec.from_yaml(release_files(where)[0])  # its architecture: sizes are checked before any weights
    patch = spec.downsample
    if not width and not height:
        width, height = default_size(max_positions, patch)
    width, height = width or height, height or width
    check_size(width, height, max_positions, patch)
    tokenizer = load_tokenizer(folder)
    if len(tokenizer.codes) != spec.n_embed:
        raise CheckpointError(f"{where}: the IBQ tokenizer has {spec.n_embed} codes but {tokenizer.source}/"
                              f"{VISION_TOKENS_FILE} names {len(tokenizer.codes)} visual tokens")
    decoder = IBQDecoder.load(where, device=device, dtype=full_dtype(dtype, device))
    model, tokenizer = load_model(folder, device, dtype, tokenizer)
    sizes = tuple(s for s in SIZES if s % patch == 0 and stream_length(s, s, patch) + PROMPT_ROOM <= max_positions)

    def build(size) -> LoadedModel:
        w, h = (size, size) if isinstance(size, int) else size
        check_size(w, h, max_positions, patch)
        adapter = Emu35Adapter(model, tokenizer, h // patch, w // patch, decoder.codebook())

        def decode(tokens: torch.Tensor) -> torch.Tensor:
            return decoder.decode(adapter.codes_of(tokens))

        return LoadedModel(family=FAMILY_NAME, name=f"Emu3.5 ({folder.name})", adapter=adapter, decode=decode,
                           condition="text", resolutions=tuple(sorted({*sizes, w, h})), resize=build,
                           info={"resolution": w if w == h else None, "width": w, "height": h,
                                 "grid": adapter.layout.grid, "vq": str(where), "tokenizer": tokenizer.source},
                           modules={"emu35": model, "ibq": decoder.model},
                           decode_bytes_per_image=decoder.bytes_per_image(adapter.layout.grid))

    return build((width, height))


def _detect(path: pathlib.Path) -> Detected | None:
    return Detected(FAMILY_NAME, path, "Emu3") if path.is_dir() and is_emu35(path) else None


def _load(hit: Detected, o: LoadOptions):
    return load(hit.path, o.vq, o.device, o.storage or o.dtype, o.width or o.resolution, o.height or o.resolution)


FAMILY = Family(
    FAMILY_NAME, detect=_detect, load=_load, square=False,
    needs="an Emu3.5 folder (BAAI/Emu3.5-Image or BAAI/Emu3.5): config.json with model_type 'Emu3' and head_dim, "
          "weights with per-head q_norm / k_norm, and BAAI's emu3.tiktoken + emu3_vision_tokens.txt in it or in a "
          "tokenizer_emu3_ibq or tokenizer folder beside it; with BAAI/Emu3.5-VisionTokenizer beside it or given "
          "(Emu3 v1's own release, model_type 'Emu3' without q_norm / k_norm, loads converted: Emu3-Gen-hf)")
