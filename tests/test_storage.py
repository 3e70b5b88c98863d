"""Weight storage: quantized options store the transformer layers in fewer bytes, the
sizing reads the files before loading, and speculative decoding samples the
quantized model's own distribution exactly."""
from __future__ import annotations

import itertools

import pytest
import torch

from spec_ar.loaders import sizing, storage
from spec_ar.loaders.llamagen import LlamaGenAdapter
from spec_ar.sampling import ConfigError, DecodeConfig, SpeculativeDecoder

from .checkpoints import random_gpt, tiny_gpt_spec, write_gpt
from .test_exactness import stream_test

QUANTIZED = [name for name, s in storage.STORAGES.items() if s.quantized]
#: streams sampled per check: at 8 000 the check below already tells nf4's joint from bfloat16's samples at a
#: p-value that underflows to 0 (seeds 7, 8), where 20 000 streams cost 2.5x the decoding for no power it needs
STREAMS = 8_000


def tiny_adapter(dtype, seed=0):
    """A 2 x 2-token LlamaGen c2i with a vocabulary of 4, stored as ``dtype``: small
    enough to enumerate every stream."""
    gpt = random_gpt(tiny_gpt_spec("c2i", vocab=4, dim=128, n_layer=2, classes=3), seed=seed)
    adapter = LlamaGenAdapter(storage.place(gpt, dtype, "cpu"), 2)
    adapter.MARGIN = 8  # cache room past the image for windows of 3 (not 512: the batches here are 8 000)
    return adapter


@torch.no_grad()
def joint(adapter, cls=1) -> dict[tuple, float]:
    """The exact distribution of the 4-token streams, from the adapter's own logits:
    every length-3 prefix scored in one window forward."""
    prefixes = torch.tensor(list(itertools.product(range(4), repeat=3)))
    first = torch.softmax(adapter.prefill([cls] * len(prefixes), None, False)[0].float(), -1)  # [64, 4]
    rest = torch.softmax(adapter.forward(prefixes)[0].float(), -1)  # [64, 3, 4]: after t0, t0 t1, t0 t1 t2
    adapter.release()
    out = {}
    for i, (a, b, c) in enumerate(prefixes.tolist()):
        base = first[i, a] * rest[i, 0, b] * rest[i, 1, c]
        for d in range(4):
            out[(a, b, c, d)] = float(base * rest[i, 2, d])
    return out


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_layers_replace_the_block_linears_only(name):
    gpt = random_gpt(tiny_gpt_spec("c2i", vocab=64, dim=128, n_layer=2))
    full = storage.stored_bytes(gpt.to(torch.bfloat16))
    predicted = storage.weight_bytes(gpt, name)
    storage.place(gpt, name, "cpu")
    quantized = [n for n, m in gpt.named_modules() if type(m) is not torch.nn.Linear and "Linear" in type(m).__name__]
    assert quantized and all(storage.BLOCK_LINEAR.search(n) for n in quantized)
    assert type(gpt.output) is torch.nn.Linear and gpt.output.weight.dtype == torch.bfloat16  # the head stays
    assert storage.stored_bytes(gpt) == pytest.approx(predicted, rel=0.01)
    assert storage.stored_bytes(gpt) < 0.75 * full


def test_nf4_leaves_layers_of_partial_row_blocks_unquantized():
    """bitsandbytes' CPU kernel packs 32 output rows at a time (and asserts it at the first forward, on CPUs with
    AVX512-BF16): a layer of 80 rows stays in the compute dtype, one of 96 is quantized, and the forward runs."""
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.ModuleDict({"odd": torch.nn.Linear(64, 80, bias=False),
                                                             "even": torch.nn.Linear(64, 96, bias=False)})])
    assert not storage.quantizes("layers.0.odd.weight", (80, 64), storage.STORAGES["nf4"])
    predicted = storage.weight_bytes(model, "nf4")
    storage.place(model, "nf4", "cpu")
    block = model.layers[0]
    assert type(block["odd"]) is torch.nn.Linear and type(block["even"]) is not torch.nn.Linear
    assert storage.stored_bytes(model) == pytest.approx(predicted, rel=0.01)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert block["odd"](x).shape == (3, 80) and block["even"](x).shape == (3, 96)


@pytest.mark.parametrize("name", QUANTIZED)
def test_speculative_decoding_samples_the_quantized_models_own_distribution(name):
    adapter = tiny_adapter(name)
    exact = joint(adapter)
    reference = joint(tiny_adapter(torch.bfloat16))
    assert max(abs(exact[s] - reference[s]) for s in exact) > 1e-4, "quantizing changed the model"
    adapter.joint = lambda cls, cfg, top_k, temperature=1.0: exact  # what stream_test compares with
    # (no `ar` run beside it: a wrong joint would fail this one too, as the test below shows)
    config = DecodeConfig(mode="sjd", window=3, cfg_scale=1.0, top_k=None, top_p=1.0, temperature=1.0)
    tokens = SpeculativeDecoder(adapter, config).generate([1] * STREAMS, seeds=7).tokens
    pvalue, impossible = stream_test(adapter, tokens, cls=1, cfg=1.0, top_k=None)
    assert impossible == 0 and pvalue > 1e-4, pvalue


def test_the_check_would_see_full_precision_sampling_against_a_quantized_joint():
    """The test above can fail: nf4 changes the distribution enough that samples of the
    bfloat16 model are told apart from the nf4 model's joint."""
    quantized = joint(tiny_adapter("nf4"))
    adapter = tiny_adapter(torch.bfloat16)
    adapter.joint = lambda cls, cfg, top_k, temperature=1.0: quantized
    tokens = SpeculativeDecoder(adapter, DecodeConfig(mode="sjd", window=3, cfg_scale=1.0, top_k=None)).generate(
        [1] * STREAMS, seeds=7).tokens
    assert stream_test(adapter, tokens, cls=1, cfg=1.0, top_k=None)[0] < 1e-4


def test_sizing_reads_the_files_and_names_what_fits(tmp_path, monkeypatch):
    from spec_ar.sampling import memory

    gpt = random_gpt(tiny_gpt_spec("c2i", vocab=1024, dim=256, n_layer=4))
    path = write_gpt(tmp_path / "c2i.safetensors", gpt)
    files = storage.checkpoint_files(path)
    sizes = {name: storage.file_weight_bytes(files, name) for name in storage.STORAGES}
    assert sizes["float32"] == 2 * sizes["bfloat16"] > sizes["int8"] > sizes["nf4"]
    for name in ("bfloat16", "int8", "nf4"):  # the estimate is what loading then holds
        loaded = storage.place(random_gpt(tiny_gpt_spec("c2i", vocab=1024, dim=256, n_layer=4)), name, "cpu")
        assert storage.stored_bytes(loaded) == pytest.approx(sizes[name], rel=0.02)
    # a machine with room for int8 but not bfloat16
    monkeypatch.setattr(memory, "free_bytes", lambda device: int((sizes["bfloat16"] + sizes["int8"]) / 2 / 0.9))
    with pytest.raises(ConfigError, match=r"in bfloat16 needs about .* of weights, cpu has .* free: int8 \(.*\) or "
                                          r"fp8 \(.*\) or nf4 \(.*\) fit$"):
        sizing.choose(files, "bfloat16", "cpu", "c2i.safetensors (llamagen)")
    assert sizing.choose(files, "int8", "cpu", "x").name == "int8"
    # auto never picks what does not fit, and never a quantized storage
    monkeypatch.setattr(memory, "free_bytes", lambda device: 10 * sizes["float32"])
    assert sizing.choose(files, "auto", "cpu", "x").name == "float32"
    monkeypatch.setattr(memory, "free_bytes", lambda device: int(1.5 * sizes["float32"]))
    assert sizing.choose(files, "auto", "cpu", "x").name == "bfloat16"


def test_a_storage_that_cannot_run_here_is_refused_naming_what_can(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_bitsandbytes(name, *a, **k):
        if name == "bitsandbytes":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_bitsandbytes)
    with pytest.raises(ConfigError, match="needs the bitsandbytes package.*without it: float32, bfloat16, float16, "
                                          "int8, fp8"):
        storage.check_available(storage.STORAGES["nf4"], "cpu")


def test_the_command_line_renders_with_int8_weights(tmp_path, capsys):
    import json

    from spec_ar.cli import main

    code = main(["render", "--model", "embedded", "--prompt", "a red circle", "--mode", "sjd", "--dtype", "int8",
                 "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "sjd_0.json").read_text())
    assert report["dtype"] == "int8" and (tmp_path / "sjd_0.png").is_file()
