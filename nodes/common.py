"""What the nodes do, without ComfyUI: model listing, settings from widget values,
accept maps, report tables and plots, prompt lists, throttled previews.

Kept free of ComfyUI imports so it is tested directly; the node classes in this
folder only translate between these functions and ComfyUI's types.
"""
from __future__ import annotations

import os
import pathlib
import time
from dataclasses import dataclass
from typing import Callable

EMBEDDED = "embedded (ships with the pack)"
EMBEDDED_DRAFTER = "embedded drafter (ships with the pack)"
EMBEDDED_SIBLING = "embedded sibling (ships with the pack)"
BUILT_IN = "built-in (from the model)"
NO_FILE = "(none: use the text box)"
MODEL_SUFFIXES = (".pt", ".pth", ".safetensors", ".ckpt", ".bin")
#: a combo's entry for an optional knob left on auto (the schedule: the mode's; draft init: the coupling's)
AUTO = "auto"
#: the sampler's switch between the family's reference sampling settings and its own widgets
FAMILY_DEFAULTS = "family_defaults"
DRAFTER_INPUT = "drafter"  # the sampler's optional draft-model input
#: the mode input's option carrying :func:`knob_visibility` to the web page
KNOB_VISIBILITY = "spec_ar_knob_visibility"


#: the listing's bounds: a model folder is small and shallow; a huge or looping
#: tree (a symlink to a parent, a home folder) must not hang node registration
LIST_DEPTH = 4
LIST_ENTRIES = 20000


def list_models(folders: list[str], depth: int = LIST_DEPTH, entries: int = LIST_ENTRIES) -> list[str]:
    """Model files and model folders (holding a ``config.json``) under ``folders``,
    as paths relative to their folder, sorted; what the loader combos show.
    Symlinks are followed (models often live on another disk) but every real
    folder is visited once, at most ``depth`` levels down, and the walk stops
    after ``entries`` directory entries."""
    found, seen, budget = set(), set(), entries
    for base in folders:
        base = pathlib.Path(base)
        if not base.is_dir():
            continue
        for root, dirs, files in os.walk(base, followlinks=True):
            here = pathlib.Path(root)
            try:
                key = (here.stat().st_dev, here.stat().st_ino)
            except OSError:
                dirs[:] = []
                continue
            budget -= len(dirs) + len(files)
            rel = here.relative_to(base)
            if key in seen or budget < 0:  # a loop, or more than a model folder holds
                dirs[:] = []
                continue
            seen.add(key)
            if "config.json" in files and rel != pathlib.Path("."):
                found.add(rel.as_posix())
                dirs[:] = []  # a model folder's own files are not separate models
                continue
            # hidden folders, and downloads still under way (loaders/downloads.py), are no models
            dirs[:] = ([d for d in dirs if not d.startswith(".") and not d.endswith(".partial")]
                       if len(rel.parts) < depth else [])
            found.update((rel / f).as_posix() for f in files if f.lower().endswith(MODEL_SUFFIXES))
    return sorted(found)


def resolve_model(name: str, folders: list[str]) -> pathlib.Path:
    """The file or folder a combo entry names, inside one of ``folders``; a clear
    error if it is gone or if the name would leave the folders (``..``, an
    absolute path: values any client can post to ``/prompt``)."""
    rel = pathlib.PurePosixPath(str(name).replace("\\", "/"))
    if not str(name) or rel.is_absolute() or ".." in rel.parts or pathlib.PureWindowsPath(str(name)).drive:
        raise FileNotFoundError(f"model {_short(name)!r} is not a name from the spec_ar model folder(s): names are "
                                "paths inside the folder, without '..' or a leading '/'")
    for base in folders:
        path = pathlib.Path(base) / rel
        try:
            if path.exists():
                return path
        except OSError:  # a name the file system cannot hold (too long, ...)
            break
    raise FileNotFoundError(f"model {_short(name)!r} is not in the spec_ar model folder(s) {folders}; "
                            "put the file or folder there and refresh the page")


def _short(text, limit: int = 80) -> str:
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def check_choices(**given: tuple) -> bool | str:
    """``name=(value, allowed)`` pairs -> True, or the message for the first value
    not allowed (ComfyUI 0.3.x does not check V3 combo values itself).  Values
    arriving over a link are unknown at validation time (None) and pass."""
    for name, (value, allowed) in given.items():
        if value is not None and value not in allowed:
            return f"{name} must be one of {', '.join(map(repr, allowed))} (got {value!r})"
    return True


def sampler_widgets() -> list[dict]:
    """The sampler node's decoding widgets, read from the knob table in its order:
    ``label`` (the widget), ``field`` (the :class:`DecodeConfig` field), ``widget``
    (``slider``, ``number`` or ``combo``), ``default``, ``options`` or ``kind``/
    ``min``/``max``/``step``, ``tooltip`` and ``uses`` (which modes read it)."""
    from ..sampling.config import KNOBS, SAMPLING_FALLBACK, DecodeConfig

    defaults = DecodeConfig()
    out = []
    for k in KNOBS.values():
        if k.widget is None:
            continue
        default = SAMPLING_FALLBACK.get(k.name, getattr(defaults, k.name))
        tip = f"{k.help}. Symbol {k.symbol}; {k.range_text()}."
        if k.unset and k.widget == "combo":
            tip += f" {AUTO}: {k.unset.split(': ', 1)[1]}."
        if k.name in SAMPLING_FALLBACK:
            tip += f" Used when {FAMILY_DEFAULTS} is off."
        w = {"label": k.label, "field": k.name, "widget": k.widget, "uses": list(k.uses), "tooltip": tip,
             "appended": k.appended}
        if k.widget == "combo":
            w.update(options=[AUTO if c is None else c for c in k.choices],
                     default=AUTO if default is None else default)
        else:  # an optional integer (top-k) shows "off" as 0
            off = k.optional and k.kind == "int"
            w.update(kind=k.kind, min=0 if off else k.lo, max=k.hi, step=k.step or 1,
                     default=0 if default is None and off else default)
            if off:
                w.update(off=0, tooltip=w["tooltip"] + f" 0 = {k.unset or 'off'}.")
        out.append(w)
    return out


def knob_visibility() -> dict:
    """Which of the sampler's widgets each mode shows, for the web page (served with
    the node definition; ``web/sampler_knobs.js`` only looks it up).  Read from the
    knob table's ``uses`` through :meth:`Knob.used_by`, so the page and the engine
    agree on which knob a setting reads: ``visible[mode][schedule choice]`` lists the
    widgets shown with Jacobi drafting, ``drafted[tree][mode][schedule choice]`` those
    shown while the ``drafter`` input is linked, by the ``tree`` widget's value;
    ``switched`` ones show only while ``switch`` (family defaults) is off."""
    from ..sampling.config import KNOBS, MODES, SAMPLING_FALLBACK, DecodeConfig

    from ..sampling.config import DRAFT_TREES

    widgets = sampler_widgets()
    schedule = next(w for w in widgets if w["field"] == "schedule")
    tree = next(w for w in widgets if w["field"] == "tree")

    def shown(**kw):
        return {mode: {choice: [w["label"] for w in widgets
                                if KNOBS[w["field"]].used_by(DecodeConfig(
                                    mode=mode, schedule=None if choice == AUTO else choice, **kw))]
                       for choice in schedule["options"]}
                for mode in MODES}

    return {"knobs": [w["label"] for w in widgets], "schedule": schedule["label"], "visible": shown(),
            "drafted": {t: shown(drafter="drafter", tree=t) for t in DRAFT_TREES}, "tree": tree["label"],
            "drafter_input": DRAFTER_INPUT,
            "switch": FAMILY_DEFAULTS, "switched": [w["label"] for w in widgets if w["field"] in SAMPLING_FALLBACK]}


def decode_config(mode: str, family_defaults: bool = True, **widgets):
    """A validated :class:`DecodeConfig` from the sampler's widget values (by label);
    raises ``ConfigError`` naming the first bad one by its label."""
    from ..sampling import ConfigError, DecodeConfig
    from ..sampling.config import SAMPLING_FALLBACK

    by_label = {w["label"]: w for w in sampler_widgets()}
    unknown = sorted(set(widgets) - set(by_label))
    if unknown:
        raise ConfigError(f"unknown sampler input(s) {unknown}")
    settings = {}
    for label, value in widgets.items():
        w = by_label[label]
        if w["field"] in SAMPLING_FALLBACK and family_defaults:
            continue  # the family's reference value
        if value == AUTO or ("off" in w and value == w["off"]):
            value = None
        settings[w["field"]] = value
    return DecodeConfig(mode=mode, **settings).validate(surface="node")


def accept_map_images(reports, layout, scale: int = 8):
    """``[B, H, W, 3]`` float images in [0, 1]: how each token was obtained, in
    raster order (structural columns included)."""
    import numpy as np
    import torch

    from ..sampling.report import accept_map

    maps = [accept_map(r.origins, layout.row_stride, scale) for r in reports]
    return torch.from_numpy(np.stack(maps).astype(np.float32) / 255.0)


def report_row(report, label: str = "", prompt: str = "") -> dict:
    """One report as the flat record the report nodes tabulate and plot."""
    return {"label": label or report.mode, "prompt": prompt, "mode": report.mode, "seed": report.seed,
            "tokens": report.tokens, "nfe": report.nfe, "tokens_per_forward": report.tokens_per_forward,
            "mean_accepted_length": report.mean_accepted_length, "latency_s": report.latency_s,
            "batch_size": report.batch_size, "skipped": report.skipped_verifications}


#: the sampler's ui key: its reports in ``/history`` (outputs, under the node's id), for ``spec-ar queue``
REPORTS_UI = "spec_ar_reports"


def report_ui(reports) -> dict:
    """The sampler's ui data: every image's report as a plain dict, less the per-token
    origins (the accept map shows them).  ComfyUI concatenates the lists of a prompt
    list's runs and keeps them in ``/history``, so clients read data, not the report text."""
    return {REPORTS_UI: [{k: v for k, v in r.to_dict().items() if k != "origins"} for r in reports]}


def table(rows: list[dict]) -> str:
    """A markdown table of report rows (one per image), with the speed-up against
    the mean ``ar`` latency when an ``ar`` row is present."""
    if not rows:
        return "(no reports)"
    ar = [r["latency_s"] for r in rows if r["mode"] == "ar"]
    base = sum(ar) / len(ar) if ar else None
    head = "| run | prompt | mode | seed | NFE | tokens/forward | MAL | latency s | speed-up vs ar |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        speed = f"{base / r['latency_s']:.2f}x" if base and r["latency_s"] > 0 else "-"
        prompt = (r["prompt"][:40] + "...") if len(r["prompt"]) > 43 else r["prompt"]
        lines.append(f"| {r['label']} | {prompt.replace('|', '/')} | {r['mode']} | {r['seed']} | {r['nfe']} | "
                     f"{r['tokens_per_forward']:.2f} | {r['mean_accepted_length']:.2f} | {r['latency_s']:.2f} | "
                     f"{speed} |")
    return "\n".join(lines)


def plot(rows: list[dict], size=(900, 420)):
    """NFE and latency per run, side by side: a PIL image."""
    from PIL import Image

    from ..charts import bars

    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["label"], []).append(r)
    nfe = {k: sum(r["nfe"] for r in v) / len(v) for k, v in groups.items()}
    lat = {k: sum(r["latency_s"] for r in v) / len(v) for k, v in groups.items()}
    half = (size[0] // 2, size[1])
    left = bars(nfe, title="forward passes (NFE) per image", ylabel="NFE", size=half, fmt="{:.0f}")
    right = bars(lat, title="latency per batch", ylabel="seconds", size=half, fmt="{:.2f}")
    out = Image.new("RGB", size, "white")
    out.paste(left, (0, 0))
    out.paste(right, (half[0], 0))
    return out


def prompt_list(text: str, file: str | None = None, folder: str | None = None) -> list[str]:
    """The Prompt List node: the text box, or the UTF-8 file ``file`` in ``folder``
    (ComfyUI's input folder) when one is chosen; errors name the input."""
    from ..prompt_files import prompt_lines, read_prompts

    if not file or file == NO_FILE:
        return prompt_lines(text, "prompts")
    if pathlib.PurePath(file).name != file:
        raise ValueError(f"file: {_short(file)!r} is not a file name in the input folder")
    return read_prompts(pathlib.Path(folder) / file, f"file {file!r}")


def shard(lines: list[str], index: int, count: int) -> list[str]:
    """Part ``index`` of ``count`` contiguous, near-equal parts of ``lines`` (in order), so that
    ``count`` machines (ComfyUI-Distributed's workers) render a prompt list together."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"shards must be an integer >= 1 (got {_short(count)!r})")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(f"shard must be an integer from 0 to shards - 1 = {count - 1} (got {_short(index)!r})")
    size, extra = divmod(len(lines), count)
    start = index * size + min(index, extra)
    return lines[start:start + size + (index < extra)]


@dataclass
class PreviewThrottle:
    """Allows a preview only when one more (at the average cost so far) keeps all
    previews under ``budget`` of the time since ``start``, at most every
    ``interval`` seconds.  The first waits ``first`` seconds: its cost is unknown
    until measured, and short renders need no preview.  So a render of ``t`` seconds
    sends at most ``1 + (t - first) / interval`` previews.  ``clock``: where the time
    comes from (tests pass their own)."""

    budget: float = 0.04
    interval: float = 0.5
    first: float = 2.0
    clock: Callable[[], float] = time.perf_counter
    start: float | None = None
    spent: float = 0.0
    count: int = 0
    last: float | None = None

    def __post_init__(self):
        if self.start is None:
            self.start = self.clock()

    def due(self) -> bool:
        now = self.clock()
        if self.last is None:
            return now - self.start >= self.first
        expected = self.spent / self.count
        return now - self.last >= self.interval and self.spent + expected <= self.budget * (now - self.start)

    def record(self, seconds: float) -> None:
        self.spent += seconds
        self.count += 1
        self.last = self.clock()


def image_preview(image):
    """A PIL picture of one ``[H, W, 3]`` image in [0, 1] (previews: finished or partial)."""
    import numpy as np
    from PIL import Image

    return Image.fromarray((image.float().clamp(0, 1).cpu().numpy() * 255).round().astype(np.uint8))


def partial_preview(decode, tokens, committed: int, layout):
    """A PIL preview of the first image: decoded tokens, rows not yet committed greyed."""
    pos = layout.image_positions().to(tokens.device)
    grid = tokens[:1, pos].view(1, *layout.grid)
    done = int((pos < committed).sum())
    img = decode(grid)[0].permute(1, 2, 0).float()
    rows, cols = layout.grid
    cell = img.shape[0] // rows
    full_rows, part = divmod(done, cols)
    img[(full_rows + (part > 0)) * cell:] = 0.5
    if part:
        img[full_rows * cell:(full_rows + 1) * cell, part * cell:] = 0.5
    return image_preview(img)
