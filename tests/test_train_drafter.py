"""`spec-ar train-drafter`: a draft head for every family, trained on the target's own
samples, written as a folder `--drafter` reads; resumable; bad input is one error."""
from __future__ import annotations

import json

import pytest

from spec_ar.cli import main
from spec_ar.loaders.detect import load_drafter, load_model
from spec_ar.sampling import DecodeConfig, HeadDrafts, SpeculativeDecoder

from .chameleon_files import write_chameleon
from .checkpoints import random_gpt, tiny_gpt_spec, write_gpt, write_janus, write_vq, tiny_janus
from .emu3_files import write_emu3

QUICK = ["--images", "4", "--data-batch", "2", "--steps", "3", "--batch", "2"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("drafter_targets")
    (d / "c2i").mkdir()
    janus, tok = tiny_janus(seed=1)
    write_vq(d / "c2i" / "vq.pt")
    return {"llamagen": (write_gpt(d / "c2i" / "c2i.pt", random_gpt(tiny_gpt_spec("c2i"), 1)), ["3", "5"], 64),
            "janus": (write_janus(d / "janus", janus, tok), ["a cat", "a red house"], None),
            "anole": (write_chameleon(d / "anole", "anole", seed=1), ["a fox"], None),
            "emu3": (write_emu3(d / "emu3"), ["a dog"], 64)}


@pytest.mark.parametrize("family", ["llamagen", "janus", "anole", "emu3"])
def test_a_head_trained_for_any_family_drafts_for_it(models, family, tmp_path):
    path, prompts, resolution = models[family]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    out = tmp_path / "head"
    args = ["train-drafter", "--model", str(path), "--prompts", str(tmp_path / "prompts.txt"), "--out", str(out)]
    args += ["--resolution", str(resolution)] if resolution else []
    assert main(args + QUICK) == 0
    config = json.loads((out / "config.json").read_text())
    training = config["spec_ar_drafter"]["training"]
    kept = training["held_out_acceptance_by_depth"]
    assert training["images"] == 4 and training["steps"] == 3 and len(kept) == 3 and all(0 < a <= 1 for a in kept)
    model = load_model(path, resolution=resolution)
    source = load_drafter(out, model)
    assert isinstance(source, HeadDrafts) and source.head.spec.layers == 1
    assert source.head.spec.grid == (model.adapter.layout.grid[0] if family == "llamagen" else None)
    condition = int(prompts[0]) if family == "llamagen" else prompts[0]
    result = SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd", depth=2), drafter=source).generate(
        [condition], seeds=1)
    assert result.reports[0].drafter == source.name and result.reports[0].nfe > 1


def test_training_resumes_where_it_stopped(models, tmp_path, capsys):
    path, prompts, resolution = models["llamagen"]
    (tmp_path / "ids.txt").write_text("3\n5\n")
    args = ["train-drafter", "--model", str(path), "--prompts", str(tmp_path / "ids.txt"), "--out",
            str(tmp_path / "head"), "--resolution", "64", "--images", "4", "--data-batch", "2", "--batch", "2"]
    assert main(args + ["--steps", "2"]) == 0
    shards = sorted((tmp_path / "head.work").glob("shard_*.safetensors"))
    made = [p.stat().st_mtime_ns for p in shards]
    assert len(shards) == 2 and (tmp_path / "head.work" / "train_state.pt").is_file()
    capsys.readouterr()
    assert main(args + ["--steps", "4"]) == 0
    assert "resuming at step 2 of 4" in capsys.readouterr().out
    assert [p.stat().st_mtime_ns for p in shards] == made  # the data was not made again
    assert json.loads((tmp_path / "head" / "config.json").read_text())["spec_ar_drafter"]["training"]["steps"] == 4


@pytest.mark.parametrize("args, message", [
    (["--prompts", "missing.txt"], "--prompts missing.txt: no such file"),
    (["--steps", "0"], "--steps must be at least 1 (got 0)"),
    (["--prompts", "words.txt"], "is class-conditional: --prompts must hold one class id per line"),
])
def test_bad_input_is_one_error_before_any_model_work(models, tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ids.txt").write_text("3\n")
    (tmp_path / "words.txt").write_text("a cat\n")
    base = {"--model": str(models["llamagen"][0]), "--prompts": "ids.txt", "--out": "head"}
    base.update(dict(zip(args[::2], args[1::2])))
    code = main(["train-drafter"] + [x for kv in base.items() for x in kv])
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "head.work").exists()
