"""Which family a checkpoint file or folder holds, judged by its contents.

Each family module declares a :class:`~.family.Family` (how to recognise its files,
what it needs, how to load); :data:`FAMILIES` asks them in turn.
"""
from __future__ import annotations

import pathlib

import torch

from ..formats.checkpoints import CheckpointError, peek, read_json
from ..sampling.config import ConfigError
from . import chameleon, embedded, emu3, emu35, glm_image, janus, liquid, llamagen, lumina2, simplear
from .family import Detected, Family, LoadOptions, NotAModel
from .offload import ACTIVE as OFFLOAD
from .static_cache import resolve_path
from .sizing import choose
from .storage import STORAGES, check_available, checkpoint_files, full_dtype

#: detection order.  The folder families come first and LlamaGen last: it recognises a
#: folder by reading the checkpoint files in it, which must not happen to Meta's
#: 14 GB consolidated.pth (an Anole folder).  Their config.json sets them apart otherwise.
FAMILIES: tuple[Family, ...] = (embedded.FAMILY, janus.FAMILY, lumina2.FAMILY, chameleon.LUMINA, emu35.FAMILY,
                                emu3.FAMILY, chameleon.ANOLE, liquid.FAMILY, simplear.FAMILY, glm_image.FAMILY,
                                llamagen.FAMILY)
BY_NAME = {family.name: family for family in FAMILIES}
#: families whose loaders place their language model with ``storage.place`` (quantized storage)
QUANTIZABLE = ("embedded", "llamagen", "emu3", "emu35", "janus", "lumina", "anole", "liquid", "lumina2", "simplear",
               "glm_image")


def _describe(keys: dict) -> str:
    names = sorted(keys)
    return f"{len(names)} tensors, e.g. {', '.join(names[:4])}" if names else "no tensors"


def detect(path: str | pathlib.Path) -> Detected:
    """The family of ``path``; one clear error listing what was found otherwise."""
    if str(path) == "embedded":  # the shipped model's name, not a path
        return Detected("embedded", embedded.FOLDER)
    path = pathlib.Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or folder")
    for family in FAMILIES:
        try:
            hit = family.detect(path)
        except NotAModel:
            raise
        except CheckpointError as err:
            if path.is_dir():  # a folder's config.json that is no JSON object: named as it is
                raise
            raise CheckpointError(f"{path}: not a model this pack recognises ({err}). {_needs()}") from err
        if hit is not None:
            return hit
    raise CheckpointError(f"{path}: not a model this pack recognises (found {_found(path)}). {_needs()}")


def _found(path: pathlib.Path) -> str:
    """What ``path`` holds, for the error when no family recognises it."""
    if not path.is_dir():
        return _describe(peek(path))
    config = path / "config.json"
    if config.is_file():
        return f"config.json with model_type {read_json(config).get('model_type')!r}"
    files = [p for p in path.iterdir() if p.suffix in llamagen.FOLDER_SUFFIXES]
    gpts = llamagen.gpts_in(path)
    return f"no config.json; {len(files)} checkpoint files" + (f", {len(gpts)} LlamaGen GPTs" if gpts else "")


def _needs() -> str:
    return "Supported: " + "; ".join(f"{family.name}: {family.needs}" for family in FAMILIES) + "."


def load_model(path, vq=None, text_encoder=None, resolution=None, device="cpu", dtype=torch.float32,
               width=None, height=None, offload=False, decode_path="auto"):
    """Detect the family of ``path`` and load it as a :class:`~.base.LoadedModel`.  ``offload``: the
    transformer's blocks stay in system memory and are streamed to the GPU as they run (``offload.py``);
    ``decode_path``: how its forwards run (``static_cache.DECODE_PATHS``)."""
    resolve_path(decode_path, device)  # a bad name fails before loading
    if offload:
        check_offload(device)
    hit = detect(path)
    family = BY_NAME[hit.family]
    if family.square and (width or height):
        if width and height and width != height:
            raise ValueError(f"width and height must be equal for {hit.family} models (got {width}x{height})")
        resolution = width or height
    files = [f for p in (hit.path, vq, text_encoder) if p for f in checkpoint_files(p)]
    chosen = choose(files, dtype, device, f"{hit.path.name} ({hit.family})", offload, keep=family.reads)
    if offload and chosen.name == "nf4":
        raise ConfigError("dtype 'nf4' cannot be offloaded: bitsandbytes keeps 4-bit weights on the GPU; with offload "
                          "use bfloat16, float16, int8 or fp8 (int8 streams half the bytes of bfloat16)")
    if chosen.quantized and hit.family not in QUANTIZABLE:
        raise ConfigError(f"dtype {chosen.name!r}: quantized storage is not available for {hit.family} models yet; "
                          f"use {', '.join(n for n, s in STORAGES.items() if not s.quantized)} "
                          f"(quantized storage: {', '.join(QUANTIZABLE)})")
    check_available(chosen, device)
    token = OFFLOAD.set(offload)
    try:
        loaded = family.load(hit, LoadOptions(vq, text_encoder, resolution, width, height, device,
                                              full_dtype(chosen, device), chosen))
    finally:
        OFFLOAD.reset(token)
    loaded.info["offload"] = offload
    path = resolve_path(decode_path, device, capturable=not offload and chosen.name != "nf4")
    return with_storage(loaded, chosen, path)


def check_offload(device) -> None:
    if torch.device(device).type != "cuda":
        raise ConfigError(f"offload streams weights from system memory to a GPU; the device here is {device}, which "
                          "reads them where they are: load without offload")


def with_storage(model, storage, decode_path="eager"):
    """``model`` (and the models its ``resize`` builds) marked with how its weights are stored
    and set to run its forwards on ``decode_path``."""
    model.storage = storage
    model.adapter.decode_path = model.info["decode_path"] = decode_path
    if model.resize is not None:
        resize = model.resize
        model.resize = lambda res: with_storage(resize(res), storage, decode_path)
    return model


def load_drafter(path, target, text_encoder=None, device="cpu", dtype=torch.float32, option="--drafter"):
    """A draft source for ``target`` (a :class:`~.base.LoadedModel`) from ``path``: a
    draft head folder (LANTERN's or ``spec-ar train-drafter``'s), or a sibling model
    with the same family grammar, image codebook and grid, loaded at the target's
    resolution; ``embedded``: the embedded model's shipped head, ``embedded-sibling``
    its shipped two-layer sibling.  Refused with one
    clear error (naming ``option``) when it cannot draft for the target."""
    from ..sampling import ConfigError, HeadDrafts
    from ..sampling.model_drafts import ModelDrafts
    from . import draft_head

    shipped = {  # keyword: (folder, its test, how to make it)
        "embedded": (embedded.DRAFTER, draft_head.is_draft_head, "spec-ar train-drafter --model embedded"),
        "embedded-sibling": (embedded.SIBLING, embedded.is_embedded,
                             f"spec-ar train-embedded --sibling embedded/weights --out {embedded.SIBLING}")}
    if str(path) in shipped:
        folder, present, make = shipped[str(path)]
        if not present(folder):
            raise CheckpointError(f"{option} {path}: the embedded model's {folder.name} is missing ({folder}); "
                                  f"make it with {make}")
        path = folder
    if draft_head.is_draft_head(path):
        drafts = HeadDrafts(draft_head.load_head(path, device, full_dtype(dtype, device)))
        try:
            drafts.check(target.adapter)
        except ConfigError as e:
            raise ConfigError(f"{option} {path}: {e}") from None
        return drafts
    hit = detect(path)
    if hit.condition != target.condition:
        raise ConfigError(f"{option} {path}: a {hit.condition}-conditional {hit.family} model cannot draft for "
                          f"the {target.condition}-conditional {target.name}")
    info = target.info
    model = load_model(path, None, text_encoder, target.resolution, device, dtype,
                       info.get("width") if hit.family == target.family else None,
                       info.get("height") if hit.family == target.family else None)
    drafts = ModelDrafts(model.adapter, model.name)
    try:
        drafts.check(target.adapter)
    except ConfigError as e:
        raise ConfigError(f"{option} {path}: {e}") from None
    return drafts
