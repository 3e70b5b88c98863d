"""Cosmos DV decoders in the release's format (nvidia/Cosmos-1.0-Tokenizer-DV8x16x16's ``decoder.jit``), with
random weights, for tests (tiny) and the scale bench (the release's size): a TorchScript archive, written by
``torch.jit.trace``, of the module tree NVIDIA's ``CausalDiscreteVideoTokenizer.decoder_jit()`` builds, with
its names and 3D shapes (``inv_quant.quantizer`` with its ``_levels`` / ``_basis`` / ``implicit_codebook``
buffers, ``post_quant_conv.conv3d``, ``decoder.conv_in.0.conv3d``, ``decoder.mid.block_1.norm1.norm``, ...,
``decoder.unpatcher3d``'s wavelet).

The tree is built from a config in the reference's terms (``networks/configs.py``'s ``discrete_video``:
:data:`DV`, or shrunk) by ``DecoderFactorized``'s own rules.  Only the tensors matter: the traced ``forward``
is a stand-in that looks codes up in the codebook (readers never run an archive's code).  Values are drawn
from one seeded generator in name order (:func:`randomize`).
"""
from __future__ import annotations

import math
import pathlib

import torch
from torch import nn

#: the release's architecture (NVIDIA/Cosmos-Tokenizer @3584ae7, networks/configs.py ``discrete_video``)
DV = {"channels": 128, "channels_mult": [2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [32],
      "resolution": 1024, "patch_size": 4, "z_channels": 16, "embedding_dim": 6, "levels": [8, 8, 8, 5, 5, 5]}


class CausalConv(nn.Module):
    """``CausalConv3d``: its weights in ``.conv3d``."""

    def __init__(self, cin: int, cout: int, kernel):
        super().__init__()
        self.conv3d = nn.Conv3d(cin, cout, kernel)


class CausalNorm(nn.Module):
    """``CausalNormalize``: its weights in ``.norm``."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = nn.GroupNorm(1, c, eps=1e-6)


def factorized(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(CausalConv(cin, cout, (1, 3, 3)), CausalConv(cout, cout, (3, 1, 1)))


class ResnetBlock(nn.Module):
    """``CausalResnetBlockFactorized3d``'s tensors."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1, self.conv1 = CausalNorm(cin), factorized(cin, cout)
        self.norm2, self.conv2 = CausalNorm(cout), factorized(cout, cout)
        self.nin_shortcut = CausalConv(cin, cout, 1) if cin != cout else nn.Identity()


class AttnBlock(nn.Module):
    """``CausalAttnBlock`` / ``CausalTemporalAttnBlock``'s tensors (the same names)."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = CausalNorm(c)
        self.q, self.k, self.v, self.proj_out = (CausalConv(c, c, 1) for _ in range(4))


class HybridUpsample(nn.Module):
    """``CausalHybridUpsample3d``'s tensors (all three convolutions exist whichever way it upsamples)."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1, self.conv2, self.conv3 = CausalConv(c, c, (3, 1, 1)), CausalConv(c, c, (1, 3, 3)), \
            CausalConv(c, c, 1)


class UnPatcher(nn.Module):
    """``UnPatcher3D``'s (non-persistent, still archived) buffers."""

    def __init__(self):
        super().__init__()
        self.register_buffer("wavelets", torch.tensor([0.7071067811865476, 0.7071067811865476]))
        self.register_buffer("_arange", torch.arange(2))


class Decoder(nn.Module):
    """``DecoderFactorized``'s tensors, built by its rules."""

    def __init__(self, cfg: dict):
        super().__init__()
        mult, ch, patch = cfg["channels_mult"], cfg["channels"], cfg["patch_size"]
        n = len(mult)
        self.unpatcher3d = UnPatcher()
        block_in = ch * mult[-1]
        curr_res = (cfg["resolution"] // patch) // 2 ** (n - 1)
        self.conv_in = factorized(cfg["z_channels"], block_in)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(block_in, block_in)
        self.mid.attn_1 = nn.Sequential(AttnBlock(block_in), AttnBlock(block_in))
        self.mid.block_2 = ResnetBlock(block_in, block_in)
        self.up = nn.ModuleList()
        for i_level in reversed(range(n)):
            block, attn = nn.ModuleList(), nn.ModuleList()
            block_out = ch * mult[i_level]
            for _ in range(cfg["num_res_blocks"] + 1):
                block.append(ResnetBlock(block_in, block_out))
                block_in = block_out
                if curr_res in cfg["attn_resolutions"]:
                    attn.append(nn.Sequential(AttnBlock(block_in), AttnBlock(block_in)))
            up = nn.Module()
            up.block, up.attn = block, attn
            if i_level != 0:
                up.upsample = HybridUpsample(block_in)
                curr_res *= 2
            self.up.insert(0, up)
        self.norm_out = CausalNorm(block_in)
        self.conv_out = factorized(block_in, 3 * patch ** 3)


class Quantizer(nn.Module):
    """``FSQuantizer``'s buffers, with the values its constructor gives them (codebook in bfloat16, its dtype)."""

    def __init__(self, levels: list[int]):
        super().__init__()
        basis = [math.prod(levels[:i]) for i in range(len(levels))]
        self.register_buffer("_levels", torch.tensor(levels, dtype=torch.int32))
        self.register_buffer("_basis", torch.tensor(basis, dtype=torch.int32))
        index = torch.arange(math.prod(levels)).unsqueeze(-1)
        half = self._levels // 2
        self.register_buffer("implicit_codebook", (((index // self._basis) % self._levels - half) / half)
                             .to(torch.bfloat16))


class InvQuantizer(nn.Module):
    def __init__(self, levels: list[int]):
        super().__init__()
        self.quantizer = Quantizer(levels)

    def forward(self, indices):
        return self.quantizer.implicit_codebook[indices]


class DecoderJit(nn.Module):
    """``decoder_jit()``'s three parts; ``forward`` is a stand-in (the FSQ look-up alone)."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.inv_quant = InvQuantizer(cfg["levels"])
        self.post_quant_conv = CausalConv(cfg["embedding_dim"], cfg["z_channels"], 1)
        self.decoder = Decoder(cfg)

    def forward(self, indices):
        return self.inv_quant(indices)


def randomize(model: nn.Module, seed: int) -> None:
    """Seeded values in name order: GroupNorm weights near 1 and biases near 0 (not the identity), unit-variance
    convolutions, and a last convolution scaled so that pixels mostly stay inside [-1, 1] (each of them sums
    8 sub-bands per inverse Haar level)."""
    g = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            if name.endswith("norm.weight"):
                value = 1 + 0.2 * torch.randn(p.shape, generator=g)
            elif name.endswith(".bias"):
                value = 0.05 * torch.randn(p.shape, generator=g)
            else:
                value = torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5
                if name == "decoder.conv_out.1.conv3d.weight":
                    value /= 16
            p.copy_(value)


def write_archive(folder: pathlib.Path, cfg: dict = DV, seed: int = 0, dtype: torch.dtype = torch.float32,
                  name: str = "decoder.jit") -> pathlib.Path:
    """``folder/name``: the decoder of ``cfg``, its parameters in ``dtype``."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = DecoderJit(cfg)
    randomize(model, seed)
    model.post_quant_conv.to(dtype)
    model.decoder.to(dtype)
    path = folder / name
    torch.jit.trace(model.eval(), torch.zeros(1, 1, 2, 2, dtype=torch.long)).save(str(path))
    return path
