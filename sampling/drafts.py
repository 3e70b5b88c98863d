"""Draft sources: where the tokens a forward pass verifies come from.

A draft source works on the :class:`~.state.DecodeState` (``state.py`` documents
what it may read and write) and implements two calls:

* ``after_verify(state, probs, samples, first_new)`` once a forward has been
  judged: ``probs`` ``[B, L, V]`` are the target rows of the window (row ``j`` for
  position ``state.window_positions[:, j] + 1``), ``samples`` ``[B, L]`` one draw
  from each row, and rows after ``first_new`` ``[B]`` hold positions still to be
  drafted;
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
``q``; new positions get a :data:`DRAFT_INITS` guess.  A learned drafter (e.g.
LANTERN's EAGLE heads) is another class with the same two calls, running its
head in ``extend`` and writing its own ``q`` rows.
"""
from __future__ import annotations

from typing import Protocol

import torch

from . import rng
from .state import DecodeState


class DraftSource(Protocol):
    """What the engine needs from a draft source (see the module docstring)."""

    def after_verify(self, st: DecodeState, probs: torch.Tensor, samples: torch.Tensor,
                     first_new: torch.Tensor) -> None: ...

    def extend(self, st: DecodeState, start: torch.Tensor, stop: torch.Tensor, width: int) -> None: ...


class JacobiDrafts:
    """Speculative Jacobi drafting (Teng et al., ICLR 2025, sec. 4).

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
    """

    def __init__(self, init: str):
        self.init = init

    def after_verify(self, st, probs, samples, first_new):
        # Jacobi: positions after the first unverified one take this pass's
        # samples, and the pass's rows become their q.  Rows of committed
        # positions are kept too: sample-left/above draw from them.
        pos = st.window_positions + 1
        L = pos.shape[1]
        tail = st.arange(L).unsqueeze(0) > first_new.unsqueeze(1)
        st.seq.scatter_(1, pos, torch.where(tail, samples, st.seq.gather(1, pos)))
        st.ring[st.batch_idx, pos % st.ring_size] = probs
        # every position the pass predicted now holds a draft drawn from the pass
        end = pos[:, -1] + 1
        st.draft_end = torch.maximum(st.draft_end, end)
        st.informed_end = torch.maximum(st.informed_end, end)
        st.host_draft_end = [max(d, c + L + 1) for d, c in zip(st.host_draft_end, st.host_cached)]

    def extend(self, st, start: torch.Tensor, stop: torch.Tensor, width: int):
        """Fresh drafts at positions ``[start[b], stop[b])``; writes past a sample's
        ``stop`` go to scratch storage nothing reads."""
        pos = start.unsqueeze(1) + torch.arange(width, device=start.device)
        valid = pos < stop.unsqueeze(1)
        u = rng.uniform(st.keys, st.step, rng.INIT, pos)
        if self.init.endswith("left"):
            src = st.prev_free[(start - 1).clamp(min=0)].unsqueeze(1).expand_as(pos)
        elif self.init.endswith("above"):
            stride = st.layout.row_stride
            src = pos - stride * torch.div(pos - start.unsqueeze(1) + stride, stride, rounding_mode="floor")
        else:
            src = torch.full_like(pos, -1)
        random = st.image_ids[(u * st.image_ids.numel()).long().clamp_(max=st.image_ids.numel() - 1)]
        has_src = src >= 0
        srcc = src.clamp(min=0)
        if self.init.startswith("sample"):
            rows = st.ring[st.batch_idx, srcc % st.ring_size]  # [B, n, V]
            tok = rng.categorical(rows, u.unsqueeze(-1)).squeeze(-1)
        elif self.init.startswith("repeat"):
            tok = st.seq.gather(1, srcc)
        else:
            tok = random
        tok = torch.where(has_src, tok, random)
        forced = st.forced_at[pos]
        tok = torch.where(forced >= 0, forced, tok)
        st.seq.scatter_(1, torch.where(valid, pos, st.scratch), tok)
        # q rows: the source row for sampled drafts, one-hot for the rest
        slot = torch.where(valid, pos % st.ring_size, st.ring_size)
        if self.init.startswith("sample"):
            st.ring[st.batch_idx, slot] = torch.where(has_src.unsqueeze(-1), rows, 0.0)
        else:
            st.ring[st.batch_idx, slot] = 0.0
        onehot = ~has_src if self.init.startswith("sample") else torch.ones_like(has_src)
        st.ring[st.batch_idx, slot, tok] = torch.where(onehot, 1.0, st.ring[st.batch_idx, slot, tok])
