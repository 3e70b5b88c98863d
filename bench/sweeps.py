"""Sweep specifications: ``gsd:G=1,3,10,25`` -> a list of named decoding settings.

The knob names are the papers' (``G``, ``delta``, ``k``, ``d``, ``window``,
``init``, ``interval``, ``threshold``) or any ``DecodeConfig`` field; ``delta``
means GSD's or LANTERN's budget depending on the mode's acceptance rule.  Several
knobs in one spec form a grid: ``lantern:k=100,1000;delta=0.1,0.4``.
"""
from __future__ import annotations

import dataclasses
import itertools

from ..sampling.config import ConfigError, DecodeConfig

ALIASES = {"G": "group_size", "g": "group_size", "k": "lantern_k", "d": "gsd_distance", "L": "window",
           "interval": "skip_interval", "i": "skip_interval", "threshold": "skip_threshold", "s": "skip_threshold"}
FIELDS = {f.name: f for f in dataclasses.fields(DecodeConfig)}


def _field(mode: str, knob: str, base: DecodeConfig) -> str:
    if knob == "delta":
        rule = DecodeConfig(mode=mode, acceptance=base.acceptance).rule
        return {"grouped": "gsd_delta", "latent": "lantern_delta"}.get(rule, "lantern_delta")
    name = ALIASES.get(knob, knob)
    if name not in FIELDS or name == "mode":
        raise ConfigError(f"sweep knob {knob!r} is not a decoding setting; use one of "
                          f"{sorted(set(ALIASES) | {'delta'} | set(FIELDS) - {'mode'})}")
    return name


def _value(name: str, text: str):
    kind = str(FIELDS[name].type).split(" |")[0]
    if text.lower() in ("none", "off"):
        return None
    try:
        return {"int": int, "float": float}.get(kind, str)(text)
    except ValueError as err:
        raise ConfigError(f"sweep value {text!r} for {name} must be of type {kind}") from err


def parse_sweep(spec: str, base: DecodeConfig | None = None) -> list[tuple[str, DecodeConfig]]:
    """``"gsd:G=1,3,10"`` -> ``[("gsd G=1", DecodeConfig(...)), ...]``, every one validated."""
    mode, _, knobs = spec.partition(":")
    mode = mode.strip()
    base = dataclasses.replace(base or DecodeConfig(), mode=mode)
    axes = []
    for part in filter(None, (p.strip() for p in knobs.split(";"))):
        knob, _, values = part.partition("=")
        if not values:
            raise ConfigError(f"sweep {spec!r}: expected knob=v1,v2,... (got {part!r})")
        name = _field(mode, knob.strip(), base)
        axes.append([(knob.strip(), name, _value(name, v.strip())) for v in values.split(",") if v.strip()])
    out = []
    for combo in itertools.product(*axes) if axes else [()]:
        label = " ".join([mode] + [f"{knob}={value}" for knob, _, value in combo])
        config = dataclasses.replace(base, **{name: value for _, name, value in combo})
        out.append((label, config.validate()))
    return out
