"""``spec-ar bench leave``: the two ways of ending a batch side by side, on the same seeds."""
from __future__ import annotations

import json

from spec_ar.bench.leave import main


def test_the_bench_times_both_and_checks_the_tokens(tmp_path, capsys):
    assert main(["--batches", "2", "--modes", "sjd", "--repeats", "1", "--out", str(tmp_path)]) == 0
    row, = json.loads((tmp_path / "leave.json").read_text())
    assert row["same_tokens"] and row["batch"] == 2 and row["ride_along_ms"] > 0 and row["leave_ms"] > 0
    assert row["leave_image_forwards"] < row["ride_along_image_forwards"] == 2 * row["steps"]
    assert "| 2 | sjd |" in (tmp_path / "report.md").read_text()
