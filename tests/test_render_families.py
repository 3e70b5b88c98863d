"""`spec-ar render` with the part-2 families: the family detected from the folder."""
import json

from spec_ar.cli import main

from .chameleon_files import write_chameleon
from .emu3_files import write_emu3


def test_render_anole(tmp_path):
    folder = write_chameleon(tmp_path / "Anole-7b-hf", "anole", seed=1)
    assert main(["render", "--model", str(folder), "--prompt", "a red fox", "--mode", "gsd", "--window", "32",
                 "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "gsd_0.json").read_text())
    assert report["family"] == "anole" and report["reports"][0]["tokens"] == 1025


def test_render_emu3_with_a_negative_prompt(tmp_path, capsys):
    folder = write_emu3(tmp_path / "Emu3-Gen-hf")
    assert main(["render", "--model", str(folder), "--prompt", "a cat", "--mode", "vvs", "--lantern-k", "16",
                 "--negative-prompt", "blurry", "--width", "64", "--height", "64", "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "vvs_0.json").read_text())
    assert report["family"] == "emu3" and report["resolution"] == 64 and report["reports"][0]["tokens"] == 8 * 9 + 2
    assert main(["render", "--model", str(folder), "--prompt", "a cat", "--resolution", "60",
                 "--out", str(tmp_path / "out")]) == 2
    assert "resolution must be a multiple of 8 pixels" in capsys.readouterr().err
