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
from spec_ar.sampling.state import DecodeState

PROMPTS = ["a red circle", "a blue square on a striped background", "a green star"]


@pytest.fixture(scope="module")
def models():
    return {"embedded": (embedded.load().adapter, PROMPTS),
            # an end-of-line token after every row: forced positions among the drafts
            "synthetic-eol": (SyntheticAdapter(rows=6, cols=6, end_of_line=True, seed=2), [1, 4, 7])}


def decode(adapter, conditions, config, seeds, patch=None):
    """The images and reports, how many times the draft source extended the drafts, and how many
    source rows its extensions copied out of the ring."""
    decoder = SpeculativeDecoder(adapter, config)
    calls, reads = [], []
    extend = decoder.drafter.extend
    decoder.drafter.extend = lambda st, *a: calls.append(a[2]) or extend(st, *a)
    if patch is not None:
        patch(decoder)
    rows = DecodeState.rows
    DecodeState.rows = lambda st, ring, slots, name, *r: reads.append(name) or rows(st, ring, slots, name, *r)
    try:
        return decoder.generate(conditions, seeds=seeds), len(calls), reads.count("init")
    finally:
        DecodeState.rows = rows


def unchanged_by(patch, family, models, config, seeds):
    """Decodes without and with ``patch``, which must not change an image or a report."""
    adapter, conditions = models[family]
    plain = decode(adapter, conditions, DecodeConfig(**config), seeds)
    patched = decode(adapter, conditions, DecodeConfig(**config), seeds, patch=patch)
    same(plain[0], patched[0])
    return plain, patched


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
    (early, early_calls, _), (_, late_calls, _) = unchanged_by(at_the_skip, family, models, config, [11, 12, 13])
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
    assert any(k == "S" for k, _ in kinds), "no skip step: nothing to check"
    after_skips = [n for (k, n), (_, before) in zip(kinds[1:], kinds) if k == "S" and n > before]
    assert not after_skips  # no skip step called extend


def without_the_edge(decoder):
    """Every extension reads its source row from the ring."""
    after_verify = decoder.drafter.after_verify

    def forget(st, *a):
        after_verify(st, *a)
        st.source_state.pop("edge", None)

    decoder.drafter.after_verify = forget


# (where an extension starts past the window, as under VVS, or a forced position may stand before it, the ring
# is read: those decodes take the other path alike)
@pytest.mark.parametrize("config", [dict(mode="sjd", window=6), dict(mode="gsd", window=6),
                                    dict(mode="lantern", window=6, lantern_k=4),
                                    dict(mode="sjd", window=6, draft_coupling="gumbel")])
def test_an_extension_from_the_windows_edge_draws_what_the_ring_holds(models, config):
    (_, calls, from_ring), (_, _, all_from_ring) = unchanged_by(without_the_edge, "embedded", models, config,
                                                                 [5, 6, 7])
    assert all_from_ring == calls  # (the patch did take the edge away)
    assert from_ring < calls / 2  # most extensions start at the window's edge and read it
