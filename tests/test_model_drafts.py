"""Drafts from a draft model (a sibling with the target's token layout): exact
acceptance stays lossless on them, caches roll back with the target's, a drafter
that does not fit is refused, and the report shows the drafter's time."""
from __future__ import annotations

import time

import pytest
import torch

from spec_ar.loaders import llamagen
from spec_ar.loaders.synthetic import SyntheticAdapter
from spec_ar.sampling import ConfigError, DecodeConfig, ModelDrafts, SpeculativeDecoder

from .checkpoints import random_gpt, tiny_gpt_spec, write_gpt, write_vq
from .fakes import TabularAdapter
from .test_exactness import CFG, TOP_K, stream_test


def decoder(target, drafter, **config):
    return SpeculativeDecoder(target, DecodeConfig(**{"cfg_scale": CFG, "top_k": TOP_K, **config}),
                              drafter=ModelDrafts(drafter, "test drafter"))


@pytest.mark.parametrize("depth", [1, 3, 8])
def test_exact_acceptance_on_draft_model_drafts_follows_the_exact_joint(depth):
    target, drafter = TabularAdapter(seed=3), TabularAdapter(seed=4)
    result = decoder(target, drafter, mode="sjd", depth=depth).generate([1] * 30_000, seeds=7_000_000)
    pvalue, impossible = stream_test(target, result.tokens, cls=1)
    assert impossible == 0 and pvalue > 1e-4
    origins = {k: sum(r.origin_counts()[k] for r in result.reports)
               for k in ("accepted draft", "resampled after a rejection")}
    assert origins["accepted draft"] > 0 and origins["resampled after a rejection"] > 0  # both paths ran


def test_a_batch_of_one_on_draft_model_drafts_follows_the_exact_joint():
    target, drafter = TabularAdapter(image=3, length=3, forced=(1,), seed=5), TabularAdapter(image=3, length=3,
                                                                                            forced=(1,), seed=6)
    dec = SpeculativeDecoder(target, DecodeConfig(mode="sjd", depth=3, cfg_scale=CFG, top_k=2),
                             drafter=ModelDrafts(drafter))
    tokens = torch.cat([dec.generate([0], seeds=[s]).tokens for s in range(500)])
    pvalue, impossible = stream_test(target, tokens, cls=0, top_k=2)
    assert impossible == 0 and pvalue > 1e-4


def test_the_check_rejects_lantern_with_a_large_delta_on_draft_model_drafts():
    target, drafter = TabularAdapter(seed=3, spread=4.0), TabularAdapter(seed=4, spread=4.0)
    result = decoder(target, drafter, mode="lantern", depth=3, lantern_k=3, lantern_delta=1.0).generate(
        [1] * 30_000, seeds=8_000_000)
    pvalue, impossible = stream_test(target, result.tokens, cls=1)
    assert impossible > 0 or pvalue < 1e-6


@pytest.mark.parametrize("depth", [1, 2])
def test_an_image_does_not_depend_on_its_batch_with_a_draft_model(depth):
    # a sample whose drafts and bonus all stand feeds the drafter two tokens, one
    # whose draft fell feeds one: the batch's feed is padded and the padding must
    # leave the drafter's cache (the tabular drafter reads its whole prefix)
    target, drafter = TabularAdapter(seed=3), TabularAdapter(seed=4)
    dec = decoder(target, drafter, mode="sjd", depth=depth)
    seeds = list(range(24))
    batch = dec.generate([1] * len(seeds), seeds=seeds)
    for b, seed in enumerate(seeds):
        assert torch.equal(dec.generate([1], seeds=[seed]).tokens[0], batch.tokens[b]), f"sample {b}"


def test_a_draft_model_spends_no_forward_past_the_image():
    """A 5-position stream (4 image tokens) at depth 3: the prefill's position, then two
    drafts' inputs; no drafts past the end, none after the last verification (it made 6
    forwards before, 3 of them for positions no window scores)."""
    target, same = TabularAdapter(seed=3), TabularAdapter(seed=3)
    widths = []
    forward = same.forward
    same.forward = lambda tokens: widths.append(tokens.shape[1]) or forward(tokens)
    decoder(target, same, mode="sjd", depth=3).generate([1], seeds=1)
    assert widths == [1, 1, 1]


def test_a_drafter_that_is_the_target_has_every_draft_accepted():
    target, same = TabularAdapter(seed=3), TabularAdapter(seed=3)
    result = decoder(target, same, mode="sjd", depth=3).generate([1] * 64, seeds=1)
    for r in result.reports:
        assert r.origin_counts()["resampled after a rejection"] == 0
        assert r.nfe == 2  # the prefill, then three drafts and the bonus in one forward


@pytest.fixture(scope="module")
def llamagen_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("llamagen_drafts")
    spec = tiny_gpt_spec("c2i")
    return {"gpt": write_gpt(d / "c2i_tiny.pt", random_gpt(spec, seed=1)),
            "sibling": write_gpt(d / "c2i_sibling.pt", random_gpt(spec, seed=9)),
            "vq": write_vq(d / "vq_ds16_c2i.pt")}


def test_a_llamagen_drafting_for_itself_is_accepted_through_its_kv_cache(llamagen_files):
    # the drafter's cache is rolled back and fed again every pass; any slip in
    # positions would give it other logits than the target and rejections
    def load():
        return llamagen.load(llamagen_files["gpt"], llamagen_files["vq"], resolution=64).adapter

    target = load()
    result = decoder(target, load(), mode="sjd", depth=5, top_k=None).generate([3, 5, 3], seeds=[1, 2, 3])
    for r in result.reports:
        assert r.origin_counts()["resampled after a rejection"] == 0
        assert r.nfe == 1 + -(-(r.tokens - 1) // 6)  # the prefill, then five drafts and the bonus a forward


@pytest.mark.parametrize("depth", [1, 4])
def test_an_image_does_not_depend_on_its_batch_with_a_sibling_drafter(llamagen_files, depth):
    # depth 1: a sample whose draft and bonus both stand feeds the drafter two
    # tokens, one whose draft fell feeds one; the batch's feed is padded
    target = llamagen.load(llamagen_files["gpt"], llamagen_files["vq"], resolution=64).adapter
    sibling = llamagen.load(llamagen_files["sibling"], llamagen_files["vq"], resolution=64).adapter
    dec = decoder(target, sibling, mode="sjd", depth=depth, top_k=None)
    batch = dec.generate([3, 5, 7], seeds=[11, 12, 13])
    assert len({r.nfe for r in batch.reports}) > 1, "samples advance by their own amounts"
    for b, (cls, seed) in enumerate(zip([3, 5, 7], [11, 12, 13])):
        assert torch.equal(dec.generate([cls], seeds=[seed]).tokens[0], batch.tokens[b])


def test_a_drafter_of_another_layout_is_refused_before_decoding():
    target = SyntheticAdapter(codebook=64, rows=4, cols=4)
    with pytest.raises(ConfigError, match="cannot draft for this model: it has vocabulary 32 ids"):
        decoder(target, SyntheticAdapter(codebook=32, rows=4, cols=4), mode="sjd")
    with pytest.raises(ConfigError, match="a 5x4 grid in 20 positions, the target's 4x4 in 16"):
        decoder(target, SyntheticAdapter(codebook=64, rows=5, cols=4), mode="sjd")
    with pytest.raises(ConfigError, match="not 'ar'"):
        decoder(target, SyntheticAdapter(codebook=64, rows=4, cols=4), mode="ar")


class SlowAdapter(SyntheticAdapter):
    """A draft model whose every forward takes at least 5 ms."""

    calls = 0

    def forward(self, tokens):
        SlowAdapter.calls += 1
        time.sleep(0.005)
        return super().forward(tokens)


def test_the_report_names_the_drafter_and_keeps_its_time_apart():
    target = SyntheticAdapter(codebook=64, rows=4, cols=4, hidden=32)
    drafter = SlowAdapter(codebook=64, rows=4, cols=4, hidden=16, seed=2)
    SlowAdapter.calls = 0
    rep = decoder(target, drafter, mode="sjd", depth=4).generate([1, 2], seeds=3).reports[0]
    slept = 0.005 * SlowAdapter.calls
    assert rep.drafter == "test drafter" and SlowAdapter.calls > 0
    assert rep.drafter_time_s >= slept  # the drafter's forwards are timed as the drafter's
    assert rep.engine_time_s < slept and rep.model_time_s < rep.latency_s - slept  # and as nothing else
    assert "drafts from test drafter" in rep.summary()
