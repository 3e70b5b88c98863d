"""The static decode path (a preallocated cache read in buckets, windows and trees padded
to a few widths; ``loaders/static_cache.py``) gives the eager path's tokens in float32,
for every family, mode and kind of drafting; it samples the exact joint; its forward
compiles as one graph; on CUDA, CUDA graphs give the same tokens again."""
from __future__ import annotations

import pytest
import torch

from spec_ar.loaders import janus
from spec_ar.loaders.static_cache import StaticKV, pad_tree, pad_window, padded_width, resolve_path
from spec_ar.sampling import ConfigError, DecodeConfig, SpeculativeDecoder

from .checkpoints import tiny_janus, write_janus
from .test_exactness import chi_square
from .tiny_families import conditions, enumerable_llamagen, exact_joint, tiny_families


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    return tiny_families(tmp_path_factory.mktemp("static"))


def decode_on(path, model, config, drafter=None, seeds=(4, 5)):
    ad = model.adapter
    ad.decode_path, ad.cache = path, None
    try:
        return SpeculativeDecoder(ad, config, drafter=drafter).generate(conditions(model), seeds=list(seeds))
    finally:
        ad.decode_path, ad.cache = "eager", None


def same_tokens(model, config, drafter=None):
    eager = decode_on("eager", model, config, drafter)
    static = decode_on("static", model, config, drafter)
    assert torch.equal(static.tokens, eager.tokens)
    assert [r.nfe for r in static.reports] == [r.nfe for r in eager.reports]
    return eager


MODES = {"ar": dict(mode="ar"), "sjd": dict(mode="sjd", window=6), "gsd": dict(mode="gsd", window=6),
         "lantern": dict(mode="lantern", window=6, lantern_k=4), "vvs": dict(mode="vvs", window=6, lantern_k=4),
         "sjd-independent": dict(mode="sjd", window=6, draft_coupling="none"),
         "sjd-proactive": dict(mode="sjd", window=6, proactive=3),
         "sjd-rows": dict(mode="sjd", window=6, rows=3, row_lead=2)}
CHEAP = ["embedded", "llamagen-c2i", "llamagen-t2i", "janus", "lumina", "emu3"]  # anole, liquid: 1025, 1024 positions


@pytest.mark.parametrize("family,mode", [(f, m) for f in CHEAP for m in MODES]
                         + [("anole", "sjd"), ("anole", "vvs"), ("liquid", "sjd"), ("liquid", "sjd-rows"),
                            ("lumina2", "sjd"), ("lumina2", "lantern"), ("simplear", "sjd"), ("simplear", "gsd")])
def test_the_static_path_gives_the_eager_tokens(families, family, mode):
    # the tiny SimpleAR under its guidance of 6 is all but deterministic and its Jacobi drafts never land
    unguided = {"cfg_scale": 1.0} if family == "simplear" else {}
    result = same_tokens(families[family], DecodeConfig(**MODES[mode], **unguided))
    if mode != "ar":  # not vacuous: windows of several widths were scored and partly rejected
        assert any(r.nfe < r.tokens for r in result.reports)


@pytest.mark.parametrize("tree", ["chain", "dynamic", "static", "sampled"])
def test_draft_heads_and_their_trees_give_the_eager_tokens_on_the_static_path(families, tree, tmp_path):
    from spec_ar.loaders.detect import load_drafter

    from .checkpoints import write_lantern_head

    model = families["llamagen-t2i"]
    source = load_drafter(write_lantern_head(tmp_path / "head", hidden=128, heads=2, vocab=1024), model)
    config = DecodeConfig(mode="sjd", tree=tree, depth=3, tree_top_k=6, tree_tokens=10)
    same_tokens(model, config, source)


def test_a_draft_head_reading_the_prompt_gives_the_eager_tokens_on_the_static_path(families, tmp_path):
    from spec_ar.loaders.detect import load_drafter

    from .checkpoints import write_lantern_anole_head

    model = families["anole"]
    folder = write_lantern_anole_head(tmp_path / "anole_drafter", hidden=32, heads=4, kv_heads=2,
                                      vocab=model.adapter.vocab_size)
    same_tokens(model, DecodeConfig(mode="sjd", tree="dynamic", depth=2, tree_top_k=3, tree_tokens=6),
                load_drafter(folder, model))


def test_a_sibling_draft_model_gives_the_eager_tokens_on_the_static_path(families):
    from spec_ar.loaders.detect import load_drafter

    model = families["embedded"]
    sibling = load_drafter("embedded-sibling", model)
    sibling.adapter.decode_path = "static"
    try:
        same_tokens(model, DecodeConfig(mode="sjd", depth=3), sibling)
    finally:
        sibling.adapter.decode_path = "eager"


@pytest.mark.parametrize("family", ["embedded", "llamagen-t2i", "janus", "lumina", "emu3", "liquid", "lumina2",
                                    "simplear"])
@pytest.mark.parametrize("shape", ["window", "tree"])
def test_the_static_forward_compiles_as_one_graph(families, family, shape):
    """``torch.compile(fullgraph=True)`` fails on any graph break (a host synchronisation,
    a data-dependent shape): what a CUDA graph could not capture either.  And with
    ``dynamic=True`` (the compiled path) every width and cache read after the first share a compile."""
    from spec_ar.sampling.tree import ancestors

    ad = families[family].adapter
    ad.decode_path, ad.cache = "static", None
    try:  # without gradients, as the adapters' forwards run
        torch.set_grad_enabled(False)
        ad.prefill(conditions(families[family]), None, True)
        tokens = torch.nonzero(ad.layout.image_tokens)[:16].view(2, 8)
        kv = ad.cache if isinstance(ad.cache, StaticKV) else ad.cache.kv
        keys = kv.keys_for(8)
        within = ancestors(torch.tensor([[-1, 0, 0, 1, 1, 2, 2, 3]]).repeat(2, 1))
        forward = {"window": lambda t, w: ad._static_window(t, keys),
                   "tree": lambda t, w: ad._static_tree(t, w, keys)}[shape]
        expected = forward(tokens, within)[0]
        torch._dynamo.reset()
        compiled = torch.compile(forward, fullgraph=True, backend="aot_eager")
        assert torch.allclose(compiled(tokens, within)[0], expected, atol=1e-5)
        if shape == "window" and family in ("embedded", "janus"):  # ours, and transformers' Llama
            counts = torch._dynamo.utils.counters["stats"]
            counted = counts["unique_graphs"]
            method = torch.compile(ad._static_window, fullgraph=True, backend="aot_eager", dynamic=True)
            graphs = []
            for width, step in ((8, 0), (16, 8), (4, 24), (2, 3), (32, 5)):  # other widths and cache lengths
                t = torch.nonzero(ad.layout.image_tokens)[: 2 * width].view(2, width)
                kv.advance([step] * kv.rows)
                method(t, kv.keys_for(width))
                graphs.append(counts["unique_graphs"] - counted)
            # transformers' code specialises the first width it sees; the second compile serves the rest
            assert graphs[-1] == graphs[1] <= 2
    finally:
        torch.set_grad_enabled(True)
        ad.decode_path, ad.cache = "eager", None
        torch._dynamo.reset()


def compiled_decode(model, config, monkeypatch):
    """A decode on the compiled path with ``aot_eager`` (the same arithmetic, no code generation):
    the result and the number of graphs compiled."""
    from spec_ar.loaders import static_cache

    monkeypatch.setattr(static_cache, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters["stats"]
    before = counts["unique_graphs"]
    try:
        return decode_on("compiled", model, config), counts["unique_graphs"] - before
    finally:
        model.adapter.__dict__.pop("compiled_blocks", None)
        torch._dynamo.reset()


@pytest.mark.parametrize("family", ["embedded", "lumina", "simplear"])  # ours, Chameleon's, Qwen2's blocks
def test_the_compiled_path_runs_the_blocks_compiled(families, family, monkeypatch):
    """Regional compilation: the repeated blocks run compiled, in a compile or two for the whole
    decode (widths and cache reads symbolic); ``aot_eager`` keeps the arithmetic, so the tokens
    are the static path's; after the forward the model holds its plain blocks again."""
    from spec_ar.loaders.storage import repeated_blocks

    model = families[family]
    config = DecodeConfig(mode="sjd", window=6, **({"cfg_scale": 1.0} if family == "simplear" else {}))
    compiled, graphs = compiled_decode(model, config, monkeypatch)
    static = decode_on("static", model, config)
    assert torch.equal(compiled.tokens, static.tokens)
    assert [r.nfe for r in compiled.reports] == [r.nfe for r in static.reports]
    assert 1 <= graphs <= 2
    blocks = repeated_blocks(model.adapter.network())
    assert all(type(b) is type(blocks[0]) and not isinstance(b, torch._dynamo.eval_frame.OptimizedModule)
               for b in blocks)


def test_one_compile_serves_every_layer(tmp_path, monkeypatch):
    """The layer index is symbolic (transformers keeps it on each attention module): a model of
    five layers compiles its block once or twice, not once per layer, so a 7B model's 30 layers
    compile in the time of one."""
    model = janus.load(write_janus(tmp_path / "Janus-Pro-deep", *tiny_janus(seed=3, layers=5)))
    _, graphs = compiled_decode(model, DecodeConfig(mode="sjd", window=6), monkeypatch)
    assert 1 <= graphs <= 2 < 5


def test_a_decode_runs_forwards_of_a_few_shapes(families):
    """Padded widths and bucketed cache reads: the set of forward shapes stays small."""
    model = families["emu3"]  # 8 x 8 image tokens, an end-of-line per row: 74 positions
    ad = model.adapter
    shapes = set()
    original = ad._hidden

    def spy(tokens, inputs):
        shapes.add((tokens.shape[1], inputs["attention_mask"].shape[-1]))
        return original(tokens, inputs)

    ad._hidden = spy
    try:
        decode_on("static", model, DecodeConfig(mode="sjd", window=6))
    finally:
        del ad._hidden
    widths, keys = {w for w, _ in shapes}, {k for _, k in shapes}
    assert widths <= {1, 2, 4, 8} and keys <= {256, 512}  # the prompt and 74 positions: two buckets
    assert len(shapes) <= 8


def test_padding_helpers():
    assert [padded_width(n) for n in (1, 2, 3, 7, 8, 25, 33)] == [1, 2, 4, 8, 8, 32, 64]
    assert pad_window(torch.tensor([[5, 6]]), 4).tolist() == [[5, 6, 6, 6]]
    assert pad_tree(torch.tensor([[-1, 0, 0]]), 4).tolist() == [[-1, 0, 0, -1]]


def test_paths_resolve_per_device():
    assert resolve_path("auto", "cpu") == "eager" and resolve_path("graphs", "cpu") == "static"
    assert resolve_path("auto", "cuda") == "graphs" and resolve_path("auto", "cuda", capturable=False) == "static"
    assert resolve_path("compiled", "cpu") == "compiled" and resolve_path("compiled", "cuda", capturable=False) == "static"
    with pytest.raises(ConfigError, match="decode path must be one of auto, eager, static, graphs"):
        resolve_path("fast", "cpu")


# -- exactness on the static path -------------------------------------------------------------
@pytest.fixture(scope="module")
def enumerable():
    return enumerable_llamagen()


@pytest.mark.parametrize("config", [dict(mode="ar"), dict(mode="sjd", window=3),
                                    dict(mode="sjd", window=3, draft_coupling="none")])
def test_the_static_path_samples_the_exact_joint(enumerable, config):
    settings = dict(cfg_scale=2.0, top_k=2, **config)
    exact = exact_joint(enumerable, settings)
    enumerable.decode_path, enumerable.cache = "static", None
    try:
        decoder = SpeculativeDecoder(enumerable, DecodeConfig(**settings))
        tokens = torch.cat([decoder.generate([1] * 1000, seeds=b * 1000).tokens for b in range(12)])
    finally:
        enumerable.decode_path, enumerable.cache = "eager", None
    pvalue, impossible = chi_square(exact, tokens)
    assert impossible == 0
    assert pvalue > 1e-4


# -- CUDA graphs -------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("mode", ["ar", "sjd", "gsd", "lantern", "vvs"])
def test_cuda_graphs_give_the_eager_tokens(mode):
    from spec_ar.loaders.detect import load_model

    model = load_model("embedded", device="cuda", dtype="float32", decode_path="graphs")
    ad = model.adapter
    config = DecodeConfig(mode=mode, window=24)  # set: on auto each path would measure its own costs
    graphed = SpeculativeDecoder(ad, config).generate(["a red circle", "a blue square"], seeds=[1, 2])
    assert ad.graphs.enabled and ad.graphs.failed is None and ad.graphs.replays > 0
    ad.decode_path, ad.cache = "eager", None
    eager = SpeculativeDecoder(ad, config).generate(["a red circle", "a blue square"], seeds=[1, 2])
    assert torch.equal(graphed.tokens, eager.tokens)


def test_graphs_are_dropped_when_the_weights_move():
    """ComfyUI moves a model off the GPU and back between runs: graphs captured on the
    old addresses would read freed memory, so a decode checks where the weights are."""
    from spec_ar.loaders.static_cache import CapturedForwards, weights_signature

    layer = torch.nn.Linear(4, 4)
    graphs = CapturedForwards(enabled=False)
    graphs.check_weights(weights_signature(layer))
    graphs.graphs["window"] = "a captured graph"
    graphs.check_weights(weights_signature(layer))  # nothing moved
    assert graphs.graphs
    layer.to(torch.float64)  # new storage, as a move to another device and back gives
    graphs.check_weights(weights_signature(layer))
    assert not graphs.graphs


def test_the_compile_time_bench_times_both_ways(tmp_path, capsys):
    """``bench/compile_time.py``: both ways, each a first forward and one of another width."""
    import json

    from spec_ar.bench import compile_time

    out = tmp_path / "compile.json"
    assert compile_time.main(["--depths", "1", "--dim", "64", "--backend", "aot_eager", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["depth"], r["how"]) for r in rows] == [(1, "regional"), (1, "whole")]
    assert all(r["first_forward_s"] > 0 and r["graphs"] >= 1 for r in rows)
    assert "regional" in capsys.readouterr().out
