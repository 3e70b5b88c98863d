"""A model of stages rendered with its stages taking turns in memory, measured: what the sizing picks for a card,
loaded here in that storage, one image made end to end, the process's resident memory sampled throughout.

    spec-ar bench stages --model FOLDER [--card 24] [--system 64] [--width 256 --height 256] [--mode sjd]
                         [--dit-steps 2] [--seed 0] [--out DIR]

The storage is the cards bench's answer for a ``--card`` GB card with ``--system`` GB of system memory
(``bench/cards.py``: the widest storage whose AR weights fit the card whole, the DiT taking turns with it); the model
is then loaded on this machine's CPU in that storage, where the stages take turns as the sizing says for the memory
here (``sizing.stage_wait``: on a CPU that holds one stage at a time, each leaves memory and is read again at its
turn).  Reported: the wait, the load, sampling (forwards, seconds) and decoding times, the moves the turns made,
the peak resident memory of the whole run and of each phase (``VmRSS``, sampled every 50 ms; ``VmHWM`` for the
whole) beside each stage's weights, and the picture's size.  Writes ``stages.json`` and ``report.md`` into
``--out``.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import threading
import time

GB = 1e9


class Resident:
    """The process's resident memory, sampled on a thread; :meth:`phase` names what runs from now on."""

    def __init__(self, every: float = 0.05):
        self.every, self.name, self.peaks = every, "start", {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def status(field: str = "VmRSS") -> int:
        """Bytes of ``field`` in ``/proc/self/status`` (``VmRSS`` now, ``VmHWM`` the high water); 0 without."""
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        return 0

    def _run(self):
        while not self._stop.is_set():
            self._take()
            time.sleep(self.every)

    def _take(self):
        rss = self.status()
        self.peaks[self.name] = max(self.peaks.get(self.name, 0), rss)

    def phase(self, name: str):
        self._take()
        self.name = name
        self._take()

    def stop(self) -> dict[str, int]:
        self._take()
        self._stop.set()
        self._thread.join()
        return dict(self.peaks)


def sized(model: str, card: float, system: float, width: int, height: int) -> dict:
    """The cards bench's answer for one card (its row), read from a run of it."""
    import tempfile

    from .cards import main as cards, pick

    with tempfile.TemporaryDirectory() as out:
        cards(["--model", model, "--cards", str(card), "--system", str(system), "--width", str(width), "--height",
               str(height), "--storages", "bfloat16", "int8", "fp8", "--out", out])
        report = json.loads((pathlib.Path(out) / "cards.json").read_text())
    best = pick(report["rows"])
    if best is None:
        raise SystemExit(f"nothing fits a {card:g} GB card: {report['rows']}")
    return {**best, "dit_gb": report.get("dit_gb"), "dit_per_image_gb": report.get("dit_per_image_gb")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spec-ar bench stages", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--card", type=float, default=24, help="the card the storage is sized for, GB (default 24)")
    ap.add_argument("--system", type=float, default=64, help="its machine's system memory, GB (default 64)")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--height", type=int, default=256)
    ap.add_argument("--mode", default="sjd")
    ap.add_argument("--dit-steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt", default="a lighthouse at dawn, a sign that reads \"OPEN\"")
    ap.add_argument("--out", default="out/bench-stages")
    args = ap.parse_args(argv)

    memory = Resident()
    memory.phase("sizing")
    answer = sized(args.model, args.card, args.system, args.width, args.height)
    import gc

    import torch

    from ..loaders.storage import trim_heap

    gc.collect()  # the sizing's own load of the model gone before this one
    trim_heap()

    from ..loaders.detect import load_model
    from ..sampling import DecodeConfig, SpeculativeDecoder

    storage = answer["storage"]
    print(f"a {args.card:g} GB card: {storage} ({answer['weights_gb']:.1f} GB of AR weights), stages "
          f"{answer.get('stages')}; loading it here on the CPU", flush=True)
    memory.phase("load")
    t = time.perf_counter()
    model = load_model(args.model, width=args.width, height=args.height, dtype=storage)
    load_s = time.perf_counter() - t
    turns = model.turns
    print(f"loaded in {load_s:.0f} s; stages here: {turns.wait if turns else 'one stage'}", flush=True)
    memory.phase("sampling")
    t = time.perf_counter()
    result = SpeculativeDecoder(model.adapter, DecodeConfig(mode=args.mode)).generate([args.prompt], seeds=args.seed)
    sample_s = time.perf_counter() - t
    forwards = result.reports[0].nfe
    print(f"sampled {model.adapter.layout.length} tokens in {sample_s:.0f} s ({forwards} forwards)", flush=True)
    memory.phase("turn")  # until the AR stage has left: then the DiT's own phase
    if turns is not None:
        turns.on_leave.append(lambda stage, kind: memory.phase("decoding"))
    t = time.perf_counter()
    model.decode.steps = args.dit_steps
    images = model.decode_images(result.image_tokens(model.adapter.layout))
    decode_s = time.perf_counter() - t
    print(f"decoded in {decode_s:.0f} s: {tuple(images.shape)}", flush=True)
    peaks = memory.stop()
    ar_gb = answer["weights_gb"]
    report = {"model": args.model, "card_gb": args.card, "system_gb": args.system, "storage": storage,
              "card_stages": answer.get("stages"), "here_stages": turns.wait if turns else None,
              "width": args.width, "height": args.height, "mode": args.mode, "dit_steps": args.dit_steps,
              "tokens": model.adapter.layout.length, "forwards": forwards, "load_s": load_s, "sample_s": sample_s,
              "decode_s": decode_s, "moves": dict(turns.moves) if turns else None, "ar_weights_gb": ar_gb,
              "dit_weights_gb": answer.get("dit_gb"), "peak_gb": {k: v / GB for k, v in peaks.items()},
              "high_water_gb": Resident.status("VmHWM") / GB, "image": list(images.shape),
              "finite": bool(torch.isfinite(images).all()), "torch": torch.__version__,
              "threads": torch.get_num_threads()}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "stages.json").write_text(json.dumps(report, indent=1))
    (out / "report.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def markdown(r: dict) -> str:
    peaks = ", ".join(f"{k} {v:.2f} GB" for k, v in r["peak_gb"].items())
    return (f"{r['model']}: sized for a {r['card_gb']:g} GB card with {r['system_gb']:g} GB of system memory: "
            f"{r['storage']} (AR weights {r['ar_weights_gb']:.2f} GB, DiT {r['dit_weights_gb'] or 0:.2f} GB; there the "
            f"stages wait: {r['card_stages']}); here (CPU) they wait: {r['here_stages']}\n\n"
            f"| phase | seconds | peak resident |\n|---|---|---|\n"
            f"| load | {r['load_s']:.0f} | {r['peak_gb'].get('load', 0):.2f} GB |\n"
            f"| sampling ({r['mode']}, {r['tokens']} tokens, {r['forwards']} forwards) | {r['sample_s']:.0f} | "
            f"{r['peak_gb'].get('sampling', 0):.2f} GB |\n"
            f"| decoding (DiT {r['dit_steps']} steps, {r['width']}x{r['height']}; from the AR stage's leaving on) | "
            f"{r['decode_s']:.0f} | {r['peak_gb'].get('decoding', 0):.2f} GB |\n\n"
            f"Whole run: high water {r['high_water_gb']:.2f} GB ({peaks}); moves {r['moves']}; image "
            f"{r['image']} finite {r['finite']}; torch {r['torch']}, {r['threads']} threads\n")


if __name__ == "__main__":
    raise SystemExit(main())
