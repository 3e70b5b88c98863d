"""A decoding request checked and normalised before any model work: the
conditions, their negative prompts and one seed per image."""
from __future__ import annotations

import operator
from typing import Sequence

from .config import ConfigError, shorten


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
    allowed = f"an integer (image i gets seed + i) or one integer per prompt ({len(conditions)})"
    first = integer(seeds)
    if first is not None:
        return conditions, negatives, [first + i for i in range(len(conditions))]
    try:
        if isinstance(seeds, (str, bytes)):
            raise TypeError
        values = [integer(s) for s in seeds]
    except TypeError:  # not iterable (a float, a 0-d tensor)
        raise ConfigError(f"seeds must be {allowed}, got {shorten(seeds)}") from None
    if len(values) != len(conditions) or None in values:
        raise ConfigError(f"seeds must be {allowed}, got {shorten(seeds)}")
    return conditions, negatives, values


def integer(value) -> int | None:
    """``value`` as a Python int if it is integer-like (int, numpy and torch integer
    scalars), else None: floats and booleans are not seeds."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None
