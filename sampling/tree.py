"""Draft trees: nodes in one target forward.

A tree of ``N`` nodes per sample is given by ``parents`` ``[B, N]``: node ``i``'s
parent is node ``parents[b, i]`` (an earlier node), or ``-1`` for a child of the
root (the newest committed token, which the forward does not hold).  Node ``i``
sits at stream position ``n + depth[b, i]`` (``n``: the position of the root's
child), attends to the cached prefix, its ancestors and itself, and its output
row predicts the position after it.  A chain of ``L`` drafts is the tree whose
node ``i`` has parent ``i - 1``.  The engine prepends the root (and, after a
skipped verification, the committed tokens the target has not scored before it)
as a chain, so its trees' parents are ``-1`` only for the first node.
"""
from __future__ import annotations

import heapq
import json
import math
import pathlib

import torch

from .config import ConfigError


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """``[B, N, N]`` bool: ``a[b, i, j]`` when node ``j`` is node ``i`` or one of its
    ancestors (the attention a node has within the tree).  Pointer doubling: after round
    ``k`` a node holds its ancestors within ``2^k`` generations and ``jump`` its ``2^k``-th
    ancestor, so ``ceil(log2 N)`` rounds of fixed shapes serve any tree, with nothing read
    on the host (the step on the device scores trees too)."""
    B, N = parents.shape
    eye = torch.eye(N, dtype=torch.bool, device=parents.device)
    jump = parents
    out = eye | (torch.nn.functional.one_hot(jump.clamp(min=0), N).bool() & (jump >= 0).unsqueeze(2))
    for _ in range(max(0, N - 2).bit_length()):  # 2^rounds >= N - 1, the deepest a tree of N nodes goes
        live = (jump >= 0).unsqueeze(2)
        at = jump.clamp(min=0)
        out = out | (out.gather(1, at.unsqueeze(2).expand(B, N, N)) & live)
        jump = torch.where(jump >= 0, jump.gather(1, at), jump)
    return out


def depths(parents: torch.Tensor) -> torch.Tensor:
    """``[B, N]``: 0 for the root's children, parent's depth + 1 otherwise."""
    return ancestors(parents).sum(-1) - 1


def chain(B: int, L: int, device=None) -> torch.Tensor:
    """The parents of a chain of ``L`` nodes."""
    return (torch.arange(L, device=device) - 1).expand(B, L).contiguous()


class DenseRows:
    """Draft distributions held as rows ``[B, n, V]`` (a sampled tree's siblings
    were drawn from their parent's row); ``at`` as :class:`PointMass`'s."""

    def __init__(self, rows: torch.Tensor):
        self.rows = rows

    def at(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dim() == self.rows.dim() - 1:
            return self.rows.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        return self.rows.gather(-1, ids)


class PointMass:
    """The draft distribution of a deterministic draft (a tree node taken by rank):
    all its mass on the node's token ``x`` ``[B, n]``.  What acceptance rules read
    through ``q.at`` (``acceptance.py``), and ``dense`` for their residual."""

    def __init__(self, x: torch.Tensor):
        self.x = x

    def at(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.x if ids.dim() == self.x.dim() else self.x.unsqueeze(-1)
        return (ids == x).float()

    def dense(self, vocab: int) -> torch.Tensor:
        return torch.nn.functional.one_hot(self.x, vocab).float()


def children(parents: torch.Tensor, valid: torch.Tensor, most: int | None = None) -> torch.Tensor:
    """``[B, M, K]``: the valid children of each node of ``parents`` ``[B, M]``
    (``-1``: no parent), in node order, ``-1``-padded.  ``most``: the most children a
    node has, where the caller knows it (else read on the host)."""
    B, M = parents.shape
    owner = torch.where(valid & (parents >= 0), parents, M)  # the others go to a row that is cut off
    earlier = torch.ones(M, M, dtype=torch.bool, device=parents.device).tril(-1)
    rank = ((owner.unsqueeze(2) == owner.unsqueeze(1)) & earlier).sum(-1)  # among its siblings
    rank = torch.where(owner < M, rank, 0)  # (the row cut off takes them all at one place)
    K = int(rank.max()) + 1 if most is None else most
    out = torch.full((B, M + 1, K), -1, dtype=torch.long, device=parents.device)
    batch = torch.arange(B, device=parents.device).unsqueeze(1).expand(B, M)
    out[batch, owner, rank] = torch.arange(M, device=parents.device).expand(B, M)
    return out[:, :M]


def leaf_paths(parents: torch.Tensor, valid: torch.Tensor, u: torch.Tensor):
    """Root-to-leaf paths of the valid nodes, one per uniform in ``u`` ``[B, P]``
    (leaves drawn uniformly, with replacement): ``[B, P, D]`` node indices by
    depth (``-1`` past the leaf), and the mean path length over all leaves ``[B]``."""
    B, N = parents.shape
    depth = depths(parents)
    is_parent = torch.zeros_like(valid)
    is_parent.scatter_(1, parents.clamp(min=0), (parents >= 0) & valid)
    leaf = valid & ~is_parent
    count = leaf.sum(1, keepdim=True)
    mean = (leaf * (depth + 1)).sum(1) / count.squeeze(1).clamp(min=1)
    pick = (u * count).long().clamp(max=(count - 1).clamp(min=0))  # the pick-th leaf
    node = (((leaf.cumsum(1) - 1).unsqueeze(1) == pick.unsqueeze(2)) & leaf.unsqueeze(1)).int().argmax(2)
    D = int(depth.max()) + 1
    out = torch.full((B, u.shape[1], D), -1, dtype=torch.long, device=parents.device)
    for _ in range(D):  # climb: each path's node at its depth, then its parent
        out.scatter_(2, depth.gather(1, node).unsqueeze(2), node.unsqueeze(2))
        up = parents.gather(1, node)
        node = torch.where(up >= 0, up, node)
    return torch.where(count.unsqueeze(2) > 0, out, -1), mean


def accept_path(probs, tokens, kids, root, rule, u_coin, u_draw, levels: int, exact: bool,
                draft_rows: torch.Tensor | None = None):
    """Walk a verified tree from node ``root`` ``[B]``.  ``probs`` ``[B, M, V]``: the
    target's distribution after each node; ``tokens`` ``[B, M]``; ``kids`` from
    :func:`children`; ``levels`` the tree's depth below the root; ``u_coin``
    ``[B, M]`` one uniform per node, ``u_draw`` ``[B, levels + 1]`` one per depth.
    Without ``draft_rows`` every draft is deterministic (``q`` a point mass), so
    exact acceptance is recursive rejection over the siblings, which draws the same
    as: draw ``t`` from the node's row, move to the child whose token is ``t``, or
    stop with ``t`` as the new token (``exact``: done that way, one draw per level).
    Other rules test each sibling in turn with ``rule.accept_prob`` on the residual
    the siblings before it left, and draw the new token from the last residual.
    With ``draft_rows`` ``[B, M, V]`` (a sampled tree: node ``m``'s children were
    drawn from row ``m`` without replacement, in sibling order) every rule tests the
    siblings that way against ``q``: the ``i``-th sibling's ``q`` is the row less the
    siblings drawn before it, renormalised, and a rejection leaves
    ``norm(residual(p_i, q_i))`` (recursive rejection sampling without replacement,
    lossless for exact acceptance).  A sample that reaches a
    leaf draws the bonus from the leaf's row.  Returns ``(path [B, levels + 1]`` node
    indices from the root, ``counts`` nodes on it (the root included), ``new`` tokens ``[B]``,
    ``rejected`` ``[B]``: a child was tried and none stood); no host synchronisation."""
    from . import rng

    B, M, V = probs.shape
    batch = torch.arange(B, device=probs.device)
    cur = root.clone()
    moving = torch.ones(B, dtype=torch.bool, device=probs.device)
    path, counts = [cur], torch.ones(B, dtype=torch.long, device=probs.device)
    rejected = torch.zeros(B, dtype=torch.bool, device=probs.device)
    new = torch.zeros(B, dtype=torch.long, device=probs.device)
    for depth in range(levels + 1):
        k = kids[batch, cur]  # [B, K]
        row = probs[batch, cur]  # [B, V]
        u = u_draw[:, depth: depth + 1]
        if depth == levels or (exact and draft_rows is None):  # the last level has no children: the bonus
            t = rng.categorical(row, u).squeeze(-1)
            child_tok = torch.where(k >= 0, tokens.gather(1, k.clamp(min=0)), -1)
            hit = (child_tok == t.unsqueeze(1)) & moving.unsqueeze(1)
            moved = hit.any(1)
            nxt = k.gather(1, hit.int().argmax(1, keepdim=True)).squeeze(1)
        else:
            r, moved, nxt = row, torch.zeros_like(moving), cur
            left = None if draft_rows is None else draft_rows[batch, cur]  # q less the siblings tried
            for j in range(k.shape[1]):
                c = k[:, j]
                x = tokens.gather(1, c.clamp(min=0).unsqueeze(1))
                live = moving & ~moved & (c >= 0)
                total = r.sum(-1, keepdim=True)
                rn = r / torch.where(total > 0, total, 1.0)
                if left is None:
                    q = PointMass(x)
                    qd = q.dense(V)  # [B, 1, V]
                else:
                    mass = left.sum(-1, keepdim=True)
                    q = DenseRows((left / torch.where(mass > 0, mass, 1.0)).unsqueeze(1))
                    qd = q.rows
                acc = live & (u_coin.gather(1, c.clamp(min=0).unsqueeze(1)).squeeze(1)
                              < rule.accept_prob(rn.unsqueeze(1), q, x).squeeze(1))
                res = rule.residual(rn.unsqueeze(1), qd, x).squeeze(1)
                # float ties: nothing left to take
                res = torch.where(res.sum(-1, keepdim=True) >= rng.MIN_MASS, res, rn)
                r = torch.where((live & ~acc).unsqueeze(1), res, r)
                if left is not None:
                    left = torch.where((live & ~acc).unsqueeze(1), left.scatter(1, x, 0.0), left)
                nxt = torch.where(acc, c, nxt)
                moved = moved | acc
            t = rng.categorical(r, u).squeeze(-1)
        stop = moving & ~moved
        new = torch.where(stop, t, new)
        rejected |= stop & (k[:, 0] >= 0)
        cur = torch.where(moved, nxt, cur)
        counts = counts + moved.long()
        moving = moved
        if depth < levels:
            path.append(torch.where(moved, nxt, 0))
    return torch.stack(path, 1), counts, new, rejected


def static_shape(choices: str | None, tokens: int, top_k: int, depth: int) -> dict:
    """A static tree: ``parents``, ``ranks`` (which ranked child of its parent a node
    is) and ``depths`` per node, parents first.  From ``choices``: a JSON file holding
    a list of child-rank paths (``[[0], [1], [0, 0], ...]``, every prefix listed, as
    LANTERN++'s tree choices); without one, the ``tokens`` paths of at most ``depth``
    ranks below ``top_k`` that are likeliest under a Zipf prior (rank ``r`` taken with
    weight ``1 / (r + 1)``)."""
    if choices:
        path = pathlib.Path(choices)
        try:
            paths = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ConfigError(f"tree_choices {choices}: cannot be read as a JSON list of rank paths ({err})") from None
        if not (isinstance(paths, list) and paths and all(
                isinstance(p, list) and p and all(isinstance(r, int) and r >= 0 for r in p) for p in paths)):
            raise ConfigError(f"tree_choices {choices}: expected a non-empty list of rank paths such as "
                              "[[0], [1], [0, 0]] (lists of ranks >= 0)")
        paths = sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))
        missing = [p for p in paths if len(p) > 1 and p[:-1] not in set(paths)]
        if missing:
            raise ConfigError(f"tree_choices {choices}: path {list(missing[0])} is listed without its parent "
                              f"{list(missing[0][:-1])}")
    else:
        found = []
        heap = [(-math.log(1 / (r + 1)), (r,)) for r in range(top_k)]
        heapq.heapify(heap)
        while heap and len(found) < tokens:
            cost, p = heapq.heappop(heap)
            found.append(p)
            if len(p) < depth:
                for r in range(top_k):
                    heapq.heappush(heap, (cost - math.log(1 / (r + 1)), p + (r,)))
        paths = sorted(found, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(paths)}
    return {"parents": [index[p[:-1]] if len(p) > 1 else -1 for p in paths], "ranks": [p[-1] for p in paths],
            "depths": [len(p) - 1 for p in paths]}
