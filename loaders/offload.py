"""Offload: a transformer's blocks kept in system memory and streamed to the GPU.

For a card that cannot hold the model's weights: everything but the repeated blocks
(embeddings, head, norms, image tower, VQ model) lives on the device; each block's
tensors stay in (pinned) host memory and are copied in just before the block runs,
the next block's copy already under way on a side stream, and dropped after it, so
the device holds at most two blocks.  A forward then costs about the weights' bytes
over the host link (PCIe), whatever the window: speculative decoding's fewer
forwards are worth the most here.  Between forwards a block's tensors are on the
meta device, so nothing can use one without it being fetched first.
"""
from __future__ import annotations

import contextvars

import torch
from torch import nn

#: the option's help, for every surface (CLI, node, bench)
HELP = ("keep the transformer's blocks in system memory and stream each to the GPU as it runs (for cards that "
        "cannot hold the weights: a forward then costs about the weights' bytes over PCIe, so speculative modes, "
        "which need fewer forwards, gain the most); bfloat16, float16, int8 and fp8 weights, not nf4; GPUs only")

#: set while a model loads with ``offload``: :func:`..storage.place` streams the blocks it finds
ACTIVE = contextvars.ContextVar("offload", default=False)


def _slots(block: nn.Module):
    """``(owner, table, key, name)`` of every parameter and buffer tensor of ``block`` (``name``:
    its qualified name in the block)."""
    return [(m, table, key, f"{prefix}.{key}" if prefix else key) for prefix, m in block.named_modules()
            for table in ("_parameters", "_buffers") for key, t in getattr(m, table).items() if t is not None]


class BlockStream:
    """Streams ``blocks`` to ``device`` around each one's forward (hooks), from host copies."""

    def __init__(self, blocks: nn.ModuleList, device, pin: bool | None = None):
        self.layers = blocks  # the list itself (what a memory manager must leave alone)
        self.blocks, self.device = list(blocks), torch.device(device)
        cuda = self.device.type == "cuda"
        pin = cuda if pin is None else pin
        self.host, self.slots, self.idle = [], [], []
        for block in self.blocks:
            slots = _slots(block)
            host = []
            for owner, table, key, _ in slots:
                t = getattr(owner, table)[key].detach().cpu()
                if pin:
                    try:
                        t = t.pin_memory()
                    except RuntimeError:  # no pinnable memory left: slower copies, same result
                        pass
                host.append(t)
            self.slots.append(slots)
            self.host.append(host)
            self.idle.append([t.to("meta") for t in host])
            self._place(block, slots, self.idle[-1])
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self.ready: dict[int, tuple[list[torch.Tensor], object]] = {}
        self.fetches = 0
        self.hooks = []
        for i, block in enumerate(self.blocks):
            self.hooks.append(block.register_forward_pre_hook(lambda m, args, i=i: self._enter(i)))
            self.hooks.append(block.register_forward_hook(lambda m, args, out, i=i: self._leave(i)))

    @staticmethod
    def _place(block, slots, tensors):
        for (owner, table, key, _), t in zip(slots, tensors):
            if table == "_parameters":
                owner._parameters[key] = nn.Parameter(t, requires_grad=False)
            else:
                owner._buffers[key] = t

    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for host in self.host for t in host)

    def _fetch(self, i: int) -> None:
        if i in self.ready:
            return
        self.fetches += 1
        if self.stream is None:
            self.ready[i] = ([t.to(self.device) for t in self.host[i]], None)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # its memory may be a block just freed
        with torch.cuda.stream(self.stream):
            tensors = [t.to(self.device, non_blocking=True) for t in self.host[i]]
            done = torch.cuda.Event()
            done.record(self.stream)
        self.ready[i] = (tensors, done)

    def _enter(self, i: int) -> None:
        self._fetch(i)
        tensors, done = self.ready.pop(i)
        if done is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(done)
            for t in tensors:
                t.record_stream(current)  # made on the side stream, used (and freed) on this one
        self._place(self.blocks[i], self.slots[i], tensors)
        self._fetch((i + 1) % len(self.blocks))  # the next block (or the next forward's first) while this one runs

    def _leave(self, i: int) -> None:
        self._place(self.blocks[i], self.slots[i], self.idle[i])

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.ready.clear()


def resident_parts(module: nn.Module, blocks: nn.Module) -> list[nn.Module]:
    """The submodules of ``module`` that hold everything but ``blocks`` (for a memory manager
    that moves modules whole: ComfyUI's model patcher gets these, the blocks are streamed)."""
    inside = {id(m) for m in blocks.modules()}
    holds = {id(m) for m in module.modules() if any(id(d) in inside for d in m.modules())}

    def parts(m):
        for child in m.children():
            if id(child) in inside:
                continue
            yield from parts(child) if id(child) in holds else [child]
    return list(parts(module))


def stream(module: nn.Module, blocks: nn.ModuleList, device) -> BlockStream:
    """Attach a :class:`BlockStream` for ``blocks`` of ``module`` (kept on the module, so it
    lives and goes with it)."""
    module._spec_ar_offload = BlockStream(blocks, device)
    module._spec_ar_offload.name = next(name for name, m in module.named_modules() if m is blocks)
    return module._spec_ar_offload


def streams_of(module: nn.Module) -> BlockStream | None:
    return getattr(module, "_spec_ar_offload", None)
