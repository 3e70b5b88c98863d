"""ComfyUI's two workflow formats: the UI format the browser saves and shares, and
the API format ``/prompt`` takes."""
from __future__ import annotations

WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")


def is_api_format(workflow: dict) -> bool:
    return "nodes" not in workflow and all(isinstance(v, dict) and "class_type" in v for v in workflow.values())


def ui_to_api(workflow: dict, object_info: dict) -> dict:
    """A UI-format workflow (what the browser saves) -> the API format ``/prompt`` takes.

    Widget values are matched to input names in the node's input order; a seed
    with ``control_after_generate`` is followed by its control value, which the
    API format drops; widgets a workflow saved before they existed take their defaults, as
    the page gives them.  Links become ``[source id, output slot]``.
    """
    links = {link[0]: link for link in workflow["links"]}
    api = {}
    for node in workflow["nodes"]:
        if node["type"] not in object_info:
            raise KeyError(f"the server has no node {node['type']!r} (is its pack installed?)")
        info = object_info[node["type"]]
        linked = {i["name"]: links[i["link"]] for i in node.get("inputs", []) if i.get("link") is not None}
        values = list(node.get("widgets_values", []))
        inputs = {}
        for section in ("required", "optional"):
            for name in info["input_order"].get(section, []):
                spec = info["input"][section][name]
                kind, opts = spec[0], (spec[1] if len(spec) > 1 else {})
                is_widget = isinstance(kind, list) or kind in WIDGET_TYPES
                if is_widget:
                    if not values:  # saved before the node had this widget: the page shows its default
                        if name not in linked and "default" in opts:
                            inputs[name] = opts["default"]
                        continue
                    value = values.pop(0)
                    if opts.get("control_after_generate") and values:
                        values.pop(0)
                    if name not in linked:
                        inputs[name] = value
                if name in linked:
                    _, src, slot, *_ = linked[name]
                    inputs[name] = [str(src), slot]
        api[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return api
