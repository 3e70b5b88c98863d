"""``spec-ar batch``: a prompt list rendered once per prompt, in this process or by Ray actors on a local
cluster (a head and a worker node on this machine), equal to a single-process render, resumable, and losing
nothing when an actor is killed mid-run."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from spec_ar.cli import main

PROMPTS = [line for line in (pathlib.Path(__file__).parent.parent / "embedded" / "prompts.txt").read_text()
           .splitlines() if line.strip() and not line.startswith("#")][:8]


def batch(*args, env=None, wait=True):
    """``spec-ar batch`` in its own process (one torch thread: the thread count Ray gives a one-CPU actor,
    so the floating-point sums, and with them the images, are the same)."""
    command = [sys.executable, "-m", "spec_ar.cli", "batch", "--model", "embedded", *args]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    if not wait:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment)
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "list.txt"
    path.write_text("# a comment line\n" + "\n".join(PROMPTS) + "\n")
    return path


@pytest.fixture(scope="module")
def single(prompts, tmp_path_factory):
    """The list rendered in one process, one prompt at a time: the images every other run must equal."""
    out = tmp_path_factory.mktemp("single") / "out"
    batch("--prompts", str(prompts), "--out", str(out), "--seed", "3")
    return out


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray.data")
    from ray.cluster_utils import Cluster

    local = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    local.add_node(num_cpus=1)  # a second node: its actor runs in another raylet's worker
    yield local.address
    local.shutdown()


def manifest_of(out: pathlib.Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def check_against_single(out: pathlib.Path, single: pathlib.Path) -> dict:
    manifest = manifest_of(out)
    indices = [item["index"] for item in manifest["items"]]
    assert indices == list(range(len(PROMPTS)))  # every prompt, each once
    assert [item["prompt"] for item in manifest["items"]] == PROMPTS
    for item in manifest["items"]:
        assert (out / item["image"]).read_bytes() == (single / item["image"]).read_bytes(), item
        record = json.loads((out / item["record"]).read_text())
        assert record["seed"] == 3 + item["index"] and record["report"]["tokens"] > 0
        assert record["report"]["settings"]["window"] == 24  # auto's base width, not one timed per replica
    return manifest


def test_two_actors_render_every_prompt_once_as_one_process_does_and_a_rerun_renders_nothing(
        prompts, single, cluster, tmp_path):
    out = tmp_path / "ray"
    log = batch("--prompts", str(prompts), "--out", str(out), "--seed", "3", "--ray", cluster, "--actors", "2")
    manifest = check_against_single(out, single)
    replicas = [json.loads(p.read_text()) for p in (out / ".actors").glob("*.json")]
    assert len(replicas) == 2  # two actors loaded the model, once each
    assert {item["actor"] for item in manifest["items"]} <= {r["name"] for r in replicas}
    assert f"rendered {len(PROMPTS)} images" in log and "images/s while rendering" in log
    written = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()}
    log = batch("--prompts", str(prompts), "--out", str(out), "--seed", "3", "--ray", cluster, "--actors", "2")
    assert f"{len(PROMPTS)} already rendered, 0 to render" in log
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file() and p.name != "manifest.json"} == {
        k: v for k, v in written.items() if k != "manifest.json"}
    assert len(list((out / ".actors").glob("*.json"))) == 2  # no model was loaded again


def test_an_actor_killed_mid_run_loses_nothing(prompts, single, cluster, tmp_path):
    out = tmp_path / "killed"
    run = batch("--prompts", str(prompts), "--out", str(out), "--seed", "3", "--ray", cluster, "--actors", "2",
                wait=False)
    killed, deadline = None, time.time() + 300
    while run.poll() is None and time.time() < deadline:
        replicas = sorted((out / ".actors").glob("*.json")) if (out / ".actors").is_dir() else []
        if killed is None and len(replicas) == 2 and any(out.glob("*.png")):
            killed = json.loads(replicas[0].read_text())["pid"]
            os.kill(killed, signal.SIGKILL)  # a replica's process dies mid-run, as a crashed or lost node's would
        time.sleep(0.02)
    log = run.communicate(timeout=300)[0]
    assert run.returncode == 0, log[-3000:]
    assert killed is not None, "the run ended before an actor could be killed"
    manifest = check_against_single(out, single)
    assert len(manifest["items"]) == len(list(out.glob("*.png"))) == len(PROMPTS)  # nothing written twice
    assert len(list((out / ".actors").glob("*.json"))) == 3  # Ray restarted the killed one


def test_settings_are_checked_before_any_work(prompts, single, tmp_path, capsys):
    assert main(["batch", "--model", "embedded", "--prompts", str(prompts), "--out", str(tmp_path / "a"),
                 "--actors", "2"]) == 2
    assert "--actors sets the replicas of a Ray run: add --ray" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    assert main(["batch", "--model", "embedded", "--prompts", str(empty), "--out", str(tmp_path / "b")]) == 2
    assert "no prompt found" in capsys.readouterr().err
    assert main(["batch", "--model", "embedded", "--prompts", str(prompts), "--out", str(single),
                 "--mode", "gsd"]) == 2  # another run's folder
    assert "holds a run with other settings" in capsys.readouterr().err
    assert main(["batch", "--model", "embedded", "--prompts", str(prompts), "--out", str(tmp_path / "c"),
                 "--group-size", "0", "--mode", "gsd"]) == 2
    assert "--group-size" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()
