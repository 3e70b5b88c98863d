"""How a model's weights are held: a full-precision dtype, or the transformer's linear
layers quantized (8-bit or 4-bit, weight-only: every matmul runs in the compute dtype).

One declaration per option (:data:`STORAGES`), read by the command line, the loader
node, the sizing and the bench.  What is quantized: the ``nn.Linear`` layers inside the
transformer blocks of the language model (names with a ``layers.N.`` component), where
nearly all of a 7B model's bytes are; embeddings, output heads, norms, the text encoder
and the VQ decoder keep the compute dtype (a head's logits are what sampling reads).

The quantized formats, and why these (docs/benchmarks.md, "Weight storage"):

* ``int8``: per-output-channel symmetric int8 with a scale per row; on the CPU multiplied
  by torch's own int8 weight-only kernel (``torch._weight_int8pack_mm``, the kernel
  torchao's int8 weight-only layout calls there), on a GPU by the fastest of the kernels
  of :mod:`.lowbit` measured there (widened as gpt-fast does, the weight-only kernel, or
  int8 tensor cores through ``torch._int_mm``), within its tolerance.
* ``fp8``: float8 e4m3 with a scale per row (ComfyUI's "fp8 scaled" scheme), cast to the
  compute dtype per forward or, on GPUs with float8 tensor cores, through
  ``torch._scaled_mm`` where measured faster (:mod:`.lowbit`); slow on CPUs.
* ``nf4``: bitsandbytes' NormalFloat4 with double-quantised block scales (QLoRA),
  through its ``Linear4bit`` (CUDA and CPU kernels).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from ..sampling.config import ConfigError
from . import lowbit


@dataclass(frozen=True)
class Storage:
    name: str
    help: str
    dtype: torch.dtype | None = None  # a full-precision storage; None: quantized linear layers
    bits: float = 16.0  # bits per weight of a quantized layer, block scales included
    row_bytes: int = 0  # bytes per output row of a quantized layer (its scale)
    block: int = 1  # a layer is quantized only if its input width is a multiple of this (the scale blocks)
    rows: int = 1  # ... and its output rows a multiple of this
    library: str = "torch"
    requires: str = ""  # the package a quantized option imports

    @property
    def quantized(self) -> bool:
        return self.dtype is None


STORAGES: dict[str, Storage] = {s.name: s for s in (
    Storage("float32", "full precision (4 bytes per weight)", torch.float32, 32.0),
    Storage("bfloat16", "half precision, float32's range (2 bytes per weight): the releases' own", torch.bfloat16),
    Storage("float16", "half precision, narrow range (2 bytes per weight): may overflow on some models",
            torch.float16),
    Storage("int8", "transformer layers in int8 with a scale per row (about 1 byte per weight), computed in "
                    "bfloat16", bits=8.0, row_bytes=2),
    Storage("fp8", "transformer layers in float8 e4m3 with a scale per row (about 1 byte per weight), computed "
                   "in bfloat16; fast on GPUs with native float8 (RTX 40xx, H100), slow on CPUs",
            bits=8.0, row_bytes=2),
    Storage("nf4", "transformer layers in bitsandbytes' 4-bit NormalFloat (about 0.53 bytes per weight), "
                   "computed in bfloat16", bits=4.0 + 8.0 / 64 + 32.0 / (64 * 256), library="bitsandbytes",
            # bitsandbytes' CPU kernel (AVX512-BF16) repacks a weight 32 output rows at a time at its first
            # forward and fails on a remainder: such a layer (in no release; in narrow test models) stays unquantized
            requires="bitsandbytes", block=64, rows=32),
)}
AUTO_HELP = ("bfloat16 on GPUs (float16 where bfloat16 is missing), float32 on CPUs unless it takes more than half "
             "the free memory, then bfloat16; refused, naming what fits, when even that does not fit")
#: a linear layer of a transformer block: what quantized storage quantizes
BLOCK_LINEAR = re.compile(r"(^|\.)layers\.\d+\.")
#: submodules never quantized although their blocks are called layers (image encoders, VQ models)
NEVER = re.compile(r"(^|\.)(vision_model|vision_tower|vqmodel|vq|vqgan)(\.|$)")


def storage_of(name: str, option: str = "dtype") -> Storage:
    """The declared storage called ``name``, or one error naming ``option`` and the choices."""
    if name not in STORAGES:
        raise ConfigError(f"{option} must be one of {', '.join(map(repr, STORAGES))} (got {name!r})")
    return STORAGES[name]


def resolve(dtype) -> Storage:
    """A storage from what loaders are given: a :class:`Storage`, its name, or a torch dtype."""
    if isinstance(dtype, Storage):
        return dtype
    if isinstance(dtype, torch.dtype):
        return next(s for s in STORAGES.values() if s.dtype == dtype)
    return storage_of(dtype)


def full_dtype(dtype, device) -> torch.dtype:
    """The dtype of what is never quantized (decoders, text encoders, heads) under ``dtype``."""
    storage = resolve(dtype)
    return compute_dtype(device) if storage.quantized else storage.dtype


def compute_dtype(device) -> torch.dtype:
    """What quantized layers multiply in: bfloat16, or float16 on GPUs without bfloat16."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def check_available(storage: Storage, device) -> None:
    """Refuse, before any loading, a storage this machine cannot run, naming what works."""
    if not storage.requires:
        return
    try:
        import_bitsandbytes() if storage.requires == "bitsandbytes" else __import__(storage.requires)
    except ImportError:
        fine = ", ".join(n for n, s in STORAGES.items() if not s.requires)
        raise ConfigError(f"dtype {storage.name!r} needs the {storage.requires} package, which is not installed "
                          f"(pip install {storage.requires}); without it: {fine}") from None


ROWS_AT_A_TIME = 1024  # quantizing works in float32: 1024 rows of a 7B layer are 16-56 MB of temporaries


def rowwise(w: torch.Tensor, qmax: float, stored: torch.dtype, quantize) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` with a scale per row (its largest magnitude over ``qmax``): ``(quantize(rows / scale), scale)``,
    a block of rows at a time so the float32 temporaries stay small whatever the layer's size."""
    out = torch.empty(w.shape, dtype=stored, device=w.device)
    scale = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
    for i in range(0, w.shape[0], ROWS_AT_A_TIME):
        rows = w[i:i + ROWS_AT_A_TIME].to(torch.float32, copy=True)  # a float32 weight is left as it is
        s = rows.abs().amax(1).clamp_min(1e-12) / qmax
        out[i:i + ROWS_AT_A_TIME] = quantize(rows.div_(s[:, None]))
        scale[i:i + ROWS_AT_A_TIME] = s
    return out, scale


class Int8Linear(nn.Module):
    """``nn.Linear`` with int8 weights and a scale per output row."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype):
        super().__init__()
        weight, scale = rowwise(linear.weight.detach(), 127, torch.int8,
                                lambda rows: rows.round_().clamp_(-127, 127).to(torch.int8))
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale.to(dtype))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(dtype))
        self.in_features, self.out_features = linear.in_features, linear.out_features

    #: its matmul (``lowbit.KERNELS["int8"]``): chosen by measurement on a GPU, the device's default until then
    kernel: str | None = None

    def forward(self, x):
        y = lowbit.run("int8", self, x)
        return y if self.bias is None else y + self.bias


class Fp8Linear(nn.Module):
    """``nn.Linear`` with float8 e4m3 weights and a scale per output row.  The bytes
    are kept as uint8, so ``module.to(dtype)`` (which casts every floating tensor)
    leaves them alone."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype):
        super().__init__()
        weight, scale = rowwise(linear.weight.detach(), torch.finfo(torch.float8_e4m3fn).max, torch.uint8,
                                lambda rows: rows.to(torch.float8_e4m3fn).view(torch.uint8))
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale.to(dtype))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(dtype))
        self.in_features, self.out_features = linear.in_features, linear.out_features

    #: its matmul (``lowbit.KERNELS["fp8"]``): chosen by measurement on a GPU, the device's default until then
    kernel: str | None = None

    def forward(self, x):
        y = lowbit.run("fp8", self, x)
        return y if self.bias is None else y + self.bias


def import_bitsandbytes():
    """``bitsandbytes``, imported without its warning that an optional CPU kernel could not be
    fetched from the Hugging Face hub (its own CPU path is used instead; the pack never downloads)."""
    import logging

    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    import bitsandbytes

    return bitsandbytes


def _nf4(linear: nn.Linear, dtype: torch.dtype, device) -> nn.Module:
    bnb = import_bitsandbytes()

    layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                              compute_dtype=dtype, quant_type="nf4", compress_statistics=True, device="meta")
    layer.weight = bnb.nn.Params4bit(linear.weight.detach().to(dtype), requires_grad=False, quant_type="nf4",
                                     blocksize=64, compress_statistics=True)
    if linear.bias is not None:
        layer.bias = nn.Parameter(linear.bias.detach().to(dtype), requires_grad=False)
    return layer.to(device)  # Params4bit quantises on its way to a device


def quantized_layer(linear: nn.Linear, storage: Storage, dtype: torch.dtype, device) -> nn.Module:
    """``linear`` stored as ``storage``, on ``device``; the weight is moved there first
    (one layer at a time: a GPU never holds more than one layer in full precision)."""
    linear = linear.to(device)
    if storage.name == "nf4":
        return _nf4(linear, dtype, device)
    return {"int8": Int8Linear, "fp8": Fp8Linear}[storage.name](linear, dtype)


def quantizes(name: str, shape, storage: Storage) -> bool:
    """Whether ``storage`` quantizes the weight ``name`` of ``shape`` (a module's or a checkpoint's
    name): a 2D weight in a transformer block, not in an image model, with whole scale blocks and row blocks."""
    return (storage.quantized and len(shape) == 2 and shape[1] % storage.block == 0 and shape[0] % storage.rows == 0
            and bool(BLOCK_LINEAR.search(name)) and not NEVER.search(name))


def repeated_blocks(module: nn.Module) -> nn.ModuleList | None:
    """The transformer's blocks, which offload streams: the ``layers`` list outside any image
    model (the layers whose linears quantized storage replaces, :data:`BLOCK_LINEAR`), the
    largest if there are several."""
    best, size = None, 0
    for name, m in module.named_modules():
        if isinstance(m, nn.ModuleList) and name.rpartition(".")[2] == "layers" and not NEVER.search(name):
            n = sum(t.numel() for t in m.parameters())
            if n > size:
                best, size = m, n
    return best


def block_linears(module: nn.Module, storage: Storage) -> list[str]:
    """Qualified names of the linear layers ``storage`` quantizes in ``module``."""
    return [name for name, m in module.named_modules()
            if isinstance(m, nn.Linear) and quantizes(name + ".weight", m.weight.shape, storage)]


def checkpoint_ranges() -> list[tuple[int, int]]:
    """Address ranges of checkpoint files mapped into this process (weights loaded memory-mapped)."""
    from ..sampling.memory import CHECKPOINT_SUFFIXES

    try:
        lines = open("/proc/self/maps").read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].strip().endswith(CHECKPOINT_SUFFIXES):
            out.append(tuple(int(x, 16) for x in parts[0].split("-")))
    return out


def drop_pages(t: torch.Tensor, ranges: list[tuple[int, int]]) -> int:
    """Give back the resident pages of ``t`` if it lies in a mapped checkpoint file and
    is no longer needed (its quantized copy replaced it): ``madvise(MADV_DONTNEED)`` on
    the whole pages inside it, which a file mapping simply reads again if touched.
    Without it every layer read while quantizing stays resident until the whole file
    is unmapped, and loading peaks at the full-precision size.  Returns bytes given back."""
    import ctypes
    import mmap

    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    if t.device.type != "cpu" or not any(a <= start and end <= b for a, b in ranges):
        return 0  # anonymous memory: DONTNEED would zero it
    page = mmap.PAGESIZE
    lo, hi = -(-start // page) * page, end // page * page
    if hi <= lo:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return hi - lo if libc.madvise(lo, hi - lo, mmap.MADV_DONTNEED) == 0 else 0


@torch.no_grad()
def place(module: nn.Module, dtype, device) -> nn.Module:
    """``module`` on ``device`` stored as ``dtype`` (a storage, its name or a torch
    dtype): full precision converts it whole;
    with offload (``offload.ACTIVE``) the transformer's blocks stay in system memory and are
    streamed to ``device`` as they run (``offload.py``);
    quantized storage replaces each transformer-block linear layer in turn (quantised
    on ``device``), then moves the rest there in the compute dtype (``Module.to``
    casts floating tensors only, so the int8, float8-as-uint8 and 4-bit bytes stay)."""
    from . import offload

    storage = resolve(dtype)
    blocks = repeated_blocks(module) if offload.ACTIVE.get() else None
    if not storage.quantized:
        if blocks is None:
            return convert(module, storage.dtype, device)
        convert(blocks, storage.dtype, "cpu")  # streamed from system memory (offload.py)
        convert(module, storage.dtype, device, skip=blocks)
        offload.stream(module, blocks, device)
        return module
    check_available(storage, device)
    dtype = compute_dtype(device)
    mapped = checkpoint_ranges()
    for name in block_linears(module, storage):
        parent, _, child = name.rpartition(".")
        owner = module.get_submodule(parent) if parent else module
        linear = getattr(owner, child)
        layer = quantized_layer(linear, storage, dtype, "cpu" if blocks is not None else device)
        if storage.name in lowbit.KERNELS and blocks is None and device_type(device) == "cuda":
            layer.kernel = lowbit.choose(storage.name, layer)  # timed once per shape on this card
        setattr(owner, child, layer)
        if linear.weight.dtype == dtype or device_type(device) != "cpu":  # the file's own bytes, read as they are
            drop_pages(linear.weight, mapped)
        del linear
        trim_heap()  # each layer's temporaries, before the next layer's
    if blocks is None:
        return module.to(device=device, dtype=dtype)
    convert(blocks, dtype, "cpu")
    convert(module, dtype, device, skip=blocks)
    offload.stream(module, blocks, device)
    return module


def trim_heap() -> None:
    """Hand the heap's free memory back to the system (glibc keeps freed blocks, and the
    per-layer temporaries of quantizing would otherwise stay resident)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@torch.no_grad()
def convert(module: nn.Module, dtype: torch.dtype, device, skip: nn.Module | None = None) -> nn.Module:
    """``module.to(device, dtype)`` one tensor at a time, each source's mapped pages given
    back as it is replaced: a bfloat16 file read as float16 (or moved to a GPU) peaks at
    the new size plus one tensor, not both copies.  Tied tensors stay tied.  ``skip``: a
    submodule left where it is."""
    mapped, done = checkpoint_ranges(), {}
    target = torch.device(device)
    skipped = {id(m) for m in skip.modules()} if skip is not None else set()
    for m in module.modules():
        if id(m) in skipped:
            continue
        for table in (m._parameters, m._buffers):
            for key, t in list(table.items()):
                if t is None:
                    continue
                want = dtype if t.is_floating_point() else t.dtype
                if t.device == target and t.dtype == want:
                    continue
                if id(t) not in done:
                    new = t.detach().to(device=target, dtype=want)
                    done[id(t)] = nn.Parameter(new, requires_grad=t.requires_grad) if table is m._parameters else new
                    drop_pages(t, mapped)
                table[key] = done[id(t)]
    return module


def device_type(device) -> str:
    return torch.device(device).type


def stored_bytes(module: nn.Module) -> int:
    """Bytes the parameters and buffers of ``module`` occupy as stored (quantized ones included)."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        key = (t.data_ptr(), t.numel()) if t.device.type != "meta" else id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
        state = getattr(t, "quant_state", None)  # bitsandbytes' block scales
        if state is not None:
            for s in (state.absmax, getattr(state, "state2", None) and state.state2.absmax):
                if isinstance(s, torch.Tensor):
                    total += s.numel() * s.element_size()
    return total


def weight_bytes(module: nn.Module, dtype) -> int:
    """Bytes ``module`` will take once placed with ``storage``, read from its shapes alone
    (it may still be on the meta device): what sizing counts before loading."""
    storage = resolve(dtype)
    quantized = set(block_linears(module, storage))
    full = 2 if storage.quantized else torch.finfo(storage.dtype).bits // 8
    total, seen = 0.0, set()
    for name, m in module.named_modules():
        for key, t in list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False)):
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            if name in quantized and key == "weight":
                total += t.numel() * storage.bits / 8 + t.shape[0] * storage.row_bytes
            else:
                total += t.numel() * (full if t.is_floating_point() else t.element_size())
    return int(total)


# -- sizing before loading --------------------------------------------------------------
def checkpoint_files(path) -> list:
    """The weight files a model at ``path`` loads: the file itself (a weight file) or the weights beside it
    (another file: Meta's ``vqgan.yaml`` given for its ``vqgan.ckpt``), or a folder's transformers weights
    (safetensors or .bin, not both) or else its checkpoint files, plus those one folder down (Meta's
    ``tokenizer/vqgan.ckpt``)."""
    import pathlib

    from ..formats.checkpoints import weight_files
    from ..sampling.memory import CHECKPOINT_SUFFIXES

    path = pathlib.Path(path)
    if path.is_file():  # a weight file, or a file beside its weights (Meta's vqgan.yaml given for its .ckpt)
        return [path] if path.suffix in CHECKPOINT_SUFFIXES else sorted(
            p for p in path.parent.iterdir() if p.is_file() and p.suffix in CHECKPOINT_SUFFIXES)
    if not path.is_dir():
        return []
    top = weight_files(path) or sorted(p for p in path.iterdir() if p.is_file() and p.suffix in CHECKPOINT_SUFFIXES)
    below = sorted(p for sub in path.iterdir() if sub.is_dir() and not (sub / "config.json").is_file()
                   for p in sub.iterdir() if p.is_file() and p.suffix in CHECKPOINT_SUFFIXES)  # not a model of its own
    return top + below


def stored_tensor_bytes(name: str, shape, storage: Storage, full_bytes: int) -> float:
    """Bytes checkpoint tensor ``name`` of ``shape`` takes stored by ``storage`` (``full_bytes`` per element
    where it stays in full precision)."""
    n = 1
    for d in shape:
        n *= d
    if quantizes(name, shape, storage):
        return n * storage.bits / 8 + shape[0] * storage.row_bytes
    return n * full_bytes


def file_weight_bytes(files, dtype, device="cpu", keep=None) -> int:
    """Bytes the tensors in ``files`` take once loaded as ``dtype`` (read from the
    files' headers: safetensors headers, or pickles memory-mapped); ``keep(name)``: only
    the tensors it accepts (those a loader reads)."""
    from ..formats.checkpoints import peek

    storage = resolve(dtype)
    full = full_dtype(storage, device).itemsize
    return int(sum(stored_tensor_bytes(name, shape, storage, full) for f in files for name, shape in peek(f).items()
                   if keep is None or keep(name)))
