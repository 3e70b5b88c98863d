"""The quality loop every harness shares (``spec-ar evaluate``, ``spec-ar bench``):
a setting's images of the same prompts, judged against real renders.

Prompts are canonical captions of random scenes of the embedded model's domain;
the "real" set is the renderer's pictures of those scenes.  The judge reads
colour, shape and position (prompt adherence) and gives the features of a
Frechet distance (FD).  Result keys, the same wherever they are reported:

* per setting: ``adherence``, ``adherence_parts`` (colour / shape / position),
  ``quality_images``, ``fd`` (to real renders), ``fd_to_ar`` (to ``ar``'s images);
* once: ``fd_noise_floor`` (FD between ``ar`` with two seed sets: what a lossless
  setting's ``fd_to_ar`` should stay within), ``ar_other_seeds`` (``ar``'s figures
  with the other seeds) and ``real_adherence`` (the judge on real renders).
"""
from __future__ import annotations

import numpy as np
import torch

from ..sampling import DecodeConfig, SpeculativeDecoder
from ..embedded import domain, judge as judging

OTHER_SEEDS = 10**5  # the noise floor's second seed set starts here
REAL_SEEDS = 10**6  # the renderer's noise seeds for the real images


def scenes_and_prompts(n: int, seed: int):
    rng = np.random.default_rng(seed)
    scenes = [domain.sample_scene(rng) for _ in range(n)]
    return scenes, [domain.caption(s) for s in scenes]


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """``[B, 3, H, W]`` in [0, 1] -> ``[B, H, W, 3]`` uint8."""
    return (images.permute(0, 2, 3, 1).cpu().numpy() * 255).round().astype(np.uint8)


@torch.no_grad()
def generate(model, config: DecodeConfig, prompts: list[str], seed: int, batch: int, drafter=None):
    """Images (uint8) and reports for ``prompts``, image ``i`` with seed ``seed + i``
    (``drafter``: a draft source instead of Jacobi drafts)."""
    decoder = SpeculativeDecoder(model.adapter, config, drafter=drafter)
    images, reports = [], []
    for start in range(0, len(prompts), batch):
        res = decoder.generate(prompts[start:start + batch], seeds=seed + start)
        images.append(to_uint8(model.decode_images(res.image_tokens(model.adapter.layout))))
        reports += res.reports
    return np.concatenate(images), reports


class QualityProbe:
    """Judges settings on ``n`` prompts (scene seed ``scenes_seed``), ``batch`` images
    at a time.  Measure ``ar`` first: the others' ``fd_to_ar`` is against it."""

    def __init__(self, model, judge, n: int, scenes_seed: int = 12345, batch: int = 50):
        self.model, self.judge, self.batch = model, judge, batch
        scenes, self.prompts = scenes_and_prompts(n, scenes_seed)
        real = domain.render_batch(scenes, [REAL_SEEDS + i for i in range(n)])
        self.real_feats = judging.image_features(judge, real)
        self.summary = {"quality_prompts": n, "real_adherence": judging.adherence(judge, real, self.prompts)["all"]}
        self.ar_feats = None

    def _judge(self, config: DecodeConfig, seed: int, drafter=None) -> tuple[dict, np.ndarray]:
        images, _ = generate(self.model, config, self.prompts, seed, self.batch, drafter)
        feats = judging.image_features(self.judge, images)
        adh = judging.adherence(self.judge, images, self.prompts)
        return {"adherence": adh["all"], "adherence_parts": {k: adh[k] for k in judging.CORE_ATTRIBUTES},
                "quality_images": adh["n"], "fd": judging.frechet_distance(feats, self.real_feats)}, feats

    def measure(self, config: DecodeConfig, seed: int = 0, drafter=None) -> dict:
        """The figures of one setting; ``ar`` also sets the noise floor (``self.summary``)."""
        row, feats = self._judge(config, seed, drafter)
        if config.mode == "ar" and self.ar_feats is None:
            self.ar_feats = feats
            other, other_feats = self._judge(config, seed + OTHER_SEEDS)
            self.summary.update(fd_noise_floor=judging.frechet_distance(other_feats, feats), ar_other_seeds=other)
        if self.ar_feats is not None:
            row["fd_to_ar"] = judging.frechet_distance(feats, self.ar_feats)
        return row
