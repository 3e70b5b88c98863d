"""Engine overhead: time outside model forwards, per mode, on synthetic models.

    spec-ar bench overhead [--batch 1 8] [--sizes small large] [--device cpu]     (make bench)

The synthetic model (loaders/synthetic.py) has the vocabulary of LlamaGen
(16384 codes, a 16x16 grid at 256 px); ``--sizes`` picks its cost: ``small``
(hidden 256, 2 layers: a window forward of ~4 ms at batch 1 on a 2-core CPU) and
``large`` (hidden 768, 12 layers: ~18 ms).  Each window forward is timed and
printed so the share can be read against it.  Modes take turns run by run
(``--repeats`` runs each, seeds 0, 100, ...); figures are medians over the runs.
Decoding uses LlamaGen's t2i sampling defaults (CFG 7.5, top-k 1000) and a
window of 16; ``sjd-none`` / ``sjd-maximal`` / ``sjd-gumbel`` isolate what
coupled drafting costs per step.  Also prints the LANTERN table memory for a
16384-token codebook.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from ..loaders.synthetic import SyntheticAdapter
from ..sampling import DecodeConfig, SpeculativeDecoder
from ..sampling.neighbours import TokenGeometry

SIZES = {"small": (256, 2), "large": (768, 12)}  # (hidden, layers)
MODES = {
    "ar": dict(mode="ar"),
    "sjd": dict(mode="sjd"),
    # the cost of coupling itself: the same window and init, drafts redrawn three ways
    "sjd-none": dict(mode="sjd", init="random", draft_coupling="none"),
    "sjd-maximal": dict(mode="sjd", init="random", draft_coupling="maximal"),
    "sjd-gumbel": dict(mode="sjd", init="random", draft_coupling="gumbel"),
    "gsd": dict(mode="gsd", group_size=10),
    "lantern": dict(mode="lantern"),
    "vvs": dict(mode="vvs"),
    "vvs-similarity": dict(mode="vvs", schedule="similarity"),
}


def forward_ms(model, batch, window, device):
    model.prefill([0] * batch, None, True)
    tokens = torch.zeros(batch, window + 1, dtype=torch.long, device=device)
    times = []
    for _ in range(7):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        model.forward(tokens)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        model.rollback([window + 1] * batch)
    model.release()
    return statistics.median(times) * 1000


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spec-ar bench overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--modes", nargs="+", default=list(MODES))
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    print(f"device {device} ({dtype}), torch {torch.__version__}, threads {torch.get_num_threads()}")
    for size in args.sizes:
        hidden, layers = SIZES[size]
        model = SyntheticAdapter(codebook=16384, rows=16, cols=16, hidden=hidden, layers=layers,
                                 sharpness=12.0, device=device, dtype=dtype)
        for batch in args.batch:
            report(model, size, batch, args, device)
    geo = TokenGeometry(torch.arange(16384), torch.randn(16384, 8), 16384, torch.device("cpu"))
    t = time.perf_counter()
    for k in (300, 1000):
        geo.neighbours(k)
        print(f"\nLANTERN neighbour table, 16384 codes, k={k}: {geo.nbytes() / 2**20:.1f} MiB "
              f"(built in {time.perf_counter() - t:.1f} s)")
        t = time.perf_counter()
    print("GSD: no table; distances for the d filter come from the codebook vectors "
          f"({16384 * 8 * 4 / 2**20:.2f} MiB for 16384 x 8 float32)")
    return 0


def report(model, size, batch, args, device):
    fwd = forward_ms(model, batch, args.window, device)
    print(f"\n{size} model, batch {batch}: one window forward ({args.window + 1} tokens, CFG) = {fwd:.2f} ms")
    print(f"{'mode':16} {'NFE':>6} {'tok/fwd':>8} {'latency ms':>11} {'model ms':>9} {'engine ms':>10} "
          f"{'engine/step ms':>15} {'engine share':>13}")
    decoders = {name: SpeculativeDecoder(model, DecodeConfig(window=args.window, cfg_scale=7.5, top_k=1000,
                                                             **MODES[name])) for name in args.modes}
    runs = {name: [] for name in args.modes}
    for r in range(args.repeats):  # modes take turns run by run, so drifts of a noisy machine hit all alike
        for name, dec in decoders.items():
            runs[name].append(dec.generate(list(range(batch)), seeds=100 * r).reports[0])
    for name, reps in runs.items():
        med = lambda f: statistics.median(f(rep) for rep in reps)  # noqa: E731
        nfe = statistics.mean(rep.nfe for rep in reps)
        engine = med(lambda rep: rep.engine_time_s * 1e3)
        print(f"{name:16} {nfe:6.1f} {statistics.mean(rep.tokens_per_forward for rep in reps):8.2f} "
              f"{med(lambda rep: rep.latency_s * 1e3):11.1f} {med(lambda rep: rep.model_time_s * 1e3):9.1f} "
              f"{engine:10.1f} {med(lambda rep: rep.engine_time_s * 1e3 / len(rep.step_kinds)):15.2f} "
              f"{med(lambda rep: rep.engine_time_s / rep.latency_s):13.1%}")
