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
   (Jacobi; with coupled drafting each is coupled with the draft already there,
   in the same pass as the first rejection's residual), everything is written
   to the ring of distributions, the adapter's cache is rolled back to the kept
   prefix, and new window positions are initialised.

With proactive drafting (``proactive.py``) the forward also scores a tree of
alternatives below the window's first drafts, and a walk over it settles those
rows before step 2 goes on along the window.  With row-parallel drafting
(``rows.py``) it also scores the next image rows, and each row whose turn has
come gets a token that is *fixed*: in later windows its position passes like a
forced one.

A skipped step (VVS) commits part of each sample's informed draft tail without a
forward.  The only host synchronisation per step is reading the new lengths
(plus the skip plan); plain AR needs none.

**Finished images leave the batch** (``LEAVE_SHARE``): where the adapter can drop samples
(``drops_samples``), and a draft source keeps its per-image state in step with it
(``keep_samples``) or keeps none, once a quarter of
the batch has finished, their cache rows and state rows go and the forwards narrow
(``DecodeState.leave``); the report and the result rejoin the whole batch, and step
events describe it whole.  Every image is the one it would have been riding along.

**The step on the device** (``device_step``; on auto on CUDA): the verify step reads
nothing on the host.  Its window is the full width every step (rows past the image
masked), the adapter rolls its cache back by a device tensor (``rolls_back_on_device``),
new drafts are initialised over the whole horizon (positions past each sample's stop
masked), and a non-finite row is kept as a device (step, position).  The host reads the
lengths every ``READ_EVERY`` steps, and every step once the slowest image could have
ended; a static KV cache reads them too where the bounds it keeps would read another
bucket of keys.  The tokens are the host step's; so one graph can hold the forward and
the step (``tests/test_device_step.py`` compiles it with ``fullgraph=True``).  Proactive
and row-parallel drafts score their trees beside the window there too: the adapter keeps
the path that stands by device counts (``keep_tree``, as ``rollback``).  A draft head or draft
model (``drafts_on_device``) catches up at a fixed width and rolls its cache back by device
tensors, for chains and a head's trees (a tree's verify step: the one waiting token, then
the tree); the host's reads make their caches' lengths exact too.  A draft model whose
adapter rolls back on the host only, the similarity schedule (VVS-D) and skips of draft
trees shape their work by lengths read on the host: they keep the host step
(``device_step_blocker`` says why).  A uniform
schedule's skip (VVS-U) is due by the step count: the skip commits on the device, and the
forward after it runs as wide as the committed tokens can make it, its rows past the host
step's width masked.

A verified distribution that is not one (NaN, from a NaN or infinite logit, as
float16 weights produce when they overflow) stops decoding with
:class:`~.checks.NonFiniteError` naming the step and position; it is read from the row
totals the sampler computes anyway, and reaches the host with the step's one
synchronisation (AR: every ``AR_CHECK_EVERY`` steps, naming the first bad one).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Sequence

import torch

from . import rng
from .acceptance import DraftDistributions, ExactAcceptance, make_rule
from .adapter import ImageAdapter
from .compact import CompactVocabulary, compact, scores_trees
from .config import KNOBS, ConfigError, DecodeConfig
from .drafts import DraftSource, JacobiDrafts
from . import proactive, scoring
from .rows import RowGrid, draft_rows, force_fixed, judge_rows, settle_rows
from .checks import AR_CHECK_EVERY, NonFiniteError, check_ar, check_shape, raise_if_nonfinite
from .memory import check_fits, state_bytes_per_image
from .neighbours import TokenGeometry
from .processing import build_pipeline
from .report import DecodeReport, build_reports
from .request import normalize_request
from .schedule import make_schedule
from .state import DecodeState, Sizes, kept
from .timing import Timer
from . import window

DENSE_RESIDUAL = 1 << 17  # CPU: window rows x vocabulary up to which every row's residual is drawn
#: a batch of one on the host step keeps its lengths as host numbers and cuts its positions, slots and row
#: masks from the state's tables (``DecodeState.scalar``): 28 (``gsd``) to 43 (``vvs``) fewer small
#: operations a forward, the same tokens
SCALAR_STEP = True
#: the step on the device: verify steps between the host's reads of the lengths (an image that
#: ends first rides along, committing nothing, as on the host step; near the end it reads every step)
READ_EVERY = 8
#: finished images leave the batch once they are at least this share of it (a quarter): each leaving
#: copies the KV cache's rows and, on CUDA, captures the narrower forwards' graphs again
LEAVE_SHARE = 4

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


def attention_without_cudnn(device):
    """Scaled dot-product attention on CUDA without its cuDNN backend while decoding:
    cuDNN builds an execution plan for every new shape, and speculative steps bring
    new shapes all the time (windows, trees and cache lengths).  On an H100 in
    bfloat16 the embedded model's `sjd` took 675-1432 ms per image with it and
    346-364 ms without (flash, memory-efficient and math kernels stay allowed)."""
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class SpeculativeDecoder:
    """Decodes batches of images with one adapter and one configuration.

    Build once (validates the configuration, builds neighbour tables), then call
    :meth:`generate` for each batch.  ``drafter`` replaces Jacobi self-drafting
    with another :class:`~.drafts.DraftSource` (e.g. a learned draft head);
    ``surface`` names the settings in errors as the caller's user saw them
    (:data:`~.config.SURFACES`).  ``vocabulary``: ``"compact"`` decodes over the ids a
    stream can hold (``compact.py``: the same distribution, narrower rows; a draft head or
    draft model follows it); ``"full"`` over the whole vocabulary.
    """

    def __init__(self, adapter: ImageAdapter, config: DecodeConfig, drafter: DraftSource | None = None,
                 surface: str = "api", vocabulary: str = "compact", device_step: bool | None = None):
        if vocabulary not in ("compact", "full"):
            raise ValueError(f"vocabulary must be 'compact' or 'full' (got {vocabulary!r})")
        self.base_adapter = adapter
        # a draft source that follows the vocabulary (a head, a draft model) learns it in its check
        if vocabulary == "compact" and (drafter is None or getattr(drafter, "follows_compact_vocabulary", False)):
            adapter = compact(adapter)
        if drafter is not None:  # the config names its draft source: drafts = its depth
            config = replace(config, drafter=getattr(drafter, "name", "") or "draft model")
        elif config.drafter:
            raise ConfigError(f"the settings name a draft model ({config.drafter!r}) but none is attached")
        # the window on auto (Jacobi drafts, not set): found on the decode's own steps (window.py)
        self.auto_window = drafter is None and config.window is None and config.mode != "ar"
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
        config.validate(codebook_size=geometry.size if geometry else None, surface=surface)
        self.adapter, self.config, self.geometry = adapter, config, geometry
        lay = adapter.layout
        if lay.vocab_size != adapter.vocab_size:
            raise ValueError(f"adapter layout covers {lay.vocab_size} ids but vocab_size is {adapter.vocab_size}")
        self.pipeline = build_pipeline(config, lay, adapter.guidance, adapter.device,
                                       scales=adapter.guidance_scales(config.cfg_scale))
        self.rule = make_rule(config.rule, config, geometry) if config.drafts else None
        self.schedule = make_schedule(config.verify_schedule, config, geometry)
        if drafter is not None:
            if not config.drafts:
                raise ConfigError(f"a draft model drafts for the speculative modes, not {config.mode!r}")
            if hasattr(drafter, "check"):
                drafter.check(adapter)
        self.drafter = drafter or JacobiDrafts(config.init, config.draft_coupling)
        self.tree = bool(config.drafts and drafter is not None and config.tree != "chain")
        if self.tree:
            if not hasattr(self.drafter, "tree"):
                raise ConfigError(f"the {self.drafter.name} drafts chains only; draft trees need a draft head")
            if not scores_trees(adapter):
                raise ConfigError(f"{type(self.base_adapter).__name__} cannot score draft trees")
            if config.tree_top_k > int(lay.image_tokens.sum()):
                raise ConfigError(f"{KNOBS['tree_top_k'].shown_as(surface)} must be at most the model's "
                                  f"{int(lay.image_tokens.sum())} image tokens (got {config.tree_top_k})")
            if config.tree == "sampled" and config.verify_schedule != "every":
                # VVS commits a uniformly chosen path unverified; a sampled tree's paths end
                # in its later draws without replacement, unlikely tokens (measured on the
                # embedded model: FD to ar 144 and target NLL 2.68, against 38 and 1.61 on
                # a dynamic tree)
                raise ConfigError(f"{KNOBS['schedule'].shown_as(surface)} {config.verify_schedule!r} commits tree "
                                  f"paths unverified, which a sampled tree fills with unlikely draws: use "
                                  f"{KNOBS['tree'].shown_as(surface)} 'dynamic' or 'static' with it")
            self.tree_levels = config.depth
            if config.tree in ("static", "sampled"):  # the shape is read (and checked) now; a choices file sets depth
                from .tree import static_shape

                shape = static_shape(config.tree_choices, config.tree_tokens, config.tree_top_k, config.depth)
                self.tree_levels = max(shape["depths"]) + 1
        # tokens beside the window's, scored in its forward as a tree (config.validate allows one kind):
        # proactive drafting (proactive.py), alternatives at the window's first drafts; row-parallel
        # drafting (rows.py), the next image rows, relaxed
        jacobi = config.drafts and drafter is None
        self.proactive = config.proactive if jacobi and config.proactive > 1 else 0
        self.rows = config.rows if jacobi and config.rows > 1 else 0
        for name, value in (("proactive", self.proactive), ("rows", self.rows)):
            if value and not scores_trees(adapter):
                raise ConfigError(f"{KNOBS[name].shown_as(surface)} {value}: "
                                  f"{type(self.base_adapter).__name__} cannot score draft trees (use 1, off)")
        if self.rows:
            self.row_grid = RowGrid(lay, adapter.device)
        self.guided = self.pipeline.guidance.branches > 1
        # the draft source wants the rows after the first rejection coupled with their
        # old drafts (see _verify), and under exact acceptance that is the verifier's test
        self.coupled = getattr(self.drafter, "redraw", "independent") == "coupled"
        self.exact = type(self.rule) is ExactAcceptance
        # a relaxed rule whose first rejection resamples from SJD's norm(max(0, p - q)) (GSD)
        self.resamples_exactly = (not self.exact
                                  and getattr(type(self.rule), "residual", None) is ExactAcceptance.residual)
        host_bound = self._host_bound(drafter)
        self.device_step_blocker = host_bound or (
            None if getattr(adapter, "rolls_back_on_device", False) or not config.drafts else
            f"{type(self.base_adapter).__name__} rolls its cache back by lengths read on the host")
        if device_step and self.device_step_blocker:
            raise ConfigError(f"the step cannot stay on the device: {self.device_step_blocker}")
        self.device_step = device_step
        # finished images leave the batch (LEAVE_SHARE) where nothing else keeps per-image state on the host
        # (under a uniform schedule too: a finished image has nothing to commit, so it abstains from the batch's
        # skips, and waits no tokens that would widen its window after one); a draft model or head leaves with
        # them (keep_samples) where it can (a model: where its adapter drops samples too)
        self.leaves = (bool(config.drafts) and host_bound is None and getattr(adapter, "drops_samples", False)
                       and (drafter is None or getattr(drafter, "leaves", False)))

    def _host_bound(self, drafter) -> str | None:
        """What in this configuration keeps state of its own per image and step, shaped by lengths
        read on the host every step (None: nothing does; the engine's own state is all there is)."""
        c = self.config
        if not c.drafts:
            return None  # plain AR reads nothing per step anyway
        if drafter is not None and not getattr(drafter, "drafts_on_device", False):
            return f"the {getattr(drafter, 'name', '') or 'draft model'} drafts from lengths read on the host"
        if c.verify_schedule not in ("every", "uniform"):  # (uniform skips are due by the step count)
            return f"the {c.verify_schedule!r} schedule decides its skips on the host"
        if self.tree and c.verify_schedule != "every":
            return "a skipping schedule decides on the host whether the batch commits a draft tree's path"
        return None

    def _steps_on_device(self, trial) -> bool:
        """Whether this decode keeps its step on the device: asked for, or (on auto) on CUDA
        where nothing needs the host; never while the window on auto times its own steps."""
        if trial is not None or self.device_step_blocker or not self.config.drafts:
            return False
        if self.device_step is None:
            return torch.device(self.adapter.device).type == "cuda"
        return self.device_step

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
        conditions, negatives, seeds = normalize_request(conditions, negatives, seeds)
        self.adapter.check_conditions(conditions, negatives)
        check_fits(self.memory_per_image(conditions, negatives), len(conditions), self.adapter.device)
        try:
            # inference mode, as ComfyUI runs every node: no tensor of a decode needs autograd, and each
            # operation dispatches past it (on this CPU the step's share of an image fell by a seventh)
            with attention_without_cudnn(self.adapter.device), torch.inference_mode():
                result = self._run(conditions, negatives, seeds, callback)
            # (a plain tensor the caller may change in place, not a view of the decode's state)
            return replace(result, tokens=result.tokens.clone())
        finally:
            self.adapter.release()
            if hasattr(self.drafter, "finish"):
                self.drafter.finish()

    def memory_per_image(self, conditions: Sequence, negatives: Sequence | None = None) -> dict[str, int]:
        """Bytes one image of a batch of ``conditions`` needs while decoding, by part
        (estimates, before anything is allocated): the KV cache (the adapter's
        figure, 0 if it gives none) and the engine's state."""
        ad = self.adapter
        widest = replace(self.config, window=max(window.CANDIDATES)) if self.auto_window else self.config
        state = state_bytes_per_image(Sizes.of(widest, ad.layout), ad.vocab_size, ad.branches(self.guided),
                                      ad.layout.length, self.config.draft_coupling,
                                      ad.output_width() if isinstance(ad, CompactVocabulary) else None)
        negatives = None if negatives is None else list(negatives)
        cache = ad.cache_bytes_per_image(list(conditions), negatives, self.guided) or 0
        parts = {"KV cache": cache, "decoding state": state}
        drafter = getattr(self.drafter, "adapter", None)
        if drafter is not None:
            parts["draft model's KV cache"] = drafter.cache_bytes_per_image(list(conditions), negatives,
                                                                            self.guided) or 0
        return parts

    def target_probabilities(self, conditions: Sequence, tokens: torch.Tensor, negatives=None,
                             reduce=lambda p: p.amax(-1), chunk: int | None = None) -> torch.Tensor:
        """See :func:`.scoring.target_probabilities`."""
        return scoring.target_probabilities(self, conditions, tokens, negatives, reduce, chunk)

    def target_log_likelihood(self, conditions: Sequence, tokens: torch.Tensor, negatives=None,
                              chunk: int | None = 256) -> torch.Tensor:
        """See :func:`.scoring.target_log_likelihood`."""
        return scoring.target_log_likelihood(self, conditions, tokens, negatives, chunk)

    # -- the loop -----------------------------------------------------------
    def _run(self, conditions, negatives, seeds, callback):
        ad = self.adapter
        device = ad.device
        timer = Timer(device)
        B = len(seeds)

        timer.start()
        with timer.model():
            logits = ad.prefill(conditions, negatives, self.guided)
        check_shape("prefill", logits, (ad.branches(self.guided), B, ad.vocab_size))
        config, choice, trial = self.config, None, None
        if self.auto_window:
            choice = self._choose_window(B)
            if isinstance(choice, window.Trial):  # widths tried in this decode: the state is made for the widest
                trial, choice = choice, None
                config = replace(config, window=max(window.CANDIDATES))
            else:
                config = replace(config, window=choice.width)
        st = DecodeState(ad, config, seeds, device, self.geometry,
                         shared=self.__dict__.setdefault("shared_tables", {}))  # (a decoder's decodes share them)
        st.device_step = self._steps_on_device(trial)
        st.scalar = (SCALAR_STEP and B == 1 and not st.device_step and type(self.drafter) is JacobiDrafts
                     and not self.proactive and not self.rows)
        st.settled = trial is None
        if trial is not None:
            st.set_drafts(trial.width)
        if self.rows:
            st.fixed = torch.full_like(st.seq, -1)
            st.row_drafted = torch.zeros_like(st.seq, dtype=torch.bool)
        T = st.length
        zero = st.span(0, 1) if st.scalar else torch.zeros(B, 1, dtype=torch.long, device=device)
        probs = self.pipeline(logits.unsqueeze(2), zero)  # [B, 1, V]
        # (position 0's numbers of step 0: with drafts, from the first block of numbers, which the first extension
        # reads too; plain AR draws its numbers for the whole image at its first step)
        u = (st.uniform(rng.VERIFY, zero, 2, [1] * B, [0] * B) if st.drafting
             else rng.uniform(st.keys, 0, rng.VERIFY, zero, lanes=2))[..., 1:]
        st.seq[:, :1] = rng.categorical(probs, u, st.buffer("cumsum", 1)).view(B, 1)
        raise_if_nonfinite(st.buffer("cumsum", 1)[:, 0, -1].isnan().tolist(), 0, [0] * B)
        if st.scalar:  # (host numbers: state.py)
            st.log.append(("P", 0, 1, False, 0))
            st.n_committed = st.produced = st.verified = 1
            st.scalar_counts.update(committed=1, informed_end=0, produced=1, verified=1, redrawn=0, kept=0)
        else:
            st.log.append(("P", st.n_committed, st.n_committed + 1,
                           torch.zeros_like(st.n_committed, dtype=torch.bool), st.n_committed))
            st.n_committed = st.n_committed + 1
            st.produced += 1
            st.verified += 1
        st.host_committed = [1] * B
        if st.drafting:
            st.ring[:, 0] = probs[:, 0]  # position 0's p: sample-left draws from it
            if st.scalar:
                st.draft_end = 1
            else:
                st.draft_end += 1
            st.host_draft_end = [1] * B
            if hasattr(self.drafter, "check"):  # checked when built; again to bind it to this decoder's
                self.drafter.check(ad)  # vocabulary, as one source may serve decoders of both
            if hasattr(self.drafter, "start"):
                self.drafter.start(st, conditions, negatives, self.guided, config, timer)
            if not self.tree:  # a tree is drafted from the committed prefix at each step
                self._extend(st)
        self._notify(callback, st)

        plan, read = None, st.step
        while min(st.host_committed) < T:
            st.step += 1
            if trial is not None and trial.open:  # the decode times its own steps (window.Trial)
                began, before, forward = window.now(), sum(st.host_committed), plan is None
            if plan is not None:
                self._skip(st, *plan)
                plan = None
            elif st.drafting:
                plan = self._tree_step(st, timer) if self.tree else self._verify(st, timer)
            else:
                self._autoregressive(st, timer)
            if trial is not None and trial.open:  # (a verify step ends on its host sync: the time is the device's)
                width = trial.record(window.now() - began, forward, (sum(st.host_committed) - before) / B)
                if width is not None:
                    st.set_drafts(width)
                st.settled = not trial.open
            if st.device_step:  # the host reads every READ_EVERY steps, and every step once the batch
                # could have ended (no forward is spent past it); the callback sees those
                most = max(st.drafts, self.tree_levels if self.tree else 0) + 1 + st.max_commit  # a step's most tokens
                if st.step % READ_EVERY and min(st.host_committed) + (st.step - read) * most < T:
                    continue
                self._read(st)
                read = st.step
            self._notify(callback, st)
            # (not while a trial counts tokens over its batch; a narrower batch would compile anew)
            if self.leaves and (trial is None or not trial.open) and ad.decode_path != "compiled":
                plan = self._leave(st, plan)

        if not st.drafting:
            check_ar(st)
        st.rejoin()
        timer.stop()
        memory = self._memory_mb(st, timer)
        if trial is not None:
            config, choice = replace(config, window=st.drafts), window.Choice(trial.width, trial.reason)
            if not trial.open:  # later decodes at this batch start at the width kept (window.py)
                self._window_profile()[self._window_key(B)] = choice
        reports = build_reports(st, config, timer, memory, ad.device, getattr(self.drafter, "name", ""),
                                choice.reason if choice else "")
        # the stream's view (or a compact vocabulary's ids): generate copies it out of inference mode
        return DecodeResult(self.to_ids(st.seq[:, :T]), reports)

    def _leave(self, st: DecodeState, plan):
        """Finished images leave the batch once they are a ``LEAVE_SHARE``-th of it: the adapter
        drops their cache rows, the state its rows (state.py), and the forwards narrow (and a skip's
        ``plan`` due next, returned).  An image
        leaves once its cache holds the whole stream (the step after its last token): its length
        is final, and a static cache reads as many keys as it would have riding along."""
        keep = [b for b, n in enumerate(st.host_cached) if n < st.length]
        if keep and (st.batch - len(keep)) * LEAVE_SHARE >= st.batch:
            if plan is not None:  # a skip due next: the lengths of the images that stay
                m, m_host = plan
                plan = (kept(m, keep), None if m_host is None else kept(m_host, keep))
            st.leave(keep)
            self.adapter.keep_samples(keep)
            if hasattr(self.drafter, "keep_samples"):  # (a draft source that keeps per-image state)
                self.drafter.keep_samples(keep)
        return plan

    def _read(self, st: DecodeState):
        """The step on the device: what the host reads every ``READ_EVERY`` steps (lengths,
        and the first distribution that was not one, by step)."""
        cached, committed, bad_step, bad_pos = torch.stack(
            [st.n_cached, st.n_committed, st.bad_step, st.bad_pos]).tolist()
        bad = [(s, b) for b, s in enumerate(bad_step) if s >= 0]
        if bad:
            step, b = min(bad)
            raise NonFiniteError(step, b, bad_pos[b])
        st.host_cached, st.host_committed = cached, committed
        self.adapter.sync_lengths()
        if hasattr(self.drafter, "sync_lengths"):
            self.drafter.sync_lengths()

    def to_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """The model's ids of the engine's tokens (they differ under a compact vocabulary)."""
        ad = self.adapter
        return ad.to_ids(tokens) if isinstance(ad, CompactVocabulary) else tokens

    def to_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """The engine's tokens of the model's ids."""
        ad = self.adapter
        return ad.to_compact(ids) if isinstance(ad, CompactVocabulary) else ids

    # -- the window on auto -------------------------------------------------------
    def _choose_window(self, batch: int) -> "window.Choice | window.Trial":
        """The window on auto for this batch (window.py): the preset under a skipping schedule (VVS)
        or with trees beside the window, else a width kept from this session's first decode at this
        batch, else a trial in this decode.  The width kept lives on the adapter (one per loaded
        model), by batch, guidance, decode path and device."""
        preset = self.config.window
        if self.config.verify_schedule != "every":
            return window.Choice(preset, window.SKIPS_KEEP_PRESET.format(preset=preset))
        if self.proactive or self.rows:
            what = "proactive drafts" if self.proactive else "row-parallel drafts"
            return window.Choice(preset, window.TREES_KEEP_PRESET.format(preset=preset, what=what))
        kept = self._window_profile().get(self._window_key(batch))
        if kept is not None:
            return window.Choice(kept.width, f"{kept.reason} (kept from this session's first decode at this batch)")
        drafting = "independent" if self.config.draft_coupling == "none" else "coupled"
        return window.Trial(preset, window.Acceptance(window.PRIOR[drafting], preset), batch)

    def _window_profile(self) -> dict:
        # kept on the model's own adapter (a compact vocabulary's wrapper lives as long as its decoder)
        return self.base_adapter.__dict__.setdefault("window_profile", {})

    def _window_key(self, batch: int) -> tuple:
        ad = self.adapter
        return ("kept", batch, self.guided, ad.decode_path, str(ad.device), ad.vocab_size)

    def _memory_mb(self, st: DecodeState, timer: "Timer") -> float:
        if timer.cuda:
            return torch.cuda.max_memory_allocated(self.adapter.device) / 2**20
        return (st.nbytes() + (self.adapter.cache_bytes() or 0)) / 2**20

    def _forward(self, st, tokens, timer):
        ad = self.adapter
        with timer.model():
            logits = ad.forward(tokens)
        check_shape("forward", logits, (ad.branches(self.guided), st.batch, tokens.shape[1], ad.vocab_size))
        return logits

    def _autoregressive(self, st: DecodeState, timer: "Timer"):
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
            check_ar(st)
        none = torch.zeros_like(st.n_committed, dtype=torch.bool)
        st.log.append(("V", st.n_committed, st.n_committed + 1, none, st.n_committed))
        st.n_cached = st.n_cached + 1
        st.n_committed = st.n_committed + 1
        st.host_cached = [n + 1 for n in st.host_cached]
        st.host_committed = [n + 1 for n in st.host_committed]

    def _verify(self, st: DecodeState, timer: "Timer"):
        ad, B, T = self.adapter, st.batch, st.length
        width = None  # the host step's window width where the step on the device runs a wider one
        if st.device_step:  # nothing read on the host: the full window, its rows past the image masked
            waiting, L, near_end = 1, st.drafts + 1, True
            if st.skips and st.last_kind() == "S":  # after a skip the committed tokens lead: as wide as they can be,
                # the rows past the host's width (the drafts plus the most any sample has waiting) masked
                waiting, L = 1 + st.max_commit, L + st.max_commit
                width = st.drafts + (st.n_committed - st.n_cached).max()
        else:
            waiting = max(c - n for c, n in zip(st.host_committed, st.host_cached))
            L = max(1, min(st.drafts + waiting, max(T - n for n in st.host_cached)))
            near_end = max(st.host_cached) + L >= T  # some window rows predict past the image
        scalar = st.scalar  # a batch of one on the host step: lengths as host numbers (state.py)
        base = None if scalar else st.n_cached
        window = st.arange(L)
        if scalar:
            c0 = st.host_cached[0]
            pos, target = st.span(c0, L), st.span(c0 + 1, L)
        else:
            pos = base.unsqueeze(1) + window  # input positions [B, L]
            target = pos + 1  # row j predicts position base + j + 1
        st.window_positions = pos
        # (a batch of one: the window's inputs and the drafts its rows judge, views of one span of seq, which is
        # written only after everything that reads them: JacobiDrafts' new drafts, then the new token)
        tokens_in = st.seq[:, c0:c0 + L + 1] if scalar else None
        inp = tokens_in[:, :L] if scalar else st.seq.gather(1, pos)
        # proactive drafting: alternatives below the newest committed token (row r0)
        levels = min(self.config.proactive_depth - 1, L - waiting) if self.proactive else 0
        if levels > 0:
            r0 = (st.n_committed - base - 1).clamp(min=0)  # finished samples have nothing waiting
            sp = proactive.sprout(st, inp, base, r0, self.proactive, levels)
            E = sp.tokens.shape[1]
            tokens = torch.cat([inp, sp.tokens], 1)
            with timer.model():
                logits = ad.forward_tree(tokens, torch.cat([(window - 1).expand(B, L), sp.parents], 1))
            check_shape("forward_tree", logits, (ad.branches(self.guided), B, L + E, ad.vocab_size))
            every = self.pipeline(logits, torch.cat([target, sp.target], 1), st.buffer("probs", L + E))
            probs = every[:, :L]
            path, counts, tree_new, tree_rejected, on_spine = proactive.walk(sp, every, tokens, st, self.rule,
                                                                          self.exact)
        elif self.rows:
            rd = draft_rows(st, self.row_grid, self.rows, self.config.row_lead, st.drafts, base)
            E = rd.tokens.shape[1]
            sees = torch.zeros(B, L + E, L + E, dtype=torch.bool, device=base.device)
            sees[:, :L, :L] = torch.tril(torch.ones(L, L, dtype=torch.bool, device=base.device))
            sees[:, L:, L:] = rd.sees
            graph = (sees, torch.cat([window.expand(B, L), rd.depth], 1))
            with timer.model():
                logits = ad.forward_tree(torch.cat([inp, rd.tokens], 1), None, graph)
            check_shape("forward_tree", logits, (ad.branches(self.guided), B, L + E, ad.vocab_size))
            every = self.pipeline(logits, torch.cat([target, rd.target], 1), st.buffer("probs", L + E))
            probs = every[:, :L]
            force_fixed(probs, st.fixed.gather(1, target))
            lower = judge_rows(st, self.row_grid, rd, every[:, L + self.row_grid.stride:], self.rule)
        else:
            probs = self.pipeline(self._forward(st, inp, timer), target, st.buffer("probs", L))  # [B, L, V]
        u = st.uniform(rng.VERIFY, target, 2, [c + L + 1 for c in st.host_cached],  # coin, sample
                       [c + 1 for c in st.host_cached])
        coin = u[..., 0]
        committed_before = None if scalar else st.n_committed
        coupled = self.coupled
        residual_draws = None

        # judge the drafts: row j's draft is the token at position base + j + 1, for
        # rows 0..L-2 the window's own next input; coupled drafting judges the last
        # row's draft too (the test is its coupling test, see below)
        tested = L - 1
        judged = L if coupled else tested  # (coupled: the last row's draft too, for the coupling's q)
        x = (tokens_in[:, 1:] if scalar else st.seq.gather(1, target)) if coupled else inp[:, 1:]
        if scalar:
            slots, had = st.span_slots(c0 + 1, L), st.first_rows(st.host_draft_end[0] - c0 - 1, L)
        else:
            slots = target % st.ring_size
            had = target < st.draft_end.unsqueeze(1)  # the row's position holds a draft from before this pass
        ring_rows = st.ring_rows(st.ring, slots)  # the slots' rows in the flattened ring
        # what the draft source reads of this window (state.py)
        st.window_targets, st.window_slots, st.window_had = target, slots, had
        st.window_drafts, st.window_rows, st.window_near_end = (x if coupled else None), ring_rows, near_end
        st.window_width, st.window_last_cdf = width, None  # (the coupled draws may set the latter)
        # coupled drafting draws every row from a residual pass over the window's q rows (dense) or picks
        # the falling rows (large CPU windows); the dense pass's rows of q serve the rule first (a batch of one's
        # are the ring's own where they do not wrap around it: the pass writes the residual beside them)
        dense = coupled and (st.device_step or probs.is_cuda or had.numel() * probs.shape[-1] <= DENSE_RESIDUAL)
        q_rows = None
        if dense:
            q_rows = (st.span_rows(st.ring, c0 + 1, L, "residual", view=True) if scalar
                      else st.rows(st.ring, slots, "residual", ring_rows))
        if judged:
            cut = (lambda t: t) if judged == L else (lambda t: t[:, :judged])
            q = DraftDistributions(st.ring, cut(slots), st.batch_idx, cut(ring_rows),
                                   starts=cut(st.span_starts(c0 + 1, L)) if scalar and q_rows is None else None,
                                   copy=q_rows)
            # (ratios, not min(1, ratio): the uniforms are below 1, so the same tests)
            if coupled and not self.exact:  # the coupling keeps the exact ratio (below): the two at once
                prob, exact_prob = self.rule.ratios(probs, q, x)
            else:
                prob = self.rule.ratio(cut(probs), q, cut(x))  # (coupled under the exact rule: its test stays)
            test = cut(coin) < prob
        if scalar:  # the same rows stand, counted on the host
            passed = self._passed_on_host(st, test, tested, c0, st.host_committed[0] - c0 - 1) if tested else 0
        elif tested:
            ok = test[:, :tested]
            tp = target[:, :-1] if waiting > 1 or st.any_forced or self.rows or near_end else None
            # committed (post-verified) and forced rows stand without a test
            if waiting > 1:
                ok = ok | (tp < st.n_committed.unsqueeze(1))
            if st.any_forced:
                ok = ok | (st.forced_at[tp] >= 0)
            if self.rows:  # a lower row's fixed token stands like a forced one
                ok = ok | (st.fixed.gather(1, tp) >= 0)
            if levels > 0:  # the walk settled the tree's levels: on the spine, its drafts stand
                rows = window[:-1].unsqueeze(0) - r0.unsqueeze(1)
                ok = ok | (on_spine.unsqueeze(1) & (rows >= 0) & (rows < levels))
            if near_end:
                ok = ok & (tp < T)
            if width is not None:  # a row's draft is the next row's input: inside the width
                ok = ok & (window[1:] < width)
            passed = ok.cumprod(1).sum(1)  # rows that stand (a bool's cumprod is int64)
        else:
            passed = torch.zeros(B, dtype=torch.long, device=base.device)
        if levels > 0:  # off the spine the walk decides: its path's length
            passed = torch.where(on_spine, passed, r0 + counts - 1)

        # row `passed` gets the new token: the bonus draw from p when every draft
        # stood, else a draw from the rule's residual (with the same uniform)
        rejected = passed < (tested if width is None else width - 1)
        relax = None
        if coupled:
            # MC-SJD: from row `passed` on, a row whose position holds a draft x (drawn
            # from q) keeps it with probability min(1, p(x) / q(x)), else draws from
            # norm(max(0, p - q)).  That is exact speculative sampling (a maximal
            # coupling of q and p), so the row's token is p-distributed whether it is
            # committed (the first rejection, the bonus) or becomes the next draft.  Coin
            # and draw are the row's verification uniforms, which nothing else reads
            # from the first rejection on: under exact acceptance the test above is the
            # coupling test and one residual pass serves every row.  (Rows before
            # `passed` are never read, so they need not be told apart.)
            stays = test if self.exact else coin < exact_prob
            if judged:
                q.release()  # (the residual pass overwrites the copy)
            # a rule with its own residual (LANTERN) makes its first rejection's row of that pass its own:
            # the row's draw is then the rejection's (the same uniform), with no pass of its own
            if dense and tested and levels == 0 and not self.rows and hasattr(self.rule, "relax_row"):
                relax = partial(self.rule.relax_row, q=q, x=x, rejected=rejected,  # (a batch of one: host numbers)
                                row=min(passed, tested - 1) if scalar else passed.clamp(max=tested - 1))
            drawn, residual_draws, totals = self._coupled_draws(st, probs, slots, had, stays, x, u, q_rows, relax)
        else:
            drawn, totals = rng.categorical(probs, u[..., 1:], st.buffer("cumsum", L)).squeeze(-1), None  # one per row
        if scalar:  # rows that are no distribution (NaN != NaN), inside the image
            if totals is None:
                totals = st.buffer("cumsum", L)[0, :, -1].tolist()
            inside = totals[:max(min(L, T - c0 - 1), 0)]
            total = sum(inside)  # (NaN only if one is: the totals are sums of non-negative numbers)
            bad = [] if total == total else [j for j, t in enumerate(inside) if t != t]
        else:
            bad = st.buffer("cumsum", L)[..., -1].isnan()  # rows that are no distribution
        if levels > 0:
            bad |= (every[:, L:].sum(-1).isnan() & sp.valid).any(1, keepdim=True)
        if self.rows:
            bad |= lower.bad.unsqueeze(1)
        if near_end and not scalar:
            bad &= target < T
        if width is not None:
            bad &= window < width
        # GSD resamples as SJD: the coupled rows' draws are from that residual with the same
        # uniform, so the first rejection's is the one at its row (without mass: the draft)
        from_draws = tested and residual_draws is not None and self.resamples_exactly
        if scalar:  # (the new token is row `passed` of the draws unless a residual's draw replaces it)
            new_tok = (residual_draws if from_draws and rejected else drawn)[:, passed:passed + 1]
            st.window_new_drawn = not (from_draws and rejected)
        else:
            new_tok = (torch.where(rejected.unsqueeze(1), residual_draws, drawn) if from_draws
                       else drawn).gather(1, passed.unsqueeze(1))
        if tested and not (coupled and self.exact) and relax is None and not from_draws:
            # the first rejection resamples from the rule's residual (same uniform)
            row = (st.count(min(passed, tested - 1)) if scalar else passed.clamp(max=tested - 1)).unsqueeze(1)
            p_row = probs.gather(1, row.unsqueeze(2).expand(-1, -1, probs.shape[-1])).squeeze(1)
            q_row = st.rows(st.ring, slots.gather(1, row), "q_row").squeeze(1)
            res = self.rule.residual(p_row, q_row, inp.gather(1, row + 1).squeeze(1))
            # p and q equal to float precision leave no residual mass: fall back to p
            res = torch.where(res.sum(-1, keepdim=True) >= rng.MIN_MASS, res, p_row)
            redraw = rng.categorical(res, u[..., 1].gather(1, row))
            if scalar:
                new_tok = redraw if rejected else new_tok
                st.window_new_drawn = st.window_new_drawn and not rejected
            else:
                new_tok = torch.where(rejected.unsqueeze(1), redraw, new_tok)

        nodes = None
        if levels > 0:
            # off the spine: the walk's new token, its path's tokens and rows (the ring keeps a
            # committed position's row), and its nodes in the cache
            new_tok = torch.where(on_spine, new_tok.squeeze(1), tree_new).unsqueeze(1)
            rejected = torch.where(on_spine, rejected, tree_rejected)
            depth = window.unsqueeze(0) - r0.unsqueeze(1)
            on_path = ~on_spine.unsqueeze(1) & (depth >= 0) & (depth < counts.unsqueeze(1))
            walked = path.gather(1, depth.clamp(0, levels))
            nodes = torch.where(on_path, sp.walk_rows.gather(1, walked), window)  # forward rows by window row
            # the window's rows (a view of `every`, read for nothing else now) take the path's at its
            # levels: only those rows can differ
            rows = r0.unsqueeze(1) + st.arange(levels + 1)
            V = probs.shape[-1]
            probs.scatter_(1, rows.unsqueeze(-1).expand(-1, -1, V),
                           every.gather(1, nodes.gather(1, rows).unsqueeze(-1).expand(-1, -1, V)))
        # next drafts (Jacobi: the tail); the new token lands after them
        if scalar:
            st.window_passed = passed
            self.drafter.after_verify(st, probs, drawn, None)
            return self._commit_on_host(st, L, c0, passed, rejected, new_tok, bad, near_end)
        self.drafter.after_verify(st, probs, drawn, passed)
        if nodes is not None:
            moved = on_path & (depth > 0)
            st.seq.scatter_(1, torch.where(moved, pos, st.scratch), tokens.gather(1, nodes))
        # the cache keeps the input rows that stand; the new token lands after them
        keep = passed + 1
        at = base + keep
        stop = at.unsqueeze(1)
        st.seq.scatter_(1, torch.where(stop < T, stop, st.scratch) if near_end else stop, new_tok)
        committed = at + 1
        if near_end:
            keep = torch.minimum(keep, (T - base).clamp(min=0))
            committed = committed.clamp(max=T).maximum(committed_before)
        st.n_cached = base + keep if near_end else at
        st.n_committed = committed
        st.log.append(("V", committed_before, committed, rejected, at))
        if st.skips:
            st.produced += committed - committed_before
            st.verified += committed_before < T
        st.verified_since_skip += 1

        plan = self.schedule.plan(st)  # (a uniform skip is due by the host's count; on the device its lengths stay)
        if st.device_step:  # the first bad row stays on the device until the host reads (_read)
            first_bad = torch.where(bad.any(1), bad.int().argmax(1), -1)
            st.note_bad(first_bad, base + first_bad + 1)
            dropped, kept, plan = L - keep, keep, (None if plan is None else (plan, None))
        else:
            sync = torch.stack([st.n_cached, st.n_committed, keep, bad.sum(1)]  # (one dtype: no promotion)
                               + ([plan] if plan is not None else [])).tolist()
            if any(sync[3]):  # (where, read only now: the rows' totals are read with the lengths)
                raise_if_nonfinite(sync[3], st.step, [c + j + 1 for c, j in zip(st.host_cached,
                                                                                bad.int().argmax(1).tolist())])
            st.host_cached, st.host_committed = sync[0], sync[1]
            dropped, kept = [L - n for n in sync[2]], sync[2]
            # a skip is taken unless a sample dissents (one with nothing to commit abstains)
            plan = (plan, sync[4]) if plan is not None and min(sync[4]) >= 0 else None
        if nodes is None and self.rows:  # the window rows that stand stay, the rows' chains leave
            nodes = window.expand(B, L)
        if nodes is None:
            ad.rollback(dropped)  # the rejected rows leave the cache (a device tensor on the device)
        else:  # the window rows that stand (or the walk's path) stay, the tree's other nodes leave
            ad.keep_tree(nodes, kept)
        # (a due skip's extension drawn in this one: not on the device, nor under lower rows' drafts, which settle
        # after the extension and before the skip)
        self._extend(st, skip=None if st.device_step or self.rows else plan)
        if self.rows:  # the lower rows' draws and drafts (after the window's: see settle_rows)
            settle_rows(st, lower)
        return plan

    @staticmethod
    def _passed_on_host(st: DecodeState, test: torch.Tensor, tested: int, c0: int, standing: int) -> int:
        """A batch of one's rows that stand (``_verify``'s ``passed``): the leading rows whose draft passed its
        test, was committed before (the first ``standing``) or is forced, inside the image."""
        ok, forced = test.tolist()[0], st.forced_host() if st.any_forced else None
        end = min(tested, st.length - c0 - 1)
        passed = 0
        while passed < end and (ok[passed] or passed < standing or (forced is not None and forced[c0 + 1 + passed])):
            passed += 1
        return passed

    def _commit_on_host(self, st: DecodeState, L: int, c0: int, passed: int, rejected: bool, new_tok, bad,
                        near_end: bool):
        """``_verify``'s commit for a batch of one on the host step: the same lengths, log and plan, from host
        numbers (the lengths' tensors are views of the state's tables)."""
        T = st.length
        keep = passed + 1
        at = c0 + keep
        if at < T and not st.window_new_written:  # (the draft source may have written it with the new drafts)
            st.seq[:, at:at + 1] = new_tok
        before, committed = st.host_committed[0], at + 1
        if near_end:
            keep = min(keep, max(T - c0, 0))
            committed = max(min(committed, T), before)
        st.n_cached, st.n_committed = c0 + keep, committed  # (host numbers: a view is cut when read, state.py)
        st.log.append(("V", before, committed, rejected, at))  # (host numbers: report.py reads them)
        counts = st.scalar_counts
        counts["committed"] = committed
        if st.skips:
            counts["produced"] += committed - before
            counts["verified"] += before < T
            st.produced, st.verified = counts["produced"], counts["verified"]
        st.verified_since_skip += 1
        plan = self.schedule.plan(st)
        if bad:
            raise_if_nonfinite([len(bad)], st.step, [c0 + bad[0] + 1])
        st.host_cached, st.host_committed = [c0 + keep], [committed]
        if plan is not None:  # a skip is taken unless the sample abstains
            m = plan.tolist()
            plan = (plan, m) if min(m) >= 0 else None
        self.adapter.rollback([L - keep])
        self._extend(st, skip=plan)
        return plan

    def _tree_step(self, st: DecodeState, timer: "Timer"):
        """A step on a draft tree (``tree.py``) from the committed prefix: VVS's
        schedule may commit one of its paths without a forward (``_skip_tree``),
        else one forward verifies it (``_verify_tree``)."""
        tokens, parents, valid, rows = self.drafter.tree(st, self.config)
        skip = self.schedule.skip_tree(st, tokens, parents, valid) if st.skips else None
        if skip is not None and bool(skip.all()):  # a batch skips together
            self._skip_tree(st, tokens, parents, valid)
        else:
            self._verify_tree(st, timer, tokens, parents, valid, rows)
        return None

    def _skip_tree(self, st: DecodeState, tokens, parents, valid):
        """VVS on a tree (sec. 4.2): commit one root-to-leaf path, chosen uniformly
        among the tree's, truncated to the tree's mean path length; the next forward
        verifies after it (post-verification)."""
        from .tree import leaf_paths

        u = rng.uniform(st.keys, st.step, rng.PATHS, st.n_committed.unsqueeze(1))
        paths, mean = leaf_paths(parents, valid, u)
        path = paths[:, 0]  # [B, D]
        m = torch.minimum(torch.floor(mean).long(), (path >= 0).sum(1))
        m = torch.minimum(m, (st.length - st.n_committed).clamp(min=0))
        D = path.shape[1]
        pos = st.n_committed.unsqueeze(1) + st.arange(D)
        take = st.arange(D).unsqueeze(0) < m.unsqueeze(1)
        st.seq.scatter_(1, torch.where(take, pos, st.scratch), tokens.gather(1, path.clamp(min=0)))
        st.log.append(("S", st.n_committed, st.n_committed + m, m > 0, None))
        st.n_committed = st.n_committed + m
        st.host_committed = st.n_committed.tolist()
        st.verified_since_skip = 0

    def _verify_tree(self, st: DecodeState, timer: "Timer", tokens, parents, valid, rows=None):
        """One forward over the committed tokens the target has not scored (the last
        one the root; more than one after a skip: they are prepended and stand, VVS's
        post-verification) and the draft tree hung below the root; the walk from the
        root keeps the accepted path, which the caches keep, and draws the new token
        after it."""
        from .tree import accept_path, children, depths

        ad, B, T = self.adapter, st.batch, st.length
        N = tokens.shape[1]
        base = st.n_cached
        waiting = st.n_committed - base  # >= 1
        # (the step on the device verifies every step: one token waits, the last committed)
        W = 1 if st.device_step else max(c - k for c, k in zip(st.host_committed, st.host_cached))
        chain = st.arange(W).unsqueeze(0)
        root = waiting - 1
        full_tok = torch.cat([st.seq.gather(1, (base.unsqueeze(1) + chain).clamp(max=st.seq.shape[1] - 1)), tokens], 1)
        full_par = torch.cat([(chain - 1).expand(B, W), torch.where(parents >= 0, parents + W, root.unsqueeze(1))], 1)
        full_valid = torch.cat([chain < waiting.unsqueeze(1), valid], 1)
        target = base.unsqueeze(1) + depths(full_par) + 1  # the position each row predicts
        with timer.model():
            logits = ad.forward_tree(full_tok, full_par)
        M = W + N
        check_shape("forward_tree", logits, (ad.branches(self.guided), B, M, ad.vocab_size))
        probs = self.pipeline(logits, target, st.buffer("probs", M))  # [B, M, V]
        u = rng.uniform(st.keys, st.step, rng.VERIFY, st.arange(M).expand(B, -1), lanes=2)
        kids = children(full_par, full_valid & (st.arange(M).unsqueeze(0) >= W))  # the tree's nodes only
        levels = self.tree_levels
        draft_rows = None
        if rows is not None:  # the draft rows by forward row: the root's at the root, the nodes' after the chain
            draft_rows = rows.new_zeros(B, M, rows.shape[-1])
            draft_rows[st.batch_idx.view(-1), root] = rows[:, 0]
            draft_rows[:, W:] = rows[:, 1:]
        path, counts, new, rejected = accept_path(probs, full_tok, kids, root, self.rule, u[..., 0],
                                                  u[:, : levels + 1, 1], levels, self.exact, draft_rows)
        committed_before = st.n_committed
        done = committed_before >= T  # finished samples ride along: they keep nothing
        keep = torch.where(done, 0, waiting - 1 + counts)  # the waiting chain, then the accepted nodes
        bad = probs.sum(-1).isnan() & (target < T) & full_valid & ~done.unsqueeze(1)
        first_bad = torch.where(bad.any(1), bad.int().argmax(1), -1)

        # kept nodes: the chain before the root, then the walk's path from the root
        nodes = torch.cat([chain.expand(B, W), path[:, 1:]], 1)
        shift = (W - waiting).unsqueeze(1)  # the path follows the sample's own chain
        idx = st.arange(nodes.shape[1]).unsqueeze(0)
        nodes = torch.where(idx < waiting.unsqueeze(1), nodes,
                            nodes.gather(1, (idx + shift).clamp(max=nodes.shape[1] - 1)))
        self.drafter.after_tree(st, nodes, keep)
        at = base.unsqueeze(1) + idx
        kept = idx < keep.unsqueeze(1)
        st.seq.scatter_(1, torch.where(kept & (idx >= waiting.unsqueeze(1)), at, st.scratch), full_tok.gather(1, nodes))
        stop = base + keep  # where the new token goes
        st.seq.scatter_(1, torch.where((stop < T) & ~done, stop, st.scratch).unsqueeze(1), new.unsqueeze(1))
        committed = torch.where(done, committed_before, (stop + 1).clamp(max=T))
        st.n_cached = base + keep
        st.n_committed = committed
        st.log.append(("V", committed_before, committed, rejected & ~done, stop))
        if st.skips:
            st.produced += committed - committed_before
            st.verified += committed_before < T
        st.verified_since_skip += 1
        if st.device_step:  # a bad row stays on the device until the host reads (_read)
            st.note_bad(first_bad, base + 1)
            kept = keep
        else:
            sync = torch.stack([st.n_cached, st.n_committed, keep, first_bad]).tolist()
            raise_if_nonfinite([j >= 0 for j in sync[3]], st.step, [c + 1 for c in st.host_cached])
            st.host_cached, st.host_committed, kept = sync[0], sync[1], sync[2]
        ad.keep_tree(nodes, kept)  # the waiting chain and the accepted nodes stay, the rest leaves

    @staticmethod
    def _coupled_draws(st, probs, slots, had, stays, x, u, q_rows, relax=None):
        """One token per window row, each with the row's sample uniform: the draft
        ``x`` where the row had one and it stays, a draw from ``norm(max(0, p - q))``
        (``q``: the draft's row in the ring) where it falls, a draw from ``p`` where
        the row had no draft.  Where the residual has no mass (``p`` and ``q`` equal
        to float precision, so ``min(1, p / q)`` is 1 but for rounding) the draft
        stays.  The draws go through ``st.buffer("cumsum")`` (the engine reads its
        row totals for NaN).

        On CUDA, and on CPU while rows x vocabulary stay under ``DENSE_RESIDUAL``,
        each row is drawn once from ``max(0, p - had * q)`` (a few whole-window ops,
        no host sync); larger CPU windows draw every row from ``p`` and then pick the
        falling rows, so rows that keep their draft cost no pass over the
        vocabulary.  Both give the same tokens; the caller chooses (``q_rows``: the window's q rows, copied
        into ``st.buffer("residual")`` or a batch of one's ring rows themselves, for the dense path, which writes
        the residual into that buffer; ``_verify``: the step on the device draws densely
        too, as picking rows would read their number on the host).  Also returns the dense
        path's residual draw of every row (the draft where the residual has no mass; None on the other path) and, for
        a batch of one on the dense path, its rows' residual totals as the host read them (else None).  ``relax``
        (dense path only): ``relax(res, p)`` makes one row per sample the rule's residual."""
        B, L, V = probs.shape
        if q_rows is not None:
            # rows without a draft draw from p: their q counts as zero (a batch of one's rows that all had one:
            # the same numbers without the mask)
            every = st.scalar and st.host_draft_end[0] - st.host_cached[0] - 1 >= L
            out = st.buffer("residual", L)  # (q_rows itself, or beside the ring's rows: span_rows)
            res = (torch.sub(probs, q_rows, out=out) if every
                   else torch.addcmul(probs, q_rows, had.unsqueeze(-1), value=-1, out=out)).clamp_(min=0.0)
            if relax is not None:
                relax(res, probs)
            cumsum = st.buffer("cumsum", L)
            drawn = rng.categorical(res, u[..., 1:], cumsum, empty="past-end").squeeze(-1)
            # a residual without mass (p and q equal to float precision) keeps the draft; a batch of one reads
            # its rows' totals here (for NaN, _verify) and skips this where every row has mass
            totals = cumsum[0, :, -1].tolist() if st.scalar else None
            # the last row held no draft: its sums are p's, which the next extension draws from (drafts.py)
            st.window_last_cdf = (cumsum[:, L - 1], totals[L - 1]) if st.scalar and not every else None
            # (every total is a sum of non-negative numbers: NaN in their sum where one is)
            if totals is None or not min(totals) >= rng.MIN_MASS or (s := sum(totals)) != s:
                drawn = torch.where(drawn == V, x, drawn)
            return torch.where(stays if every else had & stays, x, drawn), drawn, totals
        redo = had & ~stays
        samples = rng.categorical(probs, u[..., 1:], st.buffer("cumsum", L)).squeeze(-1)
        tokens = torch.where(had, x, samples)
        idx = redo.view(-1).nonzero().squeeze(1)
        n = idx.numel()
        res = st.buffer("residual", L).view(-1, V)[:n]
        q = st.buffer("residual_q", L).view(-1, V)[:n]
        torch.index_select(probs.reshape(-1, V), 0, idx, out=res)
        flat = (st.batch_idx * st.ring.shape[1] + slots).view(-1)
        torch.index_select(st.ring.view(-1, V), 0, flat[idx], out=q)
        res.sub_(q).clamp_(min=0.0)
        draws = rng.categorical(res, u.reshape(-1, 2)[idx, 1:], q, empty="past-end")
        tokens.view(-1).index_copy_(0, idx, draws.view(-1))
        return torch.where(tokens < V, tokens, x), None, None

    def _skip(self, st: DecodeState, m: torch.Tensor, m_host: list[int] | None):
        """Commit ``m[b]`` informed drafts of each sample without a forward (``m_host``: the host's
        copy; None on the step on the device, which reads the lengths later)."""
        if st.scalar:  # (host numbers: state.py, report.py)
            before = st.host_committed[0]
            after = st.scalar_counts["committed"] = before + m_host[0]
            st.log.append(("S", before, after, m_host[0] > 0, None))
        else:
            after = st.n_committed + m
            st.log.append(("S", st.n_committed, after, m > 0, None))
        st.n_committed = after
        if m_host is not None:
            st.host_committed = [c + d for c, d in zip(st.host_committed, m_host)]
        st.verified_since_skip = 0
        self._extend(st, after_skip=True)

    def _extend(self, st: DecodeState, after_skip: bool = False, skip: tuple | None = None):
        """Initialise drafts up to ``n_committed + horizon`` for every sample (``skip``: the host step's
        plan of a skip due next, ``(m, m_host)``)."""
        if st.device_step:  # as many positions as the horizon, those past a sample's stop masked
            start = torch.maximum(st.draft_end, st.n_committed)
            stop = (st.n_committed + st.horizon).clamp(max=st.length)
            st.extend_span = None
            # (a skip follows a verify step that drafted the horizon: it needs as many as it committed)
            width = min(st.max_commit, st.horizon) if after_skip else st.horizon
            if width:
                self.drafter.extend(st, start, stop, width)
            st.draft_end = torch.maximum(start, stop)
        else:
            self._extend_on_host(st, skip)
        if st.fixed is not None:  # a lower row's fixed token is the draft at its position
            torch.where(st.fixed >= 0, st.fixed, st.seq, out=st.seq)

    def _extend_on_host(self, st: DecodeState, skip: tuple | None = None):
        # never over committed tokens: a source may leave draft_end behind them
        st.host_draft_end = [max(d, c) for d, c in zip(st.host_draft_end, st.host_committed)]
        # no drafts past the image: no window scores them (a draft model would spend forwards on them)
        stop = [min(c + st.horizon, st.length) for c in st.host_committed]
        st.extend_split, ahead = None, None
        if (skip is not None and st.settled and any(skip[1])
                and getattr(self.drafter, "extends_past_skip", lambda st: False)(st)):
            # a skip is due next: its extension drawn now, past this one's stop with its step's numbers (the
            # same drafts, one extension a forward instead of two)
            ahead, st.extend_split = skip[0], (stop, st.step + 1)
            stop = [min(c + m + st.horizon, st.length) for c, m in zip(st.host_committed, skip[1])]
        width = max(e - d for e, d in zip(stop, st.host_draft_end))
        if width > 0:
            st.extend_span = (st.host_draft_end, stop)
            if st.scalar:  # the same lengths as host numbers (the host's mirror is exact: state.py)
                self.drafter.extend(st, st.host_draft_end[0], stop[0], width)
                st.host_draft_end = [max(st.host_draft_end[0], stop[0])]
                st.draft_end = st.host_draft_end[0]
            else:
                st.draft_end = torch.maximum(st.draft_end, st.n_committed)
                stop_t = (st.n_committed + st.horizon + (0 if ahead is None else ahead)).clamp(max=st.length)
                self.drafter.extend(st, st.draft_end, stop_t, width)
                st.host_draft_end = [max(d, e) for d, e in zip(st.host_draft_end, stop)]
                st.draft_end = torch.maximum(st.draft_end, stop_t)

    def _notify(self, callback, st):
        if callback is None:
            return
        committed, cached = list(st.host_committed), list(st.host_cached)
        if st.left:  # the whole batch, the images that left it finished
            committed, cached = [st.length] * len(st.origin_seeds), [st.length] * len(st.origin_seeds)
            for i, b in enumerate(st.origin):
                committed[b], cached[b] = st.host_committed[i], st.host_cached[i]
        callback(StepEvent(
            step=st.step, kind=st.log[-1][0], committed=committed, cached=cached, length=st.length,
            nfe=sum(k != "S" for k, *_ in st.log) + sum(k != "S" for _, _, part in st.log_parts for k, *_ in part),
            tokens=self.to_ids(st.whole_seq()),
        ))
