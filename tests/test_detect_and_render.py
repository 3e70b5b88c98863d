"""Pointing the pack at a file or folder finds the family; ``spec-ar render`` renders with it."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from spec_ar.cli import main
from spec_ar.formats.checkpoints import CheckpointError
from spec_ar.loaders.detect import detect
from spec_ar.loaders.llamagen import find_vq

from .checkpoints import (random_gpt, tiny_gpt_spec, tiny_janus, write_gpt, write_janus, write_original_janus, write_t5,
                          write_vq)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    d = tmp_path_factory.mktemp("zoo")
    (d / "c2i").mkdir()
    (d / "t2i").mkdir()
    model, tok = tiny_janus(seed=1)
    return {
        # names that say nothing: detection must read the contents
        "c2i": write_gpt(d / "c2i" / "weights.pt", random_gpt(tiny_gpt_spec("c2i"), 1)),
        "c2i_vq": write_vq(d / "c2i" / "tokenizer.pt"),
        "t2i": write_gpt(d / "t2i" / "model.safetensors", random_gpt(tiny_gpt_spec("t2i"), 2)),
        "t2i_vq": write_vq(d / "t2i" / "vq.pt"),
        "t5": write_t5(d / "t5", d_model=32),
        "janus": write_janus(d / "janus-hf", model, tok),
        "janus_original": write_original_janus(d / "janus-original", model, tok),
        "dir": d,
    }


def test_families_are_told_by_content(zoo):
    assert detect(zoo["c2i"]).family == "llamagen" and detect(zoo["c2i"]).detail == "c2i"
    assert detect(zoo["t2i"]).detail == "t2i"
    assert detect(zoo["c2i"].parent).path == zoo["c2i"]  # a folder with one GPT
    assert find_vq(zoo["c2i"]) == zoo["c2i_vq"]
    assert detect(zoo["janus"]).family == "janus" and detect(zoo["janus"]).detail == "janus"
    assert detect(zoo["janus_original"]).detail == "multi_modality"


def test_unrecognised_inputs_get_one_clear_error(zoo, tmp_path):
    other = tmp_path / "unet.safetensors"
    from safetensors.torch import save_file

    save_file({"conv_in.weight": torch.zeros(4, 4)}, str(other))
    with pytest.raises(CheckpointError) as err:
        detect(other)
    msg = str(err.value)
    assert "not a model this pack recognises (found 1 tensors, e.g. conv_in.weight)" in msg
    assert "llamagen: a LlamaGen GPT file" in msg and "janus: a Janus / Janus-Pro folder" in msg
    with pytest.raises(CheckpointError, match="LlamaGen VQ tokenizer, not a model"):
        detect(zoo["c2i_vq"])
    folder = tmp_path / "sd15"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "unet"}))
    with pytest.raises(CheckpointError, match="found config.json with model_type 'unet'"):
        detect(folder)
    with pytest.raises(CheckpointError, match="no such file or folder"):
        detect(tmp_path / "missing.pt")
    junk = tmp_path / "notes.pt"
    junk.write_text("not a pickle")
    with pytest.raises(CheckpointError, match="not a model this pack recognises"):
        detect(junk)


def render(tmp_path, *args):
    out = tmp_path / "out"
    code = main(["render", "--out", str(out), "--window", "4", "--lantern-k", "20", *args])
    return code, out


@pytest.mark.parametrize("case", ["c2i", "t2i", "janus", "janus_original"])
def test_render_writes_images_and_a_report(zoo, tmp_path, case, capsys):
    args = {"c2i": ["--model", str(zoo["c2i"]), "--class-id", "3", "--resolution", "64"],
            "t2i": ["--model", str(zoo["t2i"]), "--vq", str(zoo["t2i_vq"]), "--text-encoder", str(zoo["t5"]),
                    "--prompt", "a red circle", "--resolution", "64"],
            "janus": ["--model", str(zoo["janus"]), "--prompt", "a red circle"],
            "janus_original": ["--model", str(zoo["janus_original"]), "--prompt", "a blue cat"]}[case]
    code, out = render(tmp_path, *args, "--mode", "gsd", "--seed", "5", "--batch", "2", "--group-size", "3")
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "gsd_5.json").read_text())
    assert [p.split("/")[-1] for p in report["images"]] == ["gsd_5.png", "gsd_6.png"]
    assert report["reports"][0]["settings"]["group_size"] == 3
    from PIL import Image

    size = {"c2i": 64, "t2i": 64, "janus": 8, "janus_original": 8}[case]
    assert Image.open(out / "gsd_5.png").size == (size, size)


def test_render_errors_are_one_line(zoo, tmp_path, capsys):
    code, _ = render(tmp_path, "--model", str(zoo["c2i"]), "--prompt", "a cat", "--resolution", "64")
    assert code == 2 and "is class-conditional: give --class-id" in capsys.readouterr().err
    code, _ = render(tmp_path, "--model", str(zoo["janus"]), "--prompt", "a cat", "--group-size", "0", "--mode", "gsd")
    assert code == 2 and "--group-size must be an integer in [1, 1000] (got 0)" in capsys.readouterr().err
    code, _ = render(tmp_path, "--model", str(zoo["janus"]), "--prompt", "a cat", "--resolution", "512")
    assert code == 2 and "resolution must be one of [8]" in capsys.readouterr().err
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    shutil.copy(zoo["c2i"], lonely / "gpt.pt")
    code, _ = render(tmp_path, "--model", str(lonely / "gpt.pt"), "--class-id", "1")
    assert code == 2 and "needs its VQ decoder" in capsys.readouterr().err


def test_a_sibling_model_drafts_for_render(zoo, tmp_path, capsys):
    # a second copy of the target drafts for it: q equals p, so every draft stands and
    # each verified forward commits the window and the new token
    code, out = render(tmp_path, "--model", str(zoo["c2i"]), "--drafter", str(zoo["c2i"]), "--class-id", "3",
                       "--resolution", "64", "--mode", "sjd", "--seed", "5")
    assert code == 0, capsys.readouterr().err
    assert "drafts from LlamaGen" in capsys.readouterr().out
    report = json.loads((out / "sjd_5.json").read_text())["reports"][0]
    assert report["drafter"].startswith("LlamaGen") and report["drafter_time_s"] > 0
    assert report["tokens"] == 16 and report["nfe"] == 1 + -(-15 // 5)


def test_a_drafter_that_cannot_draft_is_refused_before_decoding(zoo, tmp_path, capsys):
    other = write_gpt(tmp_path / "other.pt", random_gpt(tiny_gpt_spec("c2i", vocab=512), 3))
    code, out = render(tmp_path, "--model", str(zoo["c2i"]), "--drafter", str(other), "--class-id", "3",
                       "--resolution", "64")
    err = capsys.readouterr().err
    assert code == 2 and f"--drafter {other}: the LlamaGen" in err and "vocabulary 512 ids, the target's 1024" in err
    assert not out.exists() or not list(out.iterdir())
    code, _ = render(tmp_path, "--model", str(zoo["c2i"]), "--drafter", str(zoo["janus"]), "--class-id", "3",
                     "--resolution", "64")
    err = capsys.readouterr().err
    assert code == 2 and "a text-conditional janus model cannot draft for the class-conditional" in err
    # plain AR has no drafts: refused before any model is read
    code, _ = render(tmp_path, "--model", str(tmp_path / "missing.pt"), "--drafter", str(zoo["c2i"]),
                     "--class-id", "3", "--mode", "ar")
    assert code == 2 and "--drafter drafts for the speculative modes, not --mode ar" in capsys.readouterr().err


class Payload:
    """Any class outside the weights-only allowlist."""


def test_pickles_load_weights_only(tmp_path):
    from spec_ar.formats.checkpoints import load_file

    evil = tmp_path / "evil.pt"
    torch.save({"model": {"w": torch.zeros(1)}, "payload": Payload()}, evil)
    with pytest.raises(CheckpointError, match=r"refused: it pickles a non-tensor object \(.*Payload\)"):
        load_file(evil)
