"""The window on auto against the widths set by hand, quiet and beside a CPU-bound process.

    spec-ar bench auto-window [--batches 1 8] [--runs 10] [--neighbours 0 1] [--busy-start S] [--out DIR]

Each run decodes the embedded model's first ``batch`` prompts once per setting, the
settings taking turns: ``ar``, ``sjd`` with the window on auto, and ``sjd`` at each
``--widths`` width set by hand.  Before each auto decode the model forgets what it
measured and kept (``window_profile``), so every run probes and tries widths anew, as
a fresh ``spec-ar render`` process does.  ``--neighbours N`` runs the whole set again
with N processes beside it that keep a core busy each (a loop of Python arithmetic),
the busy machine on which one probe once chose plain AR steps that ran 6x slower than
window 24.  Prints, per condition and batch, the median latency of each setting, its
ratio to ``ar`` and to window 24, and how often auto chose each width; writes
``results.json`` and ``report.md`` to ``--out``.  ``--busy-start S`` adds a condition in which every
decode starts while two processes keep both cores busy for its first ``S`` seconds, then stop (a
machine still finishing another job as a render starts: the stretch a trial run in blocks of one
width took for that width's cost).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

#: a busy process's work: Python arithmetic until its parent is gone (a bench killed midway leaves none behind)
#: or its seconds, counted from its own start, are over (``inf``: a neighbour, killed when its block ends)
BUSY = ("import os, sys, time\nend = time.perf_counter() + float(sys.argv[2])\n"
        "while os.getppid() == int(sys.argv[1]) and time.perf_counter() < end:\n    sum(i * i for i in range(1000))\n")
#: processes a busy start runs (both cores of the development machine), and the time they take to start
BUSY_START_PROCESSES, BUSY_START_DELAY = 2, 0.06


def _busy(n: int, seconds: float = float("inf")) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY, str(os.getpid()), str(seconds)]) for _ in range(n)]


@contextlib.contextmanager
def neighbours(n: int):
    """``n`` CPU-bound processes for the block's duration."""
    procs = _busy(n)
    try:
        time.sleep(0.5 if n else 0)  # let them reach the cores
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


@contextlib.contextmanager
def busy_start(seconds: float):
    """The block starts while :data:`BUSY_START_PROCESSES` processes keep a core busy each, for its first
    ``seconds``; they are gone when it ends."""
    procs = _busy(BUSY_START_PROCESSES, seconds + BUSY_START_DELAY)
    try:
        time.sleep(BUSY_START_DELAY)  # (their interpreters start)
        yield procs
    finally:
        for p in procs:
            p.wait()


def run(batches, runs, counts, widths, log=print, busy_seconds: float = 0.0) -> dict:
    from ..embedded_tools.demo import PROMPTS
    from ..loaders import embedded
    from ..prompt_files import read_prompts
    from ..sampling import DecodeConfig, SpeculativeDecoder

    model = embedded.load(embedded.FOLDER)
    prompts = read_prompts(PROMPTS)
    settings = {"ar": DecodeConfig(mode="ar"), "sjd auto": DecodeConfig(mode="sjd")}
    settings.update({f"sjd L={w}": DecodeConfig(mode="sjd", window=w) for w in widths})
    decoders = {name: SpeculativeDecoder(model.adapter, c) for name, c in settings.items()}
    out = {"runs": runs, "widths": list(widths), "conditions": {}}
    conditions = [(n, 0.0) for n in counts] + ([(0, busy_seconds)] if busy_seconds else [])
    for n, seconds in conditions:
        label = (f"busy for {seconds:g} s at each decode's start" if seconds else
                 "quiet" if n == 0 else f"{n} busy neighbour{'s' * (n > 1)}")
        condition = out["conditions"][label] = {}
        start = (lambda: busy_start(seconds)) if seconds else contextlib.nullcontext
        with neighbours(n):
            for batch in batches:
                batch_prompts = (prompts * batch)[:batch]
                for d in decoders.values():  # warm-up: first-call costs stay out of the figures
                    d.generate(batch_prompts, seeds=0)
                rows = collections.defaultdict(list)
                for r in range(runs):
                    for name, d in decoders.items():
                        if name == "sjd auto":
                            model.adapter.__dict__.pop("window_profile", None)  # a fresh process: probe anew
                        with start():
                            rep = d.generate(batch_prompts, seeds=100 * r).reports[0]
                        rows[name].append({"latency_s": rep.latency_s, "nfe": rep.nfe, "window": rep.settings["window"],
                                           "window_choice": rep.window_choice})
                condition[batch] = dict(rows)
                log(table(label, batch, rows))
    return out


def table(label: str, batch: int, rows: dict) -> str:
    med = {name: statistics.median(r["latency_s"] for r in runs) for name, runs in rows.items()}
    lines = [f"{label}, batch {batch} ({len(rows['ar'])} runs, settings taking turns; medians):",
             "| setting | ms per batch | vs ar | vs L=24 | min - max ms | width kept (runs) |",
             "|---|---|---|---|---|---|"]
    for name, runs in rows.items():
        lat = [r["latency_s"] * 1000 for r in runs]
        chosen = collections.Counter(r["window"] for r in runs)
        windows = ", ".join(f"{w}: {c}" for w, c in sorted(chosen.items())) if name == "sjd auto" else ""
        w24 = f"{med['sjd L=24'] / med[name]:.2f}x" if "sjd L=24" in med else ""
        lines.append(f"| {name} | {med[name] * 1000:.0f} | {med['ar'] / med[name]:.2f}x | {w24} | "
                     f"{min(lat):.0f} - {max(lat):.0f} | {windows} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spec-ar bench auto-window", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--neighbours", type=int, nargs="+", default=[0, 1],
                    help="CPU-bound processes beside the bench, one condition each (0: quiet)")
    ap.add_argument("--busy-start", type=float, default=0.0, metavar="S",
                    help="add a condition: every decode starts with both cores busy for its first S seconds")
    ap.add_argument("--widths", type=int, nargs="*", default=[24], help="windows set by hand beside auto")
    ap.add_argument("--out", default="out/bench-auto-window")
    args = ap.parse_args(argv)
    if args.runs < 1 or min(args.batches) < 1 or min(args.neighbours) < 0 or not 0 <= args.busy_start <= 60:
        ap.error("--runs and --batches must be >= 1, --neighbours >= 0, --busy-start from 0 to 60 seconds")
    res = run(args.batches, args.runs, args.neighbours, args.widths, busy_seconds=args.busy_start)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    (out / "report.md").write_text("# The window on auto, quiet and beside busy processes\n\n"
                                   f"`spec-ar bench auto-window {' '.join(argv or [])}`\n\n" + "\n".join(
                                       table(label, int(b), rows) for label, cond in res["conditions"].items()
                                       for b, rows in cond.items()))
    print(f"wrote {out}/results.json and report.md")
    return 0
