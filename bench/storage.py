"""Weight storage side by side: what each option costs to load, holds, and changes.

    spec-ar bench storage --model FOLDER [--vq ...] [--dtypes bfloat16 int8 fp8 nf4] [--device cpu]
                          [--windows 1 24] [--forwards 5] [--out out/bench-storage]

Each option runs in a fresh process (so its peak memory is its own): load time,
peak resident memory (CPU; ``VmHWM``) or peak allocated memory (GPU), the
weights as stored, milliseconds per forward at each window (median; batch 1,
guided as the family's defaults say), and the logits of the same tokens against
the first option's (the reference: bfloat16 by default): top-1 agreement and
KL(reference || option), averaged over the positions of a fixed stream.  On the
embedded model ``--quality-images N`` adds each option's images beside ``ar`` of
the reference: Frechet distance to the reference's ``ar`` (against the noise floor,
two reference ``ar`` runs with different seeds) and the NLL the reference model
gives the option's tokens, for ``ar`` and ``sjd``.  The
weights need not be trained: on random weights (``python -m
spec_ar.bench.scale_checkpoints``) the figures of time and memory hold, and the
logit agreement shows what the storage does to a forward.
Writes ``results.json`` and ``report.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import shutil
import subprocess
import sys
import tempfile
import time

import torch

PROMPT = "a red circle in the top left on a striped blue background"


def _peak_rss() -> int:
    """This process's peak resident memory (``VmHWM``; ``ru_maxrss`` would carry the parent's over)."""
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def measure_one(args) -> dict:
    """One storage option, in this process: the figures, and its logits saved to ``--logits``."""
    from ..loaders.detect import load_model
    from ..loaders.storage import stored_bytes

    device = args.device
    base = _peak_rss()
    t = time.perf_counter()
    model = load_model(args.model, args.vq, args.text_encoder, args.resolution, device, args.one)
    _sync(device)
    load_s = time.perf_counter() - t
    out = {"dtype": model.storage.name, "load_s": load_s, "rss_before_load": base,
           "weights_bytes": sum(stored_bytes(m) for m in model.modules.values())}
    ad = model.adapter
    guided = (ad.sampling_defaults or {}).get("cfg_scale", 1.0) != 1.0
    condition = PROMPT if model.condition == "text" else 0
    gen = torch.Generator().manual_seed(0)
    ids, _ = ad.token_vectors() if ad.token_vectors() is not None else (torch.arange(ad.vocab_size), None)
    stream = ids.cpu()[torch.randint(0, len(ids), (max(args.windows) * (args.forwards + 1),), generator=gen)]
    with torch.no_grad():
        first = ad.prefill([condition], None, guided)
        logits = [first[0, 0].float().cpu()]
        probe = stream[: max(args.windows)].to(ad.device).unsqueeze(0)  # the same tokens for every option
        logits.append(ad.forward(probe)[0, 0].float().cpu())
        ad.rollback([probe.shape[1]])
        for window in args.windows:
            times = []
            for i in range(args.forwards):
                tokens = stream[i * window:(i + 1) * window].to(ad.device).unsqueeze(0)
                _sync(device)
                t = time.perf_counter()
                ad.forward(tokens)
                _sync(device)
                times.append(time.perf_counter() - t)
                ad.rollback([window])
            out[f"ms_per_forward_w{window}"] = statistics.median(times) * 1000
        ad.release()
    torch.save(torch.cat([logits[0][None], logits[1]]), args.logits)
    if torch.device(device).type == "cuda":
        out["peak_allocated"] = torch.cuda.max_memory_allocated(device)
    out["peak_rss"] = _peak_rss()
    return out


def quality(args, log=print) -> dict:
    """Each option's ``ar`` and ``sjd`` images judged against the reference's ``ar``
    (the first option, in full precision): FD to it, and the reference's NLL of
    their tokens, nats per image token."""
    import numpy as np

    from ..embedded import judge as judging
    from ..embedded_tools.quality import QualityProbe, to_uint8
    from ..loaders import embedded
    from ..loaders.detect import load_model
    from ..sampling import DecodeConfig, SpeculativeDecoder

    reference = load_model(args.model, device=args.device, dtype=args.dtypes[0])
    judge = judging.load_judge(embedded.FOLDER / "judge.safetensors")
    probe = QualityProbe(reference, judge, args.quality_images)
    probe.measure(DecodeConfig(mode="ar"))  # the reference's ar and its noise floor
    out = {"fd_noise_floor": probe.summary["fd_noise_floor"], "rows": []}
    log(f"quality: noise floor {out['fd_noise_floor']:.1f} (two {args.dtypes[0]} ar runs, "
        f"{args.quality_images} images)")
    image = reference.adapter.layout.image_positions()
    for name in args.dtypes:
        model = load_model(args.model, device=args.device, dtype=name)
        for mode in ("ar", "sjd"):
            config = DecodeConfig(mode=mode)
            decoder, scorer = (SpeculativeDecoder(m.adapter, config) for m in (model, reference))
            images, nll = [], []
            for start in range(0, len(probe.prompts), 50):
                prompts = probe.prompts[start:start + 50]
                res = decoder.generate(prompts, seeds=start)
                images.append(to_uint8(model.decode_images(res.image_tokens(model.adapter.layout))))
                ll = scorer.target_log_likelihood(prompts, res.tokens)[:, image.to(res.tokens.device)].cpu()
                nll += [-float(row[torch.isfinite(row)].mean()) for row in ll]
            feats = judging.image_features(judge, np.concatenate(images))
            row = {"dtype": name, "mode": mode, "fd_to_ar": judging.frechet_distance(feats, probe.ar_feats),
                   "nll": float(np.mean(nll)), "nll_se": float(np.std(nll, ddof=1) / np.sqrt(len(nll)))}
            out["rows"].append(row)
            log(f"  {name:9s} {mode:4s} FD to {args.dtypes[0]} ar {row['fd_to_ar']:.1f}  NLL {row['nll']:.3f} "
                f"+- {row['nll_se']:.3f}")
        del model
    return out


def compare(ref: torch.Tensor, other: torch.Tensor) -> dict:
    """Top-1 agreement and mean KL(ref || other) over positions, on the vocabulary."""
    lp, lq = torch.log_softmax(ref.float(), -1), torch.log_softmax(other.float(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return {"top1_agreement": float((ref.argmax(-1) == other.argmax(-1)).float().mean()),
            "kl_mean": float(kl.mean()), "kl_max": float(kl.max())}


def gbs(n) -> str:
    from ..sampling.memory import gb

    return gb(n)


def report(results: dict) -> str:
    rows = results["runs"]
    windows = results["windows"]
    lines = [f"# Weight storage on {results['model']} ({results['device']}, torch {results['torch']})", "",
             "| dtype | load s | weights | peak memory | peak above start | " +
             " | ".join(f"ms/forward L={w}" for w in windows) + " | top-1 vs " + rows[0]["dtype"]
             + " | KL mean | KL max |",
             "|---" * (7 + len(windows)) + "|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['dtype']} | refused: {r['error']} |")
            continue
        peak = r.get("peak_allocated", r["peak_rss"])
        above = peak - (0 if "peak_allocated" in r else r["rss_before_load"])
        lines.append(f"| {r['dtype']} | {r['load_s']:.1f} | {gbs(r['weights_bytes'])} | {gbs(peak)} | "
                     f"{gbs(above)} ({above / r['weights_bytes']:.2f}x weights) | "
                     + " | ".join(f"{r[f'ms_per_forward_w{w}']:.1f}" for w in windows)
                     + f" | {r['top1_agreement']:.3f} | {r['kl_mean']:.4f} | {r['kl_max']:.4f} |")
    if "quality" in results:
        q = results["quality"]
        lines += ["", f"Quality on {q['images']} prompts against {rows[0]['dtype']} ar (noise floor: two "
                  f"{rows[0]['dtype']} ar runs with different seeds, FD {q['fd_noise_floor']:.1f}):", "",
                  "| dtype | mode | FD to ar | NLL (reference model) |", "|---|---|---|---|"]
        lines += [f"| {r['dtype']} | {r['mode']} | {r['fd_to_ar']:.1f} | {r['nll']:.3f} +- {r['nll_se']:.3f} |"
                  for r in q["rows"]]
    lines += ["", "Peak memory: " + ("peak allocated GPU memory" if results["device"].startswith("cuda") else
                                       "peak resident memory of the process (VmHWM), imports included "
                                       f"({gbs(results['runs'][0].get('rss_before_load', 0))} before loading)"), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spec-ar bench storage", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--vq")
    ap.add_argument("--text-encoder")
    ap.add_argument("--resolution", type=int)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "int8", "fp8", "nf4"],
                    help="storage options; the first is the reference for the logits")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--windows", type=int, nargs="+", default=[1, 24])
    ap.add_argument("--forwards", type=int, default=5, help="forwards timed per window")
    ap.add_argument("--quality-images", type=int, default=0,
                    help="embedded model: also judge each option's ar and sjd images on this many prompts")
    ap.add_argument("--out", default="out/bench-storage")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one option in this process
    ap.add_argument("--logits", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args)))
        return 0
    from ..loaders.storage import storage_of
    from ..output_folders import writable_folder

    for name in args.dtypes:
        storage_of(name, "--dtypes")
    out = writable_folder(args.out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    results = {"model": args.model, "device": args.device, "torch": torch.__version__, "windows": args.windows,
               "runs": []}
    ref = None
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="spec-ar-storage-"))  # logits: compared, not kept
    for name in args.dtypes:
        logits = scratch / f"logits_{name}.pt"
        cmd = [sys.executable, "-m", "spec_ar.cli", "bench", "storage", "--one", name, "--logits", str(logits),
               "--model", args.model, "--device", args.device, "--forwards", str(args.forwards),
               "--windows", *map(str, args.windows)]
        for opt in ("vq", "text_encoder", "resolution"):
            if getattr(args, opt):
                cmd += ["--" + opt.replace("_", "-"), str(getattr(args, opt))]
        print(f"{name}: loading and timing ...", flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            err = (done.stderr.strip().splitlines() or ["failed"])[-1]
            results["runs"].append({"dtype": name, "error": err})
            print(f"{name}: {err}", flush=True)
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        these = torch.load(logits, weights_only=True)
        ref = these if ref is None else ref
        row.update(compare(ref, these))
        results["runs"].append(row)
        print(f"{name}: load {row['load_s']:.1f} s, weights {gbs(row['weights_bytes'])}, peak "
              f"{gbs(row.get('peak_allocated', row['peak_rss']))}, "
              + ", ".join(f"L={w} {row[f'ms_per_forward_w{w}']:.1f} ms" for w in args.windows)
              + f", top-1 {row['top1_agreement']:.3f}, KL {row['kl_mean']:.4f}", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    if args.quality_images:
        results["quality"] = {"images": args.quality_images, **quality(args)}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "report.md").write_text(report(results))
    print(f"wrote {out / 'report.md'} and {out / 'results.json'}")
    return 0
