"""The Jacobi window on auto: the width that commits the most tokens per second here.

A wider window commits more tokens per forward but costs more per forward; how
much more depends on the device, the batch and the model.  On a GPU a forward
reads the weights once whatever its width, so a window of 32 costs about what
one token does; on a CPU a batch of 8 is compute-bound and every draft row costs
its share.  So the engine measures, once per adapter, batch, guidance and decode
path (:func:`probe`), what a forward and its processing cost at each
:data:`CANDIDATES` width (the widths taking turns, each keeping its least time:
on a busy machine one stall during the probe once moved the choice to a width
1.2x slower than ``ar``), and models the tokens a window of ``L`` drafts commits
per forward as ``1 + e * (L / L0) ** SHAPE``: the tokens past the one every
forward commits grow as a power of the width (Jacobi drafts deep in a
window have been refined by more passes, so they fare better than one
acceptance rate per draft would say).  ``SHAPE`` was measured on the embedded
model (batch 8, coupled drafts: 1.63, 1.97, 2.52, 3.41, 4.86 and 5.61 tokens
per forward at widths 1, 2, 4, 8, 16 and 24, slope 0.62 on a log-log plot);
``e`` comes from the tokens per forward measured at the preset width
(:data:`PRIOR`, by drafting).  It keeps the drafting's preset width unless
another is predicted :data:`GAIN` times faster, so that it moves only where the
preset is clearly wrong for the device (a compute-bound batch, say), not on
noise.  A batch steps until its slowest image is done (:func:`straggle`), which
costs most where forwards cost most: at batch 32 on the embedded model the
slowest image took 1.07x the mean image's forwards at window 1 and 1.45x at 24.

The choice depends on measured costs, not on what earlier decodes accepted:
with the costs kept on the model, the same settings and seed give the same image
again in a session.  Across machines (or after a restart, where costs are
measured again) an image on auto is the same whenever the choice is; a set
window makes it the same anywhere.
"""
from __future__ import annotations

import time
from statistics import NormalDist
from typing import NamedTuple

import torch

#: draft widths considered (a window of L drafts scores L + 1 tokens per forward; 0: plain AR steps, where no
#: window pays, as on a device whose every row costs its full share)
CANDIDATES = (0, 1, 2, 4, 8, 16, 24, 32)
#: how much faster (predicted) another width must be than the preset to replace it
GAIN = 1.15
#: how the tokens past the first grow with the width (see the module docstring)
SHAPE = 0.62
#: tokens per forward at the preset width, by drafting: the embedded model's (docs/benchmarks.md; coupled
#: drafts at window 24: 6.07 at batch 1, 5.95 at batch 8; SJD's independent drafts at 16: 3.44)
PRIOR = {"coupled": 6.0, "independent": 3.4}
#: the standard deviation of an image's forwards over a batch, as a share of the stream's tokens: the embedded
#: model's, 32 prompts and seeds, windows 1 to 32: 6.8-9.1 forwards for 256 tokens whatever the width
SPREAD = 0.031


class Choice(NamedTuple):
    width: int
    reason: str


class Acceptance(NamedTuple):
    """Tokens per forward observed at a width."""

    tokens_per_forward: float
    width: int

    def at(self, width: int) -> float:
        """Tokens per forward predicted at ``width``."""
        extra = max(self.tokens_per_forward - 1.0, 0.0)
        return 1.0 + extra * (width / self.width) ** SHAPE


def straggle(batch: int) -> float:
    """Forwards per stream token that a batch adds to its mean image's: a batch steps until its
    slowest image is done, about ``z_B`` standard deviations past the mean (``z_B`` the expected
    largest of ``batch`` standard normal draws, Blom's approximation), where an image's forwards
    spread by :data:`SPREAD` of the stream's tokens."""
    if batch <= 1:
        return 0.0
    return NormalDist().inv_cdf((batch - 0.375) / (batch + 0.25)) * SPREAD


def choose(costs: dict[int, float], acceptance: Acceptance, preset: int, batch: int = 1) -> Choice:
    """The width that commits a batch's tokens fastest; the preset unless another is predicted
    :data:`GAIN` times faster.  ``costs``: seconds per forward by width.  A batch's forwards are
    its slowest image's, :func:`straggle` more per token than its mean image's, which weighs
    most where forwards cost most (wide windows on a compute-bound device)."""
    # plain AR steps commit one token per forward for every image alike: no image waits for another
    per_forward = {w: 1.0 / (1.0 / acceptance.at(w) + (straggle(batch) if w else 0.0)) for w in costs}
    rate = {w: per_forward[w] / c for w, c in costs.items()}
    best = max(rate, key=rate.get)
    if preset in rate and rate[best] < GAIN * rate[preset]:
        best = preset
    ms = ", ".join(f"{w}: {1000 * c:.2f}" for w, c in sorted(costs.items()))
    slowest = (f" ({per_forward[best]:.2f} for a batch of {batch}, whose slowest image sets the forwards)"
               if batch > 1 and best else "")
    ar = "plain AR steps (no window is predicted faster here), " if best == 0 else ""
    return Choice(best, f"window {best} on auto: {ar}{acceptance.at(best):.2f} tokens per forward{slowest} of "
                        f"{1000 * costs[best]:.2f} ms predicted, {rate[best] / 1000:.3f} tokens/ms (window {preset}: "
                        f"{rate[preset] / 1000:.3f}); ms per forward by window here: {ms}")


def probe(adapter, pipeline, batch: int, image_id: int, rounds: int = 3, budget: float = 2.0,
          clock=time.perf_counter) -> dict[int, float]:
    """Seconds per forward (and its processing) at each candidate width, on top of the
    prefilled cache (rolled back after each; the cache a forward reads grows along the image,
    but on the embedded model at batch 16 half an image more moved no width's cost beyond
    the noise, docs/benchmarks.md).  The widths take turns for up to ``rounds`` rounds and
    each keeps its least time, so a stall of the machine (another process, a page fault)
    inflates one measurement, not a width's figure; a round starts only within ``budget``
    seconds (forwards that take seconds, as an offloaded model's, are measured once: a stall
    is small beside them).  A width is never taken to cost more than a wider one
    (:func:`monotone`)."""
    device = adapter.device
    cuda = torch.device(device).type == "cuda"
    inputs = {drafts: (torch.full((batch, drafts + 1), image_id, dtype=torch.long, device=device),
                       torch.arange(1, drafts + 2, device=device).expand(batch, -1)) for drafts in CANDIDATES}
    costs = dict.fromkeys(CANDIDATES, float("inf"))
    began = clock()
    for _ in range(rounds):
        if clock() - began > budget:
            break
        for drafts, (tokens, target) in inputs.items():
            if cuda:
                torch.cuda.synchronize(device)
            start = clock()
            pipeline(adapter.forward(tokens), target)
            if cuda:
                torch.cuda.synchronize(device)
            costs[drafts] = min(costs[drafts], clock() - start)
            adapter.rollback([drafts + 1] * batch)
    return monotone(costs)


def monotone(costs: dict[int, float]) -> dict[int, float]:
    """``costs`` with each width's cost at most that of any wider one: a forward of fewer
    tokens does no more work, so a narrow width measured dearer met a stall."""
    out, least = {}, float("inf")
    for w in sorted(costs, reverse=True):
        least = min(least, costs[w])
        out[w] = least
    return dict(sorted(out.items()))
