"""Device-synchronised timing of a decode: the whole batch, and the time inside model forwards."""
from __future__ import annotations

import time

import torch


class Timer:
    """Wall-clock for the batch and time inside model calls, device-synchronised.

    On CUDA, model calls are bracketed by events (read once at the end), so
    measuring adds no host synchronisation to the loop."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.events: list = []
        self.model_total = 0.0
        self.total = 0.0

    def start(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.t0 = time.perf_counter()

    def stop(self):
        if self.cuda:
            torch.cuda.synchronize()
            self.model_total = sum(a.elapsed_time(b) for a, b in self.events) / 1000.0
        self.total = time.perf_counter() - self.t0

    def model(self):
        return ModelSpan(self)


class ModelSpan:
    def __init__(self, timer: Timer):
        self.timer = timer

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
            self.timer.events.append((self.a, b))
        else:
            self.timer.model_total += time.perf_counter() - self.t
        return False
