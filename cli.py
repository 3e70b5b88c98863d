"""The ``spec-ar`` command line."""
from __future__ import annotations

import argparse
import json
import pathlib
import sys


def _demo(args) -> int:
    import torch
    from PIL import Image

    from .loaders.synthetic import SyntheticAdapter
    from .sampling import ConfigError, DecodeConfig, SpeculativeDecoder
    from .sampling.report import ORIGINS, accept_map

    torch.manual_seed(0)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = SyntheticAdapter(codebook=1024, rows=16, cols=16, hidden=128, layers=2, end_of_line=True,
                             sharpness=3.0, seed=0)
    prompts = list(range(args.batch))
    rows, results = [], {}
    print("Engine demo on a random-weight synthetic model (1024 codes, 16x16 tokens with end-of-line).")
    print("It shows the decoding machinery, not images: the embedded trained model comes with the demo proper.\n")
    for mode in ("ar", "sjd", "gsd", "lantern", "vvs"):
        try:
            cfg = DecodeConfig(mode=mode, window=args.window, lantern_k=100, top_k=200)
            decoder = SpeculativeDecoder(model, cfg)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        decoder.generate(prompts, seeds=args.seed)  # warm-up
        res = decoder.generate(prompts, seeds=args.seed)
        results[mode] = [r.to_dict() for r in res.reports]
        rep = res.reports[0]
        nfe = sum(r.nfe for r in res.reports) / len(res.reports)
        rows.append((mode, nfe, rep.tokens / nfe, sum(r.mean_accepted_length for r in res.reports) / len(res.reports),
                     rep.latency_s * 1000, rep.engine_time_s / rep.latency_s))
        Image.fromarray(accept_map(rep.origins, model.layout.row_stride)).save(out / f"accept_map_{mode}.png")
    ar_latency = rows[0][4]
    header = "| mode | NFE | tokens/forward | MAL | latency ms | speed-up vs ar | outside forwards |"
    lines = [header, "|" + "---|" * 7]
    for mode, nfe, tpf, mal, ms, share in rows:
        speedup = ar_latency / ms
        lines.append(f"| {mode} | {nfe:.1f} | {tpf:.2f} | {mal:.2f} | {ms:.0f} | {speedup:.2f}x | {share:.0%} |")
    table = "\n".join(lines)
    print(table)
    legend = "\n".join(f"- {name}" for name in ORIGINS.values())
    (out / "report.md").write_text(
        "# Engine demo (synthetic random-weight model)\n\n"
        f"Batch {args.batch}, window {args.window}, seed {args.seed}, CPU.\n\n{table}\n\n"
        f"Accept maps (`accept_map_<mode>.png`, first image) colour each token by how it was obtained:\n{legend}\n"
    )
    (out / "report.json").write_text(json.dumps(results, indent=1))
    print(f"\nWrote {out / 'report.md'}, {out / 'report.json'} and accept maps in {out}/")
    return 0


def _config_args(ap: argparse.ArgumentParser):
    """One option per decoding setting (``--group-size``, ``--lantern-delta``, ...)."""
    import dataclasses

    from .sampling.config import DecodeConfig

    group = ap.add_argument_group("decoding settings (defaults: the mode's and the model family's)")
    for f in dataclasses.fields(DecodeConfig):
        if f.name == "mode":
            continue
        kind = {"int": int, "float": float, "str": str}.get(str(f.type).split(" |")[0], float)
        group.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=kind, default=None,
                           help=f"default: {f.default}")


def _render(args) -> int:
    import dataclasses

    import torch
    from PIL import Image

    from .loaders.checkpoints import CheckpointError
    from .loaders.detect import load_model
    from .sampling import ConfigError, DecodeConfig, SpeculativeDecoder

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[
        args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")]
    names = {f.name for f in dataclasses.fields(DecodeConfig)} - {"mode"}
    settings = {k: v for k, v in vars(args).items() if k in names and v is not None}
    try:
        config = DecodeConfig(mode=args.mode, **settings).validate()
        model = load_model(args.model, args.vq, args.text_encoder, args.resolution, device, dtype)
        if args.resolution and args.resolution != model.resolution:
            raise ConfigError(f"resolution must be one of {list(model.resolutions)} for {model.name} "
                              f"(got {args.resolution})")
        if model.condition == "class":
            if args.class_id is None:
                raise ConfigError(f"{model.name} is class-conditional: give --class-id")
            conditions = [args.class_id] * args.batch
        else:
            if args.prompt is None:
                raise ConfigError(f"{model.name} is text-conditional: give --prompt")
            conditions = [args.prompt] * args.batch
        if model.decode is None:
            raise ConfigError(f"{model.name} needs its VQ decoder to make images: give --vq")
        decoder = SpeculativeDecoder(model.adapter, config)
        result = decoder.generate(conditions, seeds=args.seed)
    except (ConfigError, CheckpointError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    images = model.decode(result.image_tokens(model.adapter.layout))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for i, img in enumerate(images):
        name = out / f"{args.mode}_{args.seed + i}.png"
        Image.fromarray((img.permute(1, 2, 0).cpu().numpy() * 255).round().astype("uint8")).save(name)
        files.append(str(name))
    report = {"model": model.name, "family": model.family, "resolution": model.resolution, "device": device,
              "dtype": str(dtype), "images": files, "reports": [r.to_dict() for r in result.reports]}
    (out / f"{args.mode}_{args.seed}.json").write_text(json.dumps(report, indent=1))
    print(result.reports[0].summary())
    print(f"wrote {', '.join(files)} and {out / f'{args.mode}_{args.seed}.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spec-ar", description="Speculative decoding for autoregressive image models.")
    sub = ap.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="decode in every mode and write a report")
    demo.add_argument("--out", default="out/demo", help="output folder (default: out/demo)")
    demo.add_argument("--batch", type=int, default=2)
    demo.add_argument("--window", type=int, default=16)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(run=_demo)
    render = sub.add_parser("render", help="render images with a model file or folder (the family is detected)")
    render.add_argument("--model", required=True, help="checkpoint file or model folder")
    render.add_argument("--vq", help="VQ tokenizer file (LlamaGen; found beside the GPT if there is one)")
    render.add_argument("--text-encoder", help="T5 folder (LlamaGen text-to-image: a copy of google/flan-t5-xl)")
    render.add_argument("--prompt", help="text prompt")
    render.add_argument("--class-id", type=int, help="class id (class-conditional models)")
    render.add_argument("--mode", default="sjd", help="ar, sjd, gsd, lantern or vvs (default: sjd)")
    render.add_argument("--seed", type=int, default=0)
    render.add_argument("--batch", type=int, default=1, help="images (seeds seed, seed+1, ...)")
    render.add_argument("--resolution", type=int, help="image size in pixels, where the family offers several")
    render.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when present)")
    render.add_argument("--dtype", choices=["float32", "float16", "bfloat16"])
    render.add_argument("--out", default="out/render", help="output folder (default: out/render)")
    _config_args(render)
    render.set_defaults(run=_render)
    args = ap.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
