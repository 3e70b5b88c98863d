"""What a loaded model family hands to the command line and the nodes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..sampling.adapter import ImageAdapter


@dataclass
class LoadedModel:
    """A ready-to-sample model: the engine adapter, how to turn image tokens into
    pictures, and what the user can set."""

    family: str  # e.g. "llamagen", "janus"
    name: str  # human-readable, e.g. "LlamaGen-XL t2i"
    adapter: ImageAdapter
    #: image tokens ``[B, rows, cols]`` -> images ``[B, 3, H, W]`` float32 in [0, 1]; None without a decoder
    decode: Callable[[torch.Tensor], torch.Tensor] | None
    condition: str  # "text" or "class"
    #: resolutions (pixels, square) the family accepts; rebuild with ``resize``
    resolutions: tuple[int, ...] = ()
    resize: Callable[[int], "LoadedModel"] | None = None
    info: dict = field(default_factory=dict)
    #: every torch module the model runs (GPT, text encoder, VQ): what ComfyUI's memory manager moves
    modules: dict[str, torch.nn.Module] = field(default_factory=dict)

    @property
    def resolution(self) -> int | None:
        return self.info.get("resolution")
