"""Output folders: checked before any work, written all or nothing.

Shared by ``spec-ar render`` and ``demo`` (cli/), ``spec-ar bench`` and
``spec-ar queue``, so none of them imports another for it.
"""
from __future__ import annotations

import os
import pathlib


def writable_folder(path: str, option: str) -> pathlib.Path:
    """``path`` as an output folder, checked before any work and not created yet:
    it is a folder (or can become one) that this user may write to."""
    folder = pathlib.Path(path)
    probe = folder
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise OutputError(f"{option} {path}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(f"{option} {path}: {probe} is not writable")
    return folder


def write_all(folder: pathlib.Path, files: dict[str, bytes]) -> None:
    """Write ``files`` into ``folder`` all or nothing: each goes to a temporary name
    first; on any failure the ones written by this call are removed."""
    folder.mkdir(parents=True, exist_ok=True)
    done: list[pathlib.Path] = []
    try:
        for name, data in files.items():
            tmp = folder / f".{name}.partial"
            done.append(tmp)
            tmp.write_bytes(data)
        for name in files:
            (folder / f".{name}.partial").replace(folder / name)
            done.append(folder / name)
    except OSError as err:
        for path in done:
            path.unlink(missing_ok=True)
        raise OutputError(f"cannot write into {folder} ({err.strerror or err})") from err


class OutputError(ValueError):
    """An output folder that cannot be written."""
