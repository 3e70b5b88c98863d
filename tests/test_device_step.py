"""The verify step on the device (``sampling/engine.py``, ``device_step``): acceptance, the commit
of each image's accepted prefix, redrawn drafts, the cache's rollback and the new drafts stay device
tensors, and the host reads the lengths every ``READ_EVERY`` steps.  The tokens are the host step's
for every mode and drafting kind it takes and every family's tiny model; it samples the exact joint;
the whole step, forward included, compiles as one graph, where the host step's read breaks it."""
from __future__ import annotations

import contextlib

import pytest
import torch

from spec_ar.loaders.detect import load_model
from spec_ar.sampling import ConfigError, DecodeConfig, HeadDrafts, SpeculativeDecoder
from spec_ar.sampling import engine

from .emu35_files import write_emu35
from .glm_image_files import write_glm_image
from .test_exactness import chi_square
from .tiny_families import conditions, enumerable_llamagen, exact_joint, tiny_families


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    d = tmp_path_factory.mktemp("device-step")
    return {**tiny_families(d), "emu3.5": load_model(write_emu35(d / "Emu3.5-Image"), width=64, height=48),
            "glm-image": load_model(write_glm_image(d / "GLM-Image"), width=96, height=64)}


def decode(model, config, device_step, path="eager", seeds=(4, 5), callback=None, drafter=None):
    ad = model.adapter
    ad.decode_path, ad.cache = path, None
    try:
        decoder = SpeculativeDecoder(ad, config, device_step=device_step, drafter=drafter)
        return decoder.generate(conditions(model)[: len(seeds)], seeds=list(seeds), callback=callback)
    finally:
        ad.decode_path, ad.cache = "eager", None


MODES = {"ar": dict(mode="ar"), "sjd": dict(mode="sjd", window=6), "gsd": dict(mode="gsd", window=6),
         "lantern": dict(mode="lantern", window=6, lantern_k=4),
         "sjd-independent": dict(mode="sjd", window=6, draft_coupling="none"),
         "sjd-random-init": dict(mode="sjd", window=6, init="random", draft_coupling="none"),
         "sjd-repeat-above": dict(mode="sjd", window=6, init="repeat-above"),
         "gsd-independent": dict(mode="gsd", window=6, draft_coupling="none"),
         "sjd-window-1": dict(mode="sjd", window=1), "sjd-gumbel": dict(mode="sjd", window=6, draft_coupling="gumbel"),
         "vvs": dict(mode="vvs", window=6, lantern_k=4),
         "sjd-proactive": dict(mode="sjd", window=6, proactive=3),
         "sjd-rows": dict(mode="sjd", window=6, rows=3, row_lead=2)}
#: on a few families only: the same parts as above, combined otherwise
MORE = {"lantern-gumbel": dict(mode="lantern", window=6, lantern_k=4, draft_coupling="gumbel"),
        "vvs-interval-3": dict(mode="vvs", window=6, lantern_k=4, skip_interval=3),
        "sjd-uniform-skips": dict(mode="sjd", window=6, schedule="uniform"),
        "vvs-proactive": dict(mode="vvs", window=6, lantern_k=4, proactive=2),
        "lantern-rows": dict(mode="lantern", window=6, lantern_k=4, rows=2, row_lead=3)}
CHEAP = ["embedded", "llamagen-c2i", "llamagen-t2i", "janus", "lumina", "emu3"]  # anole, liquid: 1025, 1024 positions
OTHERS = [("anole", "sjd"), ("liquid", "lantern"), ("lumina2", "sjd"), ("lumina2", "gsd-independent"),
          ("simplear", "sjd"), ("simplear", "lantern"), ("simplear", "sjd-proactive"), ("simplear", "sjd-rows"), ("emu3.5", "sjd"), ("emu3.5", "gsd"),
          ("glm-image", "sjd"), ("glm-image", "sjd-independent"), ("emu3.5", "vvs")] + [
          (f, m) for f in ("embedded", "llamagen-t2i") for m in MORE]


@pytest.mark.parametrize("family,mode", [(f, m) for f in CHEAP for m in MODES] + OTHERS)
def test_the_step_on_the_device_gives_the_host_steps_tokens(families, family, mode):
    model = families[family]
    # the tiny SimpleAR under its guidance of 6 is all but deterministic and its Jacobi drafts never land;
    # the tiny GLM-Image's land at a lower temperature
    config = DecodeConfig(**{**MODES, **MORE}[mode], **{"simplear": {"cfg_scale": 1.0}, "glm-image": {"temperature": 0.5}}.get(
        family, {}))
    host = decode(model, config, device_step=False)
    device = decode(model, config, device_step=True)
    assert torch.equal(device.tokens, host.tokens)
    assert [r.nfe for r in device.reports] == [r.nfe for r in host.reports]
    assert [r.origins for r in device.reports] == [r.origins for r in host.reports]
    if mode != "ar":  # not vacuous: windows were partly rejected, and the two images took different steps
        assert any(r.nfe < r.tokens for r in host.reports)
    if config.verify_schedule == "uniform":  # skipped verifications, at the same steps
        assert "S" in host.reports[0].step_kinds and device.reports[0].step_kinds == host.reports[0].step_kinds
        assert [r.unverified_tokens for r in device.reports] == [r.unverified_tokens for r in host.reports]
        if family != "janus":  # (the tiny Janus's windows take its 16 tokens whole: nothing left to skip)
            assert any(r.unverified_tokens for r in host.reports)


# -- draft heads --------------------------------------------------------------------------------
#: chains (VVS: with its uniform skips, which the head reads through with stale features) and trees
HEAD_MODES = {"sjd": dict(mode="sjd", depth=4), "lantern": dict(mode="lantern", depth=4, lantern_k=4),
              "vvs": dict(mode="vvs", depth=4, lantern_k=4),
              "dynamic": dict(mode="sjd", depth=3, tree="dynamic", tree_top_k=3, tree_tokens=8),
              "static": dict(mode="sjd", depth=3, tree="static", tree_top_k=3, tree_tokens=7),
              "sampled": dict(mode="gsd", depth=3, tree="sampled", tree_top_k=3, tree_tokens=7)}


def random_head(adapter, seed=0):
    """A draft head with random weights for ``adapter``'s features and ids (1D positions)."""
    from spec_ar.loaders import draft_head

    torch.manual_seed(seed)
    H = adapter.feature_size
    head = draft_head.DraftHead(draft_head.HeadSpec(hidden=H, heads=2, kv_heads=2, intermediate=2 * H, layers=1,
                                                    vocab=adapter.vocab_size))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.5 / H ** 0.5)
    return HeadDrafts(head.eval(), "random head")


def same_tokens_with_a_drafter(model, config, drafter):
    host = decode(model, config, device_step=False, drafter=drafter)
    device = decode(model, config, device_step=True, drafter=drafter)
    assert torch.equal(device.tokens, host.tokens)
    assert [r.nfe for r in device.reports] == [r.nfe for r in host.reports]
    assert [r.origins for r in device.reports] == [r.origins for r in host.reports]
    return host


@pytest.mark.parametrize("drafter,mode", [("embedded", "sjd"), ("embedded", "vvs"), ("embedded", "dynamic"),
                                          ("embedded-sibling", "sjd"), ("embedded-sibling", "vvs")])
def test_the_shipped_head_and_siblings_drafts_on_the_device_give_the_host_steps_tokens(families, drafter, mode):
    """The embedded model's shipped draft head (chains, a tree) and its sibling draft model."""
    from spec_ar.loaders.detect import load_drafter

    model = families["embedded"]
    config = DecodeConfig(**HEAD_MODES[mode])
    host = same_tokens_with_a_drafter(model, config, load_drafter(drafter, model))
    counts = [r.origin_counts() for r in host.reports]
    assert any(c["accepted draft"] for c in counts) and any(c["resampled after a rejection"] for c in counts)
    if config.verify_schedule == "uniform":
        assert all(c["committed without verification (VVS skip)"] for c in counts)


@pytest.mark.parametrize("family,mode", [(f, m) for f in ("janus", "lumina", "emu3", "lumina2") for m in ("sjd", "dynamic")]
                         + [("llamagen-c2i", "sjd"), ("llamagen-c2i", "lantern"), ("llamagen-c2i", "vvs"),
                            ("emu3", "static"), ("janus", "sampled"), ("lumina", "lantern"), ("emu3", "vvs")])
def test_a_heads_drafts_on_the_device_give_the_host_steps_tokens_on_every_family(families, family, mode):
    model = families[family]
    host = same_tokens_with_a_drafter(model, DecodeConfig(**HEAD_MODES[mode]), random_head(model.adapter))
    assert any(r.nfe < r.tokens for r in host.reports)  # drafts were accepted


@pytest.mark.parametrize("family,resolution", [("llamagen-c2i", 128), ("emu3", 64)])
def test_a_draft_models_drafts_on_the_device_give_the_host_steps_tokens_on_other_families(families, family,
                                                                                          resolution):
    from spec_ar.sampling.model_drafts import ModelDrafts

    model = families[family]
    drafter = ModelDrafts(model.resize(resolution).adapter, "a copy of the target")  # its own cache
    for mode in ("sjd", "vvs"):
        host = same_tokens_with_a_drafter(model, DecodeConfig(**HEAD_MODES[mode]), drafter)
        assert all(r.nfe < r.tokens for r in host.reports)


@pytest.mark.parametrize("mode", ["sjd", "lantern"])
def test_the_static_path_too(families, mode):
    model = families["janus"]
    config = DecodeConfig(**MODES[mode])
    host = decode(model, config, device_step=False, path="static")
    assert torch.equal(decode(model, config, device_step=True, path="static").tokens, host.tokens)


def test_the_host_reads_every_few_steps_and_every_step_once_the_batch_could_end(families, monkeypatch):
    """Reads every READ_EVERY steps (the callback sees those), and every step once the slowest
    image could have ended (its last read length plus a full window a step since), so no
    forward is spent past the end; an image that ends first rides along as on the host step."""
    model = families["embedded"]
    reads, seen = [], []
    original = engine.SpeculativeDecoder._read
    monkeypatch.setattr(engine.SpeculativeDecoder, "_read", lambda self, st: (reads.append(st.step),
                                                                             original(self, st))[1])
    config = DecodeConfig(mode="sjd", window=6)
    result = decode(model, config, device_step=True, callback=lambda e: seen.append((e.step, e.kind)))
    every = engine.READ_EVERY
    steps = [s for s, k in seen if k != "P"]
    assert reads == steps
    spaced = [b - a for a, b in zip([0] + steps, steps)]
    assert set(spaced) <= set(range(1, every + 1)) and spaced.count(every) >= 2
    assert steps[-1] == max(r.nfe for r in result.reports) - 1  # the last forward ended the decode
    assert len(steps) < steps[-1] / 2
    assert min(r.nfe for r in result.reports) < max(r.nfe for r in result.reports)  # one ended first


def test_at_batch_one_the_host_reads_far_less_than_once_a_step(families, monkeypatch):
    """At batch 1 the device step syncs far less often than once per step: the KV cache reads its
    lengths only where their bounds would round to another bucket of keys."""
    model = families["embedded"]
    syncs = []
    from spec_ar.loaders import static_cache

    original = static_cache.StaticKV.sync_host
    monkeypatch.setattr(static_cache.StaticKV, "sync_host",
                        lambda self: (syncs.append(self.bounded), original(self))[1])
    result = decode(model, DecodeConfig(mode="sjd", window=6), device_step=True, seeds=(4,))
    forwards = result.reports[0].nfe - 1
    reads = sum(syncs)  # the engine's reads find bounds to make exact; a sync of exact lengths reads nothing
    print(f"{reads} reads of the cache's lengths in {forwards} verify steps")
    assert 0 < reads <= forwards // 2


@pytest.mark.parametrize("config,why", [
    (dict(mode="vvs", window=6, schedule="similarity"), "'similarity' schedule decides its skips on the host"),
])
def test_what_needs_the_host_is_named_and_runs_there_on_auto(families, config, why):
    ad = families["embedded"].adapter
    with pytest.raises(ConfigError, match=f"the step cannot stay on the device: .*{why}"):
        SpeculativeDecoder(ad, DecodeConfig(**config), device_step=True)
    decoder = SpeculativeDecoder(ad, DecodeConfig(**config))  # auto: the host step
    assert decoder.device_step_blocker and not decoder._steps_on_device(None)


def test_a_draft_model_that_rolls_back_on_the_host_and_a_skipped_tree_are_named_too(families):
    from spec_ar.loaders.detect import load_drafter
    from spec_ar.sampling.model_drafts import ModelDrafts

    model = families["embedded"]
    sibling = load_drafter("embedded-sibling", model).adapter
    with pytest.raises(ConfigError, match="the step cannot stay on the device: the .* drafts from lengths read"):
        SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd", depth=3), device_step=True,
                           drafter=ModelDrafts(HostRollbacks(sibling)))
    with pytest.raises(ConfigError, match="the step cannot stay on the device: a skipping schedule decides on the "
                                          "host whether the batch commits a draft tree's path"):
        SpeculativeDecoder(model.adapter, DecodeConfig(mode="vvs", depth=3, tree="dynamic"),
                           drafter=load_drafter("embedded", model), device_step=True)


class HostRollbacks:
    """An adapter as one that rolls its cache back by host lists only."""

    rolls_back_on_device = False

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_on_auto_the_step_stays_on_the_device_on_cuda_only(families):
    decoder = SpeculativeDecoder(families["embedded"].adapter, DecodeConfig(mode="sjd", window=6))
    assert decoder.device_step_blocker is None
    assert decoder._steps_on_device(None) is False  # this adapter is on the CPU
    assert SpeculativeDecoder(families["embedded"].adapter, DecodeConfig(mode="sjd", window=6),
                              device_step=True)._steps_on_device("a trial") is False  # the window on auto times steps


def test_a_non_finite_distribution_is_named_at_its_own_step(families):
    from spec_ar.sampling.checks import NonFiniteError

    model = families["embedded"]
    ad = model.adapter
    forward = type(ad).forward
    calls = []

    def poisoned(self, tokens):
        logits = forward(self, tokens)
        calls.append(1)
        if len(calls) == 3:  # the third verify step's first row
            logits[:, :, 0] = float("nan")
        return logits

    type(ad).forward = poisoned
    try:
        for device_step in (False, True):
            calls.clear()
            with pytest.raises(NonFiniteError) as err:
                decode(model, DecodeConfig(mode="sjd", window=6), device_step=device_step)
            assert err.value.step == 3 and err.value.sample == 0
            assert len(calls) == (3 if not device_step else engine.READ_EVERY)  # found at the next read
            assert err.value.position > 0
    finally:
        type(ad).forward = forward


# -- exactness ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def enumerable():
    return enumerable_llamagen()


@pytest.mark.parametrize("config", [dict(mode="sjd", window=3), dict(mode="sjd", window=3, draft_coupling="none"),
                                    dict(mode="sjd", window=3, draft_coupling="gumbel"),
                                    dict(mode="sjd", window=3, proactive=2)])
def test_the_step_on_the_device_samples_the_exact_joint(enumerable, config):
    settings = dict(cfg_scale=2.0, top_k=2, **config)
    exact = exact_joint(enumerable, settings)
    decoder = SpeculativeDecoder(enumerable, DecodeConfig(**settings), device_step=True)
    tokens = torch.cat([decoder.generate([1] * 1000, seeds=b * 1000).tokens for b in range(12)])
    pvalue, impossible = chi_square(exact, tokens)
    assert impossible == 0
    assert pvalue > 1e-4


@pytest.mark.parametrize("tree", ["chain", "dynamic", "sampled"])
def test_draft_head_drafts_on_the_device_sample_the_exact_joint(enumerable, tree):
    from .test_head_drafts import tabular_head

    settings = dict(cfg_scale=2.0, top_k=2, mode="sjd")
    exact = exact_joint(enumerable, settings)
    shape = {} if tree == "chain" else dict(tree=tree, tree_top_k=2, tree_tokens=4)
    decoder = SpeculativeDecoder(enumerable, DecodeConfig(**settings, depth=2, **shape), device_step=True,
                                 drafter=HeadDrafts(tabular_head(1, width=16, vocab=3)))
    result = [decoder.generate([1] * 1000, seeds=b * 1000) for b in range(12)]
    pvalue, impossible = chi_square(exact, torch.cat([r.tokens for r in result]))
    assert impossible == 0
    assert pvalue > 1e-4
    counts = [r.origin_counts() for part in result for r in part.reports]
    assert sum(c["accepted draft"] for c in counts) and sum(c["resampled after a rejection"] for c in counts)


def test_draft_model_drafts_on_the_device_sample_the_exact_joint(enumerable):
    from spec_ar.sampling.model_drafts import ModelDrafts

    settings = dict(cfg_scale=2.0, top_k=2, mode="sjd")
    exact = exact_joint(enumerable, settings)
    decoder = SpeculativeDecoder(enumerable, DecodeConfig(**settings, depth=2), device_step=True,
                                 drafter=ModelDrafts(enumerable_llamagen(seed=1), "another model"))
    result = [decoder.generate([1] * 1000, seeds=b * 1000) for b in range(12)]
    pvalue, impossible = chi_square(exact, torch.cat([r.tokens for r in result]))
    assert impossible == 0
    assert pvalue > 1e-4
    counts = [r.origin_counts() for part in result for r in part.reports]
    assert sum(c["accepted draft"] for c in counts) and sum(c["resampled after a rejection"] for c in counts)


# -- one graph ----------------------------------------------------------------------------------
class Untimed:
    """The report's timer is host instrumentation around the forward, outside what a graph
    captures: the compiled step runs without it."""

    def model(self, kind="target"):
        return contextlib.nullcontext()


#: what tracing a host read raises: a data-dependent branch, or a guard on a value read back
HOST_READ = (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError,
             torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode)


@pytest.mark.parametrize("family,mode", [("embedded", "sjd"), ("embedded", "gsd"), ("embedded", "lantern"),
                                         ("embedded", "sjd-independent"), ("embedded", "sjd-gumbel"), ("embedded", "vvs"),
                                         ("embedded", "sjd-proactive"), ("embedded", "sjd-rows"), ("janus", "sjd")])
def test_the_whole_step_compiles_as_one_graph(families, family, mode, monkeypatch):
    """``torch.compile(fullgraph=True)`` of one verify step, the forward on the static path
    included: acceptance, commit, redraw, rollback and new drafts, no graph break (a host read
    would be one: the host step's fails the same compile); and the decode's tokens stay the
    host step's."""
    model = families[family]
    config = DecodeConfig(**MODES[mode])
    original = engine.SpeculativeDecoder._verify
    compiled = torch.compile(original, fullgraph=True, backend="eager")
    ran = []

    def verify(self, st, timer):
        if st.step == 3:
            ran.append(st.device_step)
            return compiled(self, st, Untimed())
        return original(self, st, timer)

    monkeypatch.setattr(engine.SpeculativeDecoder, "_verify", verify)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            stepped = decode(model, config, device_step=True, path="static")
            with pytest.raises(HOST_READ):
                decode(model, config, device_step=False, path="static")
    finally:
        torch._dynamo.reset()
    assert ran == [True, False]
    monkeypatch.setattr(engine.SpeculativeDecoder, "_verify", original)
    assert torch.equal(stepped.tokens, decode(model, config, device_step=False, path="static").tokens)


@pytest.mark.parametrize("drafter,mode,step", [("embedded", "vvs", "_verify"), ("embedded", "dynamic", "_tree_step"),
                                               ("embedded-sibling", "sjd", "_verify")])
def test_the_whole_step_with_a_draft_head_or_model_compiles_as_one_graph(families, drafter, mode, step, monkeypatch):
    """The same with a draft head (or model): the step, the drafter catching up and drafting (a
    chain, after the verify; a tree, before it) and its cache's rollback, one graph; the host
    step's read breaks it."""
    from spec_ar.loaders.detect import load_drafter

    model = families["embedded"]
    config = DecodeConfig(**HEAD_MODES[mode])
    drafter = load_drafter(drafter, model)
    original = getattr(engine.SpeculativeDecoder, step)
    compiled = torch.compile(original, fullgraph=True, backend="eager")
    ran = []

    def run(self, st, timer):
        if st.step == 3:
            ran.append(st.device_step)
            kept, self.drafter.timer = self.drafter.timer, Untimed()
            try:
                return compiled(self, st, Untimed())
            finally:
                self.drafter.timer = kept
        return original(self, st, timer)

    monkeypatch.setattr(engine.SpeculativeDecoder, step, run)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            stepped = decode(model, config, device_step=True, path="static", drafter=drafter)
            with pytest.raises(HOST_READ):
                decode(model, config, device_step=False, path="static", drafter=drafter)
    finally:
        torch._dynamo.reset()
    assert ran == [True, False]
    monkeypatch.setattr(engine.SpeculativeDecoder, step, original)
    assert torch.equal(stepped.tokens, decode(model, config, device_step=False, path="static", drafter=drafter).tokens)
