"""Chain drafts from a draft model: a smaller model of the same token grammar.

:class:`ModelDrafts` is a draft source (``drafts.py``) that runs a second
:class:`~.adapter.ImageAdapter` (a sibling: LlamaGen-B for LlamaGen-XL, Janus-Pro-1B
for Janus-Pro-7B, a smaller embedded model) autoregressively from the committed
prefix: after each verified forward the drafts past the first rejection are
dropped and the drafter proposes the next ``horizon`` tokens one by one, each
drawn from the drafter's own distribution ``q`` (processed like the target's:
guidance, grammar, temperature, top-k, top-p), which goes to the ring as the
draft's ``q``.  Acceptance is then the usual rule, so exact acceptance stays
lossless whatever the drafter is.

Cache: the drafter keeps its own KV cache (its adapter's), per sample; before
drafting it is rolled back to the position before the first draft, which is fed
again for its logits (one token more than strictly needed, so nothing has to
be kept between passes).  It feeds every draft but the last as it drafts, so
when a pass accepts every draft it has two tokens to catch up on (that draft
and the new one), otherwise one; the catch-up forward is padded to the longest
feed of the batch and the padding rolled back at once.

On the engine's step on the device (where the drafter's adapter rolls back on the device)
nothing is read on the host: the catch-up goes in two tokens wide (the most it can need),
and the drafter drafts as far as the engine's width for every sample (the horizon; after a
uniform skip, what a skip commits), those past a sample's stop masked (so near the image's
end it spends forwards the host step does not).

Random numbers: draft ``t`` of sample ``b`` uses ``rng.uniform(keys, step,
DRAFT, t)``, so an image's drafts do not depend on its batch.

Vocabulary: where the engine decodes over a compact vocabulary (``compact.py``) the drafter
runs behind the same one (its layout is the target's, so its compact ids are too): its
``q`` rows and the engine's are as narrow, and it reads and writes the engine's tokens.
"""
from __future__ import annotations

import torch

from . import rng
from .adapter import ImageAdapter
from .compact import CompactVocabulary, compact
from .config import ConfigError
from .processing import build_pipeline
from .state import DecodeState, kept


class ModelDrafts:
    """Draft source running ``adapter`` (whose token layout must be the target's)."""

    redraw = "independent"  # drafts past a rejection are replaced, not redrawn
    #: follows a compact vocabulary: the engine may wrap the target it checks
    follows_compact_vocabulary = True

    def __init__(self, adapter: ImageAdapter, name: str = "draft model"):
        self.adapter, self.name = adapter, name
        #: it drafts on the engine's step on the device where its adapter rolls back there
        self.drafts_on_device = getattr(adapter, "rolls_back_on_device", False)
        self.running = adapter  # what drafts run on: ``adapter``, or it behind the target's compact vocabulary
        self.timer = None

    # -- set-up --------------------------------------------------------------
    def check(self, target: ImageAdapter) -> None:
        """One clear error when this drafter cannot draft for ``target`` (the model's ids are
        compared); then the drafter follows ``target``'s vocabulary."""
        base = target.inner if isinstance(target, CompactVocabulary) else target
        a, b = self.adapter.layout, base.layout
        problems = []
        if self.adapter.vocab_size != base.vocab_size:
            problems.append(f"vocabulary {self.adapter.vocab_size} ids, the target's {base.vocab_size}")
        elif not torch.equal(a.image_tokens.cpu(), b.image_tokens.cpu()):
            problems.append("a different set of image token ids")
        if a.grid != b.grid or a.length != b.length or a.row_stride != b.row_stride:
            problems.append(f"a {a.grid[0]}x{a.grid[1]} grid in {a.length} positions, "
                            f"the target's {b.grid[0]}x{b.grid[1]} in {b.length}")
        elif not torch.equal(a.forced.cpu(), b.forced.cpu()):
            problems.append("structural tokens at other positions")
        if problems:
            raise ConfigError(f"the {self.name} cannot draft for this model: it has " + "; ".join(problems)
                              + " (a drafter needs the target's codebook and token layout)")
        if (base is not target) != isinstance(self.running, CompactVocabulary):  # the wrapper is kept
            self.running = compact(self.adapter) if base is not target else self.adapter

    def start(self, st: DecodeState, conditions, negatives, guided: bool, config, timer) -> None:
        """Prefill the drafter with the batch's conditions (called after the target's);
        its logits are processed with the target's settings (``config``)."""
        ad = self.running
        self.pipeline = build_pipeline(config, ad.layout, ad.guidance, ad.device,
                                       scales=ad.guidance_scales(config.cfg_scale))
        self.timer = timer
        with timer.model("drafter"):
            ad.prefill(conditions, negatives, guided)
        # stream positions in the drafter's cache, per sample (a device tensor on the step on the device)
        self.cached = torch.zeros_like(st.n_committed) if st.device_step else [0] * st.batch

    def sync_lengths(self) -> None:
        """The engine read its lengths: the drafter's cache may read its own too."""
        self.running.sync_lengths()

    def finish(self) -> None:
        self.running.release()

    @property
    def leaves(self) -> bool:
        """Whether finished images may leave the batch: the drafter's adapter drops samples too."""
        return getattr(self.running, "drops_samples", False)

    def keep_samples(self, keep: list[int]) -> None:
        """Only the images ``keep`` stay (engine.py, images leaving): the drafter's cache rows and lengths."""
        self.running.keep_samples(keep)
        self.cached = kept(self.cached, keep)

    # -- the draft source calls ------------------------------------------------
    def after_verify(self, st: DecodeState, probs, samples, first_new):
        # drafts after the new token were proposed from a rejected prefix: drop them
        st.draft_end = st.window_positions[:, 0] + first_new + 1
        st.host_draft_end = [0] * st.batch  # the engine raises it to the committed length

    def extend(self, st: DecodeState, start: torch.Tensor, stop: torch.Tensor, width: int):
        if st.device_step:
            logits = self._catch_up_on_device(st, start)
            return self._draft(st, logits, start, stop, width)
        first = st.host_draft_end  # == start on the host (the engine just set both)
        # roll the cache back to the position before the first draft, then feed it
        # (and any committed tokens the drafter has not seen) for the first draft's q
        back = [max(0, c - (f - 1)) for c, f in zip(self.cached, first)]
        self._rollback(back)
        feed = [f - c for f, c in zip(first, self.cached)]
        k = max(feed)
        cols = torch.tensor(self.cached, device=st.seq.device).unsqueeze(1) + st.arange(k)
        logits = self._forward(st.seq.gather(1, cols))  # [K, B, k, V]
        last = torch.tensor([n - 1 for n in feed], device=logits.device)
        logits = logits[:, st.batch_idx.squeeze(1), last].unsqueeze(2)  # each sample's last fed row
        self.cached = [c + k for c in self.cached]
        self._rollback([k - n for n in feed])
        self._draft(st, logits, start, stop, width)

    def _catch_up_on_device(self, st: DecodeState, start: torch.Tensor) -> torch.Tensor:
        """The catch-up with nothing read on the host: roll back to the position before the
        first draft, feed two tokens (the most a step leaves to catch up on: a pass that took
        every draft), roll the padding back; the logits of each sample's last fed token."""
        back = (self.cached - (start - 1)).clamp(min=0)
        # (a bound of it: the drafts fed since the last catch-up, a horizon, ran at most a horizon
        # ahead of the committed tokens, and two more for the catch-up's width)
        self._rollback(back, most=2 * st.horizon + 2)
        feed = start - self.cached  # 1 or 2
        cols = (self.cached.unsqueeze(1) + st.arange(2)).clamp(max=st.seq.shape[1] - 1)
        logits = self._forward(st.seq.gather(1, cols))  # [K, B, 2, V]
        self.cached = self.cached + 2
        self._rollback(2 - feed, most=1)
        return logits[:, st.batch_idx.view(-1), feed - 1].unsqueeze(2)

    def _draft(self, st: DecodeState, logits, start, stop, width: int):
        """``width`` drafts from each sample's ``start``, each fed for the next one's logits;
        those at or past its ``stop`` are not kept."""
        B = st.batch
        pos, tok = start.unsqueeze(1), None
        for d in range(width):
            if tok is not None:  # feed the previous draft for the next one's logits
                logits = self._forward(tok)
                self.cached = self.cached + 1 if isinstance(self.cached, torch.Tensor) else [
                    c + 1 for c in self.cached]
            q = self.pipeline(logits, pos)  # [B, 1, V]
            u = rng.uniform(st.keys, st.step, rng.DRAFT, pos)
            tok = rng.categorical(q, u.unsqueeze(-1)).view(B, 1)
            valid = pos < stop.unsqueeze(1)
            st.seq.scatter_(1, torch.where(valid, pos, st.scratch), tok)
            st.put_rows(st.ring, torch.where(valid, pos % st.ring_size, st.ring_size), q)
            pos = pos + 1
        st.informed_end = torch.maximum(st.informed_end, stop)

    # -- helpers ---------------------------------------------------------------
    def _forward(self, tokens):
        with self.timer.model("drafter"):
            return self.running.forward(tokens)

    def _rollback(self, n, most=None):
        if isinstance(n, torch.Tensor):  # the step on the device
            self.running.rollback(n, most=most)
            self.cached = self.cached - n
        elif any(n):
            self.running.rollback(n)
            self.cached = [c - m for c, m in zip(self.cached, n)]
