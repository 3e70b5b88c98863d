"""Small charts drawn with Pillow (no plotting library needed inside ComfyUI).

    chart([Series("gsd", nfe, adherence, labels=["G=1", "G=3"])], title=..., xlabel=..., ylabel=...)
    bars({"ar": 256, "sjd": 120}, title="forward passes")
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from PIL import Image, ImageDraw, ImageFont

PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]


@dataclass
class Series:
    label: str
    xs: list[float]
    ys: list[float]
    labels: list[str] = field(default_factory=list)  # one per point, drawn beside it
    line: bool = True


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 or v == int(v) else f"{v:.3g}"


def chart(series: list[Series], title: str = "", xlabel: str = "", ylabel: str = "",
          size: tuple[int, int] = (720, 460), log_x: bool = False) -> Image.Image:
    """A line/scatter chart of ``series``."""
    w, h = size
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    f, small = _font(15), _font(12)
    legend = max((d.textlength(s.label, font=small) for s in series), default=0.0)
    left, right, top, bottom = 70, int(20 + 40 + legend), 40, 55
    fx = (lambda v: math.log10(max(v, 1e-12))) if log_x else (lambda v: v)
    xs = [fx(x) for s in series for x in s.xs] or [0.0, 1.0]
    ys = [y for s in series for y in s.ys] or [0.0, 1.0]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    pad_x, pad_y = (x1 - x0) * 0.06 or 0.5, (y1 - y0) * 0.08 or 0.5
    x0, x1, y0, y1 = x0 - pad_x, x1 + pad_x, y0 - pad_y, y1 + pad_y

    def px(x, y):
        return (left + (fx(x) - x0) / (x1 - x0) * (w - left - right),
                h - bottom - (y - y0) / (y1 - y0) * (h - top - bottom))

    d.rectangle([left, top, w - right, h - bottom], outline=(60, 60, 60))
    for t in _ticks(y0, y1):
        _, y = px(10 ** x0 if log_x else x0, t)
        d.line([left, y, w - right, y], fill=(230, 230, 230))
        d.text((left - 6, y), _fmt(t), fill="black", font=small, anchor="rm")
    for t in _ticks(x0, x1):
        x, _ = px(10 ** t if log_x else t, y0)
        d.line([x, top, x, h - bottom], fill=(230, 230, 230))
        d.text((x, h - bottom + 6), _fmt(10 ** t if log_x else t), fill="black", font=small, anchor="mt")
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        pts = [px(x, y) for x, y in zip(s.xs, s.ys)]
        if s.line and len(pts) > 1:
            d.line(pts, fill=colour, width=2)
        for j, (x, y) in enumerate(pts):
            d.ellipse([x - 4, y - 4, x + 4, y + 4], fill=colour)
            if j < len(s.labels):
                d.text((x + 6, y - 6), s.labels[j], fill=colour, font=small, anchor="ls")
        ly = top + 8 + i * 20
        d.rectangle([w - right + 12, ly - 5, w - right + 24, ly + 5], fill=colour)
        d.text((w - right + 30, ly), s.label, fill="black", font=small, anchor="lm")
    d.text((left + (w - left - right) / 2, 12), title, fill="black", font=f, anchor="mt")
    d.text((left + (w - left - right) / 2, h - 18), xlabel, fill="black", font=small, anchor="mm")
    d.text((10, top - 22), ylabel, fill="black", font=small, anchor="la")
    return img


#: the x labels of :func:`bars`: the largest font size at which every label fits its bar's slot
#: in at most ``LABEL_LINES`` lines (16 px: still about 9 px when the Report Plot node shows its
#: 900 px picture in a 520 px node), down to ``LABEL_MIN`` px, below which the lines are shortened
LABEL_SIZE, LABEL_MIN, LABEL_LINES, LABEL_GAP = 16, 10, 6, 8


def _wrap(d: ImageDraw.ImageDraw, text: str, font, width: float) -> list[str]:
    """``text`` in lines no wider than ``width`` where its spaces allow, a word too wide
    for a line split after its ``=`` (a knob's ``delta=0.15``: name and value)."""
    pieces = []  # (piece, joined to the previous one by a space)
    for word in text.split() or [""]:
        head, eq, tail = word.partition("=")
        if eq and tail and d.textlength(word, font=font) > width:
            pieces += [(head + eq, True), (tail, False)]
        else:
            pieces.append((word, True))
    lines: list[str] = []
    for piece, spaced in pieces:
        joined = lines[-1] + (" " if spaced else "") + piece if lines else piece
        if lines and d.textlength(joined, font=font) <= width:
            lines[-1] = joined
        else:
            lines.append(piece)
    return lines


def _shorten(d: ImageDraw.ImageDraw, line: str, font, width: float) -> str:
    while line and d.textlength(line + "...", font=font) > width:
        line = line[:-1]
    return line + "..."


def x_labels(d: ImageDraw.ImageDraw, names: list[str], width: float) -> tuple[int, list[list[str]]]:
    """One font size for all of ``names`` and each name's lines, every line at most
    ``width`` wide (a bar's slot less a gap, so that no two labels touch)."""
    for size in range(LABEL_SIZE, LABEL_MIN - 1, -1):
        font = _font(size)
        wrapped = [_wrap(d, name, font, width) for name in names]
        if all(len(lines) <= LABEL_LINES and all(d.textlength(t, font=font) <= width for t in lines)
               for lines in wrapped):
            return size, wrapped
    cut = []
    for lines in wrapped:
        lines = [t if d.textlength(t, font=font) <= width else _shorten(d, t, font, width) for t in lines]
        if len(lines) > LABEL_LINES:
            lines = lines[:LABEL_LINES - 1] + [_shorten(d, lines[LABEL_LINES - 1], font, width)]
        cut.append(lines)
    return LABEL_MIN, cut


def bars(values: dict[str, float], title: str = "", ylabel: str = "", size: tuple[int, int] = (720, 420),
         fmt: str = "{:.3g}") -> Image.Image:
    """A bar per key, value printed on top, the key below it (wrapped to its bar's width:
    long labels such as ``"lantern k=300 delta=0.1"`` never run into their neighbours).
    The picture's ``info["x_labels"]`` lists each label's lines as drawn:
    ``(key, [(line, (x, y)), ...], font size)``, each line anchored at its middle top."""
    w, h = size
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    f, small = _font(18), _font(LABEL_SIZE)
    hi = max([v for v in values.values()] + [1e-9]) * 1.15
    ticks = _ticks(0, hi)
    left = int(max(d.textlength(_fmt(t), font=small) for t in ticks)) + 16
    right, top = 12, 44
    slot = (w - left - right) / max(1, len(values))
    label_size, lines = x_labels(d, list(values), slot - LABEL_GAP)
    label_font, step = _font(label_size), label_size + 3
    bottom = 10 + step * max((len(t) for t in lines), default=1) + 6
    for t in ticks:
        y = h - bottom - t / hi * (h - top - bottom)
        d.line([left, y, w - right, y], fill=(230, 230, 230))
        d.text((left - 6, y), _fmt(t), fill="black", font=small, anchor="rm")
    value_size, _ = x_labels(d, [fmt.format(v) for v in values.values()], slot - LABEL_GAP)
    drawn = []
    for i, ((name, v), name_lines) in enumerate(zip(values.items(), lines)):
        x = left + i * slot + slot * 0.15
        y = h - bottom - v / hi * (h - top - bottom)
        d.rectangle([x, y, x + slot * 0.7, h - bottom], fill=PALETTE[i % len(PALETTE)])
        d.text((x + slot * 0.35, y - 4), fmt.format(v), fill="black", font=_font(value_size), anchor="mb")
        placed = [(line, (x + slot * 0.35, h - bottom + 10 + j * step)) for j, line in enumerate(name_lines)]
        for line, at in placed:
            d.text(at, line, fill="black", font=label_font, anchor="mt")
        drawn.append((name, placed, label_size))
    d.rectangle([left, top, w - right, h - bottom], outline=(60, 60, 60))
    d.text((w / 2, 12), title, fill="black", font=f, anchor="mt")
    d.text((10, top - 24), ylabel, fill="black", font=small, anchor="la")
    img.info["x_labels"] = drawn
    return img
