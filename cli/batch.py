"""``spec-ar batch``: a prompt list rendered by model replicas, in this process or on a Ray cluster.

    spec-ar batch --model M --prompts FILE --out FOLDER [--ray [ADDRESS]] [--actors N] [--gpus-per-actor G]
                  [--batch B] [render's options and decoding settings]

Line ``i`` of the prompt list (blank and ``#`` lines skipped) is item ``i``, rendered with seed ``--seed + i``
into ``FOLDER/NNNNN.png`` with its report ``NNNNN.json`` (the prompt, seed, run settings, which replica, the
sampler's report), both written at once when the item is done; ``manifest.json`` lists every item on disk.  A
rerun with the same settings renders only what is missing; other settings into the same folder are refused.

With ``--ray`` the list becomes a Ray Data dataset mapped by an actor pool (``map_batches``): each actor loads
the model (and drafter) once and keeps it; on a cluster with GPUs one actor per ``--gpus-per-actor`` GPUs,
else one per node with that node's cores (``--actors`` overrides; the cores are then shared out).  An actor
that dies has its batch retried by Ray on a restarted actor; the item files are written whole or not at all, so
a retried item is written once.  ``FOLDER`` must be a path every node can write (a shared file system), and
every node needs the pack and the model files at the same paths.  Ray is an optional dependency
(``pip install "ray[data]"``), imported by this command only.

Left on auto, the window is the auto setting's base width (24 with coupled drafts, 16 without), not a width
picked from each replica's own timings: every replica, and every rerun, draws the same images for a seed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys
import time

MANIFEST = "manifest.json"
ACTORS = ".actors"  # one file per replica that loaded the model: its name and process id


def item_name(index: int) -> str:
    return f"{index:05d}"


def build_parser() -> argparse.ArgumentParser:
    from ..loaders.static_cache import DECODE_PATHS
    from ..loaders.storage import STORAGES
    from ..sampling.config import MODE_HELP
    from .options import decoding_options, dtype_help, literal

    ap = argparse.ArgumentParser(prog="spec-ar batch", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    ap.add_argument("--model", required=True, help="checkpoint file or model folder ('embedded': the shipped model)")
    ap.add_argument("--prompts", required=True, help="prompt list: one prompt (or class id) per line, UTF-8")
    ap.add_argument("--out", required=True, help="output folder (on a cluster: a path every node can write)")
    ap.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                    help="render on a Ray cluster: its address (host:port, or 'auto' for the one this machine "
                         "joined); without an address a local Ray instance is started")
    ap.add_argument("--actors", type=int, help="model replicas (default: one per --gpus-per-actor GPUs of the "
                                               "cluster, else one per node, with that node's cores)")
    ap.add_argument("--gpus-per-actor", type=float, default=1.0, help="GPUs each replica takes on a GPU cluster "
                                                                       "(default 1)")
    ap.add_argument("--batch", type=int, default=1, help="prompts a replica renders together (default 1)")
    ap.add_argument("--vq", help="VQ tokenizer file or folder, as for spec-ar render")
    ap.add_argument("--text-encoder", help="T5 folder (LlamaGen text-to-image)")
    ap.add_argument("--drafter", help="a draft source, as for spec-ar render")
    ap.add_argument("--negative-prompt", help="negative prompt for every item (Emu3)")
    ap.add_argument("--mode", default="sjd", help=literal("; ".join(f"{m}: {h}" for m, h in MODE_HELP.items())
                                                          + " (default: sjd)"))
    ap.add_argument("--seed", type=int, default=0, help="item i gets seed + i (default 0)")
    ap.add_argument("--resolution", type=int)
    ap.add_argument("--width", type=int)
    ap.add_argument("--height", type=int)
    ap.add_argument("--device", help="cpu, cuda ... (default: cuda where the replica has a GPU)")
    ap.add_argument("--dtype", choices=["auto", *STORAGES], default="auto", help=literal(dtype_help()))
    ap.add_argument("--decode-path", choices=DECODE_PATHS, default="auto")
    decoding_options(ap)
    return ap


def options_of(args) -> dict:
    """What a replica needs to load and run: plain values (they travel to the actors)."""
    from ..sampling.config import KNOBS

    keep = ("model", "vq", "text_encoder", "drafter", "negative_prompt", "mode", "seed", "resolution", "width",
            "height", "device", "dtype", "decode_path", "batch")
    out = {k: getattr(args, k) for k in keep}
    out["settings"] = {k.name: getattr(args, k.name) for k in KNOBS.values() if getattr(args, k.name) is not None}
    if args.mode != "ar" and not args.drafter and "window" not in out["settings"]:
        # auto would pick a width from each replica's own timings (so replicas, and reruns, could draw different
        # images for one seed): the auto base width instead, the same everywhere
        from ..sampling.config import DecodeConfig, parse

        settings = {name: parse(KNOBS[name], value, "cli") for name, value in out["settings"].items()}
        out["settings"]["window"] = str(DecodeConfig(mode=args.mode, **settings).drafting[0])
    return out


def run_key(options: dict) -> str:
    """What makes two runs render the same images (the batch size does not: an image does not depend on its
    batch, except VVS's shared skips, so it is kept in the key for vvs only)."""
    keyed = {k: v for k, v in options.items() if k not in ("device", "batch")}
    if options["mode"] == "vvs":
        keyed["batch"] = options["batch"]
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


def _conditions(prompts: list[str], condition: str) -> list:
    if condition != "class":
        return prompts
    bad = [p for p in prompts if not p.lstrip("-").isdigit()]
    if bad:
        from ..sampling import ConfigError

        raise ConfigError(f"--prompts: a class-conditional model takes class ids, one per line (got {bad[0]!r})")
    return [int(p) for p in prompts]


def done_items(out: pathlib.Path, key: str) -> dict[int, dict]:
    """Item index -> its record, for the items of run ``key`` already written in ``out``."""
    records = {}
    for path in sorted(out.glob("[0-9][0-9][0-9][0-9][0-9].json")) if out.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except ValueError:
            continue  # not ours, or damaged: rendered again
        if record.get("run") == key and (out / record.get("image", "")).is_file():
            records[int(record["index"])] = record
    return records


class Renderer:
    """One model replica (a Ray actor, or this process): loads the model and drafter once, then renders
    batches of items and writes each item's image and record."""

    def __init__(self, options: dict, out: str, key: str):
        import socket

        import torch

        from ..loaders.base import resolve_device
        from ..loaders.detect import load_drafter, load_model
        from ..sampling import DecodeConfig, SpeculativeDecoder
        from ..sampling.config import KNOBS, parse

        self.options, self.out, self.key = options, pathlib.Path(out), key
        device = resolve_device(options["device"] or ("cuda" if torch.cuda.is_available() else "cpu"))
        settings = {name: parse(KNOBS[name], value, "cli") for name, value in options["settings"].items()}
        config = DecodeConfig(mode=options["mode"], **settings).validate(surface="cli")
        self.model = load_model(options["model"], options["vq"], options["text_encoder"], options["resolution"],
                                device, options["dtype"], options["width"], options["height"],
                                decode_path=options["decode_path"])
        drafter = (load_drafter(options["drafter"], self.model, options["text_encoder"], device,
                                self.model.storage.name) if options["drafter"] else None)
        self.decoder = SpeculativeDecoder(self.model.adapter, config, drafter=drafter, surface="cli")
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        (self.out / ACTORS).mkdir(parents=True, exist_ok=True)
        (self.out / ACTORS / f"{os.getpid()}.json").write_text(json.dumps({"name": self.name, "pid": os.getpid(),
                                                                           "device": device}))

    def __call__(self, batch: dict) -> dict:
        from ..output_folders import write_all
        from .options import png_bytes

        indices = [int(i) for i in batch["index"]]
        prompts = [str(p) for p in batch["prompt"]]
        seeds = [int(s) for s in batch["seed"]]
        conditions = _conditions(prompts, self.model.condition)
        negatives = [self.options["negative_prompt"]] * len(prompts) if self.options["negative_prompt"] else None
        start = time.perf_counter()
        result = self.decoder.generate(conditions, negatives, seeds=seeds)
        images = self.model.decode_images(result.image_tokens(self.model.adapter.layout))
        seconds = (time.perf_counter() - start) / len(indices)
        for index, prompt, seed, image, report in zip(indices, prompts, seeds, images, result.reports):
            name = item_name(index)
            record = {"index": index, "prompt": prompt, "seed": seed, "run": self.key, "image": f"{name}.png",
                      "actor": self.name, "seconds": seconds, "model": self.model.name, "report": report.to_dict()}
            files = {f"{name}.png": png_bytes(image), f"{name}.json": json.dumps(record, indent=1).encode()}
            write_all(self.out, files)
        return {"index": indices, "actor": [self.name] * len(indices), "seconds": [seconds] * len(indices)}


def write_manifest(out: pathlib.Path, key: str, options: dict, items: list[dict]) -> dict:
    records = done_items(out, key)
    manifest = {"run": key, "settings": options, "items": [
        {"index": i, "prompt": it["prompt"], "seed": it["seed"], "image": records[i]["image"],
         "record": f"{item_name(i)}.json", "actor": records[i]["actor"], "seconds": records[i]["seconds"]}
        for i, it in enumerate(items) if i in records]}
    from ..output_folders import write_all

    write_all(out, {MANIFEST: json.dumps(manifest, indent=1).encode()})
    return manifest


def _check_folder(out: pathlib.Path, key: str) -> None:
    from ..output_folders import OutputError

    path = out / MANIFEST
    if path.is_file():
        try:
            earlier = json.loads(path.read_text()).get("run")
        except ValueError:
            earlier = None
        if earlier != key:
            raise OutputError(f"--out {out}: holds a run with other settings ({MANIFEST}); give another folder")


def _render_here(todo: list[dict], options: dict, out: pathlib.Path, key: str) -> list[dict]:
    renderer = Renderer(options, str(out), key)
    rows = []
    for start in range(0, len(todo), options["batch"]):
        part = todo[start:start + options["batch"]]
        got = renderer({k: [it[k] for it in part] for k in ("index", "prompt", "seed")})
        rows += [dict(zip(got, values)) for values in zip(*got.values())]
        print(f"{len(rows)}/{len(todo)} rendered", file=sys.stderr)
    return rows


def _render_on_ray(todo: list[dict], options: dict, out: pathlib.Path, key: str, address: str, actors: int | None,
                   gpus_per_actor: float) -> list[dict]:
    try:
        import ray
        import ray.data
    except ImportError as err:
        from ..sampling import ConfigError

        raise ConfigError(f'--ray needs Ray Data: pip install "ray[data]" ({err})') from None
    try:
        ray.init(address=None if address == "local" else address, include_dashboard=False, log_to_driver=False,
                 ignore_reinit_error=True)
    except ConnectionError as err:
        from ..sampling import ConfigError

        raise ConfigError(f"--ray {address}: cannot join that cluster ({' '.join(str(err).split())}). A cluster "
                          "started with `ray start` asks for its token (Ray's default since 2.59): run with "
                          "RAY_AUTH_MODE=token and the head's token (`ray get-auth-token` there) in "
                          "~/.ray/auth_token or RAY_AUTH_TOKEN") from None
    try:
        resources = ray.cluster_resources()
        gpus = resources.get("GPU", 0)
        if gpus:
            count = actors or max(1, int(gpus // gpus_per_actor))
            per_actor = {"num_gpus": gpus_per_actor}
        else:  # a replica per node, with the node's cores (its torch threads); --actors shares them out
            nodes = [n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")]
            count = actors or max(1, len(nodes))
            per_actor = {"num_cpus": max(1, min(int(min(nodes, default=1)), int(sum(nodes) // count)))}
        print(f"ray: {count} actors on {resources.get('CPU', 0):g} CPUs, {gpus:g} GPUs, each with "
              f"{', '.join(f'{v:g} {k[4:-1].upper()}' for k, v in per_actor.items())}", file=sys.stderr)
        # Ray Data's actor pools restart a dead actor and retry its batch without end (max_restarts and
        # max_task_retries -1, its defaults): what keeps a killed replica's prompts
        dataset = ray.data.from_items(todo).map_batches(
            Renderer, fn_constructor_kwargs={"options": options, "out": str(out), "key": key},
            batch_size=options["batch"], batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=count),
            **per_actor)
        return list(dataset.iter_rows())
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    from ..loaders.detect import detect
    from ..output_folders import writable_folder
    from ..prompt_files import read_prompts
    from ..sampling import ConfigError, DecodeConfig
    from ..sampling.config import KNOBS, parse

    args = build_parser().parse_args(argv)
    if args.batch < 1:
        raise ConfigError(f"--batch must be an integer >= 1 (got {args.batch})")
    if args.actors is not None and args.actors < 1:
        raise ConfigError(f"--actors must be an integer >= 1 (got {args.actors})")
    if not args.gpus_per_actor > 0:
        raise ConfigError(f"--gpus-per-actor must be above 0 (got {args.gpus_per_actor})")
    if args.actors is not None and args.ray is None:
        raise ConfigError("--actors sets the replicas of a Ray run: add --ray")
    # everything a user can get wrong, before any model is loaded or a cluster joined
    out = writable_folder(args.out, "--out")
    prompts = read_prompts(args.prompts, f"--prompts {args.prompts}")
    settings = {k.name: parse(k, getattr(args, k.name), "cli") for k in KNOBS.values()
                if getattr(args, k.name) is not None}
    DecodeConfig(mode=args.mode, **settings).validate(surface="cli")
    _conditions(prompts, detect(args.model).condition)
    options = options_of(args)
    key = run_key(options)
    _check_folder(out, key)
    items = [{"index": i, "prompt": p, "seed": args.seed + i} for i, p in enumerate(prompts)]
    done = done_items(out, key)
    todo = [it for it in items if it["index"] not in done or done[it["index"]]["prompt"] != it["prompt"]]
    print(f"{len(items)} prompts: {len(items) - len(todo)} already rendered, {len(todo)} to render", file=sys.stderr)
    start = time.perf_counter()
    rows = []
    if todo:
        rows = (_render_on_ray(todo, options, out, key, args.ray, args.actors, args.gpus_per_actor) if args.ray
                else _render_here(todo, options, out, key))
    wall = time.perf_counter() - start
    manifest = write_manifest(out, key, options, items)
    summary(manifest, rows, wall, out)
    missing = len(items) - len(manifest["items"])
    if missing:
        print(f"error: {missing} prompts were not rendered (see above); rerun the same command to render them",
              file=sys.stderr)
        return 1
    return 0


def summary(manifest: dict, rows: list[dict], wall: float, out: pathlib.Path) -> None:
    """Images, images per second per replica, and tokens per forward pass (``ar``: 1 by definition)."""
    per_actor: dict[str, list[float]] = {}
    for row in rows:
        per_actor.setdefault(str(row["actor"]), []).append(float(row["seconds"]))
    print(f"rendered {len(rows)} images in {wall:.1f} s on {len(per_actor)} replicas; {len(manifest['items'])} in "
          f"{out / MANIFEST}")
    for actor, seconds in sorted(per_actor.items()):
        print(f"  {actor}: {len(seconds)} images, {len(seconds) / sum(seconds):.2f} images/s while rendering")
    reports = [json.loads((out / it["record"]).read_text())["report"] for it in manifest["items"]]
    tokens, forwards = sum(r["tokens"] for r in reports), sum(r["nfe"] for r in reports)
    if forwards:
        print(f"tokens per forward pass {tokens / forwards:.2f} over {len(reports)} images (ar: 1.00, so "
              f"{tokens / forwards:.2f}x fewer forwards than ar)")
