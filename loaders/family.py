"""What each model family declares so that ``detect.py`` can tell families apart and
load them: a :class:`Family` (``FAMILY`` in the family's module) saying how to
recognise its files by their contents, what a user must give, and how to load it."""
from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from ..formats.checkpoints import CheckpointError, read_json

if TYPE_CHECKING:
    from .base import LoadedModel


@dataclass(frozen=True)
class Detected:
    family: str  # "llamagen", "janus"; "llamagen-vq" for a tokenizer file
    path: pathlib.Path
    detail: str = ""

    @property
    def condition(self) -> str:
        """What the model is conditioned on, known before loading: "class" or "text"."""
        return "class" if self.family == "llamagen" and self.detail == "c2i" else "text"


@dataclass(frozen=True)
class LoadOptions:
    """What the caller asked for besides the path; each family reads what applies to it."""

    vq: str | None = None
    text_encoder: str | None = None
    resolution: int | None = None
    width: int | None = None
    height: int | None = None
    device: str = "cpu"
    dtype: torch.dtype = torch.float32  # what is kept in full precision (all of it, unless storage is quantized)
    storage: object = None  # how the language model's weights are stored (storage.Storage; None: ``dtype``)


@dataclass(frozen=True)
class Family:
    name: str  # the Detected.family it recognises
    #: what a user must give, in the error that lists every family when none recognises a path
    needs: str
    #: the file or folder's family, judged by its contents (config.json, tensor names), never by its name
    detect: Callable[[pathlib.Path], Detected | None]
    load: Callable[[Detected, LoadOptions], "LoadedModel"]
    #: makes square images only: a width and height given must agree and become its resolution
    square: bool = True
    #: the tensors of its files the loader reads, by name (None: all of them): what the memory check counts
    reads: Callable[[str], bool] | None = None


class NotAModel(CheckpointError):
    """A file a family recognises as a part of a model (a VQ tokenizer) where a model belongs."""


def transformers_config(path: pathlib.Path) -> dict | None:
    """The settings in a folder's ``config.json`` (transformers' format); None for a
    file or a folder without one."""
    config = path / "config.json"
    return read_json(config) if path.is_dir() and config.is_file() else None
