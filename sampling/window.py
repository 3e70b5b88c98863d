"""The Jacobi window on auto: the width that commits the most tokens per second here.

A wider window commits more tokens per forward but costs more per forward; how
much more depends on the device, the batch and the model.  On a GPU a forward
reads the weights once whatever its width, so a window of 32 costs about what
one token does; on a CPU a batch of 8 is compute-bound and every draft row costs
its share.  So the decode finds out on its own steps (:class:`Trial`): it runs
the drafting's preset width and the narrow width :data:`NARROW` by turns, step
by step, :data:`TRIAL` forwards each, and times them (the engine's work
included; the median step, so a stall inflates one figure, not a width's; by
turns, so a busy stretch of the machine slows both widths alike).  A forward's
cost is close to a line in the rows it scores (:class:`CostLine`: flat where
the weights' reads dominate, steep where the arithmetic does), so the two give
every :data:`CANDIDATES` width's cost; where the line predicts another width
(or plain AR steps) fastest, that width runs :data:`TRIAL` forwards too, by
turns with the preset again.  The decode then keeps the fastest width it ran,
the preset unless another commits :data:`GAIN` times its tokens per second in
both halves of their steps taken apart, each weighed against the preset's steps
taken by turns with it (repeated agreement: one stretch of stalls cannot move
it).  An earlier trial ran each width's steps in one block, so a busy stretch
could cover the preset's block alone: at batch 1 with both cores busy for a
decode's first 0.25 s it kept 24 in 3 of 8 fresh trials, by turns 8 of 8
(``spec-ar bench auto-window --busy-start 0.25``, docs/benchmarks.md).

Tokens per forward at a width are modelled as ``1 + e * (L / L0) ** SHAPE``: the
tokens past the one every forward commits grow as a power of the width (Jacobi
drafts deep in a window have been refined by more passes, so they fare better
than one acceptance rate per draft would say).  ``SHAPE`` was measured on the
embedded model (batch 8, coupled drafts: 1.63, 1.97, 2.52, 3.41, 4.86 and 5.61
tokens per forward at widths 1, 2, 4, 8, 16 and 24, slope 0.62 on a log-log
plot); ``e`` comes from the tokens per forward measured at the preset width
(:data:`PRIOR`, by drafting).  The trial's own tokens per forward are reported but
not weighed: a window's first passes refine drafts that started from a guess
(the embedded model's first six forwards at window 24 commit 1.1 tokens each,
against 6.0 over an image), and one stretch of an image accepts more than another.
A batch steps until its slowest image is done (:func:`straggle`), which costs
most where forwards cost most: at batch 32 on the embedded model the slowest
image took 1.07x the mean image's forwards at window 1 and 1.45x at 24.

An earlier version measured the widths with forwards of their own before the
decode (a probe).  On a busy machine one such probe chose plain AR steps that ran
6x slower than window 24, and its forwards, made only to be timed, are paid in
every process (a decode on auto that kept 24 took 586 ms against 437 ms at 24 set
by hand, batch 1, two quiet cores: docs/benchmarks.md).  The
decode's own steps cost nothing extra where the preset is right but the narrow
width's shorter commits, and a width is kept only on what the decode saw.

The width kept is kept on the model for its batch size, so later decodes in a
session start at it and try nothing: the same settings and seed then give the
same image again.  The first decode at a batch size runs two or three widths (its
image is still exact in the lossless modes: each step is a valid speculative step
whatever its width; which steps run which width depends on forward counts only,
the width kept on the times); across machines or after a restart the choice is
made again, and a set window makes an image the same anywhere.  The report says
what each width cost, what the line predicted and what was kept.
"""
from __future__ import annotations

import time
from statistics import NormalDist, median
from typing import NamedTuple

#: draft widths considered (a window of L drafts scores L + 1 tokens per forward; 0: plain AR steps, where no
#: window pays, as on a device whose every row costs its full share)
CANDIDATES = (0, 1, 2, 4, 8, 16, 24, 32)
#: how the tokens past the first grow with the width (see the module docstring)
SHAPE = 0.62
#: tokens per forward at the preset width, by drafting: the embedded model's (docs/benchmarks.md; coupled
#: drafts at window 24: 6.07 at batch 1, 5.95 at batch 8; SJD's independent drafts at 16: 3.44); the decode's
#: own windows replace it
PRIOR = {"coupled": 6.0, "independent": 3.4}
#: the standard deviation of an image's forwards over a batch, as a share of the stream's tokens: the embedded
#: model's, 32 prompts and seeds, windows 1 to 32: 6.8-9.1 forwards for 256 tokens whatever the width
SPREAD = 0.031
#: forwards each width of a trial runs (the median of each half of them is that half's cost of a forward)
TRIAL = 6
#: the width tried beside the preset: far enough from it that the two give the cost line's slope
NARROW = 2
#: how much faster a width must be than the preset, in both halves of the trial, to replace it
GAIN = 1.05
#: why a skipping schedule (VVS) keeps the preset on auto: its skips commit the window's tail unverified, and a
#: narrow window's tail is drafted from the context its pass rejected (``spec-ar evaluate --modes ar vvs --images
#: 200`` at batch 50, where the CPU's choice had moved to window 2: FD to ar 185.6; windows set by hand: 2: 185.6,
#: 16: 59.6, 24: 52.3; noise floor 37.3)
SKIPS_KEEP_PRESET = ("window {preset} on auto: the preset, kept for a skipping schedule (its skips commit the "
                     "window's tail unverified, which a narrow window drafts from what its pass rejected: on the "
                     "embedded model FD to ar 185.6 at window 2 against 52.3 at 24, noise floor 37.3)")
#: why trees beside the window (proactive, row-parallel drafting) keep the preset: their sizes follow its width
TREES_KEEP_PRESET = ("window {preset} on auto: the preset, kept for the {what} beside the window (its size follows "
                     "the window's)")


def now() -> float:
    """The clock the trials read (tests put a device of their own behind it)."""
    return time.perf_counter()


class Choice(NamedTuple):
    width: int
    reason: str


class Acceptance(NamedTuple):
    """Tokens per forward observed at a width."""

    tokens_per_forward: float
    width: int

    def at(self, width: int) -> float:
        """Tokens per forward predicted at ``width`` (a window of ``width`` drafts commits at most
        ``width + 1``)."""
        extra = max(self.tokens_per_forward - 1.0, 0.0)
        return min(1.0 + extra * (width / self.width) ** SHAPE, width + 1.0)


def straggle(batch: int) -> float:
    """Forwards per stream token that a batch adds to its mean image's: a batch steps until its
    slowest image is done, about ``z_B`` standard deviations past the mean (``z_B`` the expected
    largest of ``batch`` standard normal draws, Blom's approximation), where an image's forwards
    spread by :data:`SPREAD` of the stream's tokens."""
    if batch <= 1:
        return 0.0
    return NormalDist().inv_cdf((batch - 0.375) / (batch + 0.25)) * SPREAD


def per_forward(width: int, acceptance: Acceptance, batch: int) -> float:
    """Tokens a batch commits per forward at ``width``: its slowest image's (:func:`straggle`); plain AR
    steps commit one token per forward for every image alike, so no image waits for another."""
    return 1.0 / (1.0 / acceptance.at(width) + (straggle(batch) if width else 0.0))


class CostLine(NamedTuple):
    """Seconds per forward as a line in the rows a forward scores (``width + 1`` for a window)."""

    fixed: float
    per_row: float

    @classmethod
    def through(cls, costs: dict[int, float]) -> "CostLine":
        """The line through the narrowest and widest of ``costs`` (seconds by width); never falling (a
        forward of more rows does no less work: a narrow width that measured dearer met stalls)."""
        lo, hi = min(costs), max(costs)
        per_row = max((costs[hi] - costs[lo]) / (hi - lo), 0.0) if hi > lo else 0.0
        return cls(max(costs[lo] - per_row * (lo + 1), 0.0), per_row)

    def at(self, width: int) -> float:
        return self.fixed + self.per_row * (width + 1)


class Trial:
    """Widths tried in the decode itself, by turns with the preset, :data:`TRIAL` forwards each:
    :data:`NARROW`, then the width their :class:`CostLine` predicts fastest when that is neither; then
    the width kept for the rest of it (the module docstring)."""

    def __init__(self, preset: int, prior: Acceptance, batch: int, forwards: int = TRIAL, narrow: int = NARROW):
        self.preset, self.prior, self.batch, self.forwards = preset, prior, batch, forwards
        self.width = preset
        self.steps: dict[int, list[float]] = {preset: []}  # seconds of each forward step, by width
        self.other: dict[int, float] = {preset: 0.0}  # seconds of steps without a forward (VVS's skips)
        self.tokens: dict[int, float] = {preset: 0.0}  # tokens the mean image committed
        # the preset's steps taken by turns with each other width (the last one: taking turns now), what that
        # width is weighed against
        self.beside: dict[int, list[float]] = {}
        self.predicted = ""
        self.kept: int | None = None
        if narrow != preset:
            self._pair(narrow)

    @property
    def open(self) -> bool:
        return self.kept is None

    @property
    def reason(self) -> str:
        """What was tried and kept, for the report (or where the decode left the trial)."""
        if self.open:
            return f"window {self.width} on auto: the decode ended during its trial (window {self.width} ran last)"
        return self._story()

    def record(self, seconds: float, forward: bool, tokens: float) -> int | None:
        """One step at :attr:`width` (``tokens``: what the mean image committed); the width to run
        from the next step on where it changes, else ``None``.  A step without a forward commits
        what the forward before it planned: the width changes only after a forward."""
        w, partner = self.width, next(reversed(self.beside), None)
        self.tokens[w] += tokens
        if not forward:
            self.other[w] += seconds
            return None
        self.steps[w].append(seconds)
        if w == self.preset and partner is not None:
            self.beside[partner].append(seconds)
        if partner is not None and min(len(self.steps[partner]), len(self.beside[partner])) < self.forwards:
            return self._run(self.preset if w == partner else partner)  # by turns
        if partner is None and len(self.steps[w]) < self.forwards:
            return None
        if partner is not None and len(self.beside) == 1:  # the line through both: a third width where it says so
            best = self._predict()
            if best not in self.steps:
                self._pair(best)
                return self._run(best)
        self.kept = self._decide()
        self.width = self.kept
        return self.kept if self.kept != w else None

    def _pair(self, width: int) -> None:
        self.steps[width], self.other[width], self.tokens[width], self.beside[width] = [], 0.0, 0.0, []

    def _run(self, width: int) -> int:
        self.width = width
        return width

    def cost(self, width: int, half: int | None = None, steps: list[float] | None = None) -> float:
        """Seconds per forward step at ``width`` as run (``half`` 0 / 1: of the first / second half of
        its steps; ``steps``: those of them to read, by default all), steps without a forward spread over
        the forwards."""
        steps = self.steps[width] if steps is None else steps
        part = steps if half is None else steps[: len(steps) // 2] if half == 0 else steps[len(steps) // 2:]
        return median(part) + self.other[width] / len(self.steps[width])

    def _predict(self) -> int:
        line = CostLine.through({w: self.cost(w) for w in self.steps})
        rate = {w: per_forward(w, self.prior, self.batch) / max(line.at(w), 1e-12) for w in CANDIDATES}
        best = max(rate, key=lambda w: (rate[w], -w))  # of equals the narrowest: one token costs least
        self.predicted = (f"their cost line ({1000 * line.fixed:.2f} ms + {1000 * line.per_row:.3f} ms a row) "
                          f"predicted window {best} fastest")
        return best

    def _gain(self, width: int, half: int | None = None) -> float:
        """Tokens per second at ``width`` over the preset's, its steps against the preset's taken by turns
        with them."""
        def rate(w, steps):
            return per_forward(w, self.prior, self.batch) / self.cost(w, half, steps)
        return rate(width, self.steps[width]) / rate(self.preset, self.beside[width])

    def _decide(self) -> int:
        """The fastest width that beat the preset's steps beside it by :data:`GAIN`, in both halves."""
        faster = [w for w in self.beside if all(self._gain(w, h) >= GAIN for h in (0, 1))]
        return max(faster, key=self._gain) if faster else self.preset

    def _story(self) -> str:
        seen = "; ".join(f"window {w}: {1000 * self.cost(w):.2f} ms and {self.tokens[w] / len(s):.2f} tokens per "
                         f"forward" for w, s in self.steps.items())
        kept = self.kept
        ar = "plain AR steps, " if kept == 0 else ""
        if kept == self.preset:
            why = f"the preset, as no width ran {GAIN:.2f}x faster than it in both halves of their steps"
        else:
            why = (f"{self._gain(kept):.2f}x the tokens per second of window {self.preset} "
                   f"({GAIN:.2f}x or more in both halves of their steps)")
        predicted = f"; {self.predicted}" if self.predicted else ""
        turns = f" by turns with window {self.preset}" if self.beside else ""
        return (f"window {kept} on auto: {ar}tried in this decode{turns}, {self.forwards} forwards each ({seen}"
                f"{predicted}): kept {kept}, {why}")
