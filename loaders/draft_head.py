"""EAGLE-style draft heads: LANTERN's released drafters and the ones ``spec-ar
train-drafter`` writes.

A draft head (Li et al., EAGLE; the architecture LANTERN releases for LlamaGen)
predicts the target's next *feature* (its last hidden state after the final
norm) from the target's feature at position ``s - 1`` and the token at ``s``:

    g_s = layers(fc([embed_tokens(x_s) ; f_{s-1}]))      g_s ~ f_s

and the target's own output head turns ``g_s`` into the draft distribution of
``x_{s+1}``.  Later drafts feed the head's own ``g`` in place of ``f``.  The
layers are Llama decoder layers without an input norm in the first one and
without a final norm (the features are already normalised).

Positions: LANTERN's LlamaGen heads use LlamaGen's 2D rotary table, indexed by
the position of the token a head input carries; text-to-image heads first read
the caption (``condition_inputs`` = 119 inputs pairing the caption's features
with token 0, with zero rotary rows), class-to-image heads start at image token 0.

Files: a folder with ``config.json`` and ``pytorch_model.bin`` (read weights-only)
or ``model.safetensors``.  LANTERN's LlamaGen config is the target's Llama config
with ``num_hidden_layers`` 1 and ``input_type`` ``c2i`` (24 x 24 grid), ``t2i`` (16 x 16,
119 caption inputs) or ``t2i2`` (32 x 32, 119).  Its Anole drafter has Anole's
Chameleon config with one layer: an input norm in every layer, q/k LayerNorms per
head, Chameleon's 1D rotary (half-split pairs, reordered here to LlamaGen's
neighbouring pairs at load), and the prompt read first, each prompt feature with the
next prompt token.  Ours adds a
``spec_ar_drafter`` block (grid or 1D positions, condition inputs, the target it
was trained for).
Key names are LANTERN's: ``embed_tokens``, ``fc``, ``layers.N.self_attn.{q,k,v,o}_proj``,
``layers.N.mlp.{gate,up,down}_proj``, ``layers.N.{input,post_attention}_layernorm``.
"""
from __future__ import annotations

import pathlib
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..formats.checkpoints import CheckpointError, load_file, load_weights, peek, read_json, state_dict
from .llamagen import RMSNorm, apply_rope, grid_rope
from .static_cache import StaticKV as KVCache

#: LANTERN's input types: (grid side, caption inputs before image token 0)
LANTERN_INPUTS = {"c2i": (24, 0), "t2i": (16, 119), "t2i2": (32, 119)}
FORMAT = "spec_ar_drafter"
WEIGHTS = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class HeadSpec:
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    layers: int
    vocab: int
    eps: float = 1e-6
    fc_bias: bool = True
    qkv_bias: bool = False
    grid: int | None = None  # 2D rotary positions on this grid; None: 1D positions (the input's index)
    condition_inputs: int = 0  # inputs before image token 0 (caption features paired with token 0)
    rope_base: float = 10000.0
    # LANTERN's Chameleon (Anole) heads: the prompt is read first (its features, each with the
    # next prompt token), every layer has an input norm, q and k get a LayerNorm per head
    prompt_inputs: bool = False
    first_norm: bool = False
    qk_norm: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_config(cls, config: dict, source) -> "HeadSpec":
        ours = config.get(FORMAT) or {}
        if not ours and config.get("input_type") not in LANTERN_INPUTS and config.get("model_type") != "chameleon":
            raise CheckpointError(f"{source}: not a draft head: config.json has neither a {FORMAT!r} block nor "
                                  f"LANTERN's input_type ({', '.join(LANTERN_INPUTS)}) or Chameleon model_type; "
                                  f"got input_type {config.get('input_type')!r}")
        try:
            hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
            fields = dict(hidden=hidden, heads=heads, kv_heads=int(config.get("num_key_value_heads") or heads),
                          intermediate=int(config["intermediate_size"]), layers=int(config["num_hidden_layers"]),
                          vocab=int(config["vocab_size"]), eps=float(config.get("rms_norm_eps", 1e-6)),
                          fc_bias=bool(config.get("bias", True)), qkv_bias=bool(config.get("qkv_bias", False)))
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"{source}: config.json lacks a usable {err} for a draft head") from None
        if ours:
            fields.update(grid=ours.get("grid"), condition_inputs=int(ours.get("condition_inputs", 0)),
                          rope_base=float(ours.get("rope_base", 10000.0)))
        elif config.get("model_type") == "chameleon":  # LANTERN's anole_drafter
            bias = bool(config.get("attention_bias", False))
            fields.update(prompt_inputs=True, first_norm=True, qk_norm=True, attention_bias=bias, qkv_bias=bias,
                          mlp_bias=bool(config.get("mlp_bias", False)),
                          rope_base=float(config.get("rope_theta", 10000.0)))
        else:  # LANTERN's LlamaGen drafters: LlamaGen's base 10000 whatever rope_theta says
            fields["grid"], fields["condition_inputs"] = LANTERN_INPUTS[config["input_type"]]
        return cls(**fields)


class _Attention(nn.Module):
    def __init__(self, s: HeadSpec):
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(s.hidden, s.heads * s.head_dim, bias=s.qkv_bias)
        self.k_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=s.qkv_bias)
        self.v_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=s.qkv_bias)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=s.attention_bias)
        if s.qk_norm:  # Chameleon's: statistics over each head, a weight and bias per head
            self.q_norm = _HeadNorm(s.heads, s.head_dim)
            self.k_norm = _HeadNorm(s.kv_heads, s.head_dim)

    def forward(self, x, rope, cache, layer, mask):
        n, L, _ = x.shape
        s = self.s
        q = self.q_proj(x).view(n, L, s.heads, s.head_dim)
        k = self.k_proj(x).view(n, L, s.kv_heads, s.head_dim)
        if s.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        v = self.v_proj(x).view(n, L, s.kv_heads, s.head_dim)
        k, v = cache.write(layer, k.transpose(1, 2), v.transpose(1, 2))
        if s.kv_heads != s.heads:
            k, v = (t.repeat_interleave(s.heads // s.kv_heads, 1) for t in (k, v))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(n, L, -1))


class _HeadNorm(nn.Module):
    def __init__(self, heads: int, head_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim))

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], eps=1e-5) * self.weight + self.bias


class _MLP(nn.Module):
    def __init__(self, s: HeadSpec):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden, s.intermediate, bias=s.mlp_bias)
        self.up_proj = nn.Linear(s.hidden, s.intermediate, bias=s.mlp_bias)
        self.down_proj = nn.Linear(s.intermediate, s.hidden, bias=s.mlp_bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, s: HeadSpec, index: int):
        super().__init__()
        self.self_attn, self.mlp = _Attention(s), _MLP(s)
        if index or s.first_norm:  # LlamaGen heads: the first layer reads fc's output as it is
            self.input_layernorm = RMSNorm(s.hidden, s.eps)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.eps)

    def forward(self, x, rope, cache, layer, mask):
        h = self.input_layernorm(x) if hasattr(self, "input_layernorm") else x
        x = x + self.self_attn(h, rope, cache, layer, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DraftHead(nn.Module):
    """The network (parameter names as LANTERN's files) and its cache handling."""

    def __init__(self, spec: HeadSpec, name: str = "draft head", config: dict | None = None):
        super().__init__()
        self.spec, self.name, self.config = spec, name, dict(config or {})
        self.embed_tokens = nn.Embedding(spec.vocab, spec.hidden)
        self.fc = nn.Linear(2 * spec.hidden, spec.hidden, bias=spec.fc_bias)
        self.layers = nn.ModuleList(_Layer(spec, i) for i in range(spec.layers))
        self._rope = None

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def forward(self, tokens, features, rope, cache, mask):
        """``tokens`` ``[N, L]`` and the features before them ``[N, L, H]`` -> the
        predicted next features ``[N, L, H]``."""
        h = self.fc(torch.cat([self.embed_tokens(tokens), features.to(self.fc.weight.dtype)], -1))
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, mask)
        return h

    # -- inference with a cache whose rows advance by different amounts -------------------
    def new_cache(self, rows: int, image_positions: int, prompt: int = 0) -> KVCache:
        """A cache for ``rows`` rows of the condition inputs (``condition_inputs``, or
        ``prompt`` for heads that read the prompt) and ``image_positions`` inputs (the
        image and the drafts that run past its end)."""
        s = self.spec
        capacity = s.condition_inputs + prompt + image_positions
        if self._rope is None or self._rope.shape[0] < capacity:
            self._rope = self.rope_table(prompt + image_positions).to(self.device)
        return KVCache(s.layers, s.kv_heads, s.head_dim, rows, capacity, self.fc.weight.dtype, self.device)

    def rope_table(self, positions: int) -> torch.Tensor:
        """``[condition_inputs + positions, head_dim / 2, 2]``: zero rows for the
        caption inputs, then LlamaGen's 2D table on ``grid`` (or 1D positions)."""
        s = self.spec
        if s.grid:
            return grid_rope(s.head_dim, s.rope_base, s.grid, positions - s.grid * s.grid, s.condition_inputs)
        freqs = 1.0 / s.rope_base ** (torch.arange(s.head_dim // 2, dtype=torch.float64) * 2 / s.head_dim)
        angles = torch.outer(torch.arange(s.condition_inputs + positions).double(), freqs)
        return torch.stack([angles.cos(), angles.sin()], -1).float()

    @torch.no_grad()
    def step(self, tokens, features, cache: KVCache) -> torch.Tensor:
        """Append ``L`` inputs per row to ``cache``; their predicted features.  Attention reads
        every entry of the cache (those past a row's length masked): the same keys whether
        the host knows the rows' lengths or the engine's step rolled them back on the device."""
        L = tokens.shape[1]
        pos, mask = cache.begin(L, cache.capacity)
        out = self(tokens, features, self._rope[pos], cache, mask)
        cache.advance([L] * len(cache.host_length))
        return out

    def unrolled(self, tokens, features, rope, passes: int) -> list[torch.Tensor]:
        """Teacher-forced outputs ``[N, T, H]`` of ``passes`` chained passes over a
        whole sequence (training).  Pass 1 reads the true features; pass ``k`` reads
        pass ``k - 1``'s output one position back, as the ``k``-th draft of a chain
        does, and sees what that draft sees: the true inputs up to ``s - k + 1`` and
        the chained ones after them (pass ``j``'s input at ``s - k + j``)."""
        N, T = tokens.shape
        device = tokens.device
        s_idx = torch.arange(T, device=device).unsqueeze(1)
        t_idx = torch.arange(T, device=device).unsqueeze(0)
        memory = _PassMemory(len(self.layers))
        outs, feats = [], features
        for k in range(1, passes + 1):
            blocks = [t_idx <= s_idx - k + 1] + [t_idx == s_idx - k + j for j in range(2, k + 1)]
            out = self(tokens, feats, rope, memory, torch.cat(blocks, 1))  # mask [T, k * T]
            memory.next_pass()
            outs.append(out)
            feats = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], 1)  # g_{s-1} for the input at s
        return outs

    @torch.no_grad()
    def step_tree(self, tokens, features, depth, within, start, cache: KVCache) -> torch.Tensor:
        """Append ``N`` nodes of a draft tree per row (fed level by level): ``depth``
        ``[rows, N]`` their depths below the tree's first level, ``within``
        ``[rows, N, M]`` which of the tree's ``M`` nodes so far (from cache position
        ``start``) each one sees; their predicted features."""
        pos, mask = cache.begin_tree(depth, within, start, cache.capacity)
        out = self(tokens, features, self._rope[pos], cache, mask)
        cache.advance([tokens.shape[1]] * len(cache.host_length))
        return out

    def describe(self) -> dict:
        return {"name": self.name, **asdict(self.spec)}


class _PassMemory:
    """Keys and values of the earlier passes of :meth:`DraftHead.unrolled`, per layer."""

    def __init__(self, layers: int):
        self.past = [[] for _ in range(layers)]
        self.current = [None] * layers

    def write(self, layer: int, k, v):
        self.current[layer] = (k, v)
        keys = [kv[0] for kv in self.past[layer]] + [k]
        values = [kv[1] for kv in self.past[layer]] + [v]
        return torch.cat(keys, 2), torch.cat(values, 2)

    def next_pass(self):
        for layer, kv in enumerate(self.current):
            self.past[layer].append(kv)


def is_draft_head(path) -> bool:
    """A folder holding a draft head: ours (config.json's ``spec_ar_drafter`` block),
    LANTERN's LlamaGen drafters (``input_type``, not a whole converted model), or
    its Anole drafter (a Chameleon config of a few layers whose weights are a head's:
    ``fc`` and ``embed_tokens`` at the top level)."""
    path = pathlib.Path(path)
    if not (path.is_dir() and (path / "config.json").is_file()):
        return False
    config = read_json(path / "config.json")
    if FORMAT in config:
        return True
    if int(config.get("num_hidden_layers", 99)) > 4:
        return False
    if config.get("input_type") in LANTERN_INPUTS:
        return "cls_token_num" not in config
    files = [path / name for name in WEIGHTS if (path / name).is_file()]
    return config.get("model_type") == "chameleon" and bool(files) and "fc.weight" in peek(files[0])


def _interleave_rotary(sd: dict, spec: HeadSpec) -> dict:
    """Chameleon's heads rotate the halves ``(x_i, x_{i + d/2})`` of each head;
    :func:`~.llamagen.apply_rope` rotates neighbours ``(x_2i, x_2i+1)``.  Reordering q
    and k's output rows (and their per-head norms) to ``0, d/2, 1, d/2 + 1, ...``
    makes one the other, with the same frequencies."""
    d = spec.head_dim
    order = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], 1).flatten()
    out = dict(sd)
    for key, value in sd.items():
        if any(f"self_attn.{n}" in key for n in ("q_proj.", "k_proj.", "q_norm.", "k_norm.")):
            heads = value.shape[0] // d if "_proj." in key else value.shape[0]
            shaped = value.reshape(heads, d, *value.shape[1:]) if "_proj." in key else value
            out[key] = shaped[:, order].reshape(value.shape)
    return out


def load_head(folder, device="cpu", dtype=torch.float32) -> DraftHead:
    folder = pathlib.Path(folder)
    config = read_json(folder / "config.json")
    spec = HeadSpec.from_config(config, folder / "config.json")
    files = [folder / name for name in WEIGHTS if (folder / name).is_file()]
    if not files:
        raise CheckpointError(f"{folder}: no {' or '.join(WEIGHTS)} beside its config.json: the download is "
                              "incomplete")
    kind = "LANTERN" if FORMAT not in config else "spec-ar"
    name = (config.get(FORMAT) or {}).get("name") or f"{folder.name} ({kind} draft head)"
    head = DraftHead(spec, name, config)
    sd = state_dict(load_file(files[0]))
    if spec.qk_norm:
        sd = _interleave_rotary(sd, spec)
    load_weights(head, sd, files[0], f"a draft head of width {spec.hidden} with {spec.layers} layer(s) and "
                                     f"{spec.vocab} token embeddings")
    return head.to(device=device, dtype=dtype).eval()


def save_head(head: DraftHead, folder, info: dict) -> None:
    """Write ``head`` as a folder :func:`load_head` reads (our format: LANTERN's keys
    and config fields plus the ``spec_ar_drafter`` block with ``info``)."""
    import json

    from safetensors.torch import save_file

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    s = head.spec
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": s.hidden,
              "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
              "intermediate_size": s.intermediate, "num_hidden_layers": s.layers, "vocab_size": s.vocab,
              "rms_norm_eps": s.eps, "hidden_act": "silu", "bias": s.fc_bias, "qkv_bias": s.qkv_bias,
              FORMAT: {"grid": s.grid, "condition_inputs": s.condition_inputs, "rope_base": s.rope_base, **info}}
    tensors = {k: v.detach().contiguous() for k, v in head.state_dict().items()}
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=1))
