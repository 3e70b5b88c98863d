"""What a write made and cost: the files and bytes (:class:`Stats`), the writer's peak memory
(:func:`peak_rss`), and a family's figures (:class:`Written`, filled by :func:`write_weights`)."""
from __future__ import annotations

import pathlib
import resource
import sys
import time
from dataclasses import dataclass, field

import torch

from .tensors import TensorSpec


class Stats:
    """Bytes and files written."""

    def __init__(self):
        self.bytes, self.files = 0, []

    def add(self, path: pathlib.Path):
        self.files.append(path)
        self.bytes += path.stat().st_size


def peak_rss() -> int:
    """This process's peak resident memory in bytes: Linux's ``VmHWM`` (the high-water mark of this program's
    memory), else ``getrusage``'s ``ru_maxrss`` (KiB on Linux, bytes on macOS).  On Linux ``ru_maxrss``
    carries over through exec, so a writer started from a big process (a test runner holding models) would
    report its parent's peak; ``VmHWM`` starts afresh with the program."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


@dataclass
class Written:
    family: str
    layout: str
    folder: pathlib.Path
    scale: float
    dtype: torch.dtype
    bytes: int = 0
    files: list = field(default_factory=list)
    seconds: float = 0.0
    weight_seconds: float = 0.0
    peak_rss: int = 0
    rss_before_weights: int = 0
    tensors: int = 0
    parameters: int = 0
    expected: dict = field(default_factory=dict)  # weight file -> {name: shape}
    layers: int | None = None  # --layers: the language model's depth, widths real

    def summary(self) -> dict:
        return {"family": self.family, "layout": self.layout, "folder": str(self.folder), "scale": self.scale,
                "layers": self.layers, "dtype": str(self.dtype).replace("torch.", ""), "files": len(self.files),
                "bytes": self.bytes,
                "tensors": self.tensors, "parameters": self.parameters, "seconds": round(self.seconds, 2),
                "weight_seconds": round(self.weight_seconds, 2), "peak_rss_bytes": self.peak_rss,
                "rss_before_weights_bytes": self.rss_before_weights}


def write_weights(result: Written, stats: Stats, specs: list[TensorSpec], dtype, log, write_fn):
    """Run ``write_fn`` (which writes the weight files), recording time, RSS and what each file should hold."""
    result.rss_before_weights = peak_rss()
    result.tensors = len(specs)
    result.parameters = sum(s.numel for s in specs)
    log(f"writing {len(specs)} tensors, {result.parameters / 1e9:.3f} B parameters, "
        f"{sum(s.nbytes(dtype) for s in specs) / 1e9:.2f} GB")
    t = time.perf_counter()
    write_fn()
    result.weight_seconds = time.perf_counter() - t
