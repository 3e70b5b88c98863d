"""The decode state: what the engine, draft sources and schedules share for one batch.

Positions are *stream* positions (structural tokens included), ``0 .. length-1``;
per sample ``b`` the state tracks how many are **committed** (final) and how
many the adapter has **cached**.  Tensors live on the model's device; the
``host_*`` lists mirror some of them and are refreshed by the one host
synchronisation per step, so code that needs a Python int reads those (with the
step on the device, ``device_step``, they are read every few steps only: lower
bounds of the lengths in between).

What a **draft source** (``drafts.py``; a new one needs this file only) may use:

==================  =============================  =====================================================
name                shape / type                   meaning (R = read, W = write)
==================  =============================  =====================================================
``seq``             int64 ``[B, length + pad]``    R/W tokens by position: committed ones, then drafts
``ring``            f32 ``[B, ring_size + 1, V]``  R/W ``q`` of the draft at position ``t`` in slot
                                                   ``t % ring_size`` (committed ones keep their ``p``);
                                                   slot ``ring_size`` absorbs masked writes
``draft_end``       int64 ``[B]``                  R/W drafts exist at positions before it
``host_draft_end``  ``list[int]``                  R/W its host mirror
``informed_end``    int64 ``[B]``                  W drafts before it came from a model pass and may be
                                                   committed unverified by a skipping schedule
``window_positions``int64 ``[B, L]``               R input positions of the forward just judged
``window_targets``  int64 ``[B, L]``               R the positions its rows predict (``+ 1``), their ring
``window_slots``,   int64, bool ``[B, L]``         R slots, whether each held a draft before the pass
``window_had``
``window_drafts``   int64 ``[B, L]`` or None       R the tokens at ``window_targets`` before the pass (None:
                                                   not read by the engine; gather them from ``seq``)
``window_rows``     int64 ``[B, L]``               R the slots' rows in ``ring`` viewed ``[B * R, V]``
                                                   (``ring_rows``; ``rows`` and ``put_rows`` take them)
``window_near_end`` bool                           R some of its rows predict past an image's end
``window_width``    int64 ``[]`` or None           R on the device step after a skip: the window's width,
                                                   its rows at and past it not the window's (None: all are)
``window_last_cdf`` ``(f32 [1, V], float)``        R a batch of one's last window row's cumulative sums and
                    or None                        total where the engine drew that row from its ``p`` (it
                                                   held no draft): what ``rng.categorical`` makes of ``p``
``extend_span``     ``(list[int], list[int])``     R in ``extend`` on the host step: each sample's ``start``
                                                   and ``stop`` as the host has them (None on the device step)
``extend_uniform``  method                         R the numbers of an extension's positions (``extend``)
``n_committed``,    int64 ``[B]``, ``list[int]``   R committed prefix length (and host mirror)
``host_committed``
``n_cached``,       int64 ``[B]``, ``list[int]``   R positions in the adapter's cache
``host_cached``
``step``            int                            R decoding step (0: the prefill)
``keys``            int64 ``[B]``                  R per-sample random keys: ``rng.uniform(keys, step,
                                                   stream, positions)``
``forced_at``       int64 ``[length + pad]``       R forced token per position, -1 where free
``prev_free``       int64 ``[length + pad]``       R nearest free position ``<= t``
``first_free``      int                            R the first free position (``prev_free`` is -1 before it)
``image_ids``       int64 ``[N]``                  R the token ids allowed at free positions
``layout``          :class:`~.adapter.TokenLayout` R raster geometry (``row_stride``, ``grid``)
``batch_idx``       int64 ``[B, 1]``               R ``arange(B)`` for advanced indexing
``scratch``         int                            R a ``seq`` column that absorbs masked writes
``arange(n)``       int64 ``[n]``                  R a cached ``arange``
==================  =============================  =====================================================

With row-parallel drafting (``rows.py``) ``fixed`` (int64 ``[B, length + pad]``, -1 where
none) holds the tokens drawn in lower rows: the engine keeps them in ``seq`` at their
positions and the window passes them like forced ones; a draft source may read it.

A skipping schedule (``schedule.py``) plans after the verify step's lengths are written and before the
host reads them: ``committed_bound()`` (None on the step on the device) bounds each committed length then,
so that it can read numbers at committed positions through ``uniform`` (a block holds the streams in
``block_lanes``).

A draft source also keeps ``drafts_redrawn`` / ``drafts_kept`` (int64 ``[B, max_window]``,
by window row: positions it drafted again after a pass, and how many of those kept their
draft; their row sums are the report's draft stability; counting by row adds a pass's mask
without a reduction) and may hold per-batch tensors of its own in ``source_state``
(a dict, emptied when images leave the batch: what it holds must be rebuilt from the state),
and fill a ``[B, n, V]`` buffer from a ring with ``rows(ring, slots, name)``.

A batch of one on the host step with Jacobi drafts (``scalar``) sets its lengths as host numbers (each length
attribute cuts its view from kept tables, ``count``, when something reads it) and keeps its positions and row
masks as views cut from those tables (``span``, ``span_slots``, ``first_rows``): the same values, no kernel to
compute them; nothing may write into them.  ``JacobiDrafts`` reads the window's new-token row there as
``window_passed``.

A **schedule** (``schedule.py``) reads the same plus ``produced``/``verified``
(tokens committed by and number of verified forwards, for the mean accepted
length), ``verified_since_skip``, ``max_commit`` and :meth:`commit_lengths`.
Everything else is the engine's own.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import rng
from .config import DecodeConfig, proactive_nodes


class Sizes(NamedTuple):
    """How far a configuration looks ahead (all in stream positions)."""

    drafts: int  # draft tokens per window (0: plain AR)
    skips: bool  # a schedule may commit drafts without a forward
    max_commit: int  # longest unverified commit
    horizon: int  # drafts kept past the committed prefix
    max_window: int  # longest forward window
    pad: int  # positions past the stream that windows may touch
    ring_size: int  # slots of the ring of draft distributions

    @classmethod
    def of(cls, config: DecodeConfig, layout) -> "Sizes":
        drafts = config.drafts
        skips = config.verify_schedule != "every" and drafts > 0
        max_commit = drafts + 1 if skips else 0
        horizon = drafts + max_commit
        max_window = drafts + 1 + max_commit + (proactive_nodes(config) if drafts and not config.drafter else 0)
        pad = 2 * (max_window + horizon) + 4
        above = layout.row_stride if config.init.endswith("above") else 0  # *-above reads one row back
        ring = above + pad
        if drafts and not config.drafter and config.rows > 1:  # row-parallel drafts reach R rows ahead
            ring += (config.rows + 1) * layout.row_stride
            max_window += config.rows * layout.row_stride
        return cls(drafts, skips, max_commit, horizon, max_window, pad, ring)


def _length(name: str) -> property:
    """A per-sample length ``[B]``.  A batch of one on the host step may set it as a host number: the tensor (a
    view cut from the state's tables) is made when something reads it, and most steps nothing does."""
    key = "_" + name

    def read(st):
        v = getattr(st, key)
        if type(v) is int:
            v = st.count(v)
            setattr(st, key, v)
        return v

    return property(read, lambda st, v: setattr(st, key, v))


class DecodeState:
    """Per-batch decoding state (see the module docstring for the public part)."""

    n_cached, n_committed = _length("n_cached"), _length("n_committed")
    draft_end, informed_end = _length("draft_end"), _length("informed_end")
    produced, verified = _length("produced"), _length("verified")

    def __init__(self, adapter, config: DecodeConfig, seeds, device, geometry, shared: dict | None = None):
        """``shared``: tensors a decoder's decodes share, which nothing writes (the aranges by width, the
        layout's tables); a dict of its own if None."""
        shared = {} if shared is None else shared
        lay = adapter.layout
        self.layout, self.length = lay, lay.length
        self.batch = len(seeds)
        self.seeds = seeds
        self.keys = rng.seed_keys(seeds, device)
        self.shared = shared
        self.batch_idx = shared.get(("batch_idx", self.batch, str(device)))
        if self.batch_idx is None:
            self.batch_idx = shared[("batch_idx", self.batch, str(device))] = torch.arange(
                self.batch, device=device).unsqueeze(1)
        sizes = Sizes.of(config, lay)
        self.drafts, self.skips, self.max_commit = sizes.drafts, sizes.skips, sizes.max_commit
        self.drafting = sizes.drafts > 0  # drafts and verifies (its width may change: set_drafts)
        self.horizon, self.max_window, self.ring_size = sizes.horizon, sizes.max_window, sizes.ring_size
        self.sized_for = sizes.drafts
        tables = shared.get(("layout", sizes.pad, str(device)))
        if tables is None or tables[0] is not lay:  # (made once for a decoder's layout: a dozen operations)
            forced_at = torch.cat([lay.forced, torch.full((sizes.pad,), -1, dtype=torch.long)]).to(device)
            free = torch.where(forced_at < 0, torch.arange(forced_at.numel(), device=device), -1)
            tables = shared[("layout", sizes.pad, str(device))] = (
                lay, forced_at,
                torch.cummax(free, 0).values,  # nearest free position <= t
                int(torch.nonzero(lay.forced < 0)[0]), torch.nonzero(lay.image_tokens).flatten().to(device),
                bool((lay.forced >= 0).any()),  # some positions hold a forced token
                int(torch.nonzero(lay.image_tokens)[0]))
        _, self.forced_at, self.prev_free, self.first_free, self.image_ids, self.any_forced, image_id = tables
        self.seq = torch.full((self.batch, self.length + sizes.pad), image_id, device=device)  # pad: any image token
        self.scratch = self.length + sizes.pad - 1  # a seq column that absorbs masked writes; never read
        self.ring = (torch.zeros(self.batch, self.ring_size + 1, adapter.vocab_size, device=device)
                     if self.drafts else None)
        self.geometry = geometry
        (self.n_cached, self.n_committed, self.draft_end, self.informed_end, self.produced,
         self.verified) = torch.zeros(6, self.batch, dtype=torch.long, device=device)  # (rows of one: no copies)
        self.drafts_redrawn = torch.zeros(self.batch, self.max_window, dtype=torch.long, device=device)
        self.drafts_kept = torch.zeros_like(self.drafts_redrawn)
        self.source_state: dict = {}
        self.fixed: torch.Tensor | None = None  # row-parallel drafting's fixed tokens (rows.py), -1 elsewhere
        self.row_drafted: torch.Tensor | None = None  # and where it drafted
        self.host_cached = [0] * self.batch
        self.host_committed = [0] * self.batch
        self.host_draft_end = [0] * self.batch
        self.aranges: dict[int, torch.Tensor] = shared.setdefault("aranges", {})  # arange(n) by n
        self.buffers: dict[str, torch.Tensor] = {}
        self.buffer_views: dict[tuple, torch.Tensor] = {}  # (name, rows, batch) -> its view (buffer)
        self.row_offsets: dict[int, torch.Tensor] = {}  # b * rows, by ring size (_flat)
        self.vocab = adapter.vocab_size
        self.step = 0
        # AR: the first NaN step; the step on the device: its position
        self.bad_step, self.bad_pos = torch.full((2, self.batch), -1, dtype=torch.long, device=device)
        #: the verify step stays on the device (engine.py): the host_* lists are read every few
        #: steps only (then lower bounds of the lengths); a source must not need them exact
        self.device_step = False
        #: a batch of one on the host step with Jacobi drafts (engine.py): its lengths are host numbers and
        #: its position tensors views (span, count, first_rows)
        self.scalar = False
        self.window_passed: int | None = None  # (scalar) the row of the window's new token
        #: (scalar) whether that token is the row's draw (``samples`` of after_verify), and whether the draft
        #: source wrote it to seq with the new drafts (then the commit does not)
        self.window_new_drawn = self.window_new_written = False
        #: (scalar) the host numbers of ``n_committed``, ``informed_end``, ``produced`` and ``verified``, and
        #: the drafts redrawn and kept (``drafts_redrawn``'s and ``drafts_kept``'s parts: draft_stability)
        self.scalar_counts: dict[str, int] = {}
        self._tables: _Tables | None = None  # (scalar) what its views are cut from, made on first use
        self._forced_host: list[bool] | None = None  # forced positions on the host, made on first use
        self.verified_since_skip = 0
        self.window_positions = self.window_targets = self.window_slots = self.window_had = None
        self.window_drafts = self.window_rows = self.extend_span = self.window_last_cdf = None
        # a skip due next whose extension is drawn early (engine._extend_on_host): each sample's position
        # from which the numbers are the skip step's, and that step
        self.extend_split: tuple[list[int], int] | None = None
        self.settled = True  # the window's width stays for the rest of the decode (not while a trial runs)
        self.window_near_end = True
        self.window_width = None
        self.block: rng.UniformBlock | None = None  # random numbers for the next few steps (uniform)
        # the streams a block holds: the window's and the extensions', and similarity skipping's paths (its
        # plan reads them every verify step: three hashes of a window's positions, some fifty small operations)
        self.block_lanes = dict(self.BLOCK_LANES)
        if sizes.skips and config.verify_schedule == "similarity":
            self.block_lanes.update({rng.PATHS + i: 1 for i in range(config.skip_paths - 1)})
        # (kind, committed before, committed after, rejected, position of the drawn
        # token) per step: origins, histograms and counts are rebuilt from it once
        # decoding ends (report.build_reports)
        self.log: list[tuple] = []
        # images that left the batch: the batch's rows by original image, the seeds of the whole batch, the
        # rows put aside (image -> (tokens, drafts redrawn, drafts kept)), the log of each earlier batch
        self.origin = list(range(self.batch))
        self.origin_seeds = list(seeds)
        self.left: dict[int, tuple] = {}
        self.log_parts: list[tuple] = []

    def note_bad(self, first_bad: torch.Tensor, position: torch.Tensor) -> None:
        """The step on the device: each image's first step whose distribution was not one (``first_bad``
        ``>= 0`` where this step had one, at ``position``), kept until the host reads it."""
        newly = (self.bad_step < 0) & (first_bad >= 0)
        self.bad_pos = torch.where(newly, position, self.bad_pos)
        self.bad_step = torch.where(newly, self.step, self.bad_step)

    # -- images leaving the batch (engine.py, LEAVE_SHARE) ----------------------------------------
    #: per-sample tensors, indexed by the batch's rows
    PER_SAMPLE = ("seq", "ring", "keys", "n_cached", "n_committed", "draft_end", "informed_end", "produced",
                  "verified", "drafts_redrawn", "drafts_kept", "bad_step", "bad_pos", "fixed", "row_drafted")
    #: what an image that leaves puts aside, by name, for the whole batch again (rejoin): the report reads them
    SET_ASIDE = ("drafts_redrawn", "drafts_kept", "fixed", "row_drafted")

    def leave(self, keep: list[int]) -> None:
        """Only the rows ``keep`` (a sorted list) stay in the batch: the others' tokens and counts
        are put aside, the step log so far is kept by original image, and every per-sample tensor
        and host list is narrowed (reusable buffers start again at the new size)."""
        B0 = len(self.origin_seeds)
        left = [b for b in range(self.batch) if b not in keep]
        for b in left:
            self.left[self.origin[b]] = (self.seq[b, : self.length].clone(),
                                         {n: getattr(self, n)[b].clone() for n in self.SET_ASIDE
                                          if getattr(self, n) is not None})
        self.log_parts.append((torch.tensor(self.origin, device=self.seq.device), B0, self.log))
        self.log = []
        idx = torch.tensor(keep, device=self.seq.device)
        for name in self.PER_SAMPLE:  # the large ones in place; the step log holds the small ones
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, narrowed(t, keep) if name in ("seq", "ring") else t.index_select(0, idx))
        self.origin = [self.origin[b] for b in keep]
        self.seeds = [self.seeds[b] for b in keep]
        for name in ("host_cached", "host_committed", "host_draft_end"):
            setattr(self, name, [getattr(self, name)[b] for b in keep])
        self.batch = len(keep)
        self.block = None
        self.source_state = {}  # a draft source's own tensors start again from the state
        self.batch_idx = torch.arange(self.batch, device=self.seq.device).unsqueeze(1)
        self.row_offsets = {}  # (the reusable buffers serve a narrower batch as they are)

    def last_kind(self) -> str:
        """The last step's kind in the step log ("P", "V", "S"), across images leaving."""
        return (self.log or self.log_parts[-1][2])[-1][0]

    def whole_seq(self) -> torch.Tensor:
        """``seq`` of the whole batch in its first order: the rows still decoding, and the tokens of
        the images that left (past their stream any image token, as ``seq`` starts)."""
        if not self.left:
            return self.seq
        full = self.image_ids[0].repeat(len(self.origin_seeds), self.seq.shape[1])
        full[torch.tensor(self.origin, device=self.seq.device)] = self.seq
        for b, (seq, _) in self.left.items():
            full[b, : self.length] = seq
        return full

    def rejoin(self) -> None:
        """The whole batch again, in its first order, once decoding ends (for the report and the
        result): the rows that left and the step log of every part."""
        if not self.log_parts:
            return
        T, B0 = self.length, len(self.origin_seeds)
        device = self.seq.device
        self.log_parts.append((torch.tensor(self.origin, device=device), B0, self.log))
        self.log = [entry for rows, _, part in self.log_parts for entry in _widen(part, rows, B0, T)]
        self.log_parts = []
        self.seq = self.whole_seq()
        rows = torch.tensor(self.origin, device=device)
        for name in self.SET_ASIDE:
            now = getattr(self, name)
            if now is None:
                continue
            full = now.new_empty((B0,) + tuple(now.shape[1:]))
            full[rows] = now
            for b, (_, aside) in self.left.items():
                full[b] = aside[name]
            setattr(self, name, full)
        self.origin, self.seeds, self.batch = list(range(B0)), list(self.origin_seeds), B0
        self.left = {}

    def set_drafts(self, drafts: int) -> None:
        """Draft ``drafts`` tokens a window from the next step on (the window on auto tries
        widths in a decode, window.Trial); the state stays sized for the width it was made
        for, the widest.  0 drafts: a forward of one token verifies nothing, the verify
        step's plain AR step."""
        if not self.drafting or not 0 <= drafts <= self.sized_for:
            raise ValueError(f"a state made for {self.sized_for} drafts cannot run {drafts}")
        self.drafts = drafts
        self.max_commit = drafts + 1 if self.skips else 0
        self.horizon = drafts + self.max_commit

    #: steps a block of random numbers serves (rng.UniformBlock), and the streams it holds.  At a window's
    #: widths a block costs its operations, not its size: 16 steps take as long to hash as 8 (some 0.3 ms on
    #: this project's CPU after a forward), and are hashed half as often
    BLOCK_STEPS = 16
    BLOCK_LANES = {rng.VERIFY: 2, rng.INIT: 1}
    #: the most hashes a block may take (streams x samples x steps x positions).  A wide batch's block
    #: costs its size (some 28 ns a hash here): at the exactness checks' batch of 30 000 a block took 0.69 s
    #: where the steps it served hash their own in 3 ms each.  The product's batches stay under it (the
    #: embedded model's batch of 32 decoded faster with its blocks than hashing each step's numbers)
    BLOCK_HASHES = 1 << 20

    def uniform(self, stream: int, positions: torch.Tensor, lanes: int = 1,
                upto: list[int] | None = None, first: list[int] | None = None,
                step: int | None = None) -> torch.Tensor:
        """``rng.uniform(keys, step, stream, positions, lanes)`` for this step (or ``step``).  With ``upto``
        (per sample, a bound on the positions read, on the host) the numbers come from a block
        hashed for several steps at once (``rng.UniformBlock``): the same numbers, fewer
        operations.  Positions ``[B, N]`` at or after the sample's cached prefix; ``first``: the
        positions are ``first[b] + arange(N)`` (then a view of the block where it can be one)."""
        step = self.step if step is None else step
        if upto is None or self.device_step or positions.dim() != 2 or stream not in self.block_lanes:
            return rng.uniform(self.keys, step, stream, positions, lanes)
        block = self.block
        if block is None or not block.covers(step, stream, lanes, upto):
            # wide enough for the block's steps: each caches at most a window, and drafts reach a horizon past
            # it; a step has so far moved some tokens on average, and a block that falls short is hashed anew
            reach = self.drafts + 2
            if step > 1:
                reach = min(reach, 2 * -(-max(self.host_committed) // (step - 1)) + 2)
            width = max(u - c for u, c in zip(upto, self.host_cached)) + self.BLOCK_STEPS * reach
            # (no position past the stream is read: a short stream's block stops there)
            width = min(width, max(max(upto), self.seq.shape[1]) - min(self.host_cached))
            if len(self.block_lanes) * len(upto) * self.BLOCK_STEPS * width > self.BLOCK_HASHES:
                return rng.uniform(self.keys, step, stream, positions, lanes)
            block = self.block = rng.UniformBlock(self.keys, step, self.BLOCK_STEPS, list(self.host_cached),
                                                  width, self.block_lanes)
        if first is not None:
            offsets = {f - lo for f, lo in zip(first, block.lo)}
            n = positions.shape[1]
            if len(offsets) == 1 and min(offsets) + n <= block.width:  # every sample's run starts as far in
                return block.run(step, stream, offsets.pop(), n)
        return block.take(step, stream, positions)

    def committed_bound(self, past: int = 0) -> list[int] | None:
        """On the host step, from a verify step on: a bound on each sample's committed length plus ``past``
        (a window commits at most its width + 1 past its base, which the host knows before it reads the
        lengths); None on the step on the device, whose host lengths may lag, or before a window."""
        if self.device_step or self.window_positions is None:
            return None
        reach = self.window_positions.shape[1] + 1 + past
        return [c + reach for c in self.host_cached]

    def extend_uniform(self, positions: torch.Tensor) -> torch.Tensor:
        """The ``rng.INIT`` numbers of an extension's ``positions`` ``[B, W]`` (a draft source's ``extend``):
        this step's, and past ``extend_split``'s positions its step's (a due skip's extension drawn early
        draws what the skip would have)."""
        starts, stops = self.extend_span if self.extend_span is not None else (None, None)
        u = self.uniform(rng.INIT, positions, 1, upto=stops, first=starts)
        if self.extend_split is None:
            return u
        at, step = self.extend_split
        later = self.uniform(rng.INIT, positions, 1, upto=stops, first=starts, step=step)
        if self.scalar and starts is not None:  # the positions are starts[0] + arange(W)
            k = min(max(at[0] - starts[0], 0), positions.shape[1])
            return torch.cat([u[:, :k], later[:, k:]], 1)
        return torch.where(positions < torch.tensor(at, device=positions.device).unsqueeze(1), u, later)

    def buffer(self, name: str, rows: int) -> torch.Tensor:
        """A reusable ``[B, rows, V]`` float32 buffer (CPU allocations of this size
        cost page faults on every step).  Its views are kept too: a step asks for some ten, and
        making one is two tensor operations."""
        key = (name, rows, self.batch)
        view = self.buffer_views.get(key)
        if view is not None:
            return view
        n = self.batch * rows * self.vocab
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < n:  # a window's rows at least (a draft tree's may be more), one row as one
            least = self.batch * self.max_window * self.vocab if rows > 1 else n
            buf = self.buffers[name] = torch.empty(max(n, least), device=self.seq.device)
            self.buffer_views = {k: v for k, v in self.buffer_views.items() if k[0] != name}
        view = self.buffer_views[key] = buf[:n].view(self.batch, rows, self.vocab)
        return view

    # Whole rows of a ring go through index_select / index_copy_ on its flat view,
    # not ``ring[batch_idx, slots]``: advanced indexing of rows is parallelised by
    # OpenMP on the CPU, and on a busy machine one such call can wait milliseconds
    # for a descheduled thread (measured: 16 us typical, up to 8 ms with another
    # job on the cores); these stay on one thread at a window's sizes.

    def rows(self, ring: torch.Tensor, slots: torch.Tensor, name: str,
             flat: torch.Tensor | None = None) -> torch.Tensor:
        """``ring[b, slots[b]]`` for every sample, ``[B, n, V]``, into the reusable
        buffer ``name`` (one copy, no allocation); ``flat``: the slots' :meth:`ring_rows`, if known."""
        B, R, V = ring.shape
        out = self.buffer(name, slots.shape[1])
        flat = self.ring_rows(ring, slots) if flat is None else flat
        torch.index_select(ring.view(B * R, V), 0, flat.view(-1), out=out.view(-1, V))
        return out

    def put_rows(self, ring: torch.Tensor, slots: torch.Tensor, values: torch.Tensor,
                 flat: torch.Tensor | None = None) -> None:
        """``ring[b, slots[b]] = values[b]`` (``values`` ``[B, n, V]``, or ``[B, 1, V]``
        for every slot); slots must be distinct but for the scratch slot."""
        B, R, V = ring.shape
        flat = self.ring_rows(ring, slots) if flat is None else flat
        ring.view(B * R, V).index_copy_(0, flat.view(-1), values.expand(B, slots.shape[1], V).reshape(-1, V))

    def fill_rows(self, ring: torch.Tensor, slots: torch.Tensor, value: float) -> None:
        """``ring[b, slots[b]] = value``."""
        B, R, V = ring.shape
        ring.view(B * R, V).index_fill_(0, self._flat(ring, slots), value)

    def ring_rows(self, ring: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """The rows of ``slots`` ``[B, n]`` in ``ring`` viewed as ``[B * R, V]``."""
        if self.batch == 1:  # (the offset of a batch of one is 0)
            return slots
        offset = self.row_offsets.get(ring.shape[1])
        if offset is None:
            offset = self.row_offsets[ring.shape[1]] = self.batch_idx * ring.shape[1]
        return offset + slots

    # -- a batch of one on the host step (``scalar``, engine.py) -----------------------------------
    # The host knows its lengths exactly, so positions, slots, lengths and row masks are cut from kept
    # tables (a view: no kernel) instead of computed by small operations, each of which costs several
    # microseconds after a forward on the CPU.  Nothing writes into these views.

    def _host_tables(self) -> "_Tables":
        t = self._tables
        if t is None:  # (a decoder's decodes share them: state.shared)
            m = self.max_window + 2
            key = ("host", self.seq.shape[1] + m, m, self.ring_size, self.vocab, str(self.seq.device))
            t = self._tables = self.shared.get(key)
            if t is None:
                pos = torch.arange(self.seq.shape[1] + m, device=self.seq.device)
                steps = (torch.arange(2 * m, device=pos.device) < m).unsqueeze(0)  # m True, then m False
                slots = (pos % self.ring_size).unsqueeze(0)
                t = self._tables = self.shared[key] = _Tables(pos, pos.unsqueeze(0), slots, slots * self.vocab,
                                                              steps, m)
        return t

    def span(self, start: int, n: int) -> torch.Tensor:
        """Positions ``start .. start + n - 1`` as ``[1, n]`` (a batch of one)."""
        return self._host_tables().rows[:, start:start + n]

    def span_slots(self, start: int, n: int) -> torch.Tensor:
        """Their ring slots, ``[1, n]``."""
        return self._host_tables().slots[:, start:start + n]

    def span_starts(self, start: int, n: int) -> torch.Tensor:
        """Where their rows start in the ring viewed flat (``DraftDistributions.starts``), ``[1, n]``."""
        return self._host_tables().starts[:, start:start + n]

    def count(self, value: int) -> torch.Tensor:
        """A length ``[1]`` (a batch of one's ``n_cached``, ``n_committed``, ...)."""
        return self._host_tables().positions[value:value + 1]

    def first_rows(self, k: int, n: int) -> torch.Tensor:
        """``[1, n]`` bools: rows ``0 .. k - 1`` True, the others False (``k`` clipped to ``[0, n]``)."""
        t = self._host_tables()
        at = t.half - min(max(k, 0), n)
        return t.steps[:, at:at + n]

    def ring_span(self, ring: torch.Tensor, start: int, n: int) -> list[torch.Tensor]:
        """A batch of one's ``ring`` rows of positions ``start .. start + n - 1`` (``n`` at most the ring's
        size): one slice of it, or two where the positions wrap around."""
        a = start % self.ring_size
        if a + n <= self.ring_size:
            return [ring[0, a:a + n]]
        return [ring[0, a:self.ring_size], ring[0, :a + n - self.ring_size]]

    def span_rows(self, ring: torch.Tensor, start: int, n: int, name: str, view: bool = False) -> torch.Tensor:
        """``rows`` of a batch of one's positions ``start .. start + n - 1``, by slices (``view``: the ring's own
        rows where one slice holds them, for a reader done before they are written)."""
        parts = self.ring_span(ring, start, n)
        if view and len(parts) == 1:
            return parts[0].unsqueeze(0)
        out = self.buffer(name, n)
        if len(parts) == 1:
            out[0].copy_(parts[0])
        else:
            torch.cat(parts, out=out[0])
        return out

    def put_span(self, ring: torch.Tensor, start: int, n: int, values: torch.Tensor) -> None:
        """``put_rows`` at a batch of one's positions ``start .. start + n - 1`` (``values`` ``[1, n, V]``, or
        ``[1, 1, V]`` for every one), by slices."""
        parts = self.ring_span(ring, start, n)
        if len(parts) == 1:
            parts[0].copy_(values[0])
        else:
            k = parts[0].shape[0]
            parts[0].copy_(values[0, :k] if values.shape[1] > 1 else values[0])
            parts[1].copy_(values[0, k:] if values.shape[1] > 1 else values[0])

    def forced_host(self) -> list[bool]:
        """Whether each position holds a forced token, on the host."""
        f = self._forced_host
        if f is None:
            f = self._forced_host = (self.forced_at >= 0).tolist()
        return f

    def _flat(self, ring: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return self.ring_rows(ring, slots).view(-1)

    def arange(self, n: int) -> torch.Tensor:
        if n not in self.aranges:
            self.aranges[n] = torch.arange(n, device=self.seq.device)
        return self.aranges[n]

    def commit_lengths(self) -> torch.Tensor:
        """VVS truncation: ``min(informed tail, floor(mean accepted length))``."""
        if self.scalar:  # (the same numbers, on the host)
            c = self.scalar_counts
            committed = c["committed"]
            m = min(c["informed_end"] - committed, c["produced"] // max(c["verified"], 1), self.length - committed)
            return self.count(max(m, 0))
        mal = torch.div(self.produced, self.verified.clamp(min=1), rounding_mode="floor")
        tail = self.informed_end - self.n_committed
        room = self.length - self.n_committed
        return torch.minimum(torch.minimum(tail, mal), room).clamp(min=0)

    def draft_stability(self) -> list[float]:
        """Each sample's share of redrawn drafts that kept their token (a batch of one on the host step counts
        both on the host, ``scalar_counts["redrawn"]`` and ``["kept"]``)."""
        redrawn = self.drafts_redrawn.sum(-1) + self.scalar_counts.get("redrawn", 0)
        kept = self.drafts_kept.sum(-1) + self.scalar_counts.get("kept", 0)
        return (kept / redrawn.clamp(min=1)).tolist()

    def nbytes(self) -> int:
        """Bytes of the engine's own tensors (memory reports on the CPU)."""
        tensors = [self.seq, self.ring] + list(self.buffers.values())
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class _Tables(NamedTuple):
    """What a batch of one's views are cut from (``DecodeState.span`` and the rest)."""

    positions: torch.Tensor  # arange over the stream and past it
    rows: torch.Tensor  # the same, [1, n]
    slots: torch.Tensor  # their ring slots, [1, n]
    starts: torch.Tensor  # where the slots' rows start in a ring of the vocabulary's width viewed flat, [1, n]
    steps: torch.Tensor  # `half` True, then `half` False, [1, 2 * half]
    half: int


def _widen(log: list[tuple], rows: torch.Tensor, B0: int, T: int) -> list[tuple]:
    """Step log entries of a narrowed batch (its rows the images ``rows``) as entries of the whole
    batch: the images outside it committed nothing (from ``T`` to ``T``) and drew nothing."""
    def full(t, fill):
        if t is None:
            return None
        out = torch.full((B0,), fill, dtype=t.dtype, device=t.device)
        out[rows] = t
        return out

    return [(kind, full(before, T), full(after, T), full(flag, False), full(new, T))
            for kind, before, after, flag, new in log]


def kept(lengths, keep: list[int]):
    """Per-sample ``lengths`` (a host list or a device tensor) of the images ``keep`` only."""
    return lengths[keep] if isinstance(lengths, torch.Tensor) else [lengths[b] for b in keep]


def narrowed(t: torch.Tensor, keep: list[int], dim: int = 0) -> torch.Tensor:
    """``t`` with only the slices ``keep`` (sorted) along ``dim``, moved to its first ones in place: a view
    of the same storage, no allocation (a ring of distributions holds batch x slots x vocabulary floats:
    216 MB for Emu3's 32,768 image ids at batch 16 and window 24),
    and only the slices after the first one dropped are copied."""
    for i, k in enumerate(keep):
        if k != i:  # k > i: slice k is read before anything is written to it
            t.select(dim, i).copy_(t.select(dim, k))
    return t.narrow(dim, 0, len(keep))
