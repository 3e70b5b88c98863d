"""Test doubles of model adapters."""
from __future__ import annotations

import torch

from spec_ar.sampling import ImageAdapter, TokenLayout


class TabularAdapter(ImageAdapter):
    """A model whose every conditional is a row of a table, indexed by the whole
    prefix: small enough to enumerate the exact joint distribution.

    ``image`` image tokens (ids ``0..image-1``) plus one structural token (id
    ``image``) forced at the positions in ``forced``.  Branch 0 is the class
    condition, branch 1 the unconditional table.
    """

    def __init__(self, image: int = 4, length: int = 5, forced=(2,), classes: int = 2, spread: float = 1.5,
                 seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.vocab_size = image + 1
        self.eol = image
        self.layout = TokenLayout.raster(1, length - len(forced), self.vocab_size, torch.arange(image),
                                         {p: image for p in forced}, row_stride=length, length=length)
        self.length = length
        prefixes = sum(self.vocab_size ** t for t in range(length + 1))
        self.cond_table = torch.randn(classes, prefixes, self.vocab_size, generator=g) * spread
        self.uncond_table = torch.randn(prefixes, self.vocab_size, generator=g) * spread
        self.offsets = torch.tensor([sum(self.vocab_size ** s for s in range(t)) for t in range(length + 1)])
        self.powers = self.vocab_size ** torch.arange(length + 64)
        self.vectors = torch.randn(image, 3, generator=g)
        self.calls = []

    # -- adapter ------------------------------------------------------------
    def prefill(self, conditions, negatives, guided):
        self.calls.append("prefill")
        B = len(conditions)
        self.cls = torch.tensor(conditions)
        self.guided = guided
        self.hist = torch.zeros(B, self.length + 64, dtype=torch.long)
        self.lengths = torch.zeros(B, dtype=torch.long)
        return self._logits(torch.zeros(B, 1, dtype=torch.long))[:, :, 0]

    def forward(self, tokens):
        self.calls.append(tuple(tokens.shape))
        B, L = tokens.shape
        pos = self.lengths.unsqueeze(1) + torch.arange(L)
        self.hist.scatter_(1, pos, tokens)
        self.lengths += L
        return self._logits(pos + 1)

    def rollback(self, n):
        assert min(n) >= 0
        self.lengths -= torch.tensor(n)

    def cache_lengths(self):
        return self.lengths.clone()

    def token_vectors(self):
        return torch.arange(self.vectors.shape[0]), self.vectors

    def forward_tree(self, tokens, parents, graph=None):
        """Each node's logits from its own prefix: the cache, its ancestors, itself (or
        the nodes ``graph`` says it sees; positions it does not see read token 0)."""
        from spec_ar.sampling.tree import ancestors, depths

        self.calls.append(("tree",) + tuple(tokens.shape))
        B, N = tokens.shape
        anc, depth = (ancestors(parents), depths(parents)) if graph is None else graph
        anc = anc | torch.eye(N, dtype=torch.bool)
        self.tree_start, self.tree_tokens = self.lengths.clone(), tokens.clone()
        hist = self.hist
        out = []
        past = torch.arange(hist.shape[1]).unsqueeze(0) >= self.lengths.unsqueeze(1)
        for i in range(N):
            self.hist = hist.masked_fill(past, 0)  # positions past the cache: only what node i sees
            pos = self.lengths.unsqueeze(1) + depth  # every node's own position
            on = anc[:, i]  # node i and its ancestors
            self.hist.scatter_(1, torch.where(on, pos, self.hist.shape[1] - 1), torch.where(on, tokens, 0))
            out.append(self._logits(self.lengths.unsqueeze(1) + depth[:, i:i + 1] + 1))
        self.hist = hist
        self.lengths = self.lengths + N
        return torch.cat(out, 2)

    def keep_tree(self, nodes, counts):
        start, counts = self.tree_start, torch.as_tensor(counts)
        j = torch.arange(nodes.shape[1])
        kept = j < counts.unsqueeze(1)  # node j of the path stays at start + j (the others go to the dump column)
        self.hist.scatter_(1, torch.where(kept, start.unsqueeze(1) + j, self.hist.shape[1] - 1),
                           self.tree_tokens.gather(1, nodes))
        self.lengths = start + counts

    def _logits(self, target):
        t = target.clamp(max=self.length)
        # prefix code of the tokens before each target position
        digits = self.hist[:, : self.length] * self.powers[: self.length]
        code = torch.cat([torch.zeros(digits.shape[0], 1, dtype=torch.long), digits.cumsum(1)], 1)
        idx = self.offsets[t] + code.gather(1, t)
        cond = self.cond_table[self.cls.unsqueeze(1), idx]
        if not self.guided:
            return cond.unsqueeze(0)
        return torch.stack([cond, self.uncond_table[idx]])

    # -- the exact answer ---------------------------------------------------
    def conditional(self, prefix: list[int], cls: int, cfg: float, top_k: int | None,
                    temperature: float = 1.0) -> torch.Tensor:
        """Reference processing, written independently of the engine's."""
        t = len(prefix)
        if self.layout.forced[t] >= 0:
            out = torch.zeros(self.vocab_size)
            out[self.layout.forced[t]] = 1.0
            return out
        code = sum(v * self.vocab_size ** i for i, v in enumerate(prefix))
        idx = int(self.offsets[t]) + code
        c, u = self.cond_table[cls, idx].double(), self.uncond_table[idx].double()
        z = u + cfg * (c - u) if cfg != 1.0 else c
        z[self.eol] = float("-inf")
        z = z / temperature
        if top_k is not None:
            kth = torch.sort(z, descending=True).values[top_k - 1]
            z[z < kth] = float("-inf")
        return torch.softmax(z, 0)

    def joint(self, cls: int, cfg: float, top_k: int | None, temperature: float = 1.0) -> dict[tuple, float]:
        """Probability of every complete stream (each prefix's conditional computed once, depth
        first; the tables never change, so each setting's joint is kept)."""
        kept = self.__dict__.setdefault("joints", {})
        key = (cls, cfg, top_k, temperature)
        if key not in kept:
            out = {}

            def extend(prefix: list[int], prob: float):
                if len(prefix) == self.length:
                    out[tuple(prefix)] = prob
                    return
                row = self.conditional(prefix, cls, cfg, top_k, temperature).tolist()
                for token, p in enumerate(row):
                    if prob * p > 0:
                        extend(prefix + [token], prob * p)

            extend([], 1.0)
            kept[key] = out
        return dict(kept[key])


class FeaturedTabularAdapter(TabularAdapter):
    """A :class:`TabularAdapter` that gives a draft head hidden states: its logits,
    zero-padded to ``width``, with the output head reading them back."""

    def __init__(self, width: int = 8, **kw):
        super().__init__(**kw)
        self.feature_size = width

    def _logits(self, target):
        logits = super()._logits(target)
        if self.keep_features:
            pad = logits.new_zeros(*logits.shape[:-1], self.feature_size - logits.shape[-1])
            self.features = torch.cat([logits, pad], -1)
        return logits

    def forward_tree(self, tokens, parents, graph=None):
        logits = super().forward_tree(tokens, parents, graph)
        if self.keep_features:
            pad = logits.new_zeros(*logits.shape[:-1], self.feature_size - logits.shape[-1])
            self.features = torch.cat([logits, pad], -1)
        return logits

    def logits_from_features(self, features):
        return features[..., : self.vocab_size].float().clone()  # the engine consumes logits in place


class PoisonedAdapter(TabularAdapter):
    """A :class:`TabularAdapter` whose logits for stream position ``at`` are
    broken: ``"nan-row"`` (all NaN), ``"nan-entry"`` (one NaN), ``"inf"`` (one +inf)."""

    def __init__(self, at: int, kind: str, **kw):
        super().__init__(**kw)
        self.at, self.kind = at, kind

    def _logits(self, target):
        out = super()._logits(target).clone()
        hit = (target == self.at).expand(out.shape[:-1])
        if self.kind == "nan-row":
            out[hit] = float("nan")
        else:
            out[..., 1][hit] = float("nan") if self.kind == "nan-entry" else float("inf")
        return out
