"""Reading a written folder back, headers and indexes only (no weights): :func:`header_shapes` and
:func:`check`."""
from __future__ import annotations

import json
import math
import pathlib
import struct

import torch

from . import CONFIGS, FAMILY_OF, TIED_CAUSAL_LMS, resolve, tied_causal_lm_state
from .tensors import meta_state

INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json",
           "diffusion_pytorch_model.safetensors.index.json")


def header_shapes(path: pathlib.Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a weight file without reading its data: the safetensors header, or the
    pickle of a torch zip (tensors memory-mapped, never touched)."""
    path = pathlib.Path(path)
    if path.suffix == ".safetensors":
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if path.stat().st_size != 8 + n + end:
            raise ValueError(f"{path}: {path.stat().st_size} bytes, the header says {8 + n + end}")
        return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    from ...formats.checkpoints import state_dict

    return {k: tuple(v.shape) for k, v in state_dict(obj, wrappers=("state_dict",)).items()}


def check(folder, family: str, layout: str | None = None, expected: dict | None = None, log=print) -> dict:
    """Header-level checks of a written folder (no weights read): the pack detects it as ``family``, the index
    names every tensor of every shard and their total size, the shapes are ``expected`` (file -> {name: shape})
    if given, and the loaders' own key mapping of the original layouts (Janus' remap, Meta's conversion,
    Lumina's norm rows) gives exactly the tensors transformers' model (built on the meta device from the
    folder's configuration) expects (GLM-Image: each weight folder, its names prefixed ``folder/``, against its own
    class)."""
    from ...formats.checkpoints import read_json, weight_files
    from ...loaders.detect import detect

    family = resolve(family)
    layout = layout or CONFIGS[family]["layouts"][0]
    folder = pathlib.Path(folder)
    report = {}
    hit = detect(folder)
    if hit.family != FAMILY_OF[family]:
        raise AssertionError(f"{folder}: detected as {hit.family}, not {FAMILY_OF[family]}")
    report["detected"] = hit.family
    if family == "anole-7b" and layout == "original":
        from ...loaders import chameleon_meta

        files = chameleon_meta.find_meta_files(folder)
        shapes = {str(p): header_shapes(p) for p in files["shards"]}
    else:
        shapes = {}
        for sub in _weight_folders(folder, family).values():
            part = {str(p): header_shapes(p) for p in weight_files(sub)}
            shapes.update(part)
            for index in INDEXES:
                if (sub / index).is_file():
                    data = read_json(sub / index)
                    wmap = data["weight_map"]
                    listed = {(name, sub / f) for name, f in wmap.items()}
                    held = {(name, pathlib.Path(f)) for f, names in part.items() for name in names}
                    if listed != held:
                        raise AssertionError(f"{sub / index}: the weight map and the shards disagree "
                                             f"({len(listed - held)} listed only, {len(held - listed)} held only)")
                    report["index_tensors"] = report.get("index_tensors", 0) + len(wmap)
                    report["index_total_size"] = report.get("index_total_size", 0) + data["metadata"]["total_size"]
    if expected is not None:
        got = {f: {k: list(v) for k, v in s.items()} for f, s in shapes.items()}
        if got != {str(k): v for k, v in expected.items()}:
            raise AssertionError(f"{folder}: the files' tensors are not the ones planned")
    prefixes = {str(sub): f"{name}/" if name else "" for name, sub in _weight_folders(folder, family).items()}
    merged = {prefixes.get(str(pathlib.Path(f).parent), "") + k: v for f, s in shapes.items() for k, v in s.items()}
    report["tensors"] = len(merged)
    report["parameters"] = sum(math.prod(v) for v in merged.values())
    want, have = _expected_model_shapes(folder, family, layout, merged)
    if want != have:
        missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
        wrong = sorted(k for k in set(want) & set(have) if want[k] != have[k])
        raise AssertionError(f"{folder}: mapped tensors do not fit transformers' model: missing {missing[:4]}, "
                             f"unexpected {extra[:4]}, wrong shapes {wrong[:4]}")
    report["model_tensors"] = len(want)
    log(f"check {folder}: detected {hit.family}; {report['tensors']} tensors, {report['parameters'] / 1e9:.3f} B "
        f"parameters in {len(shapes)} file(s); they map onto transformers' model ({len(want)} tensors)")
    return report


def _weight_folders(folder: pathlib.Path, family: str) -> dict[str, pathlib.Path]:
    """Where the family's weights are: the folder itself (name ""), or GLM-Image's weight folders by name."""
    if family == "glm-image":
        from .glm_image import WEIGHT_PARTS

        return {part: folder / part for part in WEIGHT_PARTS}
    return {"": folder}


def _meta_tensors(shapes: dict) -> dict[str, torch.Tensor]:
    return {k: torch.empty(v, device="meta") for k, v in shapes.items()}


def _expected_model_shapes(folder: pathlib.Path, family: str, layout: str, shapes: dict):
    """(shapes transformers' model holds, shapes the folder's tensors give after the loader's mapping)."""
    from ...formats.checkpoints import read_json, tokenizer_from_pretrained

    if family == "janus-pro-7b":
        from transformers import JanusConfig, JanusForConditionalGeneration

        from ...loaders import janus

        cfg = read_json(folder / "config.json")
        if layout == "original":
            tokenizer = tokenizer_from_pretrained(folder)
            meta = _meta_tensors(shapes)
            config = JanusConfig(**janus.translate_config(cfg, meta, tokenizer))
            mapped = {k: tuple(v.shape) for k, v in janus.remap_original_keys(meta).items()}
        else:
            config = JanusConfig.from_pretrained(str(folder))
            mapped = shapes
        want = meta_state(JanusForConditionalGeneration, config)
    elif family == "anole-7b" and layout == "original":
        from transformers import ChameleonConfig, ChameleonForConditionalGeneration

        from ...decoders.vqgan import VQGANSpec
        from ...loaders import chameleon_meta

        files = chameleon_meta.find_meta_files(folder)
        vocab = chameleon_meta.read_vocab(json.loads(files["tokenizer"].read_text()))
        vq = chameleon_meta.vq_config_of(VQGANSpec.from_yaml(files["vqgan"][0]))
        config = ChameleonConfig(**chameleon_meta.translate_config(chameleon_meta.read_params(files), vocab, vq))
        mapped = {k: tuple(v.shape) for k, v in chameleon_meta.remap_meta_keys(_meta_tensors(shapes), config).items()}
        want = {k: v for k, v in meta_state(ChameleonForConditionalGeneration, config).items()
                if not k.startswith("model.vqmodel.")}  # filled from vqgan.ckpt
    elif family in ("anole-7b", "lumina-mgpt-7b-768", "lumina-mgpt-2.0"):
        from transformers import ChameleonConfig, ChameleonForConditionalGeneration

        from ...loaders import chameleon

        config = ChameleonConfig.from_pretrained(str(folder))
        repeats = chameleon.norm_repeats(shapes, config, str(folder))
        mapped = {k: ((repeats[k], v[1]) if k in repeats else v) for k, v in shapes.items()}
        want = meta_state(ChameleonForConditionalGeneration, config)
        if layout == "original":  # Lumina's save has no VQ encoder (transformers initialises it)
            want = {k: v for k, v in want.items() if not k.startswith("model.vqmodel.")}
    elif family in TIED_CAUSAL_LMS:
        mapped = shapes
        want = tied_causal_lm_state(family, folder)
    elif family == "glm-image":
        from .glm_image import folder_settings, part_models, saved_state

        mapped = shapes
        want = {f"{part}/{k}": v for part, model in part_models(folder_settings(folder)).items()
                for k, v in saved_state(model).items()}
    elif family == "emu35-image":
        from transformers import Qwen3ForCausalLM

        from ...loaders.emu35 import qwen3_config

        mapped = shapes
        want = meta_state(Qwen3ForCausalLM, qwen3_config(read_json(folder / "config.json"), folder / "config.json"))
    else:
        from transformers import Emu3Config, Emu3ForConditionalGeneration

        config = Emu3Config.from_pretrained(str(folder))
        mapped = shapes
        want = meta_state(Emu3ForConditionalGeneration, config)
    return {k: tuple(v.shape) for k, v in want.items()}, {k: tuple(v) for k, v in mapped.items()}
