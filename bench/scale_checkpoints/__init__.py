"""Random-weight checkpoints with the real 7B / 8B / 34B configurations, in each family's release layout.

    python -m spec_ar.bench.scale_checkpoints --family janus-pro-7b --out DIR [--layout converted|original|diffusers]
        [--dtype bfloat16] [--scale 1.0 | --layers N] [--seed 0] [--shard-gb 5] [--check]

A module per family holds its configuration (gathered in :data:`CONFIGS`), the sources of its values, its
layouts (``--layout``, the first one the default: the layout the main release ships) and its writer: janus.py
(``janus-pro-7b``), chameleon.py (``lumina-mgpt-7b-768``, ``anole-7b``), emu3.py (``emu3-gen``), lumina2.py
(``lumina-mgpt-2.0``), liquid.py (``liquid-7b``), simplear.py (``simplear-1.5b``), emu35.py (``emu35-image``, 34B),
glm_image.py (``glm-image``: the 9B AR model and the 7B DiT in the release's diffusers layout); llamagen.py gives
LlamaGen's shapes.  Beside them, what they share: tensors.py (what a file holds, and its values), weight_files.py
(the safetensors, torch archive and sharded writers), json_files.py, bpe.py (tokenizers), vqgan.py (Meta's VQGAN),
scaling.py and stats.py; check.py reads a folder back; __main__.py is the command line.

Tensor names and shapes come from the transformers model built on the meta device from the configuration
(:data:`CONFIGS`), mapped to the original names where a layout needs them; nothing is allocated for them.
Weights are written tensor by tensor: safetensors files are streamed in chunks of :data:`.tensors.CHUNK`
elements (the header is known in advance), torch pickles (``.bin``, ``.pth``, ``.ckpt``) are written as torch.save
writes them (``data.pkl`` pickled from placeholders, then one zip record per tensor), so the writer holds one chunk
(safetensors) or one tensor (torch pickles) at a time.  Values: ``normal_(0, 0.02)`` per tensor from a
generator seeded by ``--seed`` and the tensor's name, norms 1, biases 0 (an initialised model: finite
activations), convolution kernels ``1 / sqrt(fan_in)`` and VQ codebooks 1 (so VQ decoders make varied
pictures).  Tensors that hold the same weights in two layouts (Janus' original vs converted names, Meta's
interleaved ``wq`` rows vs transformers' half-split ones) are drawn from the same seeds, so both layouts of
a family load to the same model.

Tokenizers are built offline (byte-level BPE over the 256 byte symbols and a few merges, unreachable filler
entries up to the real vocabulary size) with the special tokens at their real ids where known (see
:data:`CONFIGS`).  ``--scale s`` shrinks widths (whole heads of the real head size) and depths by ``s`` (at
least one of each), keeping vocabularies, codebooks, downsampling and image grids; ``--layers N`` keeps every
width and gives the language model N of its layers (GLM-Image's DiT too, at most its own 30: a model too big for
the machine measured at a fraction of its depth: what it holds and costs is the rest plus N times a layer);
``--check`` reads back only the headers and indexes (no weights) and checks them against the loaders' key mappings.
"""
from __future__ import annotations

import pathlib
import time

import torch

from . import chameleon, emu3, emu35, glm_image, janus, liquid, lumina2, simplear
from .chameleon import chameleon_config, chameleon_vocabulary
from .emu3 import emu3_config, emu3_vocabulary
from .emu35 import emu35_model_config, emu35_settings
from .janus import janus_config
from .liquid import liquid_config
from .lumina2 import lumina2_config
from .simplear import simplear_config
from .stats import Stats, Written, peak_rss
from .tensors import meta_state
from .vqgan import vqgan_spec
from .weight_files import HOLES

# Sources: each value of a family's configuration names one (what it is, in the family's module):
#  [T]  the defaults of transformers' config classes (read in transformers 5.24; tests/test_scale_checkpoints.py
#       checks them against the installed version).
#  [C]  transformers' converters (convert_<family>_weights_to_hf.py).
#  [N]  /work/shared/notes/model-formats.md and the loaders' docstrings (token ids read from the references, image
#       grids).
#  [R]  the release's own config.json as published -- recalled, not re-read offline.
#  [D]  derived, not read anywhere: ids the references do not fix.
#  [M]  Lumina-mGPT 2.0's code; [A] assumed: what no published file here fixes (both in lumina2.py).
#  [S]  SimpleAR's code (simplear.py); [E] Emu3.5's (emu35.py).
#  [F]  FastVideo's GlmImageDiTArchConfig; [P] diffusers' GlmImagePipeline (both in glm_image.py).
FAMILIES = (janus, chameleon, emu3, lumina2, liquid, simplear, emu35, glm_image)
CONFIGS = {name: cfg for module in FAMILIES for name, cfg in module.CONFIGS.items()}
ALIASES = {"janus": "janus-pro-7b", "janus-pro": "janus-pro-7b", "lumina": "lumina-mgpt-7b-768",
           "lumina-mgpt": "lumina-mgpt-7b-768", "anole": "anole-7b", "emu3": "emu3-gen", "emu3-gen-8b": "emu3-gen",
           "liquid": "liquid-7b", "lumina2": "lumina-mgpt-2.0", "simplear": "simplear-1.5b", "emu35": "emu35-image",
           "emu3.5": "emu35-image", "glm": "glm-image", "glm_image": "glm-image"}
FAMILY_OF = {"janus-pro-7b": "janus", "lumina-mgpt-7b-768": "lumina", "anole-7b": "anole", "emu3-gen": "emu3",
             "liquid-7b": "liquid", "lumina-mgpt-2.0": "lumina2", "simplear-1.5b": "simplear", "emu35-image": "emu35",
             "glm-image": "glm_image"}
#: each family's writer: (family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log)
WRITERS = {name: module.write_release for module in FAMILIES for name in module.CONFIGS}


def resolve(family: str) -> str:
    family = ALIASES.get(family, family)
    if family not in CONFIGS:
        raise ValueError(f"unknown family {family!r}: one of {', '.join(CONFIGS)}")
    return family


def write(family: str, out, layout: str | None = None, dtype: torch.dtype = torch.bfloat16, scale: float = 1.0,
          seed: int = 0, shard_gb: float | None = None, log=print, holes: bool = False,
          layers: int | None = None) -> Written:
    """Write ``family`` in ``layout`` into the folder ``out`` (created; must be empty or new).  ``holes``: the
    safetensors weights as headers over sparse holes (every value zero, no disk space, written at once): for
    what needs the files' layout and sizes but not their values, or redraws the values after loading
    (``spec-ar bench gpu``); torch pickles are written in full.  ``layers``: the language model's depth, every
    width the real one (not with ``scale``, which shrinks both)."""
    family = resolve(family)
    cfg = CONFIGS[family]
    layout = layout or cfg["layouts"][0]
    if layout not in cfg["layouts"]:
        raise ValueError(f"{family} has the layouts {', '.join(cfg['layouts'])} (not {layout!r})")
    if not 0 < scale <= 1:
        raise ValueError(f"--scale must be in (0, 1] (got {scale})")
    if layers is not None:
        cfg = with_layers(family, cfg, layers, scale)
    out = pathlib.Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: not empty")
    out.mkdir(parents=True, exist_ok=True)
    default_gb = cfg["shard_gb"].get(layout)
    max_bytes = None if default_gb is None and shard_gb is None else (shard_gb or default_gb) * 1e9
    result = Written(family, layout, out, scale, dtype, layers=layers)
    stats = Stats()
    start = time.perf_counter()
    fn = WRITERS[family]
    token = HOLES.set(holes)
    try:
        fn(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log)
    finally:
        HOLES.reset(token)
    result.seconds = time.perf_counter() - start
    result.bytes, result.files = stats.bytes, [str(p) for p in stats.files]
    result.peak_rss = peak_rss()
    return result


def with_layers(family: str, cfg: dict, layers: int, scale: float = 1.0) -> dict:
    """``cfg`` with its language model ``layers`` deep (the writers read the depth from ``cfg["text"]``), and a DiT
    (``cfg["dit"]``: GLM-Image's) as deep, at most its own depth."""
    real = cfg["text"]["num_hidden_layers"]
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= real:
        raise ValueError(f"--layers must be a whole number of layers from 1 to {real} for {family} (got {layers!r})")
    if scale != 1:
        raise ValueError(f"--layers keeps the real widths and --scale {scale} shrinks them: give one of the two")
    out = {**cfg, "text": {**cfg["text"], "num_hidden_layers": layers}}
    if "dit" in cfg:
        out["dit"] = {**cfg["dit"], "num_layers": min(layers, cfg["dit"]["num_layers"])}
    return out


#: families whose release is a plain transformers causal LM with its output layer tied to the embedding
TIED_CAUSAL_LMS = {"liquid-7b": ("GemmaConfig", "GemmaForCausalLM"),
                   "simplear-1.5b": ("Qwen2Config", "Qwen2ForCausalLM")}


def tied_causal_lm_state(family: str, config) -> dict:
    """Meta tensors of a :data:`TIED_CAUSAL_LMS` model (``config``: a config object, or a folder to read it
    from), without ``lm_head.weight``: tied, it is not in the files."""
    import transformers

    config_class, model_class = (getattr(transformers, name) for name in TIED_CAUSAL_LMS[family])
    if isinstance(config, (str, pathlib.Path)):
        config = config_class.from_pretrained(str(config))
    state = meta_state(model_class, config)
    state.pop("lm_head.weight")
    return state


def planned_parameters(family: str, scale: float = 1.0, layers: int | None = None) -> int:
    """Parameters of the family's transformers model (converted layout) at ``scale`` or ``layers`` deep, from the
    meta device: nothing is allocated or written (an image tokenizer outside the model's weights not counted;
    GLM-Image: every weight of the release, its parts in :func:`.glm_image.parameter_counts`)."""
    from transformers import (ChameleonForConditionalGeneration, Emu3ForConditionalGeneration,
                              JanusForConditionalGeneration)

    family = resolve(family)
    cfg = CONFIGS[family]
    if layers is not None:
        cfg = with_layers(family, cfg, layers, scale)
    if family == "janus-pro-7b":
        state = meta_state(JanusForConditionalGeneration, janus_config(cfg, scale, {}))
    elif family == "emu3-gen":
        vocab = emu3_vocabulary(cfg, cfg["text"]["vocab_size"], cfg["vq"]["codebook_size"])
        state = meta_state(Emu3ForConditionalGeneration, emu3_config(cfg, scale, vocab))
    elif family in TIED_CAUSAL_LMS:
        state = tied_causal_lm_state(family, {"liquid-7b": liquid_config, "simplear-1.5b": simplear_config}[family](
            cfg, scale))
    elif family == "emu35-image":
        from transformers import Qwen3ForCausalLM

        state = meta_state(Qwen3ForCausalLM, emu35_model_config(emu35_settings(cfg, scale, torch.bfloat16)))
    elif family == "glm-image":
        return sum(glm_image.parameter_counts(cfg, scale).values())
    elif family == "lumina-mgpt-2.0":
        from transformers import ChameleonConfig

        settings = lumina2_config(cfg, scale, torch.bfloat16)
        config = ChameleonConfig(**{k: v for k, v in settings.items() if k not in ("architectures", "model_type")})
        state = {k: v for k, v in meta_state(ChameleonForConditionalGeneration, config).items()
                 if not k.startswith("model.vqmodel.")}  # not in the release
    else:
        spec = vqgan_spec(cfg, scale)
        vocab = chameleon_vocabulary(cfg["text"]["vocab_size"], spec.n_embed, meta=False)
        state = meta_state(ChameleonForConditionalGeneration, chameleon_config(cfg, scale, vocab, spec, False))
    return sum(v.numel() for v in state.values())
