"""Registry-ready: the pack's metadata passes the Comfy Registry's own validation
(comfy-cli, offline) and the archive `comfy node publish` would upload carries no
tests, CI or benchmark data."""
from __future__ import annotations

import os
import re
import pathlib
import shutil
import subprocess
import tomllib
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
COMFY = pathlib.Path(os.environ.get("COMFY_CLI", REPO / ".comfyui" / "cli" / "bin" / "comfy"))


def comfy(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    if not COMFY.is_file():
        pytest.skip(f"no comfy-cli at {COMFY} (run `make comfyui` or set COMFY_CLI)")
    env = {**os.environ, "PATH": f"{COMFY.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([str(COMFY), "--skip-prompt", "--no-enable-telemetry", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_metadata_is_complete():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    comfy_table, project = config["tool"]["comfy"], config["project"]
    assert comfy_table["PublisherId"] and comfy_table["DisplayName"] and comfy_table["requires-comfyui"]
    # the icon is a file of this repository, named by its raw URL on the default branch
    icon = comfy_table["Icon"]
    repo_url = project["urls"]["Repository"].replace("https://github.com/", "https://raw.githubusercontent.com/")
    assert icon.startswith(repo_url + "/main/")
    assert (REPO / icon.removeprefix(repo_url + "/main/")).is_file()
    assert "Operating System :: OS Independent" in project["classifiers"]
    assert "ComfyUI" not in project["name"]


def test_comfy_node_validate_is_clean():
    result = comfy("node", "validate")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "All validation checks passed" in out and "Warning" not in out, out


def test_the_published_archive_holds_the_pack_and_nothing_else(tmp_path):
    result = comfy("node", "pack")
    made = REPO / "node.zip"
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        archive = shutil.move(made, tmp_path / "node.zip")
    finally:
        made.unlink(missing_ok=True)
    with zipfile.ZipFile(archive) as z:
        names = z.namelist()
    assert {"__init__.py", "pyproject.toml", "README.md", "embedded/weights/model.safetensors"} <= set(names)
    assert any(n.startswith("nodes/") for n in names) and any(n.startswith("web/") for n in names)
    assert any(n.startswith("workflows/") and n.endswith(".json") for n in names)
    leaked = [n for n in names if n.split("/")[0] in ("tests", ".ci")
              or re.match(r"docs/bench[^/]*/", n) or ".work/" in n or "shard_" in n]
    assert not leaked, leaked
    size = pathlib.Path(archive).stat().st_size
    assert size < 20 * 2**20, f"the archive is {size / 2**20:.1f} MB"
    print(f"archive: {len(names)} files, {size / 2**20:.1f} MB")
