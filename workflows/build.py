"""Writes the shareable workflows in both formats from the graphs below.

    python workflows/build.py            # starts the test ComfyUI (make comfyui) for its /object_info

The UI format (``*.json``: drag into the browser) carries widget values in the
order ComfyUI's front end lays widgets out, which comes from ``/object_info``;
the API format (``api/*.json``: what ``/prompt`` and ``spec-ar queue`` take) is
the same graph by input name.  ``tests/test_comfyui.py`` converts every UI file
back and checks it equals its API file, so hand edits to one are caught.
"""
from __future__ import annotations

import json
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
PROMPT = "a red circle in the top left on a striped blue background"
EMBEDDED = "embedded (ships with the pack)"
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


def graphs() -> dict[str, dict]:
    out = {f"embedded_t2i_{mode}": _t2i({"model": EMBEDDED}, mode, PROMPT) for mode in MODES}
    comparison = {"model": ("SpecAR_LoadModel", {"model": EMBEDDED})}
    for mode in MODES:
        comparison[mode] = ("SpecAR_Sampler", {"model": L("model"), "prompt": PROMPT, "mode": mode, "G": 50})
        comparison[f"{mode}_images"] = ("PreviewImage", {"images": L(mode)})
    reports = {"reports": L("ar", 6), **{f"reports_{i + 2}": L(m, 6) for i, m in enumerate(MODES[1:])}}
    comparison["table"] = ("SpecAR_ReportTable", reports)
    comparison["plot"] = ("SpecAR_ReportPlot", reports)
    comparison["plot_preview"] = ("PreviewImage", {"images": L("plot")})
    out["embedded_mode_comparison"] = comparison
    out["embedded_prompt_list"] = {
        "model": ("SpecAR_LoadModel", {"model": EMBEDDED}),
        "prompts": ("SpecAR_PromptList", {"prompts": "a red circle in the top left\n"
                                          "a green triangle in the center on a dotted white background\n"
                                          "a blue square in the bottom right on a striped yellow background"}),
        "sampler": ("SpecAR_Sampler", {"model": L("model"), "prompt": L("prompts"), "mode": "gsd"}),
        "save": ("SaveImage", {"images": L("sampler"), "filename_prefix": "spec_ar_list"}),
        "table": ("SpecAR_ReportTable", {"reports": L("sampler", 6)}),
    }
    # the real families: put the weights in models/spec_ar under these names
    out["llamagen_c2i"] = _t2i({"model": "llamagen/c2i_XL_384.pt", "vq": "llamagen/vq_ds16_c2i.pt"}, "lantern",
                               "207", k=1000, lantern_delta=0.4)
    out["llamagen_t2i"] = _t2i({"model": "llamagen/t2i_XL_stage2_512.pt", "vq": "llamagen/vq_ds16_t2i.pt",
                                "text_encoder": "flan-t5-xl"}, "vvs",
                               "a photo of a red fox sitting in fresh snow, golden hour", resolution="512")
    out["janus_pro"] = _t2i({"model": "Janus-Pro-7B"}, "gsd", "a watercolor lighthouse on a cliff at dawn", G=10)
    out["lumina_mgpt"] = _t2i({"model": "Lumina-mGPT-7B-768"}, "sjd",
                              "a majestic snow leopard resting on a rocky ledge, misty mountains behind", window=16)
    out["anole"] = _t2i({"model": "Anole-7b-hf"}, "lantern", "a red panda eating bamboo in a misty forest",
                        k=1000, lantern_delta=0.1)
    out["emu3"] = _t2i({"model": "Emu3-Gen-hf"}, "gsd", "a bowl of ramen with a soft-boiled egg, studio lighting",
                       negative_prompt="lowres, blurry, text, watermark", G=10)
    return out


def _widget_inputs(info: dict) -> list[tuple[str, list, dict]]:
    out = []
    for section in ("required", "optional"):
        for name in info["input_order"].get(section, []):
            spec = info["input"][section][name]
            out.append((name, spec[0], spec[1] if len(spec) > 1 else {}))
    return out


def _is_widget(kind) -> bool:
    return isinstance(kind, list) or kind in ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")


def build(graph: dict, object_info: dict) -> tuple[dict, dict]:
    """(UI format, API format) of one graph; unset widgets take their defaults."""
    ids = {name: i + 1 for i, name in enumerate(graph)}
    api, nodes, links = {}, [], []
    for name, (kind, given) in graph.items():
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
                src_type = object_info[graph[src][0]]["output"][slot]
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
        nodes.append({"id": ids[name], "type": kind, "pos": [60 + 380 * (len(nodes) % 4), 80 + 420 * (len(nodes) // 4)],
                      "size": [340, 380], "flags": {}, "order": len(nodes), "mode": 0, "inputs": ui_inputs,
                      "outputs": outputs, "properties": {"Node name for S&R": kind}, "widgets_values": values,
                      "title": info["display_name"]})
    by_id = {n["id"]: n for n in nodes}
    for link, src, slot, *_ in links:
        by_id[src]["outputs"][slot]["links"].append(link)
    ui = {"last_node_id": len(nodes), "last_link_id": len(links), "nodes": nodes, "links": links, "groups": [],
          "config": {}, "extra": {}, "version": 0.4}
    return ui, api


def write_all(object_info: dict, folder: pathlib.Path = HERE) -> list[pathlib.Path]:
    (folder / "api").mkdir(exist_ok=True)
    written = []
    for name, graph in graphs().items():
        ui, api = build(graph, object_info)
        for path, data in ((folder / f"{name}.json", ui), (folder / "api" / f"{name}.json", api)):
            path.write_text(json.dumps(data, indent=1) + "\n")
            written.append(path)
    return written


def main() -> int:
    sys.path.insert(0, str(HERE.parent))
    from tests.comfyui_server import ComfyServer

    with tempfile.TemporaryDirectory() as tmp:
        base = pathlib.Path(tmp)
        (base / "models").mkdir()
        with ComfyServer(base, base / "models") as server:
            info = server.get("/object_info")
    for path in write_all(info):
        print(path.relative_to(HERE.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
