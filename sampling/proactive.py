"""Proactive drafting (SJD-PAC: Kang et al., CVPR 2026): alternatives where a window's drafts fall.

A Jacobi window's first drafts fall most often: they were drawn from rows the target
computed before the last rejection changed their prefix.  Proactive drafting hangs a
full ``K``-ary tree of ``levels`` levels below the window's root (the newest committed
token): at every level the window's own draft (the *spine*) is the first child, and
``K - 1`` alternatives are drawn after it from the same ``q`` without replacement
(Gumbel top-k, the draft itself left out); every node of a level has that level's ``K``
tokens as its children, in that order (as the authors' code shares them).  One forward
scores the window and the tree (``ImageAdapter.forward_tree``).  The walk from the root
(``tree.accept_path``: recursive rejection over siblings, a sibling's ``q`` its level's
row less the siblings tried before it) settles the tree's levels; it is lossless under
exact acceptance because each level's tokens are one draw without replacement from that
level's ``q``, made before the target scored anything.  A sample whose walk stays on the
spine through the last level goes on along the window as SJD does (the chain's rows
there are the spine's); the others commit the walk's path and its new token, and their
next drafts are the window's tail as always (``drafts.JacobiDrafts``), so SJD-PAC's
"adaptive continuation" is Jacobi's own.

Where this departs from the authors' code (``scheduler/sjd_pac_iteration_lumina_mgpt.py``):
there the longest accepted path wins over the first sibling that stands, siblings after
the first are drawn from a residual but tested against ``q``, and a window that stands
whole commits a padding token; each biases the output (two tokens at 1/2 came out
0.375 / 0.625 in a toy run of that iteration).  Here the first sibling that stands is
taken and every draw is tested against the distribution it came from.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import torch

from . import rng


MAX_LEVELS = 8  # more than the depth knob allows


@lru_cache(maxsize=None)
def shape(K: int, levels: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tree's nodes beyond the spine, parents first: ``(parents, depths, ranks)`` on ``device``,
    where a parent is a *walk index* (``0 .. levels``: the spine node at that depth,
    ``levels + 1 + e``: extra node ``e``) and ``rank`` which of its level's ``K`` tokens a
    node carries (0: the spine's draft)."""
    index = {(0,) * d: d for d in range(levels + 1)}  # digit paths -> walk index; the spine is all zeros
    parents, depths, ranks = [], [], []
    for d in range(1, levels + 1):
        for digits in itertools.product(range(K), repeat=d):
            if any(digits):
                index[digits] = levels + 1 + len(parents)
                parents.append(index[digits[:-1]])
                depths.append(d)
                ranks.append(digits[-1])
    return tuple(torch.tensor(v, device=device) for v in (parents, depths, ranks))


@dataclass
class Sprout:
    """A window's tree: ``tokens``, ``parents`` (forward rows), ``valid`` and ``target``
    (the position each row predicts) of the extra nodes ``[B, E]``, and what the walk
    reads: ``walk_rows`` ``[B, M]`` (the forward row of each walk index), ``walk_parents``,
    ``walk_valid`` and ``draft_rows`` ``[B, M, V]`` (the ``q`` a node's children came from)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    valid: torch.Tensor
    target: torch.Tensor
    walk_rows: torch.Tensor
    walk_parents: torch.Tensor
    walk_valid: torch.Tensor
    draft_rows: torch.Tensor
    levels: int
    branching: int  # K: every node's children


def sprout(st, inp: torch.Tensor, base: torch.Tensor, r0: torch.Tensor, K: int, levels: int) -> Sprout:
    """The tree below window row ``r0[b]`` (the newest committed token) of the window
    ``inp`` ``[B, L]`` starting at stream position ``base``: spine rows ``r0 + d`` for
    depths ``d = 0 .. levels``, their drafts' ``q`` read from the ring."""
    B, L = inp.shape
    device, V, T = inp.device, st.vocab, st.length
    depth = st.arange(levels + 1)
    spine_rows = r0.unsqueeze(1) + depth  # [B, levels + 1]
    pos = base.unsqueeze(1) + spine_rows  # the spine nodes' positions
    q = st.rows(st.ring, pos[:, 1:] % st.ring_size, "proactive_q")  # [B, levels, V]: level d's q
    x = inp.gather(1, spine_rows[:, 1:])
    # K - 1 alternatives per level, drawn from q without replacement after the draft (Gumbel top-k)
    u = rng.uniform(st.keys, st.step, rng.PROACTIVE, pos[:, 1:].unsqueeze(-1) * V + st.arange(V))
    keys = q.log() - (-u.clamp_(min=2.0 ** -25).log()).log()
    keys.scatter_(2, x.unsqueeze(-1), -torch.inf)
    alt = torch.topk(keys, K - 1, dim=-1)
    level_tok = torch.cat([x.unsqueeze(-1), alt.indices], -1)  # [B, levels, K]
    level_ok = torch.cat([torch.ones_like(x, dtype=torch.bool).unsqueeze(-1), alt.values > -torch.inf], -1)
    level_ok &= (pos[:, 1:] < T).unsqueeze(-1)
    if st.any_forced:  # a forced position has one token: no alternatives
        level_ok[..., 1:] &= (st.forced_at[pos[:, 1:]] < 0).unsqueeze(-1)

    parents, depths, ranks = shape(K, levels, str(device))  # built once per shape and device
    at = (depths - 1) * K + ranks  # index into a level's K tokens, flattened
    tokens = level_tok.flatten(1)[:, at]
    own_ok = level_ok.flatten(1)[:, at]
    E = tokens.shape[1]
    walk_parents = torch.cat([depth - 1, parents]).expand(B, -1)
    walk_valid = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=device), level_ok[..., 0], own_ok], 1)
    for d in range(1, levels + 1):  # a node stands only under a node that stands (parents come first)
        walk_valid = walk_valid & torch.cat([torch.ones_like(walk_valid[:, :levels + 1]),
                                             walk_valid.gather(1, parents.expand(B, -1))], 1)
    walk_rows = torch.cat([spine_rows, L + torch.arange(E, device=device).expand(B, -1)], 1)
    rows_par = walk_rows.gather(1, parents.expand(B, -1))  # the extra nodes' parents as forward rows
    walk_depth = torch.cat([depth, depths])
    draft_rows = q[:, walk_depth.clamp(max=levels - 1)]  # a node's children come from the next level's q
    target = base.unsqueeze(1) + r0.unsqueeze(1) + depths + 1
    return Sprout(tokens, rows_par, walk_valid[:, levels + 1:], target, walk_rows, walk_parents, walk_valid,
                  draft_rows, levels, K)


def walk(sp: Sprout, probs: torch.Tensor, tokens: torch.Tensor, st, rule, exact: bool):
    """Recursive rejection over the tree's levels (``tree.accept_path``) on the forward's
    ``probs`` ``[B, L + E, V]`` and ``tokens`` ``[B, L + E]``: ``(path`` walk indices
    ``[B, levels + 1]``, ``counts``, ``new``, ``rejected``, ``on_spine)``."""
    from .tree import accept_path, children

    B = probs.shape[0]
    rows = sp.walk_rows
    M = rows.shape[1]
    wp = probs.gather(1, rows.unsqueeze(-1).expand(-1, -1, probs.shape[-1]))
    wt = tokens.gather(1, rows)
    kids = children(sp.walk_parents, sp.walk_valid, sp.branching)
    # one coin per node, keyed by what the node is (a spine depth, or an extra node, numbered
    # the same in every tree of fewer levels) so that an image does not depend on its batch,
    # whose longest window sets the levels near the image's end
    key = torch.cat([st.arange(sp.levels + 1), MAX_LEVELS + 1 + st.arange(M - sp.levels - 1)])
    u = rng.uniform(st.keys, st.step, rng.PROACTIVE + 1, key.expand(B, -1), lanes=2)
    root = torch.zeros(B, dtype=torch.long, device=probs.device)
    path, counts, new, rejected = accept_path(wp, wt, kids, root, rule, u[..., 0], u[:, : sp.levels + 1, 1],
                                              sp.levels, exact, sp.draft_rows)
    on_spine = (counts == sp.levels + 1) & (path[:, -1] == sp.levels)
    return path, counts, new, rejected, on_spine
