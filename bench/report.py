"""The benchmark's report: JSON, markdown tables and charts."""
from __future__ import annotations

import json
import pathlib
from collections import defaultdict

from ..charts import Series, bars, chart


def _int_keys(d: dict) -> dict:
    """JSON turns int keys into strings; accept both."""
    return {int(k): v for k, v in d.items()}


def _family(label: str) -> str:
    return label.split()[0]


def write(results: dict, out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
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
                    series.append(Series(fam, [r[xkey] for _, r in items], [r[metric] for _, r in items],
                                         labels=[lbl[len(fam):].strip() for lbl, _ in items]))
                path = f"{fname}_{metric}.png"
                chart(series, title=f"{name} against {xname}", xlabel=xname, ylabel=name).save(out / path)
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


def markdown(results: dict, charts: list[str]) -> str:
    runs = results["runs"]
    q = all("adherence" in r for r in runs.values())
    lines = [f"Model: {results['model']} on {results['device']} ({results['dtype']}, torch {results['torch']}, "
             f"{results['threads']} threads). Latency: batch 1, median over {len(results['prompts'])} prompts x "
             f"seeds {results['seeds']} x {results['repeats']} repeats (device-synchronised), spread = "
             "interquartile range. Speed-up and NFE reduction are against `ar` in the same run.", "",
             *([f"CPU only: no CUDA device on this machine ({results.get('cpu', 'CPU')}); on a GPU the same command "
                "runs in bfloat16 and the model share of each step grows.", ""] if results["device"] == "cpu"
               else []),
             "| setting | NFE | NFE reduction | tokens/forward | MAL | latency ms (IQR) | speed-up | outside forwards "
             "| memory MB |" + (" adherence | FD |" if q else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if q else "")]
    for label, r in runs.items():
        row = (f"| {label} | {r['nfe']:.1f} | {r['nfe_reduction']:.2f}x | {r['tokens_per_forward']:.2f} | "
               f"{r['mean_accepted_length']:.2f} | {r['latency_median_s'] * 1e3:.0f} "
               f"({r['latency_q1_s'] * 1e3:.0f}-{r['latency_q3_s'] * 1e3:.0f}) | {r['speedup']:.2f}x | "
               f"{r['outside_forwards']:.0%} | {r['memory_mb']:.1f} |")
        if q:
            row += f" {r['adherence']:.1%} | {r['fd']:.1f} |"
        lines.append(row)
    if q:
        other = results["ar_other_seeds"]
        lines += ["", f"Noise floor: Frechet distance between two `ar` runs with different seeds = "
                      f"{results['noise_floor_fd']:.1f}; `ar` with the other seeds: adherence "
                      f"{other['adherence']:.1%}, FD to real {other['fd']:.1f}."]
    lines += ["", "| paper | their model | their headline figures |", "|---|---|---|"]
    from .run import PAPERS

    lines += [f"| {a} | {b} | {c} |" for a, b, c in PAPERS]
    lines += [""] + [f"![{c}]({c})" for c in charts]
    return "\n".join(lines) + "\n"
