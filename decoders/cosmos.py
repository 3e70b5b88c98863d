"""NVIDIA Cosmos-1.0-Tokenizer-DV8x16x16, the image tokenizer of SimpleAR: codes -> images.

Released (hub repo ``nvidia/Cosmos-1.0-Tokenizer-DV8x16x16``) as TorchScript only; ``decoder.jit`` holds
the tree NVIDIA's ``CausalDiscreteVideoTokenizer.decoder_jit()`` builds: ``inv_quant.quantizer`` (the FSQ
quantizer: ``_levels``, ``_basis``, ``implicit_codebook``), ``post_quant_conv.conv3d`` and ``decoder.*``
(``DecoderFactorized``), every convolution a ``CausalConv3d`` (weights in ``.conv3d``), every norm a
``CausalNormalize`` (one-group GroupNorm per frame, weights in ``.norm``).  Its tensors are read by
:mod:`..formats.torchscript`, never ``torch.jit.load``.

The tokenizer is a video one; an image is one latent frame (codes ``[B, 1, h, w]`` in SimpleAR), and for one
frame the 3D network is exactly a 2D one, which is what is built here:

* a causal convolution pads time by repeating the first frame, so with one frame a ``(3, 1, 1)`` time
  convolution sees that frame three times: a 1x1 convolution whose weight is the sum of the time taps
  (every 3D weight is folded that way); a ``(1, 3, 3)`` one is a 3x3 convolution with padding 1;
* temporal attention over one frame attends to itself alone (the causal softmax of one score is 1):
  ``x + proj_out(v(norm(x)))``; its ``q`` and ``k`` are loaded but change nothing;
* hybrid upsampling repeats no frame (its time factor is 1 for one frame) but still adds ``conv1(x)`` where
  it upsamples in time, then repeats pixels 2x and adds ``conv2(x)`` where it upsamples in space, then
  ``conv3``; which levels do which follows ``DecoderFactorized`` (``legacy_mode=False``, as the DV configs);
* the final inverse Haar transform (``UnPatcher3D``) makes ``patch_size`` frames of which the last is kept;
  that frame is, per inverse level, the time-difference of the 8 sub-bands, then a 2x2 inverse in space:
  ``y[c, 2i+dy, 2j+dx] = sum over (t, h, w) of (-1)^(t + dy*h + dx*w) x[(4t+2h+w)*g + c, i, j]`` (the
  wavelet's 1/sqrt(2) per axis and the 2*sqrt(2) rescale cancel).

The architecture (channels per level, residual blocks per level, which levels attend, ``z_channels``,
``embedding_dim``, the patch size from ``conv_out``'s ``3 * p**3`` channels) is read from the tensors, so a
tiny test file loads as the release does; the FSQ levels from ``inv_quant.quantizer._levels`` where the
archive has it (else the DV levels, 8,8,8,5,5,5: 64,000 codes).  The spatial and temporal compression are
not stored and are fixed to DV8x16x16's, 16 and 8 (they decide which levels upsample in space and in
time); with them a grid of h x w codes decodes to 16h x 16w pixels.  Pixels come out in about [-1, 1].
"""
from __future__ import annotations

import math
import pathlib
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..formats.checkpoints import CheckpointError
from ..formats.torchscript import load_torchscript_tensors
from .blocks import CodebookDecoder, decoder_bytes, swish

#: DV8x16x16's compression, which the archive does not store: 16x in space, 8x in time
SPATIAL_COMPRESSION, TEMPORAL_COMPRESSION = 16, 8
#: the FSQ levels of the DV configs (``networks/configs.py``), for an archive without ``_levels``
DV_LEVELS = (8, 8, 8, 5, 5, 5)
DECODER_FILE = "decoder.jit"


def find_cosmos_decoder(folder: str | pathlib.Path) -> pathlib.Path | None:
    """``folder/decoder.jit`` if it is a file (a Cosmos tokenizer download), else None."""
    path = pathlib.Path(folder) / DECODER_FILE
    return path if path.is_file() else None


@dataclass(frozen=True)
class CosmosSpec:
    """A DV decoder's architecture, as its tensors describe it."""

    widths: tuple[int, ...] = (256, 512, 512)  # channels of level 0 (full resolution) .. the lowest level
    num_res_blocks: int = 2  # each level has num_res_blocks + 1 blocks, as DecoderFactorized
    attn_levels: tuple[int, ...] = ()  # levels whose blocks attend (the middle always does)
    z_channels: int = 16
    embedding_dim: int = 6
    levels: tuple[int, ...] = DV_LEVELS
    patch_size: int = 4
    out_channels: int = 3

    @property
    def n_embed(self) -> int:
        return math.prod(self.levels)

    def upsampling(self, level: int) -> tuple[bool, bool]:
        """(in space, in time) of level ``level``'s upsampler (levels > 0 have one), as DecoderFactorized
        decides it with ``legacy_mode=False``."""
        log_patch = int(math.log2(self.patch_size))
        spatial_ups = int(math.log2(SPATIAL_COMPRESSION)) - log_patch
        temporal_ups = int(math.log2(TEMPORAL_COMPRESSION)) - log_patch
        reverse = len(self.widths) - level - 1
        temporal = 0 < reverse < temporal_ups + 1
        return temporal or (reverse < spatial_ups and spatial_ups > temporal_ups), temporal

    @property
    def downsample(self) -> int:
        """Pixels per code along each axis: the patch size times 2 per spatial upsampler."""
        return self.patch_size * 2 ** sum(self.upsampling(i)[0] for i in range(1, len(self.widths)))

    @classmethod
    def from_tensors(cls, sd: dict[str, torch.Tensor], source: str = "the archive") -> "CosmosSpec":
        """The architecture, read from the archive's tensor names and shapes."""
        need = ("post_quant_conv.conv3d.weight", "decoder.conv_in.0.conv3d.weight", "decoder.conv_out.0.conv3d.weight",
                "decoder.up.0.block.0.conv1.0.conv3d.weight")
        missing = next((k for k in need if k not in sd), None)
        if missing is not None:
            raise CheckpointError(f"{source}: not a Cosmos DV tokenizer's decoder (no tensor {missing!r}; "
                                  "expected the decoder.jit of nvidia/Cosmos-1.0-Tokenizer-DV8x16x16)")
        for k in need:
            if sd[k].dim() != 5:
                raise CheckpointError(f"{source}: tensor {k!r} has shape {list(sd[k].shape)} where a Cosmos DV "
                                      "decoder has a 3D convolution's 5-dimensional weight")
        levels = sorted({int(m.group(1)) for k in sd if (m := re.match(r"decoder\.up\.(\d+)\.", k))})
        if levels != list(range(len(levels))):
            raise CheckpointError(f"{source}: the decoder's levels are {levels}, not 0..N")
        widths = []
        for i in levels:
            key = f"decoder.up.{i}.block.0.conv1.0.conv3d.weight"
            if key not in sd:
                raise CheckpointError(f"{source}: not a Cosmos DV tokenizer's decoder (no tensor {key!r})")
            widths.append(sd[key].shape[0])
        blocks = {int(m.group(1)) for k in sd if (m := re.match(r"decoder\.up\.0\.block\.(\d+)\.", k))}
        out = sd["decoder.conv_out.0.conv3d.weight"].shape[0]
        patch = round((out / 3) ** (1 / 3))
        if 3 * patch ** 3 != out or patch & (patch - 1) or not 1 <= patch <= SPATIAL_COMPRESSION:
            raise CheckpointError(f"{source}: decoder.conv_out makes {out} channels, not 3 * p**3 for a "
                                  "power-of-two patch size p")
        embedding_dim = sd["post_quant_conv.conv3d.weight"].shape[1]
        stored = sd.get("inv_quant.quantizer._levels")
        fsq = tuple(int(v) for v in stored.tolist()) if stored is not None and stored.dim() == 1 else DV_LEVELS
        if stored is not None and (stored.dim() != 1 or min(fsq, default=0) < 2):
            raise CheckpointError(f"{source}: inv_quant.quantizer._levels is {stored.tolist()}, not FSQ levels")
        if len(fsq) != embedding_dim:
            raise CheckpointError(f"{source}: post_quant_conv takes {embedding_dim} channels where the FSQ levels "
                                  f"{list(fsq)} give {len(fsq)} (an FSQ with a projection is not a DV decoder)")
        spec = cls(widths=tuple(widths), num_res_blocks=len(blocks) - 1,
                   attn_levels=tuple(i for i in levels if f"decoder.up.{i}.attn.0.0.q.conv3d.weight" in sd),
                   z_channels=sd["decoder.conv_in.0.conv3d.weight"].shape[1], embedding_dim=embedding_dim,
                   levels=fsq, patch_size=patch)
        if spec.downsample != SPATIAL_COMPRESSION:
            raise CheckpointError(f"{source}: {len(widths)} levels with patch size {patch} make a "
                                  f"{spec.downsample}x decoder, not DV8x16x16's {SPATIAL_COMPRESSION}x")
        return spec


class FoldedConv(nn.Conv2d):
    """A ``CausalConv3d`` on one frame: its ``(time_kernel, k, k)`` weight folded over time into a
    ``k x k`` one (see the module docstring), zero padding ``k // 2`` in space."""

    def __init__(self, cin: int, cout: int, kernel: int, time_kernel: int = 1):
        super().__init__(cin, cout, kernel, padding=kernel // 2)
        self.time_kernel = time_kernel

    def archive_shape(self) -> tuple[int, ...]:
        o, i, kh, kw = self.weight.shape
        return o, i, self.time_kernel, kh, kw


def space_then_time(cin: int, cout: int) -> nn.Sequential:
    """A factorized convolution: ``(1, 3, 3)`` then ``(3, 1, 1)`` (``.0`` and ``.1`` in the archive)."""
    return nn.Sequential(FoldedConv(cin, cout, 3), FoldedConv(cout, cout, 1, time_kernel=3))


def norm(channels: int) -> nn.GroupNorm:
    """``CausalNormalize``: one group, per frame."""
    return nn.GroupNorm(1, channels, eps=1e-6)


class ResnetBlock(nn.Module):
    """``CausalResnetBlockFactorized3d`` (dropout is 0 at inference)."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1, self.conv1 = norm(cin), space_then_time(cin, cout)
        self.norm2, self.conv2 = norm(cout), space_then_time(cout, cout)
        self.nin_shortcut = FoldedConv(cin, cout, 1) if cin != cout else None

    def forward(self, x):
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(swish(self.norm2(h)))
        return h + (x if self.nin_shortcut is None else self.nin_shortcut(x))


class SpatialAttention(nn.Module):
    """``CausalAttnBlock``: single-head self-attention over the frame's pixels."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = norm(c)
        self.q, self.k, self.v, self.proj_out = (FoldedConv(c, c, 1) for _ in range(4))

    def forward(self, x):
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (m(y).flatten(2).transpose(1, 2).unsqueeze(1) for m in (self.q, self.k, self.v))  # [b, 1, hw, c]
        y = F.scaled_dot_product_attention(q, k, v).squeeze(1)
        return x + self.proj_out(y.transpose(1, 2).reshape(b, c, h, w))


class TemporalAttention(nn.Module):
    """``CausalTemporalAttnBlock`` on one frame: each pixel attends to itself alone, so the output is
    ``x + proj_out(v(norm(x)))``; ``q`` and ``k`` are kept only so that the archive's tensors all load."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = norm(c)
        self.q, self.k, self.v, self.proj_out = (FoldedConv(c, c, 1) for _ in range(4))

    def forward(self, x):
        return x + self.proj_out(self.v(self.norm(x)))


def attention(c: int) -> nn.Sequential:
    """Spatial then temporal attention (``.0`` and ``.1`` in the archive)."""
    return nn.Sequential(SpatialAttention(c), TemporalAttention(c))


class HybridUpsample(nn.Module):
    """``CausalHybridUpsample3d`` on one frame (see the module docstring)."""

    def __init__(self, c: int, spatial: bool, temporal: bool):
        super().__init__()
        self.spatial, self.temporal = spatial, temporal
        self.conv1 = FoldedConv(c, c, 1, time_kernel=3)
        self.conv2 = FoldedConv(c, c, 3)
        self.conv3 = FoldedConv(c, c, 1)

    def forward(self, x):
        if not self.spatial and not self.temporal:
            return x
        if self.temporal:
            x = self.conv1(x) + x
        if self.spatial:
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")  # = repeat_interleave(2) on both axes
            x = self.conv2(x) + x
        return self.conv3(x)


class Level(nn.Module):
    def __init__(self, cin: int, cout: int, blocks: int, attends: bool, upsample: tuple[bool, bool] | None):
        super().__init__()
        self.block = nn.ModuleList(ResnetBlock(cin if j == 0 else cout, cout) for j in range(blocks))
        self.attn = nn.ModuleList(attention(cout) for _ in range(blocks)) if attends else nn.ModuleList()
        if upsample is not None:
            self.upsample = HybridUpsample(cout, *upsample)

    def forward(self, x):
        for j, block in enumerate(self.block):
            x = block(x)
            if len(self.attn):
                x = self.attn[j](x)
        return self.upsample(x) if hasattr(self, "upsample") else x


class Middle(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.block_1, self.attn_1, self.block_2 = ResnetBlock(c, c), attention(c), ResnetBlock(c, c)

    def forward(self, x):
        return self.block_2(self.attn_1(self.block_1(x)))


def inverse_haar(x: torch.Tensor, levels: int) -> torch.Tensor:
    """``UnPatcher3D``'s Haar inverse of a one-frame input, ``levels`` times, keeping the last frame it makes:
    ``[B, 8**levels * c, H, W]`` -> ``[B, c, 2**levels * H, 2**levels * W]``."""
    for _ in range(levels):
        b, c8, h, w = x.shape
        bands = x.view(b, 2, 2, 2, c8 // 8, h, w)  # (time, height, width) sub-band bits, then channels
        s = bands[:, 0] - bands[:, 1]  # the last frame of a pair: low minus high in time
        s = torch.stack((s[:, 0] + s[:, 1], s[:, 0] - s[:, 1]), dim=1)  # rows 2i, 2i+1
        s = torch.stack((s[:, :, 0] + s[:, :, 1], s[:, :, 0] - s[:, :, 1]), dim=2)  # columns 2j, 2j+1
        x = s.permute(0, 3, 4, 1, 5, 2).reshape(b, c8 // 8, 2 * h, 2 * w)  # [b, c, h, dy, w, dx]
    return x


class CosmosDecoderNet(nn.Module):
    """``decoder.*`` of the archive: levels ``up.N`` run from the lowest resolution (N = levels - 1) up."""

    def __init__(self, s: CosmosSpec):
        super().__init__()
        self.patch_levels = int(math.log2(s.patch_size))
        widths = s.widths
        self.conv_in = space_then_time(s.z_channels, widths[-1])
        self.mid = Middle(widths[-1])
        levels = []
        for i, width in enumerate(widths):
            cin = widths[-1] if i == len(widths) - 1 else widths[i + 1]
            levels.append(Level(cin, width, s.num_res_blocks + 1, i in s.attn_levels,
                                s.upsampling(i) if i > 0 else None))
        self.up = nn.ModuleList(levels)
        self.norm_out = norm(widths[0])
        self.conv_out = space_then_time(widths[0], s.out_channels * s.patch_size ** 3)

    def forward(self, z):
        h = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            h = level(h)
        return inverse_haar(self.conv_out(swish(self.norm_out(h))), self.patch_levels)


class CosmosModel(nn.Module):
    """``decoder_jit()``'s three parts: the FSQ codes, ``post_quant_conv``, the decoder."""

    def __init__(self, spec: CosmosSpec):
        super().__init__()
        self.spec = spec
        basis = [math.prod(spec.levels[:i]) for i in range(len(spec.levels))]  # place values of the digits
        self.register_buffer("levels", torch.tensor(spec.levels, device="cpu"), persistent=False)
        self.register_buffer("basis", torch.tensor(basis, device="cpu"), persistent=False)
        self.post_quant_conv = FoldedConv(spec.embedding_dim, spec.z_channels, 1)
        self.decoder = CosmosDecoderNet(spec)

    def fsq_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Indices ``[...]`` -> FSQ code vectors ``[..., len(levels)]`` in [-1, 1] (float32):
        digit ``(index // basis) % levels`` of each dimension, centred and scaled by ``levels // 2``."""
        half = self.levels // 2
        return ((codes.unsqueeze(-1) // self.basis) % self.levels - half).float() / half

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, h, w]`` -> pixels ``[B, 3, 16h, 16w]`` in about [-1, 1]."""
        dtype = self.post_quant_conv.weight.dtype
        z = self.fsq_codes(codes).permute(0, 3, 1, 2).to(dtype).contiguous()  # exact in bfloat16 too
        return self.decoder(self.post_quant_conv(z))


#: archive tensors that are not weights of the 2D network: the quantizer's tables (recomputed from the
#: levels) and the unpatcher's wavelet (a constant)
COMPUTED = ("inv_quant.", "decoder.unpatcher3d.")


def archive_tensors(model: CosmosModel) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each parameter of ``model`` -> its name and shape in the archive: a convolution's weights live in
    its ``.conv3d`` (5-dimensional), a norm's in its ``.norm``."""
    out = {}
    for module_name, module in model.named_modules():
        for leaf, param in module.named_parameters(recurse=False):
            if isinstance(module, FoldedConv):
                shape = module.archive_shape() if leaf == "weight" else tuple(param.shape)
                out[f"{module_name}.{leaf}"] = (f"{module_name}.conv3d.{leaf}", shape)
            else:  # nn.GroupNorm
                out[f"{module_name}.{leaf}"] = (f"{module_name}.norm.{leaf}", tuple(param.shape))
    return out


def fold_weights(model: CosmosModel, sd: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """``model``'s state dict from the archive's tensors: each name and 3D shape checked, each time kernel
    summed away (in float32); one error naming the first missing, misshapen or unexpected tensor."""
    out = {}
    wanted = archive_tensors(model)
    for name, (key, shape) in wanted.items():
        if key not in sd:
            raise CheckpointError(f"{source}: not a Cosmos DV decoder of the architecture its tensors describe: "
                                  f"no tensor {key!r}")
        if tuple(sd[key].shape) != shape:
            raise CheckpointError(f"{source}: tensor {key!r} has shape {list(sd[key].shape)} where a Cosmos DV "
                                  f"decoder needs {list(shape)}: the file is damaged or holds another model")
        t = sd[key].float()
        out[name] = t.sum(dim=2) if t.dim() == 5 else t
    known = {key for key, _ in wanted.values()}
    unexpected = next((k for k in sd if k.startswith(("decoder.", "post_quant_conv.")) and k not in known
                       and not k.startswith(COMPUTED)), None)
    if unexpected is not None:
        raise CheckpointError(f"{source}: tensor {unexpected!r} is no part of a Cosmos DV decoder of the "
                              "architecture the other tensors describe: the file holds another model")
    return out


class CosmosDecoder(CodebookDecoder):
    """A loaded Cosmos DV decoder: codes -> images, plus its FSQ codebook for the engine."""

    @classmethod
    def load(cls, path: str | pathlib.Path, device="cpu", dtype=torch.float32) -> "CosmosDecoder":
        """``path``: the release's ``decoder.jit``, or the folder holding it."""
        path = pathlib.Path(path)
        if path.is_dir():
            found = find_cosmos_decoder(path)
            if found is None:
                raise CheckpointError(f"{path}: no {DECODER_FILE} (the Cosmos tokenizer's decoder) in the folder")
            path = found
        return cls.from_tensors(load_torchscript_tensors(path), device, dtype, source=str(path))

    @classmethod
    def from_tensors(cls, sd: dict[str, torch.Tensor], device="cpu", dtype=torch.float32,
                     source: str = "") -> "CosmosDecoder":
        source = source or "the archive"
        spec = CosmosSpec.from_tensors(sd, source)
        with torch.device("meta"):
            model = CosmosModel(spec)
        weights = fold_weights(model, sd, source)
        model.load_state_dict(weights, strict=True, assign=True)
        return cls(model.to(device=device, dtype=dtype).eval(), source)

    def codebook(self) -> torch.Tensor:
        """``[n_embed, embedding_dim]`` FSQ code vectors (float32), index order."""
        return self.model.fsq_codes(torch.arange(self.spec.n_embed, device=self.model.levels.device)).float()

    def bytes_per_image(self, grid: tuple[int, int]) -> int:
        """Peak activations decoding one image of ``grid`` codes (an estimate): the last level's tensors at
        ``downsample / patch_size`` features per code and axis (the inverse Haar makes the rest), or an
        attention map where one is larger (the middle's over every code, unfused)."""
        s = self.spec
        itemsize = next(self.model.parameters()).element_size()
        codes = grid[0] * grid[1]
        features = codes * (s.downsample // s.patch_size) ** 2
        scale = 1
        attended = codes ** 2
        for i in reversed(range(len(s.widths))):
            if i in s.attn_levels:
                attended = max(attended, (codes * scale) ** 2)
            if i > 0 and s.upsampling(i)[0]:
                scale *= 4
        return max(decoder_bytes(features, s.widths[0], itemsize), attended * itemsize)
