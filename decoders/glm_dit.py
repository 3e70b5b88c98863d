"""GLM-Image's DiT stage (zai-org/GLM-Image): prior tokens and the prompt -> images, through diffusers.

The release is a diffusers folder; besides the AR model (``vision_language_encoder/``, ``processor/``,
:mod:`..loaders.glm_image`) it holds the decoder's parts: ``transformer/`` (``GlmImageTransformer2DModel``, the 7B
DiT), ``vae/`` (``AutoencoderKL``), ``text_encoder/`` + ``tokenizer/`` (the ByT5 glyph encoder, ``T5EncoderModel``
and ``ByT5Tokenizer``) and ``scheduler/`` (``FlowMatchEulerDiscreteScheduler``).  Each is loaded here by its own
diffusers / transformers class from its folder, safetensors only (``use_safetensors=True``: a folder with pickled
weights alone is refused, nothing is unpickled).

**Decoding is diffusers' own** ``GlmImagePipeline.__call__`` (diffusers >= 0.37; read on 0.42.1), built from those
parts with the AR slots (``vision_language_encoder``, ``processor``) empty: given ``prior_token_ids`` the pipeline
never touches them (``generate_prior_tokens`` is skipped), so the AR model is not loaded a second time.  What it
does with them, and so what :meth:`GlmDiT.decode` does:

* the prior tokens: the large grid ``[B, H/32, W/32]`` upsampled 2x (nearest), flattened: ``[B, 4 H W / 1024]``
  (:func:`upsample`, as ``generate_prior_tokens`` does), each a code of the DiT's ``prior_token_embedding``;
* the prompt: only its quoted text reaches the DiT (``get_glyph_texts``: '...', "...", \u201c...\u201d,
  \u300c...\u300d), encoded by the ByT5 encoder (an empty glyph list encodes ``""``); the rest of the prompt
  conditioned the AR stage only;
* ``guidance_scale`` > 1: classifier-free guidance against the empty glyph text with the prior tokens dropped
  (``prior_token_drop``); the pipeline's default 1.5, ``num_inference_steps`` 50 (read from ``__call__``'s
  signature: :func:`pipeline_defaults`);
* the noise: ``randn`` of ``[B, C, H/8, W/8]`` from the one ``generator`` (here a CPU ``torch.Generator`` seeded
  with ``seed``, so a seed gives the same noise on every device), the flow-matching Euler steps with the
  resolution-dependent shift, the VAE decode with its ``latents_mean`` / ``latents_std``; ``output_type="pt"``:
  images ``[B, 3, H, W]`` float32 in [0, 1].

A NaN or infinity in an image is :class:`NonFiniteDiTError` (a ``NonFiniteImageError``), not a black picture.

diffusers is an optional dependency of this family only (``pip install 'diffusers>=0.37'``, the pack's ``glm``
extra); :func:`diffusers_classes` is the one place that imports it and names what to install.
"""
from __future__ import annotations

import inspect
import math
import pathlib
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..formats.checkpoints import (CheckpointError, assign_weights, checked_weight_files, empty_model, hf_call,
                                   peek, read_json, read_weights, weight_files)
from ..sampling.checks import NonFiniteImageError
from .blocks import decoder_bytes

INSTALL = "pip install 'diffusers>=0.37'"
#: the release's folders this decoder reads (model_index.json's component names)
PARTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")
#: the parts that are modules (weights), with what errors call them
MODULES = {"transformer": "GLM-Image's DiT (GlmImageTransformer2DModel)", "vae": "GLM-Image's VAE",
           "text_encoder": "GLM-Image's glyph encoder (T5EncoderModel)"}
#: the pipeline's defaults when its signature cannot be read (diffusers 0.37 - 0.42: 50 steps, guidance 1.5)
FALLBACK_DEFAULTS = {"steps": 50, "guidance": 1.5}
PIXELS_PER_PRIOR = 32  # pixels per large-grid token: 2x upsampling x VAE scale 8 x patch 2 in the release
#: live [tokens, inner_dim] activations of one transformer block at a time (attention in and out, the MLP's 4x)
DIT_LIVE_TENSORS = 12


@dataclass(frozen=True)
class Setting:
    """One of the DiT stage's settings, declared once for the command line (``option``) and the GLM-Image DiT
    Decode node (``name``, its widget): an attribute of :class:`~..loaders.glm_image.PriorDecode` too."""

    name: str  # PriorDecode's attribute, the node's widget
    kind: str  # "int" or "float"
    lo: float
    hi: float  # the node widget's cap (the command line checks lo only: any finite value above it is allowed)
    step: float
    default: float
    help: str

    @property
    def option(self) -> str:
        return f"--dit-{self.name}"

    def range_text(self) -> str:
        return f">= {self.lo:g}"

    def check(self, value, shown: str | None = None):
        """``value`` if allowed, else a ``ValueError`` naming ``shown`` (the option or widget; default the
        option)."""
        shown = shown or self.option
        integer = self.kind == "int"
        ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
        if not ok or not math.isfinite(value) or not value >= self.lo:
            kind = "an integer" if integer else "a finite number"
            raise ValueError(f"{shown} must be {kind} {self.range_text()} (got {value!r})")
        return int(value) if integer else float(value)

    def parse(self, text: str, shown: str | None = None):
        """The value of a command-line string, checked."""
        try:
            value = int(text) if self.kind == "int" else float(text)
        except (TypeError, ValueError):
            kind = "an integer" if self.kind == "int" else "a finite number"
            raise ValueError(f"{shown or self.option} must be {kind} {self.range_text()} (got {text!r})") from None
        return self.check(value, shown)


#: the DiT stage's settings (defaults: the pipeline's own, :data:`FALLBACK_DEFAULTS`; a seed of its own, 0)
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("steps", "int", 1, 1000, 1, FALLBACK_DEFAULTS["steps"],
            "GLM-Image's DiT stage: denoising steps (flow-matching Euler); fewer is faster and coarser"),
    Setting("guidance", "float", 0, 100, 0.1, FALLBACK_DEFAULTS["guidance"],
            "GLM-Image's DiT stage: classifier-free guidance scale against the empty glyph text with the prior "
            "tokens dropped; 1 or less turns guidance off (one DiT pass per step)"),
    Setting("seed", "int", 0, 2**63 - 1, 1, 0,
            "GLM-Image's DiT stage: seed of its noise, one generator for the whole batch (its own seed, not "
            "the AR stage's)"),
)}


class NonFiniteDiTError(NonFiniteImageError):
    """The DiT stage turned valid prior tokens into NaN or infinity."""

    def __init__(self, sample: int):
        self.step, self.sample, self.position = "decode", sample, None
        ValueError.__init__(
            self, f"GLM-Image's DiT stage output for image {sample} of the batch (after sampling) holds NaN or "
                  "infinity, so there is no picture to save; float16 overflows like this: load the model in "
                  "bfloat16 or float32")


def diffusers_classes() -> dict:
    """The classes the decoder is built of, or one :class:`CheckpointError` naming what to install (diffusers
    missing or older than 0.37, transformers older than 5.0)."""
    try:
        import transformers

        from transformers import ByT5Tokenizer, T5EncoderModel
    except ImportError:  # pragma: no cover - transformers is a dependency of the pack
        raise CheckpointError(f"GLM-Image's DiT stage needs transformers >= 5.0 and diffusers >= 0.37: "
                              f"pip install 'transformers>=5.0' and {INSTALL}") from None
    try:
        from transformers import GlmImageConfig  # noqa: F401  (transformers >= 5.0)
    except ImportError:
        raise CheckpointError(f"GLM-Image's DiT stage needs transformers >= 5.0 (diffusers' GlmImagePipeline "
                              f"imports its GLM-Image classes); this environment has transformers "
                              f"{transformers.__version__}: pip install 'transformers>=5.0'") from None
    try:
        import diffusers
        from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, GlmImagePipeline,
                               GlmImageTransformer2DModel)
    except ImportError:
        try:
            import diffusers

            have = f"diffusers {diffusers.__version__}, which has no GlmImagePipeline"
        except ImportError:
            have = "no diffusers"
        raise CheckpointError(f"GLM-Image's decoder (its DiT stage, diffusers' GlmImagePipeline) needs diffusers "
                              f">= 0.37; this environment has {have}: {INSTALL}") from None
    return {"pipeline": GlmImagePipeline, "transformer": GlmImageTransformer2DModel, "vae": AutoencoderKL,
            "text_encoder": T5EncoderModel, "tokenizer": ByT5Tokenizer,
            "scheduler": FlowMatchEulerDiscreteScheduler, "version": diffusers.__version__}


def pipeline_defaults(pipeline_class) -> dict:
    """``{"steps", "guidance"}``: ``GlmImagePipeline.__call__``'s own defaults."""
    try:
        params = inspect.signature(pipeline_class.__call__).parameters
        steps, guidance = params["num_inference_steps"].default, params["guidance_scale"].default
    except (KeyError, TypeError, ValueError):
        return dict(FALLBACK_DEFAULTS)
    if not isinstance(steps, int) or not isinstance(guidance, (int, float)):
        return dict(FALLBACK_DEFAULTS)
    return {"steps": steps, "guidance": float(guidance)}


def missing_parts(release: pathlib.Path) -> list[str]:
    """The decoder's folders (:data:`PARTS`) ``release`` lacks."""
    return [p for p in PARTS if not (pathlib.Path(release) / p).is_dir()]


def upsample(prior: torch.Tensor) -> torch.Tensor:
    """The large grid ``[B, H, W]`` -> the pipeline's ``prior_token_ids`` ``[B, 4 H W]`` (2x nearest, flattened:
    ``GlmImagePipeline._upsample_token_ids`` per sample)."""
    grid = prior.unsqueeze(1).float()
    return torch.nn.functional.interpolate(grid, scale_factor=2, mode="nearest").long().flatten(1)


class GlmDiT:
    """The DiT stage: :meth:`decode` turns the large grid of prior tokens and the prompts into images by calling
    ``GlmImagePipeline`` (built from the parts, the AR slots empty).  What it is (its configs, the pipeline's
    defaults, its weights' size) is read at :meth:`load`; the weights come in at the first decode (:meth:`enter`)
    and can leave between turns (:meth:`park` to system memory, :meth:`drop` out of memory: the next
    :meth:`enter` reads them again), so the AR stage and the DiT need not be in memory together
    (:mod:`..loaders.stages`)."""

    def __init__(self, where: dict, classes: dict, device, dtype: torch.dtype, source: str = ""):
        self.where, self.classes, self.source = where, classes, source
        self.target, self.weights_dtype = torch.device(device), dtype
        self.config = self._config("transformer")
        vae = self._config("vae")
        self.defaults = pipeline_defaults(classes["pipeline"])
        self.version = classes["version"]
        # as GlmImagePipeline computes them: 2 ** (VAE levels - 1), 2x upsampled prior tokens of patch_size
        self.vae_scale_factor = 2 ** (len(vae.get("block_out_channels") or [0] * 4) - 1)
        self.pixels_per_prior = 2 * self.vae_scale_factor * int(self.config.get("patch_size", 0))
        self.codes = int(self.config.get("prior_vq_quantizer_codebook_size", 0))
        self.width = int(self.config.get("num_attention_heads", 0)) * int(self.config.get("attention_head_dim", 0))
        self.first_channels = int((vae.get("block_out_channels") or [0])[0])
        self.tokenizer = hf_call(lambda: classes["tokenizer"].from_pretrained(
            str(where["tokenizer"]), local_files_only=True), where["tokenizer"], "GLM-Image's ByT5 tokenizer")
        self.scheduler = hf_call(lambda: classes["scheduler"].from_pretrained(
            str(where["scheduler"]), local_files_only=True), where["scheduler"], "GLM-Image's scheduler")
        self.parts: dict | None = None  # the modules, while in memory
        self.pipeline = None

    def _config(self, part: str) -> dict:
        return read_json(self.where[part] / "config.json")  # one error naming the file if it is not JSON

    @classmethod
    def load(cls, release: str | pathlib.Path | None = None, device="cpu", dtype: torch.dtype = torch.float32,
             fill: bool = True, **folders) -> "GlmDiT":
        """The stage of ``release`` (its ``transformer/``, ``vae/``, ``text_encoder/``, ``tokenizer/``,
        ``scheduler/``) or of each part's own folder (``transformer=...`` and so on, which win over the
        release's), its modules in ``dtype`` on ``device``: read now (``fill``) or at the first decode.
        diffusers is checked first, before anything is read."""
        classes = diffusers_classes()
        unknown = set(folders) - set(PARTS)
        if unknown:
            raise TypeError(f"unknown parts {sorted(unknown)}; the parts are {list(PARTS)}")
        where = {}
        for part in PARTS:
            given = folders.get(part)
            path = pathlib.Path(given) if given is not None else None if release is None else \
                pathlib.Path(release) / part
            if path is None or not path.is_dir():
                raise CheckpointError(f"GLM-Image's DiT stage: its {part} folder is missing "
                                      f"({path if path is not None else 'no release folder given'}); the release "
                                      f"has {', '.join(p + '/' for p in PARTS)}")
            where[part] = path
        for part in MODULES:
            if not any(f.suffix == ".safetensors" for f in weight_files(where[part])):
                pickled = sorted(f.name for f in where[part].iterdir() if f.suffix in (".bin", ".pt", ".pth"))
                found = f"pickled weights only ({', '.join(pickled)}), which are not loaded" if pickled else \
                    "no weights: the download is incomplete"
                raise CheckpointError(f"{where[part]}: {MODULES[part]} is read from safetensors files; this folder "
                                      f"has {found}")
        dit = cls(where, classes, device, dtype, str(release or where["transformer"]))
        if dit.pixels_per_prior != PIXELS_PER_PRIOR:
            raise CheckpointError(f"{where['transformer']}: GLM-Image's DiT makes {dit.pixels_per_prior} px per "
                                  f"prior token (2 x VAE scale {dit.vae_scale_factor} x patch size "
                                  f"{dit.config.get('patch_size')}); the AR stage's prior tokens are "
                                  f"{PIXELS_PER_PRIOR} px each")
        if fill:
            dit.enter()
        return dit

    def weight_files(self) -> list[pathlib.Path]:
        """The safetensors files the stage's modules are read from (the DiT's, the VAE's, the glyph encoder's)."""
        return [f for part in MODULES for f in weight_files(self.where[part])]

    def weight_bytes(self) -> int:
        """The stage's weights in memory, in its dtype (read from the files' headers: every tensor of the three
        modules is floating and read in that dtype)."""
        return sum(math.prod(shape) for f in self.weight_files() for shape in peek(f).values()) * \
            self.weights_dtype.itemsize

    def _transformer(self) -> torch.nn.Module:
        """The 7B DiT built with its parameters on the meta device and given the files' tensors (one copy of
        the weights in memory, without accelerate, whatever dtype is asked)."""
        folder, cls = self.where["transformer"], self.classes["transformer"]
        files = checked_weight_files(folder)
        if any(f.suffix != ".safetensors" for f in files):
            raise CheckpointError(f"{folder}: GLM-Image's DiT is read from safetensors only (pickled weights are "
                                  "not loaded)")
        model = hf_call(lambda: empty_model(cls.from_config, dict(self.config)), folder, MODULES["transformer"])
        assign_weights(model, read_weights(files, self.weights_dtype), folder, MODULES["transformer"])
        return model  # its tensors read in the dtype asked (it has no buffers of its own)

    def enter(self) -> None:
        """The modules on the device, read from the files if they are not in memory."""
        if self.parts is None:
            parts = {"transformer": self._transformer()}
            for part in ("vae", "text_encoder"):
                path = self.where[part]
                files = [f for f in path.iterdir() if f.is_file()]
                # the VAE (0.1 B) is built then given its weights, as diffusers does without accelerate, said here
                typed = {"dtype": self.weights_dtype} if part == "text_encoder" else \
                    {"torch_dtype": self.weights_dtype, "low_cpu_mem_usage": False}
                parts[part] = hf_call(lambda c=self.classes[part], p=path, t=typed: c.from_pretrained(
                    str(p), use_safetensors=True, local_files_only=True, **t), path, MODULES[part], files)
            for part, module in parts.items():
                parts[part] = module.to(self.target).eval()
            self.parts = parts
            self.pipeline = self.classes["pipeline"](processor=None, vision_language_encoder=None,
                                                     tokenizer=self.tokenizer, scheduler=self.scheduler, **parts)
            self.pipeline.set_progress_bar_config(disable=True)
        elif self.device != self.target:
            for module in self.parts.values():
                module.to(self.target)

    def park(self) -> None:
        """The modules in system memory (back on the device at the next :meth:`enter`)."""
        if self.parts is not None:
            for module in self.parts.values():
                module.to("cpu")

    def drop(self) -> None:
        """The modules out of memory (read again at the next :meth:`enter`)."""
        self.parts = self.pipeline = None

    @property
    def modules(self) -> dict[str, torch.nn.Module]:
        """The modules while in memory (none otherwise)."""
        if self.parts is None:
            return {}
        return {"glm_image_dit": self.parts["transformer"], "glm_image_vae": self.parts["vae"],
                "glm_image_glyph_encoder": self.parts["text_encoder"]}

    @property
    def device(self) -> torch.device:
        """Where the modules are (where they go at :meth:`enter` while they are not in memory)."""
        if self.parts is None:
            return self.target
        return next(self.parts["transformer"].parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return self.weights_dtype

    def bytes_per_image(self, rows: int, cols: int, guidance: float | None = None) -> int:
        """An estimate of one image's peak activations for a ``rows x cols`` large grid: the larger of the DiT's
        (a block's live ``[tokens, width]`` tensors, twice under guidance) and the VAE decoder's."""
        guidance = self.defaults["guidance"] if guidance is None else guidance
        tokens = rows * cols * 4  # the upsampled prior tokens, one per DiT patch
        itemsize = self.dtype.itemsize
        dit = (2 if guidance > 1 else 1) * DIT_LIVE_TENSORS * tokens * self.width * itemsize
        pixels = rows * cols * self.pixels_per_prior ** 2
        return max(dit, decoder_bytes(pixels, self.first_channels, itemsize))

    def check_prior(self, prior: torch.Tensor) -> None:
        if not isinstance(prior, torch.Tensor) or prior.dim() != 3 or prior.is_floating_point():
            raise ValueError("GLM-Image's DiT takes prior tokens as an integer tensor [B, H/32, W/32] (the large "
                             f"grid), got {tuple(prior.shape) if isinstance(prior, torch.Tensor) else type(prior)}")
        if prior.numel() and (int(prior.min()) < 0 or int(prior.max()) >= self.codes):
            raise ValueError(f"GLM-Image's DiT has {self.codes} prior codes; the prior tokens hold ids from "
                             f"{int(prior.min())} to {int(prior.max())}")

    @torch.no_grad()
    def decode(self, prior: torch.Tensor, prompts: Sequence[str], steps: int | None = None,
               guidance: float | None = None, seed: int = 0,
               progress: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """The large grid ``[B, H, W]`` of prior tokens and one prompt per image -> images ``[B, 3, 32 H, 32 W]``
        float32 in [0, 1] on the CPU: ``GlmImagePipeline(prompt=prompts, prior_token_ids=upsample(prior),
        height=32 H, width=32 W, num_inference_steps=steps, guidance_scale=guidance,
        generator=torch.Generator().manual_seed(seed), output_type="pt")``.  ``progress(done, steps)`` after each
        denoising step (it may raise to stop)."""
        self.check_prior(prior)
        prompts = list(prompts)
        if len(prompts) != len(prior):
            raise ValueError(f"GLM-Image's DiT needs one prompt per image: {len(prompts)} prompts for "
                             f"{len(prior)} images")
        if any(not isinstance(p, str) for p in prompts):
            raise ValueError("GLM-Image's DiT takes text prompts")
        steps = self.defaults["steps"] if steps is None else steps
        guidance = self.defaults["guidance"] if guidance is None else guidance
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an integer >= 1 (got {steps!r})")
        if isinstance(guidance, bool) or not isinstance(guidance, (int, float)) or not guidance >= 0:
            raise ValueError(f"guidance must be a number >= 0 (got {guidance!r})")
        rows, cols = prior.shape[1:]
        self.enter()  # the weights in memory, on the device (a no-op when they are)
        callback = None
        if progress is not None:
            def callback(pipe, i, t, kwargs):
                progress(i + 1, steps)
                return {}
        out = self.pipeline(prompt=prompts, prior_token_ids=upsample(prior).to(self.device),
                            height=rows * self.pixels_per_prior, width=cols * self.pixels_per_prior,
                            num_inference_steps=steps, guidance_scale=float(guidance),
                            generator=torch.Generator().manual_seed(int(seed)), output_type="pt",
                            callback_on_step_end=callback).images
        images = out.float().cpu()
        bad = ~torch.isfinite(images.flatten(1)).all(1)
        if bool(bad.any()):
            raise NonFiniteDiTError(int(bad.nonzero()[0]))
        return images
