"""ComfyUI's web page in a real browser, for the tests and for ``workflows/build.py``.

The page is the ``comfyui-frontend-package`` that ComfyUI serves (``make comfyui``
installs it), opened by Playwright in Debian's Chromium: Playwright's own browser
download cannot run here, so :func:`chromium` finds the system browser, installing
Debian's package when it can (root with apt-get).  :class:`WebPage` records what a
person would notice: page errors, console errors and warnings, failed requests.

Two frontends (:data:`FRONTENDS`: the one ComfyUI pins and the newest on PyPI, which
``make comfyui`` installs beside it) and two renderers (the LiteGraph canvas, and
the Vue node renderer, "Nodes 2.0") make four pages.  One server serves them all: a
page of another frontend version has its static files answered from that version's
folder by the browser itself (Playwright's request routing), while the API and the
websocket go to the server as usual.
"""
from __future__ import annotations

import fcntl
import json
import mimetypes
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

#: where the system browser lives, first found wins (``CHROMIUM`` overrides)
CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
PACK = "ComfyUI-SpeculativeAR"  # the pack's folder name in the test server (ComfyServer links it so)
#: settings of a user past the first-run dialogs (the Templates browser opens on a first visit), and
#: text drawn at any zoom so that screenshots of a whole graph stay readable
SETTINGS = {"Comfy.TutorialCompleted": True, "LiteGraph.Canvas.MinFontSizeForLOD": 1}
#: the frontends the page tests run: the version ComfyUI 0.3.75 pins (in ComfyUI's environment) and the
#: newest on PyPI when it was last checked (``make comfyui`` installs it under ``.comfyui/frontends/``)
FRONTENDS = ("1.32.9", "1.58.1")
RENDERERS = ("classic", "vue")
VUE_SETTING = "Comfy.VueNodes.Enabled"
FRONTEND_DIR = pathlib.Path(__file__).resolve().parent.parent / ".comfyui" / "frontends"


def chromium(install: bool = True) -> str:
    """The browser's path, or raises ``RuntimeError`` with one line saying what is missing."""
    env = os.environ.get("CHROMIUM")
    found = [p for p in ((env,) if env else CHROMIUM_PATHS) if p and pathlib.Path(p).is_file()]
    if found:
        return found[0]
    if install and os.geteuid() == 0 and shutil.which("apt-get"):
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ,
                     DEBIAN_FRONTEND="noninteractive"), timeout=900)
        # one install at a time: a second test worker's apt-get would fail on the first's lock, and
        # its page tests skip (seen on a fresh machine: 120 skipped); it waits and finds the browser
        with open(pathlib.Path(tempfile.gettempdir()) / "spec-ar-chromium.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not any(pathlib.Path(p).is_file() for p in ((env,) if env else CHROMIUM_PATHS) if p):
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


def installed_frontend(python: pathlib.Path) -> str | None:
    """The version of the ``comfyui-frontend-package`` in ComfyUI's environment."""
    probe = subprocess.run([str(python), "-c", "import importlib.metadata as m; "
                            "print(m.version('comfyui-frontend-package'))"], capture_output=True, text=True)
    return probe.stdout.strip() if probe.returncode == 0 else None


def frontend_static(version: str, python: pathlib.Path) -> pathlib.Path | str | None:
    """The ``static`` folder of frontend ``version`` (``None``: the server's own), or why there is none."""
    if installed_frontend(python) == version:
        return None
    folder = FRONTEND_DIR / version / "comfyui_frontend_package" / "static"
    if (folder / "index.html").is_file():
        return folder
    return f"no comfyui-frontend-package {version} in {FRONTEND_DIR / version} (run `make comfyui`)"


def prepare_user(base: pathlib.Path) -> None:
    """The server's user folder as a returning user has it (call before the server starts)."""
    user = base / "user" / "default"
    (user / "workflows").mkdir(parents=True, exist_ok=True)
    (user / "comfy.settings.json").write_text(json.dumps(SETTINGS))


#: run in the page before its own scripts: every console warning or error raised while one of the
#: pack's files is on the stack is kept (deprecation notices name the caller only in their stack)
_PACK_MESSAGES = """(() => {
    window.__packMessages = [];
    for (const level of ["warn", "error"]) {
        const original = console[level].bind(console);
        console[level] = (...args) => {
            const stack = new Error().stack || "";
            if (stack.includes("/extensions/%s/"))
                window.__packMessages.push(`${level}: ${args.map(String).join(" ")}\\n${stack}`);
            return original(...args);
        };
    }
})()""" % PACK


#: a Vue node's widget rows as rendered, by widget name: 1.5x names each row (``data-widget-name``);
#: 1.3x does not, and a row is named by the input slot it carries (``data-slot-key`` "<node>-in-<slot>")
_VUE_ROWS = """(n, e) => [...e.querySelectorAll(".lg-node-widget")].filter((row) => row.offsetParent !== null)
    .map((row) => {
        if (row.dataset.widgetName) return row.dataset.widgetName;
        const slot = row.querySelector("[data-slot-key]")?.dataset.slotKey?.match(/-in-(\\d+)$/);
        const input = slot && n.inputs[Number(slot[1])];
        return input ? (input.widget?.name ?? input.name) : row.textContent.trim();
    })"""


#: a Vue node's box ``[x, y, w, h]`` in graph units, from its element (canvas ``c``, its page rect ``view``)
_VUE_BOX = """(c, view, e) => {
    const r = e.getBoundingClientRect(), s = c.ds.scale;
    return [(r.x - view.x) / s - c.ds.offset[0], (r.y - view.y) / s - c.ds.offset[1], r.width / s, r.height / s];
}"""


class WebPage:
    """``with WebPage(server_url) as page:`` the ComfyUI page in headless Chromium.
    ``static``: another frontend version's ``static`` folder to answer the page's own files
    from (:func:`frontend_static`); ``vue``: the Vue node renderer on (else the canvas)."""

    def __init__(self, url: str, viewport: tuple[int, int] = (2400, 1350), static: pathlib.Path | None = None,
                 vue: bool = False):
        self.url, self.viewport, self.static, self.vue = url, viewport, static, vue
        self.page_errors: list[str] = []  # uncaught exceptions
        self.console_errors: list[str] = []
        self.console_warnings: list[str] = []
        self.failed: list[str] = []  # "STATUS URL" (or "failed URL") for every request that did not succeed
        self.loaded: list[str] = []  # URLs answered 200

    def _serve_static(self, route) -> None:
        """Answer a request for one of the frontend's own files from ``self.static``."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(route.request.url).path).lstrip("/") or "index.html"
        file = (self.static / path).resolve()
        if file.is_file() and file.is_relative_to(self.static.resolve()):
            kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
            route.fulfill(status=200, body=file.read_bytes(), headers={"Content-Type": kind})
            self.loaded.append(route.request.url)
        else:
            route.continue_()

    def _set_renderer(self) -> None:
        request = urllib.request.Request(f"{self.url}/settings/{VUE_SETTING}", data=json.dumps(self.vue).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=30).read()

    def __enter__(self):
        from playwright.sync_api import sync_playwright

        self._set_renderer()  # the user's setting, as the settings dialog stores it
        self._pw = sync_playwright().start()
        args = ["--no-sandbox"]
        if self.static is not None:  # files the browser answers itself have no address: Chromium would then
            # take the page for a public one and block its websocket to the loopback server
            args.append("--disable-features=LocalNetworkAccessChecks")
        self.browser = self._pw.chromium.launch(executable_path=chromium(), args=args)
        self.page = self.browser.new_page(viewport={"width": self.viewport[0], "height": self.viewport[1]})
        self.page.add_init_script(_PACK_MESSAGES)
        if self.static is not None:
            self.page.route(f"{self.url}/**", self._serve_static)
        self.page.on("pageerror", lambda e: self.page_errors.append(f"{e}\n{getattr(e, 'stack', '')}"))
        self.page.on("console", self._console)
        self.page.on("requestfailed", self._request_failed)
        self.page.on("response", lambda r: self.failed.append(f"{r.status} {r.url}") if r.status >= 400
                     else self.loaded.append(r.url) if r.status == 200 else None)
        self.open()
        return self

    def _console(self, message) -> None:
        text = f"{message.text} @ {message.location.get('url', '')}"
        if message.type == "error":
            self.console_errors.append(text)
        elif message.type in ("warning", "warn"):
            self.console_warnings.append(text)

    def open(self) -> None:
        """(Re)load the page and wait until the graph editor is up (closes any dialog)."""
        self.page.goto(self.url)
        self.page.wait_for_function("() => window.app && window.app.graph && window.app.canvas", timeout=120_000)
        # node types are registered once the server's definitions are in (ComfyUI's own SaveImage: always there)
        self.page.wait_for_function("() => document.readyState === 'complete'"
                                    " && !!window.LiteGraph?.registered_node_types?.SaveImage", timeout=60_000)
        shown = self.js(f"() => !!window.app.ui.settings.getSettingValue('{VUE_SETTING}')")
        if shown != self.vue:
            raise RuntimeError(f"the page has {VUE_SETTING} = {shown}, wanted {self.vue}")

    @property
    def frontend(self) -> str:
        """The version the page runs (the frontend's own build constant)."""
        return self.js("() => window.__COMFYUI_FRONTEND_VERSION__")

    def __exit__(self, *exc):
        self.browser.close()
        self._pw.stop()

    def js(self, script: str, arg=None):
        return self.page.evaluate(script, arg)

    # -- what the pack's files did ---------------------------------------------------
    def _request_failed(self, request) -> None:
        """A request that got no response; one the page itself cancelled (``net::ERR_ABORTED``: a
        thumbnail still loading when its dialog closes) is no failure of the server's."""
        if request.failure != "net::ERR_ABORTED":
            self.failed.append(f"failed {request.url} ({request.failure})")

    def pack_failures(self) -> list[str]:
        """Failed requests for the pack's own files (its page extension and templates)."""
        return [f for f in self.failed if f"/{PACK}/" in f]

    def pack_errors(self) -> list[str]:
        """Page errors, console errors and console warnings raised by the pack's extension
        (its file named in the message, or on the stack when the frontend logged it)."""
        logged = self.page_errors + self.console_errors + self.console_warnings
        return ([e for e in logged if PACK in e or "Speculative AR" in e]
                + self.js("() => window.__packMessages || []"))

    # -- graphs ------------------------------------------------------------------------
    def load(self, workflow: dict, name: str = "workflow") -> None:
        """Open ``workflow`` as the Workflow menu does, at 100 % zoom: 1.32's Vue nodes place a
        loaded graph's nodes at their positions times the zoom the page had before (at 35 %
        the nodes of a graph land on each other), which is that frontend's, not the graph's."""
        self.js("""async ([wf, name]) => {
            window.app.canvas.ds.scale = 1;
            await window.app.loadGraphData(wf, true, true, name);
        }""", [workflow, name])
        self.page.wait_for_timeout(300)  # the frontend sizes DOM widgets on the next frames
        self.settle()

    def settle(self, timeout_ms: int = 8000) -> None:
        """Wait until no node moves or resizes between frames: Vue nodes lay themselves
        out over several frames, and move again after the graph is in (1.3x's Vue mode
        repositions a loaded graph's nodes)."""
        self.js("""async (timeout) => {
            const frame = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 60)));
            const shape = () => JSON.stringify(window.app.graph.nodes.map((n) => {
                const r = document.querySelector(`[data-node-id="${n.id}"]`)?.getBoundingClientRect();
                return [...n.pos, ...n.size, r?.x, r?.y, r?.width, r?.height];
            }));
            const end = performance.now() + timeout;
            let last = shape(), still = 0;
            while (still < 3 && performance.now() < end) {
                await frame();
                const now = shape();
                still = now === last ? still + 1 : 0;
                last = now;
            }
        }""", timeout_ms)

    def nodes(self) -> list[dict]:
        """Every node of the open graph: type, whether its type is registered, its box as
        drawn (``[x, y, w, h]`` in graph units, title bar included), its visible widgets
        and how many pictures it shows.  On the canvas that is LiteGraph's node (its size,
        its widgets not hidden, its ``imgs``); with Vue nodes, the node's element in the
        page (its bounding box, its widget rows, its loaded ``img`` elements), with the
        whole graph in view first (the page renders only the nodes it shows)."""
        if self.vue:
            self.fit()
        return self.js("""(vue) => {
            const title = window.LiteGraph.NODE_TITLE_HEIGHT;
            const c = window.app.canvas, view = c.canvas.getBoundingClientRect();
            const loaded = (imgs) => [...imgs].filter((i) => i.complete && i.naturalWidth > 0).length;
            return window.app.graph.nodes.map((n) => {
                const node = {id: String(n.id), type: n.type, registered: !!window.LiteGraph.registered_node_types[n.type]};
                // on the canvas, 1.58 fetches a node's picture only when it draws the node: a picture the
                // page holds for the node (its outputs, which the canvas draws from) counts as shown
                const held = window.app.nodeOutputs?.[String(n.id)]?.images?.length ?? 0;
                if (!vue) return {...node, box: [n.pos[0], n.pos[1] - title, n.size[0], n.size[1] + title],
                                  widgets: (n.widgets || []).filter((w) => !w.hidden).map((w) => w.name),
                                  images: Math.max(loaded(n.imgs || []), held)};
                const e = document.querySelector(`[data-node-id="${n.id}"]`);
                if (!e) return {...node, box: null, widgets: [], images: 0};
                return {...node, box: (%s)(c, view, e), widgets: (%s)(n, e), images: loaded(e.querySelectorAll("img"))};
            });
        }""" % (_VUE_BOX, _VUE_ROWS), self.vue)

    def widgets(self, node_type: str) -> list[str]:
        """The widgets the first node of ``node_type`` shows, as :meth:`nodes` reads them
        (with Vue nodes after the page's next frames, once Vue has redrawn)."""
        return self.js("""async ([type, vue]) => {
            const n = window.app.graph.nodes.find((n) => n.type === type);
            if (!vue) return n.widgets.filter((w) => !w.hidden).map((w) => w.name);
            await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
            return (%s)(n, document.querySelector(`[data-node-id="${n.id}"]`));
        }""" % _VUE_ROWS, [node_type, self.vue])

    def groups(self) -> list[dict]:
        return self.js("() => window.app.graph.groups.map((g) => ({title: g.title, box: [...g._bounding]}))")

    def fit(self) -> None:
        """The whole graph in view (drawn at full detail where it fits).  Vue nodes can be
        larger than LiteGraph's sizes say: the view is fitted again to their elements."""
        for _ in range(2 if self.vue else 1):
            self.js("""(vue) => {
                const c = window.app.canvas;
                const nodes = window.app.graph.nodes;
                if (!nodes.length) return;
                const title = window.LiteGraph.NODE_TITLE_HEIGHT;
                const rect = c.canvas.getBoundingClientRect();
                const boxes = nodes.map((n) => {
                    const e = vue && document.querySelector(`[data-node-id="${n.id}"]`);
                    return e ? (%s)(c, rect, e) : [n.pos[0], n.pos[1] - title, n.size[0], n.size[1] + title];
                });
                const xs = boxes.flatMap(([x, , w]) => [x, x + w]), ys = boxes.flatMap(([, y, , h]) => [y, y + h]);
                for (const g of window.app.graph.groups) { xs.push(g.pos[0], g.pos[0] + g.size[0]);
                                                           ys.push(g.pos[1], g.pos[1] + g.size[1]); }
                const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
                const scale = Math.min(1, 0.92 * rect.width / (x1 - x0), 0.86 * rect.height / (y1 - y0));
                c.ds.scale = scale;
                c.ds.offset[0] = (rect.width / scale - (x1 - x0)) / 2 - x0;
                c.ds.offset[1] = (rect.height / scale - (y1 - y0)) / 2 - y0 + 20 / scale;
                c.setDirty(true, true);
            }""" % _VUE_BOX, self.vue)
            self.page.wait_for_timeout(400)
            if self.vue:  # the nodes' elements follow the view a few frames later
                self.settle()

    def focus(self, ids: list[str]) -> None:
        """Nodes ``ids`` in view at 100 % zoom (as a user reads them), clear of the page's side
        and top bars (which lie over the canvas); the page draws them again (the canvas fetches
        a picture as it draws its node)."""
        self.js("""([ids, vue]) => {
            const c = window.app.canvas, rect = c.canvas.getBoundingClientRect();
            const title = window.LiteGraph.NODE_TITLE_HEIGHT;
            const nodes = window.app.graph.nodes.filter((n) => ids.includes(String(n.id)));
            const boxes = nodes.map((n) => {
                const e = vue && document.querySelector(`[data-node-id="${n.id}"]`);
                return e ? (%s)(c, rect, e) : [n.pos[0], n.pos[1] - title, n.size[0], n.size[1] + title];
            });
            c.ds.scale = 1;
            c.ds.offset[0] = 300 - Math.min(...boxes.map((b) => b[0]));
            c.ds.offset[1] = 200 - Math.min(...boxes.map((b) => b[1]));
            c.setDirty(true, true);
        }""" % _VUE_BOX, [ids, self.vue])
        self.page.wait_for_timeout(400)
        if self.vue:
            self.settle()
        self.js("() => window.app.canvas.draw(true, true)")

    def node_rect(self, node_id: str) -> list[float]:
        """Node ``node_id``'s box in the page, ``[x, y, w, h]`` in CSS pixels, title bar included
        (the canvas: its size where the view puts it; Vue nodes: its element)."""
        return self.js("""([id, vue]) => {
            const c = window.app.canvas, view = c.canvas.getBoundingClientRect(), s = c.ds.scale;
            const n = window.app.graph.nodes.find((n) => String(n.id) === id);
            const e = vue && document.querySelector(`[data-node-id="${id}"]`);
            if (e) { const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; }
            const title = window.LiteGraph.NODE_TITLE_HEIGHT;
            return [view.x + (n.pos[0] + c.ds.offset[0]) * s, view.y + (n.pos[1] - title + c.ds.offset[1]) * s,
                    n.size[0] * s, (n.size[1] + title) * s];
        }""", [node_id, self.vue])

    def screenshot(self, path: pathlib.Path, clip: list[float] | None = None) -> pathlib.Path:
        """The page (or the part ``clip`` = ``[x, y, w, h]`` of it, in CSS pixels) as a PNG."""
        path.parent.mkdir(parents=True, exist_ok=True)
        area = {"x": clip[0], "y": clip[1], "width": clip[2], "height": clip[3]} if clip else None
        self.page.screenshot(path=str(path), clip=area)
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
