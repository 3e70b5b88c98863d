"""Decoding settings, their allowed ranges, and the named modes.

A mode is a preset combination of parts: an acceptance rule and a verification
schedule on top of Jacobi self-drafting.  Any part can be swapped by name, so
``DecodeConfig(mode="gsd", schedule="similarity")`` is VVS skipping on top of GSD
acceptance without new code.

Every setting is checked by :meth:`DecodeConfig.validate` before any model work;
a bad one raises :class:`ConfigError` naming it and what is allowed.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

#: mode -> (acceptance rule, verification schedule)
MODES: dict[str, tuple[str, str]] = {
    "ar": ("exact", "every"),  # one token per forward, no drafts
    "sjd": ("exact", "every"),  # Speculative Jacobi Decoding (lossless)
    "gsd": ("grouped", "every"),  # Grouped Speculative Decoding
    "lantern": ("latent", "every"),  # LANTERN latent-neighbourhood relaxation
    "vvs": ("latent", "uniform"),  # VVS verification skipping on LANTERN acceptance
}
ACCEPTANCE_RULES = ("exact", "grouped", "latent")
SCHEDULES = ("every", "uniform", "similarity")
DRAFT_INITS = ("random", "repeat-left", "repeat-above", "sample-left", "sample-above")
#: settings a family may default (``ImageAdapter.sampling_defaults``)
SAMPLING_FIELDS = ("cfg_scale", "top_k", "top_p", "temperature")


class ConfigError(ValueError):
    """A decoding setting or input outside its allowed range."""


@dataclass(frozen=True)
class DecodeConfig:
    mode: str = "sjd"
    acceptance: str | None = None  # None: the mode's rule
    schedule: str | None = None  # None: the mode's schedule
    # Jacobi drafting
    window: int = 16  # draft tokens scored per forward (SJD paper: 16)
    init: str = "random"  # draft initialisation for new window positions
    # GSD
    group_size: int = 10  # G: ranks around the draft in the target distribution
    gsd_delta: float = 0.15  # drop cluster members with |p(c) - p(x)| > delta
    gsd_distance: float | None = None  # d: drop members farther than d (squared L2)
    # LANTERN
    lantern_k: int = 300  # latent neighbourhood size
    lantern_delta: float = 0.1  # total-variation budget
    # VVS
    skip_interval: int = 2  # uniform: every i-th step skips verification
    skip_threshold: float = 0.7  # similarity: skip when path similarity >= this
    skip_alpha: float = 0.9  # similarity: depth decay of the weights
    skip_paths: int = 4  # similarity: candidate paths compared
    # sampling (None: the family's default, then the value below)
    cfg_scale: float | None = None  # 1.0
    top_k: int | None = None  # off
    top_p: float | None = None  # 1.0 (off)
    temperature: float | None = None  # 1.0; 0 = greedy

    # -- resolution ---------------------------------------------------------
    @property
    def rule(self) -> str:
        return self.acceptance or MODES.get(self.mode, ("exact", "every"))[0]

    @property
    def verify_schedule(self) -> str:
        return self.schedule or MODES.get(self.mode, ("exact", "every"))[1]

    @property
    def drafts(self) -> int:
        """Draft tokens per window (0 in ``ar`` mode)."""
        return 0 if self.mode == "ar" else self.window

    def with_defaults(self, defaults: dict | None) -> "DecodeConfig":
        """Fill unset sampling settings from a family's defaults, then globally."""
        base = {"cfg_scale": 1.0, "top_k": None, "top_p": 1.0, "temperature": 1.0}
        base.update({k: v for k, v in (defaults or {}).items() if k in base})
        return replace(self, **{k: base[k] for k in SAMPLING_FIELDS if getattr(self, k) is None})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "DecodeConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"unknown decoding setting(s) {unknown}; known: {sorted(names)}")
        return cls(**values)

    # -- validation ---------------------------------------------------------
    def validate(self, codebook_size: int | None = None) -> "DecodeConfig":
        """Raise :class:`ConfigError` for the first setting out of range (LANTERN's
        neighbourhood against the codebook once ``codebook_size`` is known)."""
        _choice("mode", self.mode, tuple(MODES))
        if self.acceptance is not None:
            _choice("acceptance", self.acceptance, ACCEPTANCE_RULES)
        if self.schedule is not None:
            _choice("schedule", self.schedule, SCHEDULES)
        _choice("init", self.init, DRAFT_INITS)
        _int("window", self.window, 1, 256)
        _int("group_size", self.group_size, 1, 1 << 20)
        _real("gsd_delta", self.gsd_delta, 0.0, 1.0)
        if self.gsd_distance is not None:
            _real("gsd_distance", self.gsd_distance, 0.0, math.inf)
        _int("lantern_k", self.lantern_k, 1, 1 << 20, "the model's codebook size - 1")
        if codebook_size is not None and self.rule == "latent" and self.lantern_k > codebook_size - 1:
            raise ConfigError(
                f"lantern_k must be an integer in [1, {codebook_size - 1}] for this model's "
                f"codebook of {codebook_size} codes (got {self.lantern_k})"
            )
        _real("lantern_delta", self.lantern_delta, 0.0, 1.0)
        _int("skip_interval", self.skip_interval, 2, 1 << 20, "the image's token count")
        _real("skip_threshold", self.skip_threshold, -1.0, 1.0)
        _real("skip_alpha", self.skip_alpha, 1e-6, 1.0)
        _int("skip_paths", self.skip_paths, 2, 64)
        if self.cfg_scale is not None:
            _real("cfg_scale", self.cfg_scale, 0.0, 100.0)
        if self.top_k is not None:
            _int("top_k", self.top_k, 1, 1 << 24, "the vocabulary size; None disables top-k")
        if self.top_p is not None:
            _real("top_p", self.top_p, 1e-6, 1.0)
        if self.temperature is not None:
            _real("temperature", self.temperature, 0.0, 100.0)
        if self.mode == "ar" and (self.acceptance or self.schedule not in (None, "every")):
            raise ConfigError("mode 'ar' has no drafts: leave acceptance and schedule unset")
        return self


def shorten(value, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error must not echo a 10 000-character prompt."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _choice(name, value, allowed):
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, allowed))} (got {shorten(value)})")


def _int(name, value, lo, hi, bound: str = ""):
    """``bound`` names the real upper limit where ``hi`` is only a sanity cap (it
    depends on the model, or is too large to matter)."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        rng = f"in [{lo}, {bound}]" if bound else f"in [{lo}, {hi}]"
        raise ConfigError(f"{name} must be an integer {rng} (got {shorten(value)})")


def _real(name, value, lo, hi):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi
    if not ok or (isinstance(value, float) and math.isnan(value)):
        rng = f">= {lo}" if hi == math.inf else f"in [{lo}, {hi}]"
        raise ConfigError(f"{name} must be a number {rng} (got {shorten(value)})")
