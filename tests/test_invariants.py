"""Bookkeeping every mode must keep, checked after every step."""
from __future__ import annotations

import pytest
import torch

from spec_ar.loaders.synthetic import SyntheticAdapter
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder
from spec_ar.sampling.report import ACCEPTED, COMMITTED, FORCED, PENDING, RESAMPLED, SAMPLED

CONFIGS = {
    "ar": dict(mode="ar"),
    "sjd": dict(mode="sjd"),
    "sjd-sample-above": dict(mode="sjd", init="sample-above"),
    "gsd": dict(mode="gsd", group_size=10, gsd_distance=8.0),
    "lantern": dict(mode="lantern", lantern_k=20, lantern_delta=0.3),
    "vvs": dict(mode="vvs", lantern_k=20),
    "vvs-similarity": dict(mode="vvs", schedule="similarity", skip_threshold=0.0, lantern_k=20),
    "gsd+vvs": dict(mode="gsd", schedule="uniform", skip_interval=3),
}


@pytest.fixture(scope="module")
def model():
    return SyntheticAdapter(codebook=128, rows=7, cols=9, end_of_line=True, sharpness=2.0, seed=4)


def run(model, config, prompts=(0, 1, 2), seed=0, window=5):
    events = []

    def check(ev):
        # the adapter's cache holds exactly the committed prefix, minus the
        # committed tokens the next forward will feed (while the whole batch is in it: finished
        # images leave, and an event still tells of them)
        cached = model.cache_lengths().tolist()
        whole = len(cached) == len(prompts)
        assert cached == ev.cached or not whole
        for b in range(len(prompts)):
            assert ev.cached[b] <= ev.committed[b] <= ev.length
            if whole:
                assert torch.equal(model.hist[b, : cached[b]], ev.tokens[b, : cached[b]])
            if ev.kind != "S" and ev.committed[b] < ev.length:
                assert ev.committed[b] - ev.cached[b] == 1, "one pending token after a verified step"
        events.append(ev)

    cfg = DecodeConfig(window=window, top_k=50, **config)
    return SpeculativeDecoder(model, cfg).generate(list(prompts), seeds=seed, callback=check), events


@pytest.mark.parametrize("name", list(CONFIGS))
def test_bookkeeping(model, name):
    result, events = run(model, CONFIGS[name])
    lay = model.layout
    forced = lay.forced >= 0
    for b, rep in enumerate(result.reports):
        origins = torch.tensor(rep.origins)
        assert (origins != PENDING).all()
        assert torch.equal(result.tokens[b][forced], lay.forced[forced]), "forced tokens in place"
        assert (origins[forced] == FORCED).all() and not (origins[~forced] == FORCED).any()
        assert bool(lay.image_tokens[result.tokens[b][~forced]].all()), "only image tokens at free positions"
        # every token is accounted for: by verified forwards or by skipped verifications
        produced = sum(n * c for n, c in enumerate(rep.accepted_length_histogram))
        assert produced + rep.unverified_tokens == rep.tokens == lay.length
        assert int((origins == COMMITTED).sum()) <= rep.unverified_tokens
        assert rep.tokens_per_forward == pytest.approx(rep.tokens / rep.nfe)
        # each forward draws at most one token from the target; the rest are drafts
        drawn = int(((origins == SAMPLED) | (origins == RESAMPLED)).sum())
        assert drawn <= rep.nfe
        if name != "ar":
            assert int((origins == ACCEPTED).sum()) > 0
        assert rep.nfe <= lay.length
        assert "SS" not in rep.step_kinds, "never two skips in a row"
        assert rep.step_kinds.count("V") + 1 >= rep.nfe
    assert events[-1].committed == [lay.length] * 3


def test_speculative_modes_need_no_more_forwards_than_ar(model):
    ar, _ = run(model, CONFIGS["ar"])
    assert all(r.nfe == model.layout.length for r in ar.reports)
    for name in ("sjd", "gsd", "lantern", "vvs"):
        res, _ = run(model, CONFIGS[name])
        assert all(r.nfe < a.nfe for r, a in zip(res.reports, ar.reports)), name


def test_vvs_skips_and_commits_unverified_tokens(model):
    res, events = run(model, CONFIGS["vvs"])
    kinds = "".join(e.kind for e in events)
    assert "S" in kinds and "SS" not in kinds
    rep = res.reports[0]
    assert rep.skipped_verifications > 0
    assert rep.origin_counts()["committed without verification (VVS skip)"] > 0
    assert rep.tokens_per_forward > rep.mean_accepted_length


def test_similarity_threshold_gates_skipping(model):
    def skips(threshold):
        res, _ = run(model, dict(mode="vvs", schedule="similarity", skip_threshold=threshold, lantern_k=20))
        return sum(r.skipped_verifications for r in res.reports)

    always, strict = skips(-1.0), skips(0.95)
    assert always > strict
    # with every vote in favour the schedule skips at every chance, like interval 2
    res, _ = run(model, dict(mode="vvs", schedule="similarity", skip_threshold=-1.0, lantern_k=20))
    uniform, _ = run(model, dict(mode="vvs", skip_interval=2, lantern_k=20))
    assert res.reports[0].step_kinds == uniform.reports[0].step_kinds


@pytest.mark.parametrize("target,extra", [("synthetic", {}), ("synthetic", dict(init="sample-above")),
                                          ("embedded", dict(proactive=2)), ("embedded", dict(rows=2))])
def test_similarity_skipping_reads_its_paths_numbers_from_the_steps_block(model, monkeypatch, target, extra):
    """The paths' numbers come from the host step's block of numbers (state.py, ``block_lanes``), read up to
    a bound on the lengths the step can reach (``committed_bound``): the decode they give is the one hashing
    each path's numbers anew gives, skips and tokens, and the bound holds at every plan."""
    from spec_ar.sampling import rng
    from spec_ar.sampling.schedule import SimilaritySkip
    from spec_ar.sampling.state import DecodeState

    if target == "embedded":  # (draft trees beside the window: a model that scores them)
        from spec_ar.loaders import embedded

        model = embedded.load().adapter
    prompts = ["a red circle", "a blue square", "a green star"] if target == "embedded" else [0, 1, 2]
    config = DecodeConfig(mode="vvs", schedule="similarity", skip_threshold=0.3, lantern_k=20, window=5, **extra)
    read, bounds = [], []
    take, plan = rng.UniformBlock.take, SimilaritySkip.plan
    monkeypatch.setattr(rng.UniformBlock, "take", lambda self, step, stream, positions: (
        read.append(stream), take(self, step, stream, positions))[1])

    def checked(self, st):
        m = plan(self, st)
        bounds.append(all(n <= u for n, u in zip(st.n_committed.tolist(), st.committed_bound())))
        return m

    monkeypatch.setattr(SimilaritySkip, "plan", checked)
    from_block = SpeculativeDecoder(model, config).generate(prompts, seeds=7)
    assert read.count(rng.PATHS) == read.count(rng.PATHS + 2) > 0 and rng.PATHS + 3 not in read  # (4 paths)
    assert bounds and all(bounds)
    original = DecodeState.__init__

    def no_paths(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.block_lanes = dict(self.BLOCK_LANES)

    monkeypatch.setattr(DecodeState, "__init__", no_paths)
    read.clear()
    hashed = SpeculativeDecoder(model, config).generate(prompts, seeds=7)
    assert rng.PATHS not in read
    assert torch.equal(from_block.tokens, hashed.tokens)
    assert [r.step_kinds for r in from_block.reports] == [r.step_kinds for r in hashed.reports]
    assert sum(r.skipped_verifications for r in hashed.reports) > 0  # (not vacuous: it skipped)


@pytest.mark.parametrize("name", ["sjd", "sjd-sample-above", "vvs-similarity", "gsd+vvs"])
def test_a_batch_too_wide_for_a_block_hashes_each_steps_own_numbers_and_the_same(model, monkeypatch, name):
    """Past ``BLOCK_HASHES`` (a batch of thousands) a step hashes its own numbers: the same numbers, so the
    same decode, without a block ever made."""
    from spec_ar.sampling import rng
    from spec_ar.sampling.state import DecodeState

    made = []
    init = rng.UniformBlock.__init__
    monkeypatch.setattr(rng.UniformBlock, "__init__", lambda self, *a: (made.append(a[3]), init(self, *a))[1])
    blocked, _ = run(model, CONFIGS[name])
    assert made  # (not vacuous: this batch takes blocks)
    made.clear()
    monkeypatch.setattr(DecodeState, "BLOCK_HASHES", 0)
    hashed, _ = run(model, CONFIGS[name])
    assert not made
    assert torch.equal(blocked.tokens, hashed.tokens)
    assert [r.step_kinds for r in blocked.reports] == [r.step_kinds for r in hashed.reports]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models(dtype):
    model = SyntheticAdapter(codebook=64, rows=4, cols=4, seed=2, dtype=dtype)
    for mode in ("sjd", "gsd", "lantern", "vvs"):
        res = SpeculativeDecoder(model, DecodeConfig(mode=mode, window=4, lantern_k=8)).generate([0, 1], seeds=3)
        assert res.tokens.shape == (2, 16) and res.reports[0].nfe <= 16


def test_target_probabilities_score_a_stream_in_one_forward(model):
    dec = SpeculativeDecoder(model, DecodeConfig(mode="ar", top_k=50))
    res = dec.generate([0, 1], seeds=3)
    chosen = dec.target_probabilities([0, 1], res.tokens,
                                      reduce=lambda p: p)  # full rows [B, T, V]
    picked = chosen.gather(-1, res.tokens.unsqueeze(-1)).squeeze(-1)
    assert (picked > 0).all(), "every sampled token has mass under its own distribution"
    forced = model.layout.forced >= 0
    assert torch.allclose(picked[:, forced], torch.ones_like(picked[:, forced]))
    top1 = dec.target_probabilities([0, 1], res.tokens)
    assert top1.shape == res.tokens.shape and bool((top1 >= picked - 1e-6).all())


def test_target_log_likelihood_scores_committed_tokens_in_chunks(model):
    dec = SpeculativeDecoder(model, DecodeConfig(mode="ar", top_k=50))
    res = dec.generate([0, 1], seeds=3)
    full = dec.target_probabilities([0, 1], res.tokens, reduce=lambda p: p)
    expected = full.gather(-1, res.tokens.unsqueeze(-1)).squeeze(-1).log()
    for chunk in (3, 256):  # chunk boundaries inside and beyond the stream
        ll = dec.target_log_likelihood([0, 1], res.tokens, chunk=chunk)
        assert torch.allclose(ll, expected, atol=1e-5)
    forced = model.layout.forced >= 0
    assert (ll[:, forced] == 0).all() and torch.isfinite(ll).all()
    outside = res.tokens.clone()  # a token top-k 50 excludes has no mass
    free = int(torch.nonzero(~forced)[3])
    outside[:, free] = full[:, free].argmin(-1)
    assert torch.isneginf(dec.target_log_likelihood([0, 1], outside)[:, free]).all()


def test_decoding_on_cuda_leaves_cudnn_attention_out_and_restores_it():
    # cuDNN's attention builds a plan per new shape, and speculative steps keep making
    # new shapes; the switch is scoped to a decode and leaves CPU runs alone
    from spec_ar.sampling.engine import attention_without_cudnn

    before = torch.backends.cuda.cudnn_sdp_enabled()
    with attention_without_cudnn("cuda:0"):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with attention_without_cudnn("cpu"):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
