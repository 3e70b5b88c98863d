"""A transformers KV cache whose rows advance by different amounts.

``transformers``' ``DynamicCache`` crops every row alike, but under speculative
decoding each sample keeps its own number of window tokens.  ``RaggedCache``
keeps one physical length for all rows and a 2D attention mask in which a
sample's rejected positions become holes; each row's rotary positions count
only its valid tokens, so a hole changes nothing a row attends to.  Trailing
columns no row uses are cropped, and when holes pile up the rows are compacted
(valid entries right-aligned, keys already carry their rotary phase).

Works with transformers 4.52 to 5.x: it touches only ``cache.layers[i].keys``
and ``.values`` and passes ``attention_mask`` (exactly past + new long) and
``position_ids``, never ``cache_position``; the cache goes in by the name the
model's ``forward`` takes (:func:`cache_argument`).
"""
from __future__ import annotations

import inspect

import torch

from ..sampling.adapter import ImageAdapter


def cache_argument(module: torch.nn.Module) -> str:
    """The keyword ``module.forward`` takes its KV cache by: ``cache`` in the transformers
    releases that renamed it (where ``past_key_values`` warns, and goes in 5.40), else
    ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


class RaggedCache:
    def __init__(self, slack: int = 64, argument: str = "past_key_values"):
        from transformers import DynamicCache

        self.argument = argument  # forward's keyword for the cache (cache_argument)
        self.cache = DynamicCache()
        self.mask: torch.Tensor | None = None  # [rows, physical] 1 = valid
        self.valid: list[int] = []  # valid positions per row
        self.slack = slack
        self._tree = None  # (valid lengths, physical length) before the last tree forward
        self._tail = 0

    @property
    def physical(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def prefill_inputs(self, pad_mask: torch.Tensor) -> dict:
        """Arguments for the prompt forward; ``pad_mask`` ``[rows, S]`` marks real
        tokens (prompts left-padded)."""
        pad_mask = pad_mask.long()
        self._next_mask = pad_mask
        self._added = pad_mask.sum(1).tolist()
        self._tree = None
        positions = (pad_mask.cumsum(1) - 1).clamp(min=0)
        return {"attention_mask": pad_mask, "position_ids": positions, self.argument: self.cache,
                "use_cache": True}

    def step_inputs(self, L: int) -> dict:
        """Arguments for a forward of ``L`` new tokens per row."""
        device = self.mask.device
        ones = torch.ones(self.mask.shape[0], L, dtype=self.mask.dtype, device=device)
        self._next_mask = torch.cat([self.mask, ones], 1)
        self._added = [L] * len(self.valid)
        self._tree = None
        positions = torch.tensor(self.valid, device=device).unsqueeze(1) + torch.arange(L, device=device)
        return {"attention_mask": self._next_mask, "position_ids": positions, self.argument: self.cache,
                "use_cache": True}

    def tree_inputs(self, parents: torch.Tensor) -> dict:
        """Arguments for a forward of a draft tree (``sampling/tree.py``) with
        ``parents`` ``[rows, N]``: the nodes go in as ``N`` new columns; a 4D mask
        lets each see the valid prefix, its ancestors and itself, and its position
        is the row's valid length plus its depth."""
        from ..sampling.tree import ancestors

        device = self.mask.device
        N = parents.shape[1]
        within = ancestors(parents)
        self._next_mask = torch.cat([self.mask, torch.ones(self.mask.shape[0], N, dtype=self.mask.dtype,
                                                           device=device)], 1)
        self._added = [N] * len(self.valid)
        self._tree = (list(self.valid), self.physical)
        prefix = self.mask.bool()[:, None, :].expand(-1, N, -1)
        allowed = torch.cat([prefix, within], 2).unsqueeze(1)  # [rows, 1, N, physical + N]
        positions = torch.tensor(self.valid, device=device).unsqueeze(1) + within.sum(-1) - 1
        return {"attention_mask": allowed, "position_ids": positions, self.argument: self.cache,
                "use_cache": True}

    def keep_tree(self, nodes: torch.Tensor, counts: list[int]):
        """After a tree forward: keep each row's ``nodes[row, :counts[row]]`` (a path
        from the root, in order: their columns stay in order and their positions
        are the row's next ones) and make the other nodes holes."""
        valid, start = self._tree
        N = self.physical - start
        keep = torch.zeros(len(counts), N, dtype=self.mask.dtype, device=self.mask.device)
        take = torch.arange(nodes.shape[1], device=nodes.device).unsqueeze(0) < torch.tensor(
            counts, device=nodes.device).unsqueeze(1)
        keep.scatter_(1, torch.where(take, nodes, N - 1) if N else nodes, take.to(keep.dtype))
        self.mask = torch.cat([self.mask[:, :start], keep], 1)
        self.valid = [v + c for v, c in zip(valid, counts)]
        self._crop_unused()

    def commit(self):
        """After the forward: the new tokens are in the cache."""
        # trailing columns valid in every row: what the fast rollback may drop
        self._tail = self._tail + min(self._added) if self._tree is None else 0
        self.mask = self._next_mask
        self.valid = [v + a for v, a in zip(self.valid or [0] * len(self._added), self._added)]

    def rollback(self, n: list[int]):
        """Drop the last ``n[row]`` valid positions of each row."""
        if not any(n):
            return
        drop = torch.tensor(n, device=self.mask.device).unsqueeze(1)
        P = self.physical
        self.valid = [v - k for v, k in zip(self.valid, n)]
        if max(n) <= self._tail:  # within the last window, whose columns are all valid: no host sync
            self.mask = self.mask * (torch.arange(P, device=self.mask.device) < P - drop)
            self._tail = self._tail - max(n) if max(n) == min(n) else 0
            self._crop(P - min(n))
            if self.physical - max(self.valid) > self.slack:
                self._compact()
            return
        on = self.mask.bool()  # after a tree: the last valid columns are not the last columns
        from_end = on.flip(1).cumsum(1).flip(1)
        self.mask = self.mask * ~(on & (from_end <= drop))
        self._tail = 0
        self._crop_unused()

    def _crop_unused(self):
        """Drop trailing columns no row uses; compact when holes pile up."""
        used = self.mask.bool().any(0).nonzero()
        self._crop(int(used[-1]) + 1 if len(used) else 0)
        if self.physical - max(self.valid) > self.slack:
            self._compact()

    def _crop(self, length: int):
        if length < self.physical:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, :length], layer.values[:, :, :length]
            self.mask = self.mask[:, :length]

    def _compact(self):
        width = max(self.valid)
        order = torch.argsort(self.mask, dim=1, stable=True)[:, -width:]  # holes first, valid last
        for layer in self.cache.layers:
            idx = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys, layer.values = layer.keys.gather(2, idx), layer.values.gather(2, idx)
        self.mask = self.mask.gather(1, order)


class RaggedCacheAdapter(ImageAdapter):
    """What the transformers-based adapters (Janus, Chameleon, Emu3) share: a
    :class:`RaggedCache` whose rows are the ``batch`` samples of each guidance
    branch in turn, after prompts of ``prompt_lengths`` tokens (set by ``prefill``)."""

    SLACK = 64  # RaggedCache's default room for holes before compacting
    cache: RaggedCache | None = None
    batch: int = 0
    prompt_lengths: torch.Tensor | None = None
    #: the last prefill's token rows and padding mask ``[rows, S]`` (left-padded prompts)
    prompt_rows: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def feature_size(self) -> int:
        return self.model.config.get_text_config().hidden_size

    def _keep(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` ``[rows, L, H]`` (the last hidden states, after the final norm)
        kept as ``features`` ``[rows / batch, batch, L, H]`` when a draft head reads them."""
        if self.keep_features:
            self.features = hidden.view(-1, self.batch, *hidden.shape[1:])
        return hidden

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, ...] -> [K, B, ..., V] through ``self.head``."""
        logits = self.head(hidden).float()
        return logits.view(-1, self.batch, *logits.shape[1:])

    def logits_from_features(self, features):
        return self._logits(features.reshape(-1, *features.shape[2:]))

    @torch.no_grad()
    def input_embeddings(self):
        return self.model.get_input_embeddings().weight.detach()[: self.vocab_size]

    @torch.no_grad()
    def forward(self, tokens):
        hidden = self._keep(self._hidden(tokens, self.cache.step_inputs(tokens.shape[1])))
        self.cache.commit()
        return self._logits(hidden)

    @torch.no_grad()
    def forward_tree(self, tokens, parents):
        reps = len(self.cache.valid) // tokens.shape[0]
        hidden = self._keep(self._hidden(tokens, self.cache.tree_inputs(parents.repeat(reps, 1))))
        self.cache.commit()
        return self._logits(hidden)

    def keep_tree(self, nodes, counts):
        reps = len(self.cache.valid) // len(counts)
        self.cache.keep_tree(nodes.repeat(reps, 1), list(counts) * reps)

    def rollback(self, n):
        self.cache.rollback(list(n) * (len(self.cache.valid) // len(n)))  # the same for every branch

    def cache_lengths(self):
        return torch.tensor(self.cache.valid[: self.batch]) - self.prompt_lengths

    def cache_bytes(self):
        if self.cache is None:
            return None
        return sum(t.numel() * t.element_size() for layer in self.cache.cache.layers
                   for t in (layer.keys, layer.values) if t is not None)

    def cache_bytes_per_image(self, conditions, negatives, guided):
        text = self.model.config.get_text_config()
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        prompt = max(len(self.prompt_ids(c)) for c in list(conditions) + list(negatives or []))
        positions = prompt + self.layout.length + 2 * self.SLACK  # holes and windows past the end
        itemsize = next(self.model.parameters()).element_size()
        return self.branches(guided) * positions * text.num_hidden_layers * 2 * heads * head_dim * itemsize

    def release(self):
        self.cache = None
