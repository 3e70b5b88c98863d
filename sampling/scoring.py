"""Teacher-forced scoring: the verified distribution at every position of given
token streams (the bench's target NLL, the demo's uncertainty figure), with the
same guidance and sampling settings as a decoder's."""
from __future__ import annotations

from typing import Sequence

import torch


@torch.no_grad()
def target_probabilities(decoder, conditions: Sequence, tokens: torch.Tensor, negatives=None,
                         reduce=lambda p: p.amax(-1), chunk: int | None = None) -> torch.Tensor:
    """The verified distribution at every position of given streams, reduced
    per position by ``reduce`` (default: its top-1 probability).  ``tokens``:
    ``[B, length]``; scored ``chunk`` positions per forward (default: the
    whole stream in one)."""
    return _score(decoder, conditions, tokens, negatives, lambda p, _: reduce(p), chunk)

def target_log_likelihood(decoder, conditions: Sequence, tokens: torch.Tensor, negatives=None,
                          chunk: int | None = 256) -> torch.Tensor:
    """``log p(token)`` under the verified distribution (same guidance and
    sampling settings) at every position of given streams ``[B, length]``:
    how likely the target finds what a setting committed.  ``-inf`` where
    it gives the token no mass; 0 at forced positions.  ``chunk`` positions
    per forward keep memory bounded on long streams."""
    return _score(decoder, conditions, tokens, negatives,
                       lambda p, toks: p.gather(-1, toks.unsqueeze(-1)).squeeze(-1), chunk).log()

def _score(decoder, conditions, tokens, negatives, pick, chunk):
    """``pick(p, tokens)`` per chunk of positions of teacher-forced streams, concatenated (in
    inference mode, as the decoder runs, so that the adapter's caches and compiled blocks serve
    both; the result is a plain tensor)."""
    with torch.inference_mode():
        out = _score_chunks(decoder, conditions, tokens, negatives, pick, chunk)
    return out.clone()


def _score_chunks(decoder, conditions, tokens, negatives, pick, chunk):
    ad = decoder.adapter
    tokens = decoder.to_tokens(tokens.to(ad.device))
    B, T = tokens.shape
    chunk = chunk or T
    try:
        p = decoder.pipeline(ad.prefill(list(conditions), negatives, decoder.guided).unsqueeze(2),
                          torch.zeros(B, 1, dtype=torch.long, device=ad.device))
        parts = [pick(p, tokens[:, :1])]
        for start in range(1, T, chunk):
            stop = min(start + chunk, T)
            pos = torch.arange(start, stop, device=ad.device).expand(B, -1)
            parts.append(pick(decoder.pipeline(ad.forward(tokens[:, start - 1:stop - 1]), pos),
                              tokens[:, start:stop]))
    finally:
        ad.release()
    return torch.cat(parts, 1)
