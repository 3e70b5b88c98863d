"""transformers models on the pack's KV cache, whose rows advance by different amounts.

``transformers``' own caches crop every row alike, but under speculative decoding
each sample keeps its own number of window tokens.  The transformers families
(Janus, Chameleon, Emu3) run on a :class:`~.static_cache.StaticKV` instead: it is
handed to the model as a ``Cache`` whose ``update`` writes each row's new keys and
values at that row's next positions, with a 4D attention mask (transformers uses a
4D mask as given) and each row's rotary positions counting only its real tokens
(prompts are left-padded).  Rolling back moves lengths; nothing is cropped or
compacted.

Works with transformers 4.52 to 5.x: the model sees ``attention_mask`` (4D),
``position_ids`` and the cache, never ``cache_position``; the cache goes in by the
name the model's ``forward`` takes (:func:`cache_argument`).
"""
from __future__ import annotations

import inspect

import torch

from ..sampling.adapter import ImageAdapter
from ..sampling.config import shorten
from .static_cache import (BUCKET, CAPTURED, StaticKV, capacity_for, new_forwards, padded_width, static_forward,
                           weights_signature)


def cache_argument(module: torch.nn.Module) -> str:
    """The keyword ``module.forward`` takes its KV cache by: ``cache`` in the transformers
    releases that renamed it (where ``past_key_values`` warns, and goes in 5.40), else
    ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


_VIEWS: dict = {}


def _kv_view(kv: StaticKV):
    """``kv`` behind transformers' ``Cache`` interface: attention layers call
    ``update(keys, values, layer)`` and get back the entries they read."""
    cls = _VIEWS.get("cls")
    if cls is None:
        from transformers.cache_utils import Cache

        class StaticKVView(Cache):
            offloading = False
            is_compileable = True

            def __init__(self, kv):  # not Cache's: the layers live in ``kv``
                self.kv, self.layers = kv, []

            def update(self, key_states, value_states, layer_idx, *args, **kwargs):
                return self.kv.write(layer_idx, key_states, value_states)

            def get_seq_length(self, layer_idx=0):
                return max(self.kv.host_length)

            def __len__(self):
                return self.kv.K.shape[0]

        cls = _VIEWS["cls"] = StaticKVView
    return cls(kv)


class StaticCache:
    """A :class:`~.static_cache.StaticKV` for a transformers model: the inputs of each
    forward (prompt, window, draft tree) and what follows it (rows: the samples of each
    guidance branch in turn; the prompt left-padded, its pads masked and skipped by
    rotary positions)."""

    def __init__(self, kv: StaticKV, argument: str):
        self.kv, self.argument = kv, argument
        self.view = _kv_view(kv)
        self._added = 0

    @property
    def valid(self) -> list[int]:
        """Real tokens per row (the prompt's, then the image's)."""
        return [n - p for n, p in zip(self.kv.host_length, self._pads)]

    def _inputs(self, positions, mask) -> dict:
        return {"attention_mask": mask, "position_ids": positions.clamp(min=0), self.argument: self.view,
                "use_cache": True}

    def prefill_inputs(self, pad_mask: torch.Tensor) -> dict:
        self.kv.reset(key_ok=pad_mask)
        self._pads = (pad_mask.shape[1] - pad_mask.long().sum(1)).tolist()
        self._added = pad_mask.shape[1]
        return self._inputs(*self.kv.begin(pad_mask.shape[1]))

    def step_inputs(self, L: int, keys: int | None = None) -> dict:
        self._added = L
        return self._inputs(*self.kv.begin(L, keys))

    def tree_inputs(self, within: torch.Tensor, keys: int | None = None, depth: torch.Tensor | None = None) -> dict:
        """A draft tree's nodes: ``within`` ``[rows, N, N]``, each node's ancestors and
        itself (``sampling.tree.ancestors``, computed outside a captured forward: it
        synchronises with the host), or what each node sees with its ``depth`` given."""
        self._added = within.shape[1]
        return self._inputs(*self.kv.begin_tree(within.sum(-1) - 1 if depth is None else depth, within, keys=keys))

    def commit(self):
        self.kv.advance([self._added] * self.kv.rows)

    def rollback(self, n: list[int], most: int | None = None):
        if isinstance(n, torch.Tensor):
            self.kv.rollback_on_device(n, most)
        elif any(n):
            self.kv.advance([-k for k in n])

    def keep_tree(self, nodes: torch.Tensor, counts: list[int] | torch.Tensor):
        self.kv.keep(nodes, counts)

    def keep_rows(self, rows: list[int]):
        """Only ``rows`` stay (images leaving the batch)."""
        self.kv.keep_rows(rows)
        self._pads = [self._pads[r] for r in rows]


class TransformersAdapter(ImageAdapter):
    """What the transformers-based adapters (Janus, Chameleon, Emu3, Liquid) share: a
    :class:`StaticCache` whose rows are the ``batch`` samples of each guidance
    branch in turn, after prompts of ``prompt_lengths`` tokens (set by ``prefill``),
    and forwards on the adapter's decode path.  The prefill runs left-padded token
    rows (:meth:`condition_rows`: the prompts, then a fixed unconditional row each
    unless an adapter says otherwise) through ``inner``; Janus, which feeds
    embeddings, has its own."""

    MARGIN = 4 * 128  # cache entries past the image: windows over its end, padded widths
    #: the decoder stack the token rows run through (``input_ids`` and the cache in, last hidden states out)
    inner: torch.nn.Module
    cache: StaticCache | None = None
    batch: int = 0
    prompt_lengths: torch.Tensor | None = None
    #: the last prefill's token rows and padding mask ``[rows, S]`` (left-padded prompts)
    prompt_rows: tuple[torch.Tensor, torch.Tensor] | None = None
    #: the release's repetition penalty on the conditional branch, as the authors' ``generate`` applies it
    #: (``generation_config.RepetitionPenalty``, kept beside the cache); None: none
    repeats = None

    @property
    def feature_size(self) -> int:
        return self.model.config.get_text_config().hidden_size

    def network(self) -> torch.nn.Module:
        """The module whose repeated blocks the compiled path compiles."""
        return self.model

    def _keep(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` ``[rows, L, H]`` (the last hidden states, after the final norm)
        kept as ``features`` ``[rows / batch, batch, L, H]`` when a draft head reads them."""
        if self.keep_features:
            self.features = hidden.view(-1, self.batch, *hidden.shape[1:])
        return hidden

    #: ``(start, stop)``: the head's rows scored while a compact vocabulary decodes (:meth:`output_ids`)
    head_rows: tuple[int, int] | None = None

    def output_ids(self, ids):
        """A contiguous range of ids is a slice of the head's weight (a view: no copy)."""
        if ids is None:
            self.head_rows = None
            return True
        start = int(ids[0]) if ids.numel() else 0
        if type(self.head) is not torch.nn.Linear or not ids.numel() or not torch.equal(
                ids.cpu(), torch.arange(start, start + ids.numel())):
            return False
        self.head_rows = (start, start + ids.numel())
        return True

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, ...] -> [K, B, ..., V] through ``self.head`` (or its rows ``head_rows``)."""
        if self.head_rows is None:
            logits = self.head(hidden).float()
        else:
            rows = slice(*self.head_rows)
            bias = None if self.head.bias is None else self.head.bias[rows]
            logits = torch.nn.functional.linear(hidden, self.head.weight[rows], bias).float()
        return logits.view(-1, self.batch, *logits.shape[1:])

    def logits_from_features(self, features):
        return self._logits(features.reshape(-1, *features.shape[2:]))

    def _first_column(self) -> int:
        """The id of the logits' first column (a compact vocabulary's head rows start later)."""
        return self.head_rows[0] if self.head_rows is not None else 0

    @torch.no_grad()
    def input_embeddings(self):
        return self.model.get_input_embeddings().weight.detach()[: self.vocab_size]

    @torch.no_grad()
    def forward(self, tokens):
        if self.decode_path == "eager":
            hidden = self._keep(self._hidden(tokens, self.cache.step_inputs(tokens.shape[1])))
            self.cache.commit()
            logits = self._logits(hidden)
        else:
            logits, features = static_forward(self, self.cache.kv, self._static_window, tokens)
            if self.keep_features:
                self.features = features.clone()
        if self.repeats is not None:
            self.repeats.window(logits[0], tokens.to(logits.device), self._first_column())
        return logits

    @torch.no_grad()
    def forward_tree(self, tokens, parents, graph=None):
        from ..sampling.tree import ancestors

        within = None
        if self.decode_path == "eager":
            within, depth = (ancestors(parents), None) if graph is None else graph
            reps = self.cache.kv.rows // tokens.shape[0]
            depth = None if depth is None else depth.repeat(reps, 1)
            keys = None if graph is None else self.cache.kv.keys_for(padded_width(tokens.shape[1]))  # as static reads
            hidden = self._keep(self._hidden(tokens, self.cache.tree_inputs(within.repeat(reps, 1, 1), keys, depth)))
            self.cache.commit()
            logits = self._logits(hidden)
        else:
            logits, features = static_forward(self, self.cache.kv, self._static_tree, tokens, parents, graph)
            if self.keep_features:
                self.features = features.clone()
        if self.repeats is not None:
            if within is None:
                within = ancestors(parents) if graph is None else graph[0]
            self.repeats.tree(logits[0], tokens.to(logits.device), within, self._first_column())
        return logits

    # -- prompts and the cache loop of the text-prompted families -----------------------
    #: the error for a negative prompt, for a family whose unconditional row is fixed (None: it takes one)
    no_negative: str | None = None

    def check_conditions(self, conditions, negatives):
        if negatives is not None and self.no_negative:
            raise ValueError(self.no_negative)
        bad = [c for c in conditions if not isinstance(c, str) or not c.strip()]
        if bad:
            raise ValueError(f"prompt must be non-empty text (got {shorten(bad[0])})")

    def condition_rows(self, conditions, negatives, guided) -> list[list[int]]:
        """The prefill's token rows: the prompts, then (guided) a fixed unconditional row per prompt."""
        rows = [self.prompt_ids(p) for p in conditions]
        return rows + [self.unconditional_ids()] * len(conditions) if guided else rows

    def pad_id(self) -> int:
        """Any id: the left padding is masked."""
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.bos

    @torch.no_grad()
    def prefill(self, conditions, negatives, guided):
        rows = self.condition_rows(conditions, negatives, guided)
        width, pad = max(map(len, rows)), self.pad_id()
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device)
        pad_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
        self.batch = len(conditions)
        self.prompt_lengths = pad_mask[: self.batch].sum(1).cpu()
        self.prompt_rows = (ids, pad_mask)  # a draft head that reads the prompt takes them
        self.cache = self._new_cache(self.inner, len(rows), width)
        hidden = self._keep(self.inner(input_ids=ids, **self.cache.prefill_inputs(pad_mask)).last_hidden_state)
        self.cache.commit()
        logits = self._logits(hidden[:, -1])
        if self.repeats is not None:  # the conditional rows come first
            self.repeats.start(ids[: self.batch], pad_mask[: self.batch])
            self.repeats.prefill(logits[0], self._first_column())
        return logits

    @torch.no_grad()
    def _hidden(self, tokens, cache_inputs):
        ids = tokens.to(self.device).repeat(self.cache.kv.rows // tokens.shape[0], 1)
        return self.inner(input_ids=ids, **cache_inputs).last_hidden_state

    def _static_window(self, tokens, keys):
        """The static path's forward of a padded window, ``keys`` cache entries read."""
        return self._static_outputs(self._hidden(tokens, self.cache.step_inputs(tokens.shape[1], keys)))

    def _static_tree(self, tokens, within, keys, depth=None):
        """The static path's forward of a padded draft tree (``within``: its ancestor masks,
        or what each node sees with its ``depth`` given)."""
        reps = self.cache.kv.rows // tokens.shape[0]
        depth = None if depth is None else depth.repeat(reps, 1)
        return self._static_outputs(self._hidden(tokens, self.cache.tree_inputs(within.repeat(reps, 1, 1), keys,
                                                                                depth)))

    def _static_outputs(self, hidden):
        """Hidden states ``[rows, W, H]`` -> logits ``[K, B, W, V]`` and features ``[K, B, W, H]``."""
        return self._logits(hidden), hidden.view(-1, self.batch, *hidden.shape[1:])

    def _new_cache(self, module: torch.nn.Module, rows: int, prompt: int):
        """The cache a prefill of ``rows`` prompts ``prompt`` tokens wide starts, kept
        between decodes of the same rows and size on the graphs path (the graphs
        captured on it stay valid)."""
        heads, head_dim, layers = self._kv_shape()
        capacity = capacity_for(prompt + self.layout.length + self.MARGIN)
        cache = self.cache
        if cache is None or cache.kv.rows != rows or cache.kv.capacity != capacity:
            self.graphs = new_forwards(self)
            kv = StaticKV(layers, heads, head_dim, rows, capacity, next(self.model.parameters()).dtype, self.device,
                          bucket=BUCKET)
            cache = StaticCache(kv, cache_argument(module))
        if self.graphs.enabled:
            self.graphs.check_weights(weights_signature(self.model))
        return cache

    def _kv_shape(self) -> tuple[int, int, int]:
        """Key/value heads, head width and layers of the language model."""
        text = self.model.config.get_text_config()
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        return heads, head_dim, text.num_hidden_layers

    def keep_tree(self, nodes, counts):
        reps = len(self.cache.valid) // len(counts)
        on_device = isinstance(counts, torch.Tensor)
        self.cache.keep_tree(nodes.repeat(reps, 1), counts.repeat(reps) if on_device else list(counts) * reps)
        if self.repeats is not None:
            self.repeats.keep_tree(nodes, counts if on_device else list(counts))

    rolls_back_on_device = True

    def rollback(self, n, most=None):
        reps = len(self.cache.valid) // len(n)  # the same for every branch
        on_device = isinstance(n, torch.Tensor)
        self.cache.rollback(n.repeat(reps) if on_device else list(n) * reps, most)
        if self.repeats is not None:
            self.repeats.rollback(n if on_device else list(n))

    def sync_lengths(self):
        self.cache.kv.sync_host()
        if self.repeats is not None:
            self.repeats.sync()

    drops_samples = True

    def keep_samples(self, keep):
        B = self.batch
        self.cache.keep_rows([k * B + b for k in range(self.cache.kv.rows // B) for b in keep])
        self.prompt_lengths = self.prompt_lengths[keep]
        if self.repeats is not None:
            self.repeats.keep(keep)
        self.batch = len(keep)
        self.graphs = new_forwards(self)  # graphs replay the old rows' tensors

    def cache_lengths(self):
        return torch.tensor(self.cache.valid[: self.batch]) - self.prompt_lengths

    def cache_bytes(self):
        return None if self.cache is None else self.cache.kv.nbytes()

    def cache_bytes_per_image(self, conditions, negatives, guided):
        heads, head_dim, layers = self._kv_shape()
        prompt = max(len(self.prompt_ids(c)) for c in list(conditions) + list(negatives or []))
        positions = capacity_for(prompt + self.layout.length + self.MARGIN)
        itemsize = next(self.model.parameters()).element_size()
        return self.branches(guided) * positions * layers * 2 * heads * head_dim * itemsize

    def live_cache_bytes(self):
        return None if self.cache is None else self.cache.kv.live_bytes()

    def release(self):
        if self.decode_path not in CAPTURED:  # captured forwards keep reading a static cache
            self.cache = None
