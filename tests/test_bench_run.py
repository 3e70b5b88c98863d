"""`spec-ar bench` end to end on the embedded model, at a tiny size."""
import json

from spec_ar.cli import main


def test_bench_writes_tables_charts_and_quality(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle in the top left\na blue star in the center on a dotted white background\n")
    out = tmp_path / "bench"
    assert main(["bench", "--modes", "ar", "sjd", "--sweep", "gsd:G=1,10", "--seeds", "0", "--repeats", "1",
                 "--prompts", str(prompts), "--quality-images", "8", "--quality-batch", "8",
                 "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert list(res["runs"]) == ["ar", "sjd", "gsd G=1", "gsd G=10"]
    ar, sjd = res["runs"]["ar"], res["runs"]["sjd"]
    assert ar["nfe"] == 256 and ar["nfe_reduction"] == 1.0 and sjd["nfe"] < 256
    assert 0 < sjd["outside_forwards"] < 1 and sjd["memory_mb"] > 0 and 0 <= sjd["adherence"] <= 1
    assert res["noise_floor_fd"] >= 0 and "fd" in res["runs"]["gsd G=10"]
    report = (out / "report.md").read_text()
    assert "| gsd G=10 |" in report and "CPU only" in report and "Noise floor" in report
    assert "GSD (So et al., ICCV 2025)" in report  # the papers' figures, labelled as theirs
    for png in ("modes_nfe.png", "pareto_nfe_adherence.png", "pareto_latency_fd.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
