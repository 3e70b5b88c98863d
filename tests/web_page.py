"""ComfyUI's web page in a real browser, for the tests and for ``workflows/build.py``.

The page is the ``comfyui-frontend-package`` that ComfyUI serves (``make comfyui``
installs it), opened by Playwright in Debian's Chromium: Playwright's own browser
download cannot run here, so :func:`chromium` finds the system browser, installing
Debian's package when it can (root with apt-get).  :class:`WebPage` records what a
person would notice: page errors, console errors and failed requests.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import time

#: where the system browser lives, first found wins (``CHROMIUM`` overrides)
CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
PACK = "ComfyUI-SpeculativeAR"  # the pack's folder name in the test server (ComfyServer links it so)
#: settings of a user past the first-run dialogs (the Templates browser opens on a first visit), and
#: text drawn at any zoom so that screenshots of a whole graph stay readable
SETTINGS = {"Comfy.TutorialCompleted": True, "LiteGraph.Canvas.MinFontSizeForLOD": 1}


def chromium(install: bool = True) -> str:
    """The browser's path, or raises ``RuntimeError`` with one line saying what is missing."""
    env = os.environ.get("CHROMIUM")
    found = [p for p in ((env,) if env else CHROMIUM_PATHS) if p and pathlib.Path(p).is_file()]
    if found:
        return found[0]
    if install and os.geteuid() == 0 and shutil.which("apt-get"):
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ,
                     DEBIAN_FRONTEND="noninteractive"), timeout=900)
        ok = subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], **quiet).returncode == 0
        if not ok:  # a fresh machine's package lists may be missing
            subprocess.run(["apt-get", "update", "-q"], **quiet)
            subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], **quiet)
        return chromium(install=False)
    raise RuntimeError("no Chromium: install Debian's package (apt-get install chromium) or set CHROMIUM=<path>")


def playwright_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "no Playwright: pip install playwright (the test extra installs it)"
    return None


def frontend_missing(python: pathlib.Path) -> str | None:
    """Why ComfyUI's environment cannot serve the web page, or None."""
    probe = subprocess.run([str(python), "-c", "import comfyui_frontend_package"], capture_output=True)
    return None if probe.returncode == 0 else f"no comfyui-frontend-package in {python} (run `make comfyui`)"


def prepare_user(base: pathlib.Path) -> None:
    """The server's user folder as a returning user has it (call before the server starts)."""
    user = base / "user" / "default"
    (user / "workflows").mkdir(parents=True, exist_ok=True)
    (user / "comfy.settings.json").write_text(json.dumps(SETTINGS))


class WebPage:
    """``with WebPage(server_url) as page:`` the ComfyUI page in headless Chromium."""

    def __init__(self, url: str, viewport: tuple[int, int] = (2400, 1350)):
        self.url, self.viewport = url, viewport
        self.page_errors: list[str] = []  # uncaught exceptions
        self.console_errors: list[str] = []
        self.failed: list[str] = []  # "STATUS URL" (or "failed URL") for every request that did not succeed
        self.loaded: list[str] = []  # URLs answered 200

    def __enter__(self):
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        self.browser = self._pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        self.page = self.browser.new_page(viewport={"width": self.viewport[0], "height": self.viewport[1]})
        self.page.on("pageerror", lambda e: self.page_errors.append(f"{e}\n{getattr(e, 'stack', '')}"))
        self.page.on("console", lambda m: self.console_errors.append(f"{m.text} @ {m.location.get('url', '')}")
                     if m.type == "error" else None)
        self.page.on("requestfailed", lambda r: self.failed.append(f"failed {r.url}"))
        self.page.on("response", lambda r: self.failed.append(f"{r.status} {r.url}") if r.status >= 400
                     else self.loaded.append(r.url) if r.status == 200 else None)
        self.open()
        return self

    def open(self) -> None:
        """(Re)load the page and wait until the graph editor is up (closes any dialog)."""
        self.page.goto(self.url)
        self.page.wait_for_function("() => window.app && window.app.graph && window.app.canvas", timeout=120_000)
        # node types are registered once the server's definitions are in (ComfyUI's own SaveImage: always there)
        self.page.wait_for_function("() => document.readyState === 'complete'"
                                    " && !!window.LiteGraph?.registered_node_types?.SaveImage", timeout=60_000)

    def __exit__(self, *exc):
        self.browser.close()
        self._pw.stop()

    def js(self, script: str, arg=None):
        return self.page.evaluate(script, arg)

    # -- what the pack's files did ---------------------------------------------------
    def pack_failures(self) -> list[str]:
        """Failed requests for the pack's own files (its page extension and templates)."""
        return [f for f in self.failed if f"/{PACK}/" in f]

    def pack_errors(self) -> list[str]:
        """Page errors and console errors raised by the pack's extension."""
        return [e for e in self.page_errors + self.console_errors if PACK in e or "Speculative AR" in e]

    # -- graphs ------------------------------------------------------------------------
    def load(self, workflow: dict, name: str = "workflow") -> None:
        self.js("async ([wf, name]) => { await window.app.loadGraphData(wf, true, true, name); }", [workflow, name])
        self.page.wait_for_timeout(300)  # the frontend sizes DOM widgets on the next frames

    def nodes(self) -> list[dict]:
        """Every node of the open graph: type, whether its type is registered, its box as
        drawn (``[x, y, w, h]`` with the title bar) and its visible widgets."""
        return self.js("""() => {
            const title = window.LiteGraph.NODE_TITLE_HEIGHT;
            return window.app.graph.nodes.map((n) => ({
                id: n.id, type: n.type,
                registered: !!window.LiteGraph.registered_node_types[n.type],
                box: [n.pos[0], n.pos[1] - title, n.size[0], n.size[1] + title],
                widgets: (n.widgets || []).filter((w) => !w.hidden).map((w) => w.name),
            }));
        }""")

    def groups(self) -> list[dict]:
        return self.js("() => window.app.graph.groups.map((g) => ({title: g.title, box: [...g._bounding]}))")

    def fit(self) -> None:
        """The whole graph in view (drawn at full detail where it fits)."""
        self.js("""() => {
            const c = window.app.canvas;
            const nodes = window.app.graph.nodes;
            if (!nodes.length) return;
            const title = window.LiteGraph.NODE_TITLE_HEIGHT;
            const xs = nodes.flatMap((n) => [n.pos[0], n.pos[0] + n.size[0]]);
            const ys = nodes.flatMap((n) => [n.pos[1] - title, n.pos[1] + n.size[1]]);
            for (const g of window.app.graph.groups) { xs.push(g.pos[0], g.pos[0] + g.size[0]);
                                                       ys.push(g.pos[1], g.pos[1] + g.size[1]); }
            const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
            const rect = c.canvas.getBoundingClientRect();
            const scale = Math.min(1, 0.92 * rect.width / (x1 - x0), 0.86 * rect.height / (y1 - y0));
            c.ds.scale = scale;
            c.ds.offset[0] = (rect.width / scale - (x1 - x0)) / 2 - x0;
            c.ds.offset[1] = (rect.height / scale - (y1 - y0)) / 2 - y0 + 20 / scale;
            c.setDirty(true, true);
        }""")
        self.page.wait_for_timeout(400)

    def screenshot(self, path: pathlib.Path) -> pathlib.Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path))
        return path

    def queue(self) -> None:
        """Queue the open graph as the Run button does."""
        self.js("async () => { await window.app.queuePrompt(0, 1); }")

    def wait_idle(self, server, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        time.sleep(0.5)
        while time.monotonic() < deadline:
            q = server.get("/queue")
            if not q["queue_running"] and not q["queue_pending"]:
                self.page.wait_for_timeout(800)  # the page fetches the images after the last message
                return
            time.sleep(0.5)
        raise TimeoutError(f"the queue did not empty within {timeout} s")


def overlaps(boxes: list[tuple[str, list[float]]]) -> list[tuple[str, str]]:
    """Pairs of named boxes ``[x, y, w, h]`` that intersect."""
    out = []
    for i, (a, (ax, ay, aw, ah)) in enumerate(boxes):
        for b, (bx, by, bw, bh) in boxes[i + 1:]:
            if ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah:
                out.append((a, b))
    return out
