"""Device-synchronised timing of a decode: the whole batch, and the time inside model
forwards, by model (the target; a draft model, if one drafts)."""
from __future__ import annotations

import time

import torch


class Timer:
    """Wall-clock for the batch and time inside model calls, device-synchronised.

    On CUDA, model calls are bracketed by events (read once at the end), so
    measuring adds no host synchronisation to the loop."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.events: list = []  # (kind, start, end) CUDA events
        self.spent = {"target": 0.0, "drafter": 0.0}  # seconds inside each model's calls
        self.total = 0.0

    @property
    def model_total(self) -> float:
        return self.spent["target"]

    def start(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.t0 = time.perf_counter()

    def stop(self):
        if self.cuda:
            torch.cuda.synchronize()
            for kind, a, b in self.events:
                self.spent[kind] += a.elapsed_time(b) / 1000.0
        self.total = time.perf_counter() - self.t0

    def model(self, kind: str = "target"):
        return ModelSpan(self, kind)


class ModelSpan:
    def __init__(self, timer: Timer, kind: str):
        self.timer, self.kind = timer, kind

    def __enter__(self):
        if self.timer.cuda:
            self.a = torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t = time.perf_counter()

    def __exit__(self, *exc):
        if self.timer.cuda:
            b = torch.cuda.Event(enable_timing=True)
            b.record()
            self.timer.events.append((self.kind, self.a, b))
        else:
            self.timer.spent[self.kind] += time.perf_counter() - self.t
        return False
