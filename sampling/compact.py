"""A compact vocabulary: the engine's rows only as wide as the ids a stream can hold.

A family's vocabulary is mostly text (SimpleAR: 64,000 image codes among 215,672 ids;
Lumina-mGPT 2.0 16,384 of 172,032; Liquid 8,192 of 264,192), but the grammar lets a free
position hold an image token only and a structural one its forced token, so every other id
has probability 0 everywhere.  :class:`CompactVocabulary` puts an adapter behind the ids a
stream can hold, the image ids then the forced ones (each in ascending order), so every
``[rows, vocab]`` tensor of the engine (the ring of draft distributions, the window's
buffers, the logits of each guidance branch) is that much narrower.

The distribution is the same: every guidance mix is a weighted sum of branches whose weights
add up to 1, so a constant per row (a log-softmax's normaliser) changes nothing after the
softmax, and masked ids have no mass either way.  The streams are the same only up to
rounding: a narrower head and softmax round differently, so an inverse-CDF draw that lands
within rounding of a boundary moves and the stream parts from there (often, on the nearly
flat rows of random weights; greedy decoding gives the same tokens), and ``gumbel``
coupling draws its noise per column.

Tokens cross at the edges: inside the engine a token is its index here; the engine maps
results, step events and scored streams (``to_ids`` / ``to_compact``).  An adapter that can
score the image ids alone (:meth:`~.adapter.ImageAdapter.output_ids`: a contiguous range is
a view of the output head's weight) skips the head's other rows as well, and the forced
columns are appended as zeros (a forced position's row is one-hot whatever its logits, and
a free one masks them); otherwise the columns are gathered from the full logits.
"""
from __future__ import annotations

import torch

from .adapter import ImageAdapter, TokenLayout


def compact_ids(layout: TokenLayout) -> tuple[torch.Tensor, int]:
    """``(ids, n_image)``: the ids a stream can hold, image ids first, then the forced
    ids that are not image ids; each part ascending."""
    image = torch.nonzero(layout.image_tokens).flatten()
    forced = torch.unique(layout.forced[layout.forced >= 0])
    forced = forced[~layout.image_tokens[forced]]
    return torch.cat([image, forced]), image.numel()


def compact(adapter: ImageAdapter) -> ImageAdapter:
    """``adapter`` behind its compact vocabulary, or itself where every id can be held."""
    ids, n_image = compact_ids(adapter.layout)
    if ids.numel() == adapter.vocab_size:
        return adapter
    return CompactVocabulary(adapter, ids, n_image)


def scores_trees(adapter) -> bool:
    """Whether ``adapter`` (or the one a compact vocabulary wraps) scores draft trees."""
    inner = adapter.inner if isinstance(adapter, CompactVocabulary) else adapter
    return type(inner).forward_tree is not ImageAdapter.forward_tree


class CompactVocabulary:
    """``inner`` with token ``i`` standing for id ``ids[i]`` (see the module docstring).
    Everything not defined here is the inner adapter's, read and written."""

    def __init__(self, inner: ImageAdapter, ids: torch.Tensor, n_image: int):
        self.inner, self.n_image = inner, n_image
        device = inner.device
        self.ids = ids.to(device)
        self.vocab_size = n = ids.numel()
        index = torch.full((inner.vocab_size,), -1, dtype=torch.long)
        index[ids] = torch.arange(n)
        self.index = index.to(device)
        lay = inner.layout
        forced = torch.where(lay.forced >= 0, index[lay.forced.clamp(min=0)], -1)
        self.layout = TokenLayout(length=lay.length, row_stride=lay.row_stride, image_tokens=torch.arange(n) < n_image,
                                  forced=forced, grid=lay.grid)
        # whether the inner adapter scores the image ids alone (asked once, set for each decode)
        self.native = bool(inner.output_ids(self.ids[:n_image]))
        inner.output_ids(None)

    #: the wrapper's own attributes; any other is read from and written to the inner adapter
    OWN = frozenset({"inner", "n_image", "ids", "vocab_size", "index", "layout", "native"})

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        if name in self.OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    # -- the edges ---------------------------------------------------------------
    def to_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.ids[tokens]

    def to_compact(self, tokens: torch.Tensor) -> torch.Tensor:
        """Ids to compact tokens; an id no stream can hold is refused."""
        out = self.index[tokens.to(self.index.device)]
        if bool((out < 0).any()):
            bad = int(tokens.flatten()[(out < 0).flatten().nonzero()[0]])
            raise ValueError(f"token id {bad} is neither an image token nor a forced one of this model: "
                             f"no stream holds it")
        return out

    def _columns(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.native:
            return logits.index_select(-1, self.ids)
        extra = self.vocab_size - self.n_image
        return logits if not extra else torch.cat([logits, logits.new_zeros(*logits.shape[:-1], extra)], -1)

    # -- the adapter contract -------------------------------------------------------
    def prefill(self, conditions, negatives, guided):
        if self.native:
            self.inner.output_ids(self.ids[: self.n_image])
        return self._columns(self.inner.prefill(conditions, negatives, guided))

    def forward(self, tokens):
        return self._columns(self.inner.forward(self.ids[tokens]))

    def forward_tree(self, tokens, parents, graph=None):
        return self._columns(self.inner.forward_tree(self.ids[tokens], parents, graph))

    def logits_from_features(self, features):
        return self._columns(self.inner.logits_from_features(features))

    def input_embeddings(self):
        emb = self.inner.input_embeddings()
        return None if emb is None else emb[self.ids.to(emb.device)]

    def token_vectors(self):
        vectors = self.inner.token_vectors()
        if vectors is None:
            return None
        ids, vecs = vectors
        return self.index[ids.to(self.index.device)].to(ids.device), vecs

    def output_width(self) -> int:
        """Columns of the inner adapter's logits while decoding."""
        return self.n_image if self.native else self.inner.vocab_size

    def release(self):
        if self.native:
            self.inner.output_ids(None)
        self.inner.release()
