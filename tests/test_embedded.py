"""The embedded model: its text encoder, files, loader, training pipeline and demo."""
from __future__ import annotations

import json
import pathlib

import pytest
import torch

from spec_ar.embedded import domain
from spec_ar.embedded_tools import train
from spec_ar.embedded.recipe import Recipe
from spec_ar.embedded.text import TextEncoder
from spec_ar.loaders import embedded
from spec_ar.loaders.detect import detect
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

TINY = Recipe(images=48, vq_steps=2, vq_decoder_steps=2, vq_batch=4, gpt_steps=2, gpt_batch=4, dim=64, layers=1,
              text_dim=32, text_layers=1, judge_images=64, judge_epochs=1)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A tiny embedded model written by the real pipeline (a few steps per stage)."""
    out = tmp_path_factory.mktemp("embedded")
    train.run(TINY, out, log=lambda *a: None)
    return out


def test_text_encoder_reports_unknown_words_and_left_pads():
    enc = TextEncoder(list(domain.VOCABULARY), dim=16, layers=1, max_length=16).eval()
    with pytest.raises(ValueError, match=r"unknown word\(s\) \['elephant', 'sky'\]"):
        enc.check(["a red elephant in the sky"])
    feats, mask = enc.encode(["a red circle", "a blue square in the top left on a striped green background"])
    assert feats.shape == (2, 16, 16) and mask.shape == (2, 16)
    assert mask[0].tolist() == [0] * 12 + [1] * 4  # three words and </s>, at the end
    assert float(feats[0, :12].abs().max()) == 0.0


def test_the_pipeline_writes_loadable_weights(weights):
    config = json.loads((weights / "config.json").read_text())
    assert config["format"] == "spec_ar-embedded" and config["grid"] == 16
    assert set(config["training"]) >= {"dataset_minutes", "vq_minutes", "gpt_minutes", "judge_minutes"}
    assert (weights / "judge.safetensors").is_file()
    assert detect(weights).family == "embedded"
    model = embedded.load(weights)
    assert model.adapter.layout.grid == (16, 16) and model.condition == "text"
    res = SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd")).generate(["a red circle", "a blue star"])
    assert model.decode(res.image_tokens(model.adapter.layout)).shape == (2, 3, 64, 64)
    with pytest.raises(ValueError, match=r"unknown word\(s\) \['dragon'\]"):
        SpeculativeDecoder(model.adapter, DecodeConfig()).generate(["a green dragon"])


def test_the_weights_are_small(weights):
    full = Recipe()  # the shipped configuration, counted without training it
    from spec_ar.decoders.vq16 import VQModel
    from spec_ar.loaders.llamagen import LlamaGenGPT

    params = sum(p.numel() for m in (VQModel(embedded.vq_spec(full)), LlamaGenGPT(embedded.gpt_spec(full)),
                                     TextEncoder(list(domain.VOCABULARY), full.text_dim, full.text_layers))
                 for p in m.parameters())
    assert params * 2 < 30e6, "float16 weights must stay under 30 MB"
    assert embedded.vq_spec(full).codebook_size >= 512 and full.grid ** 2 >= 256


def test_render_and_demo_with_the_embedded_model(weights, tmp_path, capsys):
    from spec_ar.cli import main
    from spec_ar.embedded_tools.demo import run

    assert main(["render", "--model", str(weights), "--prompt", "a red circle", "--mode", "vvs",
                 "--out", str(tmp_path / "r")]) == 0
    assert main(["render", "--model", str(weights), "--prompt", "a red dragon", "--out", str(tmp_path / "r")]) == 2
    assert "unknown word(s) ['dragon']" in capsys.readouterr().err
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle in the top left\na blue star on a plain white background\n")
    res = run(tmp_path / "demo", modes=("ar", "sjd"), prompts_file=prompts, weights=weights, log=lambda *a: None)
    assert res["ar"]["nfe"] == 256 and res["sjd"]["nfe"] <= 256
    assert 0 <= res["uncertainty"]["top1_below_0.5"] <= 1
    report = (tmp_path / "demo" / "report.md").read_text()
    assert "| sjd |" in report and "batch 1 ms" in report and "| adherence" not in report
    assert res["sjd"]["speedup"] > 0 and res["sjd"]["batch_speedup"] > 0
    runs = res["sjd"]["batch_runs_s"]  # the batch figure is the median of the runs, the modes taking turns
    assert len(runs) == 3 and res["sjd"]["batch_latency_s"] == sorted(runs)[1]
    assert sorted(p.name for p in (tmp_path / "demo").glob("*.png"))[:2] == ["ar_00.png", "ar_01.png"]


def test_embedded_keyword_points_at_the_shipped_folder():
    hit = detect("embedded")
    assert hit.family == "embedded" and pathlib.Path(hit.path) == embedded.FOLDER


def test_a_sibling_trained_on_the_models_codes_drafts_for_it(weights, tmp_path):
    """``--sibling``: the same tokenizer and codes, a GPT of other depth, a folder the
    loader reads; it drafts for the model.  (A draft model of another vocabulary is
    refused by the same check for every family: ``test_detect_and_render``.)"""
    from spec_ar.loaders.detect import load_drafter

    out = tmp_path / "sibling"
    assert train.main(["--sibling", str(weights), "--out", str(out), "--layers", "2", "--quick"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["recipe"]["layers"] == 2 and config["recipe"]["vq_steps"] == TINY.vq_steps
    target = embedded.load(weights)
    sibling = embedded.load(out)
    assert len(sibling.modules["gpt"].layers) == 2
    for (k, a), b in zip(target.modules["vq"].state_dict().items(), sibling.modules["vq"].state_dict().values()):
        assert torch.equal(a, b), k  # the very same tokenizer
    drafts = load_drafter(str(out), target)
    res = SpeculativeDecoder(target.adapter, DecodeConfig(mode="sjd", depth=3), drafter=drafts).generate(
        ["a red circle", "a blue star"], seeds=[0, 1])
    assert res.reports[0].drafter == "embedded text-to-image (LlamaGen architecture, 64 px)"
    assert all(r.nfe < 256 for r in res.reports)
