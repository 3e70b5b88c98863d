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

* a due skip is taken unless a sample dissents; a sample with nothing to commit
  abstains, so a skip may commit nothing (it runs no forward either).  The uniform
  schedule's skips are then due by the step count alone, which lets the step stay
  on the device (engine.py).

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
        self._weights: dict = {}

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
        from .tree import leaf_paths

        u = torch.stack([rng.uniform(st.keys, st.step, rng.PATHS + i, st.n_committed) for i in range(self.paths)], 1)
        nodes = leaf_paths(parents, valid, u)[0].transpose(1, 2)  # [B, D, P]
        paths = torch.where(nodes >= 0, tokens.gather(1, nodes.clamp(min=0).flatten(1)).view_as(nodes), -1)
        score = self._score(paths.clamp(min=0), (paths >= 0).all(-1))  # depths every drawn path reaches
        return ~valid.any(1) | (score >= self.threshold)

    def similarity(self, st, depth: int, m: torch.Tensor) -> torch.Tensor:
        steps = st.arange(depth)
        pos = st.n_committed.unsqueeze(1) + steps  # [B, D]
        rows = st.rows(st.ring, pos % st.ring_size, "similarity")  # [B, D, V] draft distributions
        # (on the host step from the step's block of numbers: the same numbers, fewer operations)
        upto = st.committed_bound(depth)
        u = torch.stack([st.uniform(rng.PATHS + i, pos, upto=upto) for i in range(self.paths - 1)], -1)
        paths = torch.cat([st.seq.gather(1, pos).unsqueeze(-1), rng.categorical(rows, u)], -1)  # [B, D, P]
        return self._score(paths, (steps.unsqueeze(0) < m.unsqueeze(1)) & (st.forced_at[pos] < 0))

    def _score(self, paths: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
        """``sum_l w_l S_l / sum_l w_l`` per sample: ``S_l`` the mean cosine similarity
        over distinct pairs of the ``paths`` ``[B, D, P]`` tokens' codebook vectors at
        depth ``l``, ``w_l = alpha^l`` where ``counted`` ``[B, D]``, else 0."""
        vec = self.geometry.unit_vec(paths)  # [B, D, P, E]
        gram = vec @ vec.transpose(-1, -2)  # [B, D, P, P]
        n = self.paths
        pair_mean = (gram.sum((-1, -2)) - n) / (n * (n - 1))  # mean over distinct pairs
        w = self._depth_weights(paths.shape[1], paths.device) * counted
        return (w * pair_mean).sum(1) / w.sum(1).clamp(min=1e-12)

    def _depth_weights(self, depth: int, device) -> torch.Tensor:
        """``alpha ** l`` for ``l < depth``, kept (a decode asks for the same depth at every step)."""
        key = (depth, device)
        if key not in self._weights:
            self._weights[key] = self.alpha ** torch.arange(depth, device=device).float()
        return self._weights[key]


def make_schedule(name: str, config, geometry):
    if name == "every":
        return VerifyEveryStep()
    if name == "uniform":
        return UniformSkip(config.skip_interval)
    return SimilaritySkip(config.skip_threshold, config.skip_alpha, config.skip_paths, geometry)
