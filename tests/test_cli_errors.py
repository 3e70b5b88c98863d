"""The command line with bad input: one line on stderr naming what was given, exit
status 2, before any heavy work, and nothing written."""
from __future__ import annotations

import pathlib
import shutil

import pytest
import torch

from spec_ar.cli import main
from spec_ar.loaders.llamagen import load
from spec_ar.output_folders import write_all

from . import checkpoints as ck

LATIN1 = "a red circle\nune crème rouge\n".encode("latin-1")


def run(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def embedded_render(tmp, *extra):
    return ("render", "--model", "embedded", "--prompt", "a red circle", "--out", str(tmp / "out"), *extra)


CASES = [  # (arguments, a part the one-line message must hold)
    (lambda t: embedded_render(t, "--batch", "10000"), "the largest batch that fits is"),
    (lambda t: embedded_render(t, "--batch", "0"), "--batch must be an integer >= 1"),
    (lambda t: embedded_render(t, "--lantern-k", "2000000", "--mode", "lantern"),
     "--lantern-k must be an integer in [1, the model's codebook size - 1] (got 2000000)"),
    (lambda t: embedded_render(t, "--lantern-k", "2000", "--mode", "lantern"),
     "--lantern-k must be an integer in [1, 511] for this model's codebook of 512 codes (got 2000)"),
    (lambda t: embedded_render(t, "--class-id", "3"), "give --prompt (text-conditional models) or --class-id"),
    (lambda t: ("render", "--model", "embedded", "--class-id", "3", "--out", str(t / "out")),
     "is text-conditional: give --prompt"),
    (lambda t: ("render", "--model", "embedded", "--prompt", "a red circle " + "very " * 2000, "--out",
                str(t / "out")), "characters)"),
    (lambda t: embedded_render(t, "--out", str(t / "file.txt")), "file.txt is a file, not a folder"),
    (lambda t: embedded_render(t, "--out", str(t / "file.txt" / "sub")), "file.txt is a file, not a folder"),
    (lambda t: embedded_render(t, "--mode", "fast"), "--mode must be one of"),
    (lambda t: embedded_render(t, "--device", "tpu"), "device must be cpu, cuda or cuda:N (got 'tpu')"),
    (lambda t: ("bench", "--prompts", str(t / "latin1.txt"), "--out", str(t / "out")),
     "latin1.txt: not UTF-8 text (byte 0xe8 on line 2)"),
    (lambda t: ("bench", "--prompts", str(t / "missing.txt"), "--out", str(t / "out")), "missing.txt: no such file"),
    (lambda t: ("queue", "--server", "http://127.0.0.1:1", "--workflow", "workflows/api/embedded_t2i_ar.json",
                "--prompts", str(t / "latin1.txt"), "--out", str(t / "out")), "latin1.txt: not UTF-8 text"),
    (lambda t: ("demo", "--out", str(t / "file.txt")), "file.txt is a file, not a folder"),
]


@pytest.mark.parametrize("case,message", CASES, ids=range(len(CASES)))
def test_bad_input_is_one_line(tmp_path, capsys, case, message):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "latin1.txt").write_bytes(LATIN1)
    code, out, err = run(capsys, *case(tmp_path))
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert len(err) < 600 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(Exception, match="mode must be one of"):
        main(["--debug", *embedded_render(tmp_path, "--mode", "fast")])


@pytest.mark.parametrize("seed", [str(2**63 - 1), str(2**70), "-5"])
def test_any_integer_seed_renders(tmp_path, capsys, seed):
    code, out, err = run(capsys, *embedded_render(tmp_path, "--batch", "2", "--seed", seed, "--mode", "ar"))
    assert code == 0, err
    assert len(list((tmp_path / "out").glob("*.png"))) == 2


def test_seeds_are_taken_modulo_2_to_the_64(tmp_path, capsys):
    files = []
    for seed in ("-1", str(2**64 - 1)):
        out = tmp_path / seed
        # the window set: on auto its width follows forward costs measured per load, which a busy machine moves
        assert run(capsys, "render", "--model", "embedded", "--prompt", "a red circle", "--mode", "sjd", "--seed",
                   seed, "--window", "24", "--out", str(out))[0] == 0
        files.append(next(out.glob("*.png")).read_bytes())
    assert files[0] == files[1]


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    real = pathlib.Path.replace
    calls = []

    def flaky(self, target):
        calls.append(target)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(self, target)

    monkeypatch.setattr(pathlib.Path, "replace", flaky)
    with pytest.raises(ValueError, match="No space left on device"):
        write_all(tmp_path / "out", {"a.png": b"1", "b.png": b"2", "c.json": b"3"})
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.skipif(getattr(__import__("os"), "geteuid", lambda: 0)() == 0, reason="root may write anywhere")
def test_an_unwritable_output_folder_is_refused(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    code, _, err = run(capsys, *embedded_render(tmp_path, "--out", str(locked / "out")))
    assert code == 2 and "is not writable" in err


def test_llamagen_grid_comes_from_freqs_cis_then_the_file_name_then_a_warned_default(tmp_path):
    gpt = ck.random_gpt(ck.tiny_gpt_spec("c2i"))
    vq = ck.write_vq(tmp_path / "vq.pt")
    released = ck.write_gpt(tmp_path / "c2i_B_256.pt", gpt)
    renamed = shutil.copy(released, tmp_path / "my_model.pt")
    old = ck.write_gpt(tmp_path / "old_c2i_L_256.pt", gpt, freqs_cis=8)  # freqs_cis (8 x 8) beats the name
    cases = [(released, None, 256, False), (renamed, None, 384, True), (renamed, 256, 256, False),
             (old, None, 128, False), (released, 512, 512, False)]
    for path, asked, resolution, warned in cases:
        model = load(path, vq, resolution=asked)
        assert model.resolution == resolution and bool(model.warnings) == warned, (path, asked)
    assert "neither in the weights nor in the file name" in load(renamed, vq).warnings[0]
    assert torch.is_tensor(load(released, vq).adapter.layout.forced)


def test_render_prints_the_grid_warning(tmp_path, capsys):
    gpt = ck.random_gpt(ck.tiny_gpt_spec("c2i"))
    model = ck.write_gpt(tmp_path / "my_model.pt", gpt)
    ck.write_vq(tmp_path / "vq_ds16_c2i.pt")
    code, out, err = run(capsys, "render", "--model", str(model), "--class-id", "1", "--mode", "ar", "--out",
                         str(tmp_path / "out"), "--top-k", "5", "--batch", "1")
    assert code == 0 and err.startswith("warning: my_model.pt: the image size is stored neither"), err
