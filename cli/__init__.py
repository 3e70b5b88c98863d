"""The ``spec-ar`` command line: its parser, the subcommands it runs itself (``demo``, ``render``, ``download``)
and the hand-over to those that parse their own options (``batch`` and ``queue`` here; ``bench``, ``evaluate`` and
the training commands in their parts)."""
from __future__ import annotations

import argparse
import json
import sys

from ..output_folders import writable_folder, write_all
from .options import decoding_options, dit_options, dtype_help, literal, png_bytes


def _demo(args) -> int:
    from ..embedded_tools.demo import run

    run(writable_folder(args.out, "--out"), seed=args.seed)
    return 0


def _train_embedded(args) -> int:
    from ..embedded_tools.train import main as train

    return train(args.rest)


def _train_drafter(args) -> int:
    from ..training.drafter import main as train

    return train(args.rest)


def _bench(args) -> int:
    from ..bench.run import main as bench

    return bench(args.rest)


def _evaluate(args) -> int:
    from ..embedded_tools.evaluate import main as evaluate

    return evaluate(args.rest)


def _render(args) -> int:
    from ..loaders.base import resolve_device
    from ..loaders.detect import load_drafter, load_model
    from ..sampling import ConfigError, DecodeConfig, SpeculativeDecoder
    from ..sampling.config import KNOBS, parse

    settings = {k.name: parse(k, getattr(args, k.name), "cli") for k in KNOBS.values()
                if getattr(args, k.name) is not None}
    if args.batch < 1:
        raise ConfigError(f"--batch must be an integer >= 1 (got {args.batch})")
    if args.prompt is not None and args.class_id is not None:
        raise ConfigError("give --prompt (text-conditional models) or --class-id (class-conditional ones), not both")
    dit = _dit_settings(args)
    if dit:
        _check_dit_family(args.model, next(iter(dit)))
    out = writable_folder(args.out, "--out")
    device = resolve_device(args.device)
    config = DecodeConfig(mode=args.mode, **settings).validate(surface="cli")
    if args.drafter and not config.drafts:
        raise ConfigError(f"--drafter drafts for the speculative modes, not --mode {args.mode}")
    model = load_model(args.model, args.vq, args.text_encoder, args.resolution, device, args.dtype, args.width,
                       args.height, offload=args.offload, decode_path=args.decode_path)
    dtype = model.storage.name
    for warning in model.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.resolution and args.resolution != model.resolution:
        raise ConfigError(f"resolution must be one of {list(model.resolutions)} for {model.name} "
                          f"(got {args.resolution})")
    if model.condition == "class":
        if args.class_id is None:
            raise ConfigError(f"{model.name} is class-conditional: give --class-id (not --prompt)")
        conditions = [args.class_id] * args.batch
    else:
        if args.prompt is None:
            raise ConfigError(f"{model.name} is text-conditional: give --prompt (not --class-id)")
        conditions = [args.prompt] * args.batch
    if model.decode is None:
        raise ConfigError(model.info.get("no_decoder")
                          or f"{model.name} needs its VQ decoder to make images: give --vq")
    for name, value in dit.items():  # GLM-Image's DiT stage (checked above: the model has one)
        setattr(model.decode, name, value)
        model.info[f"dit_{name}"] = value
    drafter = (load_drafter(args.drafter, model, args.text_encoder, device, dtype) if args.drafter else None)
    decoder = SpeculativeDecoder(model.adapter, config, drafter=drafter, surface="cli")
    negatives = [args.negative_prompt] * args.batch if args.negative_prompt else None
    model.check_decoder_fits()
    result = decoder.generate(conditions, negatives, seeds=args.seed)
    images = model.decode_images(result.image_tokens(model.adapter.layout))
    names = [f"{args.mode}_{args.seed + i}.png" for i in range(len(images))]
    report = {"model": model.name, "family": model.family, "resolution": model.resolution, "device": device,
              "dtype": str(dtype), "warnings": model.warnings, "images": [str(out / n) for n in names],
              "reports": [r.to_dict() for r in result.reports]}
    files = {n: png_bytes(img) for n, img in zip(names, images)}
    files[f"{args.mode}_{args.seed}.json"] = json.dumps(report, indent=1).encode()
    write_all(out, files)
    print(result.reports[0].summary())
    print(f"wrote {', '.join(report['images'])} and {out / f'{args.mode}_{args.seed}.json'}")
    return 0


def _dit_settings(args) -> dict:
    """``--dit-steps`` / ``--dit-guidance`` / ``--dit-seed`` given, checked: ``{name: value}``."""
    from ..decoders.glm_dit import SETTINGS
    from ..sampling import ConfigError

    out = {}
    for s in SETTINGS.values():
        text = getattr(args, f"dit_{s.name}")
        if text is not None:
            try:
                out[s.name] = s.parse(text)
            except ValueError as err:
                raise ConfigError(str(err)) from None
    return out


def _check_dit_family(model: str, first: str) -> None:
    """The DiT settings are GLM-Image's: refused, naming ``--dit-<first>``, for any model without its DiT stage
    (read from the folder's contents, before any weights)."""
    from ..decoders import glm_dit
    from ..loaders import glm_image
    from ..loaders.detect import detect
    from ..sampling import ConfigError

    option = glm_dit.SETTINGS[first].option
    hit = detect(model)
    if hit.family != glm_image.FAMILY_NAME:
        raise ConfigError(f"{option} is a setting of GLM-Image's DiT stage; {model} (family {hit.family}) has "
                          f"none: leave {option} out")
    missing = glm_dit.missing_parts(hit.path.parent)
    if missing:
        raise ConfigError(f"{option} is a setting of GLM-Image's DiT stage; {model} has none "
                          f"({glm_image.no_decoder(missing)}): leave {option} out")


def _download(args) -> int:
    import pathlib

    from ..loaders import downloads

    root = pathlib.Path(args.to) if args.to else downloads.default_root()
    if args.list or not args.name:
        have = downloads.present(root)
        width = max(map(len, downloads.RELEASES))
        for r in downloads.RELEASES.values():
            print(f"{r.name:{width}s} {'on disk' if r.name in have else '-':8s} {r.what}")
        return 0 if args.list else 2

    shown = []  # whether the progress line is on the screen, to be ended before anything else is printed

    def progress(done, total):
        if total:
            print(f"\r{args.name}: {done / 2**20:.1f} of {total / 2**20:.1f} MB", end="", file=sys.stderr, flush=True)
            shown[:] = [True]

    try:
        folder = downloads.download(args.name, root, endpoint=args.endpoint, progress=progress)
    except BaseException as err:
        if shown:
            print(file=sys.stderr)
        if isinstance(err, KeyboardInterrupt):
            print(f"{args.name}: stopped; what arrived is kept and resumes: run the same command again",
                  file=sys.stderr)
        raise
    if shown:
        print(file=sys.stderr)
    print(folder)
    return 0


def _queue(args) -> int:
    from .queue import main as queue

    return queue(args.rest)


def _batch(args) -> int:
    from .batch import main as batch

    return batch(args.rest)


#: subcommands with their own option parsers: everything after the name goes to them
PASSTHROUGH = {"train-embedded": _train_embedded, "train-drafter": _train_drafter, "evaluate": _evaluate,
               "bench": _bench, "queue": _queue, "batch": _batch}


#: errors that are about the user's input: printed as one line, exit status 2
USER_ERRORS = ("ConfigError", "CheckpointError", "PromptFileError", "OutputError", "NonFiniteError", "QueueError",
               "DownloadError",
               "FileNotFoundError", "ValueError", "UnicodeDecodeError", "IsADirectoryError", "NotADirectoryError",
               "PermissionError")


def main(argv: list[str] | None = None) -> int:
    """Runs a subcommand; errors are one line on stderr (``--debug`` or
    ``SPEC_AR_DEBUG=1``: the traceback instead)."""
    import os

    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv or os.environ.get("SPEC_AR_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    try:
        return _dispatch(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if debug:
            raise
        kinds = {k.__name__ for k in type(err).__mro__}
        text = " ".join(str(err).split()) or type(err).__name__
        if kinds & set(USER_ERRORS):
            print(f"error: {text}", file=sys.stderr)
            return 2
        print(f"error: {type(err).__name__}: {text} (an internal error: rerun with --debug for the traceback and "
              "report it)", file=sys.stderr)
        return 1


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in PASSTHROUGH:
        return PASSTHROUGH[argv[0]](argparse.Namespace(rest=argv[1:]))
    args = build_parser().parse_args(argv)
    return args.run(args)


def build_parser() -> argparse.ArgumentParser:
    """``spec-ar``'s parser; the subcommands in :data:`PASSTHROUGH` parse their own options."""
    from ..loaders.offload import HELP as OFFLOAD_HELP
    from ..loaders.static_cache import DECODE_PATHS, HELP as PATH_HELP
    from ..loaders.storage import STORAGES
    from ..sampling.config import MODE_HELP

    ap = argparse.ArgumentParser(prog="spec-ar", description="Speculative decoding for autoregressive image models. "
                                 "Errors are one line; --debug (anywhere) shows the traceback instead.")
    sub = ap.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the shipped prompts with the embedded model in every mode, and a report")
    demo.add_argument("--out", default="out/demo", help="output folder (default: out/demo)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(run=_demo)
    train = sub.add_parser("train-embedded", help="train the embedded model from scratch (about an hour on CPU)",
                           add_help=False)
    train.add_argument("rest", nargs=argparse.REMAINDER)
    train.set_defaults(run=_train_embedded)
    drafter = sub.add_parser("train-drafter", help="train a draft head for any model, on its own samples",
                             add_help=False)
    drafter.add_argument("rest", nargs=argparse.REMAINDER)
    drafter.set_defaults(run=_train_drafter)
    ev = sub.add_parser("evaluate", help="prompt adherence and Frechet distance of the embedded model per mode",
                        add_help=False)
    ev.add_argument("rest", nargs=argparse.REMAINDER)
    ev.set_defaults(run=_evaluate)
    bench = sub.add_parser("bench", help="every mode and setting side by side: speed, quality, charts",
                           add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(run=_bench)
    q = sub.add_parser("queue", help="render a prompt list through running ComfyUI servers", add_help=False)
    q.add_argument("rest", nargs=argparse.REMAINDER)
    q.set_defaults(run=_queue)
    b = sub.add_parser("batch", help="render a prompt list with model replicas, here or on a Ray cluster (--ray)",
                       add_help=False)
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(run=_batch)
    dl = sub.add_parser("download", help="fetch a known release from the Hugging Face hub into the model folder")
    dl.add_argument("name", nargs="?", help="the release (spec-ar download --list names them)")
    dl.add_argument("--list", action="store_true", help="the known releases, and which are on disk (downloaded whole "
                                                        "and verified)")
    dl.add_argument("--to", help="the model folder (default: ComfyUI's models/spec_ar when the pack sits in "
                                 "custom_nodes, else ./models/spec_ar; SPEC_AR_MODELS overrides)")
    dl.add_argument("--endpoint", help="another hub than huggingface.co (default: HF_ENDPOINT or the hub)")
    dl.set_defaults(run=_download)
    render = sub.add_parser("render", help="render images with a model file or folder (the family is detected)")
    render.add_argument("--model", required=True, help="checkpoint file or model folder")
    render.add_argument("--vq", help="VQ tokenizer: LlamaGen's file (found beside the GPT if there is one), or the "
                                     "folder with Meta's vqgan.yaml + vqgan.ckpt (Lumina-mGPT, Anole)")
    render.add_argument("--text-encoder", help="T5 folder (LlamaGen text-to-image: a copy of google/flan-t5-xl)")
    render.add_argument("--drafter", help="drafts instead of Jacobi self-drafting: a draft head folder (LANTERN's "
                                          "released drafters, or spec-ar train-drafter's), or a smaller sibling "
                                          "model with the same image codebook and grid as --model, e.g. LlamaGen-B "
                                          "for LlamaGen-XL c2i, Janus-Pro-1B for Janus-Pro-7B; for the embedded "
                                          "model 'embedded' (its draft head) or 'embedded-sibling' (its two-layer "
                                          "sibling)")
    render.add_argument("--prompt", help="text prompt")
    render.add_argument("--negative-prompt", help="negative prompt (Emu3; default: the reference's)")
    render.add_argument("--class-id", type=int, help="class id (class-conditional models)")
    render.add_argument("--mode", default="sjd", help=literal("; ".join(f"{m}: {h}" for m, h in MODE_HELP.items())
                                                              + " (default: sjd)"))
    render.add_argument("--seed", type=int, default=0)
    render.add_argument("--batch", type=int, default=1, help="images (seeds seed, seed+1, ...)")
    render.add_argument("--resolution", type=int, help="image size in pixels, where the family offers several")
    render.add_argument("--width", type=int, help="image width in pixels (Lumina-mGPT: any multiple of 32)")
    render.add_argument("--height", type=int, help="image height in pixels")
    render.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when present)")
    render.add_argument("--dtype", choices=["auto", *STORAGES], default="auto", help=literal(dtype_help()))
    render.add_argument("--offload", action="store_true", help=literal(OFFLOAD_HELP))
    render.add_argument("--decode-path", choices=DECODE_PATHS, default="auto", help=literal(PATH_HELP))
    render.add_argument("--out", default="out/render", help="output folder (default: out/render)")
    decoding_options(render)
    dit_options(render)
    render.set_defaults(run=_render)
    return ap

