"""Sizes at ``--scale s``: counts and widths times ``s`` (an LLM in whole heads of its real head size), and Meta's
SwiGLU width."""
from __future__ import annotations


def scaled(value: int, scale: float, minimum: int = 1) -> int:
    return max(minimum, int(round(value * scale)))


def scaled_channels(value: int, scale: float, multiple: int = 32) -> int:
    """Convolution widths: multiples of 32 (GroupNorm's groups), at least 32."""
    return max(multiple, multiple * int(round(value * scale / multiple)))


def scaled_text(text: dict, scale: float) -> dict:
    """The LLM at ``scale``: whole heads of the real head size, the kv heads' share kept, depth scaled."""
    t = dict(text)
    if scale == 1.0:
        return t
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    ratio = text["num_attention_heads"] // text["num_key_value_heads"]
    heads = scaled(text["num_attention_heads"], scale)
    kv = max(1, heads // ratio)
    heads = kv * ratio if heads >= ratio else heads
    t.update(num_attention_heads=heads, num_key_value_heads=kv if heads % kv == 0 else heads,
             hidden_size=heads * head_dim, num_hidden_layers=scaled(text["num_hidden_layers"], scale))
    if "intermediate_size" in text:  # Meta's formula otherwise (multiple_of, ffn_dim_multiplier)
        t["intermediate_size"] = 256 * -(-int(text["intermediate_size"] * t["hidden_size"] / text["hidden_size"])
                                         // 256)
    return t


def meta_ffn(dim: int, multiplier: float, multiple_of: int) -> int:
    """Meta's SwiGLU width (= chameleon_meta.ffn_width): 11008 for dim 4096."""
    return multiple_of * -(-int(multiplier * int(8 * dim / 3)) // multiple_of)
