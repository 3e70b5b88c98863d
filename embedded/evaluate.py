"""Quality of the embedded model's images, with no downloads: prompt adherence and
a Frechet distance to real renders, next to the distance's noise floor.

    spec-ar evaluate [--modes ar sjd gsd lantern vvs] [--images 200] [--seed 0]

Prompts are canonical captions of random scenes of the domain; the "real" set is
the renderer's pictures of the same scenes.  The judge reads colour, shape and
position (adherence) and gives the features for the Frechet distance (FD).  Two
``ar`` runs with different seeds give the noise floor: a lossless mode should
land within it, and a lossy one shows how far it strays.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np
import torch

from ..sampling import DecodeConfig, SpeculativeDecoder
from . import domain, judge as judging
from .demo import to_uint8


def scenes_and_prompts(n: int, seed: int):
    rng = np.random.default_rng(seed)
    scenes = [domain.sample_scene(rng) for _ in range(n)]
    return scenes, [domain.caption(s) for s in scenes]


@torch.no_grad()
def generate(model, config: DecodeConfig, prompts: list[str], seed: int, batch: int):
    """Images (uint8) and per-batch reports for ``prompts``, image ``i`` with seed ``seed + i``."""
    decoder = SpeculativeDecoder(model.adapter, config)
    images, reports = [], []
    for start in range(0, len(prompts), batch):
        res = decoder.generate(prompts[start:start + batch], seeds=seed + start)
        images.append(to_uint8(model.decode(res.image_tokens(model.adapter.layout))))
        reports += res.reports
    return np.concatenate(images), reports


def evaluate(model, judge, configs: dict[str, DecodeConfig], n: int = 200, seed: int = 0, batch: int = 50,
             log=print) -> dict:
    scenes, prompts = scenes_and_prompts(n, seed)
    real = domain.render_batch(scenes, [10**6 + i for i in range(n)])
    real_feats = judging.image_features(judge, real)
    out = {"n": n, "seed": seed, "real_adherence": judging.adherence(judge, real, prompts)["all"], "modes": {}}
    runs = dict(configs)
    runs.setdefault("ar", DecodeConfig(mode="ar"))
    for name, config in runs.items():
        t = time.perf_counter()
        images, reports = generate(model, config, prompts, seed, batch)
        feats = judging.image_features(judge, images)
        row = {"nfe": float(np.mean([r.nfe for r in reports])),
               "tokens_per_forward": float(np.mean([r.tokens_per_forward for r in reports])),
               "adherence": judging.adherence(judge, images, prompts)["all"],
               "fd": judging.frechet_distance(feats, real_feats), "seconds": time.perf_counter() - t,
               "settings": config.to_dict()}
        out["modes"][name] = row
        if name == "ar":  # the noise floor: the same prompts, other seeds
            again, _ = generate(model, config, prompts, seed + 10**5, batch)
            row["fd_other_seeds"] = judging.frechet_distance(judging.image_features(judge, again), real_feats)
            out["fd_noise_floor"] = judging.frechet_distance(judging.image_features(judge, again), feats)
            out["adherence_other_seeds"] = judging.adherence(judge, again, prompts)["all"]
        log(f"  {name:10s} NFE {row['nfe']:6.1f}  adherence {row['adherence']:.1%}  FD {row['fd']:.1f}  "
            f"({row['seconds']:.0f} s)")
    log(f"  noise floor: FD between two ar runs {out['fd_noise_floor']:.1f}; real renders' adherence "
        f"{out['real_adherence']:.1%}")
    return out


def main(argv=None) -> int:
    from ..loaders import embedded

    ap = argparse.ArgumentParser(prog="spec-ar evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=["ar", "sjd", "gsd", "lantern", "vvs"])
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--out", default="out/evaluate.json")
    args = ap.parse_args(argv)
    model = embedded.load()
    judge = judging.load_judge(embedded.FOLDER / "judge.safetensors")
    res = evaluate(model, judge, {m: DecodeConfig(mode=m) for m in args.modes}, args.images, args.seed, args.batch)
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    print(f"wrote {path}")
    return 0
