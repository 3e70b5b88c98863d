"""Quality of the embedded model's images, with no downloads: prompt adherence and
a Frechet distance to real renders, next to the distance's noise floor.

    spec-ar evaluate [--modes ar sjd gsd lantern vvs] [--images 200] [--seed 0]

The measurement is :mod:`.quality`'s, the one ``spec-ar bench`` makes too: prompt
adherence and Frechet distances to real renders and to ``ar``, beside the noise
floor of two ``ar`` runs with different seeds (a lossless mode should land
within it; a lossy one shows how far it strays).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

from ..sampling import DecodeConfig
from . import judge as judging
from .quality import QualityProbe


def evaluate(model, judge, configs: dict[str, DecodeConfig], n: int = 200, seed: int = 0, batch: int = 50,
             log=print) -> dict:
    """Adherence and FDs of each setting on ``n`` prompts (:mod:`.quality`'s keys)."""
    probe = QualityProbe(model, judge, n, scenes_seed=seed, batch=batch)
    runs = {"ar": DecodeConfig(mode="ar"), **configs}  # ar first: the noise floor and FD to ar
    out = {"seed": seed, "runs": {}}
    for name, config in runs.items():
        t = time.perf_counter()
        row = probe.measure(config, seed)
        row.update(seconds=time.perf_counter() - t, settings=config.to_dict())
        out["runs"][name] = row
        log(f"  {name:10s} adherence {row['adherence']:.1%}  FD to real {row['fd']:.1f}  FD to ar "
            f"{row['fd_to_ar']:.1f}  ({row['seconds']:.0f} s)")
    out.update(probe.summary)
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
