"""Corrupt, truncated and mismatched files: one clear error naming the file, from
the loaders and from ``spec-ar render`` (no traceback), before any decoding."""
from __future__ import annotations

import pathlib
import pickle
import shutil

import pytest
import torch

from spec_ar.cli import main
from spec_ar.loaders import embedded
from spec_ar.formats.checkpoints import CheckpointError
from spec_ar.loaders.detect import load_model

from . import checkpoints as ck


def _gpt(tmp: pathlib.Path, suffix=".pt") -> pathlib.Path:
    path = ck.write_gpt(tmp / f"c2i_B_256{suffix}", ck.random_gpt(ck.tiny_gpt_spec("c2i")))
    ck.write_vq(tmp / "vq_ds16_c2i.pt")
    return path


def text_as_safetensors(tmp):
    path = tmp / "model.safetensors"
    path.write_text("this is not a checkpoint\n" * 10)
    return path, None, [str(path), "not a valid .safetensors file"]


def truncated_safetensors(tmp):
    path = _gpt(tmp, ".safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path, None, [str(path), "truncated or damaged"]


def truncated_pt(tmp):
    path = _gpt(tmp)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path, None, [str(path), "cannot be read"]


def truncated_embedded(tmp):
    folder = tmp / "embedded"
    shutil.copytree(embedded.FOLDER, folder)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 3])
    return folder, None, [str(folder / "model.safetensors"), "truncated or damaged"]


def wrong_shape(tmp):
    path = _gpt(tmp)
    sd = torch.load(path, weights_only=False)
    sd["model"]["layers.0.attention.wo.weight"] = torch.zeros(128, 64)
    torch.save(sd, path)
    return path, None, [str(path), "layers.0.attention.wo.weight", "[128, 64]", "[128, 128]"]


def vq_width_mismatch(tmp):
    path = _gpt(tmp)
    sd = torch.load(tmp / "vq_ds16_c2i.pt", weights_only=True)
    sd["model"]["quantize.embedding.weight"] = torch.randn(1024, 12)  # codes 12 wide, the decoder reads 8
    torch.save(sd, tmp / "vq_ds16_c2i.pt")
    return path, tmp / "vq_ds16_c2i.pt", [str(tmp / "vq_ds16_c2i.pt"), "quant_conv.weight", "of width 12"]


def janus_without_weights(tmp):
    model, tok = ck.tiny_janus()
    folder = ck.write_janus(tmp / "Janus-Pro-1B", model, tok)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    return folder, None, [str(folder), "no weights"]


class _Exploit:
    def __reduce__(self):
        return (print, ("pwned",))


def janus_refused_pickle(tmp):
    model, tok = ck.tiny_janus()
    folder = ck.write_original_janus(tmp / "Janus-Pro-7B", model, tok)
    with open(folder / "pytorch_model.bin", "wb") as fh:
        pickle.dump({"x": _Exploit()}, fh)
    return folder, None, [str(folder / "pytorch_model.bin"), "weights-only"]


def config_is_a_list(tmp):
    model, tok = ck.tiny_janus()
    folder = ck.write_janus(tmp / "Janus-Pro-1B", model, tok)
    (folder / "config.json").write_text("[1, 2, 3]")
    return folder, None, [str(folder / "config.json"), "a JSON object", "a list"]


def config_invalid_json(tmp):
    model, tok = ck.tiny_janus()
    folder = ck.write_janus(tmp / "Janus-Pro-1B", model, tok)
    (folder / "config.json").write_text('{"model_type": "janus",\n "oops"')
    return folder, None, [str(folder / "config.json"), "not valid JSON", "line 2"]


CASES = [text_as_safetensors, truncated_safetensors, truncated_pt, truncated_embedded, wrong_shape,
         vq_width_mismatch, janus_without_weights, janus_refused_pickle, config_is_a_list, config_invalid_json]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_loader_names_the_bad_file(tmp_path, case):
    model, vq, expected = case(tmp_path)
    with pytest.raises(CheckpointError) as err:
        load_model(str(model), str(vq) if vq else None)
    for part in expected:
        assert part in str(err.value), str(err.value)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_render_prints_one_line_and_writes_nothing(tmp_path, case, capsys):
    model, vq, expected = case(tmp_path)
    capsys.readouterr()  # what writing the files printed
    out = tmp_path / "out"
    args = ["render", "--model", str(model), "--prompt", "a red circle", "--out", str(out)]
    code = main(args + (["--vq", str(vq)] if vq else []))
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and expected[0] in err
    assert not out.exists()
    assert "pwned" not in capsys.readouterr().out
