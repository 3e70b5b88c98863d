"""Tiny random Cosmos DV decoders in the release's format (nvidia/Cosmos-1.0-Tokenizer-DV8x16x16's
``decoder.jit``), written by ``bench/cosmos_archive.py``: a TorchScript archive of the module tree NVIDIA's
``CausalDiscreteVideoTokenizer.decoder_jit()`` builds, with its names and 3D shapes.

The tree is built from a config in the reference's terms (``networks/configs.py``'s ``discrete_video``,
shrunk) by ``DecoderFactorized``'s own rules, so ``cosmos_reference.py`` can check that NVIDIA's code finds
every tensor it needs in the file.  The real 16x layout is kept (three levels, patch size 4); channels are
narrow, one residual block per level plus one, and the lowest level attends (``attn_resolutions`` names its
4 x 4 resolution; the release's attends in the middle only).  Only the tensors matter: the traced
``forward`` is a stand-in that looks codes up in the codebook (readers never run an archive's code).
Values are drawn from one seeded generator in name order, so the reference outputs recorded from them stay
valid."""
from __future__ import annotations

import pathlib

import torch

#: the tiny architecture, in the reference's configuration keys (``discrete_video`` with these replaced)
CONFIG = {"channels": 4, "channels_mult": [1, 2, 2], "num_res_blocks": 1, "attn_resolutions": [4],
          "resolution": 64, "patch_size": 4, "z_channels": 4, "embedding_dim": 6, "levels": [8, 8, 8, 5, 5, 5]}
SPATIAL_COMPRESSION, TEMPORAL_COMPRESSION = 16, 8  # DV8x16x16's, as SimpleAR passes them
#: what our decoder should read from the file: level widths, levels that attend
WIDTHS, ATTN_LEVELS = (4, 8, 8), (2,)


def write_cosmos_decoder(folder: pathlib.Path, seed: int = 0, dtype: torch.dtype = torch.float32,
                         cfg: dict = CONFIG, name: str = "decoder.jit") -> pathlib.Path:
    """``folder/decoder.jit``: the tiny decoder, its parameters in ``dtype`` (``bench/cosmos_archive.py``)."""
    from spec_ar.bench.cosmos_archive import write_archive

    return write_archive(folder, cfg, seed, dtype, name)
