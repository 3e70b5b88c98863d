"""``spec-ar bench``: modes and settings side by side, on one model and prompt list.

    spec-ar bench [--model embedded] [--modes ar sjd gsd lantern vvs] [--sweep gsd:G=1,3,10,25,50,100 ...]
                  [--seeds 0 1] [--repeats 3] [--quality-images 200] [--scaling] [--out out/bench]

Per mode and setting: forward passes (NFE), tokens per forward, mean accepted
length, latency per image at batch 1 (device-synchronised; median and spread
over prompts, seeds and repeats; settings take turns run by run), speed-up
against ``ar`` measured in the same run, the share of time outside model
forwards, peak memory, and quality: on every model the target NLL (how unlikely
the model, with the same sampling settings, finds the image tokens a setting
committed); on the embedded model also the judge's prompt adherence and a
Frechet distance to real renders next to its noise floor (two ``ar`` runs with
different seeds).
``--scaling`` adds forward passes and latency against the number of image tokens
(a synthetic model at several grids) and images per second against batch size.
Writes ``results.json``, ``report.md`` and PNG charts into ``--out``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import time

import numpy as np
import torch

from ..prompt_files import read_prompts
from ..sampling import ConfigError, DecodeConfig, SpeculativeDecoder
from .report import ADHERENCE_MARGIN
from .sweeps import parse_sweep


def _cpu_name() -> str:
    import os
    import platform

    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or 'CPU'}, {os.cpu_count()} cores"


def _device_sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _reset_peak_rss() -> bool:
    """Start a new peak of this process's resident memory (Linux: ``/proc/self/clear_refs``)."""
    try:
        pathlib.Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_mb() -> float:
    """This process's peak resident memory since the last reset, MB (``VmHWM``)."""
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def speed(model, configs: dict[str, DecodeConfig], prompts, seeds, repeats: int, log=None,
          drafters: dict | None = None) -> dict[str, dict]:
    """Batch-of-one runs over prompts x seeds x repeats for every setting.

    The settings take turns run by run, so a slow spell of a shared machine
    (other jobs, clock changes) lands on all of them alike instead of on
    whichever setting happened to be measured then.  ``drafters``: the draft source
    of a setting that does not use Jacobi drafts, by label."""
    decoders = _decoders(model, configs, drafters)
    for decoder in decoders.values():
        decoder.generate(prompts[:1], seeds=seeds[0])  # warm-up
    reports: dict[str, list] = {label: [] for label in configs}
    scores: dict[str, list] = {label: [] for label in configs}
    peaks: dict[str, list] = {label: [] for label in configs}
    image = model.adapter.layout.image_positions().to(model.adapter.device)
    for rep in range(repeats):
        for seed in seeds:
            for i, prompt in enumerate(prompts):
                for label, decoder in decoders.items():
                    tracked = _reset_peak_rss()
                    res = decoder.generate([prompt], seeds=seed * 1000 + i)
                    if tracked:  # the whole process at its peak: weights, caches, buffers
                        peaks[label].append(_peak_rss_mb())
                    reports[label].append(res.reports[0])
                    # after the timed run: the target's log-likelihood of what was committed
                    scores[label].append(decoder.target_log_likelihood([prompt], res.tokens)[0, image].cpu())
        if log:
            log(f"  latency round {rep + 1}/{repeats} done")
    return {label: _speed_row(reps) | _likelihood_row(scores[label])
            | ({"peak_rss_mb": max(peaks[label])} if peaks[label] else {}) for label, reps in reports.items()}


def _likelihood_row(scores: list[torch.Tensor]) -> dict:
    """Target NLL, nats per image token: a quality measure any model offers offline.  Lossless modes
    match ``ar`` within its standard error; a relaxed one that commits tokens the target finds unlikely
    scores higher.  Tokens the target gives no mass are counted, not averaged in."""
    ll = torch.stack(scores)
    finite = torch.isfinite(ll)
    per_image = [-float(row[ok].mean()) for row, ok in zip(ll, finite)]
    return {"target_nll": float(np.mean(per_image)),
            "target_nll_se": float(np.std(per_image, ddof=1) / np.sqrt(len(per_image))) if len(per_image) > 1
            else 0.0, "zero_mass_tokens": float((~finite).float().mean())}


def _speed_row(reports) -> dict:
    lat = [r.latency_s for r in reports]
    q1, q3 = np.percentile(lat, [25, 75])
    nfe = float(np.mean([r.nfe for r in reports]))
    return {"nfe": nfe, "tokens": reports[0].tokens, "tokens_per_forward": reports[0].tokens / nfe,
            "mean_accepted_length": float(np.mean([r.mean_accepted_length for r in reports])),
            "latency_median_s": statistics.median(lat), "latency_q1_s": float(q1), "latency_q3_s": float(q3),
            "latency_min_s": min(lat), "latency_max_s": max(lat),
            "outside_forwards": float(np.mean([r.engine_time_s / r.latency_s for r in reports])),
            "engine_ms_per_forward": statistics.median(r.engine_time_s / r.nfe for r in reports) * 1e3,
            "draft_stability": float(np.mean([r.draft_stability for r in reports])),
            "memory_mb": max(r.memory_mb for r in reports),
            "runs": len(reports), **_window(reports)}


def _window(reports) -> dict:
    """The Jacobi window the runs used, and why where it was on auto (the last run's choice)."""
    last = reports[-1]
    if "window" not in last.settings or last.settings.get("mode") == "ar":
        return {}
    return {"window": last.settings["window"], **({"window_choice": last.window_choice} if last.window_choice
                                                  else {})}


def best_relaxed(results: dict) -> str | None:
    """The relaxed-acceptance setting verified every step with the most tokens per forward,
    among those keeping prompt adherence within :data:`ADHERENCE_MARGIN` of ``ar`` when quality was measured."""
    runs = results["runs"]
    relaxed = [lbl for lbl, r in runs.items() if r["rule"] in ("grouped", "latent") and r["schedule"] == "every"]
    if "adherence" in runs["ar"]:
        kept = [lbl for lbl in relaxed if runs[lbl]["adherence"] >= runs["ar"]["adherence"] - ADHERENCE_MARGIN]
        relaxed = kept or relaxed
    return max(relaxed, key=lambda lbl: runs[lbl]["tokens_per_forward"], default=None)


def scaling_tokens(modes, device, log) -> dict:
    """NFE and latency against image tokens, on a synthetic model at several grids."""
    from ..loaders.synthetic import SyntheticAdapter

    out = {}
    for side in (8, 16, 24, 32):
        model = SyntheticAdapter(codebook=4096, rows=side, cols=side, hidden=128, layers=2, sharpness=2.5,
                                 seed=0, device=device)
        row = {}
        for mode in modes:
            dec = SpeculativeDecoder(model, DecodeConfig(mode=mode, lantern_k=100, top_k=500))
            dec.generate([0], seeds=0)
            reps = [dec.generate([c], seeds=7 + c).reports[0] for c in range(3)]
            row[mode] = {"nfe": float(np.mean([r.nfe for r in reps])),
                         "latency_s": statistics.median(r.latency_s for r in reps)}
        out[side * side] = row
        log(f"  {side * side:5d} tokens: " + "  ".join(f"{m} NFE {v['nfe']:.0f}" for m, v in row.items()))
    return out


def scaling_batch(model, modes, prompts, log) -> dict:
    out = {}
    for batch in (1, 2, 4, 8):
        row = {}
        for mode in modes:
            dec = SpeculativeDecoder(model.adapter, DecodeConfig(mode=mode))
            dec.generate(prompts[:batch], seeds=0)
            t = time.perf_counter()
            res = dec.generate((prompts * 8)[:batch], seeds=1)
            _device_sync(model.adapter.device)
            row[mode] = {"images_per_s": batch / (time.perf_counter() - t),
                         "nfe": float(np.mean([r.nfe for r in res.reports]))}
        out[batch] = row
        log(f"  batch {batch}: " + "  ".join(f"{m} {v['images_per_s']:.2f} img/s" for m, v in row.items()))
    return out


def _decoders(model, configs: dict[str, DecodeConfig], drafters: dict | None) -> dict:
    return {label: SpeculativeDecoder(model.adapter, config, drafter=(drafters or {}).get(label))
            for label, config in configs.items()}


def batch_speed(model, configs: dict[str, DecodeConfig], prompts, batch: int, repeats: int, log=None,
                drafters: dict | None = None) -> dict:
    """Batch-of-``batch`` runs (the prompt list cycled), settings taking turns: latency
    of the whole batch and images per second, median over ``repeats``."""
    decoders = _decoders(model, configs, drafters)
    chunk = (list(prompts) * batch)[:batch]
    for decoder in decoders.values():
        decoder.generate(chunk, seeds=0)  # warm-up
    runs: dict[str, list] = {label: [] for label in configs}
    for rep in range(repeats):
        for label, decoder in decoders.items():
            runs[label].append(decoder.generate(chunk, seeds=1000 * (rep + 1)).reports)
    out = {}
    for label, reps in runs.items():
        lat = statistics.median(r[0].latency_s for r in reps)
        out[label] = {"batch": batch, "latency_median_s": lat, "images_per_s": batch / lat,
                      "nfe": float(np.mean([x.nfe for r in reps for x in r])), **_window(reps[-1])}
    if log:
        log(f"  batch {batch}: " + "  ".join(f"{k} {v['images_per_s']:.2f} img/s" for k, v in out.items()))
    return out


def _reads(config: DecodeConfig, part: str) -> bool:
    """Whether ``config`` sets a knob away from its default that only ``part``
    ("jacobi" or "drafter", with its tree knobs) reads."""
    from ..sampling.config import DRAFT_TREES, KNOBS

    base = DecodeConfig(mode=config.mode)
    parts = {"jacobi": ("jacobi",), "drafter": ("drafter", "tree") + DRAFT_TREES}[part]
    return any(set(k.uses) <= set(parts) and getattr(config, k.name) != getattr(base, k.name) for k in KNOBS.values())


def _drafter_twins(runs) -> list:
    """The drafted settings again on a draft model's drafts (``"... + drafter"``),
    each once: a setting that differs from its mode only in Jacobi knobs has its
    mode's twin; settings of the draft model's own knobs (depth, trees) run only
    with it."""
    twins, seen = [], set()
    for label, c in runs:
        key = dataclasses.replace(c, drafter="drafter").label()  # the draft model's knobs in it
        if not c.drafts or (_reads(c, "jacobi") and not _reads(c, "drafter")) or key in seen:
            continue
        seen.add(key)
        twins.append((f"{label} + drafter", c))
    return twins


def run(args, log=print) -> dict:
    from ..loaders.base import resolve_device
    from ..loaders.detect import detect, load_drafter, load_model

    device = resolve_device(args.device)
    prompts = read_prompts(args.prompts, f"--prompts {args.prompts}")
    if detect(args.model).condition == "class":  # the list holds class ids (checked before loading)
        bad = [p for p in prompts if not p.isdigit()]
        if bad:
            raise ConfigError(f"{args.model} is class-conditional: --prompts must hold one class id per line "
                              f"(got {bad[0]!r})")
        prompts = [int(p) for p in prompts]
    model = load_model(args.model, args.vq, args.text_encoder, args.resolution, device=device, dtype=args.dtype,
                       offload=args.offload, decode_path=args.decode_path)
    dtype = model.storage.name
    runs = [(m, DecodeConfig(mode=m)) for m in args.modes]
    for spec in args.sweep:
        runs += parse_sweep(spec)
    # ar first: the others' speed-up and FD to ar are measured against it
    runs = [("ar", DecodeConfig(mode="ar"))] + [(label, c) for label, c in runs if label != "ar"]
    drafters = {}
    if args.drafter:  # every drafted setting once more, drafted by the draft model
        source = load_drafter(args.drafter, model, args.text_encoder, device, dtype)
        twins = _drafter_twins(runs)
        drafters = {label: source for label, _ in twins}
        runs = [(label, c) for label, c in runs if not _reads(c, "drafter")] + twins
    log(f"{model.name} on {device} ({dtype}); {len(prompts)} prompts x seeds {args.seeds} x {args.repeats} "
        f"repeats; {len(runs)} settings")
    results = {"model": model.name, "device": device, "dtype": str(dtype), "torch": torch.__version__,
               "threads": torch.get_num_threads(), "prompts": prompts, "seeds": args.seeds, "repeats": args.repeats,
               "command": " ".join(sys.argv), "cpu": _cpu_name(), "runs": {}}
    probe = None
    if model.family == "embedded" and args.quality_images:
        from ..embedded import judge as judging
        from ..embedded_tools.quality import QualityProbe
        from ..loaders import embedded

        probe = QualityProbe(model, judging.load_judge(embedded.FOLDER / "judge.safetensors"), args.quality_images,
                             batch=args.quality_batch)

    def measure(configs: dict[str, DecodeConfig]):
        for label, row in speed(model, configs, prompts, args.seeds, args.repeats, log, drafters).items():
            config = configs[label]
            row["settings"] = {k: v for k, v in dataclasses.asdict(config).items() if v is not None}
            row["rule"], row["schedule"] = config.rule, config.verify_schedule
            if label in drafters:
                row["drafter"] = drafters[label].name
            if probe is not None:
                row.update(probe.measure(config, drafter=drafters.get(label)))
                results.update(probe.summary)
            results["runs"][label] = row
            log(f"  {label:28s} NFE {row['nfe']:6.1f}  TPF {row['tokens_per_forward']:5.2f}  "
                f"latency {row['latency_median_s'] * 1e3:7.1f} ms" +
                (f"  adherence {row['adherence']:.1%}  FD {row['fd']:.1f}" if "fd" in row else ""))

    configs = dict(runs)
    measure(configs)
    best = best_relaxed(results)
    if best and args.skip_on_best:  # VVS's claim: skipping on top of a relaxed acceptance adds tokens per forward
        results["best_relaxed"] = best
        extra = {f"vvs on {best}": dataclasses.replace(configs[best], schedule="uniform").validate(),
                 f"vvs-sim on {best}": dataclasses.replace(configs[best], schedule="similarity").validate()}
        if best in drafters:  # skipping on the drafter's drafts
            drafters.update({label: drafters[best] for label in extra})
        measure({label: c for label, c in extra.items() if label not in results["runs"]})
        configs = {**extra, **configs}
    for batch in sorted(set(args.batch) - {1}):
        log(f"batch {batch} ({args.repeats} repeats):")
        measured = {label: configs[label] for label in results["runs"]}
        for label, row in batch_speed(model, measured, prompts, batch, args.repeats, log, drafters).items():
            results["runs"][label].setdefault("batches", {})[str(batch)] = row
    ar = results["runs"]["ar"]
    for row in results["runs"].values():
        row["nfe_reduction"] = ar["nfe"] / row["nfe"]
        row["speedup"] = ar["latency_median_s"] / row["latency_median_s"]
        for b, at in row.get("batches", {}).items():
            at["speedup"] = ar["batches"][b]["latency_median_s"] / at["latency_median_s"]
    if args.scaling:
        log("scaling with image tokens (synthetic model):")
        results["scaling_tokens"] = scaling_tokens(args.modes, device, log)
        log("scaling with batch size:")
        results["scaling_batch"] = scaling_batch(model, args.modes, prompts, log)
    return results


def main(argv=None) -> int:
    """``spec-ar bench [options]``, ``spec-ar bench overhead [options]`` (the engine's own cost), or
    ``spec-ar bench storage [options]`` (weight storage options side by side), ``spec-ar bench gpu
    [options]`` (bandwidth, 7B-class forwards against their floor, the embedded model per mode), or
    ``spec-ar bench auto-window [options]`` (the window on auto, quiet and beside busy processes), or ``spec-ar
    bench cards [options]`` (what fits a card of each size), ``spec-ar bench stages [options]`` (a model of
    stages rendered with its stages taking turns in memory, measured), or ``spec-ar bench leave [options]``
    (finished images leaving the batch against riding along)."""
    from ..embedded_tools.demo import PROMPTS
    from .sweeps import sweep_help

    argv = list(argv or [])
    if argv[:1] == ["overhead"]:
        from .overhead import main as overhead

        return overhead(argv[1:])
    if argv[:1] == ["storage"]:
        from .storage import main as storage

        return storage(argv[1:])
    if argv[:1] == ["gpu"]:
        from .gpu import main as gpu

        return gpu(argv[1:])
    if argv[:1] == ["cards"]:
        from .cards import main as cards

        return cards(argv[1:])
    if argv[:1] == ["stages"]:
        from .stages import main as stages

        return stages(argv[1:])
    if argv[:1] == ["leave"]:
        from .leave import main as leave

        return leave(argv[1:])
    if argv[:1] == ["auto-window"]:
        from .auto_window import main as auto_window

        return auto_window(argv[1:])

    ap = argparse.ArgumentParser(prog="spec-ar bench", description=__doc__, epilog=sweep_help(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded", help="checkpoint file or folder (any family), or 'embedded'")
    ap.add_argument("--vq", help="VQ tokenizer file, where the family keeps it apart (LlamaGen)")
    ap.add_argument("--text-encoder", help="T5 folder for LlamaGen t2i")
    ap.add_argument("--drafter", help="a draft head folder or a sibling model that drafts for --model ('embedded' / "
                                      "'embedded-sibling': the embedded model's shipped head / sibling): every "
                                      "drafted setting is run twice, with Jacobi drafts and with this model's "
                                      "(labelled '+ drafter')")
    ap.add_argument("--resolution", type=int)
    ap.add_argument("--prompts", default=str(PROMPTS))
    ap.add_argument("--modes", nargs="+", default=["ar", "sjd", "gsd", "lantern", "vvs"])
    ap.add_argument("--sweep", nargs="*", default=[], help="e.g. gsd:G=1,3,10,25,50,100 lantern:delta=0.1,0.2,0.4")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quality-images", type=int, default=200)
    ap.add_argument("--quality-batch", type=int, default=50)
    ap.add_argument("--batch", type=int, nargs="+", default=[1], metavar="B",
                    help="batch sizes to time (batch 1 always; larger ones: batch latency and images/s per setting)")
    ap.add_argument("--scaling", action="store_true")
    ap.add_argument("--no-skip-on-best", dest="skip_on_best", action="store_false",
                    help="do not add VVS skipping (uniform and similarity) on the best relaxed setting")
    ap.add_argument("--device")
    ap.add_argument("--dtype", default="auto", help="how the weights are stored, as spec-ar render --dtype")
    ap.add_argument("--offload", action="store_true", help="as spec-ar render --offload")
    ap.add_argument("--decode-path", default="auto", help="as spec-ar render --decode-path")
    ap.add_argument("--out", default="out/bench")
    args = ap.parse_args(argv)
    from ..output_folders import writable_folder
    from .report import write

    out = writable_folder(args.out, "--out")  # before an hour of measuring, not after
    results = run(args)
    write(results, out)
    print(f"wrote {out / 'report.md'}, {out / 'results.json'} and charts in {out}/")
    return 0


def dump(results: dict, path: pathlib.Path):
    path.write_text(json.dumps(results, indent=1, default=float))
