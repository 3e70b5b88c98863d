"""Sizing a request before anything is allocated.

A batch needs, per image, its KV cache (the adapter's estimate), the engine's
decoding state (the ring of draft distributions, the window buffers and the
logits in flight) and, later, the VQ decoder's activations.  :func:`check_fits`
compares that with what the device has free and, when it does not fit, raises
one :class:`~.config.ConfigError` saying the largest batch that does, instead
of an allocator traceback halfway through.
"""
from __future__ import annotations

import pathlib

import torch

from .config import ConfigError

#: share of the free memory a request may plan to use (allocators fragment)
HEADROOM = 0.9


#: file suffixes of checkpoints: files of these mapped into the process are model weights
CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")


def free_bytes(device) -> int | None:
    """Bytes free on ``device`` now, or None where that cannot be read.  On the CPU,
    weights memory-mapped from checkpoint files count as used: Linux reports their
    pages as available (a cache it may drop), yet decoding reads them every forward."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.mem_get_info(dev)[0]
    if dev.type == "cpu":
        free = _cpu_available()
        return None if free is None else max(0, free - mapped_checkpoint_bytes())
    return None


def mapped_checkpoint_bytes() -> int:
    """Bytes of checkpoint files mapped into this process (``/proc/self/maps``): weights
    loaded memory-mapped, resident or not."""
    try:
        lines = pathlib.Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return 0
    total = 0
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].strip().endswith(CHECKPOINT_SUFFIXES):
            start, end = (int(x, 16) for x in parts[0].split("-"))
            total += end - start
    return total


def _cpu_available() -> int | None:
    """``MemAvailable``, or less where a cgroup limit leaves less (containers)."""
    try:
        meminfo = pathlib.Path("/proc/meminfo").read_text().splitlines()
        free = next(int(ln.split()[1]) * 1024 for ln in meminfo if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = pathlib.Path(limit_file).read_text().strip()
            if limit.isdigit() and int(limit) < 1 << 60:
                free = min(free, int(limit) - int(pathlib.Path(usage_file).read_text().strip()))
            break
        except (OSError, ValueError):
            continue
    return free


def gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def check_fits(per_image: dict[str, int], batch: int, device, what: str = "batch") -> None:
    """Raise :class:`ConfigError` when ``batch`` images of ``per_image`` bytes (by
    part) do not fit the free memory of ``device``; say the largest batch that does."""
    free = free_bytes(device)
    need = sum(per_image.values())
    if free is None or need <= 0 or batch * need <= HEADROOM * free:
        return
    parts = ", ".join(f"{name} {gb(batch * n)}" for name, n in per_image.items() if n)
    fits = int(HEADROOM * free // need)
    advice = (f"the largest {what} that fits is {fits}" if fits >= 1 else
              "not even one image fits: free memory (close other programs or models) or use a smaller model, "
              "resolution or window")
    raise ConfigError(f"a {what} of {batch} image{'s' * (batch != 1)} needs about {gb(batch * need)} ({parts}) but "
                      f"{torch.device(device).type} has {gb(free)} free; {advice}")


def state_bytes_per_image(sizes, vocab: int, branches: int, length: int, coupling: str = "none",
                          output_width: int | None = None) -> int:
    """The engine's own memory per image (:class:`~.state.DecodeState` sized by ``sizes``):
    the ring of draft distributions, the window buffers (probabilities, cumulative
    sums), the adapter's float32 logits per branch and the acceptance rules'
    temporaries, all ``[rows, vocab]`` float32, plus the token stream; coupled
    drafting adds its buffers (and, for ``gumbel``, a ring of noise).  ``output_width``:
    the columns of the model's logits where they differ from ``vocab`` (a compact
    vocabulary gathering them from the whole vocabulary's); their compact copy is counted too."""
    rings = 1 + (coupling == "gumbel")
    rows = rings * (sizes.ring_size + 1) if sizes.drafts else 0
    rows += sizes.max_window * (2 + branches + 3 + 2 * (coupling != "none" and sizes.drafts > 0))
    outputs = 0 if output_width is None else 4 * output_width * sizes.max_window * branches
    return 4 * vocab * rows + outputs + 8 * (length + sizes.pad)
