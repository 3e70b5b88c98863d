"""The nodes' logic, outside ComfyUI: listing, settings, maps, tables, plots, prompts."""
import json
import time

import numpy as np
import pytest
import torch

from spec_ar.nodes import common
from spec_ar.sampling import ConfigError, DecodeConfig, SpeculativeDecoder, TokenLayout

from .fakes import TabularAdapter


def test_model_listing_shows_files_and_model_folders(tmp_path):
    (tmp_path / "llamagen").mkdir()
    (tmp_path / "llamagen" / "t2i_XL_stage1_256.pt").write_bytes(b"x")
    (tmp_path / "llamagen" / "vq_ds16_t2i.pt").write_bytes(b"x")
    janus = tmp_path / "Janus-Pro-1B"
    janus.mkdir()
    (janus / "config.json").write_text("{}")
    (janus / "model.safetensors").write_bytes(b"x")  # part of the folder, not a model of its own
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "x.pt").write_bytes(b"x")
    assert common.list_models([str(tmp_path), str(tmp_path / "missing")]) == [
        "Janus-Pro-1B", "llamagen/t2i_XL_stage1_256.pt", "llamagen/vq_ds16_t2i.pt"]
    assert common.resolve_model("Janus-Pro-1B", [str(tmp_path)]) == janus
    with pytest.raises(FileNotFoundError, match="'gone.pt' is not in the spec_ar model folder"):
        common.resolve_model("gone.pt", [str(tmp_path)])


def test_model_listing_survives_loops_and_huge_trees(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path, target_is_directory=True)  # a -> .
    (tmp_path / "b").symlink_to(tmp_path, target_is_directory=True)  # b -> .
    (tmp_path / "m.pt").write_bytes(b"x")
    elsewhere = tmp_path.parent / (tmp_path.name + "-disk2")
    elsewhere.mkdir()
    (elsewhere / "big.safetensors").write_bytes(b"x")
    (tmp_path / "disk2").symlink_to(elsewhere, target_is_directory=True)  # models on another disk still list
    deep = tmp_path / "1" / "2" / "3" / "4" / "5"
    deep.mkdir(parents=True)
    (deep / "too_deep.pt").write_bytes(b"x")
    started = time.perf_counter()
    assert common.list_models([str(tmp_path)]) == ["disk2/big.safetensors", "m.pt"]
    assert time.perf_counter() - started < 5
    wide = tmp_path / "wide"
    wide.mkdir()
    for i in range(300):
        (wide / f"{i:03d}.pt").write_bytes(b"")
    assert len(common.list_models([str(tmp_path)], entries=100)) < 100  # the walk stops, it does not hang


@pytest.mark.parametrize("name", ["../../../../etc/passwd", "/etc/passwd", "llamagen/../../secret.pt", "..",
                                  "C:\\Windows\\win.ini", "", "x" * 5000])
def test_model_names_cannot_leave_the_model_folder(tmp_path, name):
    models = tmp_path / "models"
    models.mkdir()
    (tmp_path / "secret.pt").write_bytes(b"x")
    with pytest.raises(FileNotFoundError) as err:
        common.resolve_model(name, [str(models)])
    assert "spec_ar model folder" in str(err.value) and len(str(err.value)) < 400


def test_widgets_become_a_validated_config():
    c = common.decode_config("gsd", True, window=8, draft_init="sample-left", G=25, gsd_delta=0.2, k=100,
                             lantern_delta=0.3, skip_interval=3, skip_threshold=0.6, cfg=9.0, top_k=5)
    assert (c.mode, c.window, c.init, c.group_size, c.gsd_delta) == ("gsd", 8, "sample-left", 25, 0.2)
    assert (c.lantern_k, c.lantern_delta, c.skip_interval, c.skip_threshold) == (100, 0.3, 3, 0.6)
    assert c.cfg_scale is None and c.top_k is None  # family defaults
    own = common.decode_config("sjd", False, cfg=9.0, top_k=0, top_p=0.5, temperature=0.7)
    assert (own.cfg_scale, own.top_k, own.top_p, own.temperature) == (9.0, None, 0.5, 0.7)
    assert common.decode_config("vvs", schedule="similarity").verify_schedule == "similarity"
    assert common.decode_config("gsd", schedule="similarity").verify_schedule == "similarity"  # any relaxed mode
    assert common.decode_config("gsd", schedule=common.AUTO).verify_schedule == "every"
    with pytest.raises(ConfigError, match="mode must be one of"):
        common.decode_config("fast")
    # errors name the widget as the node shows it, not the field
    assert common.decode_config("sjd", window=0).window is None  # 0 on the slider: auto
    assert common.decode_config("sjd", window=0, draft_coupling="none").drafting == (16, "random")  # SJD as published
    with pytest.raises(ConfigError, match=r"^window must be an integer in \[1, 256\]; none is auto \(got 257\)"):
        common.decode_config("sjd", window=257)
    with pytest.raises(ConfigError, match=r"^G must be an integer in \[1, 1000\] \(got 0\)"):
        common.decode_config("gsd", G=0)
    with pytest.raises(ConfigError, match=r"^k must be an integer in \[1, the model's codebook size - 1\]"):
        common.decode_config("lantern", k=0)
    with pytest.raises(ConfigError, match="unknown sampler input"):
        common.decode_config("sjd", vvs_schedule="uniform")


def test_accept_map_and_report_rows_come_from_a_real_decode():
    adapter = TabularAdapter(image=4, length=5, forced=(2,), seed=1)  # one row of 5, a forced token in it
    result = SpeculativeDecoder(adapter, DecodeConfig(mode="sjd", window=4)).generate([0, 1], seeds=3)
    maps = common.accept_map_images(result.reports, adapter.layout, scale=2)
    assert maps.shape == (2, 2, 10, 3)
    grey = torch.tensor([160, 160, 160]) / 255  # the forced token's colour
    assert torch.allclose(maps[0, 0, 4], grey) and not torch.allclose(maps[0, 0, 0], grey) and maps.dtype == torch.float32 and 0 <= maps.min() and maps.max() <= 1
    rows = [common.report_row(r, "sjd w=4", "p") for r in result.reports]
    assert [r["nfe"] for r in rows] == [r.nfe for r in result.reports] and rows[0]["seed"] == 3
    table = common.table(rows + [dict(rows[0], mode="ar", label="ar", latency_s=rows[0]["latency_s"] * 2)])
    assert table.count("\n") == 4 and "| sjd w=4 | p | sjd | 3 |" in table and "2.00x" in table
    img = common.plot(rows)
    assert img.size == (900, 420)
    assert common.table([]) == "(no reports)"


def test_the_sampler_ui_carries_every_report_as_json_data():
    adapter = TabularAdapter(image=4, length=5, forced=(2,), seed=1)
    result = SpeculativeDecoder(adapter, DecodeConfig(mode="sjd", window=4)).generate([0, 1], seeds=3)
    ui = common.report_ui(result.reports)
    assert list(ui) == [common.REPORTS_UI]
    sent = json.loads(json.dumps(ui))[common.REPORTS_UI]  # what /history hands a client
    assert [r["seed"] for r in sent] == [3, 4] and [r["nfe"] for r in sent] == [r.nfe for r in result.reports]
    assert sent[0]["mode"] == "sjd" and sent[0]["latency_s"] == result.reports[0].latency_s
    assert "origins" not in sent[0] and set(sent[0]) | {"origins"} == set(result.reports[0].to_dict())


def test_combo_values_are_checked_by_name():
    assert common.check_choices(mode=("gsd", ["sjd", "gsd"]), seed=(None, [1])) is True
    assert common.check_choices(mode=("fast", ["sjd", "gsd"])) == "mode must be one of 'sjd', 'gsd' (got 'fast')"


def test_prompt_lists(tmp_path):
    assert common.prompt_list("a red circle\n\n# skipped\n  a blue square  \n") == ["a red circle", "a blue square"]
    (tmp_path / "list.txt").write_text("\ufefffrom a file\n", encoding="utf-8")  # a BOM, as Windows editors write
    assert common.prompt_list("ignored", "list.txt", str(tmp_path)) == ["from a file"]
    with pytest.raises(ValueError, match="prompts: no prompt found"):
        common.prompt_list("\n# only a comment\n")
    (tmp_path / "latin1.txt").write_bytes("a red circle\nune crème rouge\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"file 'latin1.txt': not UTF-8 text \(byte 0xe8 on line 2\); save"):
        common.prompt_list("", "latin1.txt", str(tmp_path))
    for name in ("../secret.txt", "gone.txt"):
        with pytest.raises(ValueError, match="file"):
            common.prompt_list("", name, str(tmp_path))


def test_shards_split_a_prompt_list_into_contiguous_near_equal_parts():
    lines = [f"prompt {i}" for i in range(10)]
    parts = [common.shard(lines, i, 3) for i in range(3)]
    assert [len(p) for p in parts] == [4, 3, 3] and sum(parts, []) == lines  # every prompt once, in order
    assert common.shard(lines, 0, 1) == lines
    assert common.shard(lines[:2], 2, 3) == []  # more shards than prompts: the node says so
    for index, count, message in ((3, 3, "shard must be an integer from 0 to shards - 1 = 2"),
                                  (-1, 3, "shard must be"), (0, 0, "shards must be an integer >= 1"),
                                  (True, 2, "shard must be")):
        with pytest.raises(ValueError, match=message):
            common.shard(lines, index, count)


def test_preview_throttle_keeps_previews_under_budget():
    assert not common.PreviewThrottle(first=2.0).due()  # nothing in the first seconds
    throttle = common.PreviewThrottle(budget=0.05, interval=0.0, first=0.5, start=time.perf_counter() - 1.0)
    assert throttle.due()
    throttle.record(0.2)  # 0.2 s of previews after 1 s: over 5 %
    assert not throttle.due()
    throttle.start -= 10.0  # 11 s in
    assert throttle.due()


class SteppedClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize("preview_s", [0.002, 0.05, 0.4])
def test_a_throttled_render_sends_previews_by_count_and_interval(preview_s):
    """A 30 s render of 3000 steps (10 ms each), asking for a preview at every step as the
    sampler node does: none in the first seconds, none closer than the interval, and
    previews stay within the budget (one preview over at most, its cost unknown before)."""
    clock = SteppedClock()
    throttle = common.PreviewThrottle(clock=clock)
    sent = []
    for _ in range(3000):
        clock.now += 0.01
        if throttle.due():
            sent.append(clock.now - throttle.start)
            clock.now += preview_s
            throttle.record(preview_s)
    elapsed = clock.now - throttle.start
    assert sent and sent[0] >= throttle.first
    assert all(b - a >= throttle.interval for a, b in zip(sent, sent[1:]))
    assert len(sent) <= 1 + (elapsed - throttle.first) / throttle.interval
    assert throttle.count == len(sent) and throttle.spent <= throttle.budget * elapsed + preview_s
    if preview_s <= 0.01:  # cheap previews: about one per interval
        assert len(sent) >= (30 - throttle.first) / throttle.interval * 0.9


def test_partial_preview_greys_rows_not_yet_committed():
    layout = TokenLayout.raster(4, 4, vocab_size=8)
    tokens = torch.zeros(1, 16, dtype=torch.long)

    def decode(grid):  # a white 4 x 4-pixel square per token
        return torch.ones(grid.shape[0], 3, 16, 16)

    img = torch.from_numpy(np.array(common.partial_preview(decode, tokens, 6, layout)))
    assert (img[:4] == 255).all() and (img[4:8, :8] == 255).all()  # row 0 and half of row 1 committed
    assert (img[4:8, 8:] == 128).all() and (img[8:] == 128).all()


def test_knob_visibility_lists_for_each_mode_the_knobs_it_reads():
    from spec_ar.sampling.config import MODES

    table = common.knob_visibility()
    by_label = {w["label"]: w["field"] for w in common.sampler_widgets()}
    assert set(table["visible"]) == set(MODES) and table["switch"] == common.FAMILY_DEFAULTS
    assert table["visible"]["ar"]["auto"] == table["switched"]  # ar reads only the sampling settings
    assert "G" in table["visible"]["gsd"]["auto"] and "G" not in table["visible"]["lantern"]["auto"]
    assert "skip_interval" in table["visible"]["vvs"]["auto"]  # the mode's own schedule
    assert "skip_threshold" in table["visible"]["sjd"]["similarity"]  # a schedule chosen on the node
    jacobi = {"window", "draft_init", "draft_coupling", "proactive_K", "proactive_D", "rows_R", "rows_W"}
    drafting = {"drafter_depth", "draft_tree"}
    trees = {"chain": set(), "dynamic": {"tree_top_k", "tree_tokens"}, "static": {"tree_top_k", "tree_tokens"}}
    for mode in MODES:  # drafting knobs: every mode but ar, whatever the schedule choice
        for choice, shown in table["visible"][mode].items():
            assert ({"schedule"} | jacobi <= set(shown)) == (mode != "ar"), mode
            assert not drafting & set(shown)
            # a linked draft model: its depth and tree layout instead of the Jacobi knobs, the rest alike
            for tree, extra in trees.items():
                drafted = set(table["drafted"][tree][mode][choice])
                expect = set(shown) - jacobi | drafting | extra if mode != "ar" else set(shown)
                assert drafted == expect, (mode, tree)
    assert table["drafter_input"] == "drafter" and table["tree"] == "draft_tree"
    assert set(table["knobs"]) == set(by_label)  # every widget of the knob table is governed


def test_image_preview_is_the_picture_itself():
    img = torch.rand(8, 6, 3)
    pil = common.image_preview(img)
    assert pil.size == (6, 8)
    assert np.abs(np.asarray(pil) / 255.0 - img.numpy()).max() <= 0.5 / 255 + 1e-6
