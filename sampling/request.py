"""A decoding request checked and normalised before any model work: the
conditions, their negative prompts and one seed per image."""
from __future__ import annotations

from typing import Sequence

from .config import ConfigError


def normalize_request(conditions: Sequence, negatives: Sequence | None, seeds) -> tuple[list, list | None, list]:
    """Lists of conditions, negatives (one per condition, or None) and seeds (an
    int ``s`` becomes ``s, s + 1, ...``); :class:`ConfigError` for a mismatch."""
    conditions = list(conditions)
    if not conditions:
        raise ConfigError("conditions must hold at least one prompt (got an empty batch)")
    if negatives is not None:
        negatives = list(negatives)
        if len(negatives) == 1 and len(conditions) > 1:
            negatives = negatives * len(conditions)
        if len(negatives) != len(conditions):
            raise ConfigError(
                f"negatives must hold one negative prompt, or one per prompt ({len(conditions)}), "
                f"got {len(negatives)}"
            )
    kinds = {type(c) for c in conditions}
    if len(kinds) > 1:
        raise ConfigError(f"conditions must all be of one type (got {sorted(k.__name__ for k in kinds)})")
    if isinstance(seeds, int):
        seeds = [seeds + i for i in range(len(conditions))]
    seeds = list(seeds)
    if len(seeds) != len(conditions) or not all(isinstance(s, int) for s in seeds):
        raise ConfigError(f"seeds must be one integer per prompt ({len(conditions)}), got {seeds!r}")
    return conditions, negatives, seeds
