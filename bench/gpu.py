"""One command for a lent GPU: what the card moves, what a 7B-class forward costs against that, and the
embedded model's images per mode.

    spec-ar bench gpu [--models llamagen-xl janus-pro-7b lumina-mgpt-7b-768 emu3-gen | emu35-image] [--dtypes bfloat16]
                      [--widths 1 24 33] [--trees 60 120] [--forwards 10] [--context 0.5]
                      [--modes ar sjd gsd lantern vvs] [--images 3] [--scale 1.0] [--device cuda]
                      [--paths eager graphs] [--work DIR] [--out out/bench-gpu]

1. **Bandwidth**: a bfloat16 matrix-vector product over matrices larger than the card's cache
   (median of timed products, rotating over several matrices): bytes of the matrix over the time.
2. **Forwards** of random-weight models with the real configurations (LlamaGen-XL c2i at 512 px;
   Janus-Pro-7B at 384 px, Lumina-mGPT-7B at 768 px and Emu3-8B at 720 px in transformers' layout),
   written as headers over sparse holes (no disk space, no time), loaded through the pack's own
   loaders, their values then drawn on the device (seeded per tensor: every run and every dtype
   holds the same model).  With guidance rows (batch 1, two rows), after ``--context`` of the
   image's tokens are in the cache: milliseconds per forward (median) at each window width and for
   draft trees of ``--trees`` nodes, beside the **floor**: the bytes a forward must read (the
   stored weights of every layer the forward runs, found by hooks, plus the live KV cache) over
   the measured bandwidth.  Quantized ``--dtypes`` are made from the bfloat16 model on the device
   (their weights as stored, their peak while decoding, and their logits against bfloat16's).
   ``--vocabulary compact`` (the default, as the engine decodes: ``sampling/compact.py``) scores
   the ids a stream can hold, so the head reads its image rows only; ``full`` every id.
3. **The embedded model**: milliseconds per image for each mode at its defaults (the window on
   auto: the width it chose is printed) and ``--batches`` size (median of ``--images`` batches
   after a warm-up one), tokens per forward.

Each is timed on every ``--paths`` decode path (``loaders/static_cache.py``): eager, static shapes,
or static shapes replayed as CUDA graphs (default: eager and graphs on CUDA).
Prints the tables and writes ``results.json`` and ``report.md`` into ``--out``.  On a CPU, with
``--scale`` (widths and depths times it), it checks itself in a minute; its figures there say
nothing about a GPU.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import pathlib
import statistics
import tempfile
import time
import zlib

import torch
from torch import nn

MODELS = {  # name: (writer's family or None for LlamaGen, resolution, what it stands for)
    "llamagen-xl": (None, 512, "LlamaGen-XL c2i (775M), 512 px"),
    "janus-pro-7b": ("janus-pro-7b", None, "Janus-Pro-7B, 384 px"),
    "lumina-mgpt-7b-768": ("lumina-mgpt-7b-768", None, "Lumina-mGPT-7B-768, 768 px"),
    "emu3-gen": ("emu3-gen", None, "Emu3-Gen (8B), 720 px"),
    "emu35-image": ("emu35-image", None, "Emu3.5-Image (34B), 1168 x 880 px (the authors' default)"),
}
#: what runs without ``--models`` (the 34B on request: it alone takes minutes to load and quantize)
DEFAULT_MODELS = ("llamagen-xl", "janus-pro-7b", "lumina-mgpt-7b-768", "emu3-gen")
PROMPT = "a red fox in the snow"


class Clock:
    """Wall time of device work: synchronised before reading, CUDA events on CUDA."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def time(self, fn) -> float:
        """Milliseconds ``fn()`` takes."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1000


def bandwidth(device, side: int, count: int = 4, repeats: int = 20) -> dict:
    """Bytes per second a bfloat16 matrix-vector product reads (matrices ``side`` x ``side``,
    ``count`` of them in turn, so no product finds its matrix in the cache)."""
    g = torch.Generator(device).manual_seed(0)
    mats = [torch.randn(side, side, device=device, dtype=torch.bfloat16, generator=g) for _ in range(count)]
    x = torch.randn(side, 1, device=device, dtype=torch.bfloat16, generator=g)
    clock = Clock(device)
    deadline = time.perf_counter() + 1.0
    while time.perf_counter() < deadline:  # a second of warm-up: kernels chosen, and an idle card's clocks raised
        for m in mats:
            clock.time(lambda m=m: m @ x)
    times = [clock.time(lambda m=mats[i % count]: m @ x) for i in range(repeats * count)]
    ms = statistics.median(times)
    nbytes = side * side * 2
    return {"side": side, "bytes": nbytes, "ms": ms, "bytes_per_s": nbytes / (ms / 1000)}


@torch.no_grad()
def kernels(device, dtypes, shape=(11008, 4096), rows=(2, 66), count=4, repeats=20) -> list[dict]:
    """One 7B MLP projection (``shape``: out x in) stored each way, timed on ``rows`` input
    rows (a one-token and a 33-token window with guidance): what a quantized layer's
    own kernel costs against reading its bytes.  ``count`` layers in turn, out of cache."""
    from ..loaders.storage import quantized_layer, resolve, stored_bytes

    clock = Clock(device)
    compute = torch.bfloat16
    out = []
    for name in dtypes:
        storage = resolve(name)
        layers = []
        for i in range(count):
            linear = nn.Linear(shape[1], shape[0], bias=False, device=device, dtype=compute)
            nn.init.normal_(linear.weight, 0, 0.02)
            layers.append(quantized_layer(linear, storage, compute, device) if storage.quantized else linear)
        from ..loaders import lowbit

        # a quantized storage: each of its kernels (loaders/lowbit.py), with its distance from the widened weight
        variants = list(lowbit.KERNELS[name]) if name in lowbit.KERNELS else [None]
        for kernel in variants:
            for layer in layers:
                layer.kernel = kernel
            label = name if kernel is None else f"{name} ({kernel})"
            for n in rows:
                x = torch.randn(n, shape[1], device=device, dtype=compute)
                try:
                    for layer in layers:
                        layer(x)
                except (RuntimeError, NotImplementedError) as err:  # not on this card
                    out.append({"dtype": label, "rows": n, "ms": None, "bytes": stored_bytes(layers[0]),
                                "why": str(err).splitlines()[0][:160]})
                    continue
                ms = statistics.median(clock.time(lambda layer=layers[i % count]: layer(x))
                                       for i in range(repeats * count))
                row = {"dtype": label, "rows": n, "ms": ms, "bytes": stored_bytes(layers[0])}
                if kernel is not None:
                    row["error"] = lowbit.error(layers[0](x), lowbit.KERNELS[name]["widen"](x, layers[0]))
                out.append(row)
        if name in lowbit.KERNELS and torch.device(device).type == "cuda":
            row = {"dtype": f"{name} (chosen)", "kernel": lowbit.choose(name, layers[0])}
            out.append(row)
        del layers
    return out


# -- the models --------------------------------------------------------------------------------------------------
def llamagen_xl_shapes(scale: float) -> dict:
    """LlamaGen-XL c2i's tensors (width 1280, 36 layers, FFN 3584, 16384 codes, 1000 classes), widths and depth
    times ``scale``."""
    from .scale_checkpoints.llamagen import llamagen_shapes

    dim = max(64, round(1280 * scale / 64) * 64)
    return llamagen_shapes(dim, max(1, round(36 * scale)), 256 * math.ceil(int(2 * 4 * dim / 3) / 256))


def write_model(name: str, folder: pathlib.Path, scale: float) -> pathlib.Path:
    """``name``'s checkpoint in ``folder``, weights as sparse holes; returns what to load."""
    from . import scale_checkpoints
    from .scale_checkpoints.weight_files import write_holes

    family, resolution, _ = MODELS[name]
    if family is not None:
        layouts = scale_checkpoints.CONFIGS[family]["layouts"]
        scale_checkpoints.write(family, folder, layout="converted" if "converted" in layouts else None, scale=scale,
                                holes=True, log=lambda *a: None)
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"c2i_XL_{resolution}.safetensors"
    write_holes(path, llamagen_xl_shapes(scale))
    return path


@torch.no_grad()
def redraw(modules: dict, seed: int = 0) -> None:
    """Every floating parameter drawn anew on its device, seeded by its name: matrices
    ``normal(0, 0.02)``, vectors (norms, biases) 1.  Buffers (rotary tables, codebook
    statistics) stay as the loader made them."""
    for prefix, module in modules.items():
        for name, p in module.named_parameters():
            if not p.is_floating_point():
                continue
            g = torch.Generator(p.device).manual_seed(seed ^ zlib.crc32(f"{prefix}.{name}".encode()))
            if p.dim() >= 2:
                p.normal_(0, 0.02, generator=g)
            else:
                p.fill_(1.0)


def load(path, device, dtype: str, seed: int = 0, offloaded: bool = False):
    """The model at ``path`` in bfloat16 with its values drawn on ``device``, then stored as ``dtype``;
    ``offloaded``: then its blocks moved to system memory and streamed (as ``--offload`` loads them)."""
    from ..loaders import offload
    from ..loaders.detect import load_model, with_storage
    from ..loaders.storage import place, repeated_blocks, resolve

    model = load_model(path, device=device, dtype="bfloat16")
    redraw(model.modules, seed)
    storage = resolve(dtype)
    if storage.quantized:
        for module in model.modules.values():
            place(module, storage, device)
        model = with_storage(model, storage)
    if offloaded:
        for module in model.modules.values():
            if (blocks := repeated_blocks(module)) is not None:
                offload.stream(module, blocks, device)
    return model


def read_per_forward(adapter, modules: dict, tokens: torch.Tensor) -> int:
    """Bytes of weights one forward reads: the stored parameters and buffers of every
    leaf module it runs (embedding tables excepted: a forward reads a few rows)."""
    from ..loaders.storage import stored_bytes

    ran, hooks = set(), []
    for module in modules.values():
        for m in module.modules():
            if next(m.children(), None) is None:
                hooks.append(m.register_forward_hook(lambda m, i, o: ran.add(m)))
    try:
        adapter.forward(tokens)
        adapter.rollback([tokens.shape[1]] * tokens.shape[0])
    finally:
        for h in hooks:
            h.remove()
    read = sum(stored_bytes(m) for m in ran if not isinstance(m, nn.Embedding))
    rows = getattr(adapter, "head_rows", None)  # a compact vocabulary's head: a slice of its weight, not its forward
    if rows is not None:
        read += stored_bytes(adapter.head) * (rows[1] - rows[0]) // adapter.head.out_features
    return read


def tree_parents(n: int, branching: int = 3) -> torch.Tensor:
    """A draft tree of ``n`` nodes ``[1, n]``, every node ``branching`` children wide (the
    first ``branching`` hang from the cache): a sampled tree's shape."""
    return torch.tensor([-1 if i < branching else i // branching - 1 for i in range(n)]).unsqueeze(0)


def forwards(model, args, reference: dict | None, count: int | None = None) -> dict:
    """One model's forwards: ms per window and tree, the bytes they read, logits for comparison;
    with the attention backends the engine decodes with."""
    from ..sampling.engine import attention_without_cudnn

    with torch.no_grad(), attention_without_cudnn(model.adapter.device):
        return _forwards(model, args, reference, count)


def _forwards(model, args, reference: dict | None, count: int | None = None) -> dict:
    from ..sampling.compact import compact

    ad = compact(model.adapter) if args.vocabulary == "compact" else model.adapter
    device = ad.device
    clock = Clock(device)
    g = torch.Generator().manual_seed(0)
    ids, _ = ad.token_vectors() if ad.token_vectors() is not None else (torch.arange(ad.vocab_size), None)
    ids = ids.cpu()

    def draw(n):
        return ids[torch.randint(0, len(ids), (1, n), generator=g)].to(device)

    condition = PROMPT if model.condition == "text" else 0
    ad.prefill([condition], None, True)
    image = int(ad.layout.image_positions().numel())
    fed = 0
    context = int(args.context * image)
    graphs, path = getattr(ad, "graphs", None), ad.decode_path
    if graphs is not None:  # the context goes in uncaptured and uncompiled: only the timed shapes are
        graphs.enabled, ad.decode_path = False, "static" if path != "eager" else path
    while fed < context:  # the cache as it is halfway through an image (by default)
        step = min(256, context - fed)
        ad.forward(draw(step))
        fed += step
    # counted uncaptured and uncompiled too: hooks see no module run inside a compiled block or a replay
    weight_bytes = read_per_forward(ad, model.modules, draw(1))
    if graphs is not None:
        graphs.enabled, ad.decode_path = path in ("graphs", "compiled") and torch.device(device).type == "cuda", path
    out = {"context_tokens": fed, "image_tokens": image}
    probe = draw(max(args.widths))
    logits = ad.forward(probe)[:, 0].float().cpu()  # [K, L, vocab]: the same tokens for every dtype
    ad.rollback([probe.shape[1]])
    out["live_kv_bytes"] = ad.live_cache_bytes() or 0
    out["weight_bytes_per_forward"] = weight_bytes
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for w in args.widths:
        tokens = draw(w)

        def step(tokens=tokens):
            ad.forward(tokens)

        times = []
        for i in range((count or args.forwards) + 2):
            ms = clock.time(step)
            ad.rollback([w])
            if i >= 2:  # two warm-ups per shape
                times.append(ms)
        out[f"w{w}"] = statistics.median(times)
    for n in args.trees:
        tokens, parents = draw(n), tree_parents(n).to(device)
        nodes = torch.zeros(1, 1, dtype=torch.long, device=device)
        times = []
        for i in range((count or args.forwards) + 2):
            ms = clock.time(lambda: ad.forward_tree(tokens, parents))
            ad.keep_tree(nodes, [0])
            if i >= 2:
                times.append(ms)
        out[f"tree{n}"] = statistics.median(times)
    if torch.device(device).type == "cuda":
        out["peak_allocated"] = torch.cuda.max_memory_allocated(device)
    if graphs is not None and graphs.failed:
        out["graphs_failed"] = graphs.failed
    ad.decode_path, ad.cache = "eager", None  # the next path starts a cache of its own
    ad.release()
    if reference is not None:
        from .storage import compare

        out.update(compare(reference["logits"].flatten(0, -2), logits.flatten(0, -2)))
    out["logits"] = logits
    return out


def floor_ms(run: dict, bytes_per_s: float, link_bytes_per_s: float | None = None) -> float:
    """The bytes a forward reads over the card's bandwidth; an offloaded model's streamed
    blocks over the host link's instead."""
    streamed = run.get("streamed_bytes", 0)
    ms = (run["weight_bytes_per_forward"] - streamed + run["live_kv_bytes"]) / bytes_per_s * 1000
    return ms + streamed / (link_bytes_per_s or bytes_per_s) * 1000


def host_link(device, nbytes: int = 2 ** 30, repeats: int = 5) -> dict:
    """Bytes per second from pinned system memory to ``device`` (what offload streams over)."""
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    clock = Clock(device)
    dev.copy_(host, non_blocking=True)
    ms = statistics.median(clock.time(lambda: dev.copy_(host, non_blocking=True)) for _ in range(repeats))
    return {"bytes": nbytes, "ms": ms, "bytes_per_s": nbytes / (ms / 1000)}


@torch.no_grad()
def embedded_modes(args, log) -> list[dict]:
    """The embedded model's ms per image and tokens per forward for each mode at its defaults (the
    window on auto), path and ``--batches`` size: the median of ``--images`` batches after a warm-up one."""
    from ..loaders.detect import load_model
    from ..sampling import DecodeConfig, SpeculativeDecoder

    prompt = "a red circle in the top left on a striped blue background"
    clock = Clock(args.device)
    rows = []
    for path in args.paths:
        model = load_model("embedded", device=args.device, dtype="auto", decode_path=path)
        for batch, mode, step in [(b, m, s) for b in args.batches for m in args.modes for s in args.steps]:
            on_device = step == "device"
            decoder = SpeculativeDecoder(model.adapter, DecodeConfig(mode=mode))
            if on_device and (decoder.device_step_blocker or not decoder.config.drafts):
                continue  # (plain AR reads nothing per step anyway)
            decoder.device_step = on_device
            decoder.generate([prompt] * batch, seeds=0)  # warm-up (and the auto window's costs)
            times, results = [], []
            for i in range(1, args.images + 1):
                times.append(clock.time(lambda i=i: results.append(decoder.generate([prompt] * batch,
                                                                                    seeds=i * batch))))
            reports = [r.reports[0] for r in results]
            ms = statistics.median(times) / batch
            tokens = reports[0].tokens
            rows.append({"mode": mode, "path": model.adapter.decode_path, "batch": batch, "ms_per_image": ms,
                         "step": step if mode != "ar" else "-",
                         "window": reports[-1].settings.get("window") if mode != "ar" else None,
                         "window_choice": reports[-1].window_choice,
                         "forwards": statistics.mean(r.nfe for r in reports),
                         "tokens_per_forward": statistics.mean(r.tokens_per_forward for r in reports),
                         "engine_ms_per_forward": statistics.mean(1000 * r.engine_time_s / r.nfe for r in reports),
                         "ms_per_token": ms / tokens})
            log(f"  embedded {mode:8s} {model.adapter.decode_path:8s} {step:6s} batch {batch:2d} {ms:8.1f} ms/image  "
                f"{rows[-1]['forwards']:6.1f} forwards  {rows[-1]['ms_per_token']:.3f} ms/token  "
                f"window {rows[-1]['window']}")
    return rows


def report(results: dict) -> str:
    from ..sampling.memory import gb

    bw = results["bandwidth"]
    vocabulary = results.get("vocabulary", "full")
    lines = [f"# GPU bench on {results['device_name']} (torch {results['torch']}, {results['dtype_note']}, "
             f"{vocabulary} vocabulary)", "",
             f"Bandwidth: {bw['bytes_per_s'] / 1e9:.0f} GB/s (bfloat16 matrix-vector product, {bw['side']} x "
             f"{bw['side']}, {bw['ms']:.3f} ms)", ""]
    if results.get("host_link"):
        lines[-1:-1] = ["", f"Host link: {results['host_link']['bytes_per_s'] / 1e9:.1f} GB/s (pinned system memory to "
                        "the GPU): an offloaded row's floor counts its streamed blocks over it"]
    shapes = [f"w{w}" for w in results["widths"]] + [f"tree{n}" for n in results["trees"]]
    head = " | ".join(s.replace("w", "L=").replace("tree", "tree ") for s in shapes)
    lines += [f"| model | dtype | path | weights read / forward | live KV | floor ms | {head} | L=1 / floor | "
              f"L={results['widths'][-1]} / L=1 | peak | top-1 vs bf16 | KL |",
              "|---" * (9 + len(shapes)) + "|"]
    for r in results["forwards"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['dtype']} | failed: {r['error']} |")
            continue
        fl = r["floor_ms"]
        cells = " | ".join(f"{r[s]:.2f}" for s in shapes)
        w1, wl = r[f"w{results['widths'][0]}"], r[f"w{results['widths'][-1]}"]
        streamed = f" ({gb(r['streamed_bytes'])} streamed)" if r.get("streamed_bytes") else ""
        path = r.get("path", "eager") + (" (capture failed)" if r.get("graphs_failed") else "")
        lines.append(f"| {r['model']} | {r['dtype']} | {path} | {gb(r['weight_bytes_per_forward'])}{streamed} | "
                     f"{gb(r['live_kv_bytes'])} | {fl:.2f} | {cells} | {w1 / fl:.2f}x | {wl / w1:.2f}x | "
                     f"{gb(r['peak_allocated']) if 'peak_allocated' in r else '-'} | "
                     f"{r.get('top1_agreement', 1.0):.3f} | {r.get('kl_mean', 0.0):.4f} |")
    offloaded = (f" ({results['n_offload_forwards']} offloaded)"
                 if any("streamed_bytes" in r for r in results["forwards"]) else "")
    lines += ["", f"Forwards with guidance (2 rows), {results['context']:.0%} of the image's tokens cached; "
              f"median of {results['n_forwards']}{offloaded} timed forwards after two warm-ups; path: how the "
              "forwards ran (eager, static shapes, or static shapes replayed as CUDA graphs).", ""]
    if results.get("kernels"):
        lines += ["One 7B MLP projection (11008 x 4096, times --scale) stored each way, a quantized one by each of "
                  "its kernels (loaders/lowbit.py; error: relative distance from the widened weight's product):", "",
                  "| layer | rows | ms | floor ms (its bytes / bandwidth) | error |", "|---|---|---|---|---|"]
        for k in results["kernels"]:
            if "kernel" in k:
                continue
            ms = f"{k['ms']:.3f}" if k["ms"] is not None else f"does not run: {k.get('why', '')}"
            error = f"{k['error']:.4f}" if k.get("error") is not None else ""
            lines.append(f"| {k['dtype']} | {k['rows']} | {ms} | {k['bytes'] / bw['bytes_per_s'] * 1000:.3f} | "
                         f"{error} |")
        chosen = [f"{k['dtype'].split()[0]}: {k['kernel']}" for k in results["kernels"] if "kernel" in k]
        lines += ["", f"Chosen on this card by the loader's measurement: {', '.join(chosen)}." if chosen else "", ""]
    if results.get("embedded"):
        lines += ["| embedded mode | path | step | batch | window | ms / image | forwards | tokens / forward | "
                  "ms / token | engine ms / forward |", "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['mode']} | {r.get('path', 'eager')} | {r.get('step', 'host')} | {r.get('batch', 1)} | "
                  f"{r.get('window') or '-'} | "
                  f"{r['ms_per_image']:.1f} | {r['forwards']:.1f} | {r['tokens_per_forward']:.2f} | "
                  f"{r['ms_per_token']:.3f} | {r['engine_ms_per_forward']:.2f} |" for r in results["embedded"]]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    from ..loaders.offload import HELP as OFFLOAD_HELP
    from ..loaders.offload import streams_of
    from ..loaders.static_cache import CAPTURED
    from ..loaders.storage import STORAGES

    ap = argparse.ArgumentParser(prog="spec-ar bench gpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=list(DEFAULT_MODELS), choices=list(MODELS),
                    help=f"default: {' '.join(DEFAULT_MODELS)}")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16"], choices=[n for n in STORAGES if n != "float32"],
                    help="weight storage of the models (the first is the reference for top-1 and KL)")
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 24, 33])
    ap.add_argument("--trees", type=int, nargs="*", default=[60, 120])
    ap.add_argument("--forwards", type=int, default=10, help="timed forwards per shape")
    ap.add_argument("--context", type=float, default=0.5, help="share of the image's tokens in the cache")
    ap.add_argument("--modes", nargs="*", default=["ar", "sjd", "gsd", "lantern", "vvs"])
    ap.add_argument("--images", type=int, default=3, help="timed embedded batches per mode")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="embedded batch sizes")
    ap.add_argument("--steps", nargs="+", choices=["host", "device"], default=["host", "device"],
                    help="the embedded modes' verify step: read on the host every step, or kept on the device "
                         "(read every few steps; where a mode allows it)")
    ap.add_argument("--scale", type=float, default=1.0, help="the models' widths and depths times this")
    ap.add_argument("--bandwidth-side", type=int, default=None, help="default: 16384 on CUDA, 2048 on CPU")
    ap.add_argument("--offload", action="store_true", help="also each dtype offloaded (but nf4): " + OFFLOAD_HELP)
    ap.add_argument("--offload-forwards", type=int, default=3, help="timed forwards per shape when offloaded")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--paths", nargs="+", choices=["eager", "static", "graphs", "compiled"], default=None,
                    help="decode paths to time (default: eager and graphs on CUDA, eager and static elsewhere; "
                         "offloaded rows run eager and static; compiled: after a torch.compile of each model's block, "
                         "which its layers share)")
    ap.add_argument("--vocabulary", choices=["compact", "full"], default="compact",
                    help="the 7B-class forwards score the ids a stream can hold (the engine's default, which skips "
                         "the output head's text rows) or the whole vocabulary")
    ap.add_argument("--work", help="where the checkpoints are written (default: a temporary folder)")
    ap.add_argument("--out", default="out/bench-gpu")
    args = ap.parse_args(argv)
    if not 0 < args.context < 1:
        ap.error(f"--context must be between 0 and 1 (got {args.context})")
    cuda = torch.device(args.device).type == "cuda"
    args.paths = args.paths or (["eager", "graphs"] if cuda else ["eager", "static"])
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    results = {"device": args.device, "torch": torch.__version__, "widths": args.widths, "trees": args.trees,
               "context": args.context, "n_forwards": args.forwards, "vocabulary": args.vocabulary,
               "n_offload_forwards": args.offload_forwards, "scale": args.scale,
               "device_name": torch.cuda.get_device_name(args.device) if cuda else "CPU",
               "dtype_note": "random weights, real configurations" + (f" x {args.scale}" if args.scale != 1 else "")}
    side = args.bandwidth_side or (16384 if cuda else 2048)
    results["bandwidth"] = bw = bandwidth(args.device, side)
    log(f"bandwidth: {bw['bytes_per_s'] / 1e9:.0f} GB/s ({side} x {side} bfloat16 matrix-vector, {bw['ms']:.3f} ms)")
    wide = lambda n: max(64, round(n * args.scale / 64) * 64)  # noqa: E731
    if args.offload and cuda:
        results["host_link"] = link = host_link(args.device)
        log(f"host link: {link['bytes_per_s'] / 1e9:.1f} GB/s (pinned system memory to the GPU)")
    results["kernels"] = kernels(args.device, args.dtypes, (wide(11008), wide(4096)))
    for k in results["kernels"]:
        if "kernel" in k:
            log(f"layer {k['dtype']:28s} chosen: {k['kernel']}")
        elif k["ms"] is None:
            log(f"layer {k['dtype']:28s} rows {k['rows']:3d}: does not run here ({k.get('why', '')})")
        else:
            floor = k["bytes"] / bw["bytes_per_s"] * 1000
            log(f"layer {k['dtype']:28s} rows {k['rows']:3d}: {k['ms']:.3f} ms (floor {floor:.3f})")
    results["forwards"] = []
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        for name in args.models:
            t = time.perf_counter()
            path = write_model(name, pathlib.Path(work) / name, args.scale)
            reference = None
            rows = [(d, False, p) for d in args.dtypes for p in args.paths]
            rows += [(d, True, p) for d in args.dtypes for p in args.paths
                     if args.offload and d != "nf4" and p not in CAPTURED]
            model, loaded_as = None, None
            for dtype, offloaded, decode_path in rows:
                row = {"model": name, "dtype": dtype + (" offloaded" if offloaded else ""), "path": decode_path}
                try:
                    if loaded_as != (dtype, offloaded):  # each path of a dtype runs on the same weights
                        model = loaded_as = None
                        gc.collect()
                        model = load(path, args.device, dtype, offloaded=offloaded)
                        loaded_as = (dtype, offloaded)
                    if offloaded:
                        row["streamed_bytes"] = sum(s.host_bytes() for m in model.modules.values()
                                                    if (s := streams_of(m)) is not None)
                    nf4 = decode_path in CAPTURED and dtype == "nf4"  # bitsandbytes is not captured
                    model.adapter.decode_path = "static" if nf4 else decode_path
                    row["path"] = model.adapter.decode_path
                    row.update(forwards(model, args, reference, args.offload_forwards if offloaded else None))
                    link = (results.get("host_link") or {}).get("bytes_per_s")
                    row["floor_ms"] = floor_ms(row, bw["bytes_per_s"], link)
                except Exception as err:  # one model's failure is a row, not the end of the run
                    row["error"] = f"{type(err).__name__}: {err}"[:300]
                logits = row.pop("logits", None)
                if reference is None and logits is not None:
                    reference = {"logits": logits}
                results["forwards"].append(row)
                gc.collect()  # some models hold reference cycles: gone before the next one's peak is read
                if cuda:
                    torch.cuda.empty_cache()
                if "error" in row:
                    log(f"{name} {row['dtype']}: {row['error']}")
                    continue
                keys = [f"w{w}" for w in args.widths] + [f"tree{n}" for n in args.trees]
                shapes = "  ".join(f"{k}={row[k]:.2f}" for k in keys)
                log(f"{name} {row['dtype']} {row['path']}: floor {row['floor_ms']:.2f} ms "
                    f"({row['weight_bytes_per_forward'] / 1e9:.2f} GB weights + "
                    f"{row['live_kv_bytes'] / 1e9:.2f} GB KV)  {shapes}  "
                    f"({time.perf_counter() - t:.0f} s)")
            model = None
            gc.collect()
            for p in pathlib.Path(work, name).rglob("*"):  # before the next model's files
                if p.is_file():
                    p.unlink()
    if args.modes:
        log("embedded model:")
        results["embedded"] = embedded_modes(args, log)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    text = report(results)
    (out / "report.md").write_text(text)
    print(text)
    return 0
