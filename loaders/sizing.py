"""What fits a card: each storage option's weights, loaded whole or with the blocks offloaded, read from
the checkpoint's headers (nothing is loaded), beside what each image of a batch needs while decoding.

A model's weights part into the transformer's repeated blocks (``layers.N.``: what quantized storage
quantizes and offload streams) and the rest (embeddings, head, norms, image models).  Loaded whole,
the card holds both; offloaded, system memory holds the blocks and the card the rest plus two blocks
(the one running and the next one's copy, :mod:`.offload`).  :func:`plans` gives every option's
figures for a card and the largest batch each leaves room for; :func:`choose` is the loader's memory
check (the storage to load with, or one error naming what fits, offloaded options included);
:func:`stage_wait` says how a model of several stages takes turns in memory (:mod:`.stages`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ..sampling.config import ConfigError
from ..sampling import memory
from ..sampling.memory import HEADROOM, gb
from .storage import (NEVER, STORAGES, Storage, compute_dtype, file_weight_bytes, full_dtype, resolve,
                      stored_tensor_bytes)

#: a tensor of the transformer's N-th block (where quantized storage quantizes; ``NEVER``: image models)
BLOCK = re.compile(r"(^|\.)layers\.(\d+)\.")
#: options offload can stream (bitsandbytes keeps 4-bit weights on the GPU)
OFFLOADABLE = ("bfloat16", "float16", "int8", "fp8")


@dataclass(frozen=True)
class Split:
    """A model's weights in one storage option, in bytes."""
    resident: int  # outside the blocks: on the card whether offloaded or not
    blocks: int  # all the blocks
    largest: int  # the largest block
    count: int  # blocks

    @property
    def whole(self) -> int:
        return self.resident + self.blocks

    def on_card(self, offload: bool) -> int:
        return self.resident + 2 * self.largest if offload else self.whole

    def in_system(self, offload: bool) -> int:
        return self.blocks if offload else 0

    def with_blocks(self, count: int) -> "Split":
        """The same model ``count`` blocks deep (the full shape sized from a fraction of its layers)."""
        return Split(self.resident, int(self.blocks * count / self.count), self.largest, count)


def split(files, dtype, device="cuda", keep=None) -> Split:
    """The weights of ``files`` as ``dtype`` stores them on ``device`` (read from the headers); ``keep(name)``:
    only the tensors the loader reads."""
    from ..formats.checkpoints import peek

    storage = resolve(dtype)
    full = full_dtype(storage, device).itemsize
    resident, blocks = 0.0, {}
    for f in files:
        for name, shape in peek(f).items():
            if keep is not None and not keep(name):
                continue
            size = stored_tensor_bytes(name, shape, storage, full)
            block = BLOCK.search(name)
            if block and not NEVER.search(name):
                blocks[block.group(2)] = blocks.get(block.group(2), 0) + size
            else:
                resident += size
    return Split(int(resident), int(sum(blocks.values())), int(max(blocks.values(), default=0)), len(blocks))


@dataclass(frozen=True)
class Plan:
    storage: str
    offload: bool
    card: int  # bytes of weights on the card
    system: int  # bytes of weights in system memory
    batch: int  # images that fit beside them (0: the weights alone do not fit, or not even one image)

    @property
    def fits(self) -> bool:
        return self.batch > 0


def plans(files, card: int, system: int | None = None, per_image: int = 0,
          storages=("bfloat16", "int8", "fp8", "nf4"), blocks: int | None = None, keep=None) -> list[Plan]:
    """For a card of ``card`` bytes (and ``system`` bytes of system memory, None: not limited): every
    option of ``storages``, whole and (where it can) offloaded, with the batch of ``per_image`` bytes each
    leaves room for (the largest that fits :data:`HEADROOM` of the card; with ``per_image`` 0, 1 when the
    weights fit); ``blocks``: sized as that many blocks deep (:meth:`Split.with_blocks`); ``keep``: as
    :func:`split`."""
    out = []
    for name in storages:
        s = split(files, STORAGES[name], keep=keep)
        s = s.with_blocks(blocks) if blocks else s
        for offload in (False, True) if name in OFFLOADABLE else (False,):
            on_card, in_system = s.on_card(offload), s.in_system(offload)
            room = HEADROOM * card - on_card
            if room < 0 or (system is not None and in_system > HEADROOM * system):
                batch = 0
            else:
                batch = int(room // per_image) if per_image else 1
            out.append(Plan(name, offload, on_card, in_system, batch))
    return out


def offload_advice(files, storage: Storage, card_free: int, system_free: int | None, keep=None) -> str:
    """The loader's words for weights that do not fit the card: which options fit with their blocks
    offloaded, naming what each leaves on the card and puts in system memory; "" when none does."""
    fits = [p for p in plans(files, card_free, system_free, storages=OFFLOADABLE, keep=keep)
            if p.offload and p.fits]
    if not fits:
        return ""
    fits.sort(key=lambda p: (p.storage != storage.name, -p.card))
    named = " or ".join(f"{p.storage} ({gb(p.card)} on the card, {gb(p.system)} of system memory)" for p in fits)
    return f"; with offload (the blocks in system memory, streamed): {named}"


def choose(files, dtype, device, what: str, offload: bool = False, keep=None) -> Storage:
    """The storage to load ``files`` with: ``dtype`` if its weights fit ``device``'s free
    memory, else one error naming the options that do; ``auto``: bfloat16 on GPUs
    (float16 without bfloat16), on CPUs float32 while it takes at most half the free
    memory, else bfloat16 (quantized storage is never picked for the user: it is lossy).
    ``offload``: the weights are held in system memory, so they are sized against it; ``keep(name)``: only
    the tensors the loader reads count."""
    dev = torch.device(device)
    if offload:
        if dtype in (None, "auto"):
            dtype = compute_dtype(device)
        device = "cpu"
    free = memory.free_bytes(device)
    if dtype in (None, "auto"):
        wanted = compute_dtype(device) if dev.type == "cuda" else torch.float32
        if dev.type == "cpu" and free is not None and file_weight_bytes(files, torch.float32, keep=keep) > free / 2:
            wanted = torch.bfloat16
        storage = resolve(wanted)
    else:
        storage = resolve(dtype)
    need = file_weight_bytes(files, storage, device, keep)
    if free is None or need <= HEADROOM * free:
        return storage
    sizes = {name: file_weight_bytes(files, s, device, keep) for name, s in STORAGES.items()}
    fits = [f"{name} ({gb(n)})" for name, n in sorted(sizes.items(), key=lambda kv: -kv[1])
            if n <= HEADROOM * free and name != storage.name]
    offloaded = ""
    if dev.type == "cuda" and not offload:  # the blocks could live in system memory instead
        offloaded = offload_advice(files, storage, free, memory.free_bytes("cpu"), keep)
    advice = (f"{' or '.join(fits)} fit{'s' if len(fits) == 1 else ''}" if fits else
              "no storage fits" + ("" if offloaded else ": free memory (close other programs or models) or use a "
                                                         "smaller model"))
    where = "system memory (offload)" if offload else dev.type
    raise ConfigError(f"{what} in {storage.name} needs about {gb(need)} of weights, {where} has {gb(free)} "
                      f"free: {advice}{offloaded}")


def stage_wait(stages: dict[str, int], device, per_image: int = 0, card: int | None = None,
               system: int | None = None) -> str:
    """How the stages of a model (weights in bytes, by name) take turns on ``device`` (:mod:`.stages`): ``"none"``
    when they fit its free memory together with ``per_image`` bytes of work, ``"system"`` on a GPU that holds the
    largest stage alone while system memory holds the others, ``"files"`` where one stage at a time is all any
    memory holds; one error naming the stages' sizes and what is free when the largest does not fit alone.
    ``card`` / ``system``: free bytes (default: what is free now)."""
    dev = torch.device(device)
    card = memory.free_bytes(dev) if card is None else card
    if card is None:
        return "none"  # nothing to read the free memory from: as if they fit
    largest = max(stages.values())
    if sum(stages.values()) + per_image <= HEADROOM * card:
        return "none"
    if largest + per_image > HEADROOM * card:
        sizes = ", ".join(f"{name} {gb(n)}" for name, n in stages.items())
        where = "the GPU" if dev.type == "cuda" else "system memory"
        raise ConfigError(f"the model's stages take turns in memory, and the largest does not fit alone: {sizes} of "
                          f"weights and {gb(per_image)} of work per image, {where} has {gb(card)} free: free memory "
                          "(close other programs or models) or store the weights in fewer bits (dtype)")
    if dev.type != "cuda":
        return "files"
    system = memory.free_bytes("cpu") if system is None else system
    waiting = sum(stages.values()) - min(stages.values())  # the others, while the smallest runs
    return "system" if system is not None and waiting <= HEADROOM * system else "files"
