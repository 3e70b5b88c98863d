"""What a loaded model family hands to the command line and the nodes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..decoders.blocks import decoder_bytes
from ..sampling.adapter import ImageAdapter
from ..sampling.checks import check_images
from ..sampling.config import ConfigError
from ..sampling.memory import HEADROOM, check_fits, free_bytes


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
    #: the decoder's activations for one image (an estimate; 0: unknown)
    decode_bytes_per_image: int = 0
    #: what the user should know about how the model was loaded (e.g. a guessed image grid)
    warnings: list[str] = field(default_factory=list)
    #: how its weights are stored (``storage.Storage``), set by ``detect.load_model``
    storage: object = None
    #: a model of stages that take turns in memory (``stages.Turns``: "sampling", "decoding"); None: one stage
    turns: object = None

    @property
    def resolution(self) -> int | None:
        return self.info.get("resolution")

    @property
    def device(self) -> torch.device:
        return torch.device(self.adapter.device)

    @property
    def dtype(self) -> torch.dtype:
        """The weights' precision (of the first module; float32 if none)."""
        for module in self.modules.values():
            for p in module.parameters():
                return p.dtype
        return torch.float32

    def check_decoder_fits(self) -> None:
        """Before decoding starts: one image's decode must fit the free memory."""
        check_fits({"VQ decoder": self.decode_bytes_per_image}, 1, self.device, what="decode")

    def decode_images(self, tokens: torch.Tensor, decode=None) -> torch.Tensor:
        """Image tokens ``[B, rows, cols]`` -> images ``[B, 3, H, W]`` float32 in [0, 1] on
        the CPU, decoded as many at a time as the free memory holds (``decode``: another
        decoder than the model's own); NaN or infinity in a picture is a
        :class:`~..sampling.checks.NonFiniteImageError`."""
        return decode_in_chunks(decode or self.decode, tokens, self.decode_bytes_per_image, self.device)


def decode_in_chunks(decode, tokens: torch.Tensor, bytes_per_image: int, device) -> torch.Tensor:
    free = free_bytes(device) if bytes_per_image else None
    chunk = len(tokens) if free is None else max(1, int(HEADROOM * free // bytes_per_image))
    return torch.cat([check_images(decode(tokens[i:i + chunk]).float().cpu(), first=i)
                      for i in range(0, len(tokens), chunk)])


def vq_decoder_bytes(vq_config, side: int, dtype: torch.dtype) -> int:
    """:func:`decoder_bytes` for a transformers VQ-VAE config (Janus, Emu3) at ``side`` pixels."""
    return decoder_bytes(side * side, vq_config.base_channels * vq_config.channel_multiplier[0], dtype.itemsize)


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
