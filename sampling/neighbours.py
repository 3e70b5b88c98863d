"""Token geometry: codebook vectors by token id and latent nearest neighbours.

LANTERN's neighbourhood ``B_k(x)`` is the ``k`` nearest image tokens to ``x`` in
the VQ codebook (L2, self excluded), nearest first.  The authors store the full
sorted ``N x N`` order (512 MB for 16384 codes) and GSD's reference keeps a dense
bf16 distance matrix (~200 MB); here the table holds only the ``k`` columns in
use, as int16 ids where the vocabulary allows (16384 codes, k = 300: 9.8 MB), built
once per ``k`` in row chunks and cached.
"""
from __future__ import annotations

import numpy as np
import torch


class TokenGeometry:
    """Codebook vectors indexed by *token id* (ids that are not image tokens map
    to row -1)."""

    def __init__(self, ids: torch.Tensor, vectors: torch.Tensor, vocab_size: int, device: torch.device):
        ids = ids.long()
        if vectors.dim() != 2 or vectors.shape[0] != ids.numel():
            raise ValueError(
                f"token_vectors() must return ids [N] and vectors [N, D] (got {tuple(ids.shape)} "
                f"and {tuple(vectors.shape)})"
            )
        self.ids = ids.to(device)
        self.vectors = vectors.detach().float().to(device)
        self.row = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
        self.row[self.ids] = torch.arange(ids.numel(), device=device)
        self.device = device
        self._tables: dict[int, torch.Tensor] = {}

    @property
    def size(self) -> int:
        return self.ids.numel()

    def vec(self, tokens: torch.Tensor) -> torch.Tensor:
        """Vectors ``[..., D]`` of ``tokens`` (non-image ids read row 0; mask them)."""
        return self.vectors[self.row[tokens].clamp(min=0)]

    def neighbours(self, k: int) -> torch.Tensor:
        """``[N, k]`` token ids of the ``k`` nearest image tokens of each codebook
        row, nearest first, self excluded."""
        if k not in self._tables:
            self._tables.clear()  # one table at a time: memory, not speed, is scarce
            self._tables[k] = self._build(k)
        return self._tables[k]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tables.values())

    def _build(self, k: int, chunk: int = 1024) -> torch.Tensor:
        vec = self.vectors.cpu().numpy().astype(np.float32)
        n = vec.shape[0]
        sq = (vec * vec).sum(1)
        order = np.empty((n, k), dtype=np.int64)
        for s in range(0, n, chunk):
            d = sq[s:s + chunk, None] + sq[None, :] - 2.0 * vec[s:s + chunk] @ vec.T
            d[np.arange(d.shape[0]), np.arange(s, s + d.shape[0])] = np.inf  # self
            part = np.argpartition(d, k - 1, axis=1)[:, :k]
            near = np.take_along_axis(d, part, 1)
            order[s:s + chunk] = np.take_along_axis(part, np.argsort(near, axis=1, kind="stable"), 1)
        ids = self.ids.cpu().numpy()[order]  # rows -> token ids
        vocab = self.row.numel()
        dtype = torch.int16 if vocab <= 32767 else torch.int32
        return torch.from_numpy(ids).to(dtype).to(self.device)

    def neighbour_ids(self, tokens: torch.Tensor, k: int) -> torch.Tensor:
        """``[..., k]`` int64 neighbour ids of ``tokens`` (image tokens only)."""
        return self.neighbours(k)[self.row[tokens].clamp(min=0)].long()
