"""LlamaGen's VQ tokenizer (``vq_ds16_c2i.pt``, ``vq_ds16_t2i.pt``, ``vq_ds8_c2i.pt``).

A taming-style convolutional autoencoder with a small L2-normalised codebook
(16384 x 8).  Module names follow the checkpoint keys, and the architecture
(channels per level, blocks per level, where attention sits, codebook size) is
read from the weights, so the downsample-16 and downsample-8 tokenizers and
smaller variants load alike.  Janus uses the same design (through transformers).
"""
from __future__ import annotations

import pathlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..formats.checkpoints import CheckpointError, load_file, load_weights, state_dict
from .blocks import AttnBlock, Downsample, ResnetBlock, Upsample, decoder_bytes, norm, swish, unit_range


class _Level(nn.Module):
    def __init__(self, channels: list[tuple[int, int]], attn: bool, resample: str | None):
        super().__init__()
        self.res = nn.ModuleList(ResnetBlock(a, b) for a, b in channels)
        self.attn = nn.ModuleList(AttnBlock(b) for _, b in channels) if attn else nn.ModuleList()
        if resample == "down":
            self.downsample = Downsample(channels[-1][1])
        elif resample == "up":
            self.upsample = Upsample(channels[-1][1])

    def forward(self, x):
        for i, block in enumerate(self.res):
            x = block(x)
            if len(self.attn):
                x = self.attn[i](x)
        for name in ("downsample", "upsample"):
            if hasattr(self, name):
                x = getattr(self, name)(x)
        return x


@dataclass(frozen=True)
class VQSpec:
    """The architecture, as read from a checkpoint."""

    ch: int
    ch_mult: tuple[int, ...]  # per encoder level, highest resolution first
    enc_blocks: int
    dec_blocks: int
    z_channels: int
    codebook_size: int
    embed_dim: int
    has_encoder: bool = True
    #: the decoder's, highest resolution first, where it differs from the encoder's (LlamaGen's
    #: ``decoder_ch_mult``; its releases use the encoder's)
    dec_mult: tuple[int, ...] | None = None

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def decoder_channels(self) -> list[int]:
        """Channels of the decoder's levels, lowest resolution first."""
        return [self.ch * m for m in reversed(self.dec_mult or self.ch_mult)]

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor]) -> "VQSpec":
        need = ("quantize.embedding.weight", "post_quant_conv.weight", "decoder.conv_in.weight",
                "decoder.conv_out.weight")
        missing = [k for k in need if k not in sd]
        if missing:
            raise CheckpointError(f"not a LlamaGen VQ tokenizer: missing {missing}")
        levels = sorted({int(k.split(".")[2]) for k in sd if k.startswith("decoder.conv_blocks.")})
        out_ch = [sd[f"decoder.conv_blocks.{j}.res.0.conv1.weight"].shape[0] for j in levels]
        dec_blocks = len({k.split(".")[4] for k in sd if k.startswith("decoder.conv_blocks.0.res.")})
        enc_blocks = len({k.split(".")[4] for k in sd if k.startswith("encoder.conv_blocks.0.res.")})
        book = sd["quantize.embedding.weight"]
        # the encoder's channels, where there is one (the decoder's may be wider)
        ch = sd["encoder.conv_in.weight"].shape[0] if enc_blocks else sd["decoder.conv_out.weight"].shape[1]
        dec_mult = tuple(c // ch for c in reversed(out_ch))
        ch_mult = dec_mult
        if enc_blocks:
            enc_levels = sorted({int(k.split(".")[2]) for k in sd if k.startswith("encoder.conv_blocks.")})
            ch_mult = tuple(sd[f"encoder.conv_blocks.{i}.res.0.conv1.weight"].shape[0] // ch for i in enc_levels)
        return cls(ch=ch, ch_mult=ch_mult, enc_blocks=enc_blocks, dec_blocks=dec_blocks,
                   z_channels=sd["decoder.conv_in.weight"].shape[1], codebook_size=book.shape[0],
                   embed_dim=book.shape[1], has_encoder=enc_blocks > 0,
                   dec_mult=None if dec_mult == ch_mult else dec_mult)


class Encoder(nn.Module):
    def __init__(self, s: VQSpec):
        super().__init__()
        chans = [s.ch * m for m in s.ch_mult]
        self.conv_in = nn.Conv2d(3, s.ch, 3, padding=1)
        blocks, cin = [], s.ch
        for i, c in enumerate(chans):
            last = i == len(chans) - 1
            blocks.append(_Level([(cin if j == 0 else c, c) for j in range(s.enc_blocks)], attn=last,
                                 resample=None if last else "down"))
            cin = c
        self.conv_blocks = nn.ModuleList(blocks)
        self.mid = nn.ModuleList([ResnetBlock(cin, cin), AttnBlock(cin), ResnetBlock(cin, cin)])
        self.norm_out, self.conv_out = norm(cin), nn.Conv2d(cin, s.z_channels, 3, padding=1)

    def forward(self, x):
        x = self.conv_in(x)
        for level in self.conv_blocks:
            x = level(x)
        for m in self.mid:
            x = m(x)
        return self.conv_out(swish(self.norm_out(x)))


class Decoder(nn.Module):
    def __init__(self, s: VQSpec):
        super().__init__()
        chans = s.decoder_channels  # lowest resolution first
        cin = chans[0]
        self.conv_in = nn.Conv2d(s.z_channels, cin, 3, padding=1)
        self.mid = nn.ModuleList([ResnetBlock(cin, cin), AttnBlock(cin), ResnetBlock(cin, cin)])
        blocks = []
        for j, c in enumerate(chans):
            last = j == len(chans) - 1
            blocks.append(_Level([(cin if i == 0 else c, c) for i in range(s.dec_blocks)], attn=j == 0,
                                 resample=None if last else "up"))
            cin = c
        self.conv_blocks = nn.ModuleList(blocks)
        self.norm_out, self.conv_out = norm(cin), nn.Conv2d(cin, 3, 3, padding=1)

    def forward(self, z):
        x = self.conv_in(z)
        for m in self.mid:
            x = m(x)
        for level in self.conv_blocks:
            x = level(x)
        return self.conv_out(swish(self.norm_out(x)))


class _Quantizer(nn.Module):
    def __init__(self, s: VQSpec):
        super().__init__()
        self.embedding = nn.Embedding(s.codebook_size, s.embed_dim)

    def codebook(self) -> torch.Tensor:
        return F.normalize(self.embedding.weight, p=2, dim=-1)  # L2-normalised at lookup


class VQModel(nn.Module):
    """The tokenizer; ``decode_codes`` is what image generation needs."""

    def __init__(self, spec: VQSpec):
        super().__init__()
        self.spec = spec
        if spec.has_encoder:
            self.encoder = Encoder(spec)
            self.quant_conv = nn.Conv2d(spec.z_channels, spec.embed_dim, 1)
        self.decoder = Decoder(spec)
        self.quantize = _Quantizer(spec)
        self.post_quant_conv = nn.Conv2d(spec.embed_dim, spec.z_channels, 1)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images ``[B, 3, H, W]`` in [-1, 1] -> codes ``[B, H/ds, W/ds]`` (nearest
        normalised code by cosine, as LlamaGen's quantizer)."""
        z = F.normalize(self.quant_conv(self.encoder(images)), dim=1)
        return torch.einsum("bchw,nc->bnhw", z, self.quantize.codebook()).argmax(1)

    def set_padding(self, part: str, mode: str) -> "VQModel":
        """``zeros`` (LlamaGen's) or ``replicate`` for the 3x3 convolutions (and the
        encoder's downsampling pads) of ``part``, ``"encoder"`` or ``"decoder"``.
        Zero padding tells a network where the border is, and an undertrained one
        keeps position effects there that cost little loss on average: the embedded
        model's first encoder wrote other codes for a uniform picture within 3 to 6
        cells of the border, and its decoders drew those codes as a stripe near the
        top right.  With replicate padding a uniform picture encodes to one code and
        a uniform code grid decodes to a uniform picture, whatever the weights."""
        for m in getattr(self, part).modules():
            if isinstance(m, nn.Conv2d) and m.padding != (0, 0):
                m.padding_mode = mode
            elif isinstance(m, Downsample):
                m.pad_mode = "constant" if mode == "zeros" else mode
        return self

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, h, w]`` (raster order) -> images ``[B, 3, 16h, 16w]``, about
        [-1, 1] (not clamped)."""
        z = self.quantize.codebook()[codes].permute(0, 3, 1, 2)
        return self.decoder(self.post_quant_conv(z))


class VQ16Decoder:
    """A loaded VQ tokenizer: codes -> images, plus its codebook for the engine."""

    def __init__(self, model: VQModel, source: str = ""):
        self.model, self.source = model, source

    @classmethod
    def load(cls, path: str | pathlib.Path, device="cpu", dtype=torch.float32) -> "VQ16Decoder":
        sd = state_dict(load_file(path), wrappers=("ema", "model", "state_dict", "module"))
        try:
            spec = VQSpec.from_state_dict(sd)
        except CheckpointError as err:
            raise CheckpointError(f"{path}: {err}") from err
        return cls.from_state_dict(sd, spec, device, dtype, str(path))

    @classmethod
    def from_state_dict(cls, sd, spec=None, device="cpu", dtype=torch.float32, source=""):
        spec = spec or VQSpec.from_state_dict(sd)
        model = VQModel(spec)
        sd = {k: v for k, v in sd.items() if k != "quantize.codebook_used"}  # a training statistic
        if not spec.has_encoder:
            sd = {k: v for k, v in sd.items() if not k.startswith(("encoder.", "quant_conv."))}
        load_weights(model, sd, source or "the state dict",
                     f"a LlamaGen VQ tokenizer with {spec.codebook_size} codes of width {spec.embed_dim}")
        return cls(model.to(device=device, dtype=dtype).eval(), source)

    @property
    def spec(self) -> VQSpec:
        return self.model.spec

    @property
    def device(self) -> torch.device:
        return self.model.post_quant_conv.weight.device

    def bytes_per_image(self, grid: tuple[int, int]) -> int:
        """Peak activations decoding one image of ``grid`` tokens (an estimate)."""
        s = self.spec
        return decoder_bytes(grid[0] * grid[1] * s.downsample ** 2, s.decoder_channels[-1],
                             self.model.post_quant_conv.weight.element_size())

    def codebook(self) -> torch.Tensor:
        """``[codebook_size, embed_dim]`` L2-normalised code vectors (float32)."""
        with torch.no_grad():
            return self.model.quantize.codebook().float()

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, h, w]`` -> images ``[B, 3, H, W]`` float32 in [0, 1]."""
        x = self.model.decode_codes(codes.to(self.device).long()).float()
        return unit_range((x + 1) / 2)
