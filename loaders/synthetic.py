"""A random-weight stand-in model for engine tests, demos and benchmarks.

Not a model family: it exists so the engine can be exercised and timed without
checkpoints.  Each token's distribution depends on the token to its left and
the token above (like the spatial locality of real image models), its position
and a class condition, through a small MLP; the output head is built from a
random codebook so that tokens close in the codebook get similar logits (what
LANTERN and VVS rely on).  ``hidden`` and ``layers`` set the cost of a forward.
An optional end-of-line token after every row exercises forced positions.
"""
from __future__ import annotations

import torch

from ..sampling.adapter import ImageAdapter, TokenLayout
from ..sampling.config import shorten


class SyntheticAdapter(ImageAdapter):
    def __init__(self, codebook: int = 256, rows: int = 8, cols: int = 8, hidden: int = 64, layers: int = 1,
                 classes: int = 10, end_of_line: bool = False, sharpness: float = 4.0, seed: int = 0,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        g = torch.Generator().manual_seed(seed)
        self.device = torch.device(device)
        self.dtype = dtype
        self.vocab_size = codebook + (1 if end_of_line else 0)
        stride = cols + (1 if end_of_line else 0)
        forced = {r * stride + cols: codebook for r in range(rows)} if end_of_line else {}
        self.layout = TokenLayout.raster(rows, cols, self.vocab_size, torch.arange(codebook), forced, stride)
        self.codebook = torch.randn(codebook, 8, generator=g)
        proj = torch.randn(8, hidden, generator=g) / 8 ** 0.5
        head = torch.zeros(self.vocab_size, hidden)
        head[:codebook] = self.codebook @ proj
        T = self.layout.length
        w = {
            "embed": torch.randn(self.vocab_size, hidden, generator=g) / hidden ** 0.5,
            "pos": torch.randn(T + 64, hidden, generator=g) * 0.5,
            "cls": torch.randn(classes + 1, hidden, generator=g),  # last row: unconditional
            "head": head * sharpness / hidden ** 0.5,
            "mlp": [torch.randn(hidden, hidden, generator=g) / hidden ** 0.5 for _ in range(layers)],
        }
        self.w = {k: ([t.to(self.device, dtype) for t in v] if isinstance(v, list) else v.to(self.device, dtype))
                  for k, v in w.items()}
        self.classes = classes
        self.sampling_defaults = {"cfg_scale": 2.0}
        self.hist = None
        self.lengths = None

    def check_conditions(self, conditions, negatives):
        bad = [c for c in conditions if not isinstance(c, int) or not 0 <= c < self.classes]
        if bad:
            raise ValueError(f"prompt must be a class id in [0, {self.classes - 1}] for this model "
                             f"(got {shorten(bad[0])})")

    def prefill(self, conditions, negatives, guided):
        B = len(conditions)
        cls = torch.tensor(conditions, device=self.device)
        self.cond = torch.stack([cls, torch.full_like(cls, self.classes)]) if guided else cls.unsqueeze(0)
        self.hist = torch.zeros(B, self.layout.length + 256, dtype=torch.long, device=self.device)
        self.lengths = torch.zeros(B, dtype=torch.long, device=self.device)
        return self._logits(torch.zeros(B, 1, dtype=torch.long, device=self.device))[:, :, 0]

    def forward(self, tokens):
        B, L = tokens.shape
        pos = self.lengths.unsqueeze(1) + torch.arange(L, device=self.device)
        self.hist.scatter_(1, pos, tokens)
        self.lengths += L
        return self._logits(pos + 1)

    def _logits(self, target):
        """Logits ``[K, B, L, V]`` for the tokens at positions ``target``."""
        w, stride = self.w, self.layout.row_stride
        left = self.hist.gather(1, (target - 1).clamp(min=0)) * (target >= 1)
        above = self.hist.gather(1, (target - stride).clamp(min=0)) * (target >= stride)
        h = w["embed"][left] + 0.7 * w["embed"][above] + w["pos"][target]
        h = h.unsqueeze(0) + w["cls"][self.cond].unsqueeze(2)  # [K, B, L, H]
        for m in w["mlp"]:
            h = h + torch.nn.functional.gelu(h @ m)
        return h @ w["head"].T

    rolls_back_on_device = True
    drops_samples = True

    def keep_samples(self, keep):
        idx = torch.tensor(keep, device=self.device)
        self.cond, self.hist, self.lengths = self.cond[:, idx], self.hist[idx], self.lengths[idx]

    def rollback(self, n, most=None):
        self.lengths -= n if isinstance(n, torch.Tensor) else torch.tensor(n, device=self.device)

    def cache_lengths(self):
        return self.lengths.clone()

    def token_vectors(self):
        return torch.arange(self.codebook.shape[0]), self.codebook

    def release(self):
        self.hist = self.lengths = None
