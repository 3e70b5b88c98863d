"""The shipped workflow files as ComfyUI's Templates browser and users find them,
and the layout ``workflows/build.py`` gives them (the browser test checks the same
in the page, at the sizes the frontend gives each node)."""
import json
import pathlib

from PIL import Image

from spec_ar.workflows import build
from spec_ar.workflows.catalog import CATALOG, embedded, title

from .web_page import overlaps

WORKFLOWS = pathlib.Path(__file__).resolve().parent.parent / "workflows"


def test_every_workflow_ships_in_both_formats_with_a_thumbnail_and_nothing_else():
    for name in CATALOG:
        assert (WORKFLOWS / "api" / f"{name}.json").is_file(), name
        ui = json.loads((WORKFLOWS / f"{title(name)}.json").read_text())
        assert ui["nodes"] and ui["links"] is not None, name
        with Image.open(WORKFLOWS / f"{title(name)}.jpg") as thumb:  # the browser asks for .jpg
            assert thumb.format == "JPEG" and thumb.size == (512, 512), name
    # the browser lists every .json of the folder: nothing but the catalogue's
    assert sorted(p.stem for p in WORKFLOWS.glob("*.json")) == sorted(title(n) for n in CATALOG)
    assert sorted(p.stem for p in (WORKFLOWS / "api").glob("*.json")) == sorted(CATALOG)


def test_titles_read_as_titles_in_the_templates_browser():
    titles = [title(n) for n in CATALOG]
    assert len(set(titles)) == len(titles)
    for t in titles:  # the browser turns - and _ into spaces in the description; Windows forbids the rest
        assert not set(t) & set('-_<>:"/\\|?*#%'), t
        assert t[0].isupper() and len(t) <= 60, t
    assert all(embedded(n) == title(n).startswith("Speculative AR demo") for n in CATALOG)


def _boxes(ui: dict) -> list[tuple[str, list[float]]]:
    return [(f"{n['id']} {n['type']}", [n["pos"][0], n["pos"][1] - build.TITLE, n["size"][0],
                                        n["size"][1] + build.TITLE]) for n in ui["nodes"]]


def test_the_shipped_layout_keeps_nodes_and_groups_apart():
    for name in CATALOG:
        ui = json.loads((WORKFLOWS / f"{title(name)}.json").read_text())
        assert overlaps(_boxes(ui)) == [], name
        groups = [(g["title"], g["bounding"]) for g in ui["groups"]]
        assert overlaps(groups) == [], name
        xs = {n["id"]: n["pos"][0] for n in ui["nodes"]}
        for _, src, _, dst, *_ in ui["links"]:  # left to right: every link runs rightwards or down a column
            assert xs[src] <= xs[dst], (name, src, dst)


def test_layout_leaves_room_below_a_node_for_what_a_run_shows():
    nodes = {"a": ("SpecAR_Sampler", {}), "b": ("PreviewImage", {"images": build.L("a")}, {"column": 0})}
    tight = build.layout(nodes, [], {"a": (300, 400), "b": (300, 300)})[0]
    roomy = build.layout(nodes, [], {"a": (300, 600), "b": (300, 300)})[0]
    assert tight["b"][1] - tight["a"][1] == 400 + build.TITLE + build.GAP_Y
    assert roomy["b"][1] - tight["b"][1] == 200


def test_a_group_gets_a_title_band_and_holds_only_its_members():
    nodes = {"m": ("SpecAR_LoadModel", {}),
             "s": ("SpecAR_Sampler", {"model": build.L("m")}), "p": ("PreviewImage", {"images": build.L("s")}),
             "t": ("SpecAR_ReportTable", {"reports": build.L("s", 6)}, {"column": 1})}
    sizes = {"m": (300, 150), "s": (340, 500), "p": (300, 300), "t": (600, 300)}
    pos, groups = build.layout(nodes, [("mode", ["s", "p"])], sizes)
    (_, (gx, gy, gw, gh)), = groups
    assert pos["s"][1] - build.TITLE == gy + build.GROUP_HEAD  # under the group title band
    assert pos["t"][1] - build.TITLE >= gy + gh  # the table, in the group's column, goes below it


def test_a_workflow_that_needs_single_files_lists_them_for_the_missing_model_dialog():
    # the node module imports ComfyUI: its folder name is read from its source
    assert f'FOLDER = "{build.MODEL_FOLDER}"' in (WORKFLOWS.parent / "nodes" / "models.py").read_text()
    listed = {}
    for name in CATALOG:
        ui = json.loads((WORKFLOWS / f"{title(name)}.json").read_text())
        for node in ui["nodes"]:
            files = [v for v in node["widgets_values"] if isinstance(v, str) and v.endswith(build.MODEL_FILE)]
            models = node["properties"].get("models", [])
            # the frontend offers an entry whose name is one of the node's values, from its url, into its folder
            assert [m["name"] for m in models] == files, (name, node["type"])
            for m in models:
                assert m["directory"] == build.MODEL_FOLDER, m
                assert m["url"].startswith("https://huggingface.co/") and "/resolve/main/" in m["url"], m
                assert m["url"].rsplit("/", 1)[1] == m["name"].rsplit("/", 1)[1], m
                listed[m["name"]] = m["url"]
    assert listed["llamagen/c2i_XL_384.pt"] == "https://huggingface.co/FoundationVision/LlamaGen/resolve/main/c2i_XL_384.pt"
    assert listed["llamagen/t2i_XL_stage1_256.pt"].startswith("https://huggingface.co/peizesun/llamagen_t2i/")
    assert not any("models" in node["properties"] for n in CATALOG if embedded(n)
                   for node in json.loads((WORKFLOWS / f"{title(n)}.json").read_text())["nodes"])
