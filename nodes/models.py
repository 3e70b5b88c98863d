"""Load AR Image Model and Load VQ Decoder."""
from __future__ import annotations

import os
from dataclasses import dataclass

from comfy_api.v0_0_2 import io

from . import common

FOLDER = "spec_ar"  # models/spec_ar, or wherever extra_model_paths.yaml points "spec_ar"
ARModel = io.Custom("SPEC_AR_MODEL")
VQDecoder = io.Custom("SPEC_AR_VQ")
Drafter = io.Custom("SPEC_AR_DRAFTER")


def dtypes() -> list[str]:
    """The loader's dtype choices: auto and the storage table (``loaders/storage.py``)."""
    from ..loaders.storage import STORAGES

    return ["auto", *STORAGES]


DEVICES = ["auto", "cpu"]
AUTO_VQ = "auto (built-in, or beside the model)"
NO_TEXT_ENCODER = "auto (built-in, or none)"


def register_folder() -> None:
    import folder_paths

    folder_paths.add_model_folder_path(FOLDER, os.path.join(folder_paths.models_dir, FOLDER))


def folders() -> list[str]:
    import folder_paths

    try:
        return folder_paths.get_folder_paths(FOLDER)
    except KeyError:
        return []


@dataclass
class ARModelHandle:
    """What flows along a SPEC_AR_MODEL link: the loaded model and its ModelPatcher,
    and how to load it again once :meth:`release` (the sampler's "unload after run")
    has given its memory back."""

    _loaded: object  # loaders.base.LoadedModel, None once released
    patcher: object | None
    source: str
    reload: object = None  # () -> (LoadedModel, patcher)

    @property
    def loaded(self):
        if self._loaded is None:
            self._loaded, self.patcher = self.reload()
        return self._loaded

    def ready(self, memory_required: int = 0):
        """Ask ComfyUI's memory manager to put the weights on the device, keeping
        ``memory_required`` bytes free for the run (KV cache, decoding state, decoder).
        A full-precision model may be loaded partially (ComfyUI's lowvram: the layers
        that do not fit stay in system memory and are cast in as they run, see
        :func:`castable`); quantized and offloaded models are loaded whole (their
        int8 / float8 bytes are buffers ComfyUI does not stream; offload streams
        its blocks itself)."""
        loaded = self.loaded
        if loaded.turns is not None:  # a model of stages: the sampling one back on the device first
            loaded.turns.turn("sampling")
        if self.patcher is not None:
            import comfy.model_management as mm

            whole = (loaded.storage is not None and loaded.storage.quantized) or loaded.info.get("offload")
            mm.load_models_gpu([self.patcher], memory_required=memory_required, force_full_load=bool(whole))
            if not whole:
                buffers_to(self.patcher.model, self.patcher.load_device)
        return loaded

    def release(self):
        """Give the model's memory back (GPU and CPU): ComfyUI forgets it and the weights
        are dropped; the next use loads them again."""
        import gc

        if self.patcher is not None:
            import comfy.model_management as mm

            for entry in [e for e in mm.current_loaded_models if e.model is self.patcher]:
                entry.model_unload()
                mm.current_loaded_models.remove(entry)
        if self.reload is None:
            return  # nothing to load it again with: kept
        self._loaded = self.patcher = None
        gc.collect()
        import comfy.model_management as mm

        from ..loaders.storage import trim_heap

        mm.soft_empty_cache()
        trim_heap()  # the CPU side: freed weights would otherwise stay in the process's heap


@dataclass
class VQHandle:
    decode: object  # tokens [B, rows, cols] -> [B, 3, H, W] in [0, 1]
    name: str
    bytes_per_image: object = None  # grid (rows, cols) -> decoder activations per image (an estimate)
    device: str = "cpu"


def _device(device: str):
    import torch

    import comfy.model_management as mm

    return mm.get_torch_device() if device == "auto" else torch.device("cpu")


def dtype_tooltip() -> str:
    from ..loaders.storage import AUTO_HELP, STORAGES

    return ("How the weights are stored. " + " ".join(f"{n}: {s.help}." for n, s in STORAGES.items())
            + f" auto: {AUTO_HELP}. A model that does not fit is refused naming the options that do.")


def offload_tooltip() -> str:
    from ..loaders.offload import HELP

    return HELP[0].upper() + HELP[1:] + ". ComfyUI manages the rest of the model (embeddings, head, image models)."


def decode_paths() -> list[str]:
    from ..loaders.static_cache import DECODE_PATHS

    return list(DECODE_PATHS)


def decode_path_tooltip() -> str:
    from ..loaders.static_cache import HELP

    return HELP[0].upper() + HELP[1:] + "."


#: torch layers that ComfyUI has castable ops for (same parameters; a forward that casts the weights in
#: when its partial loading left them in system memory)
CASTABLE = ("Linear", "Conv2d", "Embedding", "LayerNorm", "GroupNorm")


def castable(module):
    """``module``'s plain torch layers turned into ComfyUI's castable ops in place (their
    class only: the weights stay), so its memory manager can load the model partially."""
    import torch

    import comfy.ops

    ops = comfy.ops.disable_weight_init
    swap = {getattr(torch.nn, name): getattr(ops, name) for name in CASTABLE if hasattr(ops, name)}
    for m in module.modules():
        if type(m) in swap:
            m.__class__ = swap[type(m)]
            if not hasattr(m, "bias"):  # ComfyUI's Embedding has one (None), set by its constructor
                m.bias = None
    return module


def buffers_to(module, device):
    """Buffers (rotary tables, codebook statistics) on ``device``: ComfyUI's partial load moves only
    the layers it lists, those holding parameters."""
    for m in module.modules():
        for key, b in m._buffers.items():
            if b is not None and b.device != device:
                m._buffers[key] = b.to(device)


def _patcher(loaded, device):
    import torch

    import comfy.model_management as mm
    import comfy.model_patcher

    from ..loaders.offload import resident_parts, streams_of

    # an offloaded model's blocks are streamed from system memory by the pack; ComfyUI manages the rest
    modules = torch.nn.ModuleDict({name: torch.nn.ModuleList(resident_parts(m, s.layers)) if (s := streams_of(m)) else m
                                   for name, m in loaded.modules.items()})
    if not loaded.info.get("offload") and not (loaded.storage is not None and loaded.storage.quantized):
        castable(modules)
    return comfy.model_patcher.ModelPatcher(modules, load_device=device, offload_device=mm.unet_offload_device())


def forget(patcher) -> None:
    """ComfyUI's memory manager forgets ``patcher``'s model, which left the device by itself (a stage's turn,
    :mod:`..loaders.stages`): it is loaded again, as new, at its next use."""
    import comfy.model_management as mm

    for entry in [e for e in mm.current_loaded_models if e.model is patcher]:
        mm.current_loaded_models.remove(entry)


def download_root():
    """Where releases are downloaded: the first spec_ar model folder (ComfyUI's models/spec_ar)."""
    paths = folders()
    return paths[0] if paths else None


def fetched(value: str):
    """The folder of a ``download: NAME`` choice, fetched now if it is not on disk (with
    ComfyUI's progress bar, in MB); None for any other value."""
    from ..loaders import downloads

    if not isinstance(value, str) or not value.startswith(downloads.PREFIX):
        return None
    import comfy.utils

    bar = {}

    def progress(done, total):
        if total:
            if "bar" not in bar:
                bar["bar"] = comfy.utils.ProgressBar(max(1, total // 2**20))
            bar["bar"].update_absolute(done // 2**20, max(1, total // 2**20))

    return downloads.download(value, download_root(), progress=progress)


class LoadARImageModel(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        from ..loaders import downloads

        root = download_root()
        models = [common.EMBEDDED] + common.list_models(folders()) + (downloads.missing(root) if root else [])
        vqs = [AUTO_VQ] + [m for m in common.list_models(folders()) if "vq" in m.lower()]
        texts = [NO_TEXT_ENCODER] + [m for m in common.list_models(folders()) if "t5" in m.lower()] + (
            downloads.missing(root, "text encoder") if root else [])
        return io.Schema(
            node_id="SpecAR_LoadModel", display_name="Load AR Image Model", category="SpeculativeAR",
            description="Loads an autoregressive image model (LlamaGen, Janus / Janus-Pro, or the embedded demo "
                        "model) from the spec_ar model folder. The family is detected from the files' contents.",
            inputs=[
                io.Combo.Input("model", options=models, default=common.EMBEDDED,
                               tooltip="A checkpoint file or model folder in models/spec_ar (or a path set for "
                                       "'spec_ar' in extra_model_paths.yaml), the embedded demo model, or a known "
                                       "release not on disk yet ('download: ...'): it is fetched from the Hugging "
                                       "Face hub into models/spec_ar/<name>/ on first use, with progress, and "
                                       "checked before it is used."),
                io.Combo.Input("vq", options=vqs, default=AUTO_VQ, optional=True,
                               tooltip="LlamaGen's VQ tokenizer file (vq_ds16_*.pt). 'auto' takes the family's "
                                       "built-in decoder or a VQ file in the same folder as the model."),
                io.Combo.Input("text_encoder", options=texts, default=NO_TEXT_ENCODER, optional=True,
                               tooltip="LlamaGen text-to-image: a folder holding a copy of google/flan-t5-xl "
                                       "('download: flan-t5-xl' fetches it on first use)."),
                io.Combo.Input("device", options=DEVICES, default="auto",
                               tooltip="auto: ComfyUI's device (the GPU when present); cpu forces the CPU."),
                io.Combo.Input("dtype", options=dtypes(), default="auto", tooltip=dtype_tooltip()),
                io.Boolean.Input("offload", default=False, optional=True, tooltip=offload_tooltip()),
                io.Combo.Input("decode_path", options=decode_paths(), default="auto", optional=True,
                               tooltip=decode_path_tooltip()),
            ],
            outputs=[ARModel.Output(display_name="model", tooltip="The loaded model, for the sampler.")],
        )

    @classmethod
    def validate_inputs(cls, model=None, device=None, dtype=None, vq=None, text_encoder=None, offload=None,
                        decode_path=None):
        from ..loaders import downloads

        for name, value, special in (("model", model, common.EMBEDDED), ("vq", vq, AUTO_VQ),
                                     ("text_encoder", text_encoder, NO_TEXT_ENCODER)):
            if isinstance(value, str) and value.startswith(downloads.PREFIX) and name != "vq":
                if downloads.release_of(value) is None:
                    return f"{name}: {value!r} is not a known release ({', '.join(downloads.RELEASES)})"
                continue
            if value not in (None, special):
                try:
                    common.resolve_model(value, folders())
                except FileNotFoundError as err:
                    return f"{name}: {err}"
        return common.check_choices(device=(device, DEVICES), dtype=(dtype, dtypes()),
                                    decode_path=(decode_path, decode_paths()))

    @classmethod
    def execute(cls, model, device, dtype, vq=AUTO_VQ, text_encoder=NO_TEXT_ENCODER, offload=False,
                decode_path="auto"):
        from ..loaders.detect import load_model

        dev = _device(device)
        path = "embedded" if model == common.EMBEDDED else str(fetched(model) or common.resolve_model(model, folders()))
        vq_path = None if vq in (None, AUTO_VQ) else str(common.resolve_model(vq, folders()))
        t5 = None if text_encoder in (None, NO_TEXT_ENCODER) else str(
            fetched(text_encoder) or common.resolve_model(text_encoder, folders()))

        def load():
            loaded = load_model(path, vq_path, t5, None, dev, dtype, offload=bool(offload),
                                decode_path=decode_path or "auto")
            patcher = _patcher(loaded, dev)
            if loaded.turns is not None:
                loaded.turns.on_leave.append(lambda stage, kind: stage == "sampling" and forget(patcher))
            return loaded, patcher

        return io.NodeOutput(ARModelHandle(*load(), path, reload=load))


class LoadVQDecoder(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        files = [common.BUILT_IN] + common.list_models(folders())
        return io.Schema(
            node_id="SpecAR_LoadVQ", display_name="Load VQ Decoder", category="SpeculativeAR",
            description="A VQ decoder that turns image tokens into pictures: a VQ-16 tokenizer file, or the "
                        "decoder built into a model (Janus, the embedded model, a LlamaGen model loaded with its VQ).",
            inputs=[
                io.Combo.Input("vq", options=files, default=common.BUILT_IN,
                               tooltip="A VQ tokenizer file in models/spec_ar, or the connected model's own."),
                ARModel.Input("model", optional=True, tooltip="Needed for the built-in choice."),
            ],
            outputs=[VQDecoder.Output(display_name="vq", tooltip="For the sampler's vq input or VQ Decode.")],
        )

    @classmethod
    def execute(cls, vq, model=None):
        if vq == common.BUILT_IN:
            if model is None:
                raise ValueError("vq: 'built-in' needs a model connected to the model input")
            if model.loaded.decode is None:
                raise ValueError(f"vq: {model.loaded.name} has no built-in decoder; choose a VQ file")
            loaded = model.loaded
            return io.NodeOutput(VQHandle(loaded.decode, f"{loaded.name} (built-in)",
                                          lambda grid: loaded.decode_bytes_per_image, str(loaded.device)))
        from ..decoders.vq16 import VQ16Decoder

        path = common.resolve_model(vq, folders())
        device = model.loaded.adapter.device if model is not None else "cpu"
        decoder = VQ16Decoder.load(path, device=device)
        return io.NodeOutput(VQHandle(decoder.decode, path.name, decoder.bytes_per_image, str(device)))


#: the drafters that ship with the pack, by combo entry: load_drafter's keyword for each
SHIPPED_DRAFTERS = {common.EMBEDDED_DRAFTER: "embedded", common.EMBEDDED_SIBLING: "embedded-sibling"}


class LoadDrafter(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        from ..loaders import downloads

        root = download_root()
        missing = downloads.missing(root, "drafter") if root else []
        return io.Schema(
            node_id="SpecAR_LoadDrafter", display_name="Load Drafter", category="SpeculativeAR",
            description="A draft model for the sampler's drafter input, in place of Jacobi self-drafting: a draft "
                        "head (LANTERN's released drafters, or one made by spec-ar train-drafter) or a smaller "
                        "sibling of the model with the same codebook and grid. Checked against the model here.",
            inputs=[
                io.Combo.Input("drafter", options=list(SHIPPED_DRAFTERS) + common.list_models(folders()) + missing,
                               default=common.EMBEDDED_DRAFTER,
                               tooltip="A draft head folder (config.json + weights) or a model in models/spec_ar; "
                                       "the embedded model's own head and a smaller sibling of it (two layers "
                                       "in place of six) ship with the pack; LANTERN's released heads not on "
                                       "disk yet ('download: ...') are fetched into models/spec_ar/<name>/ on "
                                       "first use, with progress, and checked before use."),
                ARModel.Input("model", tooltip="The model it drafts for (from Load AR Image Model)."),
            ],
            outputs=[Drafter.Output(display_name="drafter", tooltip="For the sampler's drafter input.")],
        )

    @classmethod
    def validate_inputs(cls, drafter=None, model=None):
        from ..loaders import downloads

        if isinstance(drafter, str) and drafter.startswith(downloads.PREFIX):
            release = downloads.release_of(drafter)
            if release is None or downloads.kind_of(release) != "drafter":
                known = [n for n, r in downloads.RELEASES.items() if downloads.kind_of(r) == "drafter"]
                return f"drafter: {drafter!r} is not a known drafter release ({', '.join(known)})"
            return True
        if drafter is not None and drafter not in SHIPPED_DRAFTERS:
            try:
                common.resolve_model(drafter, folders())
            except FileNotFoundError as err:
                return f"drafter: {err}"
        return True

    @classmethod
    def execute(cls, drafter, model):
        from ..loaders.detect import load_drafter

        loaded = model.loaded
        path = SHIPPED_DRAFTERS.get(drafter) or str(fetched(drafter) or common.resolve_model(drafter, folders()))
        dtype = loaded.storage.name if loaded.storage is not None else loaded.dtype  # a sibling as its target
        return io.NodeOutput(load_drafter(path, loaded, None, loaded.device, dtype, option="drafter"))
