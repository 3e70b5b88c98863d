"""``spec-ar bench gpu`` on the CPU with tiny configurations: the output it promises,
the floor it computes from what a forward really reads, trees that are trees."""
import json

import pytest
import torch

from spec_ar.bench import gpu
from spec_ar.loaders.storage import stored_bytes
from spec_ar.sampling.tree import depths


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-gpu")
    argv = ["--device", "cpu", "--scale", "0.03", "--models", "llamagen-xl", "janus-pro-7b", "--dtypes", "bfloat16",
            "int8", "--widths", "1", "3", "--trees", "5", "--forwards", "1", "--modes", "ar", "sjd", "--images", "1", "--batches", "2",
            "--offload", "--out", str(out)]
    assert gpu.main(argv) == 0
    return json.loads((out / "results.json").read_text()), (out / "report.md").read_text()


def test_every_model_and_dtype_is_timed_at_every_shape_beside_its_floor(run):
    results, _ = run
    rows = results["forwards"]
    dtypes = ["bfloat16", "int8", "bfloat16 offloaded", "int8 offloaded"]
    assert [(r["model"], r["dtype"], r["path"]) for r in rows] == [
        (m, d, p) for m in ("llamagen-xl", "janus-pro-7b") for d in dtypes for p in ("eager", "static")]
    for eager, static in zip(rows[::2], rows[1::2]):  # padded windows and bucketed keys: the same model outputs
        assert static["top1_agreement"] == eager.get("top1_agreement", 1.0)
    for r in rows:
        assert "error" not in r, r
        assert all(r[k] > 0 for k in ("w1", "w3", "tree5", "floor_ms", "live_kv_bytes", "weight_bytes_per_forward"))
        assert r["floor_ms"] == pytest.approx((r["weight_bytes_per_forward"] + r["live_kv_bytes"])
                                              / results["bandwidth"]["bytes_per_s"] * 1000)
        assert r["context_tokens"] == r["image_tokens"] // 2
    bf16, int8, bf16_offloaded, int8_offloaded = rows[8::2]
    assert int8["weight_bytes_per_forward"] < bf16["weight_bytes_per_forward"]  # the quantized blocks read less
    assert int8["top1_agreement"] > 0 and int8["kl_mean"] >= 0
    # offloaded: the same model, its blocks streamed (their bytes counted), the very logits of the resident one
    assert bf16_offloaded["weight_bytes_per_forward"] == bf16["weight_bytes_per_forward"]
    assert 0 < bf16_offloaded["streamed_bytes"] < bf16["weight_bytes_per_forward"]
    assert int8_offloaded["streamed_bytes"] < bf16_offloaded["streamed_bytes"]
    assert bf16_offloaded["top1_agreement"] == 1.0 and bf16_offloaded["kl_mean"] == 0.0


def test_the_report_prints_bandwidth_forwards_layers_and_the_embedded_modes(run):
    results, text = run
    assert text.startswith("# GPU bench on CPU")
    assert f"Bandwidth: {results['bandwidth']['bytes_per_s'] / 1e9:.0f} GB/s" in text
    assert "| model | dtype | path | weights read / forward | live KV | floor ms | L=1 | L=3 | tree 5 |" in text
    assert "| janus-pro-7b | int8 | eager |" in text and "| janus-pro-7b | int8 | static |" in text
    assert {k["dtype"] for k in results["kernels"]} == {"bfloat16", "int8 (widen)", "int8 (int8pack)", "int8 (int_mm)"}
    for k in results["kernels"]:  # each of int8's kernels runs on the CPU, near the widened weight's product
        assert k["ms"] > 0 and (k["dtype"] == "bfloat16" or 0 <= k["error"] <= 0.02), k
    assert "| int8 (int_mm) | 2 |" in text and "error" in text
    # plain AR once (it reads nothing per step anyway), sjd with its verify step on the host and on the device
    assert [(r["path"], r["batch"], r["mode"], r["step"]) for r in results["embedded"]] == [
        (p, 2, m, s) for p in ("eager", "static") for m, s in (("ar", "-"), ("sjd", "host"), ("sjd", "device"))]
    ar, sjd, on_device = results["embedded"][:3]
    assert ar["forwards"] == 256 and ar["tokens_per_forward"] == 1.0 and ar["window"] is None
    assert sjd["forwards"] < ar["forwards"] and on_device["forwards"] == sjd["forwards"]  # the same decode
    assert sjd["window_choice"].startswith(f"window {sjd['window']} on auto")
    assert "| sjd | eager | host | 2 |" in text and "| sjd | static | device | 2 |" in text


def test_the_floor_counts_only_the_layers_a_forward_runs(tmp_path):
    """Janus carries a vision tower and a VQ model that a decoding forward never runs."""
    path = gpu.write_model("janus-pro-7b", tmp_path / "janus", 0.03)
    model = gpu.load(path, "cpu", "bfloat16")
    model.adapter.prefill(["a fox"], None, True)
    read = gpu.read_per_forward(model.adapter, model.modules, torch.tensor([[model.adapter.vocab_size - 1]]))
    whole = sum(stored_bytes(m) for m in model.modules.values())
    janus = model.modules["janus"].model
    assert read < whole - stored_bytes(janus.vision_model) - stored_bytes(janus.vqmodel)
    assert read > sum(stored_bytes(m) for m in janus.language_model.layers)


def test_a_compact_vocabularys_floor_counts_the_heads_image_rows_only(tmp_path):
    """Lumina-mGPT-7B's head has 65,536 rows, 8,192 of them image tokens."""
    from spec_ar.sampling.compact import compact

    path = gpu.write_model("lumina-mgpt-7b-768", tmp_path / "lumina", 0.03)
    model = gpu.load(path, "cpu", "bfloat16")
    full, small = model.adapter, compact(model.adapter)
    reads = []
    for ad in (full, small):
        ad.prefill(["a fox"], None, True)
        image_id = int(torch.nonzero(ad.layout.image_tokens)[0])
        reads.append(gpu.read_per_forward(ad, model.modules, torch.tensor([[image_id]])))
        ad.release()
    head = stored_bytes(full.head)
    assert small.native and full.head_rows is None
    assert reads[0] - reads[1] == head - head * small.n_image // full.vocab_size


def test_redrawn_weights_are_the_same_model_every_time(tmp_path):
    path = gpu.write_model("llamagen-xl", tmp_path / "lg", 0.03)
    a, b = gpu.load(path, "cpu", "bfloat16"), gpu.load(path, "cpu", "bfloat16")
    pa, pb = (dict(m.modules["gpt"].named_parameters()) for m in (a, b))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    w = pa["layers.0.attention.wqkv.weight"].detach().float()
    assert 0.015 < float(w.std()) < 0.025  # drawn, not the file's zeros


@pytest.mark.parametrize("n", [1, 3, 4, 60, 120])
def test_tree_parents_make_a_tree(n):
    parents = gpu.tree_parents(n)
    assert parents.shape == (1, n)
    assert all(-1 <= int(p) < i for i, p in enumerate(parents[0]))
    assert int(depths(parents).max()) <= max(1, n).bit_length()


def test_the_compiled_paths_floor_counts_the_blocks_it_compiled(tmp_path, monkeypatch):
    """Hooks see no module run inside a compiled block: the weights a forward reads are counted uncompiled,
    so the compiled path's floor is the static path's."""
    from spec_ar.loaders import static_cache

    monkeypatch.setattr(static_cache, "COMPILE_BACKEND", "aot_eager")
    out = tmp_path / "bench"
    argv = ["--device", "cpu", "--scale", "0.03", "--models", "janus-pro-7b", "--paths", "static", "compiled",
            "--widths", "1", "--trees", "3", "--forwards", "1", "--modes", "--out", str(out)]
    try:
        assert gpu.main(argv) == 0
    finally:
        torch._dynamo.reset()
    static, compiled = json.loads((out / "results.json").read_text())["forwards"]
    assert (static["path"], compiled["path"]) == ("static", "compiled")
    assert compiled["weight_bytes_per_forward"] == static["weight_bytes_per_forward"] > 0
