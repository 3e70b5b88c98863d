"""The JSON files of a release: any one (:func:`write_json`), and config.json as ``save_pretrained`` writes
it (:func:`write_config`)."""
from __future__ import annotations

import json
import pathlib

import torch

from .stats import Stats


def write_json(path: pathlib.Path, obj, stats: Stats) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False))
    stats.add(path)


def _set_dtype(config, dtype: torch.dtype) -> None:
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    setattr(config, "dtype" if (major, minor) >= (4, 56) else "torch_dtype", dtype)  # renamed in 4.56


def write_config(folder: pathlib.Path, config, dtype: torch.dtype, stats: Stats, extra: dict | None = None) -> None:
    """config.json as ``save_pretrained`` writes it (this transformers version), plus ``extra``."""
    _set_dtype(config, dtype)
    config.save_pretrained(str(folder))
    if extra:
        data = json.loads((folder / "config.json").read_text())
        data.update(extra)
        (folder / "config.json").write_text(json.dumps(data, indent=2, ensure_ascii=False))
    stats.add(folder / "config.json")
