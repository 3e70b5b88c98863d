"""``spec-ar bench leave``: the two ways of ending a batch side by side, on the same seeds."""
from __future__ import annotations

import json

from spec_ar.bench.leave import _rows_run, main


def test_the_bench_times_both_and_checks_the_tokens(tmp_path, capsys):
    assert main(["--batches", "2", "--modes", "sjd", "--repeats", "1", "--out", str(tmp_path)]) == 0
    row, = json.loads((tmp_path / "leave.json").read_text())
    assert row["same_tokens"] and row["batch"] == 2 and row["ride_along_ms"] > 0 and row["leave_ms"] > 0
    assert row["leave_image_forwards"] < row["ride_along_image_forwards"] == 2 * row["steps"]
    assert "| 2 | sjd |" in (tmp_path / "report.md").read_text()


def test_the_rows_run_replay_the_engines_rule():
    T = 10
    steps = [[1] * 4, [5, 5, 5, 5], [10, 6, 7, 8], [10, 10, 9, 9], [10, 10, 10, 10]]
    # step 1: 4 rows; step 2: 4 (image 0 finished: a quarter, it leaves); step 3: 3 (image 1 finished: a third,
    # it leaves); step 4: 2, the last
    assert _rows_run(steps, T) == 4 + 4 + 3 + 2
