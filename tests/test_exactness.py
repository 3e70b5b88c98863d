"""Lossless modes sample the target distribution exactly; the check can fail.

A tabular model small enough to enumerate (4 image tokens, 5 stream positions,
one forced structural token in the middle) is decoded many times with CFG and
top-k active; the histogram of complete streams is compared with the exact joint
distribution by a chi-square test.  With fixed seeds the outcome is fixed; an
exact sampler passes with probability 1 - 1e-4 for any seed, a biased one fails.
"""
from __future__ import annotations

import pytest
import torch

from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

from .fakes import TabularAdapter

CFG, TOP_K = 2.0, 3


def stream_test(adapter: TabularAdapter, tokens: torch.Tensor, cls: int, cfg=CFG, top_k=TOP_K):
    """``(p-value, number of sampled streams that have zero probability)``."""
    exact = adapter.joint(cls, cfg, top_k)
    counts: dict[tuple, int] = {}
    for row in map(tuple, tokens.tolist()):
        counts[row] = counts.get(row, 0) + 1
    impossible = sum(c for s, c in counts.items() if s not in exact)
    n = tokens.shape[0]
    chi2 = sum((counts.get(s, 0) - n * p) ** 2 / (n * p) for s, p in exact.items())
    df = len(exact) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(chi2 / 2.0))), impossible


def sample(adapter, config, n, seed=0, cls=1):
    config = DecodeConfig(cfg_scale=CFG, top_k=TOP_K, **config)
    return SpeculativeDecoder(adapter, config).generate([cls] * n, seeds=seed * 1_000_000).tokens


EXACT = {
    "ar": dict(mode="ar"),
    "sjd": dict(mode="sjd", window=3),
    "sjd-window-1": dict(mode="sjd", window=1),
    "sjd-repeat-left": dict(mode="sjd", window=3, init="repeat-left"),
    "sjd-sample-left": dict(mode="sjd", window=3, init="sample-left"),
    "sjd-sample-above": dict(mode="sjd", window=3, init="sample-above"),
    "gsd-G1": dict(mode="gsd", window=3, group_size=1, gsd_delta=1.0),
    "lantern-delta0": dict(mode="lantern", window=3, lantern_k=3, lantern_delta=0.0),
}


@pytest.fixture(scope="module")
def model():
    return TabularAdapter(seed=3)


@pytest.mark.parametrize("name", list(EXACT))
def test_batched_samples_follow_the_exact_joint(model, name):
    tokens = sample(model, EXACT[name], n=30_000, seed=1)
    assert (tokens[:, 2] == model.eol).all(), "the forced token is always in place"
    pvalue, impossible = stream_test(model, tokens, cls=1)
    assert impossible == 0
    assert pvalue > 1e-4


@pytest.mark.parametrize("name", ["ar", "sjd", "gsd-G1", "lantern-delta0"])
def test_batch_of_one_follows_the_exact_joint(name):
    small = TabularAdapter(image=3, length=3, forced=(1,), seed=5)
    config = DecodeConfig(cfg_scale=CFG, top_k=2, **{**EXACT[name], "lantern_k": 2})
    decoder = SpeculativeDecoder(small, config)
    tokens = torch.cat([decoder.generate([0], seeds=[s]).tokens for s in range(500)])
    pvalue, impossible = stream_test(small, tokens, cls=0, top_k=2)
    assert impossible == 0
    assert pvalue > 1e-4


@pytest.mark.parametrize("config", [
    dict(mode="gsd", window=3, group_size=4, gsd_delta=1.0),  # the cluster is every image token
    dict(mode="lantern", window=3, lantern_k=3, lantern_delta=1.0),  # every neighbour joins A
    dict(mode="vvs", window=3, lantern_k=3, lantern_delta=0.0, skip_interval=2),  # unverified commits
])
def test_the_check_rejects_biased_modes(config):
    # A peaked model: accepting what the drafts propose is far from the target.
    peaked = TabularAdapter(seed=3, spread=4.0)
    tokens = sample(peaked, config, n=30_000, seed=2)
    pvalue, impossible = stream_test(peaked, tokens, cls=1)
    assert impossible > 0 or pvalue < 1e-6


class ConstantDrafts:
    """A draft source other than Jacobi: always proposes the first image token,
    never learns from the target.  The engine must stay exact with it."""

    def after_verify(self, st, probs, samples, first_new):
        pass  # drafts past the new token stay as proposed, with their one-hot q

    def extend(self, st, start, stop, width):
        pos = start.unsqueeze(1) + st.arange(width)
        pos = torch.where(pos < stop.unsqueeze(1), pos, st.scratch)
        tok = torch.where(st.forced_at[pos] >= 0, st.forced_at[pos], st.image_ids[0])
        st.seq.scatter_(1, pos, tok)
        slot = torch.where(pos < stop.unsqueeze(1), pos % st.ring_size, st.ring_size)
        st.ring[st.batch_idx, slot] = 0.0
        st.ring[st.batch_idx, slot, tok] = 1.0


def test_any_draft_source_keeps_the_engine_exact(model):
    config = DecodeConfig(mode="sjd", window=3, cfg_scale=CFG, top_k=TOP_K)
    decoder = SpeculativeDecoder(model, config, drafter=ConstantDrafts())
    result = decoder.generate([1] * 30_000, seeds=5_000_000)
    pvalue, impossible = stream_test(model, result.tokens, cls=1)
    assert impossible == 0 and pvalue > 1e-4
    accepted = sum(r.origin_counts()["accepted draft"] for r in result.reports)
    assert accepted > 0, "its drafts are used"
