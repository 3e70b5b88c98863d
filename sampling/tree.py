"""Draft trees: nodes in one target forward.

A tree of ``N`` nodes per sample is given by ``parents`` ``[B, N]``: node ``i``'s
parent is node ``parents[b, i]`` (an earlier node), or ``-1`` for a child of the
root (the newest committed token, which the forward does not hold).  Node ``i``
sits at stream position ``n + depth[b, i]`` (``n``: the position of the root's
child), attends to the cached prefix, its ancestors and itself, and its output
row predicts the position after it.  A chain of ``L`` drafts is the tree whose
node ``i`` has parent ``i - 1``.
"""
from __future__ import annotations

import torch


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """``[B, N, N]`` bool: ``a[b, i, j]`` when node ``j`` is node ``i`` or one of its
    ancestors (the attention a node has within the tree)."""
    B, N = parents.shape
    out = torch.eye(N, dtype=torch.bool, device=parents.device).repeat(B, 1, 1)
    cur = parents.clone()
    rows = torch.arange(N, device=parents.device).expand(B, N)
    batch = torch.arange(B, device=parents.device).unsqueeze(1).expand(B, N)
    for _ in range(N):  # pointer jumping: each pass goes one generation up
        live = cur >= 0
        if not bool(live.any()):
            break
        out[batch[live], rows[live], cur[live]] = True
        cur = torch.where(live, parents.gather(1, cur.clamp(min=0)), cur)
    return out


def depths(parents: torch.Tensor) -> torch.Tensor:
    """``[B, N]``: 0 for the root's children, parent's depth + 1 otherwise."""
    return ancestors(parents).sum(-1) - 1


def chain(B: int, L: int, device=None) -> torch.Tensor:
    """The parents of a chain of ``L`` nodes."""
    return (torch.arange(L, device=device) - 1).expand(B, L).contiguous()
