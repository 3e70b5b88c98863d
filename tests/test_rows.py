"""Row-parallel drafting (``sampling/rows.py``): the next image rows are drawn beside the
window from the part of the image that exists, and the window passes those tokens like
forced ones.  It is relaxed, and the chi-square check says so."""
from __future__ import annotations

import pytest
import torch

from spec_ar.loaders import embedded
from spec_ar.sampling import ConfigError, DecodeConfig, SpeculativeDecoder, TokenLayout
import spec_ar.sampling.engine as engine_module
from spec_ar.sampling.report import ORIGINS, ROW_DRAWN

from .fakes import TabularAdapter
from .test_exactness import CFG, TOP_K, chi_square


def two_rows(seed=3):
    """A tabular model whose 4 image tokens are two rows of two, an end-of-line token between."""
    m = TabularAdapter(image=3, length=5, forced=(2,), seed=seed)
    m.layout = TokenLayout.raster(2, 2, m.vocab_size, torch.arange(3), {2: m.eol}, row_stride=3, length=5)
    return m


def test_row_parallel_drafting_is_relaxed_by_the_chi_square_check():
    """Exact acceptance on the window does not make it exact: the second row's first token
    is drawn before the first row is finished.  Without it the same decode passes."""
    m = two_rows()
    exact = m.joint(1, CFG, TOP_K)
    for rows, relaxed in [(1, False), (2, True)]:
        config = DecodeConfig(mode="sjd", window=3, cfg_scale=CFG, top_k=TOP_K, rows=rows, row_lead=1)
        tokens = SpeculativeDecoder(m, config).generate([1] * 20_000, seeds=7_000_000).tokens
        assert (tokens[:, 2] == m.eol).all()
        pvalue, impossible = chi_square(exact, tokens)
        assert impossible == 0
        assert (pvalue < 1e-6) if relaxed else (pvalue > 1e-4), (rows, pvalue)


def test_a_lower_row_sees_the_committed_image_but_not_the_drafts_of_the_row_above():
    """The draw for position 3 (row 1, column 0) comes from a context where position 1 (row 0's
    unfinished column) reads as unknown: it equals the table's row for that context."""
    m = two_rows()
    seen = []
    orig = engine_module.draft_rows

    def spy(st, *a):
        rd = orig(st, *a)
        seen.append(rd)
        return rd

    engine_module.draft_rows = spy
    try:
        config = DecodeConfig(mode="sjd", window=3, cfg_scale=1.0, rows=2, row_lead=1)
        out = SpeculativeDecoder(m, config).generate([0], seeds=1)
    finally:
        engine_module.draft_rows = orig
    rd = seen[0]  # the first forward after the prefill: position 0 committed
    # row 1 may start (row 0 is known up to column 0, the lead is 1), with no drafts yet: the
    # draw is its column 0, from the node after the end-of-line (chain 1 starts at node 3)
    assert rd.active.tolist() == [[True]] and rd.known.tolist() == [[0]] and rd.drafts.tolist() == [[0]]
    node = 3
    assert int(rd.target[0, node]) == 3
    # it sees the committed (not yet cached) position 0 in the raster row's chain and its own
    # input, the forced end-of-line at position 2; not position 1, a draft
    assert rd.sees[0, node].nonzero().flatten().tolist() == [1, node]
    assert int(rd.depth[0, 1]) == 0 and int(rd.depth[0, node]) == 2 and int(rd.tokens[0, node]) == m.eol
    # what that node's logits are: the table at prefix (token 0, unknown -> 0, end-of-line)
    ref = m.conditional([int(out.tokens[0, 0]), 0, m.eol], 0, 1.0, None)
    m.prefill([0], None, False)
    m.hist[0, 0] = out.tokens[0, 0]
    m.lengths[:] = 1
    logits = m.forward_tree(rd.tokens[:, node:node + 1], None,
                            (torch.ones(1, 1, 1, dtype=torch.bool), rd.depth[:, node:node + 1] - 1))
    assert torch.allclose(torch.softmax(logits[0, 0, 0].double().masked_fill(torch.arange(4) == 3, float("-inf")), 0),
                          ref)


@pytest.fixture(scope="module")
def model():
    return embedded.load()


def decode_with_fixed(model, config, prompts, seeds):
    """Tokens, reports and the fixed tokens of a decode (read from its state), and the
    most columns one lower row fixed in one forward."""
    states, most = [], [0]
    orig_draft, orig_judge = engine_module.draft_rows, engine_module.judge_rows

    def spy(st, *a):
        states.append(st)
        return orig_draft(st, *a)

    def judged(*a):
        out = orig_judge(*a)
        most[0] = max(most[0], int(out.fix.view(out.fix.shape[0], -1, states[0].layout.row_stride).sum(-1).max()))
        return out

    engine_module.draft_rows, engine_module.judge_rows = spy, judged
    try:
        out = SpeculativeDecoder(model.adapter, config).generate(prompts, seeds=seeds)
    finally:
        engine_module.draft_rows, engine_module.judge_rows = orig_draft, orig_judge
    return out, states[0].fixed[:, : out.tokens.shape[1]], most[0]


def test_fixed_tokens_are_committed_as_drawn_and_save_forwards(model):
    prompts = ["a red circle", "a blue square on a striped background", "a green triangle", "a white star"]
    base = SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd", window=24)).generate(prompts, seeds=3)
    out, fixed, most = decode_with_fixed(model, DecodeConfig(mode="sjd", window=24, rows=8, row_lead=1), prompts, 3)
    on = fixed >= 0
    assert on.sum() > 100  # lower rows were drawn ...
    assert most > 1  # ... several columns of a row in one forward (its drafts stood) ...
    assert torch.equal(out.tokens[on], fixed[on])  # ... and they stand
    origins = torch.tensor([r.origins for r in out.reports])
    assert torch.equal(origins == ROW_DRAWN, on)  # the report says which
    assert "row-parallel" in ORIGINS[ROW_DRAWN]
    assert sum(r.nfe for r in out.reports) < sum(r.nfe for r in base.reports)


def test_an_image_does_not_depend_on_its_batch_with_row_parallel_drafts(model):
    config = DecodeConfig(mode="sjd", window=8, rows=3, row_lead=2)
    prompts = ["a red circle", "a blue square on a striped background"]
    both = SpeculativeDecoder(model.adapter, config).generate(prompts, seeds=[11, 12]).tokens
    alone = SpeculativeDecoder(model.adapter, config).generate(prompts[1:], seeds=[12]).tokens
    assert torch.equal(both[1:], alone)


def test_row_parallel_drafting_refuses_what_it_cannot_combine_with(model):
    with pytest.raises(ConfigError, match="proactive_K and rows_R both add tokens"):
        SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd", proactive=3, rows=2), surface="node")
    with pytest.raises(ConfigError, match=r"rows must be an integer in \[1, 16\]"):
        DecodeConfig(mode="sjd", rows=0).validate()
