"""The contract between a model family and the engine.

A family (``loaders/``) turns a checkpoint into an :class:`ImageAdapter`.  The
engine drives it through four calls and never learns what the model is:

* :meth:`ImageAdapter.prefill` runs the condition for every guidance branch and
  returns the logits of the first image position;
* :meth:`ImageAdapter.forward` scores a window of new tokens on top of the KV
  cache (the same tokens go to every branch) and returns one row of logits per
  window token, each predicting the *next* position;
* :meth:`ImageAdapter.rollback` drops the last ``n[b]`` cached positions of
  sample ``b`` (the rejected part of a window; host integers);
* for draft heads (EAGLE-style drafters that read the target's last hidden
  states), an adapter whose ``keep_features`` is set keeps in :attr:`features`
  the final hidden states of its last ``prefill`` (every condition position) or
  ``forward`` (every window token), ``[K, B, L, H]``, and
  :meth:`ImageAdapter.logits_from_features` turns such states into logits;
* :attr:`ImageAdapter.layout` says which token ids are image tokens, which
  positions hold forced structural tokens (end-of-line, end-of-image, size
  tokens) and how the raster is laid out; :meth:`ImageAdapter.token_vectors`
  gives the codebook vectors used for neighbourhoods and path similarities.

Cache convention: after ``prefill`` the cache holds the condition only.  Every
``forward`` appends ``L`` positions per sample; each sample may sit at its own
length (samples advance by different amounts), so adapters keep per-sample
lengths and attention masks.  Windows can run past the end of the image by up to
``window + 1`` positions; the engine rolls those back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class TokenLayout:
    """Where image tokens go in the generated stream.

    ``length``: tokens in the stream, structural ones included.
    ``row_stride``: stream positions per raster row (image columns plus any
    end-of-line token); position ``t - row_stride`` is the token above ``t``.
    ``image_tokens``: bool ``[vocab]``, the ids allowed at free positions.
    ``forced``: int64 ``[length]``, the token id forced at each position or -1.
    ``grid``: ``(rows, cols)`` of image tokens, for decoders and accept maps.
    """

    length: int
    row_stride: int
    image_tokens: torch.Tensor
    forced: torch.Tensor
    grid: tuple[int, int]

    @classmethod
    def raster(
        cls,
        rows: int,
        cols: int,
        vocab_size: int,
        image_ids: torch.Tensor | None = None,
        forced: dict[int, int] | None = None,
        row_stride: int | None = None,
        length: int | None = None,
    ) -> "TokenLayout":
        """A raster layout; ``image_ids=None`` means every id is an image token."""
        mask = torch.ones(vocab_size, dtype=torch.bool)
        if image_ids is not None:
            mask = torch.zeros(vocab_size, dtype=torch.bool)
            mask[image_ids] = True
        stride = row_stride or cols
        n = length or rows * stride
        f = torch.full((n,), -1, dtype=torch.long)
        for pos, tok in (forced or {}).items():
            f[pos] = tok
        return cls(length=n, row_stride=stride, image_tokens=mask, forced=f, grid=(rows, cols))

    @property
    def vocab_size(self) -> int:
        return self.image_tokens.numel()

    def image_positions(self) -> torch.Tensor:
        """Stream positions of the ``rows * cols`` image tokens, in raster order."""
        return torch.nonzero(self.forced < 0).flatten()


class ImageAdapter:
    """Base class of every family adapter (see the module docstring)."""

    layout: TokenLayout
    vocab_size: int
    device: torch.device = torch.device("cpu")
    #: how guidance branches combine (``sampling.processing.GUIDANCE``)
    guidance: str = "linear"
    #: the family's reference sampling settings (cfg_scale, top_k, top_p, temperature)
    sampling_defaults: dict = {}
    #: keep the final hidden states of each call in ``features`` (a draft head reads them)
    keep_features: bool = False
    features: torch.Tensor | None = None
    #: width of those hidden states, the condition's length where it is fixed (LlamaGen),
    #: and the side of a 2D rotary position grid (LlamaGen's; None: 1D positions)
    feature_size: int | None = None
    condition_positions: int | None = None
    rope_grid: int | None = None
    #: how forwards run: ``eager`` (shapes as they come), ``static`` (a preallocated cache
    #: read in buckets, windows and trees padded to a few widths) or ``graphs`` (static,
    #: replayed as CUDA graphs); see ``loaders/static_cache.py``.  Tokens are the same.
    decode_path: str = "eager"

    def check_conditions(self, conditions: Sequence, negatives: Sequence | None) -> None:
        """Raise ``ValueError`` naming the bad prompt before any model work."""

    def guidance_scales(self, scale: float) -> torch.Tensor | None:
        """The guidance scale at each stream position (``[layout.length]``) where the family's
        reference varies it with the position, starting from ``scale``; None: ``scale`` throughout."""
        return None

    def branches(self, guided: bool) -> int:
        """Number of guidance branches ``K`` that ``prefill``/``forward`` return."""
        return 2 if guided else 1

    def prefill(self, conditions: Sequence, negatives: Sequence | None, guided: bool) -> torch.Tensor:
        """Logits ``[K, B, vocab]`` of the first image position."""
        raise NotImplementedError

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[K, B, L, vocab]`` for a window ``tokens`` of shape ``[B, L]``."""
        raise NotImplementedError

    def rollback(self, n: list[int], most: int | None = None) -> None:
        """Drop the last ``n[b]`` cached positions of sample ``b`` (``n[b] >= 0``).
        Host integers: the engine calls this right after its per-step
        synchronisation, so adapters may use them freely (e.g. to crop a cache).
        An adapter that sets ``rolls_back_on_device`` also takes ``n`` as an int64
        ``[B]`` tensor the host has not read (the engine's step on the device); ``most``
        then bounds its entries where a row may end shorter than the host last knew it
        (a draft model drops its drafts; a verify step never shrinks a row)."""
        raise NotImplementedError

    #: ``rollback`` takes a device tensor too: the engine may keep its step on the device
    #: (engine.py), reading lengths every few steps; it calls :meth:`sync_lengths` then
    rolls_back_on_device: bool = False

    #: :meth:`keep_samples` narrows the batch (finished images leave it, engine.py)
    drops_samples: bool = False

    def keep_samples(self, keep: list[int]) -> None:
        """Only samples ``keep`` (sorted indices into the batch) stay: their cache rows in
        every guidance branch; later calls see a batch of ``len(keep)``."""
        raise NotImplementedError

    def sync_lengths(self) -> None:
        """The engine has read the lengths after device rollbacks: what the adapter keeps of
        them on the host may be made exact again."""

    def forward_tree(self, tokens: torch.Tensor, parents: torch.Tensor | None,
                     graph: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Logits ``[K, B, N, vocab]`` of a draft tree (``tree.py``) of ``tokens``
        ``[B, N]`` with ``parents`` ``[B, N]``, on top of the cache, in one forward;
        the cache then holds all ``N`` nodes until :meth:`keep_tree`.  A node sits
        at the cache's length plus its depth and sees the cache, its ancestors and
        itself.  ``graph`` ``(sees [B, N, N], depth [B, N])`` states that instead
        (``parents`` unused): node ``i`` sees node ``j`` where ``sees[b, i, j]``
        (itself always), at position cache length + ``depth[b, i]``; row-parallel
        drafting (``rows.py``) scores nodes of several image rows so."""
        raise NotImplementedError(f"{type(self).__name__} cannot score draft trees")

    def keep_tree(self, nodes: torch.Tensor, counts: list[int]) -> None:
        """After :meth:`forward_tree`: keep nodes ``nodes[b, :counts[b]]`` (a path from
        the root, in order) in sample ``b``'s cache and drop the other nodes.  An adapter
        that sets ``rolls_back_on_device`` takes ``counts`` as a device tensor too."""
        raise NotImplementedError(f"{type(self).__name__} cannot score draft trees")

    def logits_from_features(self, features: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., vocab]`` (float32, a fresh tensor: the engine processes
        logits in place) of final hidden states ``[..., H]`` through the model's
        output head; adapters that keep ``features`` have it."""
        raise NotImplementedError(f"{type(self).__name__} gives no hidden states to a draft head")

    def output_ids(self, ids: torch.Tensor | None) -> bool:
        """Until ``output_ids(None)``: logits of these ids only (``[..., len(ids)]``, in their order)
        from every call, where the adapter can score them without the rest of its vocabulary;
        False if it cannot (then nothing changes and the caller gathers the columns it needs).
        A compact vocabulary (``compact.py``) asks for the image ids."""
        return False

    def input_embeddings(self) -> torch.Tensor | None:
        """``[vocab, H]``: what the model reads for each token id (a new draft head's
        frozen embeddings start from it); None if unknown."""
        return None

    def token_vectors(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(ids [N], vectors [N, D])``: codebook vectors of the image tokens."""
        return None

    def cache_lengths(self) -> torch.Tensor | None:
        """Image positions currently cached per sample (for invariant checks)."""
        return None

    def cache_bytes(self) -> int | None:
        """Bytes held by the KV cache now (for memory reports), if known."""
        return None

    def live_cache_bytes(self) -> int | None:
        """Bytes of the KV cache a forward reads now: the live positions of a
        preallocated cache, all of a cache that grows as it fills."""
        return self.cache_bytes()

    def cache_bytes_per_image(self, conditions: Sequence, negatives: Sequence | None, guided: bool) -> int | None:
        """Bytes the KV cache will hold per image for a batch of ``conditions``
        (every guidance branch, the longest condition, a whole image and the
        windows past its end), estimated before ``prefill`` allocates it; None
        if unknown (the request is then sized without it)."""
        return None

    def release(self) -> None:
        """Free per-generation state (KV caches)."""
