"""Degenerate settings reproduce SJD token for token; samples do not depend on
their batch."""
from __future__ import annotations

import pytest
import torch

from spec_ar.loaders.synthetic import SyntheticAdapter
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder


@pytest.fixture(scope="module")
def model():
    # soft distributions so that drafts are often rejected
    return SyntheticAdapter(codebook=64, rows=6, cols=6, end_of_line=True, sharpness=1.5, seed=1)


def decode(model, prompts, seeds, **config):
    cfg = DecodeConfig(window=6, top_k=40, **config)
    return SpeculativeDecoder(model, cfg).generate(prompts, seeds=seeds)


@pytest.mark.parametrize("init", ["random", "sample-left", "repeat-above"])
def test_gsd_with_one_token_groups_and_lantern_without_budget_are_sjd(model, init):
    prompts, seeds = [0, 1, 2, 3], [11, 12, 13, 14]
    sjd = decode(model, prompts, seeds, mode="sjd", init=init)
    gsd = decode(model, prompts, seeds, mode="gsd", init=init, group_size=1, gsd_delta=0.5)
    lantern = decode(model, prompts, seeds, mode="lantern", init=init, lantern_k=10, lantern_delta=0.0)
    assert torch.equal(gsd.tokens, sjd.tokens)
    assert torch.equal(lantern.tokens, sjd.tokens)
    assert [r.nfe for r in gsd.reports] == [r.nfe for r in sjd.reports]
    # and the comparison is not vacuous: the drafts were rejected along the way
    assert sum(r.origin_counts()["resampled after a rejection"] for r in sjd.reports) > 0


def test_relaxed_rules_accept_more_than_sjd(model):
    prompts, seeds = [0, 1, 2, 3], 7
    nfe = {mode: sum(r.nfe for r in decode(model, prompts, seeds, mode=mode, **kw).reports)
           for mode, kw in [("sjd", {}), ("gsd", dict(group_size=20, gsd_delta=0.5)),
                            ("lantern", dict(lantern_k=10, lantern_delta=0.5))]}
    assert nfe["gsd"] < nfe["sjd"] and nfe["lantern"] < nfe["sjd"]


@pytest.mark.parametrize("mode,extra", [
    ("ar", {}), ("sjd", {}), ("gsd", {}), ("lantern", dict(lantern_k=10)),
    ("sjd", dict(init="sample-above")),
    ("sjd", dict(draft_coupling="none")), ("sjd", dict(draft_coupling="gumbel")),
    ("gsd", dict(draft_coupling="gumbel")), ("lantern", dict(lantern_k=10, draft_coupling="gumbel")),
])  # not VVS: a batch shares its skipped steps (sampling/schedule.py)
def test_an_image_does_not_depend_on_its_batch(model, mode, extra):
    batch = decode(model, [3, 1, 4, 1], [21, 22, 23, 24], mode=mode, **extra)
    for b, (prompt, seed) in enumerate(zip([3, 1, 4, 1], [21, 22, 23, 24])):
        alone = decode(model, [prompt], [seed], mode=mode, **extra)
        assert torch.equal(alone.tokens[0], batch.tokens[b]), f"sample {b} differs from its solo run"


@pytest.mark.parametrize("mode,extra", [
    ("sjd", {}), ("gsd", {}), ("lantern", dict(lantern_k=10)), ("vvs", dict(lantern_k=10)),
    ("sjd", dict(draft_coupling="none")), ("gsd", dict(draft_coupling="none")),
    ("lantern", dict(lantern_k=10, draft_coupling="gumbel")), ("vvs", dict(lantern_k=10, draft_coupling="none")),
    ("sjd", dict(init="sample-above")), ("gsd", dict(init="random")),
    ("vvs", dict(lantern_k=10, schedule="similarity")),
])
def test_a_batch_of_one_decodes_the_same_with_its_lengths_on_the_host(model, mode, extra, monkeypatch):
    # a batch of one keeps its lengths as host numbers (engine.SCALAR_STEP); the batch's tensors give the same
    from spec_ar.sampling import engine
    taken = []
    commit = engine.SpeculativeDecoder._commit_on_host
    monkeypatch.setattr(engine.SpeculativeDecoder, "_commit_on_host",
                        lambda self, st, *a, **k: taken.append(st) or commit(self, st, *a, **k))
    for prompt, seed in [(3, 21), (1, 22), (4, 23)]:
        monkeypatch.setattr(engine, "SCALAR_STEP", True)
        host = decode(model, [prompt], [seed], mode=mode, **extra)
        st = taken[-1]  # its lengths, set as host numbers, read as the tensors they stand for
        assert (st.n_cached.tolist(), st.n_committed.tolist(), st.draft_end.tolist()) == \
               (st.host_cached, st.host_committed, st.host_draft_end)
        monkeypatch.setattr(engine, "SCALAR_STEP", False)
        tensors = decode(model, [prompt], [seed], mode=mode, **extra)
        assert torch.equal(host.tokens, tensors.tokens)
        a, b = host.reports[0], tensors.reports[0]
        assert (a.nfe, a.origins, a.accepted_length_histogram, a.skipped_verifications, a.draft_stability) == \
               (b.nfe, b.origins, b.accepted_length_histogram, b.skipped_verifications, b.draft_stability)
    assert taken, "the host numbers' path ran"


def test_seeds_change_the_image(model):
    a = decode(model, [0, 0], [1, 2], mode="sjd").tokens
    assert not torch.equal(a[0], a[1])
    assert torch.equal(decode(model, [0], 1, mode="sjd").tokens[0], a[0])


@pytest.mark.parametrize("mode", ["sjd", "gsd", "lantern"])
def test_coupled_residuals_drawn_for_every_row_or_for_picked_rows_are_the_same(model, mode, monkeypatch):
    # small windows draw the coupling's residuals for every row, large ones only for
    # the rows that need one: the same numbers either way, so batch size cannot matter
    from spec_ar.sampling import engine
    prompts, seeds = [0, 1, 2, 3], [5, 6, 7, 8]
    extra = dict(lantern_k=10) if mode == "lantern" else {}
    monkeypatch.setattr(engine, "DENSE_RESIDUAL", 0)
    picked = decode(model, prompts, seeds, mode=mode, **extra)
    monkeypatch.setattr(engine, "DENSE_RESIDUAL", 1 << 40)
    every = decode(model, prompts, seeds, mode=mode, **extra)
    assert torch.equal(picked.tokens, every.tokens)
    assert min(r.draft_stability for r in every.reports) < 1  # residuals were drawn
