"""Sweep specifications: ``gsd:G=1,3,10,25`` -> a list of named decoding settings.

A knob is named as the knob table names it anywhere: its field (``group_size``),
its symbol (``G``, ``k``, ``L``, ``delta``, ``i``, ``tau``), its label on the
sampler node, or an alias the table lists (``interval``, ``threshold``).
``delta`` is GSD's or LANTERN's budget, by the mode's acceptance rule.  Several
knobs in one spec form a grid: ``lantern:k=100,1000;delta=0.1,0.4``.
"""
from __future__ import annotations

import dataclasses
import itertools

from ..sampling.config import KNOBS, MODES, ConfigError, DecodeConfig, Knob, parse


def knob_keys(k: Knob) -> list[str]:
    """The keys a sweep accepts for knob ``k``: its symbol, field, node label and aliases."""
    return list(dict.fromkeys((k.symbol, k.name, k.label, *k.aliases)))


def sweep_keys() -> dict[str, list[str]]:
    """Every key a sweep accepts -> the fields it may mean (one, or a symbol shared by rules)."""
    keys: dict[str, list[str]] = {}
    for k in KNOBS.values():
        for key in knob_keys(k):
            keys.setdefault(key, []).append(k.name)
    return keys


def sweep_help(width: int = 100) -> str:
    """Every sweep key with its knob's help and range, for ``spec-ar bench --help``."""
    import textwrap

    lines = ["sweep keys (--sweep MODE:KEY=V1,V2[;KEY=...]): each knob answers to every name listed; delta is "
             "GSD's or LANTERN's by the mode"]
    for k in KNOBS.values():
        text = f"{', '.join(knob_keys(k))}: {k.help} ({k.range_text()})"
        lines += textwrap.wrap(text, width, initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False,
                               break_long_words=False)
    return "\n".join(lines)


def _field(mode: str, key: str, base: DecodeConfig) -> str:
    names = sweep_keys().get(key)
    if not names:
        raise ConfigError(f"sweep knob {key!r} is not a decoding setting; use one of {sorted(sweep_keys())}")
    if len(names) > 1:  # a symbol two methods share (delta): the one the mode's rule reads
        rule = dataclasses.replace(base, mode=mode).rule
        names = [n for n in names if rule in KNOBS[n].uses] or names[-1:]
    return names[0]


def parse_sweep(spec: str, base: DecodeConfig | None = None) -> list[tuple[str, DecodeConfig]]:
    """``"gsd:G=1,3,10"`` -> ``[("gsd G=1", DecodeConfig(...)), ...]``, every one validated."""
    mode, _, knobs = spec.partition(":")
    mode = mode.strip()
    if mode not in MODES:
        raise ConfigError(f"sweep {spec!r}: the mode must be one of {', '.join(MODES)} (got {mode!r})")
    base = dataclasses.replace(base or DecodeConfig(), mode=mode)
    axes = []
    for part in filter(None, (p.strip() for p in knobs.split(";"))):
        key, _, values = part.partition("=")
        if not values:
            raise ConfigError(f"sweep {spec!r}: expected knob=v1,v2,... (got {part!r})")
        name = _field(mode, key.strip(), base)
        axes.append([(key.strip(), name, parse(KNOBS[name], v.strip())) for v in values.split(",") if v.strip()])
    out = []
    for combo in itertools.product(*axes) if axes else [()]:
        label = " ".join([mode] + [f"{key}={value}" for key, _, value in combo])
        config = dataclasses.replace(base, **{name: value for _, name, value in combo})
        out.append((label, config.validate()))
    return out
