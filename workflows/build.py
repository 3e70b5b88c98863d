"""Writes the shareable workflows in both formats from the graphs below, and their
thumbnails for ComfyUI's Templates browser.

    .venv/bin/python workflows/build.py   # the test ComfyUI (make comfyui) with its web page, in Chromium

The UI format (``<title>.json``: drag into the browser, or pick it in Templates)
carries widget values in the order ComfyUI's front end lays widgets out, which
comes from ``/object_info``, and node positions laid out from the sizes the web
page gives each node (measured in the browser on every frontend and renderer the
page tests run, with the pack's extension hiding the knobs a mode does not read:
the largest wins); the API format (``api/<name>.json``: what
``/prompt`` and ``spec-ar queue`` take) is the same graph by input name.
``tests/test_comfyui.py`` converts every UI file back and checks it equals its API
file, so hand edits to one are caught; ``tests/test_web_page.py`` loads every UI
file in the browser and checks nothing overlaps.
"""
from __future__ import annotations

import json
import pathlib
import sys
import tempfile

from spec_ar.workflows.catalog import CATALOG, embedded, title
from spec_ar.workflows.format import WIDGET_TYPES

HERE = pathlib.Path(__file__).resolve().parent
PROMPT = "a red circle in the top left on a striped blue background"
EMBEDDED = "embedded (ships with the pack)"
EMBEDDED_DRAFTER = "embedded drafter (ships with the pack)"
MODES = ["ar", "sjd", "gsd", "lantern", "vvs"]


def L(node: str, slot: int = 0):
    """A link to output ``slot`` of node ``node``."""
    return ("link", node, slot)


def _t2i(model: dict, mode: str, prompt: str, **sampler) -> dict:
    return {
        "model": ("SpecAR_LoadModel", model),
        "sampler": ("SpecAR_Sampler", {"model": L("model"), "prompt": prompt, "mode": mode, **sampler}),
        "save": ("SaveImage", {"images": L("sampler"), "filename_prefix": f"spec_ar_{mode}"}),
        "accept": ("PreviewImage", {"images": L("sampler", 5)}),
        "report": ("PreviewAny", {"source": L("sampler", 1)}),
    }


def _drafted(model: dict, drafter: str, mode: str, prompt: str, **sampler) -> dict:
    """:func:`_t2i` with a Load Drafter feeding the sampler's drafter input."""
    graph = _t2i(model, mode, prompt, **sampler)
    graph = {"model": graph.pop("model"), "drafter": ("SpecAR_LoadDrafter", {"drafter": drafter, "model": L("model")}),
             **graph}
    graph["sampler"][1]["drafter"] = L("drafter")
    return graph


#: the comparison's groups: one per mode, around its sampler and its images
GROUP_TITLES = {"ar": "ar (reference)", "sjd": "SJD (lossless)", "gsd": "GSD (G = 50)", "lantern": "LANTERN",
                "vvs": "VVS (skips)"}


def graphs() -> dict[str, tuple[dict, list]]:
    """name -> (nodes, groups): nodes in an order where every link points back;
    a node is ``(class, inputs)`` or ``(class, inputs, {"column": n})``; a group is
    ``(title, [node names])``."""
    out = {f"embedded_t2i_{mode}": (_t2i({"model": EMBEDDED}, mode, PROMPT), []) for mode in MODES}
    comparison = {"model": ("SpecAR_LoadModel", {"model": EMBEDDED})}
    for i, mode in enumerate(MODES):  # a column per mode: its sampler over its images
        comparison[mode] = ("SpecAR_Sampler", {"model": L("model"), "prompt": PROMPT, "mode": mode, "G": 50},
                            {"column": 1 + i})
        comparison[f"{mode}_images"] = ("PreviewImage", {"images": L(mode)}, {"column": 1 + i})
    reports = {"reports": L("ar", 6), **{f"reports_{i + 2}": L(m, 6) for i, m in enumerate(MODES[1:])}}
    comparison["table"] = ("SpecAR_ReportTable", reports, {"column": 1 + len(MODES)})
    comparison["plot"] = ("SpecAR_ReportPlot", reports, {"column": 1 + len(MODES)})
    out["embedded_mode_comparison"] = (comparison, [(GROUP_TITLES[m], [m, f"{m}_images"]) for m in MODES])
    out["embedded_prompt_list"] = ({
        "model": ("SpecAR_LoadModel", {"model": EMBEDDED}),
        "prompts": ("SpecAR_PromptList", {"prompts": "a red circle in the top left\n"
                                          "a green triangle in the center on a dotted white background\n"
                                          "a blue square in the bottom right on a striped yellow background"}),
        "sampler": ("SpecAR_Sampler", {"model": L("model"), "prompt": L("prompts"), "mode": "gsd"}),
        "save": ("SaveImage", {"images": L("sampler"), "filename_prefix": "spec_ar_list"}),
        "table": ("SpecAR_ReportTable", {"reports": L("sampler", 6)}),
    }, [])
    # the embedded model on its draft head: SJD (lossless) and LANTERN side by side
    drafted = {"model": ("SpecAR_LoadModel", {"model": EMBEDDED}),
               "drafter": ("SpecAR_LoadDrafter", {"drafter": EMBEDDED_DRAFTER, "model": L("model")})}
    for i, mode in enumerate(("sjd", "lantern")):
        drafted[mode] = ("SpecAR_Sampler", {"model": L("model"), "prompt": PROMPT, "mode": mode,
                                            "drafter": L("drafter")}, {"column": 2 + i})
        drafted[f"{mode}_images"] = ("PreviewImage", {"images": L(mode)}, {"column": 2 + i})
    drafted["table"] = ("SpecAR_ReportTable", {"reports": L("sjd", 6), "reports_2": L("lantern", 6)}, {"column": 4})
    out["embedded_t2i_drafter"] = (drafted, [("SJD on the draft head (lossless)", ["sjd", "sjd_images"]),
                                             ("LANTERN on the draft head", ["lantern", "lantern_images"])])
    # the real families: put the weights in models/spec_ar under these names
    family = {
        "llamagen_c2i": _t2i({"model": "llamagen/c2i_XL_384.pt", "vq": "llamagen/vq_ds16_c2i.pt"}, "lantern",
                             "207", k=1000, lantern_delta=0.4),
        "llamagen_t2i": _t2i({"model": "llamagen/t2i_XL_stage2_512.pt", "vq": "llamagen/vq_ds16_t2i.pt",
                              "text_encoder": "flan-t5-xl"}, "vvs",
                             "a photo of a red fox sitting in fresh snow, golden hour", resolution="512"),
        "janus_pro": _t2i({"model": "Janus-Pro-7B"}, "gsd", "a watercolor lighthouse on a cliff at dawn", G=10),
        "lumina_mgpt": _t2i({"model": "Lumina-mGPT-7B-768"}, "sjd",
                            "a majestic snow leopard resting on a rocky ledge, misty mountains behind", window=16),
        "llamagen_t2i_drafter": _drafted({"model": "llamagen/t2i_XL_stage1_256.pt", "vq": "llamagen/vq_ds16_t2i.pt",
                                          "text_encoder": "flan-t5-xl"}, "lantern/llamagen_drafter", "lantern",
                                         "a photo of a red fox sitting in fresh snow, golden hour",
                                         resolution="256", k=1000, lantern_delta=0.1),
        "anole": _t2i({"model": "Anole-7b-hf"}, "lantern", "a red panda eating bamboo in a misty forest",
                      k=1000, lantern_delta=0.1),
        "anole_drafter": _drafted({"model": "Anole-7b-hf"}, "lantern/anole_drafter", "lantern",
                                  "a red panda eating bamboo in a misty forest", k=1000, lantern_delta=0.1),
        "liquid": _t2i({"model": "Liquid_V1_7B"}, "sjd", "a lighthouse on a rocky coast at dawn, oil painting"),
        "lumina_mgpt2": _t2i({"model": "Lumina-mGPT-2.0"}, "sjd",
                             "a hummingbird hovering over a red hibiscus flower, macro photograph", window=16),
        "simplear": _t2i({"model": "SimpleAR-1.5B-RL"}, "sjd",
                         "a cozy wooden cabin by a frozen lake under the northern lights", window=16),
        # 34B: int8 with its blocks offloaded fits a 24 GB card (docs/benchmarks.md, "Emu3.5"); bfloat16 on 80 GB
        "emu35": _t2i({"model": "Emu3.5-Image", "dtype": "int8", "offload": True}, "sjd",
                      "a red fox curled up asleep in a snowy birch forest at dawn, soft light, photograph"),
        "emu3": _t2i({"model": "Emu3-Gen-hf"}, "gsd", "a bowl of ramen with a soft-boiled egg, studio lighting",
                     negative_prompt="lowres, blurry, text, watermark", G=10),
    }
    # GLM-Image: the sampler's prior tokens through its DiT stage with the DiT's settings (the sampler's own images
    # are the same decode at its defaults)
    glm = _t2i({"model": "GLM-Image"}, "sjd", "a vintage travel poster of a lighthouse at dusk with the title "
               "'North Cape' in bold letters", resolution="1024")
    family["glm_image"] = {
        "model": glm["model"], "sampler": glm["sampler"],
        "dit": ("SpecAR_GlmDiTDecode", {"model": L("model"), "tokens": L("sampler", 7), "steps": 50,
                                        "guidance": 1.5}),
        "save": ("SaveImage", {"images": L("dit"), "filename_prefix": "spec_ar_glm_image"}),
        "accept": glm["accept"], "report": glm["report"],
    }
    out.update({name: (nodes, []) for name, nodes in family.items()})
    return {name: out[name] for name in CATALOG}  # the catalogue's order


def _widget_inputs(info: dict) -> list[tuple[str, list, dict]]:
    out = []
    for section in ("required", "optional"):
        for name in info["input_order"].get(section, []):
            spec = info["input"][section][name]
            out.append((name, spec[0], spec[1] if len(spec) > 1 else {}))
    return out


def _is_widget(kind) -> bool:
    return isinstance(kind, list) or kind in WIDGET_TYPES


#: LiteGraph's node title bar, above a node's ``pos``; the group title band; gaps between boxes
TITLE, GROUP_HEAD, GROUP_PAD, GAP_X, GAP_Y, MARGIN = 30, 56, 14, 70, 40, 40
#: the size a node gets at least (image previews need room to show a picture); the web page's own
#: minimum for the node's widgets, measured in the browser, wins where larger
PREFERRED = {"PreviewImage": (300, 340), "SaveImage": (300, 340), "PreviewAny": (380, 240),
             "SpecAR_ReportTable": (620, 320), "SpecAR_ReportPlot": (520, 440), "SpecAR_Sampler": (360, 0),
             "SpecAR_LoadModel": (340, 0), "SpecAR_PromptList": (380, 200),
             "SpecAR_GlmDiTDecode": (340, 0)}
DEFAULT_SIZE = (320, 120)


def _parents(given: dict) -> list[str]:
    return [v[1] for v in given.values() if isinstance(v, tuple) and v[0] == "link"]


def layout(nodes: dict, groups: list, sizes: dict) -> tuple[dict, list]:
    """Left-to-right flow: a node's column is one right of its deepest input (or its
    hint); each node sits level with its first input where its column is free there;
    a group's members share one band, under a title, and nothing else enters it.
    ``sizes``: name -> (width, height) of the node's body.  Returns positions
    (LiteGraph's ``pos``: the body's top left) and group boxes."""
    column = {}
    for name, (kind, given, *hint) in nodes.items():
        parents = _parents(given)
        column[name] = (hint[0]["column"] if hint and "column" in hint[0]
                        else 1 + max(column[p] for p in parents) if parents else 0)
    ncol = max(column.values()) + 1
    widths = [max((sizes[n][0] for n in nodes if column[n] == c), default=0) for c in range(ncol)]
    xs = [MARGIN + sum(widths[:c]) + GAP_X * c for c in range(ncol)]
    free = [MARGIN] * ncol  # the first free y (a box's top, title bar included) per column
    top, boxes, group_of = {}, [], {m: g for g in groups for m in g[1]}
    for name, (kind, given, *_) in nodes.items():
        if name in top:
            continue
        if name in group_of:
            title, members = group_of[name]
            cols = range(min(column[m] for m in members), max(column[m] for m in members) + 1)
            band = max(free[c] for c in cols)
            y = {c: band + GROUP_HEAD for c in cols}
            for m in members:
                top[m] = y[column[m]]
                y[column[m]] += TITLE + sizes[m][1] + GAP_Y
            bottom = max(top[m] + TITLE + sizes[m][1] for m in members) + GROUP_PAD
            x0, x1 = xs[cols[0]] - GROUP_PAD, xs[cols[-1]] + widths[cols[-1]] + GROUP_PAD
            boxes.append((title, [x0, band, x1 - x0, bottom - band]))
            for c in cols:
                free[c] = bottom + GAP_Y
        else:
            c, parents = column[name], _parents(given)
            top[name] = max(free[c], top[parents[0]] if parents else MARGIN)
            free[c] = top[name] + TITLE + sizes[name][1] + GAP_Y
    return {n: [xs[column[n]], top[n] + TITLE] for n in nodes}, boxes


#: a model file's extensions: a loader value ending so names one file (the others name folders)
MODEL_FILE = (".pt", ".pth", ".ckpt", ".safetensors", ".bin")
MODEL_FOLDER = "spec_ar"  # ComfyUI's model folder of the pack (nodes/models.py FOLDER)


def model_files(values: list) -> list[dict]:
    """The frontend's ``models`` metadata for a loader's single-file values (its
    missing-model dialog offers to download a listed file the server does not have):
    each file's hub URL from the download list's releases."""
    from spec_ar.loaders.downloads import RELEASES, Source

    urls = {f: f"https://huggingface.co/{src.repo}/resolve/main/{f}" for r in RELEASES.values()
            for src in r.sources if isinstance(src, Source) for f in src.files if "*" not in f}
    out = []
    for value in values:
        if isinstance(value, str) and value.endswith(MODEL_FILE):
            url = urls.get(value.rsplit("/", 1)[-1])
            if url is None:
                raise ValueError(f"{value}: no release in loaders/downloads.py carries this file")
            out.append({"name": value, "url": url, "directory": MODEL_FOLDER})
    return out


def build(graph: tuple[dict, list], object_info: dict, measured: dict | None = None) -> tuple[dict, dict]:
    """(UI format, API format) of one graph; unset widgets take their defaults.
    ``measured``: from :func:`measure`, ``{"least": {node name: (w, h)}, "growth": {class: h}}``:
    the web page's minimum size of each node, and how much a node of each class grows
    when a run shows its output (the layout keeps that room free below it)."""
    nodes_in, groups = graph
    ids = {name: i + 1 for i, name in enumerate(nodes_in)}
    least, growth = (measured or {}).get("least", {}), (measured or {}).get("growth", {})
    size, room = {}, {}
    for name, (kind, *_) in nodes_in.items():
        want, low = PREFERRED.get(kind, DEFAULT_SIZE), least.get(name, (0, 0))
        size[name] = (max(want[0], low[0]), max(want[1], low[1]) or DEFAULT_SIZE[1])
        room[name] = (size[name][0], size[name][1] + growth.get(kind, 0))
    pos, group_boxes = layout(nodes_in, groups, room)
    api, nodes, links = {}, [], []
    for name, (kind, given, *_) in nodes_in.items():
        info = object_info[kind]
        unknown = set(given) - {n for n, *_ in _widget_inputs(info)}
        if unknown:
            raise ValueError(f"{kind}: no input(s) {sorted(unknown)}")
        api_inputs, ui_inputs, values = {}, [], []
        for inp, io_type, opts in _widget_inputs(info):
            value = given.get(inp, opts.get("default"))
            link = None
            if isinstance(value, tuple) and value[0] == "link":
                src, slot = value[1], value[2]
                link = len(links) + 1
                src_type = object_info[nodes_in[src][0]]["output"][slot]
                links.append([link, ids[src], slot, ids[name], None, src_type])
                api_inputs[inp] = [str(ids[src]), slot]
            if _is_widget(io_type):
                widget_value = opts.get("default") if link else value
                if widget_value is None and io_type == "COMBO":
                    widget_value = opts["options"][0]
                values.append(widget_value)
                if opts.get("control_after_generate"):
                    values.append("fixed")
                if link is None:
                    api_inputs[inp] = widget_value
                if link is not None:
                    ui_inputs.append({"name": inp, "type": io_type, "widget": {"name": inp}, "link": link})
            else:
                ui_inputs.append({"name": inp, "type": io_type, "link": link})
            if link is not None:
                links[-1][4] = len(ui_inputs) - 1
        api[str(ids[name])] = {"class_type": kind, "inputs": api_inputs, "_meta": {"title": info["display_name"]}}
        outputs = [{"name": n, "type": t, "links": [], "slot_index": i}
                   for i, (n, t) in enumerate(zip(info["output_name"], info["output"]))]
        properties = {"Node name for S&R": kind}
        files = model_files(values)
        if files:
            properties["models"] = files
        nodes.append({"id": ids[name], "type": kind, "pos": pos[name], "size": list(size[name]), "flags": {},
                      "order": len(nodes), "mode": 0, "inputs": ui_inputs, "outputs": outputs,
                      "properties": properties, "widgets_values": values, "title": info["display_name"]})
    by_id = {n["id"]: n for n in nodes}
    for link, src, slot, *_ in links:
        by_id[src]["outputs"][slot]["links"].append(link)
    ui = {"last_node_id": len(nodes), "last_link_id": len(links), "nodes": nodes, "links": links,
          "groups": [{"id": i + 1, "title": t, "bounding": box, "color": "#3f789e", "font_size": 24, "flags": {}}
                     for i, (t, box) in enumerate(group_boxes)],
          "config": {}, "extra": {}, "version": 0.4}
    return ui, api


def measure(page, server, object_info: dict) -> dict:
    """What :func:`build` needs to know of one web page (``page``: a
    ``tests.web_page.WebPage`` on ``server``, either renderer), measured in the browser:
    each node's size as drawn once the frontend has laid out its visible widgets (the
    pack's extension hides the knobs a mode does not read), and, from queueing every
    workflow that runs on the embedded model, how far each class of node grows when
    it shows its output (the sampler's own preview, an image, a table)."""
    least, growth = {}, {}
    for name, graph in graphs().items():
        ui, _ = build(graph, object_info)
        if page.vue:  # measured at the positions and sizes as given: the frontend then applies no scaling
            ui["extra"]["workflowRendererVersion"] = "Vue"  # of its own for a canvas-made layout
        page.load(ui, name)
        before = {n["id"]: n for n in page.nodes()}
        least[name] = {node: (before[str(i + 1)]["box"][2], before[str(i + 1)]["box"][3] - TITLE)
                       for i, node in enumerate(graph[0])}
        if embedded(name):
            page.queue()
            page.wait_idle(server)
            page.settle()  # Vue nodes resize once their pictures have loaded
            for node in page.nodes():
                kind, grew = node["type"], node["box"][3] - before[node["id"]]["box"][3]
                growth[kind] = max(growth.get(kind, 0), grew)
    return {"least": least, "growth": {k: v for k, v in growth.items() if v > 0}}


def merge(measures: list[dict]) -> dict:
    """One measure from several pages: every size and growth the largest any page gave."""
    least, growth = {}, {}
    for m in measures:
        for name, sizes in m["least"].items():
            for node, (w, h) in sizes.items():
                old = least.setdefault(name, {}).get(node, (0, 0))
                least[name][node] = (max(old[0], w), max(old[1], h))
        for kind, grew in m["growth"].items():
            growth[kind] = max(growth.get(kind, 0), grew)
    return {"least": least, "growth": growth}


def write_all(object_info: dict, measured: dict | None = None, folder: pathlib.Path = HERE) -> list[pathlib.Path]:
    (folder / "api").mkdir(exist_ok=True)
    written = []
    for name, graph in graphs().items():
        per_graph = measured and {"least": measured["least"].get(name, {}), "growth": measured["growth"]}
        ui, api = build(graph, object_info, per_graph)
        for path, data in ((folder / f"{title(name)}.json", ui), (folder / "api" / f"{name}.json", api)):
            path.write_text(json.dumps(data, indent=1) + "\n")
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Write the shipped workflows (UI and API format) and their "
                                                 "Templates-browser thumbnails.")
    parser.add_argument("--no-thumbnails", action="store_true", help="keep the thumbnails as they are")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    from tests.comfyui_server import ComfyServer
    from tests.web_page import FRONTENDS, RENDERERS, WebPage, frontend_static, prepare_user

    from spec_ar.workflows import thumbnails

    with tempfile.TemporaryDirectory() as tmp:
        base = pathlib.Path(tmp)
        (base / "models").mkdir()
        prepare_user(base)
        with ComfyServer(base, base / "models", frontend=True) as server:
            info = server.get("/object_info")
            measures = []
            for frontend in FRONTENDS:
                static = frontend_static(frontend, server.python)
                if isinstance(static, str):
                    raise SystemExit(static)
                for renderer in RENDERERS:
                    with WebPage(server.url, static=static, vue=renderer == "vue") as page:
                        measures.append(measure(page, server, info))
                    print(f"measured on {frontend} {renderer}: growth when a run shows output",
                          {k: round(v) for k, v in measures[-1]["growth"].items()})
            measured = merge(measures)
            for path in write_all(info, measured):
                print(path.relative_to(HERE.parent))
            if not args.no_thumbnails:
                for path in thumbnails.write_all(server, HERE):
                    print(path.relative_to(HERE.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
