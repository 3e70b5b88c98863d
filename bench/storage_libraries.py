"""The quantization libraries compared on one linear layer of a 7B model.

    python -m spec_ar.bench.storage_libraries [--device cpu] [--rows 1 24] [--repeats 5]

For a 4096 -> 11008 projection (an MLP layer of Llama-7B-shaped models: Janus-Pro-7B,
Lumina-mGPT-7B, Anole-7B) with random weights (std 0.02), each weight-only format
the pack could use, from whichever library is installed: its bytes per weight, the
relative error of its output against bfloat16's, and milliseconds per call at 1 and
24 input rows (a window of 24 draft tokens), median of ``--repeats``.  Formats from
libraries that are not installed, or that fail on this device, are listed as such.
This is the measurement behind the pack's choice (docs/benchmarks.md, "Weight storage").
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


def _ours(name):
    def make(w):
        from ..loaders.storage import STORAGES, quantized_layer

        lin = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
        lin.weight.data = w
        return quantized_layer(lin, STORAGES[name], w.dtype, w.device)
    return make


def _torchao(config_name, **kw):
    def make(w):
        import torchao.quantization as q

        lin = nn.Sequential(nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype))
        lin[0].weight.data = w
        q.quantize_(lin, getattr(q, config_name)(**kw))
        return lin
    return make


def _torchao_nf4(w):
    from torchao.quantization import to_nf4

    n = to_nf4(w, block_size=64, scaler_block_size=256)
    return lambda x: F.linear(x, n)


def _bnb(kind):
    def make(w):
        import bitsandbytes as bnb

        if kind == "int8":
            lin = bnb.nn.Linear8bitLt(w.shape[1], w.shape[0], bias=False, has_fp16_weights=False)
            lin.weight = bnb.nn.Int8Params(w.cpu(), requires_grad=False, has_fp16_weights=False)
        else:
            lin = bnb.nn.Linear4bit(w.shape[1], w.shape[0], bias=False, compute_dtype=w.dtype, quant_type=kind)
            lin.weight = bnb.nn.Params4bit(w.cpu(), requires_grad=False, quant_type=kind, blocksize=64)
        return lin.to(w.device)
    return make


CANDIDATES = {  # label: (library, builder)
    "int8 (pack: torch int8 weight-only kernel)": ("torch", _ours("int8")),
    "fp8 e4m3 (pack: scaled cast, as ComfyUI)": ("torch", _ours("fp8")),
    "nf4 (pack: bitsandbytes Linear4bit)": ("bitsandbytes", _ours("nf4")),
    "torchao Int8WeightOnlyConfig": ("torchao", _torchao("Int8WeightOnlyConfig")),
    "torchao Float8WeightOnlyConfig": ("torchao", _torchao("Float8WeightOnlyConfig")),
    "torchao NF4Tensor": ("torchao", _torchao_nf4),
    "bitsandbytes LLM.int8 (Linear8bitLt)": ("bitsandbytes", _bnb("int8")),
    "bitsandbytes fp4 (Linear4bit)": ("bitsandbytes", _bnb("fp4")),
}


def _bytes(t: torch.Tensor) -> int:
    """A tensor's stored bytes; a tensor subclass (torchao's) by its inner tensors."""
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(_bytes(getattr(t, n)) for n in names)
    total = t.numel() * t.element_size()
    state = getattr(t, "quant_state", None)  # bitsandbytes' block scales
    if state is not None:
        total += sum(s.numel() * s.element_size() for s in (state.absmax, getattr(getattr(state, "state2", None),
                                                                                  "absmax", None))
                     if isinstance(s, torch.Tensor))
    return total


def stored_bits(layer, numel: int) -> float | None:
    if isinstance(layer, nn.Module):
        tensors = list(layer.parameters()) + [b for b in layer.buffers() if b is not None]
    else:  # a closure over an NF4Tensor
        tensors = [c.cell_contents for c in (layer.__closure__ or ()) if isinstance(c.cell_contents, torch.Tensor)]
    return 8 * sum(_bytes(t) for t in tensors) / numel if tensors else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_ar.bench.storage_libraries", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 24])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shape", type=int, nargs=2, default=[11008, 4096], metavar=("OUT", "IN"))
    args = ap.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(*args.shape, generator=gen) * 0.02).to(torch.bfloat16).to(args.device)
    xs = {r: torch.randn(r, args.shape[1], generator=gen).to(torch.bfloat16).to(args.device) for r in args.rows}

    def timed(f, x):
        f(x)
        times = []
        for _ in range(args.repeats):
            if x.is_cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            y = f(x)
            if x.is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return y, statistics.median(times) * 1000

    print(f"{args.shape[1]} -> {args.shape[0]} on {args.device}, torch {torch.__version__}")
    print("| format | library | bits/weight | rel. error | " + " | ".join(f"ms at {r} rows" for r in args.rows) + " |")
    print("|---|---|---|---|" + "---|" * len(args.rows))
    ref_layer = lambda x: F.linear(x, w)  # noqa: E731
    exact = {r: F.linear(xs[r].float(), w.float()) for r in args.rows}
    rows = [("bfloat16 (reference)", "torch", ref_layer)] + [(k, lib, make) for k, (lib, make) in CANDIDATES.items()]
    for label, lib, make in rows:
        try:
            layer = make if label.startswith("bfloat16") else make(w.clone())
            with torch.no_grad():
                results = {r: timed(layer, xs[r]) for r in args.rows}
        except Exception as err:  # not installed, or no path on this device
            print(f"| {label} | {lib} | - | {type(err).__name__}: {str(err).splitlines()[0][:80]} |")
            continue
        r0 = args.rows[-1]
        y = results[r0][0].float()
        rel = float((y - exact[r0]).norm() / exact[r0].norm())
        bits = 16.0 if label.startswith("bfloat16") else stored_bits(layer, w.numel())
        print(f"| {label} | {lib} | {'?' if bits is None else f'{bits:.2f}'} | {rel:.4f} | "
              + " | ".join(f"{results[r][1]:.2f}" for r in args.rows) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
