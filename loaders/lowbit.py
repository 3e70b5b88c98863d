"""The matmuls of a quantized linear layer (``storage.Int8Linear``, ``storage.Fp8Linear``: weights ``[out, in]``
in int8 or float8 e4m3 with a scale per output row), and the choice among them by measurement on the device.

Each kernel computes ``x @ (weight * scale).T`` for activations ``x`` ``[..., in]`` in the compute dtype:

* ``widen``: the weight widened to the compute dtype, ``F.linear``, times the scales (gpt-fast's int8; any device;
  the reference the others are held to);
* ``int8pack`` (int8): ``torch._weight_int8pack_mm``, torch's int8 weight-only kernel (the CPU's path);
* ``int_mm`` (int8): the activations quantized per row to int8 as well (dynamic, symmetric), ``torch._int_mm``
  into int32, then both scales: the int8 tensor cores' path (W8A8);
* ``scaled_mm`` (fp8): the activations quantized per row to e4m3, ``torch._scaled_mm`` with row-wise scales into
  the compute dtype: the float8 tensor cores' path (W8A8; cards with native float8).

The W8A8 kernels round the activations too: :data:`TOLERANCE` bounds how far a kernel may be from ``widen``
(relative Frobenius error), about the error the weights' own rounding already makes, and a kernel past it is
never chosen.  :func:`choose` times the kernels that run on the device at a one-token and a window-sized input
and keeps the fastest within tolerance, once per device and layer shape; on the CPU the layers keep their
default (:data:`DEFAULT`: unchanged from before).
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max
#: how far from ``widen`` a kernel may be (relative Frobenius error): about the weights' own rounding error
TOLERANCE = {"int8": 0.02, "fp8": 0.08}
#: the kernel a layer uses until one is chosen for it, by device type
DEFAULT = {("int8", "cpu"): "int8pack", ("int8", "cuda"): "widen", ("fp8", "cpu"): "widen", ("fp8", "cuda"): "widen"}
#: input rows a choice is timed at: one token with guidance, a 24-token window with guidance
ROWS = (2, 48)
_CHOSEN: dict[tuple, str] = {}


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _padded(x2: torch.Tensor, multiple: int, least: int = 0) -> torch.Tensor:
    """Zero rows added up to a multiple of ``multiple`` rows (and at least ``least``): what the tensor-core
    kernels' shape rules ask on CUDA; the extra rows' outputs are dropped."""
    want = max(least, -(-x2.shape[0] // multiple) * multiple)
    return x2 if want == x2.shape[0] else torch.cat([x2, x2.new_zeros(want - x2.shape[0], x2.shape[1])])


def widen_int8(x, layer):
    return F.linear(x, layer.weight.to(x.dtype)) * layer.scale


def int8pack(x, layer):
    return torch._weight_int8pack_mm(_rows(x), layer.weight, layer.scale).view(*x.shape[:-1], -1)


def int_mm(x, layer):
    x2 = _rows(x)
    cuda = x.device.type == "cuda"
    s = x2.float().abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
    q = (x2.float() / s).round_().clamp_(-127, 127).to(torch.int8)
    q = _padded(q, 8, 17) if cuda else q  # cuBLASLt's int8 GEMM: more than 16 rows, a multiple of 8
    y = torch._int_mm(q, layer.weight.t())[: x2.shape[0]]
    return (y.float() * s * layer.scale.float()).to(x.dtype).view(*x.shape[:-1], -1)


def widen_fp8(x, layer):
    return F.linear(x, layer.weight.view(E4M3).to(x.dtype)) * layer.scale


def scaled_mm(x, layer):
    x2 = _rows(x)
    s = x2.float().abs().amax(1, keepdim=True).clamp_min(1e-12) / E4M3_MAX
    q = (x2.float() / s).to(E4M3)
    if x.device.type == "cuda":
        q, s = _padded(q, 16), _padded(s, 16)
        s[x2.shape[0]:] = 1  # scales of the padding rows: any finite value
    y = torch._scaled_mm(q, layer.weight.view(E4M3).t(), scale_a=s, scale_b=layer.scale.float().view(1, -1),
                         out_dtype=x.dtype)[: x2.shape[0]]
    return y.view(*x.shape[:-1], -1)


KERNELS = {"int8": {"widen": widen_int8, "int8pack": int8pack, "int_mm": int_mm},
           "fp8": {"widen": widen_fp8, "scaled_mm": scaled_mm}}


def run(kind: str, layer, x: torch.Tensor) -> torch.Tensor:
    """``layer``'s matmul of ``x`` by its kernel (``layer.kernel``; :data:`DEFAULT` until one is chosen)."""
    name = layer.kernel or DEFAULT[kind, x.device.type if x.device.type in ("cpu", "cuda") else "cuda"]
    return KERNELS[kind][name](x, layer)


def error(y: torch.Tensor, reference: torch.Tensor) -> float:
    """Relative Frobenius distance of ``y`` from ``reference``."""
    return float((y.float() - reference.float()).norm() / reference.float().norm().clamp_min(1e-12))


def _time(name: str, fn, device, repeats: int) -> float:
    """Median seconds of ``fn()`` (kernel ``name``) on ``device`` (CUDA events there)."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


@torch.no_grad()
def measure(kind: str, layer, rows=ROWS, repeats: int = 10, timer=None) -> list[dict]:
    """Every kernel of ``kind`` on ``layer``'s device: ``{"kernel", "error", "seconds" (summed over ``rows``),
    "runs"}``; a kernel the device lacks (it raises) has ``runs`` False.  ``timer(name, fn, device, repeats)``:
    another clock (tests)."""
    timer = timer or _time
    device = layer.weight.device
    dtype = layer.scale.dtype
    g = torch.Generator(device="cpu").manual_seed(0)
    inputs = [torch.randn(n, layer.in_features, generator=g).to(device, dtype) for n in rows]
    references = [KERNELS[kind]["widen"](x, layer) for x in inputs]
    out = []
    for name, kernel in KERNELS[kind].items():
        try:
            err = max(error(kernel(x, layer), ref) for x, ref in zip(inputs, references))
            seconds = sum(timer(name, lambda x=x: kernel(x, layer), device, repeats) for x in inputs)
            out.append({"kernel": name, "error": err, "seconds": seconds, "runs": True})
        except (RuntimeError, NotImplementedError) as err:  # not on this device / dtype / shape
            out.append({"kernel": name, "error": None, "seconds": None, "runs": False,
                        "why": str(err).splitlines()[0][:200]})
    return out


def choose(kind: str, layer, rows=ROWS, timer=None) -> str:
    """The fastest kernel within :data:`TOLERANCE` for ``layer``'s shape on its device (measured once per device
    and shape, then remembered)."""
    device = layer.weight.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    key = (name, kind, layer.in_features, layer.out_features, str(layer.scale.dtype))
    if key not in _CHOSEN:
        fine = [m for m in measure(kind, layer, rows, timer=timer) if m["runs"] and m["error"] <= TOLERANCE[kind]]
        _CHOSEN[key] = min(fine, key=lambda m: m["seconds"])["kernel"]
    return _CHOSEN[key]
