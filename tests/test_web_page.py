"""The pack as a user sees it: ComfyUI's web page in a real browser (Chromium driven
by Playwright) on a real server, in four pages: the frontend ComfyUI pins and the
newest one, each with the LiteGraph canvas and with Vue nodes ("Nodes 2.0").

Every shipped workflow loads with all its nodes known and none overlapping (as
drawn: canvas boxes, or the Vue nodes' elements); the sampler shows the knobs its
mode reads, as the knob table says (rows counted as rendered); the Templates browser
lists every workflow with its thumbnail and title; the embedded workflows, queued
from the page, show a picture (or text) on every output node and still overlap
nothing.  One server serves the four pages (one page at a time); each page runs the
embedded workflows for real, because a result ComfyUI takes from its cache shows
nothing on the sampler (no output node: only what executes sends its preview), and
the sampler's preview is what grows it.  After the five-mode comparison the Report
Table shows every column and row inside its node and the Report Plot's picture labels
every bar with no two labels meeting (the plot's labels are also measured, with the
chart's own font, without a browser).  Screenshots go to
``out/web-page/<frontend>-<renderer>/`` (``SPEC_AR_WEB_OUT`` elsewhere), and with
``SPEC_AR_DOCS_SCREENSHOTS=1`` those of the two report nodes also to ``docs/page/``.
"""
import io
import json
import os
import pathlib
import re
import time
import urllib.parse
import urllib.request

import pytest

from spec_ar.workflows.catalog import CATALOG, embedded, title

from .comfyui_server import ComfyServer, locate
from .web_page import (FRONTENDS, PACK, RENDERERS, WebPage, chromium, frontend_missing, frontend_static, overlaps,
                       playwright_missing, prepare_user)

REPO = pathlib.Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / "workflows"
OUT = pathlib.Path(os.environ.get("SPEC_AR_WEB_OUT", REPO / "out" / "web-page"))
DOCS = REPO / "docs"
IMAGE_OUTPUTS = {"SaveImage", "PreviewImage", "SpecAR_ReportPlot"}
TEXT_OUTPUTS = {"PreviewAny", "SpecAR_ReportTable"}


def _missing() -> str | None:
    located = locate()
    if isinstance(located, str):
        return located
    missing = playwright_missing() or frontend_missing(located[1])
    if missing:
        return missing
    try:
        chromium()
    except RuntimeError as err:
        return str(err)
    return None


MISSING = _missing()


PAGES = [(frontend, renderer) for frontend in FRONTENDS for renderer in RENDERERS]
#: pages not run, and why (what the frontend does, seen in this test)
NOT_RUN = {("1.32.9", "vue"): "1.32.9's Vue nodes (the Nodes 2.0 beta) place a loaded graph's nodes at their "
                              "positions times 1.3 and the page's zoom but leave its groups, and keep showing the "
                              "widgets a node showed when the graph loaded: its mode switch cannot hide knobs"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if MISSING is not None:
        pytest.skip(f"web page test: {MISSING}")
    base = tmp_path_factory.mktemp("web")
    (base / "models").mkdir()
    prepare_user(base)
    with ComfyServer(base, base / "models", frontend=True) as srv:
        yield srv
    assert not srv.pack_failures(), srv.pack_failures()


@pytest.fixture(scope="module", params=PAGES, ids=[f"{f}-{r}" for f, r in PAGES])
def page(request, server):
    frontend, renderer = request.param
    if request.param in NOT_RUN:
        pytest.skip(NOT_RUN[request.param])
    static = frontend_static(frontend, server.python)
    if isinstance(static, str):
        pytest.skip(static)
    with WebPage(server.url, static=static, vue=renderer == "vue") as p:
        assert p.frontend == frontend
        p.out = OUT / f"{frontend}-{renderer}"
        yield p
        assert not p.pack_failures(), f"failed requests for the pack's files: {p.pack_failures()}"
        assert not p.pack_errors(), f"errors and warnings from the pack: {p.pack_errors()}"


def _ui(name: str) -> dict:
    return json.loads((WORKFLOWS / f"{title(name)}.json").read_text())


def _boxes(nodes: list[dict]) -> list[tuple[str, list[float]]]:
    """The boxes of ``page.nodes()`` (read once: with Vue nodes each read fits the view first)."""
    assert all(n["box"] for n in nodes), f"nodes the page does not draw: {[n['type'] for n in nodes if not n['box']]}"
    return [(f"{n['id']} {n['type']}", n["box"]) for n in nodes]


def _group_trouble(page, boxes: list[tuple[str, list[float]]]) -> list[str]:
    """Groups that overlap each other, and nodes (``boxes``) cut by a group's border."""
    groups = page.groups()
    trouble = [f"groups {a} / {b}" for a, b in overlaps([(g["title"], g["box"]) for g in groups])]
    for node, (x, y, w, h) in boxes:
        for g in groups:
            gx, gy, gw, gh = g["box"]
            inside = gx <= x and x + w <= gx + gw and gy <= y and y + h <= gy + gh
            apart = x + w <= gx or gx + gw <= x or y + h <= gy or gy + gh <= y
            if not (inside or apart):
                trouble.append(f"{node} crosses group {g['title']!r}")
    return trouble


@pytest.mark.parametrize("name", list(CATALOG))
def test_every_shipped_workflow_loads_with_known_nodes_and_none_overlapping(page, name):
    page.load(_ui(name), name)
    nodes = page.nodes()  # (Vue nodes: the whole graph fitted in view first)
    assert nodes and all(n["registered"] for n in nodes), [n["type"] for n in nodes if not n["registered"]]
    boxes = _boxes(nodes)
    assert overlaps(boxes) == [], f"{name}: overlapping nodes"
    assert _group_trouble(page, boxes) == []
    if not page.vue:
        page.fit()
    page.screenshot(page.out / f"{name}.png")


def _sampler_widgets(page) -> list[str]:
    return page.widgets("SpecAR_Sampler")


def _set(page, name: str, value) -> None:
    """Change a sampler widget as the page does when a user picks a value."""
    page.js("""([name, value]) => {
        const node = window.app.graph.nodes.find((n) => n.type === "SpecAR_Sampler");
        const w = node.widgets.find((w) => w.name === name);
        w.value = value;
        w.callback?.(value, window.app.canvas, node);
    }""", [name, value])


def _saved_values(page) -> list:
    return page.js("""() => window.app.graph.nodes.find((n) => n.type === "SpecAR_Sampler")
                        .serialize().widgets_values""")


def _expected(mode: str, schedule: str = "auto", family_defaults: bool = True) -> set[str]:
    """The knob table's answer: every widget that is no knob, and the knobs this setting reads."""
    from spec_ar.nodes import common
    from spec_ar.sampling.config import KNOBS, SAMPLING_FALLBACK, DecodeConfig

    config = DecodeConfig(mode=mode, schedule=None if schedule == common.AUTO else schedule)
    return {w["label"] for w in common.sampler_widgets()
            if KNOBS[w["field"]].used_by(config) and not (family_defaults and w["field"] in SAMPLING_FALLBACK)}


def test_the_sampler_shows_the_knobs_its_mode_reads_and_saves_every_value(page):
    from spec_ar.nodes import common
    from spec_ar.sampling.config import MODES

    page.load(_ui("embedded_t2i_sjd"), "knobs")
    all_widgets = set(page.js("""() => window.app.graph.nodes.find((n) => n.type === "SpecAR_Sampler")
                                 .widgets.map((w) => w.name)"""))
    knobs = {w["label"] for w in common.sampler_widgets()}
    fixed = all_widgets - knobs
    assert {"prompt", "mode", "seed", "batch_size", common.FAMILY_DEFAULTS} <= fixed
    if page.vue:  # a Vue node draws the seed's control-after-generate inside the seed's own row
        fixed -= {"control_after_generate"}
    _set(page, "G", 50)  # a GSD knob, hidden in every other mode: its value must survive
    saved = _saved_values(page)
    counts = {}
    for mode in MODES:
        _set(page, "mode", mode)
        shown = set(_sampler_widgets(page))
        assert shown == fixed | _expected(mode), f"{mode}: shown {sorted(shown)}"
        counts[mode] = len(shown)
        _set(page, common.FAMILY_DEFAULTS, False)
        assert set(_sampler_widgets(page)) == fixed | _expected(mode, family_defaults=False), mode
        counts[f"{mode}, family_defaults off"] = len(_sampler_widgets(page))
        _set(page, common.FAMILY_DEFAULTS, True)
    for schedule in ("uniform", "similarity"):  # VVS skipping on GSD shows its knob
        _set(page, "mode", "gsd")
        _set(page, "schedule", schedule)
        assert set(_sampler_widgets(page)) == fixed | _expected("gsd", schedule), schedule
        counts[f"gsd, schedule {schedule}"] = len(_sampler_widgets(page))
        _set(page, "schedule", "auto")
    _set(page, "mode", "sjd")
    assert _saved_values(page) == saved  # hiding changed nothing that is saved
    assert saved[[w for w in page.js("""() => window.app.graph.nodes.find((n) => n.type === "SpecAR_Sampler")
                                       .widgets.filter((w) => w.serialize !== false).map((w) => w.name)""")
                  ].index("G")] == 50
    counts["all widgets"] = len(all_widgets)
    page.out.mkdir(parents=True, exist_ok=True)
    (page.out / "sampler_widget_counts.json").write_text(json.dumps(counts, indent=1) + "\n")
    assert counts["ar"] < counts["sjd"] < counts["gsd"] < counts["all widgets"]
    # docs/comfyui.md says how many the page shows (as the canvas counts them: a Vue node draws
    # the seed's control-after-generate in the seed's row, one row fewer)
    row = 1 if page.vue and "control_after_generate" in all_widgets else 0
    shown = {m: counts[m] + row for m in ("ar", "sjd", "gsd", "lantern", "vvs")} | {"all": counts["all widgets"]}
    assert _documented_widget_counts() == shown


def _documented_widget_counts() -> dict[str, int]:
    """The sampler's widget counts per mode as docs/comfyui.md states them."""
    text = " ".join((DOCS / "comfyui.md").read_text().split())
    said = re.search(r"(\d+) widgets in `ar`, (\d+) in `sjd`, (\d+) in `gsd` and `lantern`, (\d+) in `vvs`, "
                     r"of (\d+)", text)
    assert said, "docs/comfyui.md no longer says how many widgets the sampler shows per mode"
    ar, sjd, gsd, vvs, every = map(int, said.groups())
    return {"ar": ar, "sjd": sjd, "gsd": gsd, "lantern": gsd, "vvs": vvs, "all": every}


def test_a_linked_drafter_shows_its_knobs_instead_of_jacobis(page):
    from spec_ar.sampling.config import KNOBS, DecodeConfig

    page.load(_ui("embedded_t2i_drafter"), "drafter knobs")  # its first sampler: sjd, drafter linked
    for tree in ("chain", "dynamic", "static"):
        _set(page, "draft_tree", tree)
        shown = set(_sampler_widgets(page))
        config = DecodeConfig(mode="sjd", drafter="head", tree=tree)
        for k in KNOBS.values():
            if k.widget and k.uses != ("always",):
                assert (k.label in shown) == k.used_by(config), (tree, k.label)
        assert "drafter_depth" in shown and "window" not in shown
        assert ("tree_tokens" in shown) == (tree != "chain")


def test_the_templates_browser_lists_every_workflow_with_its_thumbnail_and_title(page):
    page.js("async () => { await window.app.extensionManager.command.execute('Comfy.BrowseTemplates'); }")
    dialog = page.page.get_by_role("dialog")
    dialog.get_by_text(PACK, exact=True).first.click()
    pictured = {}
    for name in CATALOG:  # each card in view in turn: the page loads a thumbnail when its card shows
        dialog.get_by_text(title(name), exact=True).first.scroll_into_view_if_needed()
        pictured[name] = page.js("""async (text) => {
            for (let i = 0; i < 40; i++) {
                const label = [...document.querySelectorAll('[role=dialog] *')]
                    .find((e) => e.children.length === 0 && e.textContent.trim() === text);
                let card = label;
                while (card && !card.querySelector('img')) card = card.parentElement;
                const img = card?.querySelector('img');
                if (img && img.complete && img.naturalWidth > 0) return [img.naturalWidth, img.naturalHeight];
                await new Promise((r) => setTimeout(r, 100));
            }
            return null;
        }""", title(name))
    # the page fetches each thumbnail from the pack's folder, then shows it from a blob: URL
    fetched = {urllib.parse.unquote(u).rsplit("/", 1)[1] for u in page.loaded if f"/workflow_templates/{PACK}/" in u}
    for name in CATALOG:
        assert f"{title(name)}.jpg" in fetched, f"{title(name)}: no thumbnail fetched"
        assert pictured[name] == [512, 512], f"{title(name)}: card picture {pictured[name]}"
    # a page tall enough for every card at once, for the screenshot
    page.page.set_viewport_size({"width": page.viewport[0], "height": 2000})
    dialog.get_by_text(PACK, exact=True).first.scroll_into_view_if_needed()
    page.page.wait_for_timeout(1000)
    page.screenshot(page.out / "templates.png")
    page.page.set_viewport_size({"width": page.viewport[0], "height": page.viewport[1]})
    page.open()  # the page again, without the dialog


#: the workflows run on every page; the other single-mode ones have embedded_t2i_vvs's nodes and layout
#: (a sampler beside its three outputs: only its own widgets differ) and run on the first page only
RUN_ON_EVERY_PAGE = ("embedded_mode_comparison", "embedded_prompt_list", "embedded_t2i_drafter", "embedded_t2i_vvs")


@pytest.mark.parametrize("name", [n for n in CATALOG if embedded(n)])
def test_embedded_workflows_queued_from_the_page_show_output_on_every_output_node(request, page, server, name):
    if name not in RUN_ON_EVERY_PAGE and request.node.callspec.params["page"] != PAGES[0]:
        def shape(n):
            return n["type"], [round(v) for v in n["pos"]], round(n["size"][0])

        assert [shape(n) for n in _ui(name)["nodes"]] == [shape(n) for n in _ui("embedded_t2i_vvs")["nodes"]]
        pytest.skip(f"the layout of embedded_t2i_vvs, which runs here; {name} runs on the {'-'.join(PAGES[0])} page")
    page.load(_ui(name), name)
    page.queue()
    page.wait_idle(server)
    # the page fetches each picture after the run's last message, for the nodes in view (1.58's canvas):
    # the whole graph in view, then wait for them (a loaded machine is slow)
    deadline = time.monotonic() + 30
    while True:
        page.fit()  # Vue nodes resize once their pictures have loaded: fitted again each time
        page.js("() => window.app.canvas.draw(true, true)")  # the canvas fetches a picture as it draws the node
        nodes = page.nodes()
        if all(n["images"] for n in nodes if n["type"] in IMAGE_OUTPUTS) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    texts = page.js("""() => window.app.graph.nodes.map((n) => (n.widgets || [])
        .filter((w) => w.serialize === false || w.name === 'preview').map((w) => String(w.value ?? '')).join(''))""")
    for node, text in zip(nodes, texts):
        if node["type"] in IMAGE_OUTPUTS:
            assert node["images"] >= 1, f"{name}: {node['type']} shows no image"
        if node["type"] in TEXT_OUTPUTS:
            assert text.strip(), f"{name}: {node['type']} shows no text"
    for node in nodes:  # read at 100 %, as a user reads it
        if node["type"] == "SpecAR_ReportTable":
            page.focus([node["id"]])
            assert _table_trouble(page, node["id"]) == [], f"{name}: the Report Table does not show all of its table"
    boxes = _boxes(page.nodes())  # (Vue nodes: the whole graph fitted in view first)
    if not page.vue:
        page.fit()
    page.screenshot(page.out / f"{name} after a run.png")
    assert overlaps(boxes) == [], f"{name}: nodes overlap after the run"
    assert _group_trouble(page, boxes) == []


#: the run labels the comparison workflow's five samplers give their reports, and longer ones
#: reports carry (a drafter's tree, VVS skipping on GSD)
MODE_LABELS = ["ar", "sjd", "gsd G=50 delta=0.15", "lantern k=300 delta=0.1", "vvs k=300 delta=0.1 i=2"]
LONG_LABELS = ["gsd G=10 delta=0.15", "sjd depth=4 tree=dynamic", "lantern depth=4 tree=static k=300 delta=0.1",
               "gsd schedule=similarity G=10 delta=0.15 tau=0.7", "vvs schedule=similarity k=300 delta=0.1 tau=0.7",
               "gsd G=1000 delta=0.123456"]


def _runs(flags) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of true values."""
    out, start = [], None
    for i, flag in enumerate(list(flags) + [False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            out.append((start, i))
            start = None
    return out


def _label_trouble(picture, count: int, parts: int = 1) -> list[str]:
    """What is wrong with the x labels of ``parts`` bar charts side by side in ``picture``
    (the Report Plot has two), each of ``count`` bars, read from its pixels: each chart's
    axis (the lowest row of its dark grey frame), its bars (palette colour just above),
    then the text below the axis.  No label may reach the middle between two bars (its
    neighbour's half) or the chart's edges, each bar has one, and none is cut off below."""
    import numpy as np

    from spec_ar.charts import PALETTE

    px = np.asarray(picture.convert("RGB")).astype(int)
    height, width, _ = px.shape
    trouble = []
    for part in range(parts):
        a, b = part * width // parts, (part + 1) * width // parts
        sub = px[:, a:b]
        frame = [y for y in range(height) if (sub[y] == (60, 60, 60)).all(axis=1).sum() > (b - a) / 2]
        if not frame:
            trouble.append(f"chart {part}: no frame found")
            continue
        axis = max(frame)
        coloured = np.zeros(b - a, bool)
        for colour in PALETTE:
            coloured |= (sub[axis - 1] == colour).all(axis=1)
        bars = [r for r in _runs(coloured) if r[1] - r[0] >= 3]
        if len(bars) != count:
            trouble.append(f"chart {part}: {len(bars)} bars found, not {count}")
            continue
        ink = (sub[axis + 2:] < 200).any(axis=2)  # the labels: black text, anti-aliased
        half = (bars[1][0] - bars[0][1]) / 2 if count > 1 else (bars[0][1] - bars[0][0]) * 0.2
        bounds = ([round(bars[0][0] - half)] + [(left[1] + right[0]) // 2 for left, right in zip(bars, bars[1:])]
                  + [round(bars[-1][1] - 1 + half)])
        for i, x in enumerate(bounds):
            if ink[:, x].any():
                where = "the chart's edge" if i in (0, count) else f"the middle of bars {i - 1} and {i}"
                trouble.append(f"chart {part}: a label crosses {where} (x = {a + x})")
        trouble += [f"chart {part}: bar {i} has no label" for i in range(count)
                    if not ink[:, bounds[i] + 1:bounds[i + 1]].any()]
        if ink[-1].any():
            trouble.append(f"chart {part}: labels cut off at the picture's bottom")
    return trouble


def _label_boxes(picture) -> list[tuple[str, list[float], int, list[str]]]:
    """Each x label of a :func:`spec_ar.charts.bars` picture as drawn: its text box
    ``[x, y, w, h]`` measured with the chart's font at its size, the size, and its lines."""
    from PIL import ImageDraw

    from spec_ar.charts import _font

    d = ImageDraw.Draw(picture)
    out = []
    for name, placed, size in picture.info["x_labels"]:
        boxes = [d.textbbox(at, line, font=_font(size), anchor="mt") for line, at in placed]
        x0, y0 = min(b[0] for b in boxes), min(b[1] for b in boxes)
        x1, y1 = max(b[2] for b in boxes), max(b[3] for b in boxes)
        out.append((name, [x0, y0, x1 - x0, y1 - y0], size, [line for line, _ in placed]))
    return out


def _report_rows(labels: list[str]) -> list[dict]:
    return [{"label": label, "prompt": "a red circle", "mode": label.split()[0], "seed": 0, "nfe": 256 // (i + 1),
             "tokens_per_forward": i + 1.0, "mean_accepted_length": i + 1.0, "latency_s": 40.0 / (i + 1)}
            for i, label in enumerate(labels)]


@pytest.mark.parametrize("labels", [MODE_LABELS, LONG_LABELS, MODE_LABELS[:1]], ids=["five modes", "long", "one"])
def test_the_report_plot_labels_every_bar_without_two_labels_meeting(labels):
    from spec_ar import charts
    from spec_ar.nodes import common

    picture = common.plot(_report_rows(labels))  # the Report Plot's picture: two charts side by side
    assert _label_trouble(picture, len(labels), parts=2) == []
    half = charts.bars({label: 1.0 + i for i, label in enumerate(labels)}, size=(picture.width // 2, picture.height))
    boxes = _label_boxes(half)
    assert [name for name, *_ in boxes] == labels
    assert overlaps([(name, box) for name, box, *_ in boxes]) == []
    for name, (x, y, w, h), size, lines in boxes:
        assert 0 <= x and x + w <= half.width and 0 <= y and y + h <= half.height, name
        assert "".join(lines).replace(" ", "") == name.replace(" ", ""), f"{name} drawn as {lines}"  # all of it
        # shown at about 0.58x in the node (900 px in 520): 16 px is about 9
        assert size == charts.LABEL_SIZE if labels is not LONG_LABELS else size >= 11, (name, size)


#: the Report Table's widget as laid out in the page: the element, the boxes of its caption and
#: cells, and any element in it that clips what it holds (scrolls) with the sizes that tell
_TABLE = """(id) => {
    const n = window.app.graph.nodes.find((n) => String(n.id) === id);
    const w = (n.widgets || []).find((w) => w.name === "table_text");
    const e = w && (w.element ?? w.inputEl);
    if (!e) return null;
    const box = (x) => { const r = x.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; };
    const clipping = [e, ...e.querySelectorAll("*")].filter((x) => getComputedStyle(x).overflow !== "visible"
        || x.tagName === "TEXTAREA");
    return {text: String(w.value ?? ""), box: box(e),
            scrolls: clipping.map((x) => [x.tagName, x.scrollWidth, x.clientWidth, x.scrollHeight, x.clientHeight]),
            heads: [...e.querySelectorAll("th")].map((x) => x.textContent.trim()),
            caption: e.querySelector(".specar-table-caption")?.textContent ?? "",
            rows: e.querySelectorAll("tbody tr").length,
            cells: [...e.querySelectorAll("th, td, .specar-table-caption")].map((x) => [x.textContent.trim(), box(x)])};
}"""


def _table_trouble(page, node_id: str) -> list[str]:
    """What of the Report Table's text the node does not show whole: every column of the
    table it got is a column of the node's table or said above it, every row is there, each
    cell lies inside the node and its widget's box, and nothing in it scrolls (hides part)."""
    shown = page.js(_TABLE, node_id)
    if shown is None:
        return ["the node has no table widget"]
    lines = [line for line in shown["text"].splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    trouble = [f"column {h!r} is not shown" for h in head
               if h not in shown["heads"] and f"{h}: " not in shown["caption"]]
    if shown["rows"] != len(lines) - 2:
        trouble.append(f"{shown['rows']} rows shown of {len(lines) - 2}")
    for tag, sw, cw, sh, ch in shown["scrolls"]:
        if sw > cw + 1 or sh > ch + 1:
            trouble.append(f"a {tag} shows {cw} x {ch} px of its {sw} x {sh}")
    node, widget = page.node_rect(node_id), shown["box"]
    for text, (x, y, w, h) in shown["cells"]:
        for name, (bx, by, bw, bh) in (("node", node), ("widget", widget)):
            if x < bx - 1 or x + w > bx + bw + 1 or y < by - 1 or y + h > by + bh + 1:
                trouble.append(f"{text!r} at {[round(v) for v in (x, y, w, h)]} leaves the {name}")
    return trouble


def _picture(page, node_id: str):
    """The picture the node shows (its loaded ``img``: on the canvas LiteGraph's, with Vue
    nodes the element's), fetched by the page, as a PIL image; None until it has loaded."""
    from PIL import Image

    data = page.js("""async (id) => {
        const n = window.app.graph.nodes.find((n) => String(n.id) === id);
        const loaded = (i) => i && i.complete && i.naturalWidth > 0;
        const e = document.querySelector(`[data-node-id="${id}"]`);
        const img = (n.imgs || []).find(loaded) ?? [...(e?.querySelectorAll("img") ?? [])].find(loaded);
        if (!img) return null;
        const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
        let text = "";
        for (const b of bytes) text += String.fromCharCode(b);
        return btoa(text);
    }""", node_id)
    if data is None:
        return None
    import base64

    return Image.open(io.BytesIO(base64.b64decode(data)))


def test_the_report_nodes_after_a_run_show_every_column_and_readable_labels(page, server):
    """The comparison workflow run from the page: its Report Table shows every column and
    row inside the node, its Report Plot (the picture the page shows) labels every bar with
    no two labels meeting; a screenshot of both at 100 % zoom (docs/page/ keeps the last ones taken
    with SPEC_AR_DOCS_SCREENSHOTS=1)."""
    page.load(_ui("embedded_mode_comparison"), "report nodes")
    page.queue()
    page.wait_idle(server)
    kinds = {n["type"]: n["id"] for n in page.nodes()}
    table, plot = kinds["SpecAR_ReportTable"], kinds["SpecAR_ReportPlot"]
    deadline = time.monotonic() + 30
    while True:
        page.focus([table, plot])
        picture = _picture(page, plot)
        if picture is not None or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert _table_trouble(page, table) == []
    assert picture is not None, "the Report Plot shows no picture"
    text = page.js(_TABLE, table)["text"]
    labels = [line.split("|")[1].strip() for line in text.splitlines()[2:] if line.startswith("|")]
    assert len(labels) == 5 and labels[0] == "ar", labels
    assert _label_trouble(picture, len(labels), parts=2) == []
    boxes = [page.node_rect(table), page.node_rect(plot)]
    x0, y0 = min(b[0] for b in boxes) - 8, min(b[1] for b in boxes) - 8
    x1, y1 = max(b[0] + b[2] for b in boxes) + 8, max(b[1] + b[3] for b in boxes) + 8
    name = f"report-nodes-{page.frontend}-{'vue' if page.vue else 'classic'}.png"
    page.screenshot(page.out / name, clip=[x0, y0, x1 - x0, y1 - y0])
    if os.environ.get("SPEC_AR_DOCS_SCREENSHOTS"):  # the docs' pictures, renewed on request (latencies vary)
        page.screenshot(DOCS / "page" / name, clip=[x0, y0, x1 - x0, y1 - y0])
