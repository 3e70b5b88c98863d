"""A preallocated KV cache whose rows advance by different amounts, and the
fixed-shape forwards (and CUDA graphs) built on it.

:class:`StaticKV` holds per layer one ``[rows, heads, capacity, head_dim]`` key
and value buffer for a whole decode (condition, image, and the windows past its
end).  Each row has its own length (``length``, a tensor updated in place, and
``host_length``, its host mirror, or an upper bound of it while the engine's step rolls
rows back on the device, :meth:`rollback_on_device`); a forward writes its ``L`` new entries at
each row's next positions, and rolling back is moving the length: the entries
past it are never read again before being overwritten, because a query sees
keys up to its own position only.

Attention reads the first ``keys`` entries of every row: the longest row plus
the window, rounded up to a multiple of ``bucket`` (masked keys add nothing).
The decode paths share that, so that they compute the same numbers: attention
kernels sum over the keys in blocks, and a different number of masked keys
can change the last bit of a probability and, rarely, a sampled token.  On the
*eager* path a window (or draft tree) goes in at its own width; on the *static*
path it is padded to a power of two (:func:`padded_width`), so that a decode runs
forwards of a handful of shapes: the padding rows are written past each row's
length and never kept.  :class:`CapturedForwards` replays one CUDA graph per
shape (the *graphs* path).

``offset`` ``[rows]`` is subtracted from a cache position to give a row's
rotary position: left-padded prompts put the first real token of a row at
position 0 (transformers' families); LlamaGen's rotary table has zero rows for
the whole condition and uses the cache position itself (offset 0).
"""
from __future__ import annotations

import contextlib

import torch

#: how the decode path is chosen: ``auto`` is ``graphs`` on CUDA and ``eager`` elsewhere
DECODE_PATHS = ("auto", "eager", "static", "graphs", "compiled")
#: the paths that replay CUDA graphs (on CUDA), and so keep their cache between decodes
CAPTURED = ("graphs", "compiled")
HELP = ("how forwards run: eager (shapes as they come), static (a KV cache allocated once per decode and read in "
        "buckets of 256 entries, windows and draft trees padded to powers of two: a few fixed shapes), graphs "
        "(static, each shape captured once as a CUDA graph and replayed, so a forward costs no per-kernel launch "
        "time; CUDA only, offloaded and nf4 models run static), compiled (graphs of forwards whose transformer "
        "blocks torch.compile fused first: fewer, larger kernels, after one compile that every block shares, "
        "whatever the depth (16 s on a 2-core CPU at 8 or 24 blocks; offloaded and nf4 models run static); "
        "the same distribution, "
        "but fused arithmetic rounds differently, so a seed's image can differ), auto (graphs on CUDA, eager "
        "elsewhere; default). eager, static and graphs give the same tokens. graphs and compiled keep the KV "
        "cache and the graphs allocated between runs, for the next one (the sampler's unload_after_run frees "
        "them with the model)")

#: what the compiled path compiles blocks with (tests use ``aot_eager``: the same arithmetic, no code generation)
COMPILE_BACKEND = "inductor"

#: cache entries per key bucket on the static path (a 7B model at 384 px: 3 buckets)
BUCKET = 256


def resolve_path(path: str | None, device, capturable: bool = True) -> str:
    """The decode path ``path`` (one of :data:`DECODE_PATHS`) runs as on ``device``: graphs need
    CUDA and a ``capturable`` model (not offloaded, not nf4), compiled such a model, else they run
    ``static``."""
    path = path or "auto"
    if path not in DECODE_PATHS:
        from ..sampling.config import ConfigError

        raise ConfigError(f"decode path must be one of {', '.join(DECODE_PATHS)} (got {path!r})")
    graphs = torch.device(device).type == "cuda" and capturable
    if path == "auto":
        return "graphs" if graphs else ("static" if torch.device(device).type == "cuda" else "eager")
    if (path == "graphs" and not graphs) or (path == "compiled" and not capturable):
        return "static"  # an offloaded or nf4 model's blocks are streamed or unpacked as they run
    return path


def new_forwards(adapter) -> "CapturedForwards":
    """The graphs an adapter's forwards replay on its decode path (none off CUDA)."""
    return CapturedForwards(adapter.decode_path in CAPTURED and torch.device(adapter.device).type == "cuda")


def static_forward(adapter, kv: "StaticKV", fn, tokens: torch.Tensor, parents: torch.Tensor | None = None,
                   graph: tuple | None = None):
    """One forward on the static paths: ``tokens`` ``[B, n]`` (a window, a draft tree's
    nodes with ``parents``, or nodes with an explicit ``graph``, see
    :meth:`~..sampling.adapter.ImageAdapter.forward_tree`) padded to :func:`padded_width`,
    run as ``fn(tokens[, within], keys[, depth])`` (an adapter method returning logits
    ``[K, B, W, V]`` and features ``[K, B, W, H]``) through the adapter's decode path,
    ``n`` positions added to ``kv``.  Returns the ``n`` real rows of both."""
    from ..sampling.tree import ancestors

    n = tokens.shape[1]
    W = padded_width(n)
    keys = kv.keys_for(W)
    run = forward_function(adapter, fn)
    if graph is not None:
        inputs, kind, call = (pad_window(tokens, W), *pad_graph(*graph, W)), "graph", lambda t, w, d: run(t, w, keys, d)
    else:
        inputs = (pad_window(tokens, W),) + (() if parents is None else (ancestors(pad_tree(parents, W)),))
        kind, call = ("window" if parents is None else "tree"), lambda *t: run(*t, keys)
    # a compact vocabulary's head rows give logits of another width (and read other weights)
    key = (kind, W, keys, adapter.batch, getattr(adapter, "head_rows", None))
    logits, features = adapter.graphs.run(key, call, *inputs)
    kv.advance([n] * kv.rows)
    return logits[:, :, :n], features[:, :, :n]


def weights_signature(*modules: torch.nn.Module) -> tuple:
    """Where the modules' weights are now.  A graph replays the addresses it was captured
    with: when ComfyUI (or anything else) moves a model off the GPU and back, its
    graphs must be captured again."""
    return tuple((t.device, t.data_ptr()) for m in modules for t in [*m.parameters(), *m.buffers()])


def forward_function(adapter, fn):
    """``fn`` (a bound method of ``adapter``) as its decode path runs it.  On the compiled path
    the network's repeated blocks run compiled, regionally: every block is the same code on
    other weights, so one compile (``dynamic``: widths, cache reads and the layer index
    symbolic) serves them all and its time does not grow with depth (a 7B model's whole
    forward did not compile within 140 s on an H100); embeddings, masks and head run as they
    are, and on CUDA the graphs capture the whole forward."""
    if adapter.decode_path != "compiled":
        return fn
    blocks, compiled = compiled_blocks(adapter)

    def run(*args):
        with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True), swapped(blocks, compiled):
            return fn(*args)
    return run


def compiled_blocks(adapter) -> tuple:
    """The adapter's repeated blocks (``ModuleList``) and each one compiled, found and made once per
    adapter (finding them walks every module: 0.4 ms a forward on Janus-Pro-7B at 0.1, 386 modules)."""
    from .storage import repeated_blocks

    kept = adapter.__dict__.get("compiled_blocks")
    if kept is None:
        blocks = repeated_blocks(adapter.network())
        if blocks is None:
            raise RuntimeError(f"{type(adapter).__name__}: no repeated blocks to compile")
        kept = adapter.compiled_blocks = (blocks, [torch.compile(b, dynamic=True, backend=COMPILE_BACKEND)
                                                    for b in blocks])
    return kept


@contextlib.contextmanager
def swapped(blocks, compiled):
    """``blocks`` run as ``compiled`` within (the other paths keep the plain blocks)."""
    plain = list(blocks)
    for i, c in enumerate(compiled):
        blocks[i] = c
    try:
        yield
    finally:
        for i, b in enumerate(plain):
            blocks[i] = b


def capacity_for(positions: int) -> int:
    """Cache entries for ``positions``, rounded up to a whole bucket."""
    return -(-positions // BUCKET) * BUCKET


def padded_width(n: int) -> int:
    """The static path's width for ``n`` window tokens or tree nodes: the next power of two."""
    return 1 << max(0, n - 1).bit_length()


class StaticKV:
    def __init__(self, layers: int, heads: int, head_dim: int, rows: int, capacity: int, dtype, device,
                 bucket: int = 1):
        # one tensor per kind for every layer: a block compiled once for all layers picks its
        # layer's entries by index (a list would need one compile per layer)
        shape = (layers, rows, heads, capacity, head_dim)
        self.K = torch.zeros(shape, dtype=dtype, device=device)
        self.V = torch.zeros(shape, dtype=dtype, device=device)
        self.length = torch.zeros(rows, dtype=torch.long, device=device)
        self.offset = torch.zeros(rows, dtype=torch.long, device=device)
        self.host_length = [0] * rows
        self.key_ok = torch.ones(rows, capacity, dtype=torch.bool, device=device)
        self.capacity, self.rows, self.bucket = capacity, rows, bucket
        self.row_index = torch.arange(rows, device=device).unsqueeze(1)  # [rows, 1]: where write puts entries
        self.pos = None
        self.keys = 0
        self.added = 0  # positions the last forward added to every row (advance)
        self.bounded = False  # host_length holds upper bounds, host_floor lower ones (rollback_on_device)
        self.departed = 0  # the longest row that left (keep_rows)
        self.host_floor = self.host_length

    def reset(self, key_ok: torch.Tensor | None = None) -> None:
        """Empty every row (in place: captured forwards keep reading these tensors);
        ``key_ok`` ``[rows, S]`` marks the real entries of the prompt about to be written."""
        self.length.zero_()
        self.offset.zero_()
        self.host_length = [0] * self.rows
        self.bounded, self.departed = False, 0
        self.key_ok.fill_(True)
        if key_ok is not None:
            self.key_ok[:, : key_ok.shape[1]] = key_ok.bool()
            self.offset.copy_((~key_ok.bool()).sum(1))

    def keys_for(self, L: int) -> int:
        """Entries attention reads in a forward of ``L`` tokens: the longest row plus
        ``L``, rounded up to the bucket.  Where the host holds bounds of the lengths
        (:meth:`rollback_on_device`) that round to different buckets, it reads the
        lengths first: the count is then the one exact lengths give, so that attention
        sums the same keys (and a forward gives the same numbers) whether the step runs
        on the host or the device."""
        if not self.bounded:  # exact now: the floor of the bounds a device rollback would leave
            self.host_floor = self.host_length
        need = max(max(self.host_length), self.departed) + L
        if self.bounded and self._bucket(need) != self._bucket(max(max(self.host_floor), self.departed) + L):
            self.sync_host()
            need = max(max(self.host_length), self.departed) + L
        if need > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded")
        return min(self._bucket(need), self.capacity)

    def _bucket(self, n: int) -> int:
        return -(-n // self.bucket) * self.bucket

    def rollback_on_device(self, n: torch.Tensor, most: int | None = None) -> None:
        """Drop the last ``n[row]`` entries of each row, ``n`` a device tensor the host has
        not read.  ``host_length`` becomes an upper bound of each row's length (it keeps
        what the forwards added) and ``host_floor`` a lower one (the exact lengths before
        the first such forward: a verify step never shrinks a row; a draft model's rows may
        shrink, by at most ``most`` a rollback) until :meth:`sync_host`."""
        self.length -= n
        if most:
            self.host_floor = [max(0, f - most) for f in self.host_floor]
        self.bounded = True

    def sync_host(self) -> None:
        """``host_length`` exact again (one host read)."""
        if self.bounded:
            self.host_length = self.length.tolist()
            self.bounded = False

    def begin(self, L: int, keys: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Start a forward of ``L`` tokens per row, reading ``keys`` entries (default
        :meth:`keys_for`): returns their rotary positions ``[rows, L]`` and the
        boolean attention mask ``[rows, 1, L, keys]`` (causal, valid keys, and every
        position sees itself, so padded condition rows see only themselves)."""
        self.pos = self.length.unsqueeze(1) + torch.arange(L, device=self.length.device)
        self.keys = keys or self.keys_for(L)
        idx = torch.arange(self.keys, device=self.length.device)
        q = self.pos.unsqueeze(-1)
        mask = ((idx <= q) & self.key_ok[:, None, : self.keys]) | (idx == q)
        return self.pos - self.offset.unsqueeze(1), mask.unsqueeze(1)

    def begin_tree(self, depth: torch.Tensor, within: torch.Tensor, start: torch.Tensor | None = None,
                   keys: int | None = None):
        """Start a forward of ``N`` nodes of a draft tree (``sampling/tree.py``) per
        row, stored after each row's cache in node order.  The tree's nodes begin
        at cache position ``start`` ``[rows]`` (default: the cache length; earlier
        nodes of a tree fed level by level are already there): ``within``
        ``[rows, N, M]`` says which of the tree's ``M`` nodes so far (these ``N``
        last) each node sees, its ancestors and itself; before ``start`` every
        valid key is seen.  Returns the nodes' rotary positions ``[rows, N]``
        (``start`` + depth) and the mask ``[rows, 1, N, keys]``."""
        start = self.length if start is None else start
        _, mask = self.begin(depth.shape[1], keys)
        s = start.view(-1, 1, 1)
        idx = torch.arange(self.keys, device=self.length.device)
        col = (idx - s).clamp(min=0, max=within.shape[2] - 1).expand(-1, within.shape[1], -1)
        in_tree = within.gather(2, col) & (idx < s + within.shape[2])
        mask = torch.where(idx >= s, in_tree, mask.squeeze(1))
        return start.unsqueeze(1) + depth - self.offset.unsqueeze(1), mask.unsqueeze(1)

    def keep(self, nodes: torch.Tensor, counts: list[int] | torch.Tensor):
        """After a tree forward (the last :meth:`advance`, which gave every row its nodes): keep
        nodes ``nodes[row, :counts[row]]`` (a root-to-node path, in order) where the row stood
        before it, and drop the rest.  ``counts`` may be a device tensor the host has not read
        (the engine's step on the device): ``host_length`` then stays an upper bound, as after
        :meth:`rollback_on_device`."""
        base = (self.length - self.added).unsqueeze(1)  # each row's length before the forward
        src, dst = base + nodes, base + torch.arange(nodes.shape[1], device=base.device)
        for buf in (self.K, self.V):  # every layer at once, by (row, position) as in write
            by_position = buf.transpose(2, 3)  # [layers, rows, capacity, heads, head_dim]
            by_position[:, self.row_index, dst] = by_position[:, self.row_index, src]
        if isinstance(counts, torch.Tensor):
            self.length.copy_(base.view(-1) + counts)
            self.bounded = True
            return
        self.host_length = [n - self.added + c for n, c in zip(self.host_length, counts)]
        self.length.copy_(torch.tensor(self.host_length, device=self.length.device))

    def keep_rows(self, rows: list[int]) -> None:
        """Only ``rows`` stay (images leaving the batch): their entries move to the first rows of
        the same buffers, their lengths and masks to new tensors (graphs captured on the old ones
        must be captured again).
        Attention goes on reading as many keys as the rows that left would have had it read (their
        final lengths, ``departed``): the same sums, so the same numbers, as with them riding along."""
        self.departed = max([self.departed] + [n for r, n in enumerate(self.host_length) if r not in rows])
        from ..sampling.state import narrowed

        idx = torch.tensor(rows, device=self.length.device)
        self.K, self.V = narrowed(self.K, rows, 1), narrowed(self.V, rows, 1)  # the same storage
        self.length, self.offset = self.length.index_select(0, idx), self.offset.index_select(0, idx)
        self.key_ok = self.key_ok.index_select(0, idx)
        self.host_length = [self.host_length[r] for r in rows]
        self.host_floor = [self.host_floor[r] for r in rows]
        self.rows = len(rows)
        self.row_index = self.row_index[: self.rows]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store ``k, v`` ``[rows, heads, L, hd]`` at each row's positions; return
        the keys and values attention reads."""
        keys, values = self.K[layer], self.V[layer]
        # index_put_ over (row, position), not scatter_ along positions: on the CPU a bfloat16
        # scatter_ costs time by the whole buffer's size (24 ms for one token of a 7B layer's
        # cache at batch 1, against 0.03 ms; float32 2-3x); the same entries
        at = (self.row_index, self.pos)
        keys.transpose(1, 2).index_put_(at, k.transpose(1, 2))
        values.transpose(1, 2).index_put_(at, v.transpose(1, 2))
        return keys[:, :, : self.keys], values[:, :, : self.keys]

    def advance(self, n: list[int]):
        """Add ``n[row]`` positions (negative: roll back); a forward adds as many to every row
        (``added``: what :meth:`keep` takes back to find where a tree forward started)."""
        self.added = n[0]
        self.host_length = [a + b for a, b in zip(self.host_length, n)]
        if n.count(n[0]) == len(n):  # (a forward, a batch of one: no list to copy to the device)
            self.length += n[0]
        else:
            self.length += torch.tensor(n, device=self.length.device)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.K, self.V))

    def live_bytes(self) -> int:
        """Bytes a forward reads now: the entries up to the longest row."""
        return self.nbytes() * max(self.host_length) // self.capacity


def pad_tree(parents: torch.Tensor, width: int) -> torch.Tensor:
    """``parents`` ``[rows, N]`` widened to ``width`` nodes; the added ones are roots
    that see only themselves (their outputs are never read)."""
    extra = width - parents.shape[1]
    if extra <= 0:
        return parents
    return torch.cat([parents, parents.new_full((parents.shape[0], extra), -1)], 1)


def pad_graph(sees: torch.Tensor, depth: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An explicit node graph (``sees`` ``[rows, N, N]``, ``depth`` ``[rows, N]``) widened to
    ``width`` nodes; the added ones see only themselves, at depth 0."""
    extra = width - depth.shape[1]
    if extra <= 0:
        return sees, depth
    rows, N = depth.shape
    out = torch.eye(width, dtype=torch.bool, device=sees.device).repeat(rows, 1, 1)
    out[:, :N, :N] = sees
    return out, torch.cat([depth, depth.new_zeros(rows, extra)], 1)


def pad_window(tokens: torch.Tensor, width: int) -> torch.Tensor:
    """``tokens`` ``[B, L]`` widened to ``width`` columns with copies of the last one."""
    extra = width - tokens.shape[1]
    if extra <= 0:
        return tokens
    return torch.cat([tokens, tokens[:, -1:].expand(-1, extra)], 1)


class CapturedForwards:
    """One CUDA graph per forward shape, replayed on fresh inputs.

    ``run(key, fn, *inputs)`` calls ``fn(*inputs)`` (tensors in, a tuple of
    tensors out).  The first call with a ``key`` captures it: its inputs are copied
    into static buffers, ``fn`` runs twice on a side stream (warm-up: its writes
    into the KV cache land where the real call writes the same values), then once
    under capture; later calls copy their inputs in and replay.  Every
    graph shares one memory pool, so outputs are valid until the next ``run``
    (the engine consumes a forward's logits before the next one).  With
    ``enabled`` false ``fn`` just runs; a capture that fails turns graphs off for
    the rest of the decode and says why in ``failed``."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.graphs: dict = {}
        self.pool = None
        self.captures = 0
        self.replays = 0
        self.failed: str | None = None

    def run(self, key, fn, *inputs):
        if not self.enabled:
            return fn(*inputs)
        hit = self.graphs.get(key)
        if hit is None:
            try:
                hit = self._capture(key, fn, inputs)
            except RuntimeError as err:  # e.g. an operation that synchronises with the host
                self.enabled, self.failed = False, f"{type(err).__name__}: {err}".splitlines()[0]
                torch.cuda.synchronize()
                return fn(*inputs)
        graph, static, out = hit
        for buf, t in zip(static, inputs):
            buf.copy_(t)
        graph.replay()
        self.replays += 1
        return out

    def _capture(self, key, fn, inputs):
        static = tuple(t.clone() for t in inputs)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn(*static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn(*static)
        self.pool = graph.pool()
        self.captures += 1
        hit = self.graphs[key] = (graph, static, out)
        return hit

    def clear(self):
        self.graphs.clear()
        self.pool = None

    def check_weights(self, signature: tuple) -> None:
        """Before a decode: drop the graphs if the weights moved since they were captured."""
        if getattr(self, "signature", None) != signature:
            self.clear()
            self.signature = signature
