"""Tiny random SBER-MoVQGAN checkpoints in the release layout (ai-forever/MoVQGAN ``movqgan_270M.ckpt``: a
torch pickle of the model's flat state dict, which Lumina-mGPT 2.0's ``get_movqgan_model`` loads with
``load_state_dict(checkpoint, strict=False)``), with the real downsampling (four levels, 8x), narrow
channels, and encoder-side tensors the decoder never reads.  Values are drawn from one seeded generator in
name order, so the reference outputs recorded from them (``movqgan_reference.py``) stay valid."""
from __future__ import annotations

import pathlib

import torch

from spec_ar.decoders.movqgan import MoVQModel, MoVQSpec

#: the tiny architecture, as the reference's ddconfig (``movqgan/__init__.py``'s MODELS entries) writes it
DDCONFIG = {"double_z": False, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 32,
            "ch_mult": [1, 2, 2, 4], "num_res_blocks": 1, "attn_resolutions": [32], "dropout": 0.0}
N_EMBED, EMBED_DIM = 64, 4
#: ours: the lowest level (256 / 8 = 32 px, in attn_resolutions) attends
SPEC = MoVQSpec(ch=32, ch_mult=(1, 2, 2, 4), num_res_blocks=1, attn_levels=(3,), z_channels=4, embed_dim=EMBED_DIM,
                n_embed=N_EMBED)
ENCODER_SIDE = {"quant_conv.weight": (EMBED_DIM, 4, 1, 1), "quant_conv.bias": (EMBED_DIM,),
                "encoder.conv_in.weight": (32, 3, 3, 3), "encoder.conv_in.bias": (32,)}


def random_state(seed: int = 0, spec: MoVQSpec = SPEC) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in MoVQModel(spec).state_dict().items()}
    shapes.update(ENCODER_SIDE)
    return random_decoder_state(shapes, seed, norms=("norm_layer.weight",))


def random_decoder_state(shapes: dict[str, tuple], seed: int, norms: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Random tensors for a VQ model's ``shapes``, drawn from one seeded generator in name order: the
    ``norms`` weights near 1, biases small, the codebook unit normal, convolutions for unit-variance
    activations (recorded references depend on this order)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith(norms):
            value = 1 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith(".bias"):
            value = 0.05 * torch.randn(shape, generator=g)
        elif name == "quantize.embedding.weight":
            value = torch.randn(shape, generator=g)
        else:  # convolutions: unit-variance activations
            fan_in = shape[1] * (shape[2] * shape[3] if len(shape) == 4 else 1)
            value = torch.randn(shape, generator=g) / fan_in ** 0.5
        out[name] = value
    return out


def write_movqgan(path: pathlib.Path, seed: int = 0, spec: MoVQSpec = SPEC) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(random_state(seed, spec), path)
    return path
