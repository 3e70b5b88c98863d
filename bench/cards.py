"""What fits a card of each size: the loader's sizing (``loaders/sizing.py``) for a model's every storage
option, whole and with its blocks offloaded, and the batch each leaves room for at one image size.

    spec-ar bench cards --model FOLDER [--layers N] [--cards 12 16 24 48 80] [--system GB] [--width W --height H]
                        [--mode sjd] [--link GB/s] [--out DIR]

The weights come from the checkpoint's headers; what an image needs while decoding (its KV cache and the
engine's state) from the engine's own estimate, on the model loaded here (in bfloat16, on the CPU: the
estimate is the one the sampler checks before a batch).  ``--layers N`` sizes the model as if it had N
blocks where the folder has fewer (the full shape at a fraction of its layers, written by ``python -m
spec_ar.bench.scale_checkpoints --layers``): the blocks' weights and the KV cache grow with the layer count,
nothing else does.  ``--link``: the host link an offloaded forward streams its blocks over (default 25 GB/s,
PCIe 4.0 x16 as measured by users; the H100 here measured 55 GB/s on PCIe 5), for the floor of a forward.
A model of stages that take turns in memory (GLM-Image: the AR model, then the DiT) is sized stage by stage:
each option's AR weights and batch as above, the DiT (in the full dtype) beside one image's work alone on the
card, and how the stage not running waits (``sizing.stage_wait``: ``none``, both on the card; ``system``, in
system memory; ``files``, read again from disk).  Writes ``cards.json`` and ``report.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import pathlib

GB = 1e9


def per_image(model, mode: str, prompt: str = "a red fox in the snow") -> dict[str, int]:
    from ..sampling import DecodeConfig, SpeculativeDecoder

    engine = SpeculativeDecoder(model.adapter, DecodeConfig(mode=mode))
    return engine.memory_per_image([prompt])


def main(argv=None) -> int:
    from ..loaders.detect import BY_NAME, detect, load_model
    from ..loaders.sizing import plans, split, stage_wait
    from ..loaders.storage import checkpoint_files
    from ..sampling.config import ConfigError

    ap = argparse.ArgumentParser(prog="spec-ar bench cards", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--layers", type=int, help="size as if the model had this many blocks (default: as it has)")
    ap.add_argument("--cards", type=float, nargs="+", default=[12, 16, 24, 48, 80], help="card memory, GB")
    ap.add_argument("--system", type=float, default=64, help="system memory for offloaded blocks, GB (default 64)")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--height", type=int, default=1024)
    ap.add_argument("--mode", default="sjd")
    ap.add_argument("--link", type=float, default=25.0, help="host link of an offloaded forward, GB/s")
    ap.add_argument("--storages", nargs="+", default=["bfloat16", "int8", "fp8", "nf4"])
    ap.add_argument("--out", default="out/bench-cards")
    args = ap.parse_args(argv)

    model = load_model(args.model, width=args.width, height=args.height, dtype="bfloat16")
    image = per_image(model, args.mode)
    hit = detect(args.model)
    files, keep = checkpoint_files(hit.path), BY_NAME[hit.family].reads  # what the loader reads
    present = split(files, "bfloat16", keep=keep).count
    grow = (args.layers or present) / present
    image["KV cache"] = int(image["KV cache"] * grow)  # a layer's cache per layer
    need = sum(image.values())
    dit = model.decode.dit if model.turns is not None else None  # the second stage's weights and one image's work
    dit_bytes, dit_image = (dit.weight_bytes(), model.decode_bytes_per_image) if dit is not None else (0, 0)
    rows = []
    for size in args.cards:
        for p in plans(files, size * GB, args.system * GB, need, args.storages, blocks=args.layers, keep=keep):
            system = p.system / GB
            row = {"card_gb": size, "storage": p.storage, "offload": p.offload, "weights_gb": p.card / GB,
                   "system_gb": system, "streamed_ms": system / args.link * 1e3 if p.offload else None,
                   "batch": p.batch}
            if dit is not None:
                try:
                    row["stages"] = stage_wait({"AR": p.card, "DiT": dit_bytes}, "cuda", dit_image, card=size * GB,
                                               system=args.system * GB - p.system)
                except ConfigError:  # the DiT does not fit the card even alone
                    row["stages"], row["batch"] = None, 0
            rows.append(row)
    report = {"model": str(args.model), "layers": args.layers or present, "layers_in_folder": present,
              "width": args.width, "height": args.height, "mode": args.mode, "system_gb": args.system,
              "link_gb_s": args.link, "per_image": image, "per_image_gb": need / GB, "rows": rows,
              **({"dit_gb": dit_bytes / GB, "dit_per_image_gb": dit_image / GB} if dit is not None else {})}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cards.json").write_text(json.dumps(report, indent=1))
    (out / "report.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def pick(rows: list[dict]) -> dict | None:
    """The option the sizing answers with: whole before offloaded (no per-forward stream), then the
    widest storage (least lossy); offloaded, the narrowest (fewest bytes over the link)."""
    whole = [r for r in rows if r["batch"] and not r["offload"]]
    if whole:
        return max(whole, key=lambda r: r["weights_gb"])
    offloaded = [r for r in rows if r["batch"]]
    return min(offloaded, key=lambda r: r["system_gb"]) if offloaded else None


def markdown(report: dict) -> str:
    image = ", ".join(f"{k} {v / GB:.2f} GB" for k, v in report["per_image"].items() if v)
    lines = [f"{report['model']}: {report['layers']} blocks (the folder has {report['layers_in_folder']}), "
             f"{report['width']}x{report['height']} px, `{report['mode']}`: per image {image}; offloaded blocks in "
             f"{report['system_gb']:.0f} GB of system memory over a {report['link_gb_s']:.0f} GB/s link"
             + (f"; its second stage, the DiT, {report['dit_gb']:.1f} GB of weights and "
                f"{report['dit_per_image_gb']:.2f} GB per image, taking turns with it (stages: where the one not "
                "running waits)" if "dit_gb" in report else ""), "",
             "| card | answer | weights on the card | in system memory | batch | every option that fits (batch) |",
             "|---|---|---|---|---|---|"]
    for size in dict.fromkeys(r["card_gb"] for r in report["rows"]):
        rows = [r for r in report["rows"] if r["card_gb"] == size]
        best = pick(rows)
        every = ", ".join(f"{_label(r)} ({r['batch']})" for r in rows if r["batch"]) or "none"
        if best is None:
            lines.append(f"| {size:g} GB | nothing fits | | | | {every} |")
            continue
        system = f"{best['system_gb']:.1f} GB (a forward streams it: {best['streamed_ms']:.0f} ms at the link)" \
            if best["offload"] else "-"
        lines.append(f"| {size:g} GB | {_label(best)} | {best['weights_gb']:.1f} GB | {system} | {best['batch']} | "
                     f"{every} |")
    return "\n".join(lines) + "\n"


def _label(r: dict) -> str:
    return r["storage"] + (" + offload" if r["offload"] else "") + (f", stages: {r['stages']}" if r.get("stages")
                                                                     else "")
