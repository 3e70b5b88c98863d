"""Quality of the embedded model's images, with no downloads: prompt adherence and
a Frechet distance to real renders, next to the distance's noise floor.

    spec-ar evaluate [--modes ar sjd gsd lantern vvs] [--images 200] [--seed 0]
    spec-ar evaluate --tokenizer [FOLDER] [--images 512]      (the VQ tokenizer of a model folder)

The measurement is :mod:`.quality`'s, the one ``spec-ar bench`` makes too: prompt
adherence and Frechet distances to real renders and to ``ar``, beside the noise
floor of two ``ar`` runs with different seeds (a lossless mode should land
within it; a lossy one shows how far it strays).  ``--tokenizer`` measures the
VQ tokenizer instead: the reconstruction error of renders it has not seen
(encode, decode; L1, MSE and PSNR, on the whole picture and on the object's
pixels) and the decoder's droplets (:class:`.train.Spikes`) on those pictures.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

from ..sampling import DecodeConfig
from ..embedded import judge as judging
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


def tokenizer_quality(model, n: int = 512, seed: int = 999) -> dict:
    """Reconstruction error of ``n`` fresh renders (scene seed ``seed``) through the
    model's VQ tokenizer, and the decoder's peak GroupNorm-input ratio on them."""
    import numpy as np
    import torch

    from ..embedded import domain
    from .train import Spikes, _to_tensor

    vq = model.modules["vq"].float()
    r = model.info["recipe"]
    images, _, _, cover = domain.make_dataset(n, seed=seed, size=r.size, drop=r.drop, coverage=True)
    x = _to_tensor(images)
    with torch.no_grad(), Spikes(vq.decoder) as spikes:
        rec = vq.decode_codes(vq.encode(x)).clamp(-1, 1)
        peaks = spikes.peak()
    err = rec - x
    mse = float(err.square().mean())
    return {"images": n, "seed": seed, "l1": float(err.abs().mean()), "mse": mse,
            "psnr_db": float(10 * np.log10(4 / mse)),
            "object_l1": float(err.abs().mean(1)[torch.from_numpy(cover) > 0.5].mean()),
            "droplet_median": float(peaks.median()), "droplet_max": float(peaks.max())}


def main(argv=None) -> int:
    from ..loaders import embedded

    ap = argparse.ArgumentParser(prog="spec-ar evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=["ar", "sjd", "gsd", "lantern", "vvs"])
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--out", default="out/evaluate.json")
    ap.add_argument("--tokenizer", nargs="?", const=str(embedded.FOLDER), metavar="FOLDER",
                    help="measure the VQ tokenizer of FOLDER (default: the embedded model's) instead of the modes")
    args = ap.parse_args(argv)
    if args.tokenizer:
        res = tokenizer_quality(embedded.load(pathlib.Path(args.tokenizer)), args.images if args.images != 200
                                else 512)
        print(f"{args.tokenizer}: {res['images']} renders: L1 {res['l1']:.4f}, MSE {res['mse']:.4f}, PSNR "
              f"{res['psnr_db']:.2f} dB, object pixels L1 {res['object_l1']:.4f}; decoder droplets: median "
              f"{res['droplet_median']:.1f}, max {res['droplet_max']:.1f} x its maps' RMS")
        return 0
    model = embedded.load()
    judge = judging.load_judge(embedded.FOLDER / "judge.safetensors")
    res = evaluate(model, judge, {m: DecodeConfig(mode=m) for m in args.modes}, args.images, args.seed, args.batch)
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    print(f"wrote {path}")
    return 0
