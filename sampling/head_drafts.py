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
drafts the target has not scored yet, the head reads them with stale features,
the most recent real ones (VVS, sec. 4.3), until the target's own arrive with
the next verification (VVS's post-verification).

Random numbers: draft ``t`` of sample ``b`` uses ``rng.uniform(keys, step, DRAFT,
t)``, so an image's drafts do not depend on its batch.
"""
from __future__ import annotations

import torch

from . import rng
from .adapter import ImageAdapter
from .compact import CompactVocabulary
from .config import ConfigError
from .processing import build_pipeline
from .state import DecodeState, kept


class HeadDrafts:
    """Draft source running ``head`` on a target's features.  A head (``loaders/draft_head.py``)
    provides ``spec`` and ``name``; ``new_cache(rows, positions, prompt=0)``, a cache with
    ``host_length`` (its rows' lengths, a host list) and ``advance(n)`` (add ``n[row]``
    positions, negative to roll back); ``step(tokens, features, cache)`` for chains;
    and, for draft trees, ``step_tree(tokens, features, depth, within, start, cache)``
    (``within``: each node's ancestors in the tree so far)."""

    redraw = "independent"  # drafts past a rejection are replaced, not redrawn
    #: on the engine's step on the device it catches up at a fixed width and rolls its cache back by
    #: device tensors (``_catch_up_on_device``): nothing it does reads the host
    drafts_on_device = True
    #: it draws through the target's head and feeds the model's ids to its own embedding, so it
    #: follows a compact vocabulary (``compact.py``): the engine may wrap the target it checks
    follows_compact_vocabulary = True

    def __init__(self, head, name: str | None = None):
        self.head, self.name = head, name or head.name
        self.timer = None

    # -- set-up --------------------------------------------------------------
    def check(self, target: ImageAdapter) -> None:
        """One clear error when the head cannot draft for ``target``; otherwise ask
        the target to keep its features."""
        s, problems = self.head.spec, []
        model = target.inner if isinstance(target, CompactVocabulary) else target  # the model's own ids
        if type(model).logits_from_features is ImageAdapter.logits_from_features:
            raise ConfigError(f"the {self.name} needs the target's hidden states, which this model's adapter "
                              f"({type(model).__name__}) does not give")
        if s.vocab != model.vocab_size:
            problems.append(f"{s.vocab} token embeddings, the target's vocabulary has {model.vocab_size} ids")
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
        self.ids = target.to_ids if isinstance(target, CompactVocabulary) else (lambda tokens: tokens)

    def start(self, st: DecodeState, conditions, negatives, guided: bool, config, timer) -> None:
        """After the target's prefill: the head reads the condition (when it was
        trained to) and keeps the feature that predicted image token 0."""
        t = self.target
        self.pipeline = build_pipeline(config, t.layout, t.guidance, t.device,
                                       scales=t.guidance_scales(config.cfg_scale))
        self.timer = timer
        if config.tree in ("static", "sampled"):
            from .tree import static_shape

            self.shape = static_shape(config.tree_choices, config.tree_tokens, config.tree_top_k, config.depth)
        cond = t.features  # [R, B, C, H]
        R, B, C, H = cond.shape
        if H != self.head.spec.hidden:
            raise ConfigError(f"the {self.name} has width {self.head.spec.hidden}, the target's hidden states "
                              f"have {H}")
        self.rows = R
        spec = self.head.spec
        room = st.length + st.max_window + 2  # the image, drafts past its end, and a tree's nodes
        if config.tree != "chain":
            room += config.tree_top_k * config.depth + config.tree_tokens
        self.cache = self.head.new_cache(R * B, room, C - 1 if spec.prompt_inputs else 0)
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
        # image inputs in the head's cache whose features were the target's, and speculative inputs
        # after them: host lists, or device tensors on the engine's step on the device
        if st.device_step:
            self.real = torch.zeros(B, dtype=torch.long, device=cond.device)
            self.spec_len = torch.zeros_like(self.real)
        else:
            self.real, self.spec_len = [0] * B, [0] * B

    def finish(self) -> None:
        self.cache = self.features = None
        self.target.features = None

    leaves = True  # finished images may leave the batch (engine.py): keep_samples

    def keep_samples(self, keep: list[int]) -> None:
        """Only the images ``keep`` stay: the head's cache rows (each of its ``rows`` branches), the
        target features it drafts from, and its lengths."""
        B = self.features.shape[1]
        self.cache.keep_rows([r * B + b for r in range(self.rows) for b in keep])
        self.features = self.features[:, keep]
        self.real, self.spec_len = kept(self.real, keep), kept(self.spec_len, keep)

    # -- the draft source calls ------------------------------------------------
    def after_verify(self, st: DecodeState, probs, samples, first_new):
        feats = self.target.features  # [R, B, L, H] at the window's input positions
        slots = (st.window_positions + 1).clamp(max=self.features.shape[2] - 1)
        self.features[:, st.batch_idx, slots] = feats
        # drafts after the new token were proposed from a rejected prefix: drop them
        st.draft_end = st.window_positions[:, 0] + first_new + 1
        st.host_draft_end = [0] * st.batch  # the engine raises it to the committed length

    def extend(self, st: DecodeState, start: torch.Tensor, stop: torch.Tensor, width: int):
        B, R = st.batch, self.rows
        g = self._catch_up(st)
        # then chain: drafts already there (kept from before a skip) are fed as they are;
        # every later position gets a draft from the head's q
        pos = st.n_committed.unsqueeze(1)  # the position g predicts
        steps = st.horizon
        tok = None  # each step's drafted token, fed to the head in the next
        for j in range(steps):
            if j:
                g = self._step(tok, g.reshape(R * B, 1, -1)).view(R, B, 1, -1)
                self._add_spec(1)
            q = self._q(g, pos)  # [B, 1, V]
            drafting = pos >= start.unsqueeze(1)
            u = rng.uniform(st.keys, st.step, rng.DRAFT, pos)
            tok = torch.where(drafting, rng.categorical(q, u.unsqueeze(-1)).view(B, 1),
                              st.seq.gather(1, pos.clamp(max=st.seq.shape[1] - 1)))
            valid = drafting & (pos < stop.unsqueeze(1))
            st.seq.scatter_(1, torch.where(valid, pos, st.scratch), tok)
            st.put_rows(st.ring, torch.where(valid, pos % st.ring_size, st.ring_size), q)
            pos = pos + 1
        st.informed_end = torch.maximum(st.informed_end, stop)

    def tree(self, st: DecodeState, config):
        """A draft tree from the committed prefix (``sampling/tree.py``): ``tokens``,
        ``parents`` and ``valid`` ``[B, N]``, nodes in order of depth, siblings by
        draft probability, and ``rows``: ``None`` where every node is a deterministic
        pick (a top-k or a ranked child of its parent's ``q``: its ``q`` is a point
        mass), else ``[B, N + 1, V]`` the ``q`` each node's children were drawn from
        (row 0: the root's).

        ``dynamic`` (EAGLE-2): the root's top ``tree_top_k`` children, then at each
        level the ``tree_top_k`` likeliest nodes (cumulative draft log-probability)
        are fed to the head and each gets its ``tree_top_k`` children; of all
        candidates the ``tree_tokens`` likeliest are kept (ancestors first on ties,
        so every kept node's parent is kept).  ``static`` (LANTERN++'s shape, our
        picks): ``tree_choices`` rank paths, each node its parent's ranked child.
        ``sampled``: the static shape, each node's children drawn from its parent's
        ``q`` without replacement (Gumbel top-k: rank ``r`` is the ``r``-th draw), so
        that acceptance can test them against ``q`` (``tree.accept_path``)."""
        B, R, device = st.batch, self.rows, st.seq.device
        K, D = config.tree_top_k, config.depth
        g = self._catch_up(st)  # [R, B, 1, H]: predicts position n
        n = st.n_committed.unsqueeze(1)
        logq = torch.log(self._q(g, n)).squeeze(1)  # [B, V]
        if config.tree in ("static", "sampled"):  # (the shape read once a decode, in start)
            return self._static(st, g, logq, self.shape, n, sampled=config.tree == "sampled")
        top = torch.topk(logq, K, dim=-1)
        tok, score, parent = [top.indices], [top.values], [torch.full((B, K), -1, device=device)]
        level = [torch.zeros(B, K, dtype=torch.long, device=device)]
        level_nodes = torch.arange(K, device=device).expand(B, K)  # indices of the last level's nodes
        fed_feats, fed_par, start = None, None, self.cache.length.clone()  # where the tree's nodes begin
        for d in range(1, D):
            scores = torch.cat(score, 1)
            pick = level_nodes.gather(1, torch.topk(scores.gather(1, level_nodes), K, dim=-1).indices)  # [B, K]
            all_tok, all_par = torch.cat(tok, 1), torch.cat(parent, 1)
            x = all_tok.gather(1, pick)
            # each picked node's input: its token and its parent's output (the root's: g)
            par_fed = self._fed_index(all_par.gather(1, pick), fed_par)
            feats = self._parent_features(g, fed_feats, par_fed)  # [R, B, K, H]
            within = self._within(fed_par, par_fed, K)  # which fed nodes each sees
            depth = torch.full((R * B, K), d - 1, device=device)
            out = self._step_tree(x, feats, depth, within, start)  # [R, B, K, H]
            fed_feats = out if fed_feats is None else torch.cat([fed_feats, out], 2)
            fed_par = self._append_fed(fed_par, par_fed, pick)
            q = self._q(out, (n + d).expand(B, K))  # [B, K, V]
            child = torch.topk(torch.log(q), K, dim=-1)  # [B, K, K]
            tok.append(child.indices.flatten(1))
            score.append((scores.gather(1, pick).unsqueeze(-1) + child.values).flatten(1))
            parent.append(pick.unsqueeze(-1).expand(B, K, K).flatten(1))
            level.append(torch.full((B, K * K), d, dtype=torch.long, device=device))
            base = sum(t.shape[1] for t in tok[:-1])
            level_nodes = base + torch.arange(K * K, device=device).expand(B, K * K)
        return self._rerank(st, torch.cat(tok, 1), torch.cat(score, 1), torch.cat(parent, 1), torch.cat(level, 1), n,
                            config.tree_tokens, D - 1) + (None,)

    # -- catching up ------------------------------------------------------------
    def _catch_up(self, st) -> torch.Tensor:
        """Feed the head every committed input (rolling back whatever it fed
        speculatively): with the target's features where it has scored them, else
        with stale ones; its output for the last one, ``[R, B, 1, H]``, which
        predicts the first uncommitted position."""
        if st.device_step:
            return self._catch_up_on_device(st)
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
        # committed tokens the target has not scored yet (a skipping schedule committed
        # them): VVS's stale features, the most recent real ones, as many as there are
        # such tokens, in order (input s takes f_{s-1-gamma}); fed speculatively, and fed
        # again with their own features once the target has scored them
        gamma = [c - r for c, r in zip(committed, self.real)]
        if max(gamma) > 0:
            G = max(gamma)
            cols = torch.tensor(self.real, device=device).unsqueeze(1) + st.arange(G)
            cols = torch.minimum(cols, torch.tensor(committed, device=device).unsqueeze(1) - 1)
            stale = (cols - torch.tensor(gamma, device=device).unsqueeze(1)).clamp(min=0)
            out = self._step(st.seq.gather(1, cols), self.features[:, st.batch_idx, stale])
            self._rollback([G - n for n in gamma])
            self.spec_len = list(gamma)
            at = torch.tensor([max(n, 1) - 1 for n in gamma], device=device)
            stale_g = out.view(R, B, G, -1)[:, torch.arange(B, device=device), at].unsqueeze(2)
            g = torch.where(torch.tensor(gamma, device=device).view(1, B, 1, 1) > 0, stale_g, g)
        return g

    def _catch_up_on_device(self, st) -> torch.Tensor:
        """:meth:`_catch_up` with nothing read on the host: the inputs go in at the widest any
        step can need (a verify window: every input it cached has a real feature now), the
        rows past each sample's feed rolled back at once, as are the stale inputs' (as wide as
        a skip can commit); the same inputs, so the same outputs, as the host's."""
        B, R = st.batch, self.rows
        committed, cached = st.n_committed, st.n_cached
        self._rollback(self.spec_len)
        last = torch.minimum(committed - 1, cached)
        first = torch.minimum(self.real, last)
        self._rollback(self.real - first)
        feed = last + 1 - first
        k = st.drafts + 1 + st.max_commit
        cols = torch.minimum(first.unsqueeze(1) + st.arange(k), last.unsqueeze(1))  # padding repeats the last
        out = self._step(st.seq.gather(1, cols), self.features[:, st.batch_idx, cols])
        self._rollback(k - feed)
        self.real = last + 1
        g = out.view(R, B, k, -1)[:, st.batch_idx.view(-1), feed - 1].unsqueeze(2)
        self.spec_len = torch.zeros_like(feed)
        if not st.max_commit:  # nothing is committed unverified without skips
            return g
        gamma = committed - self.real
        G = st.max_commit
        cols = torch.minimum(self.real.unsqueeze(1) + st.arange(G), committed.unsqueeze(1) - 1)
        stale = (cols - gamma.unsqueeze(1)).clamp(min=0)
        out = self._step(st.seq.gather(1, cols), self.features[:, st.batch_idx, stale])
        self._rollback(G - gamma)
        self.spec_len = gamma
        stale_g = out.view(R, B, G, -1)[:, st.batch_idx.view(-1), gamma.clamp(min=1) - 1].unsqueeze(2)
        return torch.where(gamma.view(1, B, 1, 1) > 0, stale_g, g)

    # -- trees -------------------------------------------------------------------
    def after_tree(self, st: DecodeState, path: torch.Tensor, counts: torch.Tensor):
        """After a tree's verification: the target's features of the kept path (the
        root and the accepted nodes) are real features of its positions."""
        feats = self.target.features  # [R, B, N + 1, H], row 0: the root
        pos = st.n_cached.unsqueeze(1) + st.arange(path.shape[1])  # before the engine moves it
        kept = st.arange(path.shape[1]).unsqueeze(0) < counts.unsqueeze(1)
        slots = torch.where(kept, pos + 1, self.features.shape[2] - 1)
        self.features[:, st.batch_idx, slots] = feats[:, st.batch_idx, path]

    def _static(self, st, g, logq, shape, n, sampled: bool):
        """The static tree ``shape`` (rank paths, parents first): each level's nodes
        fed together, each node its parent's ranked child (``sampled``: its parent's
        ``rank``-th draw without replacement)."""
        B, R, device = st.batch, self.rows, st.seq.device
        parents_of = shape["parents"]  # list: parent index per node (-1: the root)
        ranks, depth_of = shape["ranks"], shape["depths"]
        N = len(parents_of)
        tok = torch.zeros(B, N, dtype=torch.long, device=device)
        score = torch.zeros(B, N, device=device)
        V = logq.shape[-1]

        def ranked(lq, parent):  # [B, k, V] children by rank, of parents [k] (-1: the root)
            if not sampled:
                return torch.argsort(lq, -1, descending=True)
            cols = (torch.tensor(parent, device=device).view(1, -1, 1) + 1) * V + torch.arange(V, device=device)
            u = rng.uniform(st.keys, st.step, rng.TREE, cols.expand(B, -1, -1)).clamp_(min=2.0 ** -25)
            return torch.argsort(lq - torch.log(-torch.log(u)), -1, descending=True)

        rows = logq.new_zeros(B, N + 1, V) if sampled else None
        if sampled:
            rows[:, 0] = logq.exp()
        order = ranked(logq.unsqueeze(1), [-1])[:, 0]  # the root's children by rank
        fed_feats, fed_par, start = None, None, self.cache.length.clone()
        level_q = {-1: (order, logq)}  # parent node -> its ranked children and log q
        for d in range(max(depth_of) + 1):
            nodes = [i for i in range(N) if depth_of[i] == d]
            for i in nodes:
                o, lq = level_q[parents_of[i]]
                tok[:, i] = o[:, ranks[i]]
                score[:, i] = lq.gather(1, tok[:, i:i + 1]).squeeze(1) + (score[:, parents_of[i]]
                                                                          if parents_of[i] >= 0 else 0)
            inner = [i for i in nodes if i in parents_of]  # nodes with children: fed to the head
            if not inner or d + 1 > max(depth_of):
                continue
            pick = torch.tensor(inner, device=device).expand(B, -1)
            par = torch.tensor([parents_of[i] for i in inner], device=device).expand(B, -1)
            par_fed = self._fed_index(par, fed_par)
            feats = self._parent_features(g, fed_feats, par_fed)
            within = self._within(fed_par, par_fed, len(inner))
            depth = torch.full((R * B, len(inner)), d, device=device)
            out = self._step_tree(tok.gather(1, pick), feats, depth, within, start)
            fed_feats = out if fed_feats is None else torch.cat([fed_feats, out], 2)
            fed_par = self._append_fed(fed_par, par_fed, pick)
            q = self._q(out, (n + d + 1).expand(B, len(inner)))  # [B, len(inner), V]
            lq = torch.log(q)
            o = ranked(lq, inner)
            if sampled:
                rows[:, torch.tensor(inner, device=device) + 1] = q
            for j, i in enumerate(inner):
                level_q[i] = (o[:, j], lq[:, j])
        parents = torch.tensor(parents_of, device=device).expand(B, N)
        return self._finish(st, tok, parents, score, torch.tensor(depth_of, device=device).expand(B, N), n,
                            max(depth_of)) + (rows,)

    def _rerank(self, st, tok, score, parent, depth, n, budget, deepest):
        """Keep the ``budget`` likeliest candidates (ancestors before descendants on
        ties), ordered by depth then likelihood, parents remapped."""
        B, M = tok.shape
        device = tok.device
        key = torch.where(torch.isfinite(score), score, float("-inf")) - 1e-6 * depth
        keep = torch.topk(key, min(budget, M), dim=-1).indices  # [B, N], likeliest first
        order = torch.argsort(depth.gather(1, keep) * M + torch.arange(keep.shape[1], device=device), -1)
        keep = keep.gather(1, order)  # by depth, then by likelihood
        new_index = torch.full((B, M), -1, dtype=torch.long, device=device)
        new_index.scatter_(1, keep, torch.arange(keep.shape[1], device=device).expand_as(keep))
        par = parent.gather(1, keep)
        parents = torch.where(par >= 0, new_index.gather(1, par.clamp(min=0)), -1)
        return self._finish(st, tok.gather(1, keep), parents, score.gather(1, keep), depth.gather(1, keep), n, deepest)

    def _finish(self, st, tok, parents, score, depth, n, deepest: int):
        """The nodes that can stand: a finite draft probability, a parent that can,
        and a position inside the image (``deepest``: the shape's deepest level, known
        without reading ``depth``).  (The head's tree inputs are rolled back when it
        next catches up.)"""
        valid = torch.isfinite(score) & (n + depth < st.length)
        for _ in range(deepest + 1):  # a node under one that cannot stand cannot (parents come first)
            valid &= torch.where(parents >= 0, valid.gather(1, parents.clamp(min=0)), True)
        return tok, parents, valid

    def _q(self, g, pos):
        """The draft distributions of head outputs ``g`` ``[R, B, k, H]`` at ``pos`` ``[B, k]``."""
        with self.timer.model("drafter"), torch.no_grad():
            logits = self.target.logits_from_features(g)
        return self.pipeline(logits, pos)

    @staticmethod
    def _fed_index(parents, fed_par):
        """Where each parent sits among the nodes fed to the head so far (-1: the root)."""
        if fed_par is None:
            return torch.full_like(parents, -1)
        nodes = fed_par["nodes"]  # [B, M] candidate index of each fed node
        hit = nodes.unsqueeze(1) == parents.unsqueeze(2)  # [B, K, M]
        return torch.where(hit.any(-1), hit.int().argmax(-1), -1)

    def _parent_features(self, g, fed_feats, par_fed):
        R, B, _, H = g.shape
        if fed_feats is None:
            return g.expand(R, B, par_fed.shape[1], H)
        return torch.where((par_fed >= 0).view(1, B, -1, 1),
                           fed_feats.gather(2, par_fed.clamp(min=0).view(1, B, -1, 1).expand(R, B, -1, H)), g)

    @staticmethod
    def _within(fed_par, par_fed, k):
        """``[B, k, M + k]``: the fed nodes (and themselves) that ``k`` new nodes see."""
        B = par_fed.shape[0]
        eye = torch.eye(k, dtype=torch.bool, device=par_fed.device).expand(B, k, k)
        if fed_par is None:
            return eye
        anc = fed_par["anc"]  # [B, M, M]
        seen = torch.where((par_fed >= 0).unsqueeze(-1), anc.gather(
            1, par_fed.clamp(min=0).unsqueeze(-1).expand(-1, -1, anc.shape[2])), False)
        return torch.cat([seen, eye], 2)

    @staticmethod
    def _append_fed(fed_par, par_fed, pick):
        """Record newly fed nodes: their candidate index and ancestor rows."""
        B, k = pick.shape
        device = pick.device
        if fed_par is None:
            return {"nodes": pick, "anc": torch.eye(k, dtype=torch.bool, device=device).expand(B, k, k).clone()}
        anc = fed_par["anc"]
        M = anc.shape[1]
        grown = torch.zeros(B, M + k, M + k, dtype=torch.bool, device=device)
        grown[:, :M, :M] = anc
        grown[:, M:, :] = HeadDrafts._within(fed_par, par_fed, k)
        return {"nodes": torch.cat([fed_par["nodes"], pick], 1), "anc": grown}

    def _step_tree(self, tokens, feats, depth, within, start):
        R = self.rows
        B, k = tokens.shape
        with self.timer.model("drafter"):
            out = self.head.step_tree(self.ids(tokens).repeat(R, 1), feats.reshape(R * B, k, -1), depth,
                                      within.repeat(R, 1, 1), start, self.cache)
        self._add_spec(k)
        return out.view(R, B, k, -1)

    # -- helpers ---------------------------------------------------------------
    def _step(self, tokens, features):
        """One head forward over ``tokens`` ``[B, k]`` (the same for every branch)."""
        R = self.rows
        with self.timer.model("drafter"):
            return self.head.step(self.ids(tokens).repeat(R, 1),
                                  features.reshape(R * tokens.shape[0], tokens.shape[1], -1),
                                  self.cache)

    def _add_spec(self, k: int):
        self.spec_len = self.spec_len + k if isinstance(self.spec_len, torch.Tensor) else [
            m + k for m in self.spec_len]

    def _rollback(self, n):
        """Drop the last ``n[b]`` inputs of each sample's rows (a device tensor: on the device)."""
        if isinstance(n, torch.Tensor):
            self.cache.rollback_on_device(n.repeat(self.rows))
        elif any(n):
            self.cache.advance([-m for m in n] * self.rows)
