"""Compile time of the compiled decode path against depth: its blocks compiled regionally, and
the whole forward compiled (as the path did before).

    python -m spec_ar.bench.compile_time [--depths 2 8 24] [--dim 128] [--backend inductor]
        [--device cpu] [--out FILE.json]

For each depth a LlamaGen-shaped GPT of ``--dim`` width and that many blocks (random weights, a
vocabulary of 1024) is loaded twice, and one window forward (8 tokens, batch 2 with guidance) is
timed from cold: the compile and the run.  ``regional`` is the compiled path as it is
(``loaders/static_cache.py``: each block through one shared compile); ``whole`` compiles the
window forward in one piece.  Then a forward of another width (5 tokens) shows whether the compile
serves it.  Inductor's caches are off, so every compile is a real one; each run starts with a
fresh dynamo state, after a warm-up compile of a small function (the backend's one-time start).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time
import warnings

import torch

HOW = ("regional", "whole")


def model_of(depth: int, dim: int, folder: pathlib.Path, device: str):
    from .gpu import load
    from .scale_checkpoints.llamagen import llamagen_shapes
    from .scale_checkpoints.weight_files import write_holes

    path = folder / f"c2i_{dim}x{depth}.safetensors"
    if not path.exists():
        write_holes(path, llamagen_shapes(dim, depth, 3 * dim, vocab=1024, classes=10))
    return load(path, device, "float32")


def first_forwards(depth: int, dim: int, how: str, backend: str, folder: pathlib.Path, device: str) -> dict:
    model = model_of(depth, dim, folder, device)
    ad = model.adapter
    torch._dynamo.reset()
    stats = torch._dynamo.utils.counters["stats"]
    before = stats["unique_graphs"]
    if how == "regional":
        ad.decode_path = "compiled"
    else:  # the window forward compiled in one piece, on the static path
        ad.decode_path = "static"
        ad._static_window = torch.compile(ad._static_window, dynamic=True, backend=backend)
    ad.prefill([0, 1], None, True)
    times = []
    for width in (8, 5):
        tokens = torch.zeros(2, width, dtype=torch.long, device=device)
        start = time.perf_counter()
        ad.forward(tokens)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        ad.rollback([width] * 2)
    ad.release()
    graphs = stats["unique_graphs"] - before
    torch._dynamo.reset()
    return {"depth": depth, "dim": dim, "how": how, "first_forward_s": times[0], "other_width_s": times[1],
            "graphs": graphs}


def main(argv=None) -> int:
    from ..loaders import static_cache

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", type=int, nargs="+", default=[2, 8, 24])
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args(argv)
    backend, static_cache.COMPILE_BACKEND = static_cache.COMPILE_BACKEND, args.backend
    try:
        return run(args)
    finally:
        static_cache.COMPILE_BACKEND = backend


def run(args) -> int:
    print(f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} threads, backend {args.backend}, "
          f"width {args.dim}; inductor caches off")
    print(f"{'depth':>5} {'compile':>9} {'first forward s':>16} {'other width s':>14} {'graphs':>7}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch._inductor.config.patch(force_disable_caches=True), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*force_disable_caches")
        # the backend's one-time start (imports, toolchain checks) stays out of the first figure
        torch.compile(lambda x: (x * 2).sin(), backend=args.backend)(torch.ones(4, device=args.device))
        torch._dynamo.reset()
        for depth in args.depths:
            for how in HOW:
                row = first_forwards(depth, args.dim, how, args.backend, pathlib.Path(tmp), args.device)
                rows.append(row)
                print(f"{depth:5d} {how:>9} {row['first_forward_s']:16.1f} {row['other_width_s']:14.2f} "
                      f"{row['graphs']:7d}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"torch": torch.__version__, "device": args.device, "backend": args.backend,
                                        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
