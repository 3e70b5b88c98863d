"""What a loaded model family hands to the command line and the nodes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..sampling.adapter import ImageAdapter
from ..sampling.config import ConfigError


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


def resolve_device(requested: str | None) -> str:
    """``requested`` (``cpu``, ``cuda``, ``cuda:1`` ...) checked against this machine, or the
    default: ``cuda`` when present, else ``cpu``."""
    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(requested)
    except RuntimeError as err:
        raise ConfigError(f"device must be cpu, cuda or cuda:N (got {requested!r})") from err
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {requested!r}: no CUDA device on this machine (torch {torch.__version__}); "
                              "use cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"device {requested!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type != "cpu":
        raise ConfigError(f"device must be cpu, cuda or cuda:N (got {requested!r})")
    return requested
