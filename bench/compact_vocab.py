"""The compact vocabulary against the whole one, on one model: time, memory, tokens.

    python -m spec_ar.bench.compact_vocab MODEL [--width W --height H] [--modes ar sjd] [--batch 1 8]
        [--repeats 3] [--seed 0] [--dtype float32] [--device cpu] [--drafter FOLDER [--depth 3]]
        [--out FILE.json]

For each mode and batch size the two decoders (``vocabulary="full"`` and ``"compact"``, the
default, ``sampling/compact.py``) decode the same prompts and seeds, interleaved, ``--repeats``
times each; prints the median ms per image of each, their ratio, the decoding state the engine
sizes a request by (``memory_per_image``), the share of stream tokens the two agree on (the
same seeds: equal but where float rounding moves a draw), and tokens per forward of each.
``--drafter``: the speculative modes draft with a draft model or head (``--depth`` tokens), which
follows the decoder's vocabulary.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

PROMPTS = ["a red fox in the snow", "a lighthouse on a cliff at dusk", "a bowl of ramen", "an old green tractor",
           "a cat asleep on a windowsill", "a sailing boat on a calm lake", "a stack of pancakes", "a mountain road"]


def run(model, modes, batches, repeats, seed, drafter=None, depth=3):
    from ..sampling import DecodeConfig, SpeculativeDecoder

    rows = []
    for mode in modes:
        config = DecodeConfig(mode=mode, **({"depth": depth} if drafter is not None else {}))
        decoders = {v: SpeculativeDecoder(model.adapter, config, drafter=drafter, vocabulary=v)
                    for v in ("full", "compact")}
        for batch in batches:
            prompts = (PROMPTS * batch)[:batch]
            times = {v: [] for v in decoders}
            results = {}
            for v, dec in decoders.items():  # a first decode each: the window on auto tries its widths
                dec.generate(prompts, seeds=seed)
            for _ in range(repeats):
                for v, dec in decoders.items():
                    start = time.perf_counter()
                    results[v] = dec.generate(prompts, seeds=seed)
                    times[v].append((time.perf_counter() - start) * 1000 / batch)
            full, small = (statistics.median(times[v]) for v in ("full", "compact"))
            state = {v: dec.memory_per_image(prompts)["decoding state"] for v, dec in decoders.items()}
            same = float((results["full"].tokens == results["compact"].tokens).float().mean())
            tpf = {v: statistics.mean(r.tokens_per_forward for r in results[v].reports) for v in results}
            rows.append({"mode": mode, "batch": batch, "ms_full": full, "ms_compact": small, "speedup": full / small,
                         "state_mb_full": state["full"] / 2**20, "state_mb_compact": state["compact"] / 2**20,
                         "same_tokens": same,
                         "tokens_per_forward_full": tpf["full"], "tokens_per_forward_compact": tpf["compact"],
                         "vocab_full": model.adapter.vocab_size,
                         "vocab_compact": decoders["compact"].adapter.vocab_size})
    return rows


def main(argv=None):
    from ..loaders.detect import load_model
    from ..loaders.storage import STORAGES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a model folder (any family)")
    ap.add_argument("--width", type=int)
    ap.add_argument("--height", type=int)
    ap.add_argument("--modes", nargs="+", default=["ar", "sjd"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32", choices=list(STORAGES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--drafter", help="a draft model or draft head folder the speculative modes draft with")
    ap.add_argument("--depth", type=int, default=3, help="draft tokens per pass with --drafter")
    ap.add_argument("--out", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    model = load_model(args.model, device=args.device, dtype=args.dtype, width=args.width, height=args.height)
    drafter = None
    if args.drafter:
        from ..loaders.detect import load_drafter

        drafter = load_drafter(args.drafter, model, device=args.device,
                               dtype=STORAGES[args.dtype].dtype or torch.float32)  # quantized: float32 drafter
    rows, cols = model.adapter.layout.grid
    print(f"# {model.name}, {rows}x{cols} image tokens, {args.dtype} on {args.device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads"
          + (f", drafts from {drafter.name} ({args.depth} a pass)" if drafter else ""))
    rows = run(model, args.modes, args.batch, args.repeats, args.seed, drafter, args.depth)
    print(f"{'mode':6} {'batch':>5} {'vocab':>15} {'ms/img full':>11} {'compact':>8} {'speedup':>7} "
          f"{'state MB full':>13} {'compact':>8} {'same tokens':>11} {'tok/fwd full':>12} {'compact':>8}")
    for r in rows:
        print(f"{r['mode']:6} {r['batch']:5d} {r['vocab_full']:>7d}/{r['vocab_compact']:<7d} {r['ms_full']:11.0f} "
              f"{r['ms_compact']:8.0f} {r['speedup']:6.2f}x {r['state_mb_full']:13.1f} {r['state_mb_compact']:8.1f} "
              f"{r['same_tokens']:11.4f} {r['tokens_per_forward_full']:12.2f} {r['tokens_per_forward_compact']:8.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
