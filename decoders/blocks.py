"""Building blocks both VQ decoders use (taming-transformers' diffusionmodules design).

LlamaGen's tokenizer (``vq16.py``) and Meta's Chameleon VQGAN (``vqgan.py``) come
from the same code, and these blocks carry the same parameter names in both
checkpoints (``norm1``, ``conv1``, ``nin_shortcut``, ``q``/``k``/``v``/``proj_out``,
``conv`` of a resampler), so one definition loads either file unchanged.

What is not here differs in the checkpoints' key names and stays with each
decoder: how blocks group into levels (LlamaGen's ``conv_blocks.N.res.M`` against
taming's ``down.N.block.M`` / ``up.N.block.M``), the middle section (LlamaGen's
``mid.0``/``mid.1``/``mid.2`` against taming's ``mid.block_1``/``attn_1``/``block_2``)
and the quantizer (LlamaGen L2-normalises its codebook; Chameleon's is used as is).

:class:`CodebookDecoder` is the loaded decoder's interface the Chameleon VQGAN and MoVQGAN share
(codes checked, decoded, put in [0, 1]; the codebook; memory per image).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)


def unit_range(x: torch.Tensor) -> torch.Tensor:
    """Pixels clamped to [0, 1], and NaN where ``x`` is not finite: a clamp alone turns
    an overflow (infinity) into white or black, which the check after decoding
    (``sampling.checks.check_images``) could then not see."""
    return torch.where(torch.isfinite(x), x.clamp(0, 1), torch.nan)


def swish(x):
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, dropout: float = 0.0):
        super().__init__()
        self.norm1, self.conv1 = norm(cin), nn.Conv2d(cin, cout, 3, padding=1)
        # dropout has no parameters: LlamaGen's checkpoints (which have none) load alike
        self.norm2, self.dropout, self.conv2 = norm(cout), nn.Dropout(dropout), nn.Conv2d(cout, cout, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x):
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(self.dropout(swish(self.norm2(h))))
        return h + (x if self.nin_shortcut is None else self.nin_shortcut(x))


class AttnBlock(nn.Module):
    """Single-head self-attention over the pixels of a feature map."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = norm(c)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x):
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (m(y).flatten(2).transpose(1, 2).unsqueeze(1) for m in (self.q, self.k, self.v))  # [b, 1, hw, c]
        y = F.scaled_dot_product_attention(q, k, v).squeeze(1)
        return x + self.proj_out(y.transpose(1, 2).reshape(b, c, h, w))


class Upsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Downsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=2, padding=0)
        self.pad_mode = "constant"  # zeros, as taming; "replicate" hides where the border is

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1), mode=self.pad_mode))  # right/bottom padding only, as taming


#: live full-resolution tensors in a VQ decoder's last level (input, norm, activation, conv outputs)
DECODER_LIVE_TENSORS = 8


def key_problems(sd: dict, expected: dict, extra: str = "unexpected") -> list[str]:
    """What keeps checkpoint tensors ``sd`` from filling a module whose tensors are ``expected``
    (name -> shape): missing, ``extra`` (those it does not have) and wrongly shaped tensors, five
    named of each."""
    missing = [k for k in expected if k not in sd]
    unexpected = [k for k in sd if k not in expected]
    shapes = [f"{k} {list(sd[k].shape)} (expected {list(v)})" for k, v in expected.items()
              if k in sd and sd[k].shape != v]
    problems = []
    for what, items in (("missing", missing), (extra, unexpected), ("wrong shapes", shapes)):
        if items:
            more = f" and {len(items) - 5} more" if len(items) > 5 else ""
            problems.append(f"{what}: {', '.join(items[:5])}{more}")
    return problems


def decoder_bytes(pixels: int, channels: int, itemsize: int) -> int:
    """An estimate of a VQ decoder's peak activations for one image of ``pixels``
    pixels whose last level has ``channels`` channels."""
    return DECODER_LIVE_TENSORS * pixels * channels * itemsize


class LevelledSpec:
    """What a decoder's architecture (a dataclass with ``ch``, ``ch_mult``, ``n_embed``) implies."""

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


class CodebookDecoder:
    """A loaded VQ decoder whose ``model`` has a ``spec`` (:class:`LevelledSpec`), a ``quantize.embedding``
    codebook, a ``post_quant_conv`` and ``decode_codes`` (codes -> pixels in about [-1, 1]): codes -> images,
    plus the codebook for the engine."""

    def __init__(self, model: nn.Module, source: str = ""):
        self.model, self.source = model, source

    @property
    def spec(self):
        return self.model.spec

    @property
    def device(self) -> torch.device:
        return self.model.post_quant_conv.weight.device

    def codebook(self) -> torch.Tensor:
        """``[n_embed, embed_dim]`` code vectors as stored (float32)."""
        return self.model.quantize.embedding.weight.detach().float()

    def bytes_per_image(self, grid: tuple[int, int]) -> int:
        """Peak activations decoding one image of ``grid`` tokens (an estimate)."""
        s = self.spec
        itemsize = next(self.model.parameters()).element_size()
        return decoder_bytes(grid[0] * grid[1] * s.downsample ** 2, s.ch * s.ch_mult[0], itemsize)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, h, w]`` -> images ``[B, 3, h*ds, w*ds]`` float32 in [0, 1]."""
        codes = codes.to(self.device).long()
        if codes.dim() != 3:
            raise ValueError(f"codes must be [B, h, w], got {list(codes.shape)}")
        if codes.numel() and (codes.min() < 0 or codes.max() >= self.spec.n_embed):
            raise ValueError(f"codes must lie in [0, {self.spec.n_embed}), got {codes.min()}..{codes.max()}")
        x = self.model.decode_codes(codes).float()
        return unit_range((x + 1) / 2)
