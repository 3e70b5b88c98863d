"""Finished images leaving the batch, measured: each batch decoded with its finished images riding
along to the end (as before) and with them leaving (``sampling/engine.py``, ``LEAVE_SHARE``), the
two taking turns over the same seeds.

    spec-ar bench leave [--model embedded] [--prompts FILE] [--batches 8 16 32] [--modes sjd lantern]
                        [--repeats 3] [--out DIR]

Per batch size and mode: the median time per batch of each (device-synchronised), the rows the
forwards ran (images times forwards, summed over the batch's steps), the steps, and whether the
tokens are the same (they must be).  Writes ``leave.json`` and ``report.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import statistics


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spec-ar bench leave", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded", help="checkpoint file or folder (its family's adapter must "
                                                         "let images leave), or 'embedded'")
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--modes", nargs="+", default=["sjd", "lantern"])
    ap.add_argument("--repeats", type=int, default=3, help="timed batches of each, taking turns")
    ap.add_argument("--prompts", default=None, help="a prompts file (default: the embedded model's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default="out/bench-leave")
    args = ap.parse_args(argv)

    import torch

    from ..embedded_tools.demo import PROMPTS
    from ..loaders.detect import load_model
    from ..prompt_files import read_prompts
    from ..sampling import DecodeConfig, SpeculativeDecoder
    from ..sampling.timing import Timer

    model = load_model(args.model, **({"device": args.device} if args.device else {}))
    ad = model.adapter
    texts = read_prompts(args.prompts or PROMPTS, f"--prompts {args.prompts or PROMPTS}")
    rows, out = [], pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{args.model} on {ad.device}: batches {args.batches}, modes {args.modes}, {args.repeats} repeats")
    for batch in args.batches:
        prompts = [texts[i % len(texts)] for i in range(batch)] if model.condition != "class" else \
            [i % 10 for i in range(batch)]
        for mode in args.modes:
            decoders = {}
            for kind in ("ride along", "leave"):
                decoders[kind] = SpeculativeDecoder(ad, DecodeConfig(mode=mode))
                if not decoders[kind].leaves:
                    raise SystemExit(f"{mode} on {args.model}: images cannot leave the batch here")
            decoders["ride along"].leaves = False
            decoders["leave"].generate(prompts, seeds=args.seed)  # warm-up (the window on auto's trial)
            times = {k: [] for k in decoders}
            results = {}
            for r in range(args.repeats):
                for kind, decoder in decoders.items():
                    steps, widths = [], []
                    timer = Timer(ad.device)
                    timer.start()
                    with counted_rows(ad, widths):
                        result = decoder.generate(prompts, seeds=args.seed + 1000 * (r + 1),
                                                  callback=lambda e, steps=steps: steps.append(e.step))
                    timer.stop()
                    times[kind].append(timer.total)
                    results[kind] = (result, steps, sum(widths))
            (ride, ride_steps, _), (left, _, _) = results["ride along"], results["leave"]
            row = {"batch": batch, "mode": mode, "window": left.reports[0].settings.get("window"),
                   "same_tokens": bool(torch.equal(ride.tokens, left.tokens)),
                   "steps": len(ride_steps) - 1,
                   "forwards_per_image": statistics.mean(r.nfe for r in left.reports),
                   "slowest_forwards": max(r.nfe for r in left.reports)}
            for kind in decoders:
                key = kind.replace(" ", "_")
                row[f"{key}_ms"] = 1000 * statistics.median(times[kind])
                row[f"{key}_image_forwards"] = results[kind][2]  # the images each forward ran, summed
            row["speedup"] = row["ride_along_ms"] / row["leave_ms"]
            row["times_ms"] = {k: [round(1000 * t) for t in v] for k, v in times.items()}
            rows.append(row)
            print(f"  batch {batch:3d} {mode:8s} ride along {row['ride_along_ms']:8.0f} ms  leave "
                  f"{row['leave_ms']:8.0f} ms  ({row['speedup']:.2f}x)  image-forwards "
                  f"{row['ride_along_image_forwards']} -> {row['leave_image_forwards']}  "
                  f"same tokens {row['same_tokens']}")
    (out / "leave.json").write_text(json.dumps(rows, indent=1))
    (out / "report.md").write_text(report(rows, args, str(ad.device)))
    print(f"wrote {out / 'leave.json'} and {out / 'report.md'}")
    return 0 if all(r["same_tokens"] for r in rows) else 1


@contextlib.contextmanager
def counted_rows(adapter, rows: list[int]):
    """Appends to ``rows`` the images each of ``adapter``'s verify forwards runs, while within."""
    forward = adapter.forward

    def counting(tokens):
        rows.append(tokens.shape[0])
        return forward(tokens)

    adapter.forward = counting
    try:
        yield
    finally:
        del adapter.forward


def report(rows: list[dict], args, device: str) -> str:
    batches = " ".join(map(str, args.batches))
    lines = ["# Finished images leaving the batch\n", f"`spec-ar bench leave --batches {batches} "
             f"--modes {' '.join(args.modes)} --repeats {args.repeats}` on {device}, model {args.model}; median of "
             f"{args.repeats} batches each, the two taking turns.\n",
             "| batch | mode | window | steps | forwards / image (slowest) | ride along ms | leave ms | speed-up | "
             "image-forwards (ride along -> leave) | same tokens |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['mode']} | {r['window']} | {r['steps']} | {r['forwards_per_image']:.1f} "
              f"({r['slowest_forwards']}) | {r['ride_along_ms']:.0f} | {r['leave_ms']:.0f} | {r['speedup']:.2f}x | "
              f"{r['ride_along_image_forwards']} -> {r['leave_image_forwards']} | {r['same_tokens']} |" for r in rows]
    return "\n".join(lines) + "\n"
