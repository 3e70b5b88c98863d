"""The ``spec-ar`` command line."""
from __future__ import annotations

import argparse
import json
import pathlib
import sys


def _demo(args) -> int:
    import torch
    from PIL import Image

    from .loaders.synthetic import SyntheticAdapter
    from .sampling import ConfigError, DecodeConfig, SpeculativeDecoder
    from .sampling.report import ORIGINS, accept_map

    torch.manual_seed(0)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = SyntheticAdapter(codebook=1024, rows=16, cols=16, hidden=128, layers=2, end_of_line=True,
                             sharpness=3.0, seed=0)
    prompts = list(range(args.batch))
    rows, results = [], {}
    print("Engine demo on a random-weight synthetic model (1024 codes, 16x16 tokens with end-of-line).")
    print("It shows the decoding machinery, not images: the embedded trained model comes with the demo proper.\n")
    for mode in ("ar", "sjd", "gsd", "lantern", "vvs"):
        try:
            cfg = DecodeConfig(mode=mode, window=args.window, lantern_k=100, top_k=200)
            decoder = SpeculativeDecoder(model, cfg)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        decoder.generate(prompts, seeds=args.seed)  # warm-up
        res = decoder.generate(prompts, seeds=args.seed)
        results[mode] = [r.to_dict() for r in res.reports]
        rep = res.reports[0]
        nfe = sum(r.nfe for r in res.reports) / len(res.reports)
        rows.append((mode, nfe, rep.tokens / nfe, sum(r.mean_accepted_length for r in res.reports) / len(res.reports),
                     rep.latency_s * 1000, rep.engine_time_s / rep.latency_s))
        Image.fromarray(accept_map(rep.origins, model.layout.row_stride)).save(out / f"accept_map_{mode}.png")
    ar_latency = rows[0][4]
    header = "| mode | NFE | tokens/forward | MAL | latency ms | speed-up vs ar | outside forwards |"
    lines = [header, "|" + "---|" * 7]
    for mode, nfe, tpf, mal, ms, share in rows:
        speedup = ar_latency / ms
        lines.append(f"| {mode} | {nfe:.1f} | {tpf:.2f} | {mal:.2f} | {ms:.0f} | {speedup:.2f}x | {share:.0%} |")
    table = "\n".join(lines)
    print(table)
    legend = "\n".join(f"- {name}" for name in ORIGINS.values())
    (out / "report.md").write_text(
        "# Engine demo (synthetic random-weight model)\n\n"
        f"Batch {args.batch}, window {args.window}, seed {args.seed}, CPU.\n\n{table}\n\n"
        f"Accept maps (`accept_map_<mode>.png`, first image) colour each token by how it was obtained:\n{legend}\n"
    )
    (out / "report.json").write_text(json.dumps(results, indent=1))
    print(f"\nWrote {out / 'report.md'}, {out / 'report.json'} and accept maps in {out}/")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spec-ar", description="Speculative decoding for autoregressive image models.")
    sub = ap.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="decode in every mode and write a report")
    demo.add_argument("--out", default="out/demo", help="output folder (default: out/demo)")
    demo.add_argument("--batch", type=int, default=2)
    demo.add_argument("--window", type=int, default=16)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(run=_demo)
    args = ap.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
