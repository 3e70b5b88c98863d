"""The tensors of a TorchScript archive (``torch.jit.save``), read without ``torch.jit.load``.

Some releases (NVIDIA's Cosmos tokenizers) ship only TorchScript: a zip holding ``<name>/data.pkl`` (the
module tree, pickled), ``<name>/data/<key>`` (one raw storage per key), and code, constants and debug
information this reader never opens.  ``torch.jit.load`` would compile and keep the archive's code, and an
unrestricted unpickler would run whatever the pickle names; here the pickle is read by an unpickler that
knows only what a module tree of tensors needs:

* ``torch._utils._rebuild_tensor_v2`` / ``_rebuild_parameter``: a tensor over a storage (our own code
  builds it, as a view of the storage read from ``data/<key>``; tensors that share a storage share it);
* ``torch.<Kind>Storage``: the element type of a storage;
* ``collections.OrderedDict``, the ``torch.jit._pickle`` list builders and ``torch.device`` (scripted
  modules' typed attributes): plain containers, rebuilt by our own code;
* ``__torch__.*``: the archive's module classes, each read as an attribute bag.

Anything else is refused with one :class:`CheckpointError` naming the file and the global, as are a file
that is no zip, a zip without ``data.pkl``, a storage missing or shorter than the tensors need, and a
big-endian archive.
"""
from __future__ import annotations

import collections
import io
import pathlib
import pickle
import zipfile

import torch

from .checkpoints import CheckpointError

#: ``torch.<name>`` storage types -> element type
STORAGE_DTYPES = {
    "DoubleStorage": torch.float64, "FloatStorage": torch.float32, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8, "BoolStorage": torch.bool,
    "ComplexFloatStorage": torch.complex64, "ComplexDoubleStorage": torch.complex128,
}


class ScriptObject:
    """A module (or other TorchScript class instance) of the archive: its pickled attributes, nothing more.
    ``qualified_name`` is the class the archive names (``__torch__.torch.nn.modules.conv.Conv3d``)."""

    qualified_name = "__torch__"

    def __repr__(self) -> str:
        return f"<{self.qualified_name}: {', '.join(sorted(vars(self)))}>"


class _StorageRef:
    """A storage's element type, as the pickle names it (``torch.FloatStorage``)."""

    def __init__(self, name: str):
        self.name, self.dtype = name, STORAGE_DTYPES[name]


def _plain_list(values, *_):
    return list(values)


def _keep_value(value, *_):  # restore_type_tag(value, type_string): the type tag is not needed
    return value


def _device_name(*args):
    return str(args[0]) if args else "cpu"


class _ArchiveUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: zipfile.ZipFile, root: str, path: pathlib.Path):
        super().__init__(io.BytesIO(data))
        self.archive, self.root, self.path = archive, root, path
        self.storages: dict[str, torch.Tensor] = {}  # key -> its bytes (uint8), read once and shared
        self.classes: dict[str, type] = {}

    def find_class(self, module: str, name: str):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return self.rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageRef(name)
        if module == "torch" and name == "device":
            return _device_name
        if module == "torch.jit._pickle" and name in ("build_intlist", "build_doublelist", "build_boollist",
                                                      "build_tensorlist"):
            return _plain_list
        if module == "torch.jit._pickle" and name == "restore_type_tag":
            return _keep_value
        if module == "__torch__" or module.startswith("__torch__."):
            qualified = f"{module}.{name}"
            if qualified not in self.classes:
                self.classes[qualified] = type(name, (ScriptObject,), {"qualified_name": qualified})
            return self.classes[qualified]
        raise CheckpointError(f"{self.path}: refused: its {self.root}/data.pkl names {module}.{name}, which is no "
                              "part of a TorchScript module's tensors (only torch._utils tensor rebuilds, torch "
                              "storage types, plain containers and __torch__ module classes are read); the file is "
                              "not a TorchScript model archive, or one that would run code when loaded")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageRef)):
            raise CheckpointError(f"{self.path}: {self.root}/data.pkl refers to {str(pid)[:80]}, expected a tensor "
                                  "storage ('storage', type, key, location, size)")
        _, kind, key, _location, numel = pid
        key = str(key)
        if key not in self.storages:
            self.storages[key] = self.read_storage(key)
        raw = self.storages[key]
        itemsize = torch.empty((), dtype=kind.dtype).element_size()
        if raw.numel() < int(numel) * itemsize:
            raise CheckpointError(f"{self.path}: storage {self.root}/data/{key} holds {raw.numel()} bytes where "
                                  f"{numel} {kind.name} elements need {int(numel) * itemsize}: the file is truncated "
                                  "or damaged: download it again")
        return raw[: int(numel) * itemsize].view(kind.dtype)

    def read_storage(self, key: str) -> torch.Tensor:
        member = f"{self.root}/data/{key}"
        try:
            info = self.archive.getinfo(member)
        except KeyError:
            raise CheckpointError(f"{self.path}: no storage {member} (data.pkl refers to it): the file is "
                                  "truncated or damaged: download it again") from None
        raw = torch.empty(info.file_size, dtype=torch.uint8)
        try:
            with self.archive.open(info) as f:
                got = f.readinto(memoryview(raw.numpy()))
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise CheckpointError(f"{self.path}: storage {member} cannot be read ({err}): the file is truncated or "
                                  "damaged: download it again") from None
        if got != info.file_size:
            raise CheckpointError(f"{self.path}: storage {member} ends after {got} of {info.file_size} bytes: the "
                                  "file is truncated: download it again")
        return raw

    def rebuild_tensor(self, storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
        """``_rebuild_tensor_v2``: a view of ``storage`` (elements), after checking that it reaches no further."""
        size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
        if not isinstance(storage, torch.Tensor) or len(size) != len(stride):
            raise CheckpointError(f"{self.path}: {self.root}/data.pkl holds a malformed tensor (size {list(size)}, "
                                  f"stride {list(stride)})")
        last = int(offset) + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else -1
        if int(offset) < 0 or min(stride, default=0) < 0 or last >= storage.numel():
            raise CheckpointError(f"{self.path}: a tensor of shape {list(size)} reaches element {last} of a "
                                  f"{storage.numel()}-element storage: the file is damaged")
        return storage.as_strided(size, stride, int(offset))


def _rebuild_parameter(data, requires_grad=False, hooks=None):
    return data


def archive_root(archive: zipfile.ZipFile, path: pathlib.Path) -> str:
    """The archive's folder (``<name>`` of ``<name>/data.pkl``)."""
    roots = [n[: -len("/data.pkl")] for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(roots) != 1:
        found = "no <name>/data.pkl" if not roots else f"{len(roots)} data.pkl files"
        raise CheckpointError(f"{path}: not a TorchScript archive ({found}; torch.jit.save writes one "
                              "<name>/data.pkl beside its <name>/data/ storages)")
    return roots[0]


def load_torchscript_tensors(path: str | pathlib.Path) -> dict[str, torch.Tensor]:
    """Every tensor attribute of the archive's module tree (parameters and buffers, non-persistent ones
    too), as ``{dotted.name: tensor}`` like a state dict, in the stored dtypes, on the CPU.  A module
    reached by two paths lists its tensors under both; tensors that share a storage share it here."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(f"{path}: not a TorchScript archive (a zip file, as torch.jit.save writes): {err}; "
                              "it is truncated or damaged, or another kind of file") from None
    with archive:
        root = archive_root(archive, path)
        try:
            order = archive.read(f"{root}/byteorder").decode("ascii", "replace").strip()
        except KeyError:
            order = "little"  # archives before torch 1.x's byteorder record are little-endian
        if order != "little":
            raise CheckpointError(f"{path}: a {order}-endian TorchScript archive; only little-endian ones are read")
        try:
            data = archive.read(f"{root}/data.pkl")
            tree = _ArchiveUnpickler(data, archive, root, path).load()
        except CheckpointError:
            raise
        except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
                IndexError, KeyError, OSError) as err:
            raise CheckpointError(f"{path}: {root}/data.pkl cannot be read ({type(err).__name__}: "
                                  f"{str(err)[:200]}): the file is truncated or damaged: download it again") from None
    if not isinstance(tree, ScriptObject):
        raise CheckpointError(f"{path}: {root}/data.pkl holds a {type(tree).__name__}, not a TorchScript module")
    out: dict[str, torch.Tensor] = {}
    _collect(tree, "", out, set())
    return out


def _collect(obj: ScriptObject, prefix: str, out: dict, on_path: set) -> None:
    on_path.add(id(obj))
    for name, value in vars(obj).items():
        if isinstance(value, torch.Tensor):
            out[prefix + name] = value
        elif isinstance(value, ScriptObject) and id(value) not in on_path:
            _collect(value, f"{prefix}{name}.", out, on_path)
    on_path.discard(id(obj))
