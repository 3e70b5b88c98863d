"""The decoding loop: one engine for AR, SJD, GSD, LANTERN, VVS and their mixtures.

Per sample ``b`` the engine tracks how many stream positions are *committed*
(final) and how many of those are *cached* by the adapter.  The committed tokens
not yet cached (the newest one, plus any committed by a skipped verification)
open each window; drafts follow.  One forward scores the window; output row
``j`` is the target distribution of position ``n_cached + j + 1``.

A verified step, for every sample at once:

1. process the logits into the verified distribution ``p`` (processing.py);
2. draft rows: committed or forced positions pass, the others pass with the
   rule's probability; the first failure (or the end of the window) is where
   the sample stops;
3. the stopping row gets a new token: resampled from the rule's residual after a
   rejection, or drawn from ``p`` (the bonus) when every draft passed;
4. the rows after it are re-drawn from ``p`` and kept as the next drafts
   (Jacobi), everything is written to the ring of distributions, the adapter's
   cache is rolled back to the kept prefix, and new window positions are
   initialised.

A skipped step (VVS) commits part of each sample's informed draft tail without a
forward.  The only host synchronisation per step is reading the new lengths
(plus the skip plan); plain AR needs none.

A verified distribution that is not one (NaN, from a NaN or infinite logit, as
float16 weights produce when they overflow) stops decoding with
:class:`NonFiniteError` naming the step and position; it is read from the row
totals the sampler computes anyway, and reaches the host with the step's one
synchronisation (AR: every ``AR_CHECK_EVERY`` steps, naming the first bad one).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from . import rng
from .acceptance import DraftDistributions, make_rule
from .adapter import ImageAdapter
from .config import ConfigError, DecodeConfig
from .drafts import DraftSource, JacobiDrafts
from .memory import check_fits
from .neighbours import TokenGeometry
from .processing import build_pipeline
from .report import ACCEPTED, COMMITTED, FORCED, PENDING, RESAMPLED, SAMPLED, DecodeReport
from .schedule import make_schedule

AR_CHECK_EVERY = 32  # AR steps between host checks for a non-finite distribution


class NonFiniteError(ValueError):
    """The model's output holds NaN or infinity where a distribution is sampled."""

    def __init__(self, step: int, sample: int, position: int):
        self.step, self.sample, self.position = step, sample, position
        super().__init__(
            f"the model's output at step {step} (image {sample} of the batch, stream position {position}) "
            "holds NaN or infinity, so there is nothing to sample; float16 weights overflow like this: load the "
            "model in bfloat16 or float32")


@dataclass
class StepEvent:
    """Passed to the ``callback`` after the prefill and every step."""

    step: int
    kind: str  # "P" prefill, "V" verified forward, "S" skipped verification
    committed: list[int]  # committed positions per sample
    cached: list[int]  # positions in the adapter's cache per sample
    length: int  # stream length
    nfe: int  # forwards so far, the prefill included
    tokens: torch.Tensor  # [B, length] committed tokens (and drafts beyond)


@dataclass
class DecodeResult:
    tokens: torch.Tensor  # [B, length] stream tokens, structural ones included
    reports: list[DecodeReport]

    def image_tokens(self, layout) -> torch.Tensor:
        """``[B, rows, cols]`` image tokens with structural positions removed."""
        pos = layout.image_positions().to(self.tokens.device)
        return self.tokens[:, pos].view(self.tokens.shape[0], *layout.grid)


class _State:
    """Per-batch decoding state shared by the engine, drafts and schedule."""

    def __init__(self, adapter: ImageAdapter, config: DecodeConfig, seeds, device, geometry):
        lay = adapter.layout
        self.layout, self.length = lay, lay.length
        self.batch = len(seeds)
        self.seeds = seeds
        self.keys = rng.seed_keys(seeds, device)
        self.batch_idx = torch.arange(self.batch, device=device).unsqueeze(1)
        self.drafts, self.skips, self.max_commit, self.horizon, self.max_window, pad, self.ring_size = \
            _sizes(config, lay)
        self.forced_at = torch.cat([lay.forced, torch.full((pad,), -1, dtype=torch.long)]).to(device)
        free = torch.where(self.forced_at < 0, torch.arange(self.forced_at.numel(), device=device), -1)
        self.prev_free = torch.cummax(free, 0).values  # nearest free position <= t
        self.image_ids = torch.nonzero(lay.image_tokens).flatten().to(device)
        self.seq = self.image_ids[0].repeat(self.batch, self.length + pad)  # pad: any image token
        self.scratch = self.length + pad - 1  # a seq column that absorbs masked writes; never read
        # q (or committed p) rows by position modulo ring_size; the extra slot
        # absorbs masked-out writes and is never read
        self.ring = (torch.zeros(self.batch, self.ring_size + 1, adapter.vocab_size, device=device)
                     if self.drafts else None)
        self.geometry = geometry
        zeros = torch.zeros(self.batch, dtype=torch.long, device=device)
        self.n_cached, self.n_committed = zeros.clone(), zeros.clone()
        # maintained by the draft source: drafts exist before draft_end (and
        # host_draft_end); those before informed_end may be committed unverified
        self.draft_end = zeros.clone()
        self.informed_end = zeros.clone()
        # for skipping schedules: produced / verified is the mean accepted length
        self.produced = zeros.clone()
        self.verified = zeros.clone()
        # host mirrors, refreshed by the one synchronisation per step
        self.host_cached = [0] * self.batch
        self.host_committed = [0] * self.batch
        self.host_draft_end = [0] * self.batch
        self.aranges: dict[int, torch.Tensor] = {}
        self.buffers: dict[str, torch.Tensor] = {}
        self.vocab = adapter.vocab_size
        # positions whose token is fixed by the layout (forced), if any
        self.any_forced = bool((lay.forced >= 0).any())
        self.step = 0
        self.bad_step = torch.full((self.batch,), -1, dtype=torch.long, device=device)  # AR: first NaN step
        self.verified_since_skip = 0
        self.window_positions = None
        # (kind, committed before, committed after, rejected, position of the drawn
        # token) per step: origins, histograms and counts are rebuilt from it once
        # decoding ends
        self.log: list[tuple] = []

    def buffer(self, name: str, rows: int) -> torch.Tensor:
        """A reusable ``[B, rows, V]`` float32 buffer (CPU allocations of this size
        cost page faults on every step)."""
        n = self.batch * rows * self.vocab
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < n:
            buf = self.buffers[name] = torch.empty(self.batch * self.max_window * self.vocab,
                                                   device=self.n_cached.device)
        return buf[:n].view(self.batch, rows, self.vocab)

    def arange(self, n: int) -> torch.Tensor:
        if n not in self.aranges:
            self.aranges[n] = torch.arange(n, device=self.n_cached.device)
        return self.aranges[n]

    def commit_lengths(self) -> torch.Tensor:
        """VVS truncation: ``min(informed tail, floor(mean accepted length))``."""
        mal = torch.div(self.produced, self.verified.clamp(min=1), rounding_mode="floor")
        tail = self.informed_end - self.n_committed
        room = self.length - self.n_committed
        return torch.minimum(torch.minimum(tail, mal), room).clamp(min=0)


def _sizes(config: DecodeConfig, layout) -> tuple[int, bool, int, int, int, int, int]:
    """drafts, skips, longest unverified commit, horizon (drafts kept past the
    committed prefix), longest window, stream padding, ring slots."""
    drafts = config.drafts
    skips = config.verify_schedule != "every" and drafts > 0
    max_commit = drafts + 1 if skips else 0
    horizon = drafts + max_commit
    max_window = drafts + 1 + max_commit
    pad = 2 * (max_window + horizon) + 4
    above = layout.row_stride if config.init.endswith("above") else 0
    return drafts, skips, max_commit, horizon, max_window, pad, above + pad


class SpeculativeDecoder:
    """Decodes batches of images with one adapter and one configuration.

    Build once (validates the configuration, builds neighbour tables), then call
    :meth:`generate` for each batch.  ``drafter`` replaces Jacobi self-drafting
    with another :class:`~.drafts.DraftSource` (e.g. a learned draft head).
    """

    def __init__(self, adapter: ImageAdapter, config: DecodeConfig, drafter: DraftSource | None = None):
        config = config.with_defaults(getattr(adapter, "sampling_defaults", {}))
        geometry = None
        vectors = adapter.token_vectors()
        needs_geometry = (
            config.drafts
            and (config.rule == "latent" or config.verify_schedule == "similarity"
                 or (config.rule == "grouped" and config.gsd_distance is not None))
        )
        if vectors is not None:
            geometry = TokenGeometry(*vectors, adapter.vocab_size, adapter.device)
        elif needs_geometry:
            raise ConfigError(
                f"{config.rule!r} acceptance / {config.verify_schedule!r} schedule needs codebook vectors, "
                f"but this model's adapter provides none (token_vectors() is None)"
            )
        config.validate(codebook_size=geometry.size if geometry else None)
        self.adapter, self.config, self.geometry = adapter, config, geometry
        lay = adapter.layout
        if lay.vocab_size != adapter.vocab_size:
            raise ValueError(f"adapter layout covers {lay.vocab_size} ids but vocab_size is {adapter.vocab_size}")
        pad = 4 * (2 * config.drafts + 4)
        self.pipeline = build_pipeline(config, lay, adapter.guidance, adapter.device, pad)
        self.rule = make_rule(config.rule, config, geometry) if config.drafts else None
        self.schedule = make_schedule(config.verify_schedule, config, geometry)
        self.drafter = drafter or JacobiDrafts(config.init)
        self.guided = self.pipeline.guidance.branches > 1

    # -- public -------------------------------------------------------------
    def generate(
        self,
        conditions: Sequence,
        negatives: Sequence | None = None,
        seeds: Sequence[int] | int = 0,
        callback: Callable[[StepEvent], None] | None = None,
    ) -> DecodeResult:
        """Decode one image per condition.  ``seeds``: one per image, or a base
        seed ``s`` giving ``s, s + 1, ...``.  ``callback`` sees every step (and
        may raise to stop decoding)."""
        conditions = list(conditions)
        if not conditions:
            raise ConfigError("conditions must hold at least one prompt (got an empty batch)")
        if negatives is not None:
            negatives = list(negatives)
            if len(negatives) == 1 and len(conditions) > 1:
                negatives = negatives * len(conditions)
            if len(negatives) != len(conditions):
                raise ConfigError(
                    f"negatives must hold one negative prompt, or one per prompt ({len(conditions)}), "
                    f"got {len(negatives)}"
                )
        kinds = {type(c) for c in conditions}
        if len(kinds) > 1:
            raise ConfigError(f"conditions must all be of one type (got {sorted(k.__name__ for k in kinds)})")
        if isinstance(seeds, int):
            seeds = [seeds + i for i in range(len(conditions))]
        seeds = list(seeds)
        if len(seeds) != len(conditions) or not all(isinstance(s, int) for s in seeds):
            raise ConfigError(f"seeds must be one integer per prompt ({len(conditions)}), got {seeds!r}")
        self.adapter.check_conditions(conditions, negatives)
        check_fits(self.memory_per_image(conditions, negatives), len(conditions), self.adapter.device)
        try:
            return self._run(conditions, negatives, seeds, callback)
        finally:
            self.adapter.release()

    def memory_per_image(self, conditions: Sequence, negatives: Sequence | None = None) -> dict[str, int]:
        """Bytes one image of a batch of ``conditions`` needs while decoding, by part
        (estimates, before anything is allocated): the KV cache (the adapter's
        figure, 0 if it gives none) and the engine's state."""
        ad, lay = self.adapter, self.adapter.layout
        drafts, _, _, _, window, pad, ring = _sizes(self.config, lay)
        rows = (ring + 1) if drafts else 0  # the ring of draft distributions
        # window buffers (probabilities, cumulative sums), the adapter's float32 logits per
        # branch, and the acceptance rules' temporaries, all [window, vocab]
        rows += window * (2 + ad.branches(self.guided) + 3)
        state = 4 * ad.vocab_size * rows + 8 * (lay.length + pad)
        cache = ad.cache_bytes_per_image(list(conditions), None if negatives is None else list(negatives),
                                         self.guided) or 0
        return {"KV cache": cache, "decoding state": state}

    @torch.no_grad()
    def target_probabilities(self, conditions: Sequence, tokens: torch.Tensor, negatives=None,
                             reduce=lambda p: p.amax(-1), chunk: int | None = None) -> torch.Tensor:
        """The verified distribution at every position of given streams, reduced
        per position by ``reduce`` (default: its top-1 probability).  ``tokens``:
        ``[B, length]``; scored ``chunk`` positions per forward (default: the
        whole stream in one)."""
        return self._score(conditions, tokens, negatives, lambda p, _: reduce(p), chunk)

    def target_log_likelihood(self, conditions: Sequence, tokens: torch.Tensor, negatives=None,
                              chunk: int | None = 256) -> torch.Tensor:
        """``log p(token)`` under the verified distribution (same guidance and
        sampling settings) at every position of given streams ``[B, length]``:
        how likely the target finds what a setting committed.  ``-inf`` where
        it gives the token no mass; 0 at forced positions.  ``chunk`` positions
        per forward keep memory bounded on long streams."""
        return self._score(conditions, tokens, negatives,
                           lambda p, toks: p.gather(-1, toks.unsqueeze(-1)).squeeze(-1), chunk).log()

    @torch.no_grad()
    def _score(self, conditions, tokens, negatives, pick, chunk):
        """``pick(p, tokens)`` per chunk of positions of teacher-forced streams, concatenated."""
        ad = self.adapter
        tokens = tokens.to(ad.device)
        B, T = tokens.shape
        chunk = chunk or T
        try:
            p = self.pipeline(ad.prefill(list(conditions), negatives, self.guided).unsqueeze(2),
                              torch.zeros(B, 1, dtype=torch.long, device=ad.device))
            parts = [pick(p, tokens[:, :1])]
            for start in range(1, T, chunk):
                stop = min(start + chunk, T)
                pos = torch.arange(start, stop, device=ad.device).expand(B, -1)
                parts.append(pick(self.pipeline(ad.forward(tokens[:, start - 1:stop - 1]), pos),
                                  tokens[:, start:stop]))
        finally:
            ad.release()
        return torch.cat(parts, 1)

    # -- the loop -----------------------------------------------------------
    def _run(self, conditions, negatives, seeds, callback):
        ad = self.adapter
        device = ad.device
        st = _State(ad, self.config, seeds, device, self.geometry)
        timer = _Timer(device)
        B, T = st.batch, st.length

        timer.start()
        with timer.model():
            logits = ad.prefill(conditions, negatives, self.guided)
        _check_shape("prefill", logits, (ad.branches(self.guided), B, ad.vocab_size))
        zero = torch.zeros(B, 1, dtype=torch.long, device=device)
        probs = self.pipeline(logits.unsqueeze(2), zero)  # [B, 1, V]
        u = rng.uniform(st.keys, 0, rng.VERIFY, zero, lanes=2)[..., 1:]
        st.seq[:, :1] = rng.categorical(probs, u, st.buffer("cumsum", 1)).view(B, 1)
        _raise_if_nonfinite(st.buffer("cumsum", 1)[:, 0, -1].isnan().tolist(), 0, [0] * B)
        st.log.append(("P", st.n_committed, st.n_committed + 1, torch.zeros_like(st.n_committed, dtype=torch.bool),
                       st.n_committed))
        st.n_committed = st.n_committed + 1
        st.produced += 1
        st.verified += 1
        st.host_committed = [1] * B
        if st.drafts:
            st.ring[:, 0] = probs[:, 0]  # position 0's p: sample-left draws from it
            st.draft_end += 1
            st.host_draft_end = [1] * B
            self._extend(st)
        self._notify(callback, st)

        plan = None
        while min(st.host_committed) < T:
            st.step += 1
            if plan is not None:
                self._skip(st, *plan)
                plan = None
            elif st.drafts:
                plan = self._verify(st, timer)
            else:
                self._autoregressive(st, timer)
            self._notify(callback, st)

        if not st.drafts:
            _check_ar(st)
        timer.stop()
        memory = self._memory_mb(st, timer)
        return DecodeResult(st.seq[:, :T].clone(), self._reports(st, timer, memory))

    def _memory_mb(self, st: _State, timer: "_Timer") -> float:
        if timer.cuda:
            return torch.cuda.max_memory_allocated(self.adapter.device) / 2**20
        tensors = [st.seq, st.ring] + list(st.buffers.values())
        own = sum(t.numel() * t.element_size() for t in tensors if t is not None)
        return (own + (self.adapter.cache_bytes() or 0)) / 2**20

    def _forward(self, st, tokens, timer):
        ad = self.adapter
        with timer.model():
            logits = ad.forward(tokens)
        _check_shape("forward", logits, (ad.branches(self.guided), st.batch, tokens.shape[1], ad.vocab_size))
        return logits

    def _autoregressive(self, st: _State, timer: "_Timer"):
        """One token per forward; every sample sits at the same position, so no
        host synchronisation is needed.  Step t draws position t, so the draws
        of the whole image are made at once (the same numbers as step by step)."""
        if st.step == 1:
            where = st.arange(st.length).unsqueeze(0).expand(st.batch, -1)
            st.ar_uniforms = rng.uniform(st.keys, where, rng.VERIFY, where, lanes=2)[..., 1:]
        t = st.step
        pos = st.n_cached.unsqueeze(1)
        probs = self.pipeline(self._forward(st, st.seq.gather(1, pos), timer), pos + 1)
        totals = st.buffer("cumsum", 1)
        st.seq[:, t:t + 1] = rng.categorical(probs, st.ar_uniforms[:, t:t + 1], totals).view(st.batch, 1)
        st.bad_step = torch.where((st.bad_step < 0) & totals[:, 0, -1].isnan(), t, st.bad_step)
        if t % AR_CHECK_EVERY == 0:
            _check_ar(st)
        none = torch.zeros_like(st.n_committed, dtype=torch.bool)
        st.log.append(("V", st.n_committed, st.n_committed + 1, none, st.n_committed))
        st.n_cached = st.n_cached + 1
        st.n_committed = st.n_committed + 1
        st.host_cached = [n + 1 for n in st.host_cached]
        st.host_committed = [n + 1 for n in st.host_committed]

    def _verify(self, st: _State, timer: "_Timer"):
        ad, B, T = self.adapter, st.batch, st.length
        waiting = max(c - n for c, n in zip(st.host_committed, st.host_cached))
        L = max(1, min(st.drafts + waiting, max(T - n for n in st.host_cached)))
        near_end = max(st.host_cached) + L >= T  # some window rows predict past the image
        base = st.n_cached
        window = st.arange(L)
        pos = base.unsqueeze(1) + window  # input positions [B, L]
        st.window_positions = pos
        inp = st.seq.gather(1, pos)
        target = pos + 1  # row j predicts position base + j + 1
        probs = self.pipeline(self._forward(st, inp, timer), target, st.buffer("probs", L))  # [B, L, V]
        u = rng.uniform(st.keys, st.step, rng.VERIFY, target, lanes=2)  # coin, sample
        committed_before = st.n_committed

        # judge the drafts: rows 0..L-2 predict the window's own tokens 1..L-1
        tested = L - 1
        slots = target % st.ring_size
        if tested:
            x, tp = inp[:, 1:], target[:, :-1]
            q = DraftDistributions(st.ring, slots[:, :-1], st.batch_idx)
            ok = u[:, :-1, 0] < self.rule.accept_prob(probs[:, :-1], q, x)
            # committed (post-verified) and forced rows stand without a test
            if waiting > 1:
                ok |= tp < st.n_committed.unsqueeze(1)
            if st.any_forced:
                ok |= st.forced_at[tp] >= 0
            if near_end:
                ok &= tp < T
            passed = ok.to(torch.int32).cumprod(1).sum(1).long()  # rows that stand
        else:
            passed = torch.zeros(B, dtype=torch.long, device=base.device)

        # row `passed` gets the new token: the bonus draw from p when every draft
        # stood, else a draw from the rule's residual (with the same uniform)
        samples = rng.categorical(probs, u[..., 1:], st.buffer("cumsum", L)).squeeze(-1)  # one draw per row
        bad = st.buffer("cumsum", L)[..., -1].isnan() & (target < T)  # rows that are no distribution
        first_bad = torch.where(bad.any(1), bad.int().argmax(1), -1)
        new_tok = samples.gather(1, passed.unsqueeze(1))
        rejected = passed < tested
        if tested:
            row = passed.clamp(max=tested - 1).unsqueeze(1)
            p_row = probs[st.batch_idx, row].squeeze(1)
            q_row = st.ring[st.batch_idx, slots.gather(1, row)].squeeze(1)
            res = self.rule.residual(p_row, q_row, inp.gather(1, row + 1).squeeze(1))
            # p and q equal to float precision leave no residual mass: fall back to p
            res = torch.where(res.sum(-1, keepdim=True) > 0, res, p_row)
            redraw = rng.categorical(res, u[st.batch_idx, row, 1])
            new_tok = torch.where(rejected.unsqueeze(1), redraw, new_tok)

        # next drafts (Jacobi: the tail); the new token lands after them
        self.drafter.after_verify(st, probs, samples, passed)
        stop = base.unsqueeze(1) + passed.unsqueeze(1) + 1
        st.seq.scatter_(1, torch.where(stop < T, stop, st.scratch), new_tok)

        # the cache keeps the input rows that stand
        keep = passed + 1
        committed = stop.squeeze(1) + 1
        if near_end:
            keep = torch.minimum(keep, (T - base).clamp(min=0))
            committed = committed.clamp(max=T).maximum(committed_before)
        st.n_cached = base + keep
        st.n_committed = committed
        st.log.append(("V", committed_before, committed, rejected, stop.squeeze(1)))
        if st.skips:
            st.produced += committed - committed_before
            st.verified += committed_before < T
        st.verified_since_skip += 1

        plan = self.schedule.plan(st)
        sync = torch.stack([st.n_cached, st.n_committed, L - keep, first_bad]
                           + ([plan] if plan is not None else [])).tolist()
        _raise_if_nonfinite([j >= 0 for j in sync[3]], st.step,
                            [c + j + 1 for c, j in zip(st.host_cached, sync[3])])
        st.host_cached, st.host_committed = sync[0], sync[1]
        del sync[3]
        ad.rollback(sync[2])  # the rejected rows leave the cache
        self._extend(st)
        if plan is not None and min(sync[3]) >= 0 and max(sync[3]) > 0:
            return plan, sync[3]
        return None

    def _skip(self, st: _State, m: torch.Tensor, m_host: list[int]):
        """Commit ``m[b]`` informed drafts of each sample without a forward."""
        st.log.append(("S", st.n_committed, st.n_committed + m, m > 0, None))
        st.n_committed = st.n_committed + m
        st.host_committed = [c + d for c, d in zip(st.host_committed, m_host)]
        st.verified_since_skip = 0
        self._extend(st)

    def _extend(self, st: _State):
        """Initialise drafts up to ``n_committed + horizon`` for every sample."""
        # never over committed tokens: a source may leave draft_end behind them
        st.host_draft_end = [max(d, c) for d, c in zip(st.host_draft_end, st.host_committed)]
        stop = [c + st.horizon for c in st.host_committed]
        width = max(e - d for e, d in zip(stop, st.host_draft_end))
        if width > 0:
            st.draft_end = torch.maximum(st.draft_end, st.n_committed)
            stop_t = st.n_committed + st.horizon
            self.drafter.extend(st, st.draft_end, stop_t, width)
            st.draft_end = torch.maximum(st.draft_end, stop_t)
            st.host_draft_end = [max(d, e) for d, e in zip(st.host_draft_end, stop)]


    def _notify(self, callback, st):
        if callback is not None:
            callback(StepEvent(
                step=st.step, kind=st.log[-1][0], committed=list(st.host_committed),
                cached=list(st.host_cached), length=st.length, nfe=sum(k != "S" for k, *_ in st.log),
                tokens=st.seq,
            ))

    def _reports(self, st: _State, timer: "_Timer", memory_mb: float) -> list[DecodeReport]:
        """Origins, counts and histograms, rebuilt from the step log."""
        B, T = st.batch, st.length
        device = st.seq.device
        pos = torch.arange(T, device=device).unsqueeze(0)
        origin = torch.full((B, T), PENDING, dtype=torch.long, device=device)
        nfe = torch.zeros(B, dtype=torch.long, device=device)
        skipped = torch.zeros_like(nfe)
        unverified = torch.zeros_like(nfe)
        hist = torch.zeros(B, st.max_window + 2, dtype=torch.long, device=device)
        for kind, before, after, flag, new in st.log:
            span = (pos >= before.unsqueeze(1)) & (pos < after.unsqueeze(1))
            if kind == "S":
                code = torch.full_like(origin, COMMITTED)
                skipped += flag
                unverified += after - before
            else:
                last = pos == new.unsqueeze(1)  # the drawn token (past the end when all stood)
                code = torch.where(last, torch.where(flag, RESAMPLED, SAMPLED).unsqueeze(1), ACCEPTED)
                active = before < T
                nfe += active
                hist.scatter_add_(1, (after - before).clamp(max=hist.shape[1] - 1).unsqueeze(1),
                                  active.long().unsqueeze(1))
            origin = torch.where(span, code, origin)
        origin = torch.where(st.forced_at[:T] >= 0, FORCED, origin)
        origins, nfe, hist = origin.tolist(), nfe.tolist(), hist.tolist()
        skipped, unverified = skipped.tolist(), unverified.tolist()
        steps = "".join(k for k, *_ in st.log)
        settings = self.config.to_dict()
        return [
            DecodeReport(
                mode=self.config.mode, seed=st.seeds[b], tokens=T, nfe=nfe[b], tokens_per_forward=T / nfe[b],
                mean_accepted_length=(T - unverified[b]) / nfe[b], accepted_length_histogram=hist[b],
                skipped_verifications=skipped[b], unverified_tokens=unverified[b], origins=origins[b],
                steps=steps, latency_s=timer.total, model_time_s=timer.model_total,
                engine_time_s=timer.total - timer.model_total, batch_size=B,
                device=str(self.adapter.device), memory_mb=memory_mb, settings=settings,
            )
            for b in range(B)
        ]


def _raise_if_nonfinite(bad: list[bool], step: int, positions: list[int]):
    for b, flag in enumerate(bad):
        if flag:
            raise NonFiniteError(step, b, positions[b])


def _check_ar(st: _State):
    """AR decoding syncs only here: the first step whose distribution was not one."""
    bad = st.bad_step.tolist()
    if max(bad) >= 0:
        b = min((s, b) for b, s in enumerate(bad) if s >= 0)[1]
        raise NonFiniteError(bad[b], b, bad[b])


def _check_shape(call: str, logits, expected):
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != tuple(expected):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(
            f"adapter.{call}() must return logits of shape [branches, batch, "
            f"{'window, ' if call == 'forward' else ''}vocab] = {list(expected)}, got {got}"
        )


class _Timer:
    """Wall-clock for the batch and time inside model calls, device-synchronised.

    On CUDA, model calls are bracketed by events (read once at the end), so
    measuring adds no host synchronisation to the loop."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.events: list = []
        self.model_total = 0.0
        self.total = 0.0

    def start(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.t0 = time.perf_counter()

    def stop(self):
        if self.cuda:
            torch.cuda.synchronize()
            self.model_total = sum(a.elapsed_time(b) for a, b in self.events) / 1000.0
        self.total = time.perf_counter() - self.t0

    def model(self):
        return _ModelSpan(self)


class _ModelSpan:
    def __init__(self, timer: _Timer):
        self.timer = timer

    def __enter__(self):
        if self.timer.cuda:
            self.a = torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t = time.perf_counter()

    def __exit__(self, *exc):
        if self.timer.cuda:
            b = torch.cuda.Event(enable_timing=True)
            b.record()
            self.timer.events.append((self.a, b))
        else:
            self.timer.model_total += time.perf_counter() - self.t
        return False
