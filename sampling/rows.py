"""Row-parallel drafting (after ZipAR): the next image rows decoded beside the window, relaxed.

A raster token depends mostly on its spatial neighbours, so a row need not wait
for the row above to finish: ZipAR (He et al., ICML 2025) draws a row's next
token once the row above is ``W`` tokens ahead of it, from the part of the image
that exists, and commits it as drawn.  Here each verified forward scores, beside
the Jacobi window, one chain of nodes per image row from the *raster row* ``rho``
(the row the committed prefix ends in) down to row ``rho + R - 1``:

* chain 0 holds row ``rho``'s known tokens past the cache (committed, or fixed
  earlier as a lower row), so the rows below see them;
* chain ``k >= 1`` holds row ``rho + k``'s known tokens from its first column,
  preceded by the token before the row (unknown while the row above is
  unfinished: then a placeholder, the newest known token of the row above, as
  ZipAR's code does), then the row's drafts, as many as the window's and as far
  as the row above allows (a column ``c`` once the row above is known up to
  column ``c + W - 1``, or complete).

A node sees the cache, its own chain up to itself and the *known* tokens of the
chains above it (not their drafts), at its own stream position
(``ImageAdapter.forward_tree``'s ``graph``); the window neither sees the chains nor
is seen by them, and none of them stays in the cache.  Each lower row is then
decoded as the window is (:func:`judge_rows`): its drafts are tested in order by
the acceptance rule against the distributions its chain gave, the first that
falls is redrawn from the rule's residual (or the column after the last draft
is drawn), and those columns are *fixed*: the window passes them later like
forced tokens.  The columns after them, where the window has no drafts yet, get
new drafts from their chain's distributions (the window's own drafts are kept).

Unlike ZipAR, a fixed token is read again by the window with the whole image
before it (the keys and values later tokens see are the exact ones), and the
rows verify drafts instead of drawing one token per forward.  Like ZipAR, a
fixed token was drawn from part of its context only and is never tested against
the rest, so the image is not the target model's distribution even under exact
acceptance: ``tests/test_rows.py`` shows the chi-square check rejecting it, and
docs/benchmarks.md measures what it costs.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import rng
from .acceptance import DraftDistributions
from .config import ConfigError


class RowGrid:
    """The raster's rows in stream positions: ``first[i]`` / ``last[i]`` the positions of
    row ``i``'s first and last image token, ``pos[i, j]`` column ``j``'s; a chain of
    ``stride`` nodes covers row ``i`` from position ``first[i] - 1``."""

    def __init__(self, layout, device):
        rows, cols = layout.grid
        pos = layout.image_positions().view(rows, cols)
        stride = layout.row_stride
        expected = pos[0, 0] + stride * torch.arange(rows).unsqueeze(1) + torch.arange(cols)
        if not torch.equal(pos, expected):
            raise ConfigError("row-parallel drafting needs image rows at a fixed stride in the stream; "
                              "this model's layout has none")
        self.rows, self.cols, self.stride = rows, cols, stride
        self.pos = pos.to(device)
        self.first, self.last = self.pos[:, 0], self.pos[:, -1]


class RowDrafts(NamedTuple):
    """One forward's chains, ``E = R * stride`` nodes per sample, in chain order, and
    what the lower rows (``[B, R - 1]``) hold: ``row`` their row index, ``known`` their
    known columns from the left, ``drafts`` the drafts scored after them (0 where the
    row is not ``active``: its next column may not be drawn yet)."""

    tokens: torch.Tensor  # [B, E] input tokens
    sees: torch.Tensor  # [B, E, E] what each node sees among the chains
    depth: torch.Tensor  # [B, E] stream position - the cache's length
    target: torch.Tensor  # [B, E] the position each node predicts
    row: torch.Tensor
    known: torch.Tensor
    drafts: torch.Tensor
    active: torch.Tensor


def known_positions(st) -> torch.Tensor:
    """``[B, length + pad]``: positions whose token is known (committed, fixed or forced)."""
    P = st.seq.shape[1]
    return (st.arange(P).unsqueeze(0) < st.n_committed.unsqueeze(1)) | (st.fixed >= 0) | (st.forced_at >= 0)


def draft_rows(st, grid: RowGrid, R: int, lead: int, drafts: int, base: torch.Tensor) -> RowDrafts:
    """The chains of rows ``rho .. rho + R - 1`` for every sample (module docstring): a
    lower row's known tokens, then up to ``drafts`` of its drafts (the window's width),
    as far as the row above allows; ``base``: each sample's cache length."""
    B, S, C = st.batch, grid.stride, grid.cols
    known = known_positions(st)
    kc = known[:, grid.pos].int().cumprod(-1).sum(-1)  # [B, rows] known columns from the left
    rho = (grid.last.unsqueeze(0) < st.n_committed.unsqueeze(1)).sum(1)  # rows wholly committed
    row = rho.unsqueeze(1) + st.arange(R)  # [B, R]
    inside = row < grid.rows
    rk = row.clamp(max=grid.rows - 1)
    c = kc.gather(1, rk)  # [B, R]
    above = kc.gather(1, (rk - 1).clamp(min=0))
    limit = torch.where(above >= C, C, above - lead + 1)  # columns before it may be drawn
    k = st.arange(R).unsqueeze(0)
    active = inside & (k >= 1) & (c < limit)
    # drafts exist where the window drafted (before draft_end) or a row did (row_drafted)
    has = (grid.pos.unsqueeze(0) < st.draft_end.view(B, 1, 1)) | st.row_drafted[:, grid.pos]  # [B, rows, C]
    has = has.gather(1, rk.unsqueeze(-1).expand(-1, -1, C))
    col = st.arange(C).view(1, 1, C)
    avail = torch.where(col < c.unsqueeze(-1), True, has).int().cumprod(-1).sum(-1) - c
    m = torch.where(active, torch.minimum(torch.minimum(limit - 1 - c, avail), torch.full_like(c, drafts)), 0)
    j = st.arange(S).view(1, 1, S)
    npos = (grid.first[rk] - 1).unsqueeze(-1) + j  # [B, R, S]; -1 before a stream that opens with the image
    kn = known.gather(1, npos.clamp(min=0).view(B, -1)).view(B, R, S) & (npos >= 0)
    chain0 = (k == 0).unsqueeze(-1) & kn & (npos >= base.view(B, 1, 1))
    lower = (k >= 1).unsqueeze(-1) & (j <= (c + m).unsqueeze(-1)) & ((c > 0) | active).unsqueeze(-1)
    valid = inside.unsqueeze(-1) & (chain0 | lower)
    npos = npos.clamp(min=0)
    # a row whose first input is unknown starts from the newest known token of the row above
    newest = grid.pos[(rk - 1).clamp(min=0), (above - 1).clamp(min=0)]  # [B, R]
    tok = torch.where(st.forced_at[npos] >= 0, st.forced_at[npos], st.seq.gather(1, npos.view(B, -1)).view(B, R, S))
    placeholder = st.seq.gather(1, newest)
    tok[..., 0] = torch.where(kn[..., 0], tok[..., 0], placeholder)
    seen = (valid & kn).view(B, -1)  # visible to the chains below: known tokens only, not drafts
    E = R * S
    chain = k.unsqueeze(-1).expand(B, R, S).reshape(B, E)
    idx = j.expand(B, R, S).reshape(B, E)
    same = (chain.unsqueeze(2) == chain.unsqueeze(1)) & (idx.unsqueeze(1) <= idx.unsqueeze(2))
    cross = (chain.unsqueeze(1) < chain.unsqueeze(2)) & seen.unsqueeze(1)
    v = valid.view(B, E)
    sees = (v.unsqueeze(2) & v.unsqueeze(1) & (same | cross)) | torch.eye(E, dtype=torch.bool, device=v.device)
    flat = npos.view(B, E)
    depth = torch.where(v, flat - base.unsqueeze(1), 0).clamp(min=0)
    return RowDrafts(tok.view(B, E), sees, depth, flat + 1, rk[:, 1:], c[:, 1:], m[:, 1:], active[:, 1:])


class RowOutcome(NamedTuple):
    """What a forward settles in the lower rows (``N = (R - 1) * stride`` columns per sample)."""

    position: torch.Tensor  # [B, N] each column's stream position
    fix: torch.Tensor  # [B, N] the column is drawn now (fixed from the next step)
    token: torch.Tensor  # [B, N] its token where fixed, its next draft where drafted
    draft: torch.Tensor  # [B, N] the column gets a new draft, drawn from ``rows`` (its q)
    rows: torch.Tensor  # [B, N, V]
    bad: torch.Tensor  # [B] a row read for a draw is no distribution (NaN)


def judge_rows(st, grid: RowGrid, rd: RowDrafts, probs: torch.Tensor, rule) -> RowOutcome:
    """Speculative sampling along each active lower row, against what it sees: ``probs``
    ``[B, (R - 1) * stride, V]``, the lower chains' outputs (node ``j`` of a chain predicts
    its row's column ``j``).  The row's drafts are tested in order by ``rule``; the
    first that falls is redrawn from the rule's residual, or the column after the last
    draft is drawn when all stand; those columns are fixed.  The next ``drafts`` columns
    get new drafts: drawn from their node's distribution where the chain scored them
    (Jacobi), else from the fixed column's (as ``sample-left`` initialises)."""
    B, S, C = st.batch, grid.stride, grid.cols
    Rm = rd.row.shape[1]
    V = probs.shape[-1]
    col = st.arange(S).view(1, 1, S)
    pos = grid.pos[rd.row.unsqueeze(-1), col.clamp(max=C - 1)].view(B, Rm * S)
    c, m = rd.known.unsqueeze(-1), rd.drafts.unsqueeze(-1)
    act = rd.active.unsqueeze(-1)
    draft = act & (col >= c) & (col < c + m)  # [B, Rm, S]
    x = st.seq.gather(1, pos)
    slots = pos % st.ring_size
    u = rng.uniform(st.keys, st.step, rng.ROWS, pos, lanes=2)  # coin, draw
    test = (u[..., 0] < rule.accept_prob(probs, DraftDistributions(st.ring, slots, st.batch_idx), x)).view(B, Rm, S)
    stands = (col < c) | (draft & test)
    new = stands.int().cumprod(-1).sum(-1)  # [B, Rm] the column drawn now: the first that falls, or c + m
    at = new.unsqueeze(-1)
    flat_at = (torch.arange(Rm, device=pos.device) * S).unsqueeze(0) + new.clamp(max=S - 1)  # [B, Rm]
    p_new = probs.gather(1, flat_at.unsqueeze(-1).expand(-1, -1, V))  # [B, Rm, V]
    q_new = st.rows(st.ring, slots.gather(1, flat_at), "row_q")
    x_new = x.gather(1, flat_at)
    fell = new < rd.known + rd.drafts
    res = rule.residual(p_new.reshape(-1, V), q_new.reshape(-1, V), x_new.reshape(-1)).view(B, Rm, V)
    res = torch.where(fell.unsqueeze(-1) & (res.sum(-1, keepdim=True) >= rng.MIN_MASS), res, p_new)
    drawn = rng.categorical(res, u[..., 1].gather(1, flat_at).unsqueeze(-1)).squeeze(-1)  # [B, Rm]
    fix = act & (col >= c) & (col <= at)
    scored = (col > at) & (col < c + m)  # the chain scored them: redrawn from their own rows
    drafted = act & (col > at) & (col <= at + st.drafts) & (col < C)
    rows = torch.where(scored.view(B, -1, 1), probs, p_new.repeat_interleave(S, 1))  # [B, N, V]
    fresh = rng.categorical(rows, u[..., 1:]).squeeze(-1).view(B, Rm, S)
    token = torch.where(col == at, drawn.unsqueeze(-1), torch.where(drafted, fresh, x.view(B, Rm, S)))
    read = (draft | (act & (col == at))).view(B, -1)
    bad = (probs.sum(-1).isnan() & read).any(1)
    return RowOutcome(pos, fix.view(B, -1), token.view(B, -1), drafted.view(B, -1), rows, bad)


def settle_rows(st, out: RowOutcome) -> None:
    """Write ``out`` into the state: fixed tokens, and new drafts with their ``q``, at
    positions nothing has committed or fixed since and, for drafts, past the window's
    own (called after the window's drafts were extended)."""
    free = (out.position >= st.n_committed.unsqueeze(1)) & (st.fixed.gather(1, out.position) < 0)
    fix = out.fix & free
    st.fixed.scatter_(1, torch.where(fix, out.position, st.scratch), out.token)
    # where the window has drafts, its own (coupled, from the whole image so far) are kept: replacing
    # them cost tokens per forward on the embedded model (R 8, W 2: 6.24 against 6.76)
    draft = out.draft & free & (out.position >= st.draft_end.unsqueeze(1))
    at = torch.where(fix | draft, out.position, st.scratch)
    st.seq.scatter_(1, at, out.token)
    st.row_drafted.scatter_(1, torch.where(draft, out.position, st.scratch), True)
    slots = torch.where(draft, out.position % st.ring_size, st.ring_size)  # the last slot absorbs the rest
    st.put_rows(st.ring, slots, out.rows)


def force_fixed(probs: torch.Tensor, fixed: torch.Tensor) -> None:
    """``probs`` ``[B, L, V]`` one-hot on ``fixed`` ``[B, L]`` where it is a token (>= 0),
    in place: every draw at a fixed position (the bonus, a coupled redraw) gives it."""
    on = (fixed >= 0).unsqueeze(-1)
    idx = fixed.clamp(min=0).unsqueeze(-1)
    keep = probs.gather(-1, idx)
    probs.masked_fill_(on, 0.0)
    probs.scatter_(-1, idx, torch.where(on, 1.0, keep))
