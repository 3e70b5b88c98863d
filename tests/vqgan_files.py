"""Tiny random-weight Chameleon VQGANs written in Meta's format (``vqgan.yaml`` + ``vqgan.ckpt``)."""
from __future__ import annotations

import pathlib
import re

import torch

from spec_ar.bench.scale_checkpoints.vqgan import vqgan_yaml
from spec_ar.decoders.vqgan import VQGANModel, VQGANSpec

#: two levels, no attention outside the middle block
TINY = VQGANSpec(embed_dim=8, n_embed=64, z_channels=16, ch=32, ch_mult=(1, 2), num_res_blocks=1,
                 attn_resolutions=(), resolution=32)
#: three levels with attention at the lowest resolution (32 / 4 = 8)
TINY_ATTN = VQGANSpec(embed_dim=8, n_embed=64, z_channels=16, ch=32, ch_mult=(1, 1, 2), num_res_blocks=1,
                      attn_resolutions=(8,), resolution=32)
#: two levels of equal width, where only the order of ``up`` tells them apart
TINY_FLAT = VQGANSpec(embed_dim=8, n_embed=64, z_channels=16, ch=32, ch_mult=(1, 1), num_res_blocks=1,
                      attn_resolutions=(), resolution=32)


def yaml_text(spec: VQGANSpec) -> str:
    """The config as Meta ships it (the scale writer's), with a comment on one line for the parser."""
    return re.sub(r"(attn_resolutions: \[[^\]]*\])", r"\1  # none in the released tokenizer", vqgan_yaml(spec), 1)


def random_vqgan(spec: VQGANSpec, seed: int = 0) -> VQGANModel:
    """Default init, with norms and biases perturbed so that every parameter matters."""
    torch.manual_seed(seed)
    model = VQGANModel(spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.uniform_(0.7, 1.3)
            elif name.endswith("bias"):
                p.normal_(0, 0.05)
        model.quantize.embedding.weight.normal_(0, 1)
    return model.eval()


def write_vqgan(folder: str | pathlib.Path, spec: VQGANSpec = TINY, seed: int = 0,
                extra: dict | None = None) -> tuple[pathlib.Path, pathlib.Path]:
    """``folder/vqgan.yaml`` and ``folder/vqgan.ckpt`` (``{"state_dict": ..., "global_step": 0}``
    with ``loss.*`` weights, as a training run saves); ``extra`` adds top-level entries."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    yaml_path, ckpt_path = folder / "vqgan.yaml", folder / "vqgan.ckpt"
    yaml_path.write_text(yaml_text(spec))
    sd = {k: v.clone() for k, v in random_vqgan(spec, seed).state_dict().items()}
    sd["loss.logvar"] = torch.zeros(())
    sd["loss.discriminator.main.0.weight"] = torch.randn(8, 3, 4, 4)
    sd["loss.perceptual_loss.lin0.model.1.weight"] = torch.randn(1, 8, 1, 1)
    torch.save({"state_dict": sd, "global_step": 0, "epoch": 0, **(extra or {})}, ckpt_path)
    return yaml_path, ckpt_path


def _touch(path: str):
    pathlib.Path(path).write_text("unpickling ran code")


class Callback:
    """An object a training framework pickles into its checkpoints; unpickling it would run
    ``_touch``, which weights-only loading must refuse."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return _touch, (self.marker,)
