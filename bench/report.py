"""The benchmark's report: JSON, markdown tables and charts."""
from __future__ import annotations

import json
import math
import pathlib
from collections import defaultdict

from ..charts import Series, bars, chart

ADHERENCE_MARGIN = 0.02  # issue 7: "prompt adherence within 2 points of ar"
PAPERS = [  # the papers' headline figures, on their models
    ("SJD (Teng et al., ICLR 2025)", "Lumina-mGPT 7B, 768 px", "2.22x fewer steps, 2.04x latency, FID 30.85 vs 30.76"),
    ("GSD (So et al., ICCV 2025)", "Lumina-mGPT 7B, Parti, G=50",
     "3.76x fewer NFE, 4.65x latency, CLIP 32.075 vs 32.091"),
    ("LANTERN (Jang et al., ICLR 2025)", "LlamaGen-XL stage I, delta 0.4 k 1000", "MAL 2.40, 1.69x latency"),
    ("VVS (Dong et al., 2025)", "LlamaGen-XL stage II, uniform i=2, delta 0.1", "TPF 2.86, 1.76x latency"),
]


def _int_keys(d: dict) -> dict:
    """JSON turns int keys into strings; accept both."""
    return {int(k): v for k, v in d.items()}


def _family(label: str) -> str:
    """The curve a setting belongs to in the Pareto charts: its mode plus any swapped part
    (``vvs schedule=similarity``) or its draft model; "X on Y" settings stand alone."""
    if label.endswith(" + drafter"):
        return _family(label[: -len(" + drafter")]) + " + drafter"
    if " on " in label:
        return label
    mode, *knobs = label.split()
    return " ".join([mode] + [k for k in knobs if k.startswith(("schedule=", "acceptance="))])


def _point(label: str, family: str) -> str:
    """A setting's label on its family's curve: the knobs the family does not name."""
    return " ".join(w for w in label.split() if w not in family.split())


def write(results: dict, out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    results["targets"] = targets(results)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=float))
    runs = results["runs"]
    quality = all("adherence" in r for r in runs.values())
    charts = []
    base = [label for label in runs if " " not in label]
    bars({m: runs[m]["nfe_reduction"] for m in base}, title="Fewer forward passes than ar (x)",
         ylabel="NFE reduction").save(out / "modes_nfe.png")
    bars({m: runs[m]["speedup"] for m in base}, title="Latency speed-up over ar (x), batch 1",
         ylabel="speed-up").save(out / "modes_latency.png")
    charts += ["modes_nfe.png", "modes_latency.png"]
    if quality:
        groups = defaultdict(list)
        for label, r in runs.items():
            groups[_family(label)].append((label, r))
        for metric, name in (("adherence", "prompt adherence"), ("fd", "Frechet distance to real renders")):
            for xkey, xname, fname in (("nfe", "forward passes (NFE)", "pareto_nfe"),
                                       ("latency_median_s", "latency per image, s", "pareto_latency")):
                series = []
                for fam, items in groups.items():
                    items = sorted(items, key=lambda kv: kv[1][xkey])
                    points = [_point(lbl, fam) for lbl, _ in items]
                    knobs = {w.split("=")[0] for p in points for w in p.split()}
                    series.append(Series(fam, [r[xkey] for _, r in items], [r[metric] for _, r in items],
                                         labels=points, line=len(knobs) <= 1))  # a curve only along one knob
                path = f"{fname}_{metric}.png"
                chart(series, title=f"{name} against {xname}", xlabel=xname, ylabel=name,
                      size=(960, 560)).save(out / path)
                charts.append(path)
    if "scaling_tokens" in results:
        st = _int_keys(results["scaling_tokens"])
        tokens = sorted(st)
        modes = list(st[tokens[0]])
        for key, name in (("nfe", "forward passes"), ("latency_s", "latency, s")):
            chart([Series(m, tokens, [st[t][m][key] for t in tokens]) for m in modes],
                  title=f"{name} against image tokens (synthetic model)", xlabel="image tokens",
                  ylabel=name).save(out / f"scaling_tokens_{key}.png")
            charts.append(f"scaling_tokens_{key}.png")
    if "scaling_batch" in results:
        sb = _int_keys(results["scaling_batch"])
        sizes = sorted(sb)
        modes = list(sb[sizes[0]])
        chart([Series(m, sizes, [sb[b][m]["images_per_s"] for b in sizes]) for m in modes],
              title="images per second against batch size", xlabel="batch",
              ylabel="images / s").save(out / "scaling_batch.png")
        charts.append("scaling_batch.png")
    (out / "report.md").write_text(markdown(results, charts))


def targets(results: dict) -> list[dict]:
    """Issue 7's targets on the embedded model, each with what was measured and a verdict."""
    runs = results["runs"]
    ar = runs["ar"]
    if "adherence" not in ar:
        return []
    out = []
    floor = results["fd_noise_floor"]
    if "sjd" in runs:
        r = runs["sjd"]
        gap = abs(r["fd"] - ar["fd"])
        out.append({"target": "`sjd`: >= 2x fewer forward passes than `ar`, quality inside the noise floor",
                    "measured": f"{r['nfe_reduction']:.2f}x fewer; FD to real {r['fd']:.1f} vs `ar` {ar['fd']:.1f} "
                                f"(gap {gap:.1f}, noise floor {floor:.1f}); FD to `ar` samples {r['fd_to_ar']:.1f}",
                    "met": bool(r["nfe_reduction"] >= 2 and gap <= floor)})
    gsd = {lbl: r for lbl, r in runs.items() if _family(lbl) == "gsd"}
    if gsd:
        kept = {lbl: r for lbl, r in gsd.items() if r["adherence"] >= ar["adherence"] - ADHERENCE_MARGIN}
        best = max(kept or gsd, key=lambda lbl: (kept or gsd)[lbl]["nfe_reduction"])
        r = gsd[best]
        out.append({"target": "`gsd` at its best setting: >= 3.5x fewer forward passes, prompt adherence within "
                              "2 points of `ar`",
                    "measured": f"`{best}`: {r['nfe_reduction']:.2f}x fewer; adherence {r['adherence']:.1%} vs `ar` "
                                f"{ar['adherence']:.1%}" + ("" if kept else " (no `gsd` setting kept adherence)"),
                    "met": bool(kept and r["nfe_reduction"] >= 3.5)})
    best = results.get("best_relaxed")
    if best and f"vvs on {best}" in runs:
        base, r = runs[best], runs[f"vvs on {best}"]
        out.append({"target": "`vvs` on top of the best relaxed acceptance beats that acceptance alone in tokens "
                              "per forward",
                    "measured": f"best relaxed `{best}` {base['tokens_per_forward']:.2f} tokens/forward; with VVS "
                                f"uniform skipping {r['tokens_per_forward']:.2f} (adherence {r['adherence']:.1%} vs "
                                f"{base['adherence']:.1%})",
                    "met": bool(r["tokens_per_forward"] > base["tokens_per_forward"])})
    return out


def _se(p: float, n: int) -> float:
    """Binomial standard error of a share, in points."""
    return 100 * math.sqrt(max(p * (1 - p), 1e-12) / max(n, 1))


def markdown(results: dict, charts: list[str]) -> str:
    runs = results["runs"]
    q = all("adherence" in r for r in runs.values())
    nll = all("target_nll" in r for r in runs.values())  # older results.json files lack it
    rss = all("peak_rss_mb" in r for r in runs.values())  # Linux only; older files lack it
    stab = all("draft_stability" in r for r in runs.values())  # older files lack these
    per_fwd = all("engine_ms_per_forward" in r for r in runs.values())
    batches = sorted({int(b) for r in runs.values() for b in r.get("batches", {})})
    lines = [f"Model: {results['model']} on {results['device']} ({results['dtype']}, torch {results['torch']}, "
             f"{results['threads']} threads). Latency: batch 1, median over {len(results['prompts'])} prompts x "
             f"seeds {results['seeds']} x {results['repeats']} repeats (device-synchronised), spread = "
             "interquartile range. Speed-up and NFE reduction are against `ar` in the same run.", "",
             *([f"CPU only: no CUDA device on this machine ({results.get('cpu', 'CPU')}); on a GPU the same command "
                "runs in bfloat16 and the model share of each step grows.", ""] if results["device"] == "cpu"
               else []),
             "| setting | NFE | NFE reduction | tokens/forward | MAL |" + (" drafts kept |" if stab else "")
             + " latency ms (IQR) | speed-up |" + "".join(f" batch {b}: ms / speed-up |" for b in batches)
             + " outside forwards |" + (" engine ms / forward (median) |" if per_fwd else "")
             + " memory MB |" + (" peak RSS MB |" if rss else "") + (" target NLL |" if nll else "")
             + (" adherence | colour / shape / position | FD to real | FD to `ar` |" if q else ""),
             "|" + "---|" * (9 + stab + len(batches) + per_fwd + rss + nll + 4 * q)]
    for label, r in runs.items():
        row = (f"| {label} | {r['nfe']:.1f} | {r['nfe_reduction']:.2f}x | {r['tokens_per_forward']:.2f} | "
               f"{r['mean_accepted_length']:.2f} |" + (f" {r['draft_stability']:.0%} |" if stab else "")
               + f" {r['latency_median_s'] * 1e3:.0f} ({r['latency_q1_s'] * 1e3:.0f}-{r['latency_q3_s'] * 1e3:.0f}) "
               f"| {r['speedup']:.2f}x |")
        for b in batches:
            at = r.get("batches", {}).get(str(b))
            row += f" {at['latency_median_s'] * 1e3:.0f} / {at['speedup']:.2f}x |" if at else " - |"
        row += f" {r['outside_forwards']:.0%} |" + (f" {r['engine_ms_per_forward']:.2f} |" if per_fwd else "")
        row += f" {r['memory_mb']:.1f} |"
        if rss:
            row += f" {r['peak_rss_mb']:.0f} |"
        if nll:
            row += f" {r['target_nll']:.3f} ± {r['target_nll_se']:.3f}" + (
                f" ({r['zero_mass_tokens']:.1%} zero-mass)" if r["zero_mass_tokens"] else "") + " |"
        if q:
            parts = " / ".join(f"{r['adherence_parts'][k]:.0%}" for k in ("colour", "shape", "position"))
            fd_ar = "-" if label == "ar" else f"{r['fd_to_ar']:.1f}"
            row += f" {r['adherence']:.1%} | {parts} | {r['fd']:.1f} | {fd_ar} |"
        lines.append(row)
    if stab:
        lines += ["", "Drafts kept: the share of re-drafted positions whose draft survived a pass unchanged "
                      "(draft stability; coupled drafting raises it)."]
    if batches:
        lines += ["", "Batch B: latency of a whole batch of B images (the prompt list cycled; median over the "
                      "repeats) and the speed-up against `ar` at the same batch size."]
    if rss:
        lines += ["", "Memory MB: engine state and KV cache at the end of a run on CPU, peak allocated on CUDA. "
                      "Peak RSS MB: the whole process's peak resident memory during a run (weights included)."]
    if nll:
        lines += ["", "Target NLL: nats per image token that the model, with the setting's own guidance and "
                      "sampling settings, assigns the image tokens the setting committed (mean over the latency "
                      "runs ± standard error). A lossless setting matches `ar` within the error; a relaxed one "
                      "that accepts tokens the target finds unlikely scores higher."]
    if q:
        other = results["ar_other_seeds"]
        lines += ["", f"Noise floor: Frechet distance between two `ar` runs with different seeds = "
                      f"{results['fd_noise_floor']:.1f}; `ar` with the other seeds: adherence "
                      f"{other['adherence']:.1%}, FD to real {other['fd']:.1f}. Adherence is over "
                      f"{other['quality_images']} images (standard error about "
                      f"{_se(runs['ar']['adherence'], other['quality_images']):.1f} points per setting).",
                  "", "FD to `ar`: the distance between a setting's samples and `ar`'s (same prompts and seeds); "
                      "a lossless setting lands near the noise floor."]
        goals = results["targets"]
        if goals:
            lines += ["", "### Targets", "", "| target | measured | verdict |", "|---|---|---|"]
            lines += [f"| {g['target']} | {g['measured']} | {'met' if g['met'] else 'MISSED'} |" for g in goals]
    lines += ["", "| paper | their model | their headline figures |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in PAPERS]
    lines += [""] + [f"![{c}]({c})" for c in charts]
    return "\n".join(lines) + "\n"
