"""The pack inside a real ComfyUI server: registration, the shipped workflows,
prompt-list batches, bad input, interruption, and the queue client.

One server for the module (start-up takes seconds); the spec_ar model folder
holds tiny random-weight checkpoints under the names the family workflows use.
"""
import copy
import json
import pathlib
import time

import pytest
import torch

from . import checkpoints as ck
from .chameleon_files import write_chameleon, write_lumina
from .emu3_files import write_emu3
from .emu35_files import write_emu35, write_vision_tokenizer
from .glm_image_files import write_glm_image
from .liquid_files import write_liquid
from .lumina2_files import write_lumina2
from .simplear_files import write_simplear
from spec_ar.nodes.common import PreviewThrottle
from spec_ar.workflows.catalog import CATALOG, title

from .comfyui_server import ComfyServer, error_of, locate, ui_to_api

WORKFLOWS = pathlib.Path(__file__).resolve().parent.parent / "workflows"
NODES = ["SpecAR_LoadModel", "SpecAR_LoadVQ", "SpecAR_LoadDrafter", "SpecAR_Sampler", "SpecAR_VQDecode",
         "SpecAR_GlmDiTDecode",
         "SpecAR_PromptList", "SpecAR_ReportTable", "SpecAR_ReportPlot"]

pytestmark = pytest.mark.skipif(isinstance(locate(), str), reason=str(locate()))


def _family_weights(models: pathlib.Path) -> None:
    """Tiny checkpoints in the real formats, at the paths the family workflows name."""
    (models / "llamagen").mkdir(parents=True)
    ck.write_gpt(models / "llamagen" / "c2i_XL_384.pt", ck.random_gpt(ck.tiny_gpt_spec("c2i", classes=1000)))
    ck.write_vq(models / "llamagen" / "vq_ds16_c2i.pt")
    ck.write_gpt(models / "llamagen" / "t2i_XL_stage2_512.pt",
                 ck.random_gpt(ck.tiny_gpt_spec("t2i")))
    ck.write_vq(models / "llamagen" / "vq_ds16_t2i.pt")
    ck.write_t5(models / "flan-t5-xl")
    model, tok = ck.tiny_janus()
    ck.write_janus(models / "Janus-Pro-7B", model, tok)
    write_lumina(models / "Lumina-mGPT-7B-768")  # Lumina's own layout, tokenizer/vqgan.* inside as users set it up
    write_chameleon(models / "Anole-7b-hf", "anole", seed=1)
    write_emu3(models / "Emu3-Gen-hf")
    write_liquid(models / "Liquid_V1_7B")  # Meta's VQGAN in its chameleon/, where Liquid's script reads it
    write_lumina2(models / "Lumina-mGPT-2.0")  # the MoVQGAN in its movqgan/270M/, where its script reads it
    write_simplear(models / "SimpleAR-1.5B-RL")  # the Cosmos tokenizer's folder beside it, where its script reads it
    emu35 = write_emu35(models / "Emu3.5-Image", tokenizer="inside", vision=False)  # as the download lays it out
    write_vision_tokenizer(emu35 / "Emu3.5-VisionTokenizer")
    write_glm_image(models / "GLM-Image", dit_stage=True)  # the release whole: AR stage and DiT stage
    # LANTERN's drafters as released, for the drafter workflows, and the target stage I pairs with
    ck.write_gpt(models / "llamagen" / "t2i_XL_stage1_256.pt", ck.random_gpt(ck.tiny_gpt_spec("t2i", cond_tokens=120)))
    ck.write_lantern_head(models / "lantern" / "llamagen_drafter", hidden=128, heads=2, vocab=1024)
    anole = json.loads((models / "Anole-7b-hf" / "config.json").read_text())
    ck.write_lantern_anole_head(models / "lantern" / "anole_drafter", hidden=anole["hidden_size"],
                                heads=anole["num_attention_heads"], kv_heads=anole["num_key_value_heads"],
                                intermediate=anole["intermediate_size"], vocab=anole["vocab_size"])
    # a model whose float16 logits overflow (its output layer scaled past float16's range)
    (models / "broken").mkdir()
    gpt = ck.random_gpt(ck.tiny_gpt_spec("c2i", classes=1000))
    with torch.no_grad():
        gpt.output.weight.mul_(1e5)
    ck.write_gpt(models / "broken" / "c2i_B_256.pt", gpt)
    ck.write_vq(models / "broken" / "vq_ds16_c2i.pt")
    # big enough that its memory shows in the server's resident memory (about 100 M parameters)
    (models / "big").mkdir()
    big = ck.random_gpt(ck.tiny_gpt_spec("c2i", dim=1024, n_layer=8, classes=1000)).to(torch.bfloat16)
    ck.write_gpt(models / "big" / "c2i_big.safetensors", big)
    ck.write_vq(models / "big" / "vq_ds16_c2i.pt")
    # a 64-layer LlamaGen of 26 GB in bfloat16 that takes no disk space: more than this machine holds
    (models / "giant").mkdir()
    ck.write_sparse_safetensors(models / "giant" / "c2i_giant.safetensors", ck.llamagen_shapes(4096, 64, 11008))
    ck.write_vq(models / "giant" / "vq_ds16_c2i.pt")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A local stand-in for the Hugging Face hub holding a tiny LlamaGen-B release, which the
    server reaches through HF_ENDPOINT (the loader's 'download: ...' choices)."""
    import os

    from .fake_hub import FakeHub

    d = tmp_path_factory.mktemp("hub")
    gpt = ck.write_gpt(d / "c2i_B_256.pt", ck.random_gpt(ck.tiny_gpt_spec("c2i"), seed=5))
    vq = ck.write_vq(d / "vq_ds16_c2i.pt")
    saved = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_HOME", "HF_TOKEN")}
    with FakeHub({"FoundationVision/LlamaGen": {"c2i_B_256.pt": gpt.read_bytes(),
                                                "vq_ds16_c2i.pt": vq.read_bytes()}}) as fake:
        os.environ.update(HF_ENDPOINT=fake.url, HF_HOME=str(d / "hf-home"))
        os.environ.pop("HF_TOKEN", None)
        try:
            yield fake
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture(scope="module")
def server(tmp_path_factory, hub):
    base = tmp_path_factory.mktemp("comfyui")
    models = base / "spec_ar_models"
    _family_weights(models)
    (base / "input").mkdir()
    (base / "input" / "latin1.txt").write_bytes("a red circle\nune crème rouge\n".encode("latin-1"))
    with ComfyServer(base, models) as srv:
        yield srv
    assert not srv.pack_failures(), srv.pack_failures()


@pytest.fixture(scope="module")
def object_info(server):
    return server.get("/object_info")


def _api(name: str) -> dict:
    return json.loads((WORKFLOWS / "api" / f"{name}.json").read_text())


def _failure(entry: dict) -> str:
    err = error_of(entry) or {}
    return f"{err.get('node_type')}: {err.get('exception_message')}\n{''.join(err.get('traceback', []))[-2500:]}"


def _outputs(entry: dict, kind: str) -> list:
    return [item for out in entry["outputs"].values() for item in out.get(kind, [])]


def test_pack_registers_its_nodes_with_tooltips(server, object_info):
    assert "SpecAR_LoadModel" in object_info, server.log_text()[-3000:]
    for node in NODES:
        info = object_info[node]
        assert info["category"] == "SpeculativeAR" and info["description"]
        for section in ("required", "optional"):
            for name, spec in info["input"].get(section, {}).items():
                assert spec[1].get("tooltip"), f"{node}.{name} has no tooltip"
    sampler = object_info["SpecAR_Sampler"]["input"]
    assert sampler["required"]["G"][1]["display"] == "slider"
    assert sampler["required"]["seed"][1]["control_after_generate"] is True
    assert sampler["required"]["mode"][1]["options"] == ["ar", "sjd", "gsd", "lantern", "vvs"]
    assert object_info["SpecAR_Sampler"]["output"] == ["IMAGE", "STRING", "INT", "FLOAT", "FLOAT", "IMAGE",
                                                       "SPEC_AR_REPORT", "SPEC_AR_TOKENS"]
    models = object_info["SpecAR_LoadModel"]["input"]["required"]["model"][1]["options"]
    assert models[0].startswith("embedded") and "Janus-Pro-7B" in models  # the folder set in extra_model_paths
    assert "llamagen/c2i_XL_384.pt" in models
    # known releases not on disk are offered for download; so is one whose folder no download completed
    # (the tests write these folders, as a user may copy one): picked, it is checked against the hub and
    # completed, while the folder itself stays on the list as it is
    assert "download: LlamaGen-c2i-B-256" in models and "download: Janus-Pro-7B" in models
    texts = object_info["SpecAR_LoadModel"]["input"]["optional"]["text_encoder"][1]["options"]
    assert "flan-t5-xl" in texts and "download: flan-t5-xl" in texts and "download: flan-t5-xl" not in models
    assert [t for t in texts if t.startswith("download: ")] == ["download: flan-t5-xl"]  # no image model there
    drafters = object_info["SpecAR_LoadDrafter"]["input"]["required"]["drafter"][1]["options"]
    assert "download: LANTERN-drafter-Anole-7b" in drafters and "download: LANTERN-drafter-Anole-7b" not in models
    assert not any(d.startswith("download: ") and "drafter" not in d for d in drafters)
    assert object_info["SpecAR_PromptList"]["output_is_list"] == [True, False]


def test_the_sampler_shows_the_knob_table(object_info):
    from spec_ar.nodes import common

    inputs = object_info["SpecAR_Sampler"]["input"]
    order = list(object_info["SpecAR_Sampler"]["input_order"]["optional"])
    for w in common.sampler_widgets():
        # knobs added since workflows were shared come last and optional: saved widget values keep their places
        kind, opts = inputs["optional" if w["appended"] else "required"][w["label"]]
        if w["appended"]:
            assert order.index(w["label"]) > order.index("unload_after_run"), w["label"]
        assert opts["tooltip"] == w["tooltip"], w["label"]
        if w["widget"] == "combo":
            assert opts["options"] == w["options"] and opts["default"] == w["default"], w["label"]
        else:
            assert kind == w["kind"].upper() and (opts["min"], opts["max"], opts["step"], opts["default"]) == (
                w["min"], w["max"], w["step"], w["default"]), w["label"]
            assert (opts.get("display") == "slider") == (w["widget"] == "slider"), w["label"]


def test_gsd_with_similarity_skipping_is_set_from_the_node(server):
    workflow = _api("embedded_t2i_gsd")
    sampler = next(v for v in workflow.values() if v["class_type"] == "SpecAR_Sampler")
    sampler["inputs"].update(schedule="similarity", skip_threshold=0.0)
    entry = server.run(workflow)
    assert entry["status"]["status_str"] == "success", _failure(entry)
    report = "".join(_outputs(entry, "text"))
    skipped = int(report.split(" skipped)")[0].rsplit(", ", 1)[1])
    assert report.startswith("gsd: 256 tokens") and skipped > 0, report


def test_ui_and_api_workflows_agree(object_info):
    assert len(CATALOG) >= 13
    for name in CATALOG:
        ui_file = WORKFLOWS / f"{title(name)}.json"
        api = json.loads((WORKFLOWS / "api" / f"{name}.json").read_text())
        converted = ui_to_api(json.loads(ui_file.read_text()), object_info)
        strip = {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in api.items()}
        assert converted == strip, ui_file.name


def test_a_workflow_saved_before_a_knob_was_added_keeps_its_values_and_runs(server, object_info):
    """Knobs added since workflows were shared go last (``Knob.appended``): a saved workflow
    without them, in either format, keeps every value it has and runs with their defaults."""
    from spec_ar.nodes import common

    added = [w for w in common.sampler_widgets() if w["appended"]]
    assert added  # proactive drafting's knobs
    ui = json.loads((WORKFLOWS / f"{title('embedded_t2i_gsd')}.json").read_text())
    sampler = next(n for n in ui["nodes"] if n["type"] == "SpecAR_Sampler")
    sampler["widgets_values"] = sampler["widgets_values"][:-len(added)]  # as saved before
    api = ui_to_api(ui, object_info)
    inputs = next(v for v in api.values() if v["class_type"] == "SpecAR_Sampler")["inputs"]
    shipped = next(v for v in _api("embedded_t2i_gsd").values() if v["class_type"] == "SpecAR_Sampler")["inputs"]
    assert inputs == {**shipped, **{w["label"]: w["default"] for w in added}}
    for w in added:
        del inputs[w["label"]]  # an API workflow saved before
    inputs["batch_size"] = 1
    entry = server.run(api)
    assert entry["status"]["status_str"] == "success", _failure(entry)


@pytest.mark.parametrize("mode", ["ar", "sjd", "gsd", "lantern", "vvs"])
def test_text_to_image_workflow_in_every_mode(server, mode):
    workflow = _api(f"embedded_t2i_{mode}")
    batch = 32 if mode == "ar" else 1  # long enough (several seconds) for live previews
    next(v for v in workflow.values() if v["class_type"] == "SpecAR_Sampler")["inputs"]["batch_size"] = batch
    entry = server.run(workflow)
    assert entry["status"]["status_str"] == "success", _failure(entry)
    saved = [img for img in _outputs(entry, "images") if img["type"] == "output"]
    assert len(saved) == batch and saved[0]["filename"].startswith(f"spec_ar_{mode}")
    png = server.get(f"/view?filename={saved[0]['filename']}&subfolder={saved[0]['subfolder']}&type=output")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    report = "".join(_outputs(entry, "text"))
    assert report.startswith(f"{mode}: 256 tokens in ")
    # live previews, throttled (tests/test_nodes_common.py checks their budget on a clock of its own):
    # the long ar batch sees some, and none comes sooner than the throttle's first wait or interval allow
    # (the node's throttle starts just before the decode: half a second covers what comes before its clock)
    count = int(report.split("previews: ")[1].split()[0])
    seconds = float(report.split(" ms for a batch of")[0].rsplit(" ", 1)[1]) / 1000 + 0.5
    throttle = PreviewThrottle()
    assert count >= 1 or mode != "ar", report
    assert count <= 1 + max(seconds - throttle.first, 0) / throttle.interval, report
    if mode != "ar":  # the shipped workflows draft with the default coupling (MC-SJD)
        assert "maximal coupling: drafts kept" in report, report


def test_a_gumbel_coupled_workflow_renders_and_reports_its_coupling(server):
    workflow = _with("embedded_t2i_sjd", "SpecAR_Sampler", draft_coupling="gumbel")
    entry = server.run(workflow)
    assert entry["status"]["status_str"] == "success", _failure(entry)
    report = "".join(_outputs(entry, "text"))
    kept = int(report.split("gumbel coupling: drafts kept ")[1].split("%")[0])
    assert report.startswith("sjd: 256 tokens") and kept > 0, report


def test_prompt_list_renders_every_prompt_in_one_queue_entry(server):
    entry = server.run(_api("embedded_prompt_list"))
    assert entry["status"]["status_str"] == "success", _failure(entry)
    assert len([i for i in _outputs(entry, "images") if i["type"] == "output"]) == 3
    table = "".join(_outputs(entry, "text"))
    assert table.count("| gsd G=10 delta=0.15 |") == 3 and "a green triangle in the center" in table


def test_a_prompt_list_shard_renders_its_part_for_a_distributed_run(server):
    entry = server.run(_with("embedded_prompt_list", "SpecAR_PromptList", shard=1, shards=2))
    assert entry["status"]["status_str"] == "success", _failure(entry)
    assert len([i for i in _outputs(entry, "images") if i["type"] == "output"]) == 1  # 3 prompts: parts of 2 and 1
    assert "a blue square in the bottom right" in "".join(_outputs(entry, "text"))


def test_mode_comparison_graph_tabulates_and_plots(server):
    entry = server.run(_api("embedded_mode_comparison"))
    assert entry["status"]["status_str"] == "success", _failure(entry)
    table = "".join(_outputs(entry, "text"))
    for label in ("| ar |", "| sjd |", "| gsd G=50 delta=0.15 |", "| lantern k=300 delta=0.1 |",
                  "| vvs k=300 delta=0.1 i=2 |"):
        assert label in table
    assert "1.00x" in table  # ar against itself


def test_the_embedded_model_drafts_with_its_head_from_the_node(server):
    workflow = _api("embedded_t2i_drafter")
    samplers = [k for k, v in workflow.items() if v["class_type"] == "SpecAR_Sampler"]
    for i, node in enumerate(samplers):  # each sampler's own report, beside the table
        workflow[f"report_{i}"] = {"class_type": "PreviewAny", "inputs": {"source": [node, 1]}}
    entry = server.run(workflow)
    assert entry["status"]["status_str"] == "success", _failure(entry)
    text = "".join(_outputs(entry, "text"))
    assert text.count("drafts from embedded drafter (") == 2, text  # each sampler's report
    for label in ("| sjd depth=4 ", "| lantern depth=4 "):  # the table names the drafted settings
        assert label in text, text
    # the head on an ar sampler: one clear error naming the input
    workflow = _with("embedded_t2i_drafter", "SpecAR_Sampler", mode="ar")
    err = error_of(server.run(workflow)) or {}
    assert "drafter: a draft model drafts for the speculative modes, not mode 'ar'" in err.get("exception_message", "")


@pytest.mark.parametrize("name", ["llamagen_c2i", "llamagen_t2i", "janus_pro", "lumina_mgpt", "anole", "emu3",
                                  "liquid", "lumina_mgpt2", "simplear", "emu35", "glm_image", "llamagen_t2i_drafter",
                                  "anole_drafter"])
def test_family_workflows_run_once_weights_are_in_the_model_folder(server, name):
    workflow = _api(name)
    sampler = next(v for v in workflow.values() if v["class_type"] == "SpecAR_Sampler")
    if name in ("lumina_mgpt", "emu3", "lumina_mgpt2", "simplear", "emu35", "glm_image"):  # tiny models, smaller
        sampler["inputs"]["resolution"] = "256"  # than the real
    _offload_off_on_the_cpu(workflow)
    _few_dit_steps(workflow)
    if name.startswith("anole"):  # the paper's k = 1000 needs the real 8192-code VQGAN; the tiny one has 64 codes
        sampler["inputs"]["k"] = 32
    entry = server.run(workflow)
    assert entry["status"]["status_str"] == "success", _failure(entry)
    assert len([i for i in _outputs(entry, "images") if i["type"] == "output"]) == 1


def _offload_off_on_the_cpu(workflow: dict) -> None:
    """A template that offloads (Emu3.5's, for 24 GB cards) runs here with its blocks in place: offload streams
    blocks to a GPU, and this machine has none (refused by name: the offload test below)."""
    for node in workflow.values():
        if node["class_type"] == "SpecAR_LoadModel" and node["inputs"].get("offload"):
            node["inputs"]["offload"] = False


def _few_dit_steps(workflow: dict) -> None:
    """GLM-Image's DiT decode in two steps here (the workflow's 50 are the reference's)."""
    for node in workflow.values():
        if node["class_type"] == "SpecAR_GlmDiTDecode":
            node["inputs"]["steps"] = 2


@pytest.mark.parametrize("name", ["liquid", "lumina_mgpt2", "simplear", "emu35", "glm_image"])
def test_the_new_families_render_in_every_mode(server, name):
    """One queued graph per family: its shipped workflow with its sampler in `ar` (Lumina-mGPT 2.0: `gsd`) and one in each other mode
    beside it (`sjd`, the shipped mode, ran in the test above); their images are the sampler's own decode
    (GLM-Image: the token grid, its DiT being a node of its own, which the shipped graph runs on `ar`'s tokens)."""
    workflow = _api(name)
    key, sampler = next((k, v) for k, v in workflow.items() if v["class_type"] == "SpecAR_Sampler")
    if name != "liquid":  # the tiny models at a smaller size than the reference's (Liquid: 512 px only)
        sampler["inputs"]["resolution"] = "256"
    _offload_off_on_the_cpu(workflow)
    _few_dit_steps(workflow)
    # a window of 4: the tiny models' random weights take about a token a forward whatever the window
    # (Lumina-mGPT 2.0: 896 forwards for 1059 tokens at 16, 962 at 4, in 9.2 against 5.1 s on one thread)
    sampler["inputs"]["window"] = 4
    # (Lumina-mGPT 2.0's `ar` at 256 px is a thousand forwards through a head of 172k ids, most of this file's
    # time: its graph runs the other modes only, and its `ar` is checked against the reference in test_lumina2.py)
    sampler["inputs"]["mode"] = "ar" if name != "lumina_mgpt2" else "gsd"
    others = ("gsd", "lantern", "vvs") if name != "lumina_mgpt2" else ("lantern", "vvs")
    for mode in others:
        other = copy.deepcopy(sampler)
        other["inputs"]["mode"] = mode
        if mode in ("lantern", "vvs"):  # the tiny VQ codebooks are small
            other["inputs"]["k"] = 16
        workflow[f"{key}_{mode}"] = other
        workflow[f"save_{mode}"] = {"class_type": "SaveImage",
                                    "inputs": {"images": [f"{key}_{mode}", 0], "filename_prefix": f"every_{mode}"}}
    entry = server.run(workflow)
    assert entry["status"]["status_str"] == "success", _failure(entry)
    assert len([i for i in _outputs(entry, "images") if i["type"] == "output"]) == 1 + len(others)


def test_the_glm_dit_decode_sets_the_dits_settings_and_refuses_another_model_by_name(server):
    """The shipped GLM-Image graph with the DiT node's seed changed: another picture from the same tokens (the
    sampler's, seed fixed). The node on the embedded model's tokens: one error naming the model input."""
    workflow = _api("glm_image")
    sampler = next(v for v in workflow.values() if v["class_type"] == "SpecAR_Sampler")
    sampler["inputs"]["resolution"] = "256"
    dit_key = next(k for k, v in workflow.items() if v["class_type"] == "SpecAR_GlmDiTDecode")
    _few_dit_steps(workflow)
    workflow[dit_key]["inputs"].update(steps=1)
    workflow["dit_2"] = copy.deepcopy(workflow[dit_key])
    workflow["dit_2"]["inputs"]["seed"] = 7
    workflow["save_2"] = {"class_type": "SaveImage", "inputs": {"images": ["dit_2", 0], "filename_prefix": "dit_2"}}
    entry = server.run(workflow)
    assert entry["status"]["status_str"] == "success", _failure(entry)
    saved = sorted((i for i in _outputs(entry, "images") if i["type"] == "output"), key=lambda i: i["filename"])
    assert len(saved) == 2
    pngs = [server.get(f"/view?filename={i['filename']}&subfolder={i['subfolder']}&type=output") for i in saved]
    assert pngs[0][:8] == b"\x89PNG\r\n\x1a\n" and pngs[0] != pngs[1]
    other = _api("embedded_t2i_sjd")
    key = next(k for k, v in other.items() if v["class_type"] == "SpecAR_Sampler")
    model = next(k for k, v in other.items() if v["class_type"] == "SpecAR_LoadModel")
    other["dit"] = {"class_type": "SpecAR_GlmDiTDecode", "inputs": {"model": [model, 0], "tokens": [key, 7],
                                                                    "prompt": "", "steps": 1, "guidance": 1.5,
                                                                    "seed": 0}}
    other["save_dit"] = {"class_type": "SaveImage", "inputs": {"images": ["dit", 0], "filename_prefix": "dit"}}
    err = error_of(server.run(other)) or {}
    assert err.get("node_type") == "SpecAR_GlmDiTDecode", err
    assert err.get("exception_message", "").startswith("model: ") and "is not GLM-Image" in err["exception_message"]


def test_a_release_not_on_disk_is_downloaded_on_first_use_and_renders(server, hub):
    workflow = _with("llamagen_c2i", "SpecAR_LoadModel", model="download: LlamaGen-c2i-B-256",
                     vq="auto (built-in, or beside the model)")
    sampler = next(v for v in workflow.values() if v["class_type"] == "SpecAR_Sampler")
    sampler["inputs"].update(prompt="3", k=300, resolution="model default")
    entry = server.run(workflow)
    assert entry["status"]["status_str"] == "success", _failure(entry)
    assert len([i for i in _outputs(entry, "images") if i["type"] == "output"]) == 1
    fetched = [m for m, p, _ in hub.requests if p.endswith("/c2i_B_256.pt") and m == "GET"]
    assert fetched, hub.requests
    asked = len(hub.requests)
    assert server.run(workflow)["status"]["status_str"] == "success"  # on disk now: the hub is not asked again
    assert len(hub.requests) == asked


def test_bad_input_gets_one_clear_error_and_the_server_keeps_serving(server):
    bad = _api("embedded_t2i_sjd")
    sampler = next(k for k, v in bad.items() if v["class_type"] == "SpecAR_Sampler")
    bad[sampler]["inputs"]["mode"] = "fast"
    status, body = server.queue(bad)
    assert status == 400 and "mode" in json.dumps(body["node_errors"])
    bad[sampler]["inputs"].update(mode="lantern", k=2000)  # the embedded codebook has 512 codes
    entry = server.run(bad)
    err = error_of(entry)
    assert entry["status"]["status_str"] == "error"
    assert err["exception_message"].startswith("k must be an integer in [1, 511]")  # named as the slider is
    assert err["node_type"] == "SpecAR_Sampler"
    bad[sampler]["inputs"].update(k=300, prompt="a red circle floating in fog")
    err = error_of(server.run(bad))
    assert "fog" in err["exception_message"] and "unknown" in err["exception_message"]
    good = server.run(_api("embedded_t2i_ar"))  # still serving
    assert good["status"]["status_str"] == "success"


def _with(name: str, node: str, **inputs) -> dict:
    workflow = _api(name)
    next(v for v in workflow.values() if v["class_type"] == node)["inputs"].update(inputs)
    return workflow


HOSTILE = [  # (what is posted, where it is refused, what the message must name)
    (_with("embedded_t2i_sjd", "SpecAR_LoadModel", model="../../../../etc/passwd"), "queue", "../../../../etc/passwd"),
    (_with("embedded_t2i_sjd", "SpecAR_LoadModel", model="/etc/passwd"), "queue", "model"),
    (_with("llamagen_c2i", "SpecAR_LoadModel", model="broken/c2i_B_256.pt", vq="broken/vq_ds16_c2i.pt",
           dtype="float16", device="cpu"), "run", "NaN or infinity"),
    (_with("embedded_t2i_sjd", "SpecAR_Sampler", prompt="a red circle " + "very " * 2000), "run", "characters"),
    (_with("embedded_t2i_sjd", "SpecAR_Sampler", batch_size=2, seed=2**63 - 1), "ok", None),
    (_with("embedded_prompt_list", "SpecAR_PromptList", shard=2, shards=2), "queue", "shard"),
    (_with("embedded_prompt_list", "SpecAR_PromptList", file="latin1.txt"), "run", "not UTF-8"),
    (_with("embedded_prompt_list", "SpecAR_PromptList", file="../../etc/passwd"), "run", "file"),
]


@pytest.mark.parametrize("workflow,refused,names", HOSTILE)
def test_hostile_input_over_http_is_refused_and_the_server_keeps_serving(server, workflow, refused, names):
    if refused == "queue":  # refused when posted, before anything runs
        status, body = server.queue(workflow)
        assert status == 400 and names in json.dumps(body), body
    else:
        entry = server.run(workflow)
        if refused == "ok":
            assert entry["status"]["status_str"] == "success", _failure(entry)
        else:
            err = error_of(entry)
            assert entry["status"]["status_str"] == "error" and names in err["exception_message"], _failure(entry)
            assert len(err["exception_message"]) < 600, err["exception_message"]
    good = server.run(_api("embedded_t2i_ar"))  # the same server renders a good workflow
    assert good["status"]["status_str"] == "success", _failure(good)


def test_interrupt_stops_sampling_within_a_forward_pass(server):
    slow = _api("embedded_t2i_ar")
    sampler = next(k for k, v in slow.items() if v["class_type"] == "SpecAR_Sampler")
    slow[sampler]["inputs"].update(batch_size=64, seed=12345)  # several seconds on any machine
    status, body = server.queue(slow)
    assert status == 200
    time.sleep(1.5)
    t = time.monotonic()
    server.post("/interrupt", {})
    entry = server.wait(body["prompt_id"], timeout=60)
    stopped_after = time.monotonic() - t
    kinds = [kind for kind, _ in entry["status"]["messages"]]
    assert "execution_interrupted" in kinds and stopped_after < 10
    again = server.run(_api("embedded_t2i_ar"))
    assert again["status"]["status_str"] == "success"


def test_queue_client_spreads_a_prompt_list_over_servers_and_resumes(server, tmp_path):
    from spec_ar.cli import queue as queue_client

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle in the top left\n# a comment\na blue square in the center\n"
                       "a green triangle in the bottom right\n")
    out, lines = tmp_path / "out", []
    with ComfyServer(tmp_path / "second", server.models) as second:
        res = queue_client.run([server.url, second.url], str(WORKFLOWS / "api" / "embedded_t2i_gsd.json"),
                               str(prompts), out, log=lines.append)
    assert res["failed"] == 0 and len(res["prompts"]) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert {r["prompt"] for r in summary["prompts"]} == {"a red circle in the top left", "a blue square in the center",
                                                         "a green triangle in the bottom right"}
    assert {r["server"] for r in summary["prompts"]} == {server.url, second.url}
    for row in summary["prompts"]:
        assert len(row["files"]) == 1 and (out / row["files"][0]).read_bytes()[:4] == b"\x89PNG"
        assert row["reports"][0]["mode"] == "gsd" and 0 < row["reports"][0]["nfe"] < 256
        assert row["reports"][0]["latency_s"] > 0
    assert lines[-1].endswith("3 rendered, 0 failed")

    # an interrupted run: the summary lacks one prompt; the rerun renders only that one
    summary["prompts"] = [r for r in summary["prompts"] if r["prompt"] != "a blue square in the center"]
    (out / "summary.json").write_text(json.dumps(summary))
    lines.clear()
    res = queue_client.run([server.url], str(WORKFLOWS / "api" / "embedded_t2i_gsd.json"), str(prompts), out,
                           log=lines.append)
    assert lines[0] == f"resuming: 2 of 3 prompts already rendered in {out}"
    assert [ln for ln in lines if ln.startswith("[")] == [
        f"[3/3] 'a blue square in the center' -> 1 image(s) ({server.url})"]


def test_queue_client_chunks_through_a_prompt_list(server, tmp_path):
    from spec_ar.cli import queue as queue_client

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\na blue square\na green triangle\n")
    res = queue_client.run([server.url], str(WORKFLOWS / f"{title('embedded_prompt_list')}.json"), str(prompts),
                           tmp_path / "out", chunk=2, log=lambda s: None)  # the UI format, converted
    assert res["failed"] == 0, res
    assert [len(r["files"]) for r in res["prompts"]] == [1, 1, 1]
    assert len({r["prompt_id"] for r in res["prompts"]}) == 2  # two queue entries


def test_queue_client_says_what_is_wrong(server, tmp_path):
    from spec_ar.cli import queue as queue_client
    from spec_ar.prompt_files import PromptFileError
    from spec_ar.cli.queue import QueueError

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    workflow = WORKFLOWS / "api" / "embedded_t2i_ar.json"
    with pytest.raises(QueueError, match=r"server http://127.0.0.1:1 is not reachable"):
        queue_client.run(["http://127.0.0.1:1"], str(workflow), str(prompts), tmp_path / "o")
    broken = _api("embedded_t2i_ar")
    broken["99"] = {"class_type": "NoSuchNode", "inputs": {}}
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(QueueError, match=r"needs node\(s\) \['NoSuchNode'\] that the server lacks"):
        queue_client.run([server.url], str(tmp_path / "broken.json"), str(prompts), tmp_path / "o")
    with pytest.raises(PromptFileError, match="--prompts .*none.txt: no such file"):
        queue_client.run([server.url], str(workflow), str(tmp_path / "none.txt"), tmp_path / "o")


def _anon_rss(pid: int) -> int:
    """The process's anonymous resident memory (weights read into memory, not file pages)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


def test_an_int8_model_renders_and_unload_after_run_gives_its_memory_back(server):
    from spec_ar.loaders import storage

    int8 = storage.file_weight_bytes(storage.checkpoint_files(
        server.models / "big" / "c2i_big.safetensors"), "int8")
    workflow = _with("llamagen_c2i", "SpecAR_LoadModel", model="big/c2i_big.safetensors",
                     vq="big/vq_ds16_c2i.pt", dtype="int8", device="cpu")
    next(v for v in workflow.values() if v["class_type"] == "SpecAR_Sampler")["inputs"].update(
        mode="ar", resolution="256")  # ar: one row per forward, the cheapest on a CPU
    entry = server.run(workflow)
    assert entry["status"]["status_str"] == "success", _failure(entry)
    held = _anon_rss(server.proc.pid)
    next(v for v in workflow.values() if v["class_type"] == "SpecAR_Sampler")["inputs"].update(
        unload_after_run=True, seed=1)
    entry = server.run(workflow)
    assert entry["status"]["status_str"] == "success", _failure(entry)
    released = _anon_rss(server.proc.pid)
    assert held - released > 0.8 * int8, (held, released, int8)  # the weights (int8 layers, bf16 rest) went
    entry = server.run(workflow)  # and the next run loads them again
    assert entry["status"]["status_str"] == "success", _failure(entry)


def test_a_model_too_big_for_memory_is_refused_naming_what_fits_and_the_server_keeps_serving(server):
    for dtype in ("auto", "bfloat16"):
        workflow = _with("llamagen_c2i", "SpecAR_LoadModel", model="giant/c2i_giant.safetensors",
                         vq="giant/vq_ds16_c2i.pt", dtype=dtype, device="cpu")
        err = error_of(server.run(workflow))
        assert err and err["node_type"] == "SpecAR_LoadModel", err
        assert err["exception_message"].startswith(
            "c2i_giant.safetensors (llamagen) in bfloat16 needs about 26.") and "of weights, cpu has" in \
            err["exception_message"], err["exception_message"]
    good = server.run(_api("embedded_t2i_ar"))
    assert good["status"]["status_str"] == "success"


def test_offload_on_the_cpu_is_refused_by_name_and_the_tooltip_says_what_offload_does(server):
    from spec_ar.loaders.offload import HELP

    workflow = _with("embedded_t2i_ar", "SpecAR_LoadModel", offload=True, device="cpu")
    err = error_of(server.run(workflow))
    assert err and err["node_type"] == "SpecAR_LoadModel", err
    assert err["exception_message"].startswith("offload streams weights from system memory to a GPU"), err
    info = server.get("/object_info/SpecAR_LoadModel")["SpecAR_LoadModel"]["input"]["optional"]["offload"]
    assert info[0] == "BOOLEAN" and HELP[1:] in info[1]["tooltip"]
    assert server.run(_api("embedded_t2i_ar"))["status"]["status_str"] == "success"


PARTIAL_LOAD = r"""
import json, sys, importlib.util, pathlib
import torch
sys.path.insert(0, sys.argv[1])  # ComfyUI, told it has no GPU as the server is
folder, pack = sys.argv[1:3]
sys.argv = [sys.argv[0], "--cpu"]
import comfy.options
comfy.options.enable_args_parsing()
import comfy.model_management as mm
import comfy.ops
pack = pathlib.Path(pack)
spec = importlib.util.spec_from_file_location("spec_ar", pack / "__init__.py", submodule_search_locations=[str(pack)])
sys.modules["spec_ar"] = module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
from spec_ar.loaders.detect import load_model
from spec_ar.nodes.models import _patcher, buffers_to
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

def tokens(model):
    return SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd", window=24)).generate(["a red circle"], seeds=5).tokens

model = load_model("embedded", device="cpu", dtype="float32")
before = tokens(model)
patcher = _patcher(model, torch.device("cpu"))
casts = []
real = comfy.ops.cast_bias_weight
comfy.ops.cast_bias_weight = lambda s, *a, **k: casts.append(type(s).__name__) or real(s, *a, **k)
patcher.load(torch.device("cpu"), lowvram_model_memory=2 * 2**20)  # what ComfyUI does when the card is short
buffers_to(patcher.model, torch.device("cpu"))
after = tokens(model)
print(json.dumps({"lowvram": bool(patcher.model.model_lowvram), "casts": sorted(set(casts)), "calls": len(casts),
                  "same": bool(torch.equal(before, after)),
                  "weights": sum(p.numel() * p.element_size() for p in patcher.model.parameters())}))
"""


def test_comfyui_can_load_a_full_precision_model_partially_and_it_samples_the_same_tokens(tmp_path):
    """ComfyUI's own partial loading (lowvram) of the pack's model, in ComfyUI's environment: with 2 MB of
    the model's weights allowed on the device, the rest is cast in layer by layer through ComfyUI's ops,
    and the sampler makes the very tokens of the resident model."""
    import subprocess

    folder, python = locate()
    script = tmp_path / "partial.py"
    script.write_text(PARTIAL_LOAD)
    done = subprocess.run([str(python), str(script), str(folder), str(pathlib.Path(__file__).parents[1])],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["lowvram"] and out["same"], out
    assert "Linear" in out["casts"] and out["calls"] > 1000, out  # the layers left out were cast in, every forward
    assert out["weights"] > 4 * 2 * 2**20
