"""LlamaGen (FoundationVision/LlamaGen): class- and text-conditional GPTs.

The GPT is Llama-style: fused ``wqkv`` attention, SwiGLU feed-forward, RMSNorm
(eps 1e-5), 2D rotary embeddings whose rows for the condition positions are
zero (so condition queries and keys vanish, as in the reference), and either a
class embedding table (c2i, null class = number of classes, one condition
token) or a caption projection of flan-t5-xl features with a learned
unconditional embedding (t2i, 120 left-padded condition tokens).

Loads the released ``.pt`` files (weights under ``model``/``module``/
``state_dict`` or raw; a stray ``freqs_cis`` is ignored), the same weights as
``.safetensors``, and folders in transformers' layout (LANTERN's converted
``LlamaGen-T2I``: config.json with ``cls_token_num``, ``model.layers.N.self_attn.q_proj``
...).  The size (B, L, XL, XXL, 3B, ...) is read from the weights.
The image grid is not stored in the weights (rotary tables are computed), except
in old files that carry ``freqs_cis``.  It comes from, in order: the size asked
for, ``freqs_cis``, the released file name (``c2i_B_256.pt``), else the
reference sampling scripts' resolution (c2i 384 px, t2i 512 px) with a warning.
"""
from __future__ import annotations

import math
import pathlib
import re
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from ..formats.checkpoints import CheckpointError, load_file, load_weights, peek, read_json, state_dict, weight_files
from ..sampling.adapter import ImageAdapter, TokenLayout
from ..sampling.config import shorten
from .family import Detected, Family, NotAModel
from .static_cache import (BUCKET, CAPTURED, StaticKV, capacity_for, new_forwards, padded_width, static_forward,
                           weights_signature)
from .storage import full_dtype, place

#: heads by model width for the released presets (all 64-dim heads but 3B's 100)
HEADS = {768: 12, 1024: 16, 1280: 20, 1536: 24, 2048: 32, 2560: 40, 3200: 32, 4096: 32}
SIZE_NAMES = {(768, 12): "B", (1024, 24): "L", (1280, 36): "XL", (1536, 48): "XXL", (2560, 48): "XXXL",
              (2048, 22): "1B", (3200, 24): "3B", (4096, 32): "7B"}
DOWNSAMPLE = 16


@dataclass(frozen=True)
class GPTSpec:
    dim: int
    n_layer: int
    n_head: int
    ffn_hidden: int
    vocab_size: int
    kind: str  # "c2i" or "t2i"
    num_classes: int = 1000  # c2i
    caption_dim: int = 2048  # t2i
    cond_tokens: int = 1  # 1 (c2i) or 120 (t2i)
    grid: int | None = None  # from a stored freqs_cis, if any
    norm_eps: float = 1e-5
    rope_base: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def name(self) -> str:
        return f"LlamaGen-{SIZE_NAMES.get((self.dim, self.n_layer), f'{self.dim}x{self.n_layer}')} {self.kind}"

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor]) -> "GPTSpec":
        for key in ("tok_embeddings.weight", "layers.0.attention.wqkv.weight", "output.weight"):
            if key not in sd:
                raise CheckpointError(f"not a LlamaGen GPT: missing {key!r}")
        vocab, dim = sd["tok_embeddings.weight"].shape
        n_layer = 1 + max(int(m.group(1)) for k in sd if (m := re.match(r"layers\.(\d+)\.", k)))
        n_head = HEADS.get(dim, max(1, dim // 64))
        if sd["layers.0.attention.wqkv.weight"].shape[0] != 3 * dim:
            raise CheckpointError("grouped-query LlamaGen checkpoints are not supported (wqkv is not 3 x dim)")
        ffn = sd["layers.0.feed_forward.w1.weight"].shape[0]
        if "cls_embedding.embedding_table.weight" in sd:
            kind, extra = "c2i", {"num_classes": sd["cls_embedding.embedding_table.weight"].shape[0] - 1}
        elif "cls_embedding.cap_proj.fc1.weight" in sd:
            unc = sd["cls_embedding.uncond_embedding"]
            kind, extra = "t2i", {"caption_dim": unc.shape[1], "cond_tokens": unc.shape[0]}
        else:
            raise CheckpointError("LlamaGen GPT without a class table or a caption projection")
        grid = None
        if "freqs_cis" in sd:  # [cond + grid^2, head_dim / 2, 2] in old files
            cond = extra.get("cond_tokens", 1)
            grid = math.isqrt(sd["freqs_cis"].shape[0] - cond)
        return cls(dim=dim, n_layer=n_layer, n_head=n_head, ffn_hidden=ffn, vocab_size=vocab, kind=kind,
                   grid=grid, **extra)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, s: GPTSpec):
        super().__init__()
        self.n_head, self.head_dim = s.n_head, s.head_dim
        self.wqkv = nn.Linear(s.dim, 3 * s.dim, bias=False)
        self.wo = nn.Linear(s.dim, s.dim, bias=False)

    def forward(self, x, rope, cache, layer, mask):
        n, L, _ = x.shape
        q, k, v = self.wqkv(x).view(n, L, 3, self.n_head, self.head_dim).unbind(2)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        k, v = cache.write(layer, k.transpose(1, 2), v.transpose(1, 2))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(n, L, -1))


class FeedForward(nn.Module):
    def __init__(self, s: GPTSpec):
        super().__init__()
        self.w1 = nn.Linear(s.dim, s.ffn_hidden, bias=False)
        self.w3 = nn.Linear(s.dim, s.ffn_hidden, bias=False)
        self.w2 = nn.Linear(s.ffn_hidden, s.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, s: GPTSpec):
        super().__init__()
        self.attention, self.feed_forward = Attention(s), FeedForward(s)
        self.attention_norm, self.ffn_norm = RMSNorm(s.dim, s.norm_eps), RMSNorm(s.dim, s.norm_eps)

    def forward(self, x, rope, cache, layer, mask):
        h = x + self.attention(self.attention_norm(x), rope, cache, layer, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class LabelEmbedder(nn.Module):
    def __init__(self, s: GPTSpec):
        super().__init__()
        self.embedding_table = nn.Embedding(s.num_classes + 1, s.dim)  # last row: the null class


class CaptionProjection(nn.Module):
    def __init__(self, s: GPTSpec):
        super().__init__()
        self.fc1 = nn.Linear(s.caption_dim, s.dim, bias=False)
        self.fc2 = nn.Linear(s.dim, s.dim, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    def __init__(self, s: GPTSpec):
        super().__init__()
        self.cap_proj = CaptionProjection(s)
        self.register_buffer("uncond_embedding", torch.zeros(s.cond_tokens, s.caption_dim))


class LlamaGenGPT(nn.Module):
    """The network; parameter names match the checkpoints."""

    def __init__(self, spec: GPTSpec):
        super().__init__()
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.dim)
        self.cls_embedding = LabelEmbedder(spec) if spec.kind == "c2i" else CaptionEmbedder(spec)
        self.layers = nn.ModuleList(Block(spec) for _ in range(spec.n_layer))
        self.norm = RMSNorm(spec.dim, spec.norm_eps)
        self.output = nn.Linear(spec.dim, spec.vocab_size, bias=False)

    def forward(self, h, rope, cache, mask):
        """Hidden states ``[N, L, dim]`` at the cache's next positions -> logits
        ``[N, L, vocab]`` (float32)."""
        return self.output(self.features(h, rope, cache, mask)).float()

    def features(self, h, rope, cache, mask):
        """The last hidden states after the final norm (what ``output`` reads, and
        what a draft head learns to predict)."""
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, mask)
        return self.norm(h)

    def sequence_logits(self, cond_h: torch.Tensor, tokens: torch.Tensor, grid: int,
                        cond_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher-forced logits ``[N, T, vocab]`` of a whole image (training and
        scoring): row ``t`` predicts image token ``t`` from the condition
        ``cond_h`` ``[N, C, dim]`` and ``tokens[:, :t]``."""
        n, c = cond_h.shape[:2]
        h = torch.cat([cond_h, self.tok_embeddings(tokens[:, :-1])], 1)
        s = h.shape[1]
        rope = rope_table(self.spec, grid, 0).to(h.device)[:s].expand(n, -1, -1, -1)
        allowed = torch.ones(s, s, dtype=torch.bool, device=h.device).tril().repeat(n, 1, 1)
        if cond_mask is not None:  # padded condition keys are invisible; each row sees itself
            allowed[:, :, :c] &= cond_mask.bool()[:, None, :]
            allowed |= torch.eye(s, dtype=torch.bool, device=h.device)
        return self(h, rope, WholeSequence(), allowed.unsqueeze(1))[:, c - 1:]


class WholeSequence:
    """Stands in for the KV cache when a forward sees the whole sequence."""

    @staticmethod
    def write(layer, k, v):
        return k, v


def rope_table(spec: GPTSpec, grid: int, extra: int) -> torch.Tensor:
    """The GPT's table: :func:`grid_rope` after ``cond_tokens`` zero rows."""
    return grid_rope(spec.head_dim, spec.rope_base, grid, extra, spec.cond_tokens)


def grid_rope(head_dim: int, base: float, grid: int, extra: int, zero_rows: int) -> torch.Tensor:
    """``[zero_rows + positions, head_dim / 2, 2]`` (cos, sin): zero rows for the
    condition (its queries and keys vanish), then the image positions in raster
    order (row angles in the first half of the pairs, column angles in the
    second), continued past the grid for windows that run over the end."""
    quarter = head_dim // 4
    freqs = 1.0 / base ** (torch.arange(quarter, dtype=torch.float64) * 4 / head_dim)
    pos = torch.arange(grid * grid + extra)
    angles = torch.cat([torch.outer((pos // grid).double(), freqs), torch.outer((pos % grid).double(), freqs)], -1)
    table = torch.stack([angles.cos(), angles.sin()], -1).float()
    return torch.cat([torch.zeros(zero_rows, 2 * quarter, 2), table])


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of ``x`` ``[N, L, H, hd]`` by ``rope`` ``[N, L, hd/2, 2]``."""
    pairs = x.float().unflatten(-1, (-1, 2))
    cos, sin = rope[:, :, None, :, 0], rope[:, :, None, :, 1]
    x0, x1 = pairs[..., 0], pairs[..., 1]
    return torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], -1).flatten(-2).type_as(x)


class LlamaGenAdapter(ImageAdapter):
    """Drives a :class:`LlamaGenGPT` for the engine.  Conditions are class ids
    (c2i) or prompts (t2i, through ``text_encoder``)."""

    guidance = "linear"
    MARGIN = 4 * 128  # cache positions past the image: windows may run over its end

    def __init__(self, gpt: LlamaGenGPT, grid: int, codebook: torch.Tensor | None = None, text_encoder=None):
        s = gpt.spec
        self.gpt, self.spec, self.grid = gpt, s, grid
        self.device = gpt.output.weight.device
        self.dtype = gpt.output.weight.dtype
        self.vocab_size = s.vocab_size
        self.feature_size, self.condition_positions, self.rope_grid = s.dim, s.cond_tokens, grid
        self.layout = TokenLayout.raster(grid, grid, s.vocab_size)
        self.codebook = codebook
        self.text_encoder = text_encoder
        self.sampling_defaults = ({"cfg_scale": 4.0, "top_k": 2000} if s.kind == "c2i"
                                  else {"cfg_scale": 7.5, "top_k": 1000})
        self.rope = None
        self.cache = None
        self.batch = 0

    # -- conditions ---------------------------------------------------------
    def network(self) -> nn.Module:
        """The module whose repeated blocks the compiled path compiles."""
        return self.gpt

    def check_conditions(self, conditions, negatives):
        if negatives is not None:
            raise ValueError("LlamaGen has no negative prompt: leave it empty")
        if self.spec.kind == "c2i":
            n = self.spec.num_classes
            bad = [c for c in conditions if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < n]
            if bad:
                raise ValueError(f"class id must be an integer in [0, {n - 1}] for this class-conditional "
                                 f"LlamaGen model (got {shorten(bad[0])})")
        else:
            bad = [c for c in conditions if not isinstance(c, str)]
            if bad:
                raise ValueError(f"prompt must be text for this text-conditional LlamaGen model "
                                 f"(got {shorten(bad[0])})")
            if self.text_encoder is None:
                raise ValueError("this text-conditional LlamaGen model needs a T5 text encoder "
                                 "(a local copy of google/flan-t5-xl)")
            if hasattr(self.text_encoder, "check"):  # a closed vocabulary reports unknown words
                self.text_encoder.check(conditions)

    def _condition_embeddings(self, conditions, guided):
        s, emb = self.spec, self.gpt.cls_embedding
        if s.kind == "c2i":
            cls = torch.tensor(conditions, device=self.device)
            if guided:
                cls = torch.cat([cls, torch.full_like(cls, s.num_classes)])
            return emb.embedding_table(cls).unsqueeze(1), None
        feats, mask = self.text_encoder.encode(conditions, s.cond_tokens)  # left-padded, pads zeroed
        feats = feats.to(self.device, self.dtype)
        mask = mask.to(self.device)
        if guided:
            feats = torch.cat([feats, torch.zeros_like(feats) + emb.uncond_embedding])
            mask = torch.cat([mask, mask])  # the reference masks both halves alike
        return emb.cap_proj(feats), mask

    # -- the engine's calls ---------------------------------------------------
    def prefill(self, conditions, negatives, guided):
        h, mask = self._condition_embeddings(conditions, guided)
        rows, cond = h.shape[0], h.shape[1]
        self.batch = len(conditions)
        T, margin = self.layout.length, self.MARGIN
        if self.rope is None or self.rope.shape[0] < cond + T + margin:
            self.rope = rope_table(self.spec, self.grid, margin).to(self.device)
        s = self.spec
        capacity = capacity_for(cond + T + margin)
        kept = self.cache
        if not (kept is not None and kept.rows == rows and kept.capacity == capacity):  # kept: the graphs path
            self.cache = StaticKV(s.n_layer, s.n_head, s.head_dim, rows, capacity, self.dtype, self.device,
                                  bucket=BUCKET)
            self.graphs = new_forwards(self)
        if self.graphs.enabled:
            self.graphs.check_weights(weights_signature(self.gpt))
        self.cache.reset()
        if mask is not None:
            self.cache.key_ok[:, :cond] = mask.bool()
        return self._run(h)[:, :, -1]

    def forward(self, tokens):
        if self.decode_path == "eager":
            return self._run(self._embed(tokens))
        logits, features = static_forward(self, self.cache, self._static_window, tokens)
        if self.keep_features:
            self.features = features.clone()
        return logits

    def _embed(self, tokens):
        h = self.gpt.tok_embeddings(tokens)
        return h.repeat(self.cache.rows // tokens.shape[0], 1, 1)

    @torch.no_grad()
    def _static_window(self, tokens, keys):
        """The static path's forward: a padded window, ``keys`` cache entries read."""
        pos, mask = self.cache.begin(tokens.shape[1], keys)
        return self._outputs(self.gpt.features(self._embed(tokens), self.rope[pos], self.cache, mask))

    def _outputs(self, features):
        """Hidden states ``[rows, L, H]`` -> logits ``[K, B, L, V]`` and features ``[K, B, L, H]``."""
        logits = self.gpt.output(features).float()
        return (logits.view(-1, self.batch, *logits.shape[1:]),
                features.view(-1, self.batch, *features.shape[1:]))

    @torch.no_grad()
    def _run(self, h):
        L = h.shape[1]
        pos, mask = self.cache.begin(L)
        logits, features = self._outputs(self.gpt.features(h, self.rope[pos], self.cache, mask))
        self.cache.advance([L] * self.cache.rows)
        if self.keep_features:
            self.features = features
        return logits

    def logits_from_features(self, features):
        return self.gpt.output(features.to(self.dtype)).float()

    def input_embeddings(self):
        return self.gpt.tok_embeddings.weight.detach()

    rolls_back_on_device = True

    def rollback(self, n, most=None):
        branches = len(self.cache.host_length) // len(n)
        if isinstance(n, torch.Tensor):
            self.cache.rollback_on_device(n.repeat(branches), most)
        else:
            self.cache.advance([-k for k in n] * branches)

    def sync_lengths(self):
        self.cache.sync_host()

    drops_samples = True

    def keep_samples(self, keep):
        B = self.batch
        self.cache.keep_rows([k * B + b for k in range(self.cache.rows // B) for b in keep])
        self.batch = len(keep)
        self.graphs = new_forwards(self)  # graphs replay the old rows' tensors

    @torch.no_grad()
    def forward_tree(self, tokens, parents, graph=None):
        from ..sampling.tree import ancestors

        if self.decode_path == "eager":
            within, depth = (ancestors(parents), None) if graph is None else graph
            # a graph's forwards are wide: read the keys the static path reads (padded width), for its numbers
            keys = None if graph is None else self.cache.keys_for(padded_width(tokens.shape[1]))
            logits, features = self._static_tree(tokens, within, keys, depth)
            self.cache.advance([tokens.shape[1]] * self.cache.rows)
        else:
            logits, features = static_forward(self, self.cache, self._static_tree, tokens, parents, graph)
            features = features.clone()
        if self.keep_features:
            self.features = features
        return logits

    def _static_tree(self, tokens, within, keys, depth=None):
        """A draft tree's forward: ``within`` ``[B or rows, N, N]`` its ancestor masks (or what
        each node sees, with its ``depth`` ``[B or rows, N]`` given)."""
        reps = self.cache.rows // within.shape[0]
        within = within.repeat(reps, 1, 1)
        depth = within.sum(-1) - 1 if depth is None else depth.repeat(reps, 1)
        pos, mask = self.cache.begin_tree(depth, within, keys=keys)
        return self._outputs(self.gpt.features(self._embed(tokens), self.rope[pos], self.cache, mask))

    def keep_tree(self, nodes, counts):
        branches = len(self.cache.host_length) // len(counts)
        counts = counts.repeat(branches) if isinstance(counts, torch.Tensor) else list(counts) * branches
        self.cache.keep(nodes.repeat(branches, 1), counts)

    def cache_lengths(self):
        return self.cache.length[: self.batch] - self.spec.cond_tokens

    def token_vectors(self):
        if self.codebook is None:
            return None
        return torch.arange(self.codebook.shape[0]), self.codebook

    def cache_bytes(self):
        if self.cache is None:
            return None
        return self.cache.nbytes()

    def live_cache_bytes(self):
        return None if self.cache is None else self.cache.live_bytes()

    def cache_bytes_per_image(self, conditions, negatives, guided):
        s = self.spec  # keys and values: n_head * head_dim = dim per layer and position
        positions = capacity_for(s.cond_tokens + self.layout.length + self.MARGIN)
        return self.branches(guided) * positions * s.n_layer * 2 * s.dim * self.dtype.itemsize

    def release(self):
        if self.decode_path not in CAPTURED:  # captured forwards keep reading this cache
            self.cache = None


RESOLUTIONS = (256, 384, 512)
DEFAULT_RESOLUTION = {"c2i": 384, "t2i": 512}  # the reference sampling scripts


#: transformers-style names (LANTERN's converted folders, e.g. jadohu/LlamaGen-T2I) -> LlamaGen's own;
#: q_proj / k_proj / v_proj are joined into wqkv in that order (their rotary stays interleaved, unpermuted)
HF_NAMES = [(r"model\.embed_tokens\.", "tok_embeddings."), (r"model\.cls_embedding\.", "cls_embedding."),
            (r"model\.layers\.(\d+)\.self_attn\.o_proj\.", r"layers.\1.attention.wo."),
            (r"model\.layers\.(\d+)\.mlp\.gate_proj\.", r"layers.\1.feed_forward.w1."),
            (r"model\.layers\.(\d+)\.mlp\.up_proj\.", r"layers.\1.feed_forward.w3."),
            (r"model\.layers\.(\d+)\.mlp\.down_proj\.", r"layers.\1.feed_forward.w2."),
            (r"model\.layers\.(\d+)\.input_layernorm\.", r"layers.\1.attention_norm."),
            (r"model\.layers\.(\d+)\.post_attention_layernorm\.", r"layers.\1.ffn_norm."),
            (r"model\.norm\.", "norm."), (r"lm_head\.", "output.")]


def is_hf_folder(path: pathlib.Path) -> bool:
    """A LlamaGen GPT in transformers' layout: config.json with LlamaGen's ``cls_token_num``."""
    return path.is_dir() and (path / "config.json").is_file() and "cls_token_num" in read_json(path / "config.json")


def from_hf_names(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in sd.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.weight", key)
        if m:
            if m.group(2) == "q":
                parts = [sd[f"model.layers.{m.group(1)}.self_attn.{x}_proj.weight"] for x in "qkv"]
                out[f"layers.{m.group(1)}.attention.wqkv.weight"] = torch.cat(parts)
            continue
        for pattern, repl in HF_NAMES:
            key, n = re.subn("^" + pattern, repl, key)
            if n:
                break
        out[key] = value
    return out


def _read_gpt(path: pathlib.Path) -> tuple[dict, GPTSpec]:
    """State dict and architecture of a GPT file, or of a transformers-layout folder
    (its ``num_attention_heads`` and ``block_size`` are read from its config)."""
    if path.is_dir():
        config = read_json(path / "config.json")
        files = weight_files(path)
        if not files:
            raise CheckpointError(f"{path}: no weights (model*.safetensors or pytorch_model*.bin) beside its "
                                  "config.json: the download is incomplete")
        sd = from_hf_names({k: v for f in files for k, v in state_dict(load_file(f)).items()})
        spec = GPTSpec.from_state_dict(sd)
        heads, block = config.get("num_attention_heads"), config.get("block_size")
        return sd, replace(spec, n_head=int(heads or spec.n_head),
                           grid=math.isqrt(int(block)) if block else spec.grid)
    sd = state_dict(load_file(path))
    return sd, GPTSpec.from_state_dict(sd)


def load_gpt(path, device="cpu", dtype=torch.float32) -> LlamaGenGPT:
    """A LlamaGen GPT from ``.pt`` (any wrapper) or ``.safetensors``, or a folder in
    transformers' layout (LANTERN's converted LlamaGen)."""
    try:
        sd, spec = _read_gpt(pathlib.Path(path))
    except CheckpointError as err:
        raise CheckpointError(f"{path}: {err}" if str(path) not in str(err) else str(err)) from err
    gpt = LlamaGenGPT(spec)
    load_weights(gpt, {k: v for k, v in sd.items() if k != "freqs_cis"}, path, spec.name)  # freqs_cis: recomputed
    return place(gpt, dtype, device).eval()


def load(model_path, vq_path=None, text_encoder_path=None, resolution: int | None = None,
         device="cpu", dtype=torch.float32):
    """A :class:`~.base.LoadedModel` for a LlamaGen GPT, its VQ tokenizer (for
    images and LANTERN/VVS neighbourhoods) and, for t2i, a T5 folder."""
    from ..decoders.vq16 import VQ16Decoder
    from .base import LoadedModel

    gpt = load_gpt(model_path, device, dtype)
    spec = gpt.spec
    vq = VQ16Decoder.load(vq_path, device=device, dtype=full_dtype(dtype, device)) if vq_path else None
    if vq is not None and vq.spec.codebook_size != spec.vocab_size:
        raise CheckpointError(f"{vq_path}: codebook of {vq.spec.codebook_size} codes does not match the "
                              f"GPT's {spec.vocab_size}-token vocabulary ({model_path})")
    text = None
    if spec.kind == "t2i" and text_encoder_path:
        from .t5 import T5TextEncoder

        text = T5TextEncoder(text_encoder_path, device=device, dtype=full_dtype(dtype, device))
        if text.dim != spec.caption_dim:
            raise CheckpointError(f"{text_encoder_path}: T5 width {text.dim} does not match the GPT's caption "
                                  f"projection input {spec.caption_dim} (flan-t5-xl)")
    codebook = vq.codebook() if vq is not None else None

    def build(res: int) -> LoadedModel:
        ds = vq.spec.downsample if vq is not None else DOWNSAMPLE
        if res % ds:
            raise ValueError(f"resolution must be a multiple of {ds} for this tokenizer (got {res})")
        grid = res // ds
        adapter = LlamaGenAdapter(gpt, grid, codebook, text)
        return LoadedModel(
            family="llamagen", name=spec.name, adapter=adapter,
            decode=vq.decode if vq is not None else None,
            condition="class" if spec.kind == "c2i" else "text",
            resolutions=RESOLUTIONS, resize=build,
            info={"resolution": res, "grid": grid, "spec": spec, "vq": vq.source if vq else None},
            decode_bytes_per_image=vq.bytes_per_image((grid, grid)) if vq is not None else 0,
            modules={"gpt": gpt, **({"vq": vq.model} if vq else {}), **({"text": text.model} if text else {})},
        )

    ds = vq.spec.downsample if vq is not None else DOWNSAMPLE
    warnings = []
    if resolution is None and spec.grid:
        resolution = spec.grid * ds
    elif resolution is None and (resolution := resolution_hint(model_path)) is None:
        resolution = DEFAULT_RESOLUTION[spec.kind]
        warnings.append(f"{pathlib.Path(model_path).name}: the image size is stored neither in the weights nor in "
                        f"the file name (as _256 / _384 / _512); using the reference default {resolution} px. Pass "
                        "the size the model was trained at (--resolution, or the sampler's resolution) if it differs")
    loaded = build(resolution)
    loaded.warnings += warnings
    return loaded


def resolution_hint(path) -> int | None:
    """The image size a released file's name carries (``c2i_L_256.pt``, ``t2i_XL_stage2_512.pt``)."""
    m = re.search(r"(?:^|[_-])(256|384|512)(?=[_.-]|$)", pathlib.Path(path).stem)
    return int(m.group(1)) if m else None


# -- detection --------------------------------------------------------------------------
def classify_file(path: pathlib.Path) -> Detected | None:
    """A LlamaGen GPT or VQ tokenizer file, told apart by its tensor names."""
    keys = peek(path)
    if "tok_embeddings.weight" in keys and any(k.endswith("attention.wqkv.weight") for k in keys):
        kind = "t2i" if "cls_embedding.uncond_embedding" in keys else "c2i"
        return Detected("llamagen", path, kind)
    if "quantize.embedding.weight" in keys and any(k.startswith("decoder.conv_blocks.") for k in keys):
        return Detected("llamagen-vq", path)
    return None


def _try(p: pathlib.Path) -> Detected | None:
    try:
        return classify_file(p)
    except (CheckpointError, RuntimeError, OSError):
        return None


FOLDER_SUFFIXES = (".pt", ".pth", ".safetensors", ".bin")


def gpts_in(folder: pathlib.Path) -> list[Detected]:
    """The LlamaGen GPT files directly in ``folder``."""
    files = sorted(p for p in folder.iterdir() if p.suffix in FOLDER_SUFFIXES)
    return [d for p in files if (d := _try(p)) and d.family == "llamagen"]


def find_vq(gpt_path: pathlib.Path) -> pathlib.Path | None:
    """A LlamaGen VQ tokenizer next to a GPT file, if exactly one is there."""
    hits = [p for p in sorted(gpt_path.parent.iterdir())
            if p != gpt_path and p.suffix in (".pt", ".pth", ".safetensors") and (d := _try(p))
            and d.family == "llamagen-vq"]
    return hits[0] if len(hits) == 1 else None


def _detect(path: pathlib.Path) -> Detected | None:
    """A GPT file, a folder without ``config.json`` holding exactly one, or a GPT
    folder in transformers' layout."""
    if path.is_dir():
        if is_hf_folder(path):
            return Detected("llamagen", path, "c2i" if read_json(path / "config.json").get("input_type") == "c2i"
                            else "t2i")
        if (path / "config.json").is_file():
            return None
        gpts = gpts_in(path)
        return gpts[0] if len(gpts) == 1 else None
    hit = classify_file(path)
    if hit is not None and hit.family == "llamagen-vq":
        raise NotAModel(f"{path}: this is a LlamaGen VQ tokenizer, not a model; give it as the VQ decoder and "
                        "point the model at the GPT file")
    return hit


FAMILY = Family(
    "llamagen", detect=_detect,
    needs="a LlamaGen GPT file (.pt/.pth/.safetensors holding tok_embeddings.weight and "
          "layers.N.attention.wqkv.weight), with its VQ tokenizer file (vq_ds16_*.pt) beside or given",
    load=lambda hit, o: load(hit.path, o.vq or find_vq(hit.path), o.text_encoder, o.resolution, o.device,
                             o.storage or o.dtype))
