"""Decoding settings: the one knob table, the named modes, and validation.

Every :class:`DecodeConfig` field carries its :class:`Knob` (the papers' symbol,
the label the ComfyUI sampler shows, range and step, help, and which parts of
decoding use it).  Every surface reads that declaration and nothing else: the
command line's options (``--group-size``), the sampler node's sliders and combos,
the bench's sweep keys (``gsd:G=1,10``), report labels, and the error messages,
which name a knob the way the user met it (:data:`SURFACES`).

A mode is a preset combination of parts: an acceptance rule and a verification
schedule on top of Jacobi self-drafting.  Any part can be swapped by name, so
``DecodeConfig(mode="gsd", schedule="similarity")`` is VVS skipping on top of GSD
acceptance without new code.

Every setting is checked by :meth:`DecodeConfig.validate` before any model work;
a bad one raises :class:`ConfigError` naming it and what is allowed.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

#: mode -> (acceptance rule, verification schedule)
MODES: dict[str, tuple[str, str]] = {
    "ar": ("exact", "every"),  # one token per forward, no drafts
    "sjd": ("exact", "every"),  # Speculative Jacobi Decoding (lossless)
    "gsd": ("grouped", "every"),  # Grouped Speculative Decoding
    "lantern": ("latent", "every"),  # LANTERN latent-neighbourhood relaxation
    "vvs": ("latent", "uniform"),  # VVS verification skipping on LANTERN acceptance
}
MODE_HELP = {
    "ar": "one token per forward (the reference)",
    "sjd": "Speculative Jacobi Decoding: the same distribution as ar, several tokens per forward",
    "gsd": "Grouped Speculative Decoding: a draft stands on the mass of the tokens ranked around it (lossy)",
    "lantern": "LANTERN: a draft stands on the mass of its codebook neighbours (lossy)",
    "vvs": "VVS: LANTERN acceptance, and some steps commit drafts without verifying them",
}
#: VVS without a draft model is a stand-in; its cost as measured on the embedded model (docs/benchmarks.md,
#: "Draft models and draft trees"), quoted wherever the mode is offered
VVS_ON_JACOBI = ("As the paper defines it with a draft model linked (skips commit a drafter path from the accepted "
                 "prefix; on the embedded model FD to ar 37.7 against a noise floor of 34.1). Without one, an "
                 "approximation on Jacobi drafts (skips commit the window's tail, drawn after the last rejection; "
                 "the window on auto keeps 24 for it): FD to ar 52.3 against a noise floor of 37.3 (spec-ar "
                 "evaluate, 200 images; 185.6 at window 2)")
MODE_HELP["vvs"] += ". " + VVS_ON_JACOBI
ACCEPTANCE_RULES = ("exact", "grouped", "latent")
SCHEDULES = ("every", "uniform", "similarity")
DRAFT_INITS = ("random", "repeat-left", "repeat-above", "sample-left", "sample-above")
DRAFT_COUPLINGS = ("none", "maximal", "gumbel")
DRAFT_TREES = ("chain", "dynamic", "static", "sampled")
#: settings a family may default (``ImageAdapter.sampling_defaults``), and their values where it does not
SAMPLING_FALLBACK = {"cfg_scale": 1.0, "top_k": None, "top_p": 1.0, "temperature": 1.0}
SAMPLING_FIELDS = tuple(SAMPLING_FALLBACK)
#: window and draft init where left on auto, by drafting: SJD's published values for independent
#: drafts; for coupled ones the values measured best on the embedded model (docs/benchmarks.md)
DRAFTING_PRESETS = {"independent": (16, "random"), "coupled": (24, "sample-left")}
#: how each surface names a knob in messages: the field, the command-line option, the node's widget
SURFACES = ("api", "cli", "node")


class ConfigError(ValueError):
    """A decoding setting or input outside its allowed range."""


@dataclass(frozen=True)
class Knob:
    """One decoding setting, declared once.

    ``uses`` says which configurations read it: ``"drafts"`` (every mode but
    ``ar``), ``"jacobi"`` / ``"drafter"`` (drafted by the model itself, or by a
    draft model), an acceptance rule (``"grouped"``, ``"latent"``), a schedule
    (``"uniform"``, ``"similarity"``) or ``"always"``.  ``bound`` names a
    model-dependent upper limit (``hi`` is then only a sanity cap).  ``widget``
    is how the sampler node shows it (``None``: not on the node)."""

    symbol: str  # the papers' symbol, ASCII: also a bench sweep key
    label: str  # the sampler node's widget name
    help: str
    uses: tuple[str, ...]
    lo: float | None = None
    hi: float | None = None
    step: float | None = None
    choices: tuple | None = None
    bound: str = ""
    widget: str | None = "slider"  # "slider", "number", "combo" or None
    # added after workflows were shared: the node lists it after all its other inputs, as an
    # optional one, since a saved workflow keeps widget values by position (and an API one
    # without it still runs)
    appended: bool = False
    optional: bool = False  # None is a value (off / the family's default)
    aliases: tuple[str, ...] = ()  # more names bench sweeps accept
    unset: str = ""  # what None means where it is not "off" (auto: ...)
    name: str = ""  # the field's name and value type ("int", "float", "str"), filled in from the field
    kind: str = ""

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def shown_as(self, surface: str) -> str:
        return {"api": self.name, "cli": self.option, "node": self.label}[surface]

    def range_text(self) -> str:
        if self.kind == "str" and self.choices is None:
            return "a file path"
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices if c is not None)
        hi = self.bound or (f"{self.hi:g}" if self.hi != math.inf else "")
        return f"in [{self.lo:g}, {hi}]" if hi else f">= {self.lo:g}"

    def used_by(self, config: "DecodeConfig") -> bool:
        parts = {"always"}
        if config.drafts:
            parts |= {"drafts", config.rule, config.verify_schedule, "drafter" if config.drafter else "jacobi"}
            if config.drafter and config.tree != "chain":
                parts |= {"tree", config.tree}
        return bool(parts & set(self.uses))

    def to_json(self) -> dict:
        """What the web page needs (the node's knob visibility): JSON-safe."""
        out = {"name": self.name, "label": self.label, "symbol": self.symbol, "uses": list(self.uses),
               "help": self.help, "kind": self.kind, "widget": self.widget}
        if self.choices is not None:
            out["choices"] = list(self.choices)
        else:
            out.update(lo=self.lo, hi=None if self.hi == math.inf else self.hi, step=self.step)
        return out


def knob(default, **kw):
    return field(default=default, metadata={"knob": Knob(**kw)})


@dataclass(frozen=True)
class DecodeConfig:
    mode: str = "sjd"
    acceptance: str | None = knob(
        None, symbol="rule", label="acceptance", uses=("drafts",), choices=(None,) + ACCEPTANCE_RULES,
        widget=None, optional=True, help="acceptance rule instead of the mode's: exact, grouped (GSD) or latent "
                                         "(LANTERN)")
    schedule: str | None = knob(
        None, symbol="schedule", label="schedule", uses=("drafts",), choices=(None,) + SCHEDULES, widget="combo",
        optional=True, help="verification schedule instead of the mode's: every step, uniform skipping (every "
                            "i-th step commits drafts unverified) or similarity skipping (when the drafts' paths "
                            "agree); VVS's skipping on any mode")
    # Jacobi drafting
    window: int | None = knob(
        None, symbol="L", label="window", uses=("jacobi",), lo=1, hi=256, step=1, optional=True,
        unset="auto: the width that commits the most tokens per second on this device: 24 with coupled drafts "
              "and 16 without (SJD's), unless the first decode at a batch size, timing its own steps at that "
              "width by turns with 2 and with the width their costs predict (or plain AR steps), finds one 5 % "
              "faster; the "
              "width kept holds for the session (VVS and trees beside the window keep the preset)",
        help="draft tokens scored per forward (SJD's independent drafts gain little past 16; coupled ones keep "
             "gaining to 32, which costs about 11 % more engine time per forward than SJD's window against 4 % at "
             "24 for 1 % more tokens per forward)")
    init: str | None = knob(
        None, symbol="init", label="draft_init", uses=("jacobi",), choices=(None,) + DRAFT_INITS, widget="combo",
        optional=True, unset="auto: sample-left with coupled drafts, random without (SJD's)",
        help="how new draft positions start: a random image token (SJD's default), a copy of the token to the "
             "left / above, or a sample from its distribution")
    draft_coupling: str = knob(
        "maximal", symbol="coupling", label="draft_coupling", uses=("jacobi",), choices=DRAFT_COUPLINGS,
        widget="combo",
        help="how a position's draft is drawn again after a pass: coupled with its previous draft so it changes "
             "only as much as its distribution did (maximal, the default, or gumbel: MC-SJD), or independently "
             "(none: SJD as published, with window and init on auto its window 16, unless this device runs "
             "another width faster, and random init); every choice is lossless")
    proactive: int = knob(
        1, symbol="K", label="proactive_K", uses=("jacobi",), lo=1, hi=8, step=1, appended=True,
        help="proactive drafting (SJD-PAC): K alternatives at each of the window's first proactive_D - 1 draft "
             "positions, a full K-ary tree below the newest token verified with the window in one forward by "
             "recursive rejection over siblings (lossless with exact acceptance); 1 is off, SJD-PAC's K is 3 or 4. "
             "On the embedded model it gains nothing on coupled drafts (K 3: 5.93 tokens per forward against "
             "6.07) and 1.13x on SJD as published (3.92 against 3.47), and costs time on a CPU (batch 1: 664 "
             "against 410 ms)")
    proactive_depth: int = knob(
        3, symbol="D", label="proactive_D", uses=("jacobi",), lo=2, hi=6, step=1, appended=True,
        help="proactive drafting: the tree's levels, its root (the newest token) included: the window's first "
             "D - 1 drafts get alternatives (SJD-PAC: 3)")
    rows: int = knob(
        1, symbol="R", label="rows_R", uses=("jacobi",), lo=1, hi=16, step=1, appended=True,
        help="row-parallel drafting (ZipAR), relaxed: each forward also drafts and verifies the R - 1 image rows "
             "below the one being completed, each as far as the row above is rows_W tokens ahead of it, against "
             "what the row sees (the image above it so far, not the rest of the row above); what a row accepts "
             "is committed as drawn, never tested against the whole image, so the image is not the model's "
             "distribution even under exact acceptance; 1 is off. On the embedded model (coupled drafts, window 24) "
             "R 4 with W 1 commits 1.16x the tokens per forward (7.09 against 6.13) at FD to ar 42.3 against 36.7 "
             "(noise floor 30.1), R 8 with W 1 1.32x at FD 77.1, and every setting is slower on a CPU (batch 1: "
             "784 ms and more against 390)")
    row_lead: int = knob(
        8, symbol="W", label="rows_W", uses=("jacobi",), lo=1, hi=128, step=1, appended=True,
        help="row-parallel drafting: how far the row above must be ahead (in tokens, or complete) before a "
             "row's next token is drawn (ZipAR's window: 8 for LlamaGen, 16 for Lumina-mGPT)")
    # a draft model (a sibling or a draft head); ``drafter`` names it and is set by the
    # engine when one is attached (None: Jacobi self-drafting)
    depth: int = knob(4, symbol="depth", label="drafter_depth", uses=("drafter",), lo=1, hi=64, step=1,
                      help="drafts a draft model proposes per forward of the target: the chain's length, or the "
                           "tree's depth")
    tree: str = knob("chain", symbol="tree", label="draft_tree", uses=("drafter",), choices=DRAFT_TREES,
                     widget="combo",
                     help="how a draft model's drafts are laid out: one chain, a dynamic tree (EAGLE-2: the "
                          "top-k children of the likeliest nodes, then the likeliest tree_tokens kept), a "
                          "static tree (LANTERN++: a fixed shape of child ranks), or a sampled tree (the static "
                          "shape, children drawn from the draft distribution without replacement and tested "
                          "against it: beyond the papers; not with skipping schedules), all verified in one forward")
    tree_top_k: int = knob(10, symbol="topk", label="tree_top_k", uses=("tree",), lo=1, hi=64, step=1,
                           help="tree drafting: children per expanded node (dynamic), the widest rank (static, "
                                "sampled)")
    tree_tokens: int = knob(60, symbol="N", label="tree_tokens", uses=("tree",), lo=2, hi=512, step=1,
                            help="tree drafting: draft tokens in the tree, verified in one forward (LANTERN: 59)")
    tree_choices: str | None = knob(None, symbol="choices", label="tree_choices", uses=("static", "sampled"),
                                    widget=None, optional=True,
                                    unset="auto: the tree_tokens likeliest rank paths under a Zipf prior",
                                    help="static or sampled tree shape: a JSON file with a list of child-rank paths "
                                         "([[0], [1], [0, 0], ...], every prefix listed)")
    drafter: str | None = None
    # GSD
    group_size: int = knob(10, symbol="G", label="G", uses=("grouped",), lo=1, hi=1000, step=1,
                           help="GSD group size: the tokens ranked around a draft that count with it (paper: 10 "
                                "for quality, 50 for speed; 1 is SJD)")
    gsd_delta: float = knob(0.15, symbol="delta", label="gsd_delta", uses=("grouped",), lo=0.0, hi=1.0, step=0.01,
                            help="GSD: group members whose probability differs from the draft's by more than "
                                 "this leave the group (paper: 0.15)")
    gsd_distance: float | None = knob(None, symbol="d", label="gsd_distance", uses=("grouped",), lo=0.0,
                                      hi=math.inf, widget=None, optional=True,
                                      help="GSD: group members farther than this from the draft in the codebook "
                                           "(squared L2) leave the group; none: no distance filter")
    # LANTERN
    lantern_k: int = knob(300, symbol="k", label="k", uses=("latent",), lo=1, hi=1 << 20, step=1,
                          bound="the model's codebook size - 1", widget="number",
                          help="LANTERN/VVS neighbourhood: the k nearest codebook entries of a draft "
                               "(paper: 1000 of 16384)")
    lantern_delta: float = knob(0.1, symbol="delta", label="lantern_delta", uses=("latent",), lo=0.0, hi=1.0,
                                step=0.01, help="LANTERN/VVS total-variation budget: 0 is exact, larger accepts "
                                                "more (paper: 0.1 to 0.4)")
    # VVS
    skip_interval: int = knob(2, symbol="i", label="skip_interval", uses=("uniform",), lo=2, hi=64, step=1,
                              aliases=("interval",),
                              help="uniform skipping: every i-th step commits drafts without verifying "
                                   "(VVS: 2 to 4)")
    skip_threshold: float = knob(0.7, symbol="tau", label="skip_threshold", uses=("similarity",), lo=-1.0, hi=1.0,
                                 step=0.01, aliases=("threshold",),
                                 help="similarity skipping: skip a verification when the drafts' paths agree at "
                                      "least this much (VVS: 0.65 to 0.8)")
    skip_alpha: float = knob(0.9, symbol="alpha", label="skip_alpha", uses=("similarity",), lo=1e-6, hi=1.0,
                             widget=None, help="similarity skipping: depth decay of the path weights (VVS: 0.9)")
    skip_paths: int = knob(4, symbol="P", label="skip_paths", uses=("similarity",), lo=2, hi=64, widget=None,
                           help="similarity skipping: candidate paths compared")
    # sampling (None: the family's default, then the value in the help)
    cfg_scale: float | None = knob(None, symbol="cfg", label="cfg", uses=("always",), lo=0.0, hi=100.0, step=0.1,
                                   optional=True, help="classifier-free guidance scale (1 = none)")
    top_k: int | None = knob(None, symbol="top_k", label="top_k", uses=("always",), lo=1, hi=1 << 24, step=1,
                             bound="the vocabulary size", widget="number", optional=True,
                             help="keep the k most likely tokens (none: off)")
    top_p: float | None = knob(None, symbol="top_p", label="top_p", uses=("always",), lo=1e-6, hi=1.0, step=0.01,
                               optional=True, help="nucleus sampling (1 = off)")
    temperature: float | None = knob(None, symbol="T", label="temperature", uses=("always",), lo=0.0, hi=100.0,
                                     step=0.01, optional=True, help="0 = greedy")

    # -- resolution ---------------------------------------------------------
    @property
    def rule(self) -> str:
        return self.acceptance or MODES.get(self.mode, ("exact", "every"))[0]

    @property
    def verify_schedule(self) -> str:
        return self.schedule or MODES.get(self.mode, ("exact", "every"))[1]

    @property
    def drafting(self) -> tuple[int, str]:
        """(window, init), auto ones filled in for the draft coupling."""
        window, init = DRAFTING_PRESETS["independent" if self.draft_coupling == "none" else "coupled"]
        return (window if self.window is None else self.window, init if self.init is None else self.init)

    @property
    def drafts(self) -> int:
        """Draft tokens per window (0 in ``ar`` mode): the draft model's depth, or the
        Jacobi window."""
        if self.mode == "ar":
            return 0
        return self.depth if self.drafter else self.drafting[0]

    def with_defaults(self, defaults: dict | None) -> "DecodeConfig":
        """Fill unset sampling settings from a family's defaults, then globally, and the
        drafting's auto window and init."""
        base = dict(SAMPLING_FALLBACK)
        base.update({k: v for k, v in (defaults or {}).items() if k in base})
        window, init = self.drafting
        return replace(self, window=window, init=init,
                       **{k: base[k] for k in SAMPLING_FIELDS if getattr(self, k) is None})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "DecodeConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"unknown decoding setting(s) {unknown}; known: {sorted(names)}")
        return cls(**values)

    def label(self) -> str:
        """``"gsd G=10 delta=0.15"``: the mode and, by their symbols, the knobs it uses
        that differ from the defaults or define the mode's method (report rows, charts)."""
        base = DecodeConfig()
        parts = [self.mode]
        for k in KNOBS.values():
            if k.name in SAMPLING_FIELDS or not k.used_by(self):
                continue
            value = getattr(self, k.name)
            defining = k.uses[0] in ("grouped", "latent", "uniform", "similarity", "drafter") and k.widget is not None
            if value != getattr(base, k.name) or defining:
                parts.append(f"{k.symbol}={value:g}" if isinstance(value, float) else f"{k.symbol}={value}")
        return " ".join(parts)

    # -- validation ---------------------------------------------------------
    def validate(self, codebook_size: int | None = None, surface: str = "api") -> "DecodeConfig":
        """Raise :class:`ConfigError` for the first setting out of range, named as
        ``surface`` shows it (:data:`SURFACES`); LANTERN's neighbourhood is checked
        against the codebook once ``codebook_size`` is known."""
        if self.mode not in MODES:
            raise ConfigError(f"{'--mode' if surface == 'cli' else 'mode'} must be one of "
                              f"{', '.join(map(repr, MODES))} (got {shorten(self.mode)})")
        for k in KNOBS.values():
            check(k, getattr(self, k.name), surface)
        if codebook_size is not None and self.rule == "latent" and self.lantern_k > codebook_size - 1:
            raise ConfigError(f"{KNOBS['lantern_k'].shown_as(surface)} must be an integer in [1, {codebook_size - 1}] "
                              f"for this model's codebook of {codebook_size} codes (got {self.lantern_k})")
        if self.drafts and not self.drafter and self.proactive > 1 and proactive_nodes(self) > MAX_PROACTIVE_NODES:
            raise ConfigError(f"{KNOBS['proactive'].shown_as(surface)} {self.proactive} with "
                              f"{KNOBS['proactive_depth'].shown_as(surface)} {self.proactive_depth} makes a tree of "
                              f"{proactive_nodes(self)} extra tokens per forward; at most {MAX_PROACTIVE_NODES}")
        if self.drafts and not self.drafter and self.proactive > 1 and self.rows > 1:
            raise ConfigError(f"{KNOBS['proactive'].shown_as(surface)} and {KNOBS['rows'].shown_as(surface)} "
                              f"both add tokens to the window's forward; use one of them (set the other to 1)")
        if self.mode == "ar" and (self.acceptance or self.schedule not in (None, "every")):
            raise ConfigError("mode 'ar' has no drafts: leave acceptance and schedule unset")
        return self


#: proactive drafting: extra tree tokens scored per forward, at most
MAX_PROACTIVE_NODES = 256


def proactive_nodes(config: DecodeConfig) -> int:
    """Tokens proactive drafting adds to a forward: the full K-ary tree of D - 1 levels
    below the root, less the window's own drafts (its first child at every level)."""
    K, D = config.proactive, config.proactive_depth
    return 0 if K <= 1 else sum(K ** d for d in range(1, D)) - (D - 1)


def _knobs() -> dict[str, Knob]:
    out = {}
    for f in fields(DecodeConfig):
        if "knob" in f.metadata:
            out[f.name] = replace(f.metadata["knob"], name=f.name, kind=str(f.type).split(" |")[0])
    return out


#: field name -> its knob, in field order (the order surfaces show them)
KNOBS: dict[str, Knob] = _knobs()


def check(k: Knob, value, surface: str = "api") -> None:
    """Raise :class:`ConfigError` unless ``value`` is allowed for knob ``k``."""
    name = k.shown_as(surface)
    if value is None and k.optional:
        return
    if k.choices is not None:
        if value not in k.choices:
            shown = [c for c in k.choices if c is not None]
            raise ConfigError(f"{name} must be one of {', '.join(map(repr, shown))} (got {shorten(value)})")
        return
    if k.kind == "str":  # a path: read (and checked) where it is used
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{name} must be {k.range_text()} (got {shorten(value)})")
        return
    integer = k.kind == "int"
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    if not ok or (isinstance(value, float) and math.isnan(value)) or not k.lo <= value <= k.hi:
        kind = "an integer" if integer else "a number"
        extra = ("" if not k.optional or k.name in SAMPLING_FIELDS else
                 f"; none is {k.unset.split(':')[0]}" if k.unset else "; none disables it")
        raise ConfigError(f"{name} must be {kind} {k.range_text()}{extra} (got {shorten(value)})")


def parse(k: Knob, text: str, surface: str = "api"):
    """A knob's value from text (command line, bench sweeps): ``none`` for an
    optional knob, else its type; checked against its range."""
    if k.optional and text.strip().lower() in ("none", "off", "auto"):
        return None
    if k.kind in ("int", "float"):
        try:
            value = int(text) if k.kind == "int" else float(text)
        except ValueError:
            kind = "an integer" if k.kind == "int" else "a number"
            raise ConfigError(f"{k.shown_as(surface)} must be {kind} {k.range_text()} (got {shorten(text)})") from None
    else:
        value = text
    check(k, value, surface)
    return value


def shorten(value, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error must not echo a 10 000-character prompt."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
