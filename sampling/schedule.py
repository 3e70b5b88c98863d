"""Verification schedules: when a step may commit drafts without a target forward.

After every verified step the engine asks the schedule for ``plan(state)`` (a
:class:`~.state.DecodeState`): a per-sample number of draft tokens to commit
unverified at the next step, or ``None`` to verify.  Rules shared by every skipping schedule (VVS, Dong et al.
2025, sec. 4.1-4.4):

* never two skips in a row (the engine only asks after a verified step);
* the committed path is truncated to ``min(path length, floor(mean accepted
  length))`` — with Jacobi drafts the path is the informed tail, the drafts the
  last pass sampled from its own distributions;
* the next forward prepends the committed tokens ("post-verification"): they
  refill the KV cache and are never rejected.

VVS chooses one of the drafter's candidate paths uniformly at random.  Jacobi
candidates are independent draws from the same per-position distributions, so
the tail already in the window *is* such a uniform choice; extra paths are drawn
only to measure similarity.  A batch skips together (one forward serves all);
with the similarity schedule it skips only when no sample that could commit
tokens finds its paths too dissimilar.  The released VVS code truncates to ``mean - 1``; this follows the paper.
"""
from __future__ import annotations

import torch

from . import rng


class VerifyEveryStep:
    def plan(self, st):
        return None

    def skip_tree(self, st, tokens, parents, valid):
        return None


class UniformSkip:
    """After ``interval - 1`` verified steps, the next step skips verification."""

    def __init__(self, interval: int):
        self.interval = interval

    def plan(self, st):
        if st.verified_since_skip < self.interval - 1:
            return None
        return st.commit_lengths()

    def skip_tree(self, st, tokens, parents, valid):
        """On draft trees the step decides from its own tree: skip now, or not."""
        if st.verified_since_skip < max(1, self.interval - 1):
            return None
        return torch.ones_like(valid[:, 0])


class SimilaritySkip:
    """Skip when the candidate paths agree: the depth-weighted mean cosine
    similarity of their codebook vectors, ``sum_l w_l S_l`` with
    ``w_l ∝ alpha^l`` (VVS eq. 2, Alg. 1), reaches ``threshold``."""

    def __init__(self, threshold: float, alpha: float, paths: int, geometry):
        self.threshold, self.alpha, self.paths, self.geometry = threshold, alpha, paths, geometry

    def plan(self, st):
        m = st.commit_lengths()
        score = self.similarity(st, st.max_commit, m)  # fixed depth: no host sync
        # samples with nothing to commit abstain; any dissent makes the batch verify
        against = (m > 0) & (score < self.threshold)
        return torch.where(against, -1, m)

    def skip_tree(self, st, tokens, parents, valid):
        """On draft trees (VVS-D on the drafter's tree): skip now when ``paths``
        root-to-leaf paths drawn uniformly agree at least ``threshold`` (the same
        depth-weighted similarity), for every sample that has a tree."""
        if st.verified_since_skip < 1:
            return None
        paths, D = tree_paths(st, tokens, parents, valid, self.paths)
        vec = torch.nn.functional.normalize(self.geometry.vec(paths.clamp(min=0)), dim=-1)  # [B, D, P, E]
        gram = vec @ vec.transpose(-1, -2)
        n = self.paths
        pair_mean = (gram.sum((-1, -2)) - n) / (n * (n - 1))
        w = (self.alpha ** torch.arange(D, device=tokens.device).float()) * (paths >= 0).all(-1)
        score = (w * pair_mean).sum(1) / w.sum(1).clamp(min=1e-12)
        has = valid.any(1)
        return ~has | (score >= self.threshold)

    def similarity(self, st, depth: int, m: torch.Tensor) -> torch.Tensor:
        pos = st.n_committed.unsqueeze(1) + torch.arange(depth, device=m.device)  # [B, D]
        rows = st.ring[st.batch_idx, pos % st.ring_size]  # [B, D, V] draft distributions
        u = torch.stack([rng.uniform(st.keys, st.step, rng.PATHS + i, pos) for i in range(self.paths - 1)], -1)
        paths = torch.cat([st.seq.gather(1, pos).unsqueeze(-1), rng.categorical(rows, u)], -1)  # [B, D, P]
        vec = torch.nn.functional.normalize(self.geometry.vec(paths), dim=-1)  # [B, D, P, E]
        gram = vec @ vec.transpose(-1, -2)  # [B, D, P, P]
        n = self.paths
        pair_mean = (gram.sum((-1, -2)) - n) / (n * (n - 1))  # mean over distinct pairs
        depth_idx = torch.arange(depth, device=m.device)
        free = st.forced_at[pos] < 0
        w = (self.alpha ** depth_idx.float()) * ((depth_idx.unsqueeze(0) < m.unsqueeze(1)) & free)
        return (w * pair_mean).sum(1) / w.sum(1).clamp(min=1e-12)


def tree_paths(st, tokens, parents, valid, paths: int):
    """``[B, D, P]`` tokens of ``paths`` root-to-leaf paths per sample, leaves drawn
    uniformly (with replacement), by depth (``-1`` past a path's leaf), and ``D``."""
    from .tree import depths

    B, N = tokens.shape
    depth = depths(parents)
    is_parent = torch.zeros_like(valid)
    is_parent.scatter_(1, parents.clamp(min=0), (parents >= 0) & valid)
    leaf = valid & ~is_parent
    count = leaf.sum(1, keepdim=True)
    u = torch.stack([rng.uniform(st.keys, st.step, rng.PATHS + i, st.n_committed) for i in range(paths)], 1)
    pick = (u * count).long().clamp(max=(count - 1).clamp(min=0))  # [B, P]: the pick-th leaf
    rank = leaf.cumsum(1) - 1
    node = ((rank.unsqueeze(1) == pick.unsqueeze(2)) & leaf.unsqueeze(1)).int().argmax(2)  # [B, P]
    D = int(depth.max()) + 1
    out = torch.full((B, D, paths), -1, dtype=torch.long, device=tokens.device)
    for _ in range(D):  # climb: each path's node at its depth, then its parent
        d = depth.gather(1, node)
        out.scatter_(1, d.unsqueeze(1), tokens.gather(1, node).unsqueeze(1))
        up = parents.gather(1, node)
        node = torch.where(up >= 0, up, node)
    return out, D


def make_schedule(name: str, config, geometry):
    if name == "every":
        return VerifyEveryStep()
    if name == "uniform":
        return UniformSkip(config.skip_interval)
    return SimilaritySkip(config.skip_threshold, config.skip_alpha, config.skip_paths, geometry)
