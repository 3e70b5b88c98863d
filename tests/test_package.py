"""The repository is a ComfyUI pack and the package ``spec_ar`` at once."""
from __future__ import annotations

import ast
import importlib.util
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_importing_the_pack_loads_nothing_heavy():
    out = run_python("import sys, spec_ar; print(sorted(m for m in ('torch', 'numpy', 'transformers', 'comfy') "
                     "if m in sys.modules)); print(spec_ar.NODE_CLASS_MAPPINGS)")
    assert out.splitlines()[0] == "[]"


def test_comfyui_can_import_the_folder_under_any_name():
    code = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("ComfyUI-SpeculativeAR", {str(ROOT / '__init__.py')!r},
                                              submodule_search_locations=[{str(ROOT)!r}])
mod = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mod
spec.loader.exec_module(mod)
print(type(mod.NODE_CLASS_MAPPINGS).__name__)
eng = importlib.import_module("ComfyUI-SpeculativeAR.sampling")
print(eng.DecodeConfig().mode)
"""
    assert run_python(code).split() == ["dict", "sjd"]


def test_the_entry_point_imports_as_a_bare_file():
    """pytest imports the pack folder's __init__.py as a plain module when the folder's
    name is no identifier (``ComfyUI-SpeculativeAR``): no package, no nodes, no error."""
    code = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("__init__", {str(ROOT / '__init__.py')!r})
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
print(mod.NODE_CLASS_MAPPINGS)
"""
    assert run_python(code).strip() == "{}"


def test_comfyui_is_imported_only_in_nodes_and_the_entry_point():
    allowed = {ROOT / "__init__.py"} | set((ROOT / "nodes").rglob("*.py"))
    comfy = ("comfy", "comfy_api", "folder_paths", "server", "execution", "nodes")
    for path in ROOT.rglob("*.py"):
        if any(part in {".venv", ".comfyui", "tests", "build"} for part in path.relative_to(ROOT).parts):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in comfy:
                    assert path in allowed, f"{path.relative_to(ROOT)} imports {name}"


def test_the_engine_knows_no_family():
    """No model library either; that it imports nothing of the pack outside sampling/
    is tests/test_layers.py's check."""
    for path in (ROOT / "sampling").glob("*.py"):
        text = path.read_text()
        for imp in ("import transformers", "from transformers"):
            assert imp not in text, f"sampling/{path.name}: {imp}"


def test_installed_name_is_spec_ar():
    assert importlib.util.find_spec("spec_ar") is not None
    assert importlib.util.find_spec("spec_ar.sampling") is not None


def test_a_non_editable_install_carries_every_module_and_shipped_file():
    import fnmatch
    import tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    for init in [*ROOT.glob("*/__init__.py"), *ROOT.glob("*/*/__init__.py")]:  # bench/scale_checkpoints/ too
        folder = init.parent.relative_to(ROOT)
        if folder.parts[0] not in ("tests", "out", "build") and not folder.parts[0].startswith("."):
            assert f"spec_ar.{'.'.join(folder.parts)}" in listed, f"{folder}/ is missing from pyproject's packages"
    patterns = setup["package-data"]["spec_ar"]
    shipped = [p.relative_to(ROOT).as_posix() for p in (ROOT / "embedded" / "weights").rglob("*") if p.is_file()]
    assert shipped and all(any(fnmatch.fnmatchcase(f, pat) and f.count("/") == pat.count("/") for pat in patterns)
                           for f in shipped), (shipped, patterns)


def test_make_comfyui_installs_every_frontend_the_page_tests_run():
    from .web_page import FRONTENDS

    makefile = (ROOT / "Makefile").read_text()
    pinned = re.search(r"^FRONTEND_PINNED := (\S+)$", makefile, re.M).group(1)
    newest = re.search(r"^FRONTEND_NEWEST := (\S+)$", makefile, re.M).group(1)
    assert FRONTENDS == (pinned, newest)
    comfy_pins = ROOT / ".comfyui" / "ComfyUI" / "requirements.txt"
    if comfy_pins.is_file():  # the frontend ComfyUI itself asks for is the pinned one
        assert f"comfyui-frontend-package=={pinned}" in comfy_pins.read_text()
