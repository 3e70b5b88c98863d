"""The embedded model's text encoder: a word-level vocabulary and a small transformer.

It stands where LlamaGen's text-to-image models have flan-t5-xl: prompts become
a left-padded sequence of feature vectors with a mask, which the GPT's caption
projection reads (``LlamaGenAdapter`` calls :meth:`TextEncoder.encode`).  It is
trained together with the GPT.  Words outside the vocabulary are reported by
:meth:`TextEncoder.check`, never dropped silently.
"""
from __future__ import annotations

import torch
from torch import nn

from ..sampling.config import shorten
from .domain import words

PAD, EOS = "<pad>", "</s>"


class TextEncoder(nn.Module):
    def __init__(self, vocabulary: list[str], dim: int = 128, layers: int = 2, heads: int = 4, max_length: int = 16):
        super().__init__()
        self.vocabulary = [PAD, EOS] + sorted(vocabulary)
        self.index = {w: i for i, w in enumerate(self.vocabulary)}
        self.max_length = max_length
        self.embed = nn.Embedding(len(self.vocabulary), dim)
        self.position = nn.Parameter(torch.zeros(max_length, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)

    @property
    def dim(self) -> int:
        return self.embed.embedding_dim

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def unknown(self, prompt: str) -> list[str]:
        return [w for w in words(prompt) if w not in self.index]

    def check(self, prompts: list[str]) -> None:
        """Raise ``ValueError`` naming the words this model does not know."""
        for p in prompts:
            bad = self.unknown(p)
            if bad:
                known = " ".join(self.vocabulary[2:])
                raise ValueError(f"prompt {shorten(p)}: unknown word(s) {shorten(bad)}; this model knows: {known}")
            if len(words(p)) + 1 > self.max_length:
                raise ValueError(f"prompt {shorten(p)} is longer than {self.max_length - 1} words")

    def tokenize(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids ``[B, max_length]`` and mask, right-padded, ``</s>`` appended."""
        self.check(prompts)
        ids = torch.zeros(len(prompts), self.max_length, dtype=torch.long)
        for b, p in enumerate(prompts):
            row = [self.index[w] for w in words(p)] + [self.index[EOS]]
            ids[b, : len(row)] = torch.tensor(row)
        return ids.to(self.device), (ids != 0).long().to(self.device)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) + self.position[: ids.shape[1]]
        h = self.encoder(h, src_key_padding_mask=mask == 0)
        return self.norm(h)

    def encode(self, prompts: list[str], max_length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features [B, L, dim], mask [B, L])`` left-padded as LlamaGen's sampler
        pads T5 features (valid rows at the end, padding zeroed)."""
        if max_length not in (None, self.max_length):
            raise ValueError(f"this text encoder produces {self.max_length} tokens (asked for {max_length})")
        ids, mask = self.tokenize(prompts)
        with torch.set_grad_enabled(self.training):
            return left_pad(self(ids, mask), mask)


def left_pad(feats: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's valid (right-padded) tokens to the end; zero the padding: LlamaGen's
    layout of caption features, for this encoder and for T5 (``loaders/t5.py``)."""
    n = feats.shape[1]
    valid = mask.sum(1, keepdim=True)
    idx = (torch.arange(n, device=feats.device).unsqueeze(0) + valid) % n  # rotate left by `valid`
    out = feats.gather(1, idx.unsqueeze(-1).expand_as(feats))
    new_mask = mask.flip(-1)
    return out * new_mask.unsqueeze(-1).to(out.dtype), new_mask
