"""`spec-ar render` with the part-2 families: the family detected from the folder."""
import json

import pytest

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


@pytest.fixture(scope="module")
def liquid_folder(tmp_path_factory):
    from .liquid_files import write_liquid

    return write_liquid(tmp_path_factory.mktemp("liquid") / "Liquid_V1_7B")


@pytest.mark.parametrize("mode", ["ar", "sjd", "gsd", "lantern", "vvs"])
def test_render_liquid_in_every_mode_with_its_reference_defaults(liquid_folder, tmp_path, mode):
    extra = ["--lantern-k", "16"] if mode in ("lantern", "vvs") else []
    assert main(["render", "--model", str(liquid_folder), "--prompt", "a red fox", "--mode", mode, *extra,
                 "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / f"{mode}_0.json").read_text())
    assert report["family"] == "liquid" and report["resolution"] == 512 and report["reports"][0]["tokens"] == 1024
    assert (tmp_path / "out" / f"{mode}_0.png").is_file()
    settings = report["reports"][0]["settings"]  # Liquid's reference sampling, unless the user sets otherwise
    assert (settings["cfg_scale"], settings["top_k"], settings["top_p"], settings["temperature"]) == (7.0, 4096, 0.96,
                                                                                                    0.99)


@pytest.fixture(scope="module")
def lumina2_folder(tmp_path_factory):
    from .lumina2_files import write_lumina2

    return write_lumina2(tmp_path_factory.mktemp("lumina2") / "Lumina-mGPT-2.0")


@pytest.mark.parametrize("mode", ["ar", "sjd", "gsd", "lantern", "vvs"])
def test_render_lumina2_in_every_mode_with_its_reference_defaults(lumina2_folder, tmp_path, mode):
    extra = ["--lantern-k", "16"] if mode in ("lantern", "vvs") else []
    assert main(["render", "--model", str(lumina2_folder), "--prompt", "a red fox", "--mode", mode, *extra,
                 "--width", "96", "--height", "64", "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / f"{mode}_0.json").read_text())
    assert report["family"] == "lumina2" and report["reports"][0]["tokens"] == 2 + 8 * 13 + 1
    assert (tmp_path / "out" / f"{mode}_0.png").is_file()
    settings = report["reports"][0]["settings"]  # the reference's sampling, unless the user sets otherwise
    assert (settings["cfg_scale"], settings["top_k"], settings["temperature"]) == (4.0, 4096, 1.0)


@pytest.fixture(scope="module")
def simplear_folder(tmp_path_factory):
    from .simplear_files import write_simplear

    return write_simplear(tmp_path_factory.mktemp("simplear") / "SimpleAR-0.5B-RL")


@pytest.mark.parametrize("mode", ["ar", "sjd", "gsd", "lantern", "vvs"])
def test_render_simplear_in_every_mode_with_its_reference_defaults(simplear_folder, tmp_path, mode):
    extra = ["--lantern-k", "16"] if mode in ("lantern", "vvs") else []
    assert main(["render", "--model", str(simplear_folder), "--prompt", "a red fox", "--mode", mode, *extra,
                 "--width", "96", "--height", "64", "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / f"{mode}_0.json").read_text())
    assert report["family"] == "simplear" and report["reports"][0]["tokens"] == 4 * 6
    assert (tmp_path / "out" / f"{mode}_0.png").is_file()
    settings = report["reports"][0]["settings"]  # the reference's sampling, unless the user sets otherwise
    assert (settings["cfg_scale"], settings["top_k"], settings["top_p"], settings["temperature"]) == (6.0, 64000, 1.0,
                                                                                                    1.0)
