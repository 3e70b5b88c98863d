"""Token geometry: codebook vectors by token id and latent nearest neighbours.

LANTERN's neighbourhood ``B_k(x)`` is the ``k`` nearest image tokens to ``x`` in
the VQ codebook (L2, self excluded), nearest first.  The authors store the full
sorted ``N x N`` order (512 MB for 16384 codes) and GSD's reference keeps a dense
bf16 distance matrix (~200 MB); here the table holds only the ``k`` columns in
use, as int16 ids where the vocabulary allows (16384 codes, k = 300: 9.8 MB), built
once per ``k`` in row chunks and cached (the last table built is kept across decoders: a
new decode of the same model and ``k`` does not build it again).  A step reads it through
a copy by token id as int64 where that stays under ``BY_ID_BYTES`` (39 MB for 16384 codes at
k = 300): one row select, where the codebook's rows and the narrow ids took four operations.

A codebook that is a regular grid (finite scalar quantization: Cosmos' 64,000 codes are
every point of 8 x 8 x 8 x 5 x 5 x 5 evenly spaced levels) has its neighbours read off
the grid (:func:`grid_neighbours`) instead of from all N x N distances (76 s for
64,000 codes on 2 CPU cores, against well under a second): distances on a grid
depend only on the offset between two points, so the offsets sorted once give every
point's order.  Equal distances (many, on a grid) are ordered by offset, fixed.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

_LAST: dict = {}  # (codebook digest, k, device) -> the table most recently built


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
        self._by_id: tuple[int, torch.Tensor | None] | None = None  # (k, the k-table by token id, int64)
        self._unit: torch.Tensor | None = None  # the vectors at unit length (unit_vec)

    @property
    def size(self) -> int:
        return self.ids.numel()

    def vec(self, tokens: torch.Tensor) -> torch.Tensor:
        """Vectors ``[..., D]`` of ``tokens`` (non-image ids read row 0; mask them)."""
        return self.vectors[self.row[tokens].clamp(min=0)]

    def unit_vec(self, tokens: torch.Tensor) -> torch.Tensor:
        """``vec`` at unit length (cosine similarities: the table normalised once, not each read)."""
        if self._unit is None:
            self._unit = torch.nn.functional.normalize(self.vectors, dim=-1)
        return self._unit[self.row[tokens].clamp(min=0)]

    def neighbours(self, k: int) -> torch.Tensor:
        """``[N, k]`` token ids of the ``k`` nearest image tokens of each codebook
        row, nearest first, self excluded."""
        if k not in self._tables:
            self._tables.clear()  # one table at a time: memory, not speed, is scarce
            key = (self._digest(), k, str(self.device))
            if key not in _LAST:
                _LAST.clear()
                _LAST[key] = self._build(k)
            self._tables[k] = _LAST[key]
        return self._tables[k]

    def _digest(self) -> str:
        h = hashlib.sha1(self.ids.cpu().numpy().tobytes())
        h.update(self.vectors.cpu().numpy().tobytes())
        return h.hexdigest()

    def nbytes(self) -> int:
        by_id = [] if self._by_id is None or self._by_id[1] is None else [self._by_id[1]]
        unit = [] if self._unit is None else [self._unit]
        return sum(t.numel() * t.element_size() for t in [*self._tables.values(), *by_id, *unit])

    def _build(self, k: int, chunk: int = 1024) -> torch.Tensor:
        vec = self.vectors.cpu().numpy().astype(np.float32)
        n = vec.shape[0]
        order = grid_neighbours(vec, k)
        if order is not None:
            return self._as_ids(order)
        sq = (vec * vec).sum(1)
        order = np.empty((n, k), dtype=np.int64)
        for s in range(0, n, chunk):
            d = sq[s:s + chunk, None] + sq[None, :] - 2.0 * vec[s:s + chunk] @ vec.T
            d[np.arange(d.shape[0]), np.arange(s, s + d.shape[0])] = np.inf  # self
            part = np.argpartition(d, k - 1, axis=1)[:, :k]
            near = np.take_along_axis(d, part, 1)
            order[s:s + chunk] = np.take_along_axis(part, np.argsort(near, axis=1, kind="stable"), 1)
        return self._as_ids(order)

    def _as_ids(self, order: np.ndarray) -> torch.Tensor:
        ids = self.ids.cpu().numpy()[order]  # rows -> token ids
        vocab = self.row.numel()
        dtype = torch.int16 if vocab <= 32767 else torch.int32
        return torch.from_numpy(ids).to(dtype).to(self.device)

    #: the largest table kept by token id as int64 (one row select a lookup, where the codebook's
    #: rows and a narrow dtype take four operations): 39 MB for 16384 codes at k = 300
    BY_ID_BYTES = 64 << 20

    def neighbour_ids(self, tokens: torch.Tensor, k: int) -> torch.Tensor:
        """``[..., k]`` int64 neighbour ids of ``tokens`` (image tokens only; others read row 0's)."""
        if self._by_id is None or self._by_id[0] != k:
            table = self.neighbours(k)
            fits = self.row.numel() * k * 8 <= self.BY_ID_BYTES
            self._by_id = (k, table.long().index_select(0, self.row.clamp(min=0)) if fits else None)
        by_id = self._by_id[1]
        if by_id is not None:  # (a lookup by rows of any shape of ids: one operation)
            return torch.embedding(by_id, tokens)
        rows = self.row.index_select(0, tokens.reshape(-1)).clamp_(min=0)
        return self.neighbours(k).index_select(0, rows).view(*tokens.shape, k).long()


def grid_steps(vec: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(index [N, D], step [D])`` when the rows of ``vec`` are each point of a grid of evenly spaced
    values per dimension exactly once, else None."""
    n, dims = vec.shape
    if n < 2 or dims == 0:
        return None
    index, steps, sizes = np.empty((n, dims), dtype=np.int64), np.empty(dims), []
    for d in range(dims):
        values = np.unique(vec[:, d])
        if len(values) > 4096:
            return None
        step = (values[-1] - values[0]) / max(len(values) - 1, 1)
        if len(values) > 1 and not np.allclose(np.diff(values), step, rtol=1e-4, atol=1e-6):
            return None
        index[:, d] = np.rint((vec[:, d] - values[0]) / step).astype(np.int64) if len(values) > 1 else 0
        steps[d] = step if len(values) > 1 else 1.0
        sizes.append(len(values))
    if int(np.prod(sizes, dtype=np.float64)) != n:
        return None
    flat = np.ravel_multi_index(index.T, sizes)
    if len(np.unique(flat)) != n:
        return None
    return index, steps


def grid_neighbours(vec: np.ndarray, k: int, budget: int = 1 << 22) -> np.ndarray | None:
    """``[N, k]`` rows of the ``k`` nearest rows of each (self excluded, nearest first, equal distances by
    offset) when ``vec`` is a grid (:func:`grid_steps`), else None.  ``budget``: candidate entries held at once."""
    grid = grid_steps(vec)
    if grid is None or k >= vec.shape[0]:
        return None
    index, steps = grid
    sizes = index.max(0) + 1
    dims = len(sizes)
    row_of = np.empty(int(np.prod(sizes)), dtype=np.int64)
    row_of[np.ravel_multi_index(index.T, sizes)] = np.arange(len(index))
    # every offset a point can have, nearest first (ties: in the offsets' own order, fixed)
    axes = [np.arange(-(s - 1), s) for s in sizes]
    offsets = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, dims)
    dist = ((offsets * steps) ** 2).sum(1)
    offsets = offsets[np.argsort(dist, kind="stable")][1:].astype(np.int16)  # the first is the point itself
    order = np.empty((len(index), k), dtype=np.int64)
    todo, m = np.arange(len(index)), min(len(offsets), 4 * k)
    while len(todo):  # points near the grid's edges look further out, a few at a time
        short = []
        step = max(1, budget // (m * dims))
        for s in range(0, len(todo), step):
            rows = todo[s:s + step]
            cand = index[rows].astype(np.int16)[:, None, :] + offsets[None, :m]
            inside = ((cand >= 0) & (cand < sizes)).all(-1)
            enough = inside.sum(1) >= k
            if m < len(offsets):
                short.append(rows[~enough])
                rows, cand, inside = rows[enough], cand[enough], inside[enough]
            r, c = np.nonzero(inside & (np.cumsum(inside, 1) <= k))  # the first k inside, in offset order
            picked = cand[r, c]
            order[rows] = row_of[np.ravel_multi_index(picked.T, sizes)].reshape(-1, k)
        todo, m = (np.concatenate(short) if short else np.empty(0, np.int64)), min(len(offsets), 4 * m)
    return order
