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


def stream_test(adapter: TabularAdapter, tokens: torch.Tensor, cls: int, cfg=CFG, top_k=TOP_K, temperature=1.0):
    """``(p-value, number of sampled streams that have zero probability)``."""
    return chi_square(adapter.joint(cls, cfg, top_k, temperature), tokens)


def chi_square(exact: dict[tuple, float], tokens: torch.Tensor):
    """Sampled streams ``tokens`` against their ``exact`` joint (stream -> probability):
    ``(p-value, number of sampled streams that have zero probability)``."""
    counts: dict[tuple, int] = {}
    for row in map(tuple, tokens.tolist()):
        counts[row] = counts.get(row, 0) + 1
    impossible = sum(c for s, c in counts.items() if s not in exact)
    n = tokens.shape[0]
    # streams expected fewer than 5 times are pooled into one cell: single rare draws
    # would otherwise dominate the statistic, which is then no chi-square
    common = {s: p for s, p in exact.items() if n * p >= 5}
    cells = [(counts.get(s, 0), n * p) for s, p in common.items()]
    rare_p = 1.0 - sum(common.values())
    if rare_p * n >= 5:
        cells.append((sum(c for s, c in counts.items() if s in exact and s not in common), n * rare_p))
    chi2 = sum((c - e) ** 2 / e for c, e in cells)
    df = len(cells) - 1
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


# -- coupled drafting (MC-SJD) ------------------------------------------------------
COUPLED = {
    "window-2": dict(mode="sjd", window=2),
    "window-3": dict(mode="sjd", window=3),
    "window-16": dict(mode="sjd", window=16),
    "random": dict(mode="sjd", window=3, init="random"),
    "repeat-left": dict(mode="sjd", window=3, init="repeat-left"),
    "repeat-above": dict(mode="sjd", window=3, init="repeat-above"),
    "sample-left": dict(mode="sjd", window=3, init="sample-left"),
    "sample-above": dict(mode="sjd", window=4, init="sample-above"),
    "gsd-G1": dict(mode="gsd", window=3, group_size=1, gsd_delta=1.0),
    "lantern-delta0": dict(mode="lantern", window=3, lantern_k=2, lantern_delta=0.0),
}


@pytest.fixture(scope="module")
def long_model():
    """Seven positions (two forced), so drafts are redrawn pass after pass."""
    return TabularAdapter(image=3, length=7, forced=(2, 5), seed=11, spread=1.0)


@pytest.mark.parametrize("coupling", ["none", "maximal", "gumbel"])  # none: SJD as published
@pytest.mark.parametrize("name", list(COUPLED))
def test_coupled_drafts_follow_the_exact_joint(long_model, coupling, name):
    tokens = sample(long_model, {**COUPLED[name], "draft_coupling": coupling}, n=30_000, seed=3)
    assert (tokens[:, 2] == long_model.eol).all() and (tokens[:, 5] == long_model.eol).all()
    pvalue, impossible = stream_test(long_model, tokens, cls=1)
    assert impossible == 0 and pvalue > 1e-4


@pytest.mark.parametrize("drafting,seed", [(dict(draft_coupling="maximal"), 7), (dict(draft_coupling="gumbel"), 7),
                                           (dict(draft_coupling="none", proactive=3), 8),  # SJD-PAC as published
                                           (dict(draft_coupling="maximal", proactive=3), 8)])
def test_coupled_and_proactive_drafts_with_a_temperature_follow_the_exact_joint(long_model, drafting, seed):
    config = DecodeConfig(mode="sjd", window=4, cfg_scale=CFG, top_k=TOP_K, temperature=0.6, **drafting)
    tokens = SpeculativeDecoder(long_model, config).generate([0] * 30_000, seeds=seed * 1_000_000).tokens
    pvalue, impossible = stream_test(long_model, tokens, cls=0, temperature=0.6)
    assert impossible == 0 and pvalue > 1e-4


@pytest.mark.parametrize("drafting", [dict(draft_coupling="maximal"), dict(draft_coupling="gumbel"),
                                      # top-k 3 leaves room for alternatives
                                      dict(draft_coupling="none", proactive=3, top_k=3),
                                      dict(draft_coupling="maximal", proactive=3, top_k=3)])
def test_coupled_and_proactive_drafts_at_batch_one_follow_the_exact_joint(drafting):
    small = TabularAdapter(image=3, length=4, forced=(1,), seed=5)
    config = DecodeConfig(**{"mode": "sjd", "window": 3, "cfg_scale": CFG, "top_k": 2, **drafting})
    decoder = SpeculativeDecoder(small, config)
    tokens = torch.cat([decoder.generate([0], seeds=[s]).tokens for s in range(600)])
    pvalue, impossible = stream_test(small, tokens, cls=0, top_k=config.top_k)
    assert impossible == 0 and pvalue > 1e-4


@pytest.mark.parametrize("drafting", [dict(draft_coupling="maximal"), dict(draft_coupling="gumbel"), dict(proactive=3)])
@pytest.mark.parametrize("config", [
    dict(mode="gsd", window=3, group_size=4, gsd_delta=1.0),
    dict(mode="lantern", window=3, lantern_k=3, lantern_delta=1.0),
])
def test_the_check_still_rejects_biased_modes_on_coupled_and_proactive_drafts(config, drafting):
    peaked = TabularAdapter(seed=3, spread=4.0)
    tokens = sample(peaked, {**config, **drafting}, n=30_000, seed=2)
    pvalue, impossible = stream_test(peaked, tokens, cls=1)
    assert impossible > 0 or pvalue < 1e-6


def test_the_check_catches_a_kept_draft_verified_against_its_old_q(long_model):
    """The authors' Lumina/Janus schedulers keep ``q_old`` for a draft the coupling
    kept: its next acceptance ratio is then wrong, and the joint shows it."""
    from spec_ar.sampling.drafts import JacobiDrafts

    class OldQ(JacobiDrafts):
        def after_verify(self, st, probs, samples, first_new):
            pos = st.window_positions + 1
            before, old_q = st.seq.gather(1, pos), st.ring[st.batch_idx, pos % st.ring_size].clone()
            super().after_verify(st, probs, samples, first_new)
            kept = (st.seq.gather(1, pos) == before) & (pos < st.n_committed.unsqueeze(1) + 64)
            rows = torch.where(kept.unsqueeze(-1), old_q, probs)
            tail = st.arange(pos.shape[1]).unsqueeze(0) > first_new.unsqueeze(1)
            st.ring[st.batch_idx, pos % st.ring_size] = torch.where(tail.unsqueeze(-1), rows, probs)

    config = DecodeConfig(mode="sjd", window=4, cfg_scale=CFG, top_k=TOP_K)
    decoder = SpeculativeDecoder(long_model, config, drafter=OldQ("random", "maximal"))
    tokens = decoder.generate([1] * 60_000, seeds=9_000_000).tokens
    pvalue, impossible = stream_test(long_model, tokens, cls=1)
    assert impossible > 0 or pvalue < 1e-6


# -- proactive drafting (SJD-PAC) ----------------------------------------------------
PROACTIVE = {
    "K2": dict(mode="sjd", window=4, proactive=2),
    "K3-D3": dict(mode="sjd", window=4, proactive=3, proactive_depth=3),
    "K2-D4-sample-left": dict(mode="sjd", window=5, proactive=2, proactive_depth=4, init="sample-left"),
    "gsd-G1": dict(mode="gsd", window=4, proactive=3, group_size=1, gsd_delta=1.0),
    "lantern-delta0": dict(mode="lantern", window=4, proactive=3, lantern_k=2, lantern_delta=0.0),
}


@pytest.mark.parametrize("coupling", ["none", "maximal", "gumbel"])  # none: SJD-PAC as published
@pytest.mark.parametrize("name", list(PROACTIVE))
def test_proactive_drafts_follow_the_exact_joint(long_model, coupling, name):
    tokens = sample(long_model, {**PROACTIVE[name], "draft_coupling": coupling}, n=30_000, seed=4)
    assert (tokens[:, 2] == long_model.eol).all() and (tokens[:, 5] == long_model.eol).all()
    pvalue, impossible = stream_test(long_model, tokens, cls=1)
    assert impossible == 0 and pvalue > 1e-4


def test_the_check_catches_alternatives_picked_but_tested_as_drawn(long_model, monkeypatch):
    """An alternative must be a draw from the ``q`` it is tested against: the likeliest
    token after the window's draft, tested as if drawn, biases the joint, and the check
    shows it (the authors' code tests residual draws against ``q``, the same kind of bias)."""
    from spec_ar.sampling import proactive, rng

    real = rng.uniform
    monkeypatch.setattr(proactive.rng, "uniform", lambda keys, step, stream, positions, lanes=1: (
        torch.full(positions.shape, 0.5) if stream == rng.PROACTIVE else real(keys, step, stream, positions, lanes)))
    tokens = sample(long_model, dict(mode="sjd", window=4, proactive=2, draft_coupling="none"), n=60_000, seed=6)
    pvalue, impossible = stream_test(long_model, tokens, cls=1)
    assert impossible > 0 or pvalue < 1e-6


def test_proactive_drafting_commits_alternatives(long_model, monkeypatch):
    """The tree is used: some walks leave the window's drafts and commit an alternative."""
    from spec_ar.sampling import proactive

    seen = []
    real = proactive.walk

    def spy(*args):
        out = real(*args)
        path, counts, new, rejected, on_spine = out
        seen.append(int(((~on_spine) & (counts > 1) & (path[:, 1] > args[0].levels)).sum()))
        return out

    monkeypatch.setattr(proactive, "walk", spy)
    sample(long_model, dict(mode="sjd", window=4, proactive=3), n=2_000, seed=7)
    assert sum(seen) > 0


def test_an_image_does_not_depend_on_its_batch_with_proactive_drafts(long_model):
    # near its end a sample alone scores a shorter window, so its tree has fewer levels
    config = DecodeConfig(mode="sjd", window=5, proactive=2, proactive_depth=4, cfg_scale=CFG, top_k=TOP_K)
    decoder = SpeculativeDecoder(long_model, config)
    seeds = list(range(200))
    batch = decoder.generate([1] * len(seeds), seeds=seeds).tokens
    alone = torch.cat([decoder.generate([1], seeds=[s]).tokens for s in seeds])
    assert torch.equal(batch, alone)


# -- a real model: Liquid's adapter on a tiny random Gemma -------------------------------------------------
def liquid_joint(adapter, prompt: str, cfg: float, top_k: int) -> dict[tuple, float]:
    """The exact distribution of every stream of ``adapter``'s (short) layout under CFG and top-k, from full
    forwards of each prefix (no cache): the reference's arithmetic, enumerated."""
    model, n = adapter.model, adapter.layout.length
    cond, uncond = adapter.prompt_ids(prompt), adapter.unconditional_ids()
    image = adapter.image_ids
    out = {}

    def grow(prefix: list[int], p: float):
        if len(prefix) == n:
            out[tuple(prefix)] = p
            return
        with torch.no_grad():
            lc = model(input_ids=torch.tensor([cond + prefix])).logits[0, -1, image].double()
            lu = model(input_ids=torch.tensor([uncond + prefix])).logits[0, -1, image].double()
        mixed = lu + cfg * (lc - lu)
        top = mixed.topk(top_k)
        probs = top.values.softmax(0)
        for token, q in zip(image[top.indices].tolist(), probs.tolist()):
            grow(prefix + [token], p * q)

    grow([], 1.0)
    return out


LIQUID_CASES = {"sjd": (dict(mode="sjd"), True), "ar": (dict(mode="ar"), True),
                "gsd-G3": (dict(mode="gsd", group_size=3, gsd_delta=1.0), False)}  # relaxed: the control


@pytest.mark.parametrize("name", list(LIQUID_CASES))
def test_a_real_adapter_samples_the_exact_joint(tmp_path_factory, name):
    """Liquid's adapter (a new family: its prompt rows, its cache and guidance) on a 1 x 3 grid: SJD's
    streams follow the enumerated joint, as ``ar``'s do; GSD's grouped acceptance fails the same check."""
    from spec_ar.loaders.detect import load_model
    from spec_ar.loaders.liquid import LiquidAdapter

    from .liquid_files import write_liquid

    settings, exact_mode = LIQUID_CASES[name]
    loaded = load_model(write_liquid(tmp_path_factory.mktemp("liquid-exact") / "Liquid"))
    adapter = LiquidAdapter(loaded.adapter.model, loaded.adapter.tokenizer, grid=(1, 3))
    exact = liquid_joint(adapter, "a red fox", cfg=7.0, top_k=3)
    config = DecodeConfig(window=3, cfg_scale=7.0, top_k=3, temperature=1.0, top_p=1.0, **settings)
    decoder = SpeculativeDecoder(adapter, config)
    tokens = torch.cat([decoder.generate(["a red fox"] * 500, seeds=chunk * 1000).tokens for chunk in range(6)])
    pvalue, impossible = chi_square(exact, tokens)
    if exact_mode:
        assert impossible == 0 and pvalue > 1e-4, (pvalue, impossible)
        assert len(set(map(tuple, tokens.tolist()))) > 10  # many streams: the test can tell
    else:
        assert impossible > 0 or pvalue < 1e-6, (pvalue, impossible)


# -- a scale per position: Lumina-mGPT 2.0's adapter, its guidance varying along the stream ----------------
def scheduled_joint(adapter, prompt: str, scales: list[float], top_k: int, temperature: float) -> dict[tuple, float]:
    """The exact distribution of every stream of ``adapter``'s short layout, forced tokens included, with the
    guidance scale ``scales[i]`` at stream position ``i``, from full forwards of each prefix (no cache)."""
    model, lay = adapter.model, adapter.layout
    cond, uncond = adapter.prompt_ids(prompt), adapter.unconditional_ids()
    image = adapter.image_ids
    out = {}

    def grow(prefix: list[int], p: float):
        i = len(prefix)
        if i == lay.length:
            out[tuple(prefix)] = p
            return
        if lay.forced[i] >= 0:
            return grow(prefix + [int(lay.forced[i])], p)
        with torch.no_grad():
            lc = model(input_ids=torch.tensor([cond + prefix])).logits[0, -1, image].double()
            lu = model(input_ids=torch.tensor([uncond + prefix])).logits[0, -1, image].double()
        top = ((lu + scales[i] * (lc - lu)) / temperature).topk(top_k)
        for token, q in zip(image[top.indices].tolist(), top.values.softmax(0).tolist()):
            grow(prefix + [token], p * q)

    grow([], 1.0)
    return out


def test_a_scale_per_position_is_verified_at_each_position(tmp_path_factory):
    """Lumina-mGPT 2.0's adapter on a 2 x 2 grid (size tokens, row ends and the image end forced) with a
    guidance scale that changes from position to position: SJD's streams follow the joint enumerated with each
    position's own scale, and fail against the joint of one constant scale (the control, on the same streams)."""
    from spec_ar.loaders.detect import load_model
    from spec_ar.loaders.lumina2 import Lumina2Adapter

    from .lumina2_files import write_lumina2

    loaded = load_model(write_lumina2(tmp_path_factory.mktemp("lumina2-exact") / "Lumina"), width=64, height=64)
    base = loaded.adapter
    adapter = Lumina2Adapter(base.model, base.tokenizer, 16, 16, 16384, masked=base.masked)
    scales = [1.0, 1.0, 3.0, 1.2, 1.0, 2.5, 0.8, 1.0, 1.0]  # per stream position (forced ones: unused)
    assert adapter.layout.length == len(scales)
    adapter.guidance_scales = lambda scale: torch.tensor(scales)
    config = DecodeConfig(mode="sjd", window=4, cfg_scale=2.0, top_k=3, temperature=30.0, top_p=1.0)
    decoder = SpeculativeDecoder(adapter, config)
    # batches of 100: each sample's decoding state holds its window's 172,032-wide distributions
    tokens = torch.cat([decoder.generate(["a red fox"] * 100, seeds=chunk * 1000).tokens for chunk in range(12)])
    assert len(set(map(tuple, tokens.tolist()))) > 10  # many streams: the test can tell
    # a high temperature: the tiny model's logits are peaked, and the test needs many streams to tell
    exact = scheduled_joint(adapter, "a red fox", scales, top_k=3, temperature=30.0)
    pvalue, impossible = chi_square(exact, tokens)
    assert impossible == 0 and pvalue > 1e-4, (pvalue, impossible)
    constant = scheduled_joint(adapter, "a red fox", [2.0] * len(scales), top_k=3, temperature=30.0)
    pvalue, impossible = chi_square(constant, tokens)
    assert impossible > 0 or pvalue < 1e-6, (pvalue, impossible)


# -- a release's repetition penalty: SimpleAR's adapter, the penalty over each position's own prefix --------
def penalised_joint(adapter, prompt: str, cfg: float, top_k: int, temperature: float, penalty: float):
    """The exact distribution of every stream of ``adapter``'s short layout as the authors' ``generate`` gives it:
    full forwards of each prefix (no cache), transformers' own ``RepetitionPenaltyLogitsProcessor`` on the
    conditional logits over the prompt and the prefix (``penalty`` 1: none), then guidance, temperature, top-k."""
    from transformers import RepetitionPenaltyLogitsProcessor

    model, n = adapter.model, adapter.layout.length
    cond, uncond = adapter.prompt_ids(prompt), adapter.unconditional_ids()
    image = adapter.image_ids
    out = {}

    def grow(prefix: list[int], p: float):
        if len(prefix) == n:
            out[tuple(prefix)] = p
            return
        with torch.no_grad():
            lc = model(input_ids=torch.tensor([cond + prefix])).logits[:, -1].float()
            if penalty != 1:
                lc = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([cond + prefix]), lc)
            lc = lc[0, image].double()
            lu = model(input_ids=torch.tensor([uncond + prefix])).logits[0, -1, image].double()
        top = ((lu + cfg * (lc - lu)) / temperature).topk(top_k)
        for token, q in zip(image[top.indices].tolist(), top.values.softmax(0).tolist()):
            grow(prefix + [token], p * q)

    grow([], 1.0)
    return out


PENALISED = {"ar": dict(mode="ar"), "sjd": dict(mode="sjd"), "sjd-independent": dict(mode="sjd", draft_coupling="none"),
             "proactive": dict(mode="sjd", proactive=3)}


@pytest.fixture(scope="module")
def few_codes(tmp_path_factory):
    """A tiny SimpleAR with 8 image codes (repeats are frequent), without its decoder."""
    from spec_ar.loaders import simplear

    from .simplear_files import write_simplear

    return simplear.load_model(write_simplear(tmp_path_factory.mktemp("simplear-exact") / "SimpleAR", codes=8,
                                              decoder=False))


@pytest.mark.parametrize("name", list(PENALISED))
def test_a_release_repetition_penalty_is_verified_over_each_positions_own_prefix(few_codes, name, monkeypatch):
    """SimpleAR's adapter with a release's repetition penalty (``generation_config.RepetitionPenalty``) on a 1 x 3
    grid of 8 codes: the streams follow the joint enumerated with transformers' processor applied at each position
    over its own prefix (a window's rows see the drafts before them, a proactive tree's nodes their ancestors), and
    fail against the unpenalised joint (the control, on the same streams)."""
    from spec_ar.loaders import generation_config
    from spec_ar.loaders.simplear import SimpleARAdapter

    trees = []
    tree = generation_config.RepetitionPenalty.tree
    monkeypatch.setattr(generation_config.RepetitionPenalty, "tree",
                        lambda self, *a, **k: trees.append(1) or tree(self, *a, **k))
    model, tokenizer = few_codes
    adapter = SimpleARAdapter(model, tokenizer, 48, 16)
    adapter.repeats = generation_config.RepetitionPenalty(2.0)  # as a release's repetition_penalty 2.0 sets it
    cfg, top_k, temperature = 6.0, 3, 100.0  # a high temperature: the tiny model's logits are peaked
    config = DecodeConfig(window=3, cfg_scale=cfg, top_k=top_k, temperature=temperature, top_p=1.0, **PENALISED[name])
    decoder = SpeculativeDecoder(adapter, config)
    tokens = torch.cat([decoder.generate(["a red fox"] * 250, seeds=chunk * 1000).tokens for chunk in range(6)])
    assert len(set(map(tuple, tokens.tolist()))) > 10  # many streams: the test can tell
    pvalue, impossible = chi_square(penalised_joint(adapter, "a red fox", cfg, top_k, temperature, 2.0), tokens)
    assert impossible == 0 and pvalue > 1e-4, (pvalue, impossible)
    pvalue, impossible = chi_square(penalised_joint(adapter, "a red fox", cfg, top_k, temperature, 1.0), tokens)
    assert impossible > 0 or pvalue < 1e-6, (pvalue, impossible)
    assert bool(trees) == (name == "proactive")  # the tree's nodes were penalised over their own ancestors


# -- guidance in log-softmax space: Emu3.5's adapter, its row token and image end forced -------------------------
def log_softmax_joint(adapter, prompt: str, cfg: float, top_k: int, temperature: float) -> dict[tuple, float]:
    """The exact distribution of every stream of ``adapter``'s short layout as Emu3.5's logits processor makes it:
    full forwards of each prefix (no cache) over the whole vocabulary, ``log_softmax`` of each branch, ``cfg (c - u)
    + u``, every id but the visual tokens masked, then temperature and top-k; forced tokens as they are."""
    model, lay = adapter.model, adapter.layout
    cond, uncond = adapter.prompt_ids(prompt), adapter.unconditional_ids()
    visual = lay.image_tokens.nonzero().flatten()
    out = {}

    def grow(prefix: list[int], p: float):
        i = len(prefix)
        if i == lay.length:
            out[tuple(prefix)] = p
            return
        if lay.forced[i] >= 0:
            return grow(prefix + [int(lay.forced[i])], p)
        with torch.no_grad():
            lc = model(input_ids=torch.tensor([cond + prefix])).logits[0, -1].double().log_softmax(-1)
            lu = model(input_ids=torch.tensor([uncond + prefix])).logits[0, -1].double().log_softmax(-1)
        top = ((cfg * (lc - lu) + lu)[visual] / temperature).topk(top_k)
        for token, q in zip(visual[top.indices].tolist(), top.values.softmax(0).tolist()):
            grow(prefix + [token], p * q)

    grow([], 1.0)
    return out


@pytest.fixture(scope="module")
def emu35_tiny(tmp_path_factory):
    """A tiny Emu3.5 (its model and BAAI's tokenizer), without its vision tokenizer."""
    from spec_ar.loaders import emu35

    from .emu35_files import write_emu35

    return emu35.load_model(write_emu35(tmp_path_factory.mktemp("emu35-exact") / "Emu3.5-Image", vision=False))


EMU35_CASES = {"ar": dict(mode="ar"), "sjd": dict(mode="sjd"), "proactive": dict(mode="sjd", proactive=3)}


@pytest.mark.parametrize("name", list(EMU35_CASES))
def test_guidance_in_log_softmax_space_is_verified_exactly(emu35_tiny, name):
    """Emu3.5's adapter on a 2 x 2 grid (``c c <|extra_200|> c c <|image end|>``) under its guidance, the authors'
    log-softmax mix of scale 5 over the visual tokens: the streams follow the joint enumerated with the authors'
    arithmetic, and fail against the joint without guidance (the control, on the same streams)."""
    from spec_ar.loaders.emu35 import Emu35Adapter

    model, tokenizer = emu35_tiny
    adapter = Emu35Adapter(model, tokenizer, 2, 2)
    assert adapter.layout.length == 6 and adapter.guidance == "log_softmax"
    cfg, top_k, temperature = 5.0, 3, 40.0  # a high temperature: the tiny model's mixed logits are peaked
    config = DecodeConfig(window=3, cfg_scale=cfg, top_k=top_k, temperature=temperature, top_p=1.0,
                          **EMU35_CASES[name])
    decoder = SpeculativeDecoder(adapter, config)
    tokens = torch.cat([decoder.generate(["a red fox"] * 250, seeds=chunk * 1000).tokens for chunk in range(6)])
    assert len(set(map(tuple, tokens.tolist()))) > 10  # many streams: the test can tell
    pvalue, impossible = chi_square(log_softmax_joint(adapter, "a red fox", cfg, top_k, temperature), tokens)
    assert impossible == 0 and pvalue > 1e-4, (pvalue, impossible)
    pvalue, impossible = chi_square(log_softmax_joint(adapter, "a red fox", 1.0, top_k, temperature), tokens)
    assert impossible > 0 or pvalue < 1e-6, (pvalue, impossible)
