"""Draft sources: where the tokens a forward pass verifies come from.

A draft source works on the :class:`~.state.DecodeState` (``state.py`` documents
what it may read and write) and implements two calls:

* ``after_verify(state, probs, samples, first_new)`` once a forward has been
  judged: ``probs`` ``[B, L, V]`` are the target rows of the window (row ``j`` for
  position ``state.window_positions[:, j] + 1``), ``samples`` ``[B, L]`` one draw
  per row, and rows after ``first_new`` ``[B]`` hold positions still to be
  drafted.  What a later row's draw is depends on the source's ``redraw``
  attribute: ``"independent"`` (the default) a fresh draw from the row;
  ``"coupled"`` where the position holds a draft ``x`` drawn from ``q``, that
  draft kept with probability ``min(1, p(x) / q(x))`` or else a draw from
  ``norm(max(0, p - q))`` (the engine makes these with the row's own verification
  uniforms, in the pass that resamples the first rejection);
* ``extend(state, start, stop, width)`` to put fresh drafts at positions
  ``[start[b], stop[b])`` of each sample (``width >= max(stop - start)``).

Drafts live in ``state.seq`` with their ``q`` row in ``state.ring`` (slot
``position % state.ring_size``).  The source keeps ``state.draft_end`` (drafts
exist before it; ``extend`` is called from there) and ``state.informed_end``
(drafts before it came from a model and may be committed unverified by VVS)
up to date, on the device and, for ``draft_end``, in ``state.host_draft_end``
(the engine updates both after ``extend``).

:class:`JacobiDrafts` is SJD's self-drafting: the unverified tail of a pass,
re-sampled from that pass, becomes the next drafts with the pass's rows as their
``q``; new positions get a :data:`DRAFT_INITS` guess.
:class:`~.model_drafts.ModelDrafts` runs a draft model in ``extend`` and writes
its own ``q`` rows.  A source that runs a model may also have ``check(target)``
(raise :class:`~.config.ConfigError` when it cannot draft for the target; called
when the decoder is built), ``start(state, conditions, negatives, guided,
config, timer)`` (after the target's prefill; time its model calls with
``timer.model("drafter")``), ``finish()`` (after decoding, also on errors) and
``name`` (shown in reports).
"""
from __future__ import annotations

from typing import Protocol

import torch

from . import rng
from .state import DecodeState


class DraftSource(Protocol):
    """What the engine needs from a draft source (see the module docstring)."""

    redraw: str  # "independent" or "coupled": the draws ``after_verify`` gets for later rows

    def after_verify(self, st: DecodeState, probs: torch.Tensor, samples: torch.Tensor,
                     first_new: torch.Tensor) -> None: ...

    def extend(self, st: DecodeState, start: torch.Tensor, stop: torch.Tensor, width: int) -> None: ...


COUPLINGS = ("none", "maximal", "gumbel")


class JacobiDrafts:
    """Speculative Jacobi drafting (Teng et al., ICLR 2025, sec. 4), optionally with
    coupled re-drafting (MC-SJD: So, Kook, Jang, Park, arXiv 2510.24211).

    Initialisations for new window positions (sec. 4.2):

    * ``random``: uniform over image tokens (the paper's default);
    * ``repeat-left`` / ``repeat-above``: copy the last known token to the left /
      the token one row up (the nearest row above that is already known);
    * ``sample-left`` / ``sample-above``: sample from the distribution that
      token was drawn from (the authors' evaluation default is sample-left).

    Copied tokens carry a one-hot ``q``: the choice is fixed before the target
    is scored, so ``p(x) / 1`` is the exact acceptance (sampling without the
    copy's own probability would not be).  Sampled ones carry the source row.
    Structural positions take their forced token.  Where no source exists (the
    first row for ``*-above``) the draft is random.

    After a pass, every position after the first unverified one gets a new draft
    from the pass's row ``p_new`` for it, which becomes the draft's ``q``.  How it
    is drawn (``coupling``):

    * ``none``: independently (SJD as published), so a draft far ahead changes at
      almost every pass even where ``p_new`` hardly moved;
    * ``maximal``: coupled with the position's previous draft ``x`` (drawn from
      ``q_old``): keep ``x`` with probability ``min(1, p_new(x) / q_old(x))``, else
      draw from ``norm(max(0, p_new - q_old))``.  The new draft is exactly
      ``p_new``-distributed and equal to ``x`` as often as any coupling allows
      (``1 - TV(p_new, q_old)``);
    * ``gumbel``: ``argmax_i p_new(i) / e_i`` with exponential noise ``e`` fixed per
      (image, position): the Gumbel-max sample of ``p_new``, so drafts agree
      across passes whenever the argmax does (at least ``(1 - TV) / (1 + TV)``).

    Either way the next verification compares the draft with ``q = p_new``, the
    distribution it was drawn from, so acceptance stays exact.  ``maximal`` is
    what exact speculative sampling does to a draft anyway (keep with the ratio,
    else the residual), so this class asks the engine for it (``redraw =
    "coupled"``) and the engine applies it to every row from the first rejection
    on, with the rows' verification uniforms, which nothing else reads after the
    first rejection (MC-SJD's merged form).  Under exact acceptance the
    verifier's test at those rows is then the coupling test and one residual
    pass over the vocabulary serves the first rejection and the redrawn drafts;
    under GSD and LANTERN the coupling keeps the exact ratio (the drafts stay
    ``p_new``-distributed) and the first rejection takes the rule's residual.  Where we depart
    from the authors' code: their Lumina-mGPT and Janus schedulers keep ``q_old``
    as the ``q`` of a kept draft, which biases the output (the kept draft is
    ``p_new``-distributed); their Cosmos sampler, and this class, use ``p_new``.
    Positions drafted for the first time by a pass (the window's last row) draw
    independently under ``maximal`` (there is no previous draft to couple with)
    and with their fixed noise under ``gumbel``.  The gumbel noise is counter-based
    (``rng.exponential``: a pure function of the image's seed, the position and the
    token), so an image's drafts do not depend on its batch and the step on the
    device computes the window's noise where the host step keeps a ring of it,
    filled position by position; the paper's reference draws it from a table
    refilled each step.  ``st.drafts_redrawn`` / ``st.drafts_kept`` count
    re-drafted positions and those whose draft survived, by window row (the report's
    draft stability).  Under ``maximal`` only the positions that lose their draft build
    and sample a residual (their rows are picked with ``nonzero``: on CUDA one
    more host sync per pass, in exchange for no pass over the vocabulary at
    positions that keep theirs).
    """

    def __init__(self, init: str, coupling: str = "none"):
        self.init, self.coupling = init, coupling
        self.redraw = "coupled" if coupling == "maximal" else "independent"

    def after_verify(self, st, probs, samples, first_new):
        pos = st.window_targets  # the positions the window's rows predict
        L = pos.shape[1]
        if st.scalar:
            return self._after_verify_on_host(st, probs, samples, L)
        tail = st.arange(L) > first_new.unsqueeze(1)
        inside = None if st.window_width is None else st.arange(L) < st.window_width
        if inside is not None:  # (rows past the window's width on the device: not the window's)
            tail &= inside
        old = st.seq.gather(1, pos) if st.window_drafts is None else st.window_drafts
        had = st.window_had  # holds a draft from before this pass
        new = self._gumbel(st, probs, pos, L) if self.coupling == "gumbel" else samples
        redrawn = tail & had
        if st.window_near_end:  # (a finished image's window looks past its end)
            redrawn &= pos < st.length
        st.drafts_redrawn[:, :L].add_(redrawn)  # (add_ on the view: `+=` on a slice copies it back too)
        st.drafts_kept[:, :L].add_(redrawn & (new == old))
        st.seq.scatter_(1, pos, torch.where(tail, new, old))
        # the pass's rows become the q of the new drafts; committed positions keep
        # theirs too: sample-left/above draw from them
        if inside is None:
            st.put_rows(st.ring, st.window_slots, probs, st.window_rows)
            end = pos[:, -1] + 1
            # where the rows end on the host, and the last one's distribution: an extension from there
            # draws from it (``extend``: the ring's copy, read without a copy of its own)
            st.source_state["edge"] = ([c + L + 1 for c in st.host_cached], probs[:, L - 1:], None)
        else:
            st.put_rows(st.ring, torch.where(inside, st.window_slots, st.ring_size), probs)
            end = pos[:, 0] + st.window_width
        st.draft_end = torch.maximum(st.draft_end, end)
        st.informed_end = torch.maximum(st.informed_end, end)
        st.host_draft_end = [max(d, c + L + 1) for d, c in zip(st.host_draft_end, st.host_cached)]

    def _after_verify_on_host(self, st, probs, samples, L):
        """``after_verify`` for a batch of one on the host step (``st.scalar``): the same drafts, counts and
        rows, the rows' spans from host numbers (``st.window_passed``: the row of the new token)."""
        pos, c0, k = st.window_targets, st.host_cached[0], st.window_passed
        old = st.seq.gather(1, pos) if st.window_drafts is None else st.window_drafts
        new = self._gumbel(st, probs, pos, L) if self.coupling == "gumbel" else samples
        # re-drafted: the rows after k that held a draft before this pass, inside the image
        end = min(L, st.host_draft_end[0] - c0 - 1, st.length - c0 - 1 if st.window_near_end else L)
        if end > k + 1:  # (counted on the host: DecodeState.draft_stability; old is read before seq is written)
            counts = st.scalar_counts
            counts["redrawn"] += end - k - 1
            counts["kept"] += sum(a == b for a, b in zip(new[0, k + 1:end].tolist(), old[0, k + 1:end].tolist()))
        # rows up to k keep their tokens; row k's position takes the new token, written here with the new drafts
        # where it is this pass's draw (st.window_new_drawn), by the engine's commit otherwise
        first = k if st.window_new_drawn and new is samples else k + 1
        st.window_new_written = first == k
        if first < L:
            st.seq[:, c0 + first + 1:c0 + L + 1] = new[:, first:]
        st.put_span(st.ring, c0 + 1, L, probs)
        end = c0 + L + 1
        st.source_state["edge"] = ([end], probs[:, L - 1:], st.window_last_cdf)
        st.host_draft_end = [max(st.host_draft_end[0], end)]
        st.draft_end = st.host_draft_end[0]  # (host numbers: views when read, state.py)
        counts = st.scalar_counts
        counts["informed_end"] = max(counts["informed_end"], end)
        st.informed_end = counts["informed_end"]

    @staticmethod
    def _gumbel(st, probs, pos, L):
        V = probs.shape[-1]
        if st.device_step:  # the window's noise, computed (no host lengths to fill a ring by)
            e = rng.exponential(st.keys, rng.COUPLE + 1, pos, V)
        else:  # a ring of noise by position, like q's, filled in position order as the window moves
            noise = st.source_state.get("gumbel")
            if noise is None:  # (anew after images left the batch: positions past the cache are read)
                noise = st.source_state["gumbel"] = {
                    "e": torch.empty(st.batch, st.ring_size + 1, V, device=probs.device),
                    "end": [c + 1 for c in st.host_cached]}
            ends, upto = noise["end"], [c + L + 1 for c in st.host_cached]  # the window predicts c + 1 .. c + L
            n = max(u - e for u, e in zip(upto, ends))
            if n > 0:  # every image's new positions at once, those past its own masked to the scratch slot
                span = torch.tensor([ends, upto], device=probs.device).unsqueeze(2)  # [2, B, 1]: one copy
                fresh = span[0] + st.arange(n)
                slots = torch.where(fresh < span[1], fresh % st.ring_size, st.ring_size)
                st.put_rows(noise["e"], slots, rng.exponential(st.keys, rng.COUPLE + 1, fresh, V))
                noise["end"] = [max(u, e) for u, e in zip(upto, ends)]
            e = st.rows(noise["e"], pos % st.ring_size, "noise")
        return torch.div(probs, e, out=e).argmax(-1)

    def extend(self, st, start: torch.Tensor, stop: torch.Tensor, width: int):
        """Fresh drafts at positions ``[start[b], stop[b])``; writes past a sample's
        ``stop`` go to scratch storage nothing reads.  A batch of one on the host step (``st.scalar``) gives
        ``start`` and ``stop`` as host numbers, made tensors only where read."""
        span = st.extend_span  # on the host step, start and stop as the host has them
        whole = span is not None and all(e - d == width for d, e in zip(*span))  # no sample stops short
        tensor = st.count if type(start) is int else (lambda t: t)  # (a batch of one's numbers, where read)
        if st.scalar and whole:  # (views: state.py)
            pos, slot, valid = st.span(span[0][0], width), st.span_slots(span[0][0], width), None
        else:
            pos = tensor(start).unsqueeze(1) + st.arange(width)
            valid = None if whole else pos < tensor(stop).unsqueeze(1)
            slot = pos % st.ring_size if whole else torch.where(valid, pos % st.ring_size, st.ring_size)
        u = st.extend_uniform(pos)
        edge = st.source_state.pop("edge", None)
        if self._left_is_free(st):
            # the common case, in few ops: every sample has a free position left of
            # ``start``, and its new positions all draw from that position's row
            # (with no forced position every position is free: prev_free[t] is t)
            cdf = None
            if edge is not None and not st.any_forced and span is not None and span[0] == edge[0]:
                rows = edge[1]  # ``start - 1`` is the last window row's position: its row, at hand
                cdf = edge[2]  # (and its sums, where the engine drew from it)
            elif st.scalar and not st.any_forced:  # (the ring's row itself: nothing writes it meanwhile)
                rows = st.ring_span(st.ring, span[0][0] - 1, 1)[0].unsqueeze(0)
            else:
                src = (st.prev_free[tensor(start) - 1] if st.any_forced else tensor(start) - 1).unsqueeze(1)
                rows = st.rows(st.ring, src % st.ring_size, "init")  # [B, 1, V]
            tok = rng.categorical(rows.squeeze(1), u) if cdf is None else rng.categorical_by_sums(*cdf, u)
            if st.scalar and valid is None:
                st.put_span(st.ring, span[0][0], width, rows)
            else:
                st.put_rows(st.ring, slot, rows)
        else:
            tok = self._initial(st, tensor(start), pos, u, slot)
        if st.any_forced:
            forced = st.forced_at[pos]
            tok = torch.where(forced >= 0, forced, tok)
        st.seq.scatter_(1, pos if whole else torch.where(valid, pos, st.scratch), tok)

    def extends_past_skip(self, st) -> bool:
        """Whether drafts past a due skip's commit, drawn before it with the skip step's numbers
        (``DecodeState.extend_uniform``), are the ones the skip's own extension would draw: where each
        new position's draft depends on its own numbers only, keyed by position and step (random), or on
        them and one row that both extensions read (sample-left past the first free position: the second's
        source is a copy of the first's).  Copies and rows above depend on where an extension starts."""
        return self.init == "random" or self._left_is_free(st)

    def _left_is_free(self, st) -> bool:
        """Sample-left drafts with a free position left of every sample's start (each extension draws all its
        positions from that one row)."""
        return self.init == "sample-left" and min(st.host_committed) > st.first_free

    def _initial(self, st, start, pos, u, slot):
        """Initial drafts for any init, and their q rows: the source row for sampled
        drafts, one-hot for the rest (and where a sample has no source yet)."""
        random = st.image_ids[(u * st.image_ids.numel()).long().clamp_(max=st.image_ids.numel() - 1)]
        if self.init.endswith("left"):
            src = st.prev_free[(start - 1).clamp(min=0)].unsqueeze(1).expand_as(pos)
        elif self.init.endswith("above"):
            stride = st.layout.row_stride
            src = pos - stride * torch.div(pos - start.unsqueeze(1) + stride, stride, rounding_mode="floor")
        else:
            st.fill_rows(st.ring, slot, 0.0)
            st.ring[st.batch_idx, slot, random] = 1.0
            return random
        has_src = src >= 0
        srcc = src.clamp(min=0)
        if self.init.startswith("sample"):
            rows = st.rows(st.ring, srcc % st.ring_size, "init")  # [B, n, V]
            tok = torch.where(has_src, rng.categorical(rows, u.unsqueeze(-1)).squeeze(-1), random)
            st.put_rows(st.ring, slot, torch.where(has_src.unsqueeze(-1), rows, 0.0))
            st.ring[st.batch_idx, slot, tok] = torch.where(has_src, st.ring[st.batch_idx, slot, tok], 1.0)
            return tok
        tok = torch.where(has_src, st.seq.gather(1, srcc), random)
        st.fill_rows(st.ring, slot, 0.0)
        st.ring[st.batch_idx, slot, tok] = 1.0
        return tok
