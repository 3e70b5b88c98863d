"""Models of several stages that take turns in memory (GLM-Image: its 9B AR model samples the prior tokens,
then its 7B DiT turns them into pictures): only the stage that runs is on the device.

A :class:`Stage` is a set of modules and three moves: ``enter`` (onto the device, read from its files first if it
left memory), ``park`` (into system memory) and ``drop`` (out of memory; :func:`drop` leaves each module's
parameters on the meta device, :func:`adopt` gives them back from a fresh load, so whoever holds the modules keeps
holding the same objects).  :class:`Turns` runs one stage at a time: :meth:`Turns.turn` first moves the stage
that ran before out of the way as its ``wait`` says, then brings the asked one in:

* ``"none"``: every stage stays on the device (they fit together; a turn moves nothing);
* ``"system"``: the waiting stage waits in system memory and comes back over the bus (a GPU whose memory holds
  one stage at a time, in a machine whose memory holds the others);
* ``"files"``: the waiting stage leaves memory and is read again from its files at its next turn (where no memory
  holds both: a CPU, or a GPU in a machine with little system memory).

:func:`.sizing.stage_wait` picks the wait from the stages' sizes and the memory there is.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Callable

import torch

#: what each wait means, for the info a loaded model reports and the docs
WAITS = {"none": "the stages stay on the device together",
         "system": "the stage not running waits in system memory",
         "files": "the stage not running leaves memory and is read again from its files at its turn"}


@dataclass
class Stage:
    name: str
    weights: int  # bytes on the device while it runs
    enter: Callable[[], None]
    park: Callable[[], None]
    drop: Callable[[], None]


class Turns:
    """One stage on the device at a time (see the module's docstring); :attr:`moves` counts the moves made, by
    kind (what the tests and the bench read)."""

    def __init__(self, stages: list[Stage], wait: str, active: str | None = None):
        if wait not in WAITS:
            raise ValueError(f"wait must be one of {', '.join(WAITS)} (got {wait!r})")
        self.stages = {s.name: s for s in stages}
        self.wait, self.active = wait, active
        self.moves = {"enter": 0, "park": 0, "drop": 0}
        #: ``(stage, "park" or "drop")`` after a stage left: a memory manager that tracks it (ComfyUI's) forgets it
        self.on_leave: list[Callable[[str, str], None]] = []

    def turn(self, name: str) -> None:
        """``name``'s stage on the device, the one before it out of the way first (so the two never peak
        together)."""
        if name == self.active:
            return
        before = self.stages.get(self.active)
        if before is not None and self.wait != "none":
            kind = "park" if self.wait == "system" else "drop"
            getattr(before, kind)()
            self.moves[kind] += 1
            release_memory()
            for listener in self.on_leave:
                listener(before.name, kind)
        self.stages[name].enter()
        self.moves["enter"] += 1
        self.active = name


def release_memory() -> None:
    """Freed weights back to the system: Python's cycles, the CUDA cache, glibc's heap."""
    from .storage import trim_heap

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim_heap()


def on_meta(module: torch.nn.Module) -> bool:
    return any(t.is_meta for t in [*module.parameters(), *module.buffers()])


@torch.no_grad()
def drop(module: torch.nn.Module) -> None:
    """Every parameter and buffer of ``module`` on the meta device (their memory freed; the modules, their
    hooks and whoever holds them stay); :func:`adopt` refills them."""
    for m in module.modules():
        for table in (m._parameters, m._buffers):
            for key, t in list(table.items()):
                if t is not None and not t.is_meta:
                    table[key] = t.to("meta") if not isinstance(t, torch.nn.Parameter) else \
                        torch.nn.Parameter(t.to("meta"), requires_grad=t.requires_grad)


@torch.no_grad()
def adopt(module: torch.nn.Module, fresh: torch.nn.Module) -> None:
    """``module`` (dropped, or any copy of the same structure) given ``fresh``'s tensors, table by table (names
    shared by tied tensors stay shared: ``fresh``'s tie); ``fresh`` is a new load of the same files."""
    mine = dict(module.named_modules(remove_duplicate=False))
    theirs = dict(fresh.named_modules(remove_duplicate=False))
    if mine.keys() != theirs.keys():
        raise ValueError("adopt: the fresh load has another structure than the module it refills")
    for name, m in mine.items():
        other = theirs[name]
        if m._parameters.keys() != other._parameters.keys() or m._buffers.keys() != other._buffers.keys():
            raise ValueError(f"adopt: {name or 'the module'} holds other tensors than the fresh load")
        m._parameters.update(other._parameters)
        m._buffers.update(other._buffers)
