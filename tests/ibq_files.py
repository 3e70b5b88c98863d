"""Tiny random IBQ tokenizers in the release layout of ``BAAI/Emu3.5-VisionTokenizer``: a folder of
``config.yaml`` (``IBQ(**cfg)``'s arguments: ``ddconfig``, ``n_embed``, ``embed_dim`` and the training
settings the IBQ class takes) and ``model.ckpt`` (a torch pickle of the whole module's state dict, encoder
included, in a Lightning checkpoint's ``state_dict`` entry), which the authors' ``build_vision_tokenizer``
loads with a strict ``load_state_dict``.  The real downsampling (five levels, 16x, attention at the lowest
one as ``attn_resolutions: [16]`` of a 256 input puts it), narrow channels, a small codebook, and
``z_channels`` (16) unlike ``embed_dim`` so that ``post_quant_conv``'s two sides cannot be confused.  Values come
from one seeded generator in name order, so the reference outputs recorded from them
(``ibq_reference.py``) stay valid.  ``embed_dim`` is the release's 256: the authors' ``decode_image`` reshapes
the code vectors to ``(1, h, w, 256)`` whatever the configuration says."""
from __future__ import annotations

import pathlib

import torch

from spec_ar.decoders.ibq import CKPT_NAME, CONFIG_NAME, IBQSpec
from spec_ar.decoders.vqgan import VQGANModel, VQGANSpec

from .movqgan_files import random_decoder_state

#: the tiny architecture, as the release's config.yaml writes it (its keys; narrower numbers)
DDCONFIG = {"double_z": False, "z_channels": 16, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 32,
            "ch_mult": [1, 1, 2, 2, 4], "num_res_blocks": 1, "attn_resolutions": [16], "dropout": 0.0}
N_EMBED, EMBED_DIM = 96, 256
#: IBQ's other arguments (training only; decoding reads none of them)
TRAINING = {"beta": 0.25, "use_entropy_loss": True, "cosine_similarity": False, "entropy_temperature": 0.01,
            "sample_minimization_weight": 1.0, "batch_maximization_weight": 1.0}
CONFIG = {"ddconfig": DDCONFIG, "n_embed": N_EMBED, "embed_dim": EMBED_DIM, **TRAINING}
#: ours, read from CONFIG
SPEC = IBQSpec(n_embed=N_EMBED, embed_dim=EMBED_DIM, z_channels=16, ch=32, ch_mult=(1, 1, 2, 2, 4), num_res_blocks=1,
               attn_resolutions=(16,), resolution=256, out_ch=3, dropout=0.0)


def shapes(config: dict = CONFIG) -> dict[str, tuple[int, ...]]:
    """Every tensor of the authors' IBQ module for ``config``: taming's encoder and decoder (the layout
    vqgan.py's model has), ``quant_conv``, ``quantize.embedding``, ``post_quant_conv``."""
    dd = config["ddconfig"]
    spec = VQGANSpec(embed_dim=config["embed_dim"], n_embed=config["n_embed"], z_channels=dd["z_channels"], ch=dd["ch"],
                     ch_mult=tuple(dd["ch_mult"]), num_res_blocks=dd["num_res_blocks"],
                     attn_resolutions=tuple(dd["attn_resolutions"]), resolution=dd["resolution"],
                     in_channels=dd["in_channels"], out_ch=dd["out_ch"])
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in VQGANModel(spec, with_encoder=True).state_dict().items()}


def random_state(seed: int = 0, config: dict = CONFIG) -> dict[str, torch.Tensor]:
    return random_decoder_state(shapes(config), seed,
                                norms=("norm1.weight", "norm2.weight", "norm.weight", "norm_out.weight"))


def write_config(folder: pathlib.Path, config: dict = CONFIG) -> pathlib.Path:
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_NAME).write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return folder / CONFIG_NAME


def write_ibq(folder: pathlib.Path, seed: int = 0, config: dict = CONFIG, wrapped: bool = True,
              state: dict | None = None) -> pathlib.Path:
    """The tokenizer folder: ``config.yaml`` and ``model.ckpt`` (``{"state_dict": ...}``, or the bare dict)."""
    write_config(folder, config)
    state = random_state(seed, config) if state is None else state
    torch.save({"state_dict": state} if wrapped else state, folder / CKPT_NAME)
    return folder
