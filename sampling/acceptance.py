"""Acceptance rules: when a draft token stands, and what to sample when it does not.

Notation: ``p`` is the target's final sampling distribution at a draft's position
(computed from the tokens before it), ``q`` the distribution the draft ``x`` was
sampled from (SJD/GSD's convention; LANTERN and VVS swap the letters).

Each rule gives, for every draft of a window at once,

* ``accept_prob(p, q, x)``: the probability ``min(1, ratio)`` of keeping ``x``
  (``ratio``: the ratio itself, which the engine tests its uniforms against: they are below 1, so
  ``u < ratio`` is ``u < min(1, ratio)``, one operation fewer; ``ratios``: that and the exact rule's,
  for coupled drafting, sharing ``p(x)`` and ``q(x)``);
* ``residual(p, q, x)``: the unnormalised distribution to resample from at the
  first rejection.

The engine draws the coins and the samples, so rules consume no randomness and
two rules that agree give the same tokens for the same seed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .neighbours import TokenGeometry
from .processing import KEEP_NON_NEGATIVE


class DraftDistributions:
    """Read access to the ``q`` rows of a window's drafts, which live in the
    engine's per-sample ring of distributions (no ``[B, L, V]`` copy is made), or in a
    copy of them the engine made anyway (``copy``, ``[B, >= N, V]``: the coupled draws'
    residual buffer before it becomes the residual; :meth:`release` before that)."""

    def __init__(self, ring: torch.Tensor, slots: torch.Tensor, batch_idx: torch.Tensor | None = None,
                 rows: torch.Tensor | None = None, starts: torch.Tensor | None = None,
                 copy: torch.Tensor | None = None):
        self.ring, self.slots, self.copy = ring, slots, copy  # [B, R, V], [B, N]
        self.batch = torch.arange(ring.shape[0], device=ring.device).unsqueeze(1) if batch_idx is None else batch_idx
        # rows: the slots' rows of the flattened ring [B * R, V], where the caller has them (or their starts)
        self._starts, self._rows = starts, rows

    def release(self) -> None:
        """Read the ring from now on (the copy is about to be overwritten)."""
        self.copy = None

    def starts(self) -> torch.Tensor:
        """Where each draft's row starts in the flattened ring ``[B, N]``."""
        if self._starts is None:
            B, R, V = self.ring.shape
            self._starts = (self.batch * R + self.slots if self._rows is None else self._rows) * V
        return self._starts

    def at(self, ids: torch.Tensor) -> torch.Tensor:
        """``q`` of each draft row at ``ids`` (``[B, N]`` or ``[B, N, M]``): a gather from the copy, or one
        ``take`` at the rows' flat offsets (three-tensor advanced indexing costs several times as much)."""
        if self.copy is not None:
            return self.copy.gather(2, ids) if ids.dim() == 3 else _gather(self.copy, ids)
        starts = self.starts() if ids.dim() == 2 else self.starts().unsqueeze(2)
        return torch.take(self.ring, starts + ids)

    def row_at(self, row: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """``q`` at ``ids`` ``[B, n]`` of each sample's draft row ``row`` ``[B, 1]``."""
        return torch.take(self.ring, self.starts().gather(1, row) + ids)


def _next_float32_up(value: float) -> float:
    """The next float32 above ``value`` (as float32): a float32 ``t`` is at most ``value`` exactly when it is below
    this, so a test ``t <= value`` can be a ``<`` (the step's comparisons are all ``<``: on this CPU an operation
    kind's first call after a forward is dear)."""
    v = torch.tensor(value, dtype=torch.float32)
    return float(torch.nextafter(v, torch.tensor(float("inf"))))


def _gather(p: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return p.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


class ExactAcceptance:
    """Speculative sampling (Leviathan et al.; SJD eq. 1-2): accept with
    ``min(1, p(x) / q(x))``, else resample from ``norm(max(0, p - q))``.  The
    output follows ``p`` exactly whatever ``q`` is."""

    name = "exact"

    def accept_prob(self, p, q: DraftDistributions, x):
        return self.ratio(p, q, x).clamp_(max=1.0)

    def ratio(self, p, q: DraftDistributions, x):
        return self.ratios(p, q, x)[0]

    def ratios(self, p, q: DraftDistributions, x):
        """``(ratio, the exact rule's)``: coupled drafting tests its drafts by both."""
        r = _gather(p, x) / q.at(x)
        return r, r

    def residual(self, p, q, x):
        return (p - q).clamp_(min=0.0)


class GroupedAcceptance(ExactAcceptance):
    """GSD (So et al., ICCV 2025, Alg. 3): accept ``x`` with
    ``min(1, sum_C p / sum_C q)`` where the cluster ``C`` is the ``G`` tokens
    around ``x``'s rank in ``p`` — ``(G - 1) // 2`` ranked just above, ``G // 2``
    just below, ``x`` itself — less members with ``|p(c) - p(x)| > delta`` and,
    when ``d`` is set, members whose squared L2 distance to ``x`` exceeds ``d``.
    ``x`` is kept as drafted; rejection resamples as SJD.  ``G = 1`` is SJD.

    Where this differs from the authors' code: their slice
    ``[rank - G//2, rank + G//2)`` holds ``G`` ranks for even ``G`` but none for
    ``G = 1``; the window here always holds ``x`` and is clipped at the ends of
    the ranking.  The ranks come from two small ``topk`` calls (the tokens just
    above and just below ``p(x)``) instead of a full-vocabulary sort per draft,
    and distances are computed exactly from the codebook vectors instead of a
    dense precomputed matrix (theirs: input-embedding rows of the first 10000
    ids only).  Tokens whose probability equals ``p(x)`` exactly (in practice
    the zeros left by top-k) rank below ``x``; the reference's unstable sort
    orders such ties arbitrarily.
    """

    name = "grouped"

    def __init__(self, group_size: int, delta: float, distance: float | None = None,
                 geometry: TokenGeometry | None = None):
        self.up, self.down = (group_size - 1) // 2, group_size // 2
        self.delta, self.distance, self.geometry = delta, distance, geometry
        self._below = _next_float32_up(delta)

    def ratios(self, p, q, x):
        if self.up + self.down == 0:
            return super().ratios(p, q, x)
        # a group larger than the vocabulary is the whole ranking (clipped at its ends)
        up, down = min(self.up, p.shape[-1] - 1), min(self.down, p.shape[-1] - 1)
        at_x = x.unsqueeze(-1)
        px = p.gather(-1, at_x)
        diff = p - px
        # the group in rank order: ids c and their distances |p(c) - p(x)| (inf: no member), the `up` ranked just
        # above x (nearest first), then x and the `down` just below, which a topk ranks x first of (its key -1)
        inf = float("inf")
        if up:  # smallest positive differences: ranked just above x
            k_up, c_up = torch.topk(F.threshold(diff, 0.0, inf), up, dim=-1, largest=False)
        # smallest non-negative p(x) - p(c) (the same ops as above: on this CPU an operation's first call after a
        # forward costs most of its time)
        below = F.threshold(torch.sub(px, p, out=diff), KEEP_NON_NEGATIVE, inf).scatter_(-1, at_x, -1.0)
        k, c = torch.topk(below, down + 1, dim=-1, largest=False)
        if up:
            k, c = torch.cat([k_up, k], -1), torch.cat([c_up, c], -1)
        keep = k < self._below  # the distance is the delta test (<= delta); inf fails it, x's -1 passes
        if self.distance is not None:
            g = self.geometry
            keep &= (g.vec(c) - g.vec(x).unsqueeze(-2)).square_().sum(-1) <= self.distance
        p_group = (p.gather(-1, c) * keep).sum(-1)
        qc = q.at(c)  # (column `up` is q(x): the exact rule's ratio reads it)
        q_group = (qc * keep).sum(-1)
        return p_group / q_group, px.squeeze(-1) / qc[..., up]


class LatentRelaxedAcceptance(ExactAcceptance):
    """LANTERN (Jang et al., ICLR 2025, sec. 4.3): ``A_{k,delta}(x)`` is the longest
    nearest-first prefix of ``x``'s ``k`` codebook neighbours whose target mass
    stays within ``delta`` (moving that mass onto ``x`` changes ``p`` by exactly
    that much in total variation).  Accept with ``min(1, (p(x) + mass_A) / q(x))``;
    on rejection resample from ``norm(max(0, p_A - q))`` where ``p_A`` is ``p``
    with ``A``'s mass moved onto ``x`` — the paper's residual (the authors' two
    code paths instead zero the target at ``x`` and its neighbours, or the draft
    at the neighbours).  ``delta = 0`` is SJD exactly.  The table holds ``k``
    neighbours per code (the authors slice a full ``N x N`` order)."""

    name = "latent"

    def __init__(self, k: int, delta: float, geometry: TokenGeometry):
        self.k, self.delta, self.geometry = k, delta, geometry
        self._within = _next_float32_up(delta)  # (mass <= delta as `<`: GroupedAcceptance)
        self._window = None
        geometry.neighbours(k)  # build the table before decoding starts

    def _neighbourhood(self, p, x):
        nb = self.geometry.neighbour_ids(x, self.k)
        pn = p.gather(-1, nb)
        in_a = pn.cumsum(-1) < self._within
        return nb, pn, in_a, (pn * in_a).sum(-1)

    def ratio(self, p, q, x):
        _, qx, lifted = self._lifted(p, q, x, self._neighbourhood(p, x)[3])
        return lifted / qx

    def ratios(self, p, q, x):
        nb, _, in_a, mass = self._neighbourhood(p, x)
        px, qx, lifted = self._lifted(p, q, x, mass)
        # relax_row reads its row's (the window's rejection comes next): A's ids (x's elsewhere) and the
        # residual's value at x.  p is known by where it lies, not held: a decode's distributions are not
        # kept past it by the rule
        self._window = (x, p.data_ptr(), torch.where(in_a, nb, x.unsqueeze(-1)), lifted - qx)
        return lifted / qx, px / qx

    @staticmethod
    def _lifted(p, q, x, mass):
        """``p(x)``, ``q(x)`` and ``p(x) + mass_A``: the ratios' parts."""
        px = _gather(p, x)
        return px, q.at(x), px + mass

    def relax_row(self, res, p, q: DraftDistributions, x, row, rejected):
        """Row ``row[b]`` of ``res`` (``[B, L, V]``: the window's exact residual ``max(0, p - q)``) made this
        rule's residual where ``rejected[b]``: ``p_A`` is ``p`` but on ``A`` (zero) and at ``x``.  A batch of
        one may give ``row`` and ``rejected`` as host numbers: then only a rejected row is written, by slices."""
        B, L, V = p.shape
        if isinstance(row, int):
            seen = self._window
            if not rejected:
                self._window = None
                return
            if seen is not None and seen[0] is x and seen[1] == p.data_ptr():
                self._window = None
                r = res[0, row:row + 1]  # [1, V]
                r.scatter_(1, seen[2][0, row:row + 1], 0.0)  # zero on A (x where A is short)
                r.scatter_(1, x[:, row:row + 1], seen[3][:, row:row + 1].clamp(min=0.0))
                return
            row, rejected = torch.tensor([row], device=x.device), torch.tensor([True], device=x.device)
        at = row.unsqueeze(1)
        xr = x.gather(1, at)  # [B, 1]
        first = at * V  # the row's offset in a sample's flattened window
        where_x = first + xr
        seen, self._window = self._window, None
        if seen is not None and seen[0] is x and seen[1] == p.data_ptr():  # ratios' of this window
            zero_at = seen[2].gather(1, at.unsqueeze(2).expand(B, 1, self.k)).view(B, self.k)
            lifted = seen[3].gather(1, at)
        else:
            nb, _, in_a, mass = self._neighbourhood(p.gather(1, at.unsqueeze(2).expand(B, 1, V)), xr)
            zero_at = torch.where(in_a.view(B, self.k), nb.view(B, self.k), xr)
            lifted = p.view(B, L * V).gather(1, where_x) + mass - q.row_at(at, xr)
        flat_res = res.view(B, L * V)
        before = flat_res.gather(1, where_x)
        now = rejected.unsqueeze(1)
        # zero on A (elsewhere a write at x, which the next line sets)
        flat_res.scatter_(1, torch.where(now, zero_at + first, where_x), 0.0)
        flat_res.scatter_(1, where_x, torch.where(now, lifted.clamp_(min=0.0), before))

    def residual(self, p, q, x):
        nb, pn, in_a, mass = self._neighbourhood(p, x)
        p_a = p.scatter(-1, nb, pn * ~in_a)
        p_a.scatter_add_(-1, x.unsqueeze(-1), mass.unsqueeze(-1))
        return (p_a - q).clamp_(min=0.0)


def make_rule(name: str, config, geometry: TokenGeometry | None):
    if name == "exact":
        return ExactAcceptance()
    if name == "grouped":
        return GroupedAcceptance(config.group_size, config.gsd_delta, config.gsd_distance, geometry)
    return LatentRelaxedAcceptance(config.lantern_k, config.lantern_delta, geometry)
