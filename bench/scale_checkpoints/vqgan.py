"""Meta's VQGAN in its release format (``vqgan.yaml`` + ``vqgan.ckpt``): the image tokenizer of Lumina-mGPT and
Anole (chameleon.py) and of Liquid (liquid.py)."""
from __future__ import annotations

import pathlib

import torch

from .scaling import scaled_channels
from .stats import Stats
from .tensors import TensorSpec, specs_of
from .weight_files import write_torch


def vqgan_spec(cfg: dict, scale: float):
    from ...decoders.vqgan import VQGANSpec

    vq = cfg["vq"]
    return VQGANSpec(embed_dim=scaled_channels(vq["embed_dim"], scale, 8) if scale != 1 else vq["embed_dim"],
                     n_embed=vq["n_embed"], z_channels=scaled_channels(vq["z_channels"], scale) if scale != 1 else
                     vq["z_channels"], ch=scaled_channels(vq["ch"], scale) if scale != 1 else vq["ch"],
                     ch_mult=tuple(vq["ch_mult"]), num_res_blocks=vq["num_res_blocks"],
                     attn_resolutions=tuple(vq["attn_resolutions"]), resolution=vq["resolution"])


def vqgan_yaml(spec) -> str:
    """vqgan.yaml as Meta ships it (taming-transformers keys; ``ckpt_path`` and a loss config, which
    transformers' converter deletes)."""
    ch_mult = "".join(f"\n      - {m}" for m in spec.ch_mult)
    attn = "[" + ", ".join(str(r) for r in spec.attn_resolutions) + "]"
    return f"""model:
  base_learning_rate: 4.5e-06
  target: taming.models.vqgan.VQModel
  params:
    embed_dim: {spec.embed_dim}
    n_embed: {spec.n_embed}
    ddconfig:
      double_z: false
      z_channels: {spec.z_channels}
      resolution: {spec.resolution}
      in_channels: {spec.in_channels}
      out_ch: {spec.out_ch}
      ch: {spec.ch}
      ch_mult:{ch_mult}
      num_res_blocks: {spec.num_res_blocks}
      attn_resolutions: {attn}
      dropout: {spec.dropout}
    lossconfig:
      target: taming.modules.losses.vqperceptual.VQLPIPSWithDiscriminator
      params:
        disc_conditional: false
        disc_in_channels: 3
        disc_start: 100000000
        disc_weight: 0.2
        codebook_weight: 1.0
"""


def vqgan_specs(spec) -> list[TensorSpec]:
    from ...decoders.vqgan import VQGANModel

    with torch.device("meta"):
        model = VQGANModel(spec)
    out = specs_of(model.state_dict())
    for s in out:
        s.dtype = torch.float32  # a training checkpoint: float32 whatever --dtype says
        s.sources = ("vqgan." + s.name,)
    return out


def write_vqgan(folder: pathlib.Path, spec, seed: int, stats: Stats) -> None:
    """``tokenizer/vqgan.yaml`` + ``vqgan.ckpt`` (``{"state_dict": ..., "global_step": ...}``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vqgan.yaml").write_text(vqgan_yaml(spec))
    stats.add(folder / "vqgan.yaml")
    tree = {"state_dict": {s.name: s for s in vqgan_specs(spec)}, "global_step": 0, "epoch": 0}
    write_torch(folder / "vqgan.ckpt", tree, torch.float32, seed)
    stats.add(folder / "vqgan.ckpt")
