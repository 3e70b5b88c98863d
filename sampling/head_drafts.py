"""Chain drafts from a draft head (EAGLE-style, as LANTERN's drafters): a small
network that reads the target's own last hidden states.

:class:`HeadDrafts` is a draft source (``drafts.py``).  The head's input for the
token at stream position ``s`` is that token and the target's feature at ``s - 1``
(its final hidden state there, which predicted ``s``); its output ``g_s`` stands
in for the target's feature at ``s``, so the target's output head turns it into
the draft distribution ``q`` of position ``s + 1``, processed like the target's
(guidance, grammar, temperature, top-k, top-p).  Each later draft feeds the
previous draft with the head's own ``g`` (chain drafting).  Exact acceptance
stays lossless whatever the head is: ``q`` goes to the ring as the draft's.

What the target gives (``adapter.py``): with ``keep_features`` set, every call
leaves its final hidden states in ``adapter.features`` (``[R, B, L, H]``, one
row block per guidance branch it runs), and ``logits_from_features`` applies its
output head.  The head runs the same ``R`` rows (the drafts of every branch are
the same tokens), so guidance mixes the head's logits as it mixes the target's.

Caches: the head keeps its own KV cache per row; it holds the inputs whose
features were real (the committed prefix the target has cached, plus the next
token) and, after drafting, the speculative ones, which are rolled back before
the next catch-up.  Target features are kept by stream position; those of
positions the target has cached are real.  When a skipping schedule commits
drafts the target has not scored yet, the head chains through them with its own
features until real ones arrive (VVS's stale features).

Random numbers: draft ``t`` of sample ``b`` uses ``rng.uniform(keys, step, DRAFT,
t)``, so an image's drafts do not depend on its batch.
"""
from __future__ import annotations

import torch

from . import rng
from .adapter import ImageAdapter
from .config import ConfigError
from .processing import build_pipeline
from .state import DecodeState


class HeadDrafts:
    """Draft source running ``head`` (``loaders/draft_head.py``: ``spec``, ``name``,
    ``new_cache(rows, positions)``, ``step(tokens, features, cache)``) on a target's
    features."""

    redraw = "independent"  # drafts past a rejection are replaced, not redrawn

    def __init__(self, head, name: str | None = None):
        self.head, self.name = head, name or head.name
        self.timer = None

    # -- set-up --------------------------------------------------------------
    def check(self, target: ImageAdapter) -> None:
        """One clear error when the head cannot draft for ``target``; otherwise ask
        the target to keep its features."""
        s, problems = self.head.spec, []
        if type(target).logits_from_features is ImageAdapter.logits_from_features:
            raise ConfigError(f"the {self.name} needs the target's hidden states, which this model's adapter "
                              f"({type(target).__name__}) does not give")
        if s.vocab != target.vocab_size:
            problems.append(f"{s.vocab} token embeddings, the target's vocabulary has {target.vocab_size} ids")
        width = getattr(target, "feature_size", None)
        if width is not None and width != s.hidden:
            problems.append(f"width {s.hidden}, the target's hidden states have {width}")
        rows, cols = target.layout.grid
        if s.grid and (s.grid != rows or s.grid != cols):
            problems.append(f"a {s.grid}x{s.grid} position grid, the target draws {rows}x{cols} tokens")
        if s.prompt_inputs and not hasattr(target, "prompt_rows"):
            problems.append("to read the prompt's tokens, which this model's adapter does not give")
        cond = getattr(target, "condition_positions", None)
        if s.condition_inputs and cond is not None and cond - 1 != s.condition_inputs:
            problems.append(f"{s.condition_inputs + 1} condition positions, the target has {cond}")
        if problems:
            raise ConfigError(f"the {self.name} cannot draft for this model: it has " + "; ".join(problems))
        target.keep_features = True
        self.target = target

    def start(self, st: DecodeState, conditions, negatives, guided: bool, config, timer) -> None:
        """After the target's prefill: the head reads the condition (when it was
        trained to) and keeps the feature that predicted image token 0."""
        t = self.target
        self.pipeline = build_pipeline(config, t.layout, t.guidance, t.device)
        self.timer = timer
        cond = t.features  # [R, B, C, H]
        R, B, C, H = cond.shape
        if H != self.head.spec.hidden:
            raise ConfigError(f"the {self.name} has width {self.head.spec.hidden}, the target's hidden states "
                              f"have {H}")
        self.rows = R
        spec = self.head.spec
        self.cache = self.head.new_cache(R * B, st.length + st.max_window + 2, C - 1 if spec.prompt_inputs else 0)
        # target features by stream position + 1 (slot 0: the condition's last position)
        self.features = cond.new_zeros(R, B, st.length + 2 * st.max_window + 2, H)
        self.features[:, :, 0] = cond[:, :, -1]
        before = cond[:, :, :-1].reshape(R * B, C - 1, H)  # each with the token after it
        if spec.condition_inputs:  # LlamaGen t2i heads: the caption, each feature with token 0
            if C - 1 != spec.condition_inputs:
                raise ConfigError(f"the {self.name} reads {spec.condition_inputs + 1} condition positions, the "
                                  f"target gave {C}")
            with timer.model("drafter"):
                self.head.step(torch.zeros(R * B, C - 1, dtype=torch.long, device=cond.device), before, self.cache)
        elif spec.prompt_inputs and C > 1:  # the prompt, each feature with the next token; padding masked
            # (a row's rotary positions then start later by its padding, which rotary attention
            # cannot tell: it sees only differences of positions)
            ids, mask = self.target.prompt_rows
            self.cache.key_ok[:, :C - 1] = mask[:, 1:].bool()
            with timer.model("drafter"):
                self.head.step(ids[:, 1:], before, self.cache)
        self.real = [0] * B  # image inputs in the head's cache whose features were the target's
        self.spec_len = [0] * B  # speculative inputs after them

    def finish(self) -> None:
        self.cache = self.features = None
        self.target.features = None

    # -- the draft source calls ------------------------------------------------
    def after_verify(self, st: DecodeState, probs, samples, first_new):
        feats = self.target.features  # [R, B, L, H] at the window's input positions
        slots = (st.window_positions + 1).clamp(max=self.features.shape[2] - 1)
        self.features[:, st.batch_idx, slots] = feats
        # drafts after the new token were proposed from a rejected prefix: drop them
        st.draft_end = st.window_positions[:, 0] + first_new + 1
        st.host_draft_end = [0] * st.batch  # the engine raises it to the committed length

    def extend(self, st: DecodeState, start: torch.Tensor, stop: torch.Tensor, width: int):
        B, R, device = st.batch, self.rows, st.seq.device
        committed, cached = st.host_committed, st.host_cached
        self._rollback(self.spec_len)
        self.spec_len = [0] * B
        # catch up on the inputs with real features: x_s with f_{s-1}, for s up to the
        # last committed token and while the target has scored s - 1; at least one
        # input, so that the head's output for the last one is at hand
        last = [min(c - 1, k) for c, k in zip(committed, cached)]
        first = [min(r, e) for r, e in zip(self.real, last)]
        self._rollback([r - f for r, f in zip(self.real, first)])
        feed = [e + 1 - f for e, f in zip(last, first)]
        k = max(feed)
        cols = torch.tensor(first, device=device).unsqueeze(1) + st.arange(k)  # [B, k] stream positions
        cols = torch.minimum(cols, torch.tensor(last, device=device).unsqueeze(1))  # padding repeats the last
        out = self._step(st.seq.gather(1, cols), self.features[:, st.batch_idx, cols])  # [R*B, k, H]
        self._rollback([k - n for n in feed])
        self.real = [e + 1 for e in last]
        at = torch.tensor([n - 1 for n in feed], device=device)
        g = out.view(R, B, k, -1)[:, torch.arange(B, device=device), at].unsqueeze(2)  # [R, B, 1, H]
        # then chain: tokens already there (committed ones the target has not scored,
        # after a skip, and drafts kept from before) are fed as they are; every later
        # position gets a draft from the head's q
        pos = torch.tensor(self.real, device=device).unsqueeze(1)  # the position g predicts
        steps = max(c + st.horizon - r for c, r in zip(committed, self.real))
        for j in range(steps):
            if j:
                g = self._step(tok, g.reshape(R * B, 1, -1)).view(R, B, 1, -1)
                self.spec_len = [n + 1 for n in self.spec_len]
            with self.timer.model("drafter"), torch.no_grad():
                logits = self.target.logits_from_features(g)
            drafting = pos >= start.unsqueeze(1)
            q = self.pipeline(logits, pos)  # [B, 1, V]
            u = rng.uniform(st.keys, st.step, rng.DRAFT, pos)
            tok = torch.where(drafting, rng.categorical(q, u.unsqueeze(-1)).view(B, 1),
                              st.seq.gather(1, pos.clamp(max=st.seq.shape[1] - 1)))
            valid = drafting & (pos < stop.unsqueeze(1))
            st.seq.scatter_(1, torch.where(valid, pos, st.scratch), tok)
            st.ring[st.batch_idx, torch.where(valid, pos % st.ring_size, st.ring_size)] = q
            pos = pos + 1
        st.informed_end = torch.maximum(st.informed_end, stop)

    # -- helpers ---------------------------------------------------------------
    def _step(self, tokens, features):
        """One head forward over ``tokens`` ``[B, k]`` (the same for every branch)."""
        R = self.rows
        with self.timer.model("drafter"):
            return self.head.step(tokens.repeat(R, 1), features.reshape(R * tokens.shape[0], tokens.shape[1], -1),
                                  self.cache)

    def _rollback(self, n):
        if any(n):
            self.cache.advance([-m for m in n] * self.rows)
