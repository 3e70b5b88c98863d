"""Random-weight checkpoints with the real 7B / 8B / 34B configurations, in each family's release layout.

    python -m spec_ar.bench.scale_checkpoints --family janus-pro-7b --out DIR [--layout converted|original|diffusers]
        [--dtype bfloat16] [--scale 1.0 | --layers N] [--seed 0] [--shard-gb 5] [--check]

Prints the bytes written, the time and the writer's peak resident memory (:func:`.stats.peak_rss`).
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from . import CONFIGS, resolve, with_layers, write
from .check import check
from .scaling import meta_ffn

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def table() -> str:
    """The configurations, one line per family (full size)."""
    lines = []
    for name, c in CONFIGS.items():
        t = c["text"]
        inter = t.get("intermediate_size") or meta_ffn(t["hidden_size"], t["ffn_dim_multiplier"], t["multiple_of"])
        vq = c.get("vq") or c.get("movqgan") or c["cosmos"]
        lines.append(f"{name}: {t['num_hidden_layers']} layers, width {t['hidden_size']}, {t['num_attention_heads']} "
                     f"heads / {t['num_key_value_heads']} kv, FFN {inter}, vocab {t['vocab_size']}, "
                     f"VQ codes {vq.get('num_embeddings') or vq.get('n_embed') or vq.get('codebook_size')}, "
                     f"{c['image_tokens']} image-stream tokens; layouts {', '.join(c['layouts'])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_ar.bench.scale_checkpoints", description=__doc__.split("\n")[0],
                                 epilog="families:\n" + table(), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", required=True, help=f"one of {', '.join(CONFIGS)}")
    ap.add_argument("--out", required=True, help="a new or empty folder")
    ap.add_argument("--layout", choices=["converted", "original", "diffusers"],
                    help="default: the family's release layout")
    ap.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    ap.add_argument("--scale", type=float, default=1.0, help="widths and depths times this (0 < s <= 1)")
    ap.add_argument("--layers", type=int, help="the language model's depth (and GLM-Image's DiT's, at most its "
                    "30), every width the real one (the full shape at a fraction of its layers; not with --scale)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-gb", type=float, default=None,
                    help="largest weight shard in GB (default: the release's, 5 or 10; Meta's layout: one file)")
    ap.add_argument("--holes", action="store_true", help="safetensors weights as headers over sparse holes "
                    "(every value zero, no disk space): for loading and sizing, not for logits")
    ap.add_argument("--check", action="store_true", help="then read back the headers and indexes and check them")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON line at the end")
    args = ap.parse_args(argv)
    try:
        family = resolve(args.family)
        if args.layers is not None:
            with_layers(family, CONFIGS[family], args.layers, args.scale)  # refused before anything is written
    except ValueError as err:
        ap.error(str(err))
    result = write(family, args.out, args.layout, DTYPES[args.dtype], args.scale, args.seed, args.shard_gb,
                   holes=args.holes, layers=args.layers)
    depth = f", {result.layers} layers" if result.layers is not None else ""
    print(f"wrote {result.family} ({result.layout} layout, scale {result.scale}{depth}) to {result.folder}: "
          f"{result.bytes / 1e9:.3f} GB in {len(result.files)} files, {result.parameters / 1e9:.3f} B parameters; "
          f"{result.seconds:.1f} s ({result.weight_seconds:.1f} s weights, "
          f"{result.bytes / 1e6 / max(result.seconds, 1e-9):.0f} MB/s); writer peak RSS "
          f"{result.peak_rss / 2**30:.2f} GiB ({result.rss_before_weights / 2**30:.2f} GiB before the weights)")
    summary = result.summary()
    if args.check:
        summary["check"] = check(result.folder, family, result.layout, result.expected)
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
