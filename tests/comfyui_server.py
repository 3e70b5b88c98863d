"""A real ComfyUI server for the integration tests, and the workflow format converter.

The server is ComfyUI's own code: ``COMFYUI_DIR`` (any checkout) run by
``COMFYUI_PYTHON`` (an environment with ComfyUI's requirements).  ``make test``
prepares both under ``.comfyui/`` (see the Makefile); without them the
integration tests are skipped with the reason.
"""
from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid

from spec_ar.workflows.format import ui_to_api  # noqa: F401  (re-exported for the tests)

REPO = pathlib.Path(__file__).resolve().parent.parent
CACHE = REPO / ".comfyui"


def locate() -> tuple[pathlib.Path, pathlib.Path] | str:
    """``(ComfyUI folder, python)`` or the reason there is none."""
    folder = pathlib.Path(os.environ.get("COMFYUI_DIR", CACHE / "ComfyUI"))
    python = pathlib.Path(os.environ.get("COMFYUI_PYTHON", CACHE / "venv" / "bin" / "python"))
    if not (folder / "main.py").is_file():
        return f"no ComfyUI at {folder} (run `make comfyui` or set COMFYUI_DIR)"
    if not python.is_file():
        return f"no Python environment for ComfyUI at {python} (run `make comfyui` or set COMFYUI_PYTHON)"
    return folder, python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyServer:
    """``with ComfyServer(base, models) as server:`` a server on a free loopback port,
    with this repository installed as a custom node pack and ``models`` as the
    ``spec_ar`` model folder; killed (by its own pid) on exit.  ``frontend``: serve
    the web page, ``True`` the ``comfyui-frontend-package`` in ComfyUI's environment, a
    path another version's ``static`` folder."""

    def __init__(self, base: pathlib.Path, models: pathlib.Path, startup_s: float = 180,
                 frontend: bool | pathlib.Path = False):
        located = locate()
        if isinstance(located, str):
            raise RuntimeError(located)
        self.folder, self.python = located
        self.base, self.models, self.startup_s, self.frontend = base, models, startup_s, frontend
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = base / "server.log"
        self.proc = None

    def __enter__(self):
        nodes = self.base / "packs"
        nodes.mkdir(parents=True, exist_ok=True)
        (self.base / "custom_nodes").mkdir(exist_ok=True)
        (self.base / "frontend").mkdir(exist_ok=True)
        link = self.pack = nodes / "ComfyUI-SpeculativeAR"  # any folder name must work
        if not link.exists():
            link.symlink_to(REPO, target_is_directory=True)
        config = self.base / "extra_model_paths.yaml"
        config.write_text(f"tests:\n  base_path: {self.base}\n  custom_nodes: {nodes}\n  spec_ar: {self.models}\n")
        cmd = [str(self.python), "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
               "--base-directory", str(self.base), "--disable-api-nodes", "--extra-model-paths-config",
               str(config), "--preview-method", "none"]
        if self.frontend is False:  # the API alone: an empty page folder (the web page needs comfyui-frontend-package)
            cmd += ["--front-end-root", str(self.base / "frontend")]
        elif self.frontend is not True:
            cmd += ["--front-end-root", str(self.frontend)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
        self.proc = subprocess.Popen(cmd, cwd=self.folder, stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                     env=env)
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            try:
                self.get("/system_stats", timeout=2)
                return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        self.__exit__(None, None, None)
        raise RuntimeError(f"ComfyUI did not answer within {self.startup_s} s:\n{self.log_text()[-3000:]}")

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def pack_failures(self) -> list[str]:
        """Log lines where ComfyUI failed to import this pack (ComfyUI's own optional nodes,
        such as those needing torchaudio, may fail; the clone's path can contain our name)."""
        pack = str(self.pack)
        return [ln for ln in self.log_text().splitlines()
                if pack in ln and ("FAILED" in ln or "Cannot import" in ln)]

    # -- HTTP --------------------------------------------------------------------------
    def get(self, path: str, timeout: float = 30):
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            body = r.read()
        return json.loads(body) if body[:1] in (b"{", b"[") else body

    def post(self, path: str, payload: dict, timeout: float = 30):
        req = urllib.request.Request(self.url + path, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                body = r.read()
                return r.status, (json.loads(body) if body else None)
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def queue(self, prompt: dict) -> tuple[int, dict]:
        return self.post("/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})

    def wait(self, prompt_id: str, timeout: float = 600) -> dict:
        """The history entry once the prompt has finished (or failed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hist = self.get(f"/history/{prompt_id}")
            entry = hist.get(prompt_id)
            if entry and entry.get("status", {}).get("completed") is not None:
                if entry["status"].get("status_str") in ("success", "error"):
                    return entry
            time.sleep(0.3)
        raise TimeoutError(f"prompt {prompt_id} not finished after {timeout} s")

    def run(self, prompt: dict, timeout: float = 600) -> dict:
        status, body = self.queue(prompt)
        if status != 200:
            raise AssertionError(f"/prompt refused the workflow ({status}): {body}")
        return self.wait(body["prompt_id"], timeout)


def error_of(entry: dict) -> dict | None:
    for kind, data in entry.get("status", {}).get("messages", []):
        if kind == "execution_error":
            return data
    return None
