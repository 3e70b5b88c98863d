"""spec-ar bench auto-window: the window on auto against widths set by hand, quiet and beside
busy processes (the figures are the bench's to print; here, that it runs and reports them)."""
from __future__ import annotations

import json

import pytest

from spec_ar.bench import auto_window


def test_busy_neighbours_run_for_the_block_and_are_gone_after():
    with auto_window.neighbours(2) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
        assert all(auto_window.BUSY in p.args for p in procs)
    assert all(p.returncode is not None for p in procs)


def test_a_neighbour_whose_bench_is_gone_stops(tmp_path):
    import subprocess
    import sys
    import time

    # the bench's process starts a neighbour and dies without its cleanup (killed): the neighbour follows
    bench = subprocess.Popen([sys.executable, "-c", f"import os, subprocess, sys, time\n"
                              f"p = subprocess.Popen([sys.executable, '-c', {auto_window.BUSY!r}, str(os.getpid()), 'inf'])\n"
                              f"print(p.pid, flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    pid = int(bench.stdout.readline())
    bench.kill()
    bench.wait()
    for _ in range(100):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"neighbour {pid} still runs after its bench was killed")


def test_the_bench_times_every_setting_in_turn_and_writes_its_report(tmp_path, capsys):
    assert auto_window.main(["--batches", "1", "--runs", "1", "--neighbours", "0", "1", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    for condition in ("quiet", "1 busy neighbour"):
        rows = res["conditions"][condition]["1"]
        assert set(rows) == {"ar", "sjd auto", "sjd L=24"}
        assert all(len(runs) == 1 for runs in rows.values())
        assert all(r["window_choice"].startswith(f"window {r['window']} on auto") for r in rows["sjd auto"])
        assert "kept from this session" not in " ".join(r["window_choice"] for r in rows["sjd auto"])  # probed anew
    report = (tmp_path / "report.md").read_text()
    assert "| sjd auto |" in report and "1 busy neighbour, batch 1" in report


def test_a_busy_start_keeps_the_cores_busy_for_its_first_seconds_only():
    import time

    with auto_window.busy_start(0.4) as procs:
        assert len(procs) == auto_window.BUSY_START_PROCESSES and all(p.poll() is None for p in procs)
    assert all(p.returncode == 0 for p in procs)  # the block waited for them: the next decode starts quiet
    with auto_window.busy_start(0.05) as procs:
        deadline = time.monotonic() + 30  # (a busy CI machine starts interpreters slowly)
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(p.returncode == 0 for p in procs)  # done on their own while the block went on


def test_the_busy_start_condition_and_its_bad_values(tmp_path):
    assert auto_window.main(["--batches", "1", "--runs", "1", "--neighbours", "0", "--busy-start", "0.1",
                             "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert set(res["conditions"]) == {"quiet", "busy for 0.1 s at each decode's start"}
    assert set(res["conditions"]["busy for 0.1 s at each decode's start"]["1"]) == {"ar", "sjd auto", "sjd L=24"}
    for bad in ("-1", "nan", "61"):
        with pytest.raises(SystemExit) as exc:
            auto_window.main(["--busy-start", bad, "--out", str(tmp_path)])
        assert exc.value.code == 2
