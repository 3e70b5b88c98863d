"""The demo: the shipped prompt list rendered with the embedded model in every mode.

    spec-ar demo [--out out/demo]

Writes one PNG per prompt and mode, a contact sheet, and a report (markdown and
JSON) with, per mode, forward passes (NFE), tokens per forward, latency and
speed-up against ``ar`` measured in the same run, and prompt adherence as the
judge sees it; plus how uncertain the model's next-token distributions are.
"""
from __future__ import annotations

import json
import pathlib
import time

import numpy as np
import torch

MODES = ("ar", "sjd", "gsd", "lantern", "vvs")
PROMPTS = pathlib.Path(__file__).with_name("prompts.txt")


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """``[B, 3, H, W]`` in [0, 1] -> ``[B, H, W, 3]`` uint8."""
    return (images.permute(0, 2, 3, 1).cpu().numpy() * 255).round().astype(np.uint8)


def contact_sheet(rows: list[np.ndarray], scale: int = 3, gap: int = 4) -> np.ndarray:
    """Rows of ``[N, H, W, 3]`` images -> one uint8 picture."""
    n, h, w, _ = rows[0].shape
    H, W = h * scale, w * scale
    sheet = np.full((len(rows) * (H + gap) + gap, n * (W + gap) + gap, 3), 255, np.uint8)
    for r, imgs in enumerate(rows):
        for c, img in enumerate(imgs):
            y, x = gap + r * (H + gap), gap + c * (W + gap)
            sheet[y:y + H, x:x + W] = img.repeat(scale, 0).repeat(scale, 1)
    return sheet


@torch.no_grad()
def run(out: pathlib.Path, seed: int = 0, modes=MODES, prompts_file=PROMPTS, weights=None, log=print) -> dict:
    from PIL import Image

    from ..loaders import embedded
    from ..sampling import DecodeConfig, SpeculativeDecoder
    from . import judge as judging

    t0 = time.perf_counter()
    weights = pathlib.Path(weights or embedded.FOLDER)
    model = embedded.load(weights)
    judge = judging.load_judge(weights / "judge.safetensors")
    prompts = [p.strip() for p in pathlib.Path(prompts_file).read_text().splitlines() if p.strip()]
    out.mkdir(parents=True, exist_ok=True)
    log(f"{model.name}: {len(prompts)} prompts from {prompts_file}, batch of {len(prompts)}, "
        f"seeds {seed}..{seed + len(prompts) - 1}, CPU threads {torch.get_num_threads()}")
    results, rows = {}, []
    for mode in modes:
        decoder = SpeculativeDecoder(model.adapter, DecodeConfig(mode=mode))
        decoder.generate(prompts[:1], seeds=seed)  # warm-up: first-call costs stay out of the timing
        res = decoder.generate(prompts, seeds=seed)
        images = to_uint8(model.decode(res.image_tokens(model.adapter.layout)))
        rows.append(images)
        for i, img in enumerate(images):
            Image.fromarray(img).save(out / f"{mode}_{i:02d}.png")
        reports = res.reports
        nfe = float(np.mean([r.nfe for r in reports]))
        results[mode] = {
            "nfe": nfe, "tokens": reports[0].tokens, "tokens_per_forward": reports[0].tokens / nfe,
            "mean_accepted_length": float(np.mean([r.mean_accepted_length for r in reports])),
            "skipped_verifications": float(np.mean([r.skipped_verifications for r in reports])),
            "latency_s": reports[0].latency_s, "engine_share": reports[0].engine_time_s / reports[0].latency_s,
            "adherence": judging.adherence(judge, images, prompts), "settings": reports[0].settings,
            "reports": [r.to_dict() for r in reports],
        }
        if mode == "ar":  # how peaked is the model?  top-1 probability of every token's distribution
            top1 = decoder.target_probabilities(prompts, res.tokens).flatten()
            results["uncertainty"] = {"top1_below_0.5": float((top1 < 0.5).float().mean()),
                                      "top1_below_0.1": float((top1 < 0.1).float().mean()),
                                      "top1_median": float(top1.median()), "tokens": int(top1.numel())}
        a = results[mode]["adherence"]
        log(f"  {mode:8s} NFE {nfe:6.1f}  {results[mode]['tokens_per_forward']:.2f} tokens/forward  "
            f"{reports[0].latency_s:.2f} s  adherence {a['all']:.0%}")
    ar = results.get("ar", {}).get("latency_s")
    for mode in modes:
        results[mode]["speedup"] = ar / results[mode]["latency_s"] if ar else None
    Image.fromarray(contact_sheet(rows)).save(out / "contact_sheet.png")
    results["prompts"], results["seed"] = prompts, seed
    results["wall_s"] = time.perf_counter() - t0
    (out / "report.json").write_text(json.dumps(results, indent=1))
    (out / "report.md").write_text(markdown(results, modes))
    log(f"\nwrote {out / 'report.md'}, {out / 'report.json'}, {out / 'contact_sheet.png'} and "
        f"{len(prompts) * len(modes)} images in {out}/ ({results['wall_s']:.0f} s)")
    return results


def markdown(res: dict, modes) -> str:
    lines = ["# Speculative AR demo: the embedded model in every mode", "",
             f"{len(res['prompts'])} prompts decoded as one batch on CPU, seed {res['seed']}. Latency is the "
             "batch's wall-clock time, device-synchronised; speed-up is against `ar` in the same run. Adherence: "
             "share of images whose colour, shape and position the judge reads as prompted.", "",
             "| mode | NFE | tokens / forward | MAL | latency s | speed-up | outside forwards | adherence |",
             "|---|---|---|---|---|---|---|---|"]
    for m in modes:
        r = res[m]
        lines.append(f"| {m} | {r['nfe']:.1f} | {r['tokens_per_forward']:.2f} | {r['mean_accepted_length']:.2f} | "
                     f"{r['latency_s']:.2f} | {r['speedup']:.2f}x | {r['engine_share']:.0%} | "
                     f"{r['adherence']['all']:.0%} |")
    u = res.get("uncertainty")
    if u:
        lines += ["", f"Next-token uncertainty (AR run, default sampling): {u['top1_below_0.5']:.0%} of "
                      f"{u['tokens']} tokens have a top-1 probability below 0.5, {u['top1_below_0.1']:.0%} below 0.1 "
                      f"(median {u['top1_median']:.2f})."]
    lines += ["", "![contact sheet: one row per mode, in the order of the table](contact_sheet.png)", "",
              "Prompts:", ""] + [f"{i}. {p}" for i, p in enumerate(res["prompts"])]
    return "\n".join(lines) + "\n"
