"""The VQGAN of Meta's Chameleon image tokenizer (also Anole and Lumina-mGPT).

Shipped as ``tokenizer/vqgan.yaml`` (a taming-transformers config) plus
``tokenizer/vqgan.ckpt`` (a torch pickle ``{"state_dict": {...}}``, possibly with
training entries and ``loss.*`` weights, which are ignored).  Module names follow
the checkpoint keys.  Unlike LlamaGen's tokenizer, the codebook (8192 x 256) is
used as is (no L2 normalisation) and the decoder's ``up[i]`` is the level of
``ch * ch_mult[i]``, run from ``i = len(ch_mult) - 1`` (lowest resolution) down to 0.
The architecture comes from the yaml and is checked against the weights.
"""
from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

import torch
from torch import nn

from ..formats.checkpoints import CheckpointError, load_file, state_dict
from .blocks import (AttnBlock, CodebookDecoder, Downsample, LevelledSpec, ResnetBlock, Upsample, key_problems, norm,
                     swish)

YAML_NAME, CKPT_NAME = "vqgan.yaml", "vqgan.ckpt"


# -- taming's grouping of the shared blocks (key names: down.N.block.M, mid.block_1) --
class _Level(nn.Module):
    """One resolution: ``block`` ResnetBlocks, each followed by its ``attn`` block if any."""

    def __init__(self, cin: int, cout: int, blocks: int, attn: bool, dropout: float):
        super().__init__()
        self.block = nn.ModuleList(ResnetBlock(cin if j == 0 else cout, cout, dropout) for j in range(blocks))
        self.attn = nn.ModuleList(AttnBlock(cout) for _ in range(blocks)) if attn else nn.ModuleList()

    def forward(self, x):
        for j, block in enumerate(self.block):
            x = block(x)
            if len(self.attn):
                x = self.attn[j](x)
        return x


class _Mid(nn.Module):
    def __init__(self, c: int, dropout: float):
        super().__init__()
        self.block_1, self.attn_1, self.block_2 = ResnetBlock(c, c, dropout), AttnBlock(c), ResnetBlock(c, c, dropout)

    def forward(self, x):
        return self.block_2(self.attn_1(self.block_1(x)))


# -- the architecture ----------------------------------------------------------
@dataclass(frozen=True)
class VQGANSpec(LevelledSpec):
    """The architecture, as written in ``vqgan.yaml`` (``model.params``)."""

    embed_dim: int = 256
    n_embed: int = 8192
    z_channels: int = 256
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)  # per encoder level, highest resolution first
    num_res_blocks: int = 2  # encoder blocks per level; the decoder has one more
    attn_resolutions: tuple[int, ...] = ()  # feature-map sides that get attention blocks
    resolution: int = 256
    in_channels: int = 3
    out_ch: int = 3
    dropout: float = 0.0

    @classmethod
    def from_config(cls, cfg: dict, source: str = "vqgan.yaml") -> "VQGANSpec":
        """From the parsed yaml (``model.params`` or that mapping itself); extra keys are ignored."""
        params = cfg.get("model", cfg) if isinstance(cfg, dict) else None
        params = params.get("params", params) if isinstance(params, dict) else None
        dd = params.get("ddconfig") if isinstance(params, dict) else None
        if not isinstance(dd, dict):
            raise CheckpointError(f"{source}: not a VQGAN config (no model.params.ddconfig)")

        def get(key, ints=False):
            d, where = (params, "model.params.") if key in ("embed_dim", "n_embed") else (dd, "model.params.ddconfig.")
            if key not in d:
                raise CheckpointError(f"{source}: missing {where}{key}")
            try:
                return tuple(int(v) for v in d[key] or ()) if ints else int(d[key])
            except (TypeError, ValueError) as err:
                raise CheckpointError(f"{source}: bad {where}{key}: {d[key]!r}") from err

        if dd.get("double_z"):
            raise CheckpointError(f"{source}: double_z is true (a KL autoencoder, not a VQGAN)")
        if not get("ch_mult", ints=True):
            raise CheckpointError(f"{source}: empty ch_mult")
        return cls(embed_dim=get("embed_dim"), n_embed=get("n_embed"), z_channels=get("z_channels"), ch=get("ch"),
                   ch_mult=get("ch_mult", ints=True), num_res_blocks=get("num_res_blocks"),
                   attn_resolutions=get("attn_resolutions", ints=True), resolution=get("resolution"),
                   in_channels=int(dd.get("in_channels", 3)), out_ch=int(dd.get("out_ch", 3)),
                   dropout=float(dd.get("dropout", 0.0)))

    @classmethod
    def from_yaml(cls, path: str | pathlib.Path) -> "VQGANSpec":
        path = pathlib.Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file")
        import yaml  # PyYAML: transformers needs it, and every ComfyUI has it

        try:  # safe_load: plain data only, never a tag that builds Python objects
            cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (ValueError, yaml.YAMLError) as err:  # UnicodeDecodeError is a ValueError
            raise CheckpointError(f"{path}: cannot be parsed as yaml ({err})") from err
        return cls.from_config(cfg, str(path))


class Encoder(nn.Module):
    def __init__(self, s: VQGANSpec):
        super().__init__()
        self.conv_in = nn.Conv2d(s.in_channels, s.ch, 3, padding=1)
        self.down, cin, res = nn.ModuleList(), s.ch, s.resolution
        for i, m in enumerate(s.ch_mult):
            level = _Level(cin, s.ch * m, s.num_res_blocks, res in s.attn_resolutions, s.dropout)
            cin = s.ch * m
            if i != len(s.ch_mult) - 1:
                level.downsample, res = Downsample(cin), res // 2
            self.down.append(level)
        self.mid = _Mid(cin, s.dropout)
        self.norm_out, self.conv_out = norm(cin), nn.Conv2d(cin, s.z_channels, 3, padding=1)

    def forward(self, x):
        x = self.conv_in(x)
        for level in self.down:
            x = level(x)
            if hasattr(level, "downsample"):
                x = level.downsample(x)
        return self.conv_out(swish(self.norm_out(self.mid(x))))


class Decoder(nn.Module):
    def __init__(self, s: VQGANSpec):
        super().__init__()
        cin, res = s.ch * s.ch_mult[-1], s.resolution // s.downsample
        self.conv_in = nn.Conv2d(s.z_channels, cin, 3, padding=1)
        self.mid = _Mid(cin, s.dropout)
        levels = [None] * len(s.ch_mult)
        for i in reversed(range(len(s.ch_mult))):  # built (and run) lowest resolution first
            level = _Level(cin, s.ch * s.ch_mult[i], s.num_res_blocks + 1, res in s.attn_resolutions, s.dropout)
            cin = s.ch * s.ch_mult[i]
            if i != 0:
                level.upsample, res = Upsample(cin), res * 2
            levels[i] = level
        self.up = nn.ModuleList(levels)  # up[i] has ch * ch_mult[i] channels: up[-1] is the lowest resolution
        self.norm_out, self.conv_out = norm(cin), nn.Conv2d(cin, s.out_ch, 3, padding=1)

    def forward(self, z):
        x = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            x = level(x)
            if hasattr(level, "upsample"):
                x = level.upsample(x)
        return self.conv_out(swish(self.norm_out(x)))


class VectorQuantizer(nn.Module):
    """A plain nearest-neighbour codebook (Euclidean, not normalised)."""

    def __init__(self, s: VQGANSpec):
        super().__init__()
        self.embedding = nn.Embedding(s.n_embed, s.embed_dim)

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """``[B, C, h, w]`` -> indices ``[B, h, w]`` of the nearest code vectors."""
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        book = self.embedding.weight
        dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ book.t() + book.pow(2).sum(1)
        return dist.argmin(1).view(z.shape[0], z.shape[2], z.shape[3])


class VQGANModel(nn.Module):
    """The tokenizer; ``decode_codes`` is what image generation needs.  Without
    ``with_encoder`` only the decoding half is built (decoder-only weights)."""

    def __init__(self, spec: VQGANSpec, with_encoder: bool = True):
        super().__init__()
        self.spec = spec
        if with_encoder:
            self.encoder = Encoder(spec)
            self.quant_conv = nn.Conv2d(spec.z_channels, spec.embed_dim, 1)
        self.decoder = Decoder(spec)
        self.quantize = VectorQuantizer(spec)
        self.post_quant_conv = nn.Conv2d(spec.embed_dim, spec.z_channels, 1)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images ``[B, in_channels, H, W]`` in [-1, 1] -> codes ``[B, H/ds, W/ds]``."""
        return self.quantize.nearest(self.quant_conv(self.encoder(images)))

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, h, w]`` (raster order) -> images ``[B, out_ch, h*ds, w*ds]``, about
        [-1, 1] (not clamped)."""
        z = self.quantize.embedding(codes).permute(0, 3, 1, 2)
        return self.decoder(self.post_quant_conv(z))


# -- loading ---------------------------------------------------------------------
def find_vqgan(folder: str | pathlib.Path) -> tuple[pathlib.Path, pathlib.Path] | None:
    """``(vqgan.yaml, vqgan.ckpt)`` in ``folder``, ``folder/tokenizer`` or ``folder/vqgan``, if there."""
    folder = pathlib.Path(folder)
    for d in (folder, folder / "tokenizer", folder / "vqgan"):
        if (d / YAML_NAME).is_file() and (d / CKPT_NAME).is_file():
            return d / YAML_NAME, d / CKPT_NAME
    return None


def _check_weights(spec: VQGANSpec, sd: dict[str, torch.Tensor], expected: dict[str, torch.Size]) -> list[str]:
    """Why the weights do not fit the yaml's architecture (empty if they do)."""
    named = [("n_embed", spec.n_embed, "quantize.embedding.weight", 0),
             ("embed_dim", spec.embed_dim, "quantize.embedding.weight", 1),
             ("z_channels", spec.z_channels, "decoder.conv_in.weight", 1),
             ("ch * ch_mult[-1]", spec.ch * spec.ch_mult[-1], "decoder.conv_in.weight", 0),
             ("ch * ch_mult[0]", spec.ch * spec.ch_mult[0], "decoder.conv_out.weight", 1),
             ("out_ch", spec.out_ch, "decoder.conv_out.weight", 0)]
    problems = [f"{name} is {value} in the yaml but {sd[key].shape[dim]} in {key} {list(sd[key].shape)}"
                for name, value, key, dim in named if key in sd and sd[key].dim() > dim and sd[key].shape[dim] != value]
    levels = {int(m.group(1)) for k in sd if (m := re.match(r"decoder\.up\.(\d+)\.", k))}
    if levels and len(levels) != len(spec.ch_mult):
        problems.append(f"ch_mult has {len(spec.ch_mult)} levels in the yaml but the decoder has {len(levels)}")
    blocks = {int(m.group(1)) for k in sd if (m := re.match(r"decoder\.up\.0\.block\.(\d+)\.", k))}
    if blocks and len(blocks) != spec.num_res_blocks + 1:
        problems.append(f"num_res_blocks is {spec.num_res_blocks} in the yaml but the decoder has "
                        f"{len(blocks)} blocks per level (num_res_blocks + 1)")

    def attn_levels(keys):
        return sorted({int(m.group(1)) for k in keys if (m := re.match(r"decoder\.up\.(\d+)\.attn\.", k))})

    if not problems and attn_levels(sd) != attn_levels(expected):
        problems.append(f"attn_resolutions {list(spec.attn_resolutions)} in the yaml put attention in decoder levels "
                        f"{attn_levels(expected)} but the checkpoint has it in {attn_levels(sd)}")
    return problems or key_problems(sd, expected)  # the named sizes explain the rest


class VQGANDecoder(CodebookDecoder):
    """A loaded Chameleon VQGAN: codes -> images, plus its codebook for the engine."""

    @classmethod
    def load(cls, yaml_path: str | pathlib.Path, ckpt_path: str | pathlib.Path | None = None, device="cpu",
             dtype=torch.float32) -> "VQGANDecoder":
        """From ``vqgan.yaml`` and ``vqgan.ckpt``; ``yaml_path`` may instead be a folder holding
        both (directly, or under ``tokenizer/`` or ``vqgan/``).  Without ``ckpt_path`` the
        checkpoint is the yaml's sibling ``vqgan.ckpt``."""
        yaml_path = pathlib.Path(yaml_path)
        if yaml_path.is_dir() and ckpt_path is None:
            found = find_vqgan(yaml_path)
            if found is None:
                raise CheckpointError(f"{yaml_path}: no {YAML_NAME} with {CKPT_NAME} here, nor under tokenizer/ "
                                      "or vqgan/")
            yaml_path, ckpt_path = found
        ckpt_path = pathlib.Path(ckpt_path) if ckpt_path is not None else yaml_path.with_name(CKPT_NAME)
        spec = VQGANSpec.from_yaml(yaml_path)
        sd = state_dict(load_file(ckpt_path), wrappers=("state_dict", "model"))
        return cls.from_state_dict(sd, spec, device, dtype, source=str(ckpt_path), yaml_source=str(yaml_path))

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor], spec: VQGANSpec, device="cpu", dtype=torch.float32,
                        source: str = "", yaml_source: str = "the yaml") -> "VQGANDecoder":
        sd = {k: v for k, v in sd.items() if not k.startswith("loss.")}  # LPIPS and discriminator
        if "decoder.conv_in.weight" not in sd or "quantize.embedding.weight" not in sd:
            raise CheckpointError(f"{source}: not a VQGAN checkpoint (no decoder.conv_in or quantize.embedding)")
        with_encoder = any(k.startswith("encoder.") for k in sd)
        try:
            with torch.device("meta"):  # the expected names and shapes, without allocating
                expected = {k: v.shape for k, v in VQGANModel(spec, with_encoder).state_dict().items()}
        except ValueError as err:  # e.g. channels that GroupNorm(32) cannot split
            raise CheckpointError(f"{yaml_source}: not a buildable VQGAN ({err})") from err
        problems = _check_weights(spec, sd, expected)
        if problems:
            raise CheckpointError(f"{source}: weights do not match {yaml_source}: " + "; ".join(problems))
        model = VQGANModel(spec, with_encoder)
        model.load_state_dict(sd, strict=True)
        return cls(model.to(device=device, dtype=dtype).eval(), source)
