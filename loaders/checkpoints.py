"""Reading checkpoint files safely: safetensors, or torch pickles with ``weights_only``."""
from __future__ import annotations

import argparse
import pathlib
from typing import Iterable

import torch

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


class CheckpointError(ValueError):
    """A file that is not a checkpoint of the expected kind."""


def load_file(path: str | pathlib.Path) -> dict:
    """The object stored in ``path``: a safetensors dict, or a torch pickle read with
    ``weights_only=True``.  Training checkpoints of some families carry their
    ``argparse.Namespace`` of arguments; that plain container is allowed, nothing
    else beyond what ``weights_only`` admits."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file as load_safetensors

        return load_safetensors(str(path))
    if path.suffix not in TORCH_SUFFIXES:
        kinds = ", ".join(TORCH_SUFFIXES)
        raise CheckpointError(f"{path}: expected a .safetensors file or a torch checkpoint ({kinds})")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as err:  # mmap needs the zip format; older files are read whole
                if "mmap" not in str(err):
                    raise
                return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # an unpicklable, unsafe or corrupt file
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path}: cannot be read as a weights-only checkpoint ({first})") from err


def state_dict(obj, wrappers: Iterable[str] = ("model", "module", "state_dict", "ema")) -> dict[str, torch.Tensor]:
    """Unwrap the first wrapper key that holds tensors; otherwise ``obj`` itself."""
    if isinstance(obj, dict):
        for key in wrappers:
            inner = obj.get(key)
            if isinstance(inner, dict) and any(isinstance(v, torch.Tensor) for v in inner.values()):
                return inner
        return {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    raise CheckpointError(f"expected a dict of tensors, found {type(obj).__name__}")


def peek(path: str | pathlib.Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a checkpoint file, without loading safetensors data."""
    path = pathlib.Path(path)
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    return {k: tuple(v.shape) for k, v in state_dict(load_file(path)).items()}
