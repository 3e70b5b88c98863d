"""`spec-ar bench` end to end: the embedded model at a tiny size, another family, bad input."""
import json

import pytest

from spec_ar.cli import main
from spec_ar.sampling import DecodeConfig

from .checkpoints import random_gpt, tiny_gpt_spec, write_gpt, write_vq


def test_bench_writes_tables_charts_and_quality(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle in the top left\na blue star in the center on a dotted white background\n")
    out = tmp_path / "bench"
    assert main(["bench", "--modes", "ar", "sjd", "--sweep", "gsd:G=1,10", "--seeds", "0", "--repeats", "1",
                 "--prompts", str(prompts), "--quality-images", "8", "--quality-batch", "8",
                 "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    best = res["best_relaxed"]  # VVS skipping is added on the relaxed setting with the most tokens per forward
    assert best in ("gsd G=1", "gsd G=10")
    assert list(res["runs"]) == ["ar", "sjd", "gsd G=1", "gsd G=10", f"vvs on {best}", f"vvs-sim on {best}"]
    assert res["runs"][f"vvs on {best}"]["settings"]["schedule"] == "uniform"
    assert res["runs"][f"vvs on {best}"]["settings"]["group_size"] == res["runs"][best]["settings"]["group_size"]
    ar, sjd = res["runs"]["ar"], res["runs"]["sjd"]
    assert ar["nfe"] == 256 and ar["nfe_reduction"] == 1.0 and sjd["nfe"] < 256
    assert 0 < sjd["outside_forwards"] < 1 and sjd["memory_mb"] > 0 and 0 <= sjd["adherence"] <= 1
    # the process peak includes the loaded weights (8 MB of safetensors) and torch itself
    assert sjd["peak_rss_mb"] > 50 and "| peak RSS MB |" in (out / "report.md").read_text()
    assert res["fd_noise_floor"] >= 0 and "fd" in res["runs"]["gsd G=10"] and res["runs"]["sjd"]["fd_to_ar"] > 0
    assert set(res["runs"]["sjd"]["adherence_parts"]) == {"colour", "shape", "position"}
    assert 0 < ar["target_nll"] < 10 and ar["zero_mass_tokens"] == sjd["zero_mass_tokens"] == 0
    verdicts = res["targets"]  # one per issue target: sjd, gsd, vvs on the best relaxed setting
    assert [t["target"][:5] for t in verdicts] == ["`sjd`", "`gsd`", "`vvs`"]
    assert all(isinstance(t["met"], bool) and t["measured"] for t in verdicts)
    report = (out / "report.md").read_text()
    lines = report.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("| setting |"))
    assert lines[at + 1].count("---") == lines[at].count("|") - 1  # one separator cell per column
    assert "| target NLL |" in report and "### Targets" in report and "| gsd G=10 |" in report and "CPU only" in report and "Noise floor" in report
    assert "GSD (So et al., ICCV 2025)" in report  # the papers' figures, labelled as theirs
    for png in ("modes_nfe.png", "pareto_nfe_adherence.png", "pareto_latency_fd.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def _row(nfe, adherence, fd, tpf=None, **extra):
    return {"nfe": nfe, "nfe_reduction": 256 / nfe, "tokens_per_forward": tpf or 256 / nfe, "adherence": adherence,
            "fd": fd, "fd_to_ar": 50.0, **extra}


def test_target_verdicts_follow_the_issue_rules():
    from spec_ar.bench.report import targets

    results = {"fd_noise_floor": 40.0, "best_relaxed": "gsd G=3", "runs": {
        "ar": _row(256, 0.20, 1000),
        "sjd": _row(100, 0.21, 1030),  # 2.56x fewer, FD gap 30 <= floor 40
        "gsd G=3": _row(70, 0.185, 1050),  # 3.66x, adherence 1.5 points down: kept
        "gsd G=50": _row(40, 0.17, 1100),  # 6.4x but 3 points down: not kept
        "vvs on gsd G=3": _row(50, 0.18, 1060, tpf=5.0)}}
    sjd, gsd, vvs = targets(results)
    assert sjd["met"] and gsd["met"] and vvs["met"] and "`gsd G=3`" in gsd["measured"]
    results["runs"]["sjd"]["fd"] = 1041  # gap 41 > floor 40
    results["runs"]["gsd G=3"]["adherence"] = 0.175  # 2.5 points down: no gsd setting kept adherence
    results["runs"]["vvs on gsd G=3"]["tokens_per_forward"] = 256 / 70
    assert [t["met"] for t in targets(results)] == [False, False, False]


def test_bench_on_another_family_reports_target_likelihood(tmp_path, capsys):
    """Any checkpoint the pack loads can be benched; quality is then the target's own NLL."""
    (tmp_path / "c2i").mkdir()
    gpt = write_gpt(tmp_path / "c2i" / "weights.pt", random_gpt(tiny_gpt_spec("c2i"), 1))
    write_vq(tmp_path / "c2i" / "vq.pt")
    ids = tmp_path / "classes.txt"
    ids.write_text("1\n3\n")
    out = tmp_path / "bench"
    assert main(["bench", "--model", str(gpt), "--resolution", "64", "--prompts", str(ids), "--modes", "ar", "sjd",
                 "--sweep", "lantern:delta=1.0;k=50", "--seeds", "0", "--repeats", "1", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    ar, sjd, loose = res["runs"]["ar"], res["runs"]["sjd"], res["runs"]["lantern delta=1.0 k=50"]
    assert res["prompts"] == [1, 3] and "adherence" not in ar and res["targets"] == []
    # exact modes never commit a token the target gives no mass (top-k 2000 of 1024 codes: none)
    assert ar["zero_mass_tokens"] == sjd["zero_mass_tokens"] == 0 and ar["target_nll"] > 0
    # a full total-variation budget accepts neighbours the target finds less likely than its own samples
    assert loose["target_nll"] > ar["target_nll"]
    assert "| target NLL |" in (out / "report.md").read_text()


def test_bench_runs_every_drafted_setting_again_on_a_draft_model(tmp_path, capsys):
    (tmp_path / "c2i").mkdir()
    gpt = write_gpt(tmp_path / "c2i" / "weights.pt", random_gpt(tiny_gpt_spec("c2i"), 1))
    write_vq(tmp_path / "c2i" / "vq.pt")
    ids = tmp_path / "classes.txt"
    ids.write_text("1\n3\n")
    out = tmp_path / "bench"
    # the target drafting for itself: every draft stands
    assert main(["bench", "--model", str(gpt), "--drafter", str(gpt), "--resolution", "64", "--prompts", str(ids),
                 "--modes", "ar", "sjd", "--seeds", "0", "--repeats", "1", "--out", str(out)]) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert sorted(runs) == ["ar", "sjd", "sjd + drafter"]
    assert runs["sjd + drafter"]["drafter"].startswith("LlamaGen") and "drafter" not in runs["sjd"]
    # 16 tokens: the prefill draws the first, then each forward commits its drafts and the bonus
    assert runs["sjd + drafter"]["nfe"] == 1 + -(-15 // (DecodeConfig().depth + 1)) < runs["sjd"]["nfe"]
    assert "| sjd + drafter |" in (out / "report.md").read_text()


def test_bench_checks_the_prompt_list_before_loading(tmp_path, capsys):
    gpt = write_gpt(tmp_path / "weights.pt", random_gpt(tiny_gpt_spec("c2i"), 1))
    words = tmp_path / "prompts.txt"
    words.write_text("a red fox\n")
    assert main(["bench", "--model", str(gpt), "--prompts", str(words), "--out", str(tmp_path / "b")]) == 2
    assert "class-conditional: --prompts must hold one class id per line (got 'a red fox')" in capsys.readouterr().err


def test_device_is_checked_before_anything_loads(tmp_path, capsys, monkeypatch):
    import torch

    from spec_ar.loaders.base import resolve_device
    from spec_ar.sampling import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None) == "cpu"
    assert main(["bench", "--device", "cuda", "--out", str(tmp_path / "b")]) == 2
    assert "device 'cuda': no CUDA device on this machine" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a one-GPU machine
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device(None) == "cuda" and resolve_device("cuda:0") == "cuda:0"
    for bad, message in (("cuda:3", "has 1 CUDA device"), ("tpu", "must be cpu, cuda or cuda:N"),
                         ("mps", "must be cpu, cuda or cuda:N")):
        with pytest.raises(ConfigError, match=message):
            resolve_device(bad)
