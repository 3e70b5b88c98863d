"""Checks on what the model returns: logits of the agreed shape, and distributions that are distributions."""
from __future__ import annotations

import torch

AR_CHECK_EVERY = 32  # AR steps between host checks for a non-finite distribution


class NonFiniteError(ValueError):
    """The model's output holds NaN or infinity where a distribution is sampled."""

    def __init__(self, step: int, sample: int, position: int):
        self.step, self.sample, self.position = step, sample, position
        super().__init__(
            f"the model's output at step {step} (image {sample} of the batch, stream position {position}) "
            "holds NaN or infinity, so there is nothing to sample; float16 weights overflow like this: load the "
            "model in bfloat16 or float32")


class NonFiniteImageError(NonFiniteError):
    """The VQ decoder turned valid codes into NaN or infinity: no picture to show."""

    def __init__(self, sample: int):
        self.step, self.sample, self.position = "decode", sample, None
        ValueError.__init__(
            self, f"the VQ decoder's output for image {sample} of the batch (the decode step, after sampling) holds "
                  "NaN or infinity, so there is no picture to save; float16 decoders overflow like this: load the "
                  "model in bfloat16 or float32")


def check_images(images: torch.Tensor, first: int = 0) -> torch.Tensor:
    """``images`` ``[B, ...]`` as they are, or :class:`NonFiniteImageError` naming the first
    bad one (numbered from ``first``): NaN would otherwise be written as black."""
    bad = ~torch.isfinite(images.flatten(1)).all(1)
    if bool(bad.any()):
        raise NonFiniteImageError(first + int(bad.nonzero()[0]))
    return images


def raise_if_nonfinite(bad: list[bool], step: int, positions: list[int]):
    for b, flag in enumerate(bad):
        if flag:
            raise NonFiniteError(step, b, positions[b])


def check_ar(st):
    """AR decoding syncs only here: the first step whose distribution was not one."""
    bad = st.bad_step.tolist()
    if max(bad) >= 0:
        b = min((s, b) for b, s in enumerate(bad) if s >= 0)[1]
        raise NonFiniteError(bad[b], b, bad[b])


def check_shape(call: str, logits, expected):
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != tuple(expected):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(
            f"adapter.{call}() must return logits of shape [branches, batch, "
            f"{'window, ' if call == 'forward' else ''}vocab] = {list(expected)}, got {got}"
        )
