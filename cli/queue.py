"""``spec-ar queue``: render a prompt list through running ComfyUI servers.

    spec-ar queue --server http://127.0.0.1:8188 [--server URL ...] --workflow FILE --prompts FILE
                  [--chunk 1] [--out out/queue] [--retries 2] [--timeout 1800]

Each queue entry renders one prompt (or ``--chunk`` prompts through the
workflow's Prompt List node).  The client checks every server and the nodes the
workflow needs before submitting anything, spreads the entries over the
servers (one in flight per server), waits on ``/history``, downloads the saved
images and writes ``summary.json`` (per prompt: files, and the sampler's report
per image: forward passes, tokens per forward, latency ...) after every finished
entry, so a rerun with the same arguments resumes where an interrupted one
stopped.  Connection failures are retried ``--retries`` times; a workflow error
is recorded for its prompts and the rest go on.
"""
from __future__ import annotations

import argparse
import copy
import json
import pathlib
import queue as queues
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

from ..nodes.common import NO_FILE, REPORTS_UI
from ..workflows.format import is_api_format, ui_to_api

SAMPLER, PROMPT_LIST = "SpecAR_Sampler", "SpecAR_PromptList"


class QueueError(RuntimeError):
    """Something the user must fix: a server, a workflow, a prompt file."""


class Server:
    def __init__(self, url: str, timeout: float = 30):
        self.url, self.timeout = url.rstrip("/"), timeout

    def get(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=self.timeout) as r:
            body = r.read()
        return json.loads(body) if body[:1] in (b"{", b"[") else body

    def post(self, path: str, payload: dict):
        req = urllib.request.Request(self.url + path, json.dumps(payload).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")
            raise QueueError(f"{self.url} refused the workflow ({err.code}): {detail[:2000]}") from None

    def check(self) -> dict:
        """``/object_info``, or a clear error when the server does not answer."""
        try:
            self.get("/system_stats")
            return self.get("/object_info")
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise QueueError(f"server {self.url} is not reachable ({reason}); start ComfyUI or fix --server") from None


def load_workflow(path: str, object_info: dict) -> dict:
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except FileNotFoundError:
        raise QueueError(f"--workflow: {path} does not exist") from None
    except json.JSONDecodeError as err:
        raise QueueError(f"--workflow: {path} is not JSON ({err})") from None
    if not is_api_format(data):
        try:
            data = ui_to_api(data, object_info)
        except KeyError as err:
            raise QueueError(f"--workflow: {path}: {err.args[0]}") from None
    missing = sorted({v["class_type"] for v in data.values()} - set(object_info))
    if missing:
        raise QueueError(f"--workflow: {path} needs node(s) {missing} that the server lacks; install the pack(s) "
                         "and restart ComfyUI")
    if not any(v["class_type"] == SAMPLER for v in data.values()):
        raise QueueError(f"--workflow: {path} has no Speculative AR Sampler node to send prompts to")
    return data


def with_prompts(workflow: dict, prompts: list[str]) -> dict:
    """The workflow with ``prompts`` put in: into the Prompt List feeding the
    sampler if there is one, else (a single prompt) into the sampler itself."""
    wf = copy.deepcopy(workflow)
    lists = [k for k, v in wf.items() if v["class_type"] == PROMPT_LIST]
    if lists:
        for k in lists:
            wf[k]["inputs"].update(prompts="\n".join(prompts), file=NO_FILE)
        return wf
    if len(prompts) != 1:
        raise QueueError("--chunk above 1 needs a workflow with a Prompt List node feeding the sampler")
    for v in wf.values():
        if v["class_type"] == SAMPLER:
            v["inputs"]["prompt"] = prompts[0]
    return wf


def run_entry(server: Server, workflow: dict, out: pathlib.Path, tag: str, timeout: float) -> dict:
    """Submit one queue entry, wait for it, download its images."""
    body = server.post("/prompt", {"prompt": workflow, "client_id": uuid.uuid4().hex})
    pid = body["prompt_id"]
    deadline = time.monotonic() + timeout
    while True:
        entry = server.get(f"/history/{pid}").get(pid)
        if entry and entry.get("status", {}).get("status_str") in ("success", "error"):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{server.url}: prompt {pid} not finished after {timeout:.0f} s")
        time.sleep(0.5)
    if entry["status"]["status_str"] == "error":
        msgs = [d for kind, d in entry["status"].get("messages", []) if kind == "execution_error"]
        detail = msgs[0].get("exception_message", "").strip() if msgs else "unknown error"
        return {"error": detail, "server": server.url}
    files = []
    samplers = [key for key, node in workflow.items() if node["class_type"] == SAMPLER]
    reports = [r for key in samplers for r in entry["outputs"].get(key, {}).get(REPORTS_UI, [])]
    for out_node in entry["outputs"].values():
        for img in out_node.get("images", []):
            if img.get("type") != "output":
                continue
            query = urllib.parse.urlencode({k: img[k] for k in ("filename", "subfolder", "type")})
            target = out / f"{tag}_{len(files):02d}.png"
            target.write_bytes(server.get(f"/view?{query}"))
            files.append(target.name)
    return {"files": files, "reports": reports, "server": server.url, "prompt_id": pid}


def _share(res: dict, i: int, n: int) -> dict:
    """Prompt ``i``'s part of a chunk's result: the list runs prompts in order, so
    files and reports split evenly."""
    if n == 1 or "error" in res:
        return res
    part = dict(res)
    for key in ("files", "reports"):
        items = res[key]
        k = len(items) // n if len(items) % n == 0 else None
        part[key] = items[i * k:(i + 1) * k] if k is not None else items
    return part


def run(servers: list[str], workflow_file: str, prompts_file: str, out: pathlib.Path, chunk: int = 1,
        retries: int = 2, timeout: float = 1800, log=print) -> dict:
    if chunk < 1:
        raise QueueError(f"--chunk must be >= 1 (got {chunk})")
    from ..prompt_files import read_prompts

    prompts = read_prompts(prompts_file, f"--prompts {prompts_file}")
    pool = [Server(u) for u in dict.fromkeys(servers)]
    infos = [s.check() for s in pool]  # every server answers before anything is queued
    workflow = load_workflow(workflow_file, infos[0])
    for s, info in zip(pool[1:], infos[1:]):
        load_workflow(workflow_file, info)

    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    if summary.get("workflow") not in (None, str(workflow_file)):
        raise QueueError(f"{summary_path} belongs to another workflow ({summary['workflow']}); use another --out")
    done = {r["prompt"] for r in summary.get("prompts", []) if "error" not in r}
    results = [r for r in summary.get("prompts", []) if r["prompt"] in done]
    todo = [p for p in prompts if p not in done]
    jobs: queues.Queue = queues.Queue()
    for start in range(0, len(todo), chunk):
        jobs.put((start, todo[start:start + chunk]))
    total, lock = len(prompts), threading.Lock()
    if done:
        log(f"resuming: {len(done)} of {total} prompts already rendered in {out}")

    def save():
        data = {"workflow": str(workflow_file), "servers": [s.url for s in pool], "prompts": results}
        tmp = summary_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(summary_path)

    def worker(server: Server):
        while True:
            try:
                start, batch = jobs.get_nowait()
            except queues.Empty:
                return
            tag = f"{prompts.index(batch[0]):04d}"
            for attempt in range(retries + 1):
                try:
                    res = run_entry(server, with_prompts(workflow, batch), out, tag, timeout)
                    break
                except QueueError as err:  # refused: retrying will not help
                    res = {"error": str(err), "server": server.url}
                    break
                except (urllib.error.URLError, OSError, TimeoutError) as err:
                    res = {"error": f"{type(err).__name__}: {err}", "server": server.url}
                    if attempt < retries:
                        time.sleep(1 + attempt)
            with lock:
                for i, prompt in enumerate(batch):
                    results.append({"prompt": prompt, **_share(res, i, len(batch))})
                save()
                n = len({r["prompt"] for r in results})
                status = "error: " + res["error"] if "error" in res else f"{len(res['files'])} image(s)"
                log(f"[{n}/{total}] {batch[0][:60]!r}{' +%d' % (len(batch) - 1) if len(batch) > 1 else ''} "
                    f"-> {status} ({server.url})")

    threads = [threading.Thread(target=worker, args=(s,), daemon=True) for s in pool]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    save()
    failed = [r for r in results if "error" in r]
    log(f"wrote {summary_path}: {len(results) - len(failed)} rendered, {len(failed)} failed")
    return {"prompts": results, "failed": len(failed)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spec-ar queue", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", action="append", required=True, help="ComfyUI URL (repeat to use several)")
    ap.add_argument("--workflow", required=True, help="workflow JSON, API or UI format")
    ap.add_argument("--prompts", required=True, help="text file, one prompt per line")
    ap.add_argument("--chunk", type=int, default=1, help="prompts per queue entry (needs a Prompt List node)")
    ap.add_argument("--out", default="out/queue")
    ap.add_argument("--retries", type=int, default=2, help="retries per entry on connection failures")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds to wait for one entry")
    args = ap.parse_args(argv)
    from ..output_folders import writable_folder

    res = run(args.server, args.workflow, args.prompts, writable_folder(args.out, "--out"), args.chunk, args.retries,
              args.timeout)
    return 1 if res["failed"] else 0
