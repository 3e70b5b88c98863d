"""Weight files written tensor by tensor: safetensors streamed in chunks (or as a header over a sparse hole),
torch archives as torch.save writes them (one tensor held at a time), and transformers' sharded layout with its
index."""
from __future__ import annotations

import collections
import contextvars
import json
import math
import os
import pathlib
import pickle
import queue
import struct
import sys
import threading
import time

import torch

from .stats import Stats, Written, peak_rss
from .tensors import Arena, Ring, TensorSpec, chunks, materialize

ST_DTYPE = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64"}
STORAGE = {torch.bfloat16: "BFloat16Storage", torch.float16: "HalfStorage", torch.float32: "FloatStorage",
           torch.int64: "LongStorage"}


def _release_cache(f) -> None:
    """Flush to disk and drop the file's pages from the page cache (other processes share the memory)."""
    f.flush()
    os.fsync(f.fileno())
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


class _BackgroundWriter:
    """Writes buffers to a file on a second thread (drawing and writing overlap), two pieces in flight at most."""

    IN_FLIGHT = 2  # queued pieces; one more is being written

    def __init__(self, f):
        self.f, self.q, self.error = f, queue.Queue(maxsize=self.IN_FLIGHT), None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            if self.error is None:
                try:
                    self.f.write(item)
                except BaseException as err:  # reported by close()
                    self.error = err

    def write(self, tensor: torch.Tensor):
        if self.error is not None:
            raise self.error
        self.q.put(tensor.contiguous().view(torch.uint8).numpy())

    def close(self):
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


def write_holes(path: pathlib.Path, shapes: dict[str, tuple[int, ...]], dtype: str = "BF16") -> int:
    """A safetensors file declaring ``shapes`` whose data is a sparse hole (every value zero): a model of
    any size on disk in no space, for what reads headers (detection, sizing) or redraws the values after
    loading.  Returns the bytes it declares."""
    itemsize = {"BF16": 2, "F16": 2, "F32": 4}[dtype]
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = itemsize * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    return offset


#: set by ``write(..., holes=True)``: safetensors weights written as headers over sparse holes (all zeros)
HOLES = contextvars.ContextVar("holes", default=False)


def write_safetensors(path: pathlib.Path, specs: list[TensorSpec], dtype: torch.dtype, seed: int,
                      metadata: dict | None = None) -> None:
    """A safetensors file written as a stream: 8-byte little-endian header length, the JSON header (names,
    dtypes, shapes, byte ranges; padded with spaces to 8 bytes), then each tensor's bytes in order."""
    header, offset = {"__metadata__": metadata or {"format": "pt"}}, 0
    for s in specs:
        if s.rearrange is not None:
            raise ValueError(f"{s.name}: a rearranged tensor cannot be streamed")
        n = s.nbytes(dtype)
        header[s.name] = {"dtype": ST_DTYPE[s.dtype or dtype], "shape": list(s.shape), "data_offsets": [offset,
                                                                                                         offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    if HOLES.get():  # the header, then a sparse hole: the file's size in no space, every value zero
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)
        return
    ring = Ring(_BackgroundWriter.IN_FLIGHT + 2)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        out = _BackgroundWriter(f)
        try:
            for s in specs:
                for piece in chunks(s, dtype, seed, ring):
                    out.write(piece)
        finally:
            out.close()
        _release_cache(f)


class _Storage:
    """Stands for a tensor's storage in the pickle (``persistent_id`` names it, as torch.save does)."""

    def __init__(self, key: str, dtype: torch.dtype, numel: int):
        self.key, self.dtype, self.numel = key, dtype, numel


class _Tensor:
    """Pickles as torch.save pickles a contiguous CPU tensor: ``_rebuild_tensor_v2(storage, 0, size, stride,
    False, OrderedDict())``."""

    def __init__(self, storage: _Storage, shape: tuple[int, ...]):
        self.storage, self.shape = storage, tuple(shape)

    def __reduce_ex__(self, protocol):
        stride, acc = [], 1
        for d in reversed(self.shape):
            stride.append(acc)
            acc *= d
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, self.shape, tuple(reversed(stride)), False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", getattr(torch, STORAGE[obj.dtype]), obj.key, "cpu", obj.numel)
        return None


def write_torch(path: pathlib.Path, tree, dtype: torch.dtype, seed: int) -> None:
    """A torch.save zip file of ``tree`` (dicts / lists with :class:`TensorSpec` leaves and plain values),
    written without holding more than one tensor: the pickle refers to storages by key, then each
    tensor is drawn and written as its own record."""
    import io

    specs: list[tuple[_Storage, TensorSpec]] = []

    def convert(node):
        if isinstance(node, TensorSpec):
            storage = _Storage(str(len(specs)), node.dtype or dtype, node.numel)
            specs.append((storage, node))
            return _Tensor(storage, node.shape)
        if isinstance(node, dict):
            return {k: convert(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(convert(v) for v in node)
        return node

    obj = convert(tree)
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(obj)  # torch.save's default protocol
    data = buf.getvalue()
    with torch.serialization._open_zipfile_writer(str(path)) as zf:  # what torch.save itself uses
        zf.write_record("data.pkl", data, len(data))
        zf.write_record(".format_version", "1", 1)
        alignment = getattr(torch.serialization, "_get_storage_alignment", None)
        if alignment is not None:
            text = str(alignment())
            zf.write_record(".storage_alignment", text, len(text))
        zf.write_record("byteorder", sys.byteorder, len(sys.byteorder))
        arena, scratch = Arena(), Arena()  # reused: one allocation of the largest tensor
        for storage, spec in specs:
            tensor = materialize(spec, dtype, seed, arena, scratch)
            at = tensor.storage_offset() * tensor.element_size()  # the arena's bytes that hold it: a view
            zf.write_record(f"data/{storage.key}", tensor.untyped_storage()[at:at + tensor.nbytes], tensor.nbytes)
            del tensor
    with open(path, "rb+") as f:
        _release_cache(f)


def shard(specs: list[TensorSpec], dtype: torch.dtype, max_bytes: float | None) -> list[list[TensorSpec]]:
    """save_pretrained's split: in order, a new shard when the next tensor would pass ``max_bytes``."""
    shards, size = [[]], 0
    for s in specs:
        n = s.nbytes(dtype)
        if max_bytes and shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += n
    return shards


def shard_names(count: int, kind: str, stem: str | None = None) -> tuple[list[str], str]:
    """The file names of ``count`` shards and their index's name: ``model-0000X-of-0000N.safetensors`` +
    ``model.safetensors.index.json`` (``kind`` "safetensors"; diffusers' ``stem`` "diffusion_pytorch_model") or
    ``pytorch_model-0000X-of-0000N.bin`` + ``pytorch_model.bin.index.json`` ("bin"); one shard: ``model.safetensors``
    (no index)."""
    default, suffix = ("model", "safetensors") if kind == "safetensors" else ("pytorch_model", "bin")
    stem = stem or default
    names = ([f"{stem}.{suffix}"] if count == 1 else
             [f"{stem}-{i + 1:05d}-of-{count:05d}.{suffix}" for i in range(count)])
    return names, f"{stem}.{suffix}.index.json"


def write_sharded(folder: pathlib.Path, specs: list[TensorSpec], dtype: torch.dtype, seed: int,
                  max_bytes: float | None, kind: str, stats: Stats, log=print,
                  stem: str | None = None) -> list[pathlib.Path]:
    """transformers' sharded layout (:func:`shard_names`; diffusers' with ``stem``
    "diffusion_pytorch_model"): the shards and their index; one file without an index when it fits one shard."""
    parts = shard(specs, dtype, max_bytes)
    names, index_name = shard_names(len(parts), kind, stem)
    weight_map, paths = {}, []
    for name, part in zip(names, parts):
        path = folder / name
        t = time.perf_counter()
        if kind == "safetensors":
            write_safetensors(path, part, dtype, seed)
        else:
            write_torch(path, {s.name: s for s in part}, dtype, seed)
        stats.add(path)
        paths.append(path)
        weight_map.update({s.name: name for s in part})
        log(f"  {name}: {len(part)} tensors, {path.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t:.1f} s, "
            f"peak RSS so far {peak_rss() / 2**30:.2f} GiB")
    if len(parts) > 1:
        index = folder / index_name
        total = sum(s.nbytes(dtype) for s in specs)
        index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        stats.add(index)
    return paths


def record_shards(result: Written, folder: pathlib.Path, specs: list[TensorSpec], dtype, max_bytes, kind: str,
                  stem: str | None = None):
    parts = shard(specs, dtype, max_bytes)
    names, _ = shard_names(len(parts), kind, stem)
    for name, part in zip(names, parts):
        result.expected[str(folder / name)] = {s.name: list(s.shape) for s in part}
