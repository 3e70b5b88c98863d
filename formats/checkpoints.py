"""Reading checkpoint files safely: safetensors, or torch pickles with ``weights_only``.

Every way a file can be wrong (not a checkpoint, truncated, a pickle that would
run code, tensors of the wrong shape, a ``config.json`` that is no JSON object)
becomes one :class:`CheckpointError` naming the file and what to do.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
from typing import Iterable

import torch

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


class CheckpointError(ValueError):
    """A file that is not a checkpoint of the expected kind."""


def load_file(path: str | pathlib.Path, mmap: bool = True) -> dict:
    """The object stored in ``path``: a safetensors dict, or a torch pickle read with
    ``weights_only=True``.  Training checkpoints of some families carry their
    ``argparse.Namespace`` of arguments; that plain container is allowed, nothing
    else beyond what ``weights_only`` admits.  ``mmap=False`` reads a pickle whole
    (for a file that is written again while its tensors are in use)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file as load_safetensors

        with _safetensors_errors(path):
            return load_safetensors(str(path))
    if path.suffix not in TORCH_SUFFIXES:
        kinds = ", ".join(TORCH_SUFFIXES)
        raise CheckpointError(f"{path}: expected a .safetensors file or a torch checkpoint ({kinds})")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
            except RuntimeError as err:  # mmap needs the zip format; older files are read whole
                if "mmap" not in str(err):
                    raise
                return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # an unpicklable, unsafe or corrupt file
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if refused_pickle(err):
            raise refusal(path, err) from None  # torch's own text advises weights_only=False: never relayed
        raise CheckpointError(f"{path}: cannot be read as a weights-only checkpoint ({first}); the file may be "
                              "truncated or damaged: download it again") from None


def refused_pickle(err: BaseException) -> bool:
    """Whether ``err`` is torch's weights-only unpickler refusing an object (from any caller, transformers too)."""
    text = str(err)
    return "Weights only load failed" in text or "Unsupported global" in text or "weights_only" in text


def refusal(path, err: BaseException | None = None) -> CheckpointError:
    """The pack's one message for a pickle that holds more than tensors."""
    found = re.search(r"Unsupported global: (?:GLOBAL )?(\S+)", str(err or ""))
    what = f" ({found.group(1)})" if found else ""
    return CheckpointError(f"{path}: refused: it pickles a non-tensor object{what} and checkpoints are only read "
                           "weights-only (plain tensors); if you trust the file, re-save just its tensors, e.g. "
                           "torch.save({'state_dict': ckpt['state_dict']}, path), or use its .safetensors release")


class _safetensors_errors:
    """``with _safetensors_errors(path):`` turns safetensors' errors into one that names the file."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if err is None or isinstance(err, CheckpointError) or not isinstance(err, Exception):
            return False
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{self.path}: not a valid .safetensors file ({detail}); it is truncated or damaged, "
                              "or not a checkpoint: download it again") from None


def read_json(path: str | pathlib.Path) -> dict:
    """The JSON object in ``path`` (a ``config.json``); one error naming the file otherwise."""
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: not UTF-8 text, so not a JSON configuration") from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({err.strerror or err})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    if not isinstance(obj, dict):
        kind = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
            type(obj), "null")
        raise CheckpointError(f"{path}: expected a JSON object ({{...}}) of settings, found {kind}")
    return obj


def load_weights(module: torch.nn.Module, sd: dict[str, torch.Tensor], source, what: str,
                 ignore: tuple[str, ...] = ()) -> None:
    """``module.load_state_dict(sd)`` after checking every name and shape, so a
    damaged file or another model's weights is one error naming the first
    difference (torch's own message lists them all, without the file)."""
    want = {k: tuple(v.shape) for k, v in module.state_dict().items() if not k.startswith(ignore)}
    have = {k: tuple(v.shape) for k, v in sd.items() if not k.startswith(ignore)}
    bad = next((k for k in want if k in have and want[k] != have[k]), None)
    if bad is not None:
        raise CheckpointError(f"{source}: tensor {bad!r} has shape {list(have[bad])} where {what} needs "
                              f"{list(want[bad])}: the file is damaged or holds another model's weights")
    missing, unexpected = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    if missing or unexpected:
        raise CheckpointError(f"{source}: the weights do not fit {what}: missing {missing[:4]}"
                              f"{' ...' if len(missing) > 4 else ''}, unexpected {unexpected[:4]}"
                              f"{' ...' if len(unexpected) > 4 else ''}")
    module.load_state_dict({k: v for k, v in sd.items() if not k.startswith(ignore)}, strict=not ignore)


def state_dict(obj, wrappers: Iterable[str] = ("model", "module", "state_dict", "ema")) -> dict[str, torch.Tensor]:
    """Unwrap the first wrapper key that holds tensors; otherwise ``obj`` itself."""
    if isinstance(obj, dict):
        for key in wrappers:
            inner = obj.get(key)
            if isinstance(inner, dict) and any(isinstance(v, torch.Tensor) for v in inner.values()):
                return inner
        return {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    raise CheckpointError(f"expected a dict of tensors, found {type(obj).__name__}")


def peek(path: str | pathlib.Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a checkpoint file, without loading safetensors data."""
    path = pathlib.Path(path)
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with _safetensors_errors(path), safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    return {k: tuple(v.shape) for k, v in state_dict(load_file(path)).items()}


WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def weight_files(folder: pathlib.Path) -> list[pathlib.Path]:
    """A transformers folder's weight files: the shards its index names, else its
    safetensors files, else its ``pytorch_model*.bin``."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            shards = read_json(folder / index).get("weight_map") or {}
            return [folder / name for name in sorted(set(shards.values()))]
    return sorted(folder.glob(WEIGHT_PATTERNS[0])) or sorted(folder.glob(WEIGHT_PATTERNS[1]))


def dtype_kwarg(dtype: torch.dtype) -> dict:
    """``from_pretrained``'s dtype argument: ``torch_dtype`` before transformers 4.56, ``dtype`` since."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": dtype}


def from_pretrained(cls, folder: str | pathlib.Path, what: str, dtype: torch.dtype | None = None, **kwargs):
    """``cls.from_pretrained(folder)`` offline (in ``dtype`` if given), with every
    failure one error naming the folder: no weights, a truncated or refused weight
    file, or weights that do not fit the configuration."""
    folder = pathlib.Path(folder)
    if dtype is not None:
        kwargs.update(dtype_kwarg(dtype))
    files = weight_files(folder)
    if not files:
        raise CheckpointError(f"{folder}: no weights (model*.safetensors or pytorch_model*.bin) beside its "
                              "config.json: the download is incomplete")
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f}: missing (the folder's weight index names it): the download is incomplete")
        if f.suffix == ".safetensors":
            peek(f)  # a damaged header is named here, with the file
    return hf_call(lambda: cls.from_pretrained(str(folder), local_files_only=True, **kwargs), folder, what, files)


def tokenizer_from_pretrained(folder: str | pathlib.Path, what: str = "its tokenizer"):
    from transformers import AutoTokenizer

    return hf_call(lambda: AutoTokenizer.from_pretrained(str(folder), local_files_only=True), folder, what)


def hf_call(call, folder, what, files: Iterable[pathlib.Path] = ()):
    """``call()`` (a transformers loader), its failures one error naming ``folder``;
    a weights-only refusal names the weight file among ``files`` that carries it."""
    try:
        return call()
    except torch.OutOfMemoryError:
        raise
    except Exception as err:
        if not refused_pickle(err) and not isinstance(err, (OSError, RuntimeError, ValueError, TypeError, KeyError)):
            raise
        if refused_pickle(err):
            for f in files:
                if f.suffix in TORCH_SUFFIXES:
                    load_file(f)  # raises the refusal naming the file
            raise refusal(folder, err) from None
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()] or [type(err).__name__]
        detail = next((ln for ln in lines if "size mismatch" in ln), lines[0])
        raise CheckpointError(f"{folder}: cannot be loaded as {what} ({detail[:300]})") from None
