"""The procedural world of the embedded text-to-image model: scenes, their prompts, their images.

A scene is one coloured shape at one of nine places on a patterned, coloured
background.  Everything here is deterministic given a seed so that datasets are
reproducible, yet each image carries plenty of nuisance randomness (pattern
frequency and phase, colour jitter, object size, jitter and rotation, pixel
noise): an autoregressive model trained on these images must face genuinely
uncertain next tokens, as it would on natural images, or speculative decoding
would have nothing to speculate about.

The tuple orders of :data:`COLOURS`, :data:`SHAPES`, :data:`POSITIONS` and
:data:`PATTERNS` are the class indices of the judge (``judge.py``); do not
reorder them.
"""
from __future__ import annotations

import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

COLOURS: tuple[str, ...] = ("red", "green", "blue", "yellow", "purple", "orange", "white", "black")
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross", "ring")
POSITIONS: tuple[str, ...] = ("top left", "top", "top right", "left", "center", "right",
                              "bottom left", "bottom", "bottom right")
PATTERNS: tuple[str, ...] = ("plain", "striped", "dotted", "checkered", "grainy", "gradient")

# Scene field -> the values it can take (its class list for the judge).
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "colour": COLOURS, "shape": SHAPES, "position": POSITIONS, "pattern": PATTERNS, "background": COLOURS,
}

# Nominal sRGB colours in [0, 1]; each image jitters them slightly.
RGB: dict[str, tuple[float, float, float]] = {
    "red": (0.86, 0.12, 0.12),
    "green": (0.13, 0.66, 0.20),
    "blue": (0.14, 0.30, 0.90),
    "yellow": (0.96, 0.88, 0.12),
    "purple": (0.56, 0.18, 0.74),
    "orange": (0.98, 0.52, 0.08),
    "white": (0.92, 0.92, 0.92),
    "black": (0.08, 0.08, 0.08),
}

# Object/background pairs closer than this (RGB distance) would be hard to tell apart:
# it rules out yellow/orange, red/orange and blue/purple, in either role.
MIN_CONTRAST = 0.55
CONTRASTING_PAIRS: tuple[tuple[str, str], ...] = tuple(
    (obj, bg) for obj in COLOURS for bg in COLOURS
    if math.dist(RGB[obj], RGB[bg]) >= MIN_CONTRAST
)

POSITION_PHRASES: dict[str, str] = {
    "top left": "in the top left", "top": "at the top", "top right": "in the top right",
    "left": "on the left", "center": "in the center", "right": "on the right",
    "bottom left": "in the bottom left", "bottom": "at the bottom", "bottom right": "in the bottom right",
}
FUNCTION_WORDS: tuple[str, ...] = ("a", "an", "the", "in", "on", "at", "of", "background")
VOCABULARY: tuple[str, ...] = tuple(sorted(
    set(FUNCTION_WORDS) | set(COLOURS) | set(SHAPES) | set(PATTERNS) | {w for p in POSITIONS for w in p.split()}
))


@dataclass(frozen=True)
class Scene:
    """What an image shows; every field is one of the names in :data:`ATTRIBUTES`."""

    colour: str
    shape: str
    position: str
    pattern: str
    background: str

    def __post_init__(self) -> None:
        for name, value in self.attributes().items():
            if value not in ATTRIBUTES[name]:
                raise ValueError(f"unknown {name} {value!r}; expected one of {ATTRIBUTES[name]}")
        if (self.colour, self.background) not in CONTRASTING_PAIRS:
            raise ValueError(f"a {self.colour} object on a {self.background} background has too little contrast")

    def attributes(self) -> dict[str, str]:
        """Field name -> value, the same keys :func:`parse` uses."""
        return asdict(self)

    def labels(self) -> dict[str, int]:
        """Field name -> class index (the judge's targets)."""
        return {name: ATTRIBUTES[name].index(value) for name, value in self.attributes().items()}

    @property
    def cell(self) -> tuple[int, int]:
        """(row, column) of the object's cell in the 3x3 grid."""
        return divmod(POSITIONS.index(self.position), 3)


def sample_scene(rng: np.random.Generator) -> Scene:
    """A scene drawn uniformly over all valid combinations."""
    colour, background = CONTRASTING_PAIRS[rng.integers(len(CONTRASTING_PAIRS))]
    return Scene(colour=colour, shape=SHAPES[rng.integers(len(SHAPES))],
                 position=POSITIONS[rng.integers(len(POSITIONS))],
                 pattern=PATTERNS[rng.integers(len(PATTERNS))], background=background)


def caption(scene: Scene, rng: np.random.Generator | None = None, drop: float = 0.0) -> str:
    """The prompt for ``scene``, e.g. "a red circle in the top left on a striped blue background".

    With ``drop > 0`` the position phrase and the background phrase are each
    left out with probability ``drop``, so that a model trained on the captions
    also learns what partial prompts mean.
    """
    if drop > 0 and rng is None:
        raise ValueError("caption(drop > 0) needs an rng")
    keep_position, keep_background = (True, True) if drop <= 0 else tuple(rng.random(2) >= drop)
    article = "an" if scene.colour[0] in "aeiou" else "a"
    parts = [f"{article} {scene.colour} {scene.shape}"]
    if keep_position:
        parts.append(POSITION_PHRASES[scene.position])
    if keep_background:
        parts.append(f"on a {scene.pattern} {scene.background} background")
    return " ".join(parts)


def words(prompt: str) -> list[str]:
    """Lower-case words of a prompt; spaces and sentence punctuation separate them."""
    return re.findall(r"[^\s,.;:!?]+", prompt.lower())


def parse(prompt: str) -> tuple[dict[str, str], list[str]]:
    """The attributes a prompt names and the words it uses outside :data:`VOCABULARY`.

    A colour/pattern run right before "background" describes the background;
    of the other colour words the first is the object's and a second one, if
    any, the background's.  Attributes the prompt does not name are absent.
    """
    tokens = words(prompt)
    unknown = [w for w in tokens if w not in VOCABULARY]
    named: dict[str, str] = {}
    in_background = [False] * len(tokens)
    for i, word in enumerate(tokens):
        if word != "background":
            continue
        j = i - 1
        while j >= 0 and (tokens[j] in COLOURS or tokens[j] in PATTERNS):
            in_background[j] = True
            j -= 1
    loose_colours = []
    for i, word in enumerate(tokens):
        if word in COLOURS:
            if in_background[i]:
                named.setdefault("background", word)
            else:
                loose_colours.append(word)
        elif word in PATTERNS:
            named.setdefault("pattern", word)
        elif word in SHAPES:
            named.setdefault("shape", word)
    if loose_colours:
        named["colour"] = loose_colours[0]
    if len(loose_colours) > 1:
        named.setdefault("background", loose_colours[1])
    position = _find_position(tokens)
    if position is not None:
        named["position"] = position
    return named, unknown


def _find_position(tokens: list[str]) -> str | None:
    """The first position named: "top"/"bottom" may be followed by "left"/"right"."""
    for i, word in enumerate(tokens):
        if word in ("top", "bottom"):
            follower = tokens[i + 1] if i + 1 < len(tokens) else ""
            return f"{word} {follower}" if follower in ("left", "right") else word
        if word in ("left", "right", "center"):
            return word
    return None


# ---------------------------------------------------------------------------
# Rendering.  Lengths are in pixels of a 64-pixel image and scale with `size`.

SUPERSAMPLE = 4           # object edges are computed on a 4x finer grid, then averaged down
OBJECT_RADIUS = (9.0, 14.0)  # half the object's extent: 18-28 px across (4.5-7 tokens), so shapes survive 4x4-px tokens
POSITION_JITTER = 4.0
COLOUR_JITTER = 0.06
TONE = (0.25, 0.4)        # how far the pattern's second tone moves from the background colour
PIXEL_NOISE = (0.03, 0.06)
GRAIN = (0.12, 0.16)      # std of the "grainy" pattern's per-pixel luminance noise
_CHUNK = 256              # images rendered at once (bounds memory)
_THREADS = min(os.cpu_count() or 1, 8)


def _draw(seed: int, grainy: bool, size: int) -> dict[str, np.ndarray | float]:
    """Every random choice of one image, from its own generator so batches equal single renders."""
    rng = np.random.default_rng(seed)
    draws: dict[str, np.ndarray | float] = {
        "radius": rng.uniform(*OBJECT_RADIUS),
        "jitter": rng.uniform(-POSITION_JITTER, POSITION_JITTER, 2),
        "angle": rng.uniform(0, 2 * math.pi),
        "object_shift": rng.uniform(-COLOUR_JITTER, COLOUR_JITTER, 3),
        "background_shift": rng.uniform(-COLOUR_JITTER, COLOUR_JITTER, 3),
        "tone": rng.uniform(*TONE),
        "stripe_direction": rng.integers(4) * math.pi / 4,
        "stripe_period": rng.uniform(6, 14),
        "dot_spacing": rng.uniform(7, 13),
        "dot_fraction": rng.uniform(0.18, 0.32),
        "checker_cell": rng.uniform(5, 12),
        "phase": rng.uniform(0, 1, 2),
        "gradient_angle": rng.uniform(0, 2 * math.pi),
        "noise_std": rng.uniform(*PIXEL_NOISE),
        "noise": rng.standard_normal((size, size, 3), dtype=np.float32),
    }
    if grainy:
        draws["grain"] = rng.uniform(*GRAIN) * rng.standard_normal((size, size), dtype=np.float32)
    return draws


_PATTERN_KEYS = ("stripe_direction", "stripe_period", "dot_spacing", "dot_fraction", "checker_cell", "phase",
                 "gradient_angle")


def _band(coordinate: np.ndarray, period: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """Anti-aliased coverage of stripes half a period wide along ``coordinate`` (pixels)."""
    distance = np.abs(np.mod(coordinate / period + phase, 1.0) - 0.5) * period
    return np.clip(period / 4 - distance + 0.5, 0, 1)


def _pattern_mix(pattern: str, d: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, size: int) -> np.ndarray:
    """Per-pixel weight [n, size, size] of the second tone, for images that share one pattern.

    ``d`` holds each image's pattern draws as [n, 1, 1] arrays (phase: [n, 1, 1, 2]).
    """
    k = size / 64
    if pattern == "striped":
        along = x * np.cos(d["stripe_direction"]) + y * np.sin(d["stripe_direction"])
        return _band(along, d["stripe_period"] * k, d["phase"][..., 0])
    if pattern == "dotted":
        spacing = d["dot_spacing"] * k
        dx = (np.mod(x / spacing + d["phase"][..., 0], 1.0) - 0.5) * spacing
        dy = (np.mod(y / spacing + d["phase"][..., 1], 1.0) - 0.5) * spacing
        return np.clip(d["dot_fraction"] * spacing - np.hypot(dx, dy) + 0.5, 0, 1)
    if pattern == "checkered":
        period = 2 * d["checker_cell"] * k
        across, down = _band(x, period, d["phase"][..., 0]), _band(y, period, d["phase"][..., 1])
        return across + down - 2 * across * down
    if pattern == "gradient":
        half = size / 2
        along = (x - half) * np.cos(d["gradient_angle"]) + (y - half) * np.sin(d["gradient_angle"])
        return np.clip(0.5 + along / (2 * half), 0, 1)
    return np.zeros(np.broadcast_shapes(x.shape, y.shape, d["phase"].shape[:-1]), np.float32)  # plain, grainy


def _shape_distance(shape: str, u: np.ndarray, v: np.ndarray, radius: np.ndarray) -> np.ndarray:
    """Signed distance (pixels, negative inside) to a shape of outer radius ``radius`` centred at 0.

    ``u`` points right and ``v`` down in the shape's own (rotated) frame.  Exact
    near the edges, which is all anti-aliasing needs.
    """
    if shape == "circle":
        return np.hypot(u, v) - 0.9 * radius
    if shape == "ring":
        return np.abs(np.hypot(u, v) - 0.725 * radius) - 0.225 * radius
    if shape == "square":
        return np.maximum(np.abs(u), np.abs(v)) - 0.7 * radius
    if shape == "triangle":  # apex up, centroid at 0, circumradius `radius`
        s = math.sqrt(3) / 2
        return np.maximum(v, np.maximum(-s * u - 0.5 * v, s * u - 0.5 * v)) - 0.5 * radius
    if shape == "star":  # five points, inner radius 0.42 of the outer one
        sector = 2 * math.pi / 5
        angle = np.abs(np.mod(np.arctan2(u, -v) + sector / 2, sector) - sector / 2)
        rho = np.hypot(u, v)
        px, py = rho * np.cos(angle), rho * np.sin(angle)
        tip_x, inner = radius, 0.42 * radius
        ex, ey = inner * math.cos(sector / 2) - tip_x, inner * math.sin(sector / 2)
        length = np.hypot(ex, ey)
        return (ey * (px - tip_x) - ex * py) / length
    if shape == "cross":
        arm, half_width = 0.95 * radius, 0.3 * radius
        horizontal = np.maximum(np.abs(u) - arm, np.abs(v) - half_width)
        vertical = np.maximum(np.abs(u) - half_width, np.abs(v) - arm)
        return np.minimum(horizontal, vertical)
    raise ValueError(f"unknown shape {shape!r}")


def _object_coverage(scenes: Sequence[Scene], d: dict[str, np.ndarray], size: int) -> np.ndarray:
    """Anti-aliased object coverage [n, size, size] in [0, 1].

    Only a window around each object is supersampled (the rest is background),
    then pasted into a padded canvas at the object's integer offset.
    """
    n, k, ss = len(scenes), size / 64, SUPERSAMPLE
    radius = d["radius"] * k
    row_col = np.array([s.cell for s in scenes], np.float32).reshape(n, 2)
    cell = size / 3
    cx = (row_col[:, 1] + 0.5) * cell + d["jitter"][:, 0] * k
    cy = (row_col[:, 0] + 0.5) * cell + d["jitter"][:, 1] * k
    cx, cy = (np.clip(c, radius + 1, size - 1 - radius) for c in (cx, cy))  # keep the whole object visible
    half = math.ceil(OBJECT_RADIUS[1] * k) + 2
    window = 2 * half
    ox, oy = np.floor(cx).astype(np.int64) - half, np.floor(cy).astype(np.int64) - half
    fine = (np.arange(window * ss, dtype=np.float32) + 0.5) / ss
    dx = (ox - cx)[:, None, None] + fine[None, None, :]
    dy = (oy - cy)[:, None, None] + fine[None, :, None]
    distance = np.empty((n, window * ss, window * ss), np.float32)
    shape_index = np.array([SHAPES.index(s.shape) for s in scenes])
    for index, shape in enumerate(SHAPES):
        members = np.flatnonzero(shape_index == index)
        if members.size == 0:
            continue
        ux, uy = dx[members], dy[members]
        if shape not in ("circle", "ring"):
            cos, sin = np.cos(d["angle"][members])[:, None, None], np.sin(d["angle"][members])[:, None, None]
            ux, uy = cos * ux + sin * uy, cos * uy - sin * ux
        distance[members] = _shape_distance(shape, ux, uy, radius[members][:, None, None])
    fine_coverage = np.clip(0.5 - distance * ss, 0, 1)
    coverage = fine_coverage.reshape(n, window, ss, window, ss).mean(axis=(2, 4))
    canvas = np.zeros((n, size + 2 * window, size + 2 * window), np.float32)
    steps = np.arange(window)
    rows = (oy + window)[:, None, None] + steps[None, :, None]
    cols = (ox + window)[:, None, None] + steps[None, None, :]
    canvas[np.arange(n)[:, None, None], rows, cols] = coverage
    return canvas[:, window:window + size, window:window + size]


def _render_layers(scenes: Sequence[Scene], seeds: Sequence[int], size: int,
                   noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Float image [n, size, size, 3] in [0, 1] and object coverage [n, size, size], for one chunk.

    ``noise=False`` leaves out the global pixel noise (tests check colours with it).
    """
    n = len(scenes)
    draws = [_draw(int(seed), s.pattern == "grainy", size) for s, seed in zip(scenes, seeds)]
    d = {key: np.asarray([draw[key] for draw in draws], np.float32) for key in draws[0] if key != "grain"}
    background = np.clip(np.array([RGB[s.background] for s in scenes], np.float32) + d["background_shift"], 0, 1)
    luminance = background @ np.array([0.299, 0.587, 0.114], np.float32)
    towards = np.where(luminance[:, None] < 0.5, 1.0, 0.0).astype(np.float32)  # lighter on dark, darker on light
    second = background + d["tone"][:, None] * (towards - background)
    mix = np.empty((n, size, size), np.float32)
    coords = np.arange(size, dtype=np.float32) + 0.5
    x, y = coords[None, None, :], coords[None, :, None]
    pattern_index = np.array([PATTERNS.index(s.pattern) for s in scenes])
    for index, pattern in enumerate(PATTERNS):
        members = np.flatnonzero(pattern_index == index)
        if members.size:
            per_image = {key: d[key][members].reshape(members.size, 1, 1, *d[key].shape[1:]) for key in _PATTERN_KEYS}
            mix[members] = _pattern_mix(pattern, per_image, x, y, size)
    image = background[:, None, None, :] + mix[..., None] * (second - background)[:, None, None, :]
    for i, draw in enumerate(draws):
        if "grain" in draw:
            image[i] += draw["grain"][..., None]
    coverage = _object_coverage(scenes, d, size)
    colour = np.clip(np.array([RGB[s.colour] for s in scenes], np.float32) + d["object_shift"], 0, 1)
    image += coverage[..., None] * (colour[:, None, None, :] - image)
    if noise:
        image += d["noise_std"][:, None, None, None] * d["noise"]
    return np.clip(image, 0, 1), coverage


def _to_uint8(image: np.ndarray) -> np.ndarray:
    return (image * 255 + 0.5).astype(np.uint8)


def render_batch(scenes: Sequence[Scene], seeds: Sequence[int], size: int = 64, coverage: bool = False):
    """Images [n, size, size, 3] uint8; image i equals ``render(scenes[i], seeds[i], size)``.
    With ``coverage=True`` also the object's anti-aliased coverage [n, size, size]
    in [0, 1] (training weighs the object's pixels with it).

    Chunks are rendered on a few threads: numpy releases the GIL in its array
    loops, so this nearly halves the time on two cores.
    """
    if len(scenes) != len(seeds):
        raise ValueError(f"{len(scenes)} scenes but {len(seeds)} seeds")
    out = np.empty((len(scenes), size, size, 3), np.uint8)
    cover = np.empty((len(scenes), size, size), np.float32)

    def fill(start: int) -> None:
        stop = start + _CHUNK
        image, cover[start:stop] = _render_layers(scenes[start:stop], seeds[start:stop], size)
        out[start:stop] = _to_uint8(image)

    with ThreadPoolExecutor(max_workers=_THREADS) as pool:
        list(pool.map(fill, range(0, len(scenes), _CHUNK)))
    return (out, cover) if coverage else out


def render(scene: Scene, seed: int, size: int = 64) -> np.ndarray:
    """The image [size, size, 3] uint8 of ``scene``; the same (scene, seed) gives the same pixels."""
    return render_batch([scene], [seed], size)[0]


def make_dataset(n: int, seed: int, size: int = 64, drop: float = 0.0, coverage: bool = False):
    """``n`` random scenes with their images and captions, reproducible from
    ``seed``: ``(images, scenes, captions)``, plus the object coverage maps last
    when ``coverage=True``."""
    rng = np.random.default_rng(seed)
    scenes = [sample_scene(rng) for _ in range(n)]
    image_seeds = rng.integers(0, 2**63 - 1, size=n)
    captions = [caption(scene, rng, drop) for scene in scenes]
    if coverage:
        images, cover = render_batch(scenes, image_seeds, size, coverage=True)
        return images, scenes, captions, cover
    return render_batch(scenes, image_seeds, size), scenes, captions
