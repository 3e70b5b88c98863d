"""SBER-MoVQGAN (ai-forever/MoVQGAN), the image tokenizer of Lumina-mGPT 2.0: codes -> images.

Released as ``movqgan_67M.ckpt`` / ``movqgan_102M.ckpt`` / ``movqgan_270M.ckpt``: torch pickles
``{"state_dict": ...}`` of the training module (``encoder.*``, ``decoder.*``, ``quantize.embedding.weight``,
``quant_conv``, ``post_quant_conv``, possibly ``loss.*`` and EMA copies, which are not read).  The
architecture is not stored; it is read from the decoder's tensors here (widths, levels, blocks per level,
which levels attend), so every release loads.

The decoder is taming's with each GroupNorm replaced by a *spatial* norm conditioned on the quantized
vectors (MoVQ, Zheng et al. 2022): ``GroupNorm(f) * conv_y(zq) + conv_b(zq)``, with ``zq`` (the code
vectors before ``post_quant_conv``) resized to ``f`` by nearest neighbour.  Codes index the codebook as is
(16384 x 4, 8x downsampling for every release); pixels come out in [-1, 1].
"""
from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..formats.checkpoints import CheckpointError, load_file, state_dict
from .blocks import CodebookDecoder, LevelledSpec, Upsample, swish


class SpatialNorm(nn.Module):
    def __init__(self, channels: int, zq_channels: int):
        super().__init__()
        self.norm_layer = nn.GroupNorm(32, channels, eps=1e-6, affine=True)
        self.conv_y = nn.Conv2d(zq_channels, channels, 1)
        self.conv_b = nn.Conv2d(zq_channels, channels, 1)

    def forward(self, f, zq):
        zq = F.interpolate(zq, size=f.shape[-2:], mode="nearest")
        return self.norm_layer(f) * self.conv_y(zq) + self.conv_b(zq)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, zq: int):
        super().__init__()
        self.norm1, self.conv1 = SpatialNorm(cin, zq), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = SpatialNorm(cout, zq), nn.Conv2d(cout, cout, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x, zq):
        h = self.conv1(swish(self.norm1(x, zq)))
        h = self.conv2(swish(self.norm2(h, zq)))
        return h + (x if self.nin_shortcut is None else self.nin_shortcut(x))


class AttnBlock(nn.Module):
    """Single-head self-attention over the pixels, after the spatial norm."""

    def __init__(self, c: int, zq: int):
        super().__init__()
        self.norm = SpatialNorm(c, zq)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x, zq):
        b, c, h, w = x.shape
        y = self.norm(x, zq)
        q, k, v = (m(y).flatten(2).transpose(1, 2).unsqueeze(1) for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v).squeeze(1)
        return x + self.proj_out(y.transpose(1, 2).reshape(b, c, h, w))


@dataclass(frozen=True)
class MoVQSpec(LevelledSpec):
    ch: int = 256
    ch_mult: tuple[int, ...] = (1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_levels: tuple[int, ...] = (3,)  # levels (0: full resolution) whose blocks attend; the middle always does
    z_channels: int = 4
    embed_dim: int = 4
    n_embed: int = 16384
    out_ch: int = 3

    @classmethod
    def from_state_dict(cls, sd: dict, source: str = "the checkpoint") -> "MoVQSpec":
        """The architecture, read from the decoder's tensor names and shapes."""
        need = ("decoder.conv_in.weight", "decoder.conv_out.weight", "quantize.embedding.weight",
                "post_quant_conv.weight")
        missing = [k for k in need if k not in sd]
        if missing:
            raise CheckpointError(f"{source}: not a MoVQGAN checkpoint (no {', '.join(missing)})")
        levels = sorted({int(m.group(1)) for k in sd if (m := re.match(r"decoder\.up\.(\d+)\.", k))})
        if not levels or levels != list(range(len(levels))):
            raise CheckpointError(f"{source}: the decoder's levels are {levels}, not 0..N")
        ch = sd["decoder.conv_out.weight"].shape[1]
        widths = [sd[f"decoder.up.{i}.block.0.conv2.weight"].shape[0] for i in levels]
        if any(w % ch for w in widths):
            raise CheckpointError(f"{source}: level widths {widths} are not multiples of {ch}")
        blocks = {int(m.group(1)) for k in sd if (m := re.match(r"decoder\.up\.0\.block\.(\d+)\.", k))}
        book = sd["quantize.embedding.weight"]
        return cls(ch=ch, ch_mult=tuple(w // ch for w in widths), num_res_blocks=len(blocks) - 1,
                   attn_levels=tuple(i for i in levels if f"decoder.up.{i}.attn.0.q.weight" in sd),
                   z_channels=sd["decoder.conv_in.weight"].shape[1], embed_dim=book.shape[1], n_embed=book.shape[0],
                   out_ch=sd["decoder.conv_out.weight"].shape[0])


class _Level(nn.Module):
    def __init__(self, cin: int, cout: int, blocks: int, attn: bool, zq: int, upsample: bool):
        super().__init__()
        self.block = nn.ModuleList(ResnetBlock(cin if j == 0 else cout, cout, zq) for j in range(blocks))
        self.attn = nn.ModuleList(AttnBlock(cout, zq) for _ in range(blocks)) if attn else nn.ModuleList()
        if upsample:
            self.upsample = Upsample(cout)

    def forward(self, x, zq):
        for j, block in enumerate(self.block):
            x = block(x, zq)
            if len(self.attn):
                x = self.attn[j](x, zq)
        return self.upsample(x) if hasattr(self, "upsample") else x


class _Mid(nn.Module):
    def __init__(self, c: int, zq: int):
        super().__init__()
        self.block_1, self.attn_1, self.block_2 = ResnetBlock(c, c, zq), AttnBlock(c, zq), ResnetBlock(c, c, zq)

    def forward(self, x, zq):
        return self.block_2(self.attn_1(self.block_1(x, zq), zq), zq)


class MoVQDecoderNet(nn.Module):
    """``decoder.*`` of the checkpoint: levels ``up.N`` run from the lowest resolution (N = levels - 1) up."""

    def __init__(self, s: MoVQSpec):
        super().__init__()
        widths = [s.ch * m for m in s.ch_mult]
        self.conv_in = nn.Conv2d(s.z_channels, widths[-1], 3, padding=1)
        self.mid = _Mid(widths[-1], s.embed_dim)
        levels = []
        for i, width in enumerate(widths):
            cin = widths[-1] if i == len(widths) - 1 else widths[i + 1]
            levels.append(_Level(cin, width, s.num_res_blocks + 1, i in s.attn_levels, s.embed_dim, upsample=i > 0))
        self.up = nn.ModuleList(levels)
        self.norm_out = SpatialNorm(widths[0], s.embed_dim)
        self.conv_out = nn.Conv2d(widths[0], s.out_ch, 3, padding=1)

    def forward(self, z, zq):
        h = self.mid(self.conv_in(z), zq)
        for level in reversed(self.up):
            h = level(h, zq)
        return self.conv_out(swish(self.norm_out(h, zq)))


class MoVQModel(nn.Module):
    def __init__(self, spec: MoVQSpec):
        super().__init__()
        self.spec = spec
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(spec.n_embed, spec.embed_dim)
        self.post_quant_conv = nn.Conv2d(spec.embed_dim, spec.z_channels, 1)
        self.decoder = MoVQDecoderNet(spec)

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, h, w]`` -> pixels ``[B, 3, h*ds, w*ds]`` in about [-1, 1]."""
        zq = self.quantize.embedding(codes).permute(0, 3, 1, 2).contiguous()
        return self.decoder(self.post_quant_conv(zq), zq)


class MoVQGANDecoder(CodebookDecoder):
    """A loaded MoVQGAN: codes -> images, plus its codebook for the engine."""

    @classmethod
    def load(cls, path: str | pathlib.Path, device="cpu", dtype=torch.float32) -> "MoVQGANDecoder":
        path = pathlib.Path(path)
        sd = state_dict(load_file(path), wrappers=("state_dict",))
        return cls.from_state_dict(sd, device, dtype, source=str(path))

    @classmethod
    def from_state_dict(cls, sd: dict, device="cpu", dtype=torch.float32, source: str = "") -> "MoVQGANDecoder":
        spec = MoVQSpec.from_state_dict(sd, source or "the checkpoint")
        keep = ("decoder.", "quantize.embedding.", "post_quant_conv.")
        weights = {k: v for k, v in sd.items() if k.startswith(keep)}
        model = MoVQModel(spec)
        try:
            model.load_state_dict(weights, strict=True)
        except RuntimeError as err:
            raise CheckpointError(f"{source}: the MoVQGAN decoder's tensors do not fit the architecture they "
                                  f"describe ({' '.join(str(err).split())[:300]})") from None
        return cls(model.to(device=device, dtype=dtype).eval(), source)
