"""Reading checkpoint files safely: safetensors, or torch pickles with ``weights_only``.

Every way a file can be wrong (not a checkpoint, truncated, a pickle that would
run code, tensors of the wrong shape, a ``config.json`` that is no JSON object)
becomes one :class:`CheckpointError` naming the file and what to do.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import re
import threading
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
        return {k: tuple(v["shape"]) for k, v in safetensors_header(path).items()}
    return {k: tuple(v.shape) for k, v in state_dict(load_file(path)).items()}


def safetensors_header(path: pathlib.Path) -> dict[str, dict]:
    """A .safetensors file's tensor entries (dtype, shape, data offsets), read from its
    header alone: no memory map, which a file larger than the machine's memory can
    be refused (safetensors maps the whole file to read its header)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 2 <= n <= min(size - 8, 100 << 20):
                raise ValueError(f"header length {n} does not fit a file of {size} bytes")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError("the header is no JSON object")
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        end = max((v["data_offsets"][1] for v in tensors.values()), default=0)
        if 8 + n + end > size:
            raise ValueError(f"the tensors end at byte {8 + n + end} of a {size}-byte file")
        return tensors
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path}: not a valid .safetensors file ({detail}); it is truncated or damaged, or "
                              "not a checkpoint: download it again") from None


WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def weight_files(folder: pathlib.Path) -> list[pathlib.Path]:
    """A transformers (or diffusers) folder's weight files: the shards its index names, else its
    safetensors files, else its ``pytorch_model*.bin``."""
    for index in ("model.safetensors.index.json", "diffusion_pytorch_model.safetensors.index.json",
                  "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            shards = read_json(folder / index).get("weight_map") or {}
            return [folder / name for name in sorted(set(shards.values()))]
    return sorted(folder.glob(WEIGHT_PATTERNS[0])) or sorted(folder.glob(WEIGHT_PATTERNS[1]))


def dtype_kwarg(dtype: torch.dtype | str) -> dict:
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
    files = checked_weight_files(folder)
    return hf_call(lambda: cls.from_pretrained(str(folder), local_files_only=True, **kwargs), folder, what, files)


def checked_weight_files(folder: str | pathlib.Path) -> list[pathlib.Path]:
    """:func:`weight_files` of a transformers folder, each there and (safetensors) with a readable
    header; one error naming the folder or the file otherwise."""
    folder = pathlib.Path(folder)
    files = weight_files(folder)
    if not files:
        raise CheckpointError(f"{folder}: no weights (model*.safetensors or pytorch_model*.bin) beside its "
                              "config.json: the download is incomplete")
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f}: missing (the folder's weight index names it): the download is incomplete")
        if f.suffix == ".safetensors":
            peek(f)  # a damaged header is named here, with the file
    return files


# -- loading without a second copy of the weights ---------------------------------------
# A file's memory map keeps every page that was read resident until the file's last tensor
# is released.  Tensors used as stored can stay mapped (read on first use, resident once);
# tensors that are converted are read so that their source goes as soon as the copy exists:
# safetensors through a map of their own, pickles as plain reads.  Loading then never holds
# the weights twice, whatever dtype is asked for.

def _converts(t: torch.Tensor, dtype: torch.dtype | None) -> bool:
    return dtype is not None and t.is_floating_point() and t.dtype != dtype


def _read_safetensors(path: pathlib.Path, dtype, lazy: bool, keep=None) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    with _safetensors_errors(path):
        with safe_open(str(path), framework="pt") as f:  # views of one map: nothing is read yet
            mapped = {k: f.get_tensor(k) for k in f.keys() if keep is None or keep(k)}
        copied = [k for k, t in mapped.items() if not lazy or _converts(t, dtype)]
        out = {}
        for k in copied:
            del mapped[k]
            with safe_open(str(path), framework="pt") as f:  # a map per tensor, gone with its source
                t = f.get_tensor(k)
                out[k] = t.to(dtype) if _converts(t, dtype) else t.clone()
            del t
    out.update(mapped)
    return out


def _read_pickle(path: pathlib.Path, dtype, lazy: bool) -> dict[str, torch.Tensor]:
    if lazy:
        sd = state_dict(load_file(path))  # memory-mapped: tensors used as stored are read when first used
        if not any(_converts(t, dtype) for t in sd.values()):
            return sd
        del sd
    sd = state_dict(load_file(path, mmap=False))  # a storage each, so each source can go once converted
    done = {}  # tensors the file stores once under several names stay one tensor
    for k in list(sd):
        t = sd[k]
        if _converts(t, dtype):
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
            if key not in done:
                done[key] = t.to(dtype)
            sd[k] = done[key]
        del t
    return sd


def read_weights(files: Iterable[str | pathlib.Path], dtype: torch.dtype | None = None,
                 lazy: bool = True, keep=None) -> dict[str, torch.Tensor]:
    """Every tensor of ``files`` (safetensors, or weights-only pickles, unwrapped by :func:`state_dict`),
    the floating ones in ``dtype``, with at most one tensor held twice at any time.  Tensors already in
    ``dtype`` stay memory-mapped unless ``lazy`` is false (for a caller that rewrites them and wants each
    source freed as it goes).  ``keep(name)``: only the tensors it accepts (safetensors files only)."""
    out = {}
    for f in map(pathlib.Path, files):
        if not f.is_file():
            raise CheckpointError(f"{f}: no such file")
        if keep is not None and f.suffix != ".safetensors":
            raise CheckpointError(f"{f}: only safetensors files are read in part")
        out.update(_read_safetensors(f, dtype, lazy, keep) if f.suffix == ".safetensors"
                   else _read_pickle(f, dtype, lazy))
    return out


_META_LOCK = threading.Lock()


@contextlib.contextmanager
def parameters_on_meta():
    """Modules built inside get their parameters on the meta device (no memory, no random
    initialisation) and their buffers as usual, so the buffers no checkpoint stores (rotary
    frequencies, position ids) come out as the model's own code computes them."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = type(param)(param.to("meta"), requires_grad=param.requires_grad)

    with _META_LOCK:
        torch.nn.Module.register_parameter = on_meta
        try:
            yield
        finally:
            torch.nn.Module.register_parameter = register


def empty_model(cls, config):
    """``cls(config)`` with its parameters on the meta device, for :func:`assign_weights`."""
    with parameters_on_meta():
        return cls(config)


def assign_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], source, what: str,
                   optional: tuple[str, ...] = ()) -> None:
    """Make ``weights`` the parameters of ``model`` (built by :func:`empty_model`) themselves, no copy,
    after checking every name and shape: one error naming ``source`` and the first difference.
    Parameters under an ``optional`` prefix that ``weights`` lacks are zeros (parts generation never
    runs).  ``weights`` is emptied, so the model holds the only references and moving it to another
    device frees each tensor as it goes."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    ignored = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []]
    computed = {k for k, _ in model.named_buffers()} - set(want)  # old files may store rotary tables: recomputed
    have = {k: v for k, v in weights.items() if k not in computed and not any(p.search(k) for p in ignored)}
    weights.clear()
    bad = next((k for k in want if k in have and tuple(have[k].shape) != want[k]), None)
    if bad is not None:
        raise CheckpointError(f"{source}: tensor {bad!r} has shape {list(have[bad].shape)} where {what} needs "
                              f"{list(want[bad])}: the file is damaged or holds another model's weights")
    missing = sorted(k for k in set(want) - set(have) if not k.startswith(optional))
    unexpected = sorted(set(have) - set(want))
    if missing or unexpected:
        raise CheckpointError(f"{source}: the weights do not fit {what}: missing {missing[:4]}"
                              f"{' ...' if len(missing) > 4 else ''}, unexpected {unexpected[:4]}"
                              f"{' ...' if len(unexpected) > 4 else ''}")
    model.load_state_dict(have, strict=False, assign=True)
    del have
    for name, p in list(model.named_parameters()):
        if p.is_meta:  # an optional part the file lacks
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner)._parameters[leaf] = torch.nn.Parameter(
                torch.zeros(p.shape, dtype=p.dtype), requires_grad=p.requires_grad)
    left = [n for n, t in model.named_buffers() if t.is_meta]
    if left:  # a transformers version with state this loader does not know of
        raise RuntimeError(f"{what}: tensors left unset after loading {source}: {left[:4]}")


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
