"""How a verify step extends the drafts (``engine._extend_on_host``, ``JacobiDrafts.extend``): two
shortcuts that leave every token where it was.

* A skip due next has its extension drawn in the verify step's, past that one's stop with the skip
  step's numbers (``DecodeState.extend_uniform``): one extension a forward where there were two.
* An extension that starts right after the window's last row draws from that row as the pipeline
  left it, not from the ring's copy of it."""
from __future__ import annotations

import pytest
import torch

from spec_ar.loaders import embedded
from spec_ar.loaders.synthetic import SyntheticAdapter
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

PROMPTS = ["a red circle", "a blue square on a striped background", "a green star"]


@pytest.fixture(scope="module")
def models():
    return {"embedded": (embedded.load().adapter, PROMPTS),
            # an end-of-line token after every row: forced positions among the drafts
            "synthetic-eol": (SyntheticAdapter(rows=6, cols=6, end_of_line=True, seed=2), [1, 4, 7])}


def decode(adapter, conditions, config, seeds, patch=None):
    """The images, their reports and how many times the draft source extended the drafts."""
    decoder = SpeculativeDecoder(adapter, config)
    calls = []
    extend = decoder.drafter.extend
    decoder.drafter.extend = lambda st, *a: calls.append(a[2]) or extend(st, *a)
    if patch is not None:
        patch(decoder)
    return decoder.generate(conditions, seeds=seeds), len(calls)


def same(first, second):
    assert torch.equal(first.tokens, second.tokens)
    for a, b in zip(first.reports, second.reports):
        assert (a.nfe, a.origins, a.step_kinds, a.accepted_length_histogram) == (b.nfe, b.origins, b.step_kinds,
                                                                              b.accepted_length_histogram)
        assert a.draft_stability == pytest.approx(b.draft_stability)


def at_the_skip(decoder):
    """Every extension where it was drawn before: a skip's own after it."""
    decoder.drafter.extends_past_skip = lambda st: False


@pytest.mark.parametrize("family", ["embedded", "synthetic-eol"])
@pytest.mark.parametrize("config", [dict(mode="vvs", window=6, lantern_k=8), dict(mode="vvs", window=5, skip_interval=3, lantern_k=8),
                                    dict(mode="vvs", window=6, lantern_k=8, schedule="similarity", skip_threshold=0.0),
                                    dict(mode="vvs", window=6, lantern_k=8, draft_coupling="none"),  # random init
                                    dict(mode="sjd", window=6, schedule="uniform")])
def test_a_due_skips_extension_drawn_early_gives_the_same_images(models, family, config):
    adapter, conditions = models[family]
    seeds = [11, 12, 13]
    early, early_calls = decode(adapter, conditions, DecodeConfig(**config), seeds)
    late, late_calls = decode(adapter, conditions, DecodeConfig(**config), seeds, patch=at_the_skip)
    same(early, late)
    assert sum(r.skipped_verifications for r in early.reports), "no skip: nothing was drawn early"
    assert early_calls < late_calls  # the skips' extensions were drawn in the verify steps' ones


def test_a_skip_after_an_early_extension_extends_nothing(models):
    adapter, conditions = models["embedded"]
    decoder = SpeculativeDecoder(adapter, DecodeConfig(mode="vvs", window=6))
    widths, kinds = [], []
    extend = decoder.drafter.extend

    def counted(st, *a):
        widths.append(a[2])
        return extend(st, *a)

    decoder.drafter.extend = counted
    decoder.generate(conditions[:1], seeds=[3], callback=lambda e: kinds.append((e.kind, len(widths))))
    after_skips = [n for (k, n), (_, before) in zip(kinds[1:], kinds) if k == "S" and n > before]
    assert not after_skips  # no skip step called extend


def without_the_edge(decoder):
    """Every extension reads its source row from the ring."""
    after_verify = decoder.drafter.after_verify

    def forget(st, *a):
        after_verify(st, *a)
        st.source_state.pop("edge", None)

    decoder.drafter.after_verify = forget


@pytest.mark.parametrize("family", ["embedded", "synthetic-eol"])
@pytest.mark.parametrize("config", [dict(mode="sjd", window=6), dict(mode="gsd", window=6),
                                    dict(mode="lantern", window=6, lantern_k=4),
                                    dict(mode="sjd", window=6, draft_coupling="gumbel"),
                                    dict(mode="vvs", window=6, lantern_k=8)])
def test_an_extension_from_the_windows_edge_draws_what_the_ring_holds(models, family, config):
    adapter, conditions = models[family]
    seeds = [5, 6, 7]
    edge, _ = decode(adapter, conditions, DecodeConfig(**config), seeds)
    ring, _ = decode(adapter, conditions, DecodeConfig(**config), seeds, patch=without_the_edge)
    same(edge, ring)


def test_the_edge_is_read_where_the_window_ends(models):
    """On the embedded model's ``sjd`` most extensions start right after the window: their source row
    is the pipeline's, with no copy out of the ring."""
    adapter, conditions = models["embedded"]
    decoder = SpeculativeDecoder(adapter, DecodeConfig(mode="sjd", window=6))
    reads, extensions = [], []
    rows, extend = None, decoder.drafter.extend

    def counted(st, *a):
        nonlocal rows
        if rows is None:  # the state's ring reads, by buffer name
            rows = st.rows
            st.rows = lambda ring, slots, name, *r: reads.append(name) or rows(ring, slots, name, *r)
        extensions.append(1)
        return extend(st, *a)

    decoder.drafter.extend = counted
    decoder.generate(conditions[:1], seeds=[1])
    assert len(extensions) > 4
    assert reads.count("init") < len(extensions) / 2
