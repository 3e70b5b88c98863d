"""The tensors a checkpoint holds: what each is (:class:`TensorSpec`: name, shape, initialisation, seed keys),
read from a transformers model on the meta device (:func:`specs_of`, :func:`meta_state`), and its values, drawn
from generators seeded by the run's seed and the tensor's seed keys in pieces of :data:`CHUNK` elements, so the
same tensor holds the same values however it is written (streamed or whole, in any layout)."""
from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from typing import Callable

import torch

CHUNK = 1 << 23  # elements drawn (and written) at a time: 16 MB of bfloat16
STD = 0.02


@dataclass
class TensorSpec:
    """One tensor of a file: its name and shape, how it is initialised (``normal``, ``ones``, ``zeros``), the
    seed keys its values are drawn from in order (one key: the whole tensor; several: equal parts along dim 0,
    e.g. a fused q|k|v), and a rearrangement applied to the whole tensor (only in torch pickles)."""

    name: str
    shape: tuple[int, ...]
    init: str = "normal"
    dtype: torch.dtype | None = None  # None: the run's dtype
    sources: tuple[str, ...] = ()
    rearrange: Callable[[torch.Tensor], torch.Tensor] | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def nbytes(self, dtype: torch.dtype) -> int:
        return self.numel * (self.dtype or dtype).itemsize


def init_of(name: str, shape) -> str:
    """Norm weights 1, biases 0, batch-norm statistics those of a fresh BatchNorm (mean 0, variance 1, count 0),
    the training statistic ``codebook_used`` 0, everything else normal."""
    if name.endswith((".bias", "codebook_used", "running_mean", "num_batches_tracked")):
        return "zeros"
    if name.endswith("running_var"):
        return "ones"
    leaf = name.rsplit(".", 2)
    if name.endswith(".weight") and ("norm" in leaf[-2] or "normalization" in leaf[-2]) and (
            len(shape) == 1 or re.search(r"[qk]_norm\.weight$", name)):
        return "ones"
    return "normal"


def std_of(name: str, shape) -> float:
    """:data:`STD` (transformers' ``initializer_range``) for embeddings and linear layers; convolution kernels
    ``1 / sqrt(fan_in)`` and VQ codebooks unit scale, so that the VQ decoders' activations keep their size
    (at 0.02 they vanish in Emu3's spatially-conditioned norms and every picture comes out flat grey)."""
    if name.endswith("quantize.embedding.weight"):
        return 1.0
    if len(shape) >= 3 and name.endswith(".weight"):
        return 1.0 / math.sqrt(math.prod(shape[1:]))
    return STD


def specs_of(state: dict[str, torch.Tensor]) -> list[TensorSpec]:
    """The tensors of a (meta-device) state dict; integer buffers (BatchNorm's ``num_batches_tracked``) keep
    their dtype, floating ones take the run's."""
    return [TensorSpec(k, tuple(v.shape), init_of(k, v.shape), dtype=None if v.is_floating_point() else v.dtype)
            for k, v in state.items()]


def meta_state(cls, config) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        model = cls(config)
    return model.state_dict()


def _generator(seed: int, key: str) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(key.encode())) & 0x7FFF_FFFF_FFFF_FFFF)


def _parts(spec: TensorSpec) -> list[tuple[str, int]]:
    keys = spec.sources or (spec.name,)
    return [(k, spec.numel // len(keys)) for k in keys]


def _draws(spec: TensorSpec, seed: int):
    """``(count, generator)`` per piece: each seed key's generator draws :data:`CHUNK`-sized pieces in order,
    so the values are the same however the pieces are gathered (streamed, or into one tensor)."""
    for key, n in _parts(spec):
        g = _generator(seed, key) if spec.init == "normal" else None
        for start in range(0, n, CHUNK):
            yield min(CHUNK, n - start), g


def _fill(view: torch.Tensor, spec: TensorSpec, g) -> None:
    if spec.init == "ones":
        view.fill_(1)
    elif spec.init == "zeros":
        view.zero_()
    else:
        view.normal_(0.0, std_of(spec.name, spec.shape), generator=g)


class Ring:
    """A few reusable chunk buffers per dtype, handed out in turn (and :class:`Arena` for whole tensors): with
    a fresh tensor for every piece or tensor, glibc's heap grew with the bytes written (sizes under its 32 MB
    mmap threshold are carved from the heap and, interleaved with small allocations, not all given back): a
    full-size Janus writer passed 4 GB.  ``size`` must exceed the buffers in flight (queued + being written +
    being filled)."""

    def __init__(self, size: int = 4):
        self.size, self.buffers, self.turn = size, {}, 0

    def next(self, dtype: torch.dtype, n: int) -> torch.Tensor:
        if dtype.itemsize > 4:  # int64 counters: a few elements, not worth 4 x 64 MB of buffers
            return torch.empty(n, dtype=dtype)
        if dtype not in self.buffers:
            self.buffers[dtype] = [torch.empty(CHUNK, dtype=dtype) for _ in range(self.size)]
        ring = self.buffers[dtype]
        self.turn = (self.turn + 1) % self.size
        return ring[self.turn][:n]


def chunks(spec: TensorSpec, dtype: torch.dtype, seed: int, ring: Ring | None = None):
    """The tensor's values, flat, in pieces of at most :data:`CHUNK` elements (drawn into ``ring``'s
    buffers when given: a piece is valid until ``ring.size - 1`` further pieces are drawn)."""
    dtype = spec.dtype or dtype
    for m, g in _draws(spec, seed):
        view = ring.next(dtype, m) if ring is not None else torch.empty(m, dtype=dtype)
        _fill(view, spec, g)
        yield view


class Arena:
    """One reusable byte buffer, grown to the largest request: whole tensors drawn into it one after another."""

    def __init__(self):
        self.buffer = torch.empty(0, dtype=torch.uint8)

    def take(self, nbytes: int) -> torch.Tensor:
        if self.buffer.numel() < nbytes:
            self.buffer = torch.empty(0, dtype=torch.uint8)  # the old one first
            self.buffer = torch.empty(nbytes, dtype=torch.uint8)
        return self.buffer[:nbytes]


def materialize(spec: TensorSpec, dtype: torch.dtype, seed: int, arena: Arena | None = None,
                scratch: Arena | None = None) -> torch.Tensor:
    """The whole tensor (for a torch pickle record), in ``arena``'s buffer when given (valid until the next
    call), rearranged through ``scratch``'s."""
    dtype = spec.dtype or dtype
    nbytes = spec.numel * dtype.itemsize
    flat = (arena.take(nbytes).view(dtype) if arena is not None else torch.empty(spec.numel, dtype=dtype))
    at = 0
    for m, g in _draws(spec, seed):
        _fill(flat[at:at + m], spec, g)
        at += m
    out = flat.view(spec.shape)
    if spec.rearrange is None:
        return out
    view = spec.rearrange(out)  # a view whose row-major order is the tensor to write
    dst = scratch.take(nbytes).view(dtype) if scratch is not None else torch.empty(spec.numel, dtype=dtype)
    dst.view(view.shape).copy_(view)
    return dst.view(spec.shape)
