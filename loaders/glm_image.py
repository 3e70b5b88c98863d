"""GLM-Image (zai-org/GLM-Image): its autoregressive stage, the 9B ``GlmImageForConditionalGeneration`` (GLM-4
based) that writes the semantic "prior" tokens a 7B DiT then renders.  The DiT stage (``transformer/``, ``vae/``,
``text_encoder/``, ``tokenizer/``, ``scheduler/`` of the release) is the loaded model's decoder
(:class:`PriorDecode`, diffusers' own ``GlmImagePipeline`` run on the prior tokens: :mod:`..decoders.glm_dit`;
diffusers >= 0.37 needed then, checked before anything is read).  A folder without those parts samples the prior
tokens only: the loaded model has no decoder and says which folders are missing (:func:`no_decoder`: the command
line refuses before sampling, the sampler node shows the token grid and outputs the tokens; :func:`prior_token_ids`
on the stream gives diffusers' ``GlmImagePipeline(prior_token_ids=...)``).

**The decoder needs the prompt** (the DiT is conditioned on its quoted text, through the ByT5 glyph encoder): the
adapter remembers the prompts it last sampled for (:attr:`GlmImageAdapter.last_prompts`) and the decoder uses them,
so ``decode(result.image_tokens(layout))`` after ``generate`` needs nothing more (one prompt for the whole batch:
any chunk of it; different prompts: the whole batch in one call); ``decode(tokens, prompts=[...])`` names them.
Its DiT settings are the decoder's attributes ``steps``, ``guidance`` (the pipeline's defaults, 50 and 1.5, in
``info``) and ``seed`` (0: the DiT's noise is its own, not the AR stage's seed).

**The release** is a diffusers folder: ``model_index.json`` (``GlmImagePipeline``), ``vision_language_encoder/``
(``config.json`` with ``model_type "glm_image"``, ``generation_config.json``, safetensors shards; the vision encoder
and VQ model in those shards serve image-to-image only and are not read), ``processor/`` (``GlmImageProcessor``:
tokenizer, chat template, image processor).  Either the release folder or its ``vision_language_encoder`` folder is
recognised (by contents); the processor is then ``processor/`` in the release folder, beside the encoder folder, or
in the folder itself.

**The reference** is the libraries (transformers >= 5.0 ``models/glm_image``, diffusers >= 0.37
``GlmImagePipeline.generate_prior_tokens``; read on transformers 5.24.0 and diffusers 0.42.1):

* the prompt is ``processor.apply_chat_template`` of one user turn holding the prompt's text, with ``target_h`` /
  ``target_w``: the processor appends ``<sop>{H/32} {W/32}<eop><sop>{h} {w}<eop>`` and its BOS, the image start
  ``<|dit_token_16384|>``; ``h, w = int(sqrt(r) * 16), int(sqrt(1 / r) * 16)`` with ``r = (H/32) / (W/32)``, a
  preview grid of about 256 tokens whatever the size (:func:`grids`).  Called here exactly so, on the release's own
  processor, so its tokenizer and chat template decide the ids;
* ``generate(**inputs, max_new_tokens=h*w + H*W/1024 + 1, do_sample=True)``: the preview grid (``h x w``), then
  the large grid (``H/32 x W/32``), then one more token (the image end, ``eos_token_id``); the pipeline keeps the
  large grid and upsamples it 2x (nearest) as ``prior_token_ids``;
* no guidance; sampling from the release's ``generation_config.json`` as ``generate`` applies it: ``temperature``
  (0.9), ``top_k`` (absent there: transformers' default, 50), ``top_p`` (0.75), in that order (read at load time;
  :data:`GlmImageAdapter.sampling_defaults` are the release's values);
* positions (``GlmImageModel.get_rope_index``): the prompt's tokens have text positions ``0 .. P-1`` on all three
  M-RoPE axes (left padding skipped); the generated token at stream index ``k``, when fed back, sits at
  ``(t, P + row, P + col)`` of its grid, ``t = P`` for the preview and ``P + max(h, w)`` for the large grid, and the
  end token at ``P + max(h, w) + max(H, W)`` on all three axes.  Every token the engine feeds (window tokens, tree
  nodes, row-parallel chains) gets the positions of the stream place it is drafted for (:class:`GridCache`).

**The departures**: only the image codes (ids below the image start, 16384) are drawn at the grids' places and the
image end is forced after the large grid; ``generate`` draws from all 16,512 ids of the head (an end or other
non-code id inside a grid would end the image early or give the DiT an id it has no code for) and leaves the last
token to the model (the pipeline discards it).  top-k and top-p therefore act on the codes only.
"""
from __future__ import annotations

import math
import pathlib

import torch

from ..decoders import glm_dit
from ..formats.checkpoints import (CheckpointError, assign_weights, checked_weight_files, empty_model, hf_call, peek,
                                   read_json, read_weights)
from ..sampling.adapter import TokenLayout
from ..sampling.config import ConfigError
from .family import Detected, Family, LoadOptions, transformers_config
from .generation_config import REFUSED
from . import stages
from .hf_cache import StaticCache, TransformersAdapter
from .sizing import stage_wait
from .storage import file_weight_bytes, full_dtype, place

FAMILY_NAME = "glm_image"
ENCODER, PROCESSOR = "vision_language_encoder", "processor"
PIPELINE = "GlmImagePipeline"
FACTOR = 32  # pixels per large-grid token (the DiT's 16 px prior tokens, upsampled 2x by the pipeline)
PREVIEW = 16  # the preview grid's side for a square image (the processor's factor // 2)
SIZES = (512, 1024, 1536, 2048)  # square sizes offered besides the one asked for
#: the weights the AR stage reads (the vision encoder and VQ model serve image-to-image only)
KEEP = ("model.language_model.", "lm_head.")
CODEBOOK = "model.vqmodel.quantize.embedding.weight"
#: what the pipeline passes to ``generate`` itself (the release's generation_config.json values are overridden)
EXPLICIT = ("do_sample", "max_new_tokens", "max_length")
#: transformers' defaults of the sampling fields a release leaves out
#: (``GenerationConfig._get_default_generation_params``)
SAMPLING_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}
INSTALL = "pip install 'transformers>=5.0'"


def no_decoder(missing) -> str:
    """Why the loaded model makes no images (what the command line and the sampler node say): the DiT stage's
    folders ``missing`` from the release."""
    have = "none of them" if set(missing) >= set(glm_dit.PARTS) else \
        f"no {', '.join(p + '/' for p in missing)}"
    return (f"GLM-Image's decoder, its DiT stage (diffusers' GlmImagePipeline), needs "
            f"{', '.join(p + '/' for p in glm_dit.PARTS)} of the release beside {ENCODER}/; this folder has "
            f"{have}: it samples the AR stage's prior tokens only (loaders.glm_image.prior_token_ids gives the "
            f"pipeline's prior_token_ids)")


#: the message of a folder with the AR stage alone
NO_DECODER = no_decoder(glm_dit.PARTS)


def glm_classes():
    """``(GlmImageConfig, GlmImageTextModel)``, or one error naming what to install."""
    try:
        from transformers import GlmImageConfig
        from transformers.models.glm_image.modeling_glm_image import GlmImageTextModel
    except ImportError:
        import transformers

        raise CheckpointError(f"GLM-Image needs transformers >= 5.0 (its GlmImage models); this environment has "
                              f"transformers {transformers.__version__}: {INSTALL}") from None
    return GlmImageConfig, GlmImageTextModel


# -- detection --------------------------------------------------------------------------------------------------
def is_encoder(path: pathlib.Path) -> bool:
    settings = transformers_config(path) or {}
    return settings.get("model_type") == FAMILY_NAME


def encoder_folder(path: pathlib.Path) -> pathlib.Path | None:
    """The AR model's folder of a GLM-Image release folder (its ``model_index.json`` names ``GlmImagePipeline``)
    or of the encoder folder itself; None for anything else."""
    index = path / "model_index.json"
    if path.is_dir() and index.is_file():
        if read_json(index).get("_class_name") != PIPELINE:
            return None
        return path / ENCODER if is_encoder(path / ENCODER) else None
    return path if path.is_dir() and is_encoder(path) else None


def processor_folder(encoder: pathlib.Path) -> pathlib.Path | None:
    for d in (encoder.parent / PROCESSOR, encoder / PROCESSOR, encoder):
        if (d / "tokenizer_config.json").is_file() and (d / "tokenizer.json").is_file():
            return d
    return None


def _detect(path: pathlib.Path) -> Detected | None:
    encoder = encoder_folder(path)
    if encoder is None:
        if path.is_dir() and (path / "model_index.json").is_file() and \
                read_json(path / "model_index.json").get("_class_name") == PIPELINE:
            raise CheckpointError(f"{path}: a GLM-Image release without its AR model: {ENCODER}/config.json with "
                                  f"model_type '{FAMILY_NAME}' is missing (the download is incomplete)")
        return None
    return Detected(FAMILY_NAME, encoder, "t2i")  # the AR model's folder: its weights are what loading reads


# -- sizes --------------------------------------------------------------------------------------------------------
def grids(width: int, height: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((h, w) of the preview, (H, W) of the large grid)`` for an image of ``width x height`` pixels, as
    ``GlmImageProcessor._get_target_shape`` computes them."""
    rows, cols = height // FACTOR, width // FACTOR
    ratio = rows / cols
    return (int(math.sqrt(ratio) * PREVIEW), int(math.sqrt(1 / ratio) * PREVIEW)), (rows, cols)


def check_size(width, height) -> None:
    for name, v in (("width", width), ("height", height)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v % FACTOR:
            raise ValueError(f"{name} must be a positive multiple of {FACTOR} pixels for GLM-Image (got {v})")
    (h, w), _ = grids(width, height)
    if not h or not w:
        raise ValueError(f"{width}x{height}: too narrow for GLM-Image (its preview grid would be {h}x{w}); keep the "
                         "sides within 1:256 of each other")


def stream_table(preview: tuple[int, int], large: tuple[int, int], extra: int) -> torch.Tensor:
    """``[3, n + 1 + extra]``: the (temporal, height, width) position of each stream index ``k`` minus the prompt's
    length ``P`` (``get_rope_index``'s decode positions: the preview grid, the large grid, the end token), then
    ``extra`` indices past the end (windows over it, rolled back) on from the end's."""
    cols = []
    base = 0
    for h, w in (preview, large):
        r = torch.arange(h).repeat_interleave(w)
        c = torch.arange(w).repeat(h)
        cols.append(torch.stack([torch.full_like(r, base), base + r, base + c]))
        base += max(h, w)
    cols.append(torch.full((3, 1 + extra), base) + torch.arange(1 + extra))
    return torch.cat(cols, 1)


class GridCache(StaticCache):
    """The pack's KV cache handing the model 3-D M-RoPE positions: a token whose 1-D position (what the cache
    gives: its row's real tokens before it) is ``p`` sits at ``(p, p, p)`` within its row's prompt of ``P`` tokens,
    and at ``P + table[:, p - P]`` from the stream on; tree nodes and chains get their place's positions the same
    way (their 1-D position is the place they are drafted for)."""

    def __init__(self, kv, argument, table: torch.Tensor):
        super().__init__(kv, argument)
        self.table = table.to(kv.length.device)
        self.starts = torch.zeros(kv.rows, dtype=torch.long, device=kv.length.device)  # P per row, kept in place

    def prefill_inputs(self, pad_mask):
        self.starts.copy_(pad_mask.long().sum(1))
        return super().prefill_inputs(pad_mask)

    def _inputs(self, positions, mask):
        return super()._inputs(grid_positions(positions, self.starts, self.table), mask)

    def keep_rows(self, rows):
        super().keep_rows(rows)
        self.starts = self.starts[torch.tensor(rows, device=self.starts.device)]


def grid_positions(positions: torch.Tensor, starts: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """1-D positions ``[rows, L]`` -> M-RoPE positions ``[3, rows, L]`` (see :class:`GridCache`)."""
    k = positions - starts.unsqueeze(1)
    stream = starts.view(1, -1, 1) + table[:, k.clamp(0, table.shape[1] - 1)]
    return torch.where(k >= 0, stream, positions.unsqueeze(0).expand(3, -1, -1))


# -- the model ------------------------------------------------------------------------------------------------------
class GlmImageAR(torch.nn.Module):
    """The text-to-image part of ``GlmImageForConditionalGeneration``: its language model and head under the
    release's tensor names (``model.language_model.*``, ``lm_head.weight``)."""

    def __init__(self, config):
        super().__init__()
        _, GlmImageTextModel = glm_classes()
        self.config = config.text_config
        self.model = torch.nn.Module()
        self.model.language_model = GlmImageTextModel(config.text_config)
        self.lm_head = torch.nn.Linear(config.text_config.hidden_size, config.text_config.vision_vocab_size,
                                       bias=False)

    def get_input_embeddings(self):
        return self.model.language_model.embed_tokens


def load_model(encoder: pathlib.Path, device="cpu", dtype=torch.float32):
    """``(GlmImageAR, GlmImageConfig)`` from the AR model's folder, its parameters given the shards' tensors in
    ``dtype`` (the storage's full dtype; quantized storage placed by ``storage.place``)."""
    GlmImageConfig, _ = glm_classes()
    settings = read_json(encoder / "config.json")
    config = hf_call(lambda: GlmImageConfig(**{k: v for k, v in settings.items() if k != "model_type"}), encoder,
                     "a GLM-Image configuration")
    files = checked_weight_files(encoder)
    weights = read_weights(files, full_dtype(dtype, device), keep=lambda k: k.startswith(KEEP))
    model = empty_model(GlmImageAR, config)
    assign_weights(model, weights, files[0] if len(files) == 1 else encoder, "GLM-Image's AR model")
    return place(model, dtype, device).eval(), config


def codebook(encoder: pathlib.Path) -> torch.Tensor | None:
    """The VQ model's code vectors ``[codes, D]``, L2-normalised as its quantizer compares them; None without."""
    for f in checked_weight_files(encoder):
        if f.suffix == ".safetensors" and CODEBOOK in peek(f):
            vectors = read_weights([f], torch.float32, keep=lambda k: k == CODEBOOK)[CODEBOOK]
            return torch.nn.functional.normalize(vectors, dim=-1)
    return None


def release_sampling(encoder: pathlib.Path) -> dict:
    """The release's generation_config.json as the pipeline's ``generate(..., do_sample=True)`` applies it: its
    temperature, top-k and top-p (transformers' defaults where it has none); a field that would change the image
    tokens otherwise is refused."""
    path = encoder / "generation_config.json"
    settings = {k: v for k, v in (read_json(path) if path.is_file() else {}).items() if k not in EXPLICIT}
    for field, (acts, what) in REFUSED.items():
        try:
            active = acts(settings.get(field))
        except TypeError:
            active = True
        if active:
            raise CheckpointError(f"{path}: {field} {settings.get(field)!r}: with it the pipeline's generate {what}, "
                                  f"which this pack does not do: remove {field} to load the model")
    penalty = settings.get("repetition_penalty")
    if penalty not in (None, 1, 1.0):
        raise CheckpointError(f"{path}: repetition_penalty {penalty!r}: GLM-Image's adapter does not apply a "
                              "repetition penalty: remove it to load the model")
    out = {}
    for field, default in SAMPLING_DEFAULTS.items():
        value = settings.get(field)
        out[field] = default if value is None else value
    for field, value in out.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise CheckpointError(f"{path}: {field} {value!r} is not a number transformers' generate reads")
    out["top_k"] = int(out["top_k"]) or None  # 0: no top-k
    out["cfg_scale"] = 1.0
    return out


class GlmImageAdapter(TransformersAdapter):
    guidance = "linear"
    no_negative = "GLM-Image's AR stage takes no negative prompt (its reference runs without guidance): leave it empty"
    sampling_defaults = {"cfg_scale": 1.0, "temperature": 0.9, "top_k": 50, "top_p": 0.75}

    def __init__(self, model: GlmImageAR, processor, width: int, height: int, config, sampling: dict | None = None,
                 codes: torch.Tensor | None = None, grid: tuple[tuple[int, int], tuple[int, int]] | None = None):
        """``grid``: the (preview, large) grids instead of those of ``width x height`` (tests on short streams;
        the prompt still names ``width x height``)."""
        self.model, self.processor, self.config = model, processor, config
        self.tokenizer = processor.tokenizer
        self.inner, self.head = model.model.language_model, model.lm_head
        self.device = next(model.parameters()).device
        self.vocab_size = config.text_config.vision_vocab_size
        self.start, self.end = config.image_start_token_id, config.image_end_token_id
        if not 0 < self.start < self.vocab_size or not 0 <= self.end < self.vocab_size:
            raise CheckpointError(f"GLM-Image's image start / end ids ({self.start}, {self.end}) are not ids of its "
                                  f"{self.vocab_size}-id head")
        self.image_ids = torch.arange(self.start)  # the codes: every id below the image start
        if sampling is not None:
            self.sampling_defaults = dict(sampling)
        self.width, self.height = width, height
        self.preview, self.large = grid or grids(width, height)
        (ph, pw), (h, w) = self.preview, self.large
        n = ph * pw + h * w
        self.layout = TokenLayout.raster(1, n, self.vocab_size, self.image_ids, {n: self.end}, row_stride=w,
                                         length=n + 1)
        self.table = stream_table(self.preview, self.large, self.MARGIN + 1)
        self.codes = codes
        self.cache = None
        self._prompts: dict[str, list[int]] = {}
        #: the prompts of the last prefill (sampling or scoring): what :class:`PriorDecode` decodes for
        self.last_prompts: list[str] | None = None
        #: the stages' turns in memory (:func:`stages_of`), None: the AR stage alone, always in memory
        self.turns: stages.Turns | None = None

    def prefill(self, conditions, negatives, guided):
        if self.turns is not None:  # the AR model back on the device, the DiT out of the way
            self.turns.turn("sampling")
        return super().prefill(conditions, negatives, guided)

    def prompt_inputs(self, prompt: str) -> dict:
        """What ``GlmImagePipeline.generate_prior_tokens`` gets from the processor for ``prompt`` (one sample)."""
        messages = [[{"role": "user", "content": [{"type": "text", "text": prompt}]}]]
        return self.processor.apply_chat_template(messages, tokenize=True, padding=False, target_h=self.height,
                                                  target_w=self.width, return_dict=True, return_tensors="pt")

    def prompt_ids(self, prompt: str) -> list[int]:
        if prompt not in self._prompts:
            inputs = self.prompt_inputs(prompt)
            (ph, pw), (h, w) = grids(self.width, self.height)
            got = inputs["image_grid_thw"].tolist()
            if got != [[1, h, w], [1, ph, pw]]:
                raise CheckpointError(f"GLM-Image's processor gives the grids {got} for {self.width}x{self.height}; "
                                      f"this pack expects [[1, {h}, {w}], [1, {ph}, {pw}]] (transformers 5.x)")
            self._prompts[prompt] = inputs["input_ids"][0].tolist()
        return self._prompts[prompt]

    def condition_rows(self, conditions, negatives, guided):
        if guided:
            raise ConfigError("GLM-Image's AR stage runs without guidance, as its reference: set cfg_scale to 1")
        rows = [self.prompt_ids(p) for p in conditions]
        self.last_prompts = list(conditions)
        return rows

    def pad_id(self) -> int:
        return self.end  # any id: the left padding is masked

    def _new_cache(self, module, rows, prompt):
        cache = super()._new_cache(module, rows, prompt)
        if not isinstance(cache, GridCache):
            cache = GridCache(cache.kv, cache.argument, self.table)
        return cache

    def token_vectors(self):
        if self.codes is None or self.codes.shape[0] != self.image_ids.numel():
            return None
        return self.image_ids.clone(), self.codes.to(self.device)

    def prior_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Stream tokens ``[B, length]`` -> the large grid ``[B, H, W]`` (what the pipeline keeps)."""
        (ph, pw), (h, w) = self.preview, self.large
        return tokens[:, ph * pw: ph * pw + h * w].reshape(-1, h, w)


def prior_token_ids(tokens: torch.Tensor, adapter: GlmImageAdapter) -> torch.Tensor:
    """``GlmImagePipeline``'s ``prior_token_ids`` ``[B, 4 H W]`` of stream tokens ``[B, length]``: the large grid,
    upsampled 2x (nearest), flattened, as ``generate_prior_tokens`` hands them to the DiT."""
    grid = adapter.prior_tokens(tokens).unsqueeze(1).float()
    return torch.nn.functional.interpolate(grid, scale_factor=2, mode="nearest").long().flatten(1)


class PriorDecode:
    """The loaded model's ``decode``: image tokens -> images ``[B, 3, H, W]`` float32 in [0, 1] through the DiT
    stage (:meth:`.glm_dit.GlmDiT.decode`), for the prompts the adapter last sampled (or ``prompts``).  The
    tokens are the layout's (``[B, 1, n]``: preview and large grid) or the large grid ``[B, H/32, W/32]``.
    ``steps``, ``guidance``, ``seed`` and ``progress`` (``progress(done, steps)``) are settable."""

    #: the node that runs it in ComfyUI: the sampler leaves the DiT to it (it has the steps, guidance and seed; a
    #: partial stream is no picture for the DiT, and the sampler decoding too would run the 7B DiT twice)
    stage = "GLM-Image DiT Decode"

    def __init__(self, dit: "glm_dit.GlmDiT", adapter: GlmImageAdapter, steps: int | None = None,
                 guidance: float | None = None, seed: int = 0, progress=None):
        self.dit, self.adapter = dit, adapter
        self.steps = dit.defaults["steps"] if steps is None else steps
        self.guidance = dit.defaults["guidance"] if guidance is None else guidance
        self.seed, self.progress = seed, progress
        if adapter.start > dit.codes:
            raise CheckpointError(f"GLM-Image's DiT has {dit.codes} prior codes; the AR stage draws "
                                  f"{adapter.start} (the ids below its image start)")

    def prior(self, tokens: torch.Tensor) -> torch.Tensor:
        (ph, pw), (h, w) = self.adapter.preview, self.adapter.large
        if tokens.dim() == 3 and tuple(tokens.shape[1:]) == (h, w):
            return tokens
        if tokens.dim() == 3 and tuple(tokens.shape[1:]) == tuple(self.adapter.layout.grid):
            return tokens.flatten(1)[:, ph * pw:].reshape(-1, h, w)
        raise ValueError(f"GLM-Image's decoder takes the sampler's image tokens [B, {self.adapter.layout.grid[0]}, "
                         f"{self.adapter.layout.grid[1]}] or the large grid [B, {h}, {w}], got {tuple(tokens.shape)}")

    def prompts_for(self, n: int) -> list[str]:
        last = self.adapter.last_prompts
        if not last:
            raise ValueError("GLM-Image's decoder needs the prompt (its DiT reads the prompt's quoted text): sample "
                             "with this model first, or give decode(tokens, prompts=[...])")
        if len(set(last)) == 1:
            return [last[0]] * n
        if len(last) == n:
            return list(last)
        raise ValueError(f"GLM-Image's decoder: the last sampling made {len(last)} images of {len(set(last))} "
                         f"different prompts and this call decodes {n}: which prompt is whose is unknown; decode the "
                         "whole batch at once or give decode(tokens, prompts=[...])")

    def __call__(self, tokens: torch.Tensor, prompts=None, progress=None) -> torch.Tensor:
        prior = self.prior(tokens)
        prompts = self.prompts_for(len(prior)) if prompts is None else list(prompts)
        if self.adapter.turns is not None:  # the DiT on the device, the AR model out of the way
            self.adapter.turns.turn("decoding")
        return self.dit.decode(prior, prompts, self.steps, self.guidance, self.seed, progress or self.progress)


def ar_weight_bytes(encoder: pathlib.Path, dtype, device) -> int:
    """The AR stage's weights in ``dtype`` on ``device`` (the language model and head: what :func:`load_model`
    reads), from the shards' headers."""
    return file_weight_bytes(checked_weight_files(encoder), dtype, device, keep=reads)


def stages_of(model: GlmImageAR, dit: "glm_dit.GlmDiT", encoder: pathlib.Path, device, dtype, wait: str,
              ar_bytes: int) -> stages.Turns:
    """The AR stage ("sampling": ``model``, read again from ``encoder`` in ``dtype`` when it comes back from
    the files) and the DiT ("decoding": ``dit``) taking turns as ``wait`` says; the AR stage is in memory."""
    from . import offload

    target = torch.device(device)

    def resident():  # an offloaded model's blocks stay in system memory: its other parts move
        streams = offload.streams_of(model)
        return offload.resident_parts(model, streams.layers) if streams else [model]

    def enter():
        if stages.on_meta(model):
            stages.adopt(model, load_model(encoder, device, dtype)[0])
        else:
            for m in resident():
                m.to(target)

    def park():
        for m in resident():
            m.to("cpu")

    def drop():
        park() if offload.streams_of(model) else stages.drop(model)

    ar = stages.Stage("sampling", ar_bytes, enter, park, drop)
    diffusion = stages.Stage("decoding", dit.weight_bytes(), dit.enter, dit.park, dit.drop)
    return stages.Turns([ar, diffusion], wait, active="sampling")


def load_processor(encoder: pathlib.Path):
    where = processor_folder(encoder)
    if where is None:
        raise CheckpointError(f"{encoder}: GLM-Image's processor is not there (processor/ of the release: "
                              f"tokenizer.json, tokenizer_config.json, processor_config.json): put it in "
                              f"{encoder.parent / PROCESSOR}")
    from transformers import GlmImageProcessor

    processor = hf_call(lambda: GlmImageProcessor.from_pretrained(str(where), local_files_only=True), where,
                        "GLM-Image's processor")
    return processor, where


def load(path, device="cpu", dtype=torch.float32, width=None, height=None):
    """A :class:`~.base.LoadedModel` sampling GLM-Image's prior tokens, with the DiT stage as its decoder where the
    release has its folders (:mod:`..decoders.glm_dit`), else none (:func:`no_decoder`)."""
    from .base import LoadedModel

    path = pathlib.Path(path)
    encoder = encoder_folder(path)
    if encoder is None:
        raise CheckpointError(f"{path}: not a GLM-Image folder (model_index.json of {PIPELINE} with {ENCODER}/, "
                              f"or the {ENCODER} folder itself)")
    release = encoder.parent if encoder.name == ENCODER else encoder
    glm_classes()  # before anything is read
    missing = glm_dit.missing_parts(encoder.parent)  # the DiT's folders, beside the AR model's
    if not missing:
        glm_dit.diffusers_classes()  # diffusers too, before anything is read
    processor, where = load_processor(encoder)
    if not width and not height:  # the processor's own target size (GlmImageProcessor.target_w / target_h)
        width, height = getattr(processor, "target_w", 768), getattr(processor, "target_h", 1152)
    width, height = width or height, height or width
    check_size(width, height)
    sampling = release_sampling(encoder)  # before the weights are read
    # the DiT is read at its first turn; whether the stages fit together is asked before either is read
    dit = None if missing else glm_dit.GlmDiT.load(encoder.parent, device, full_dtype(dtype, device), fill=False)
    if dit is not None:
        ar_bytes = ar_weight_bytes(encoder, dtype, device)
        wait = stage_wait({"the AR model": ar_bytes, "the DiT": dit.weight_bytes()}, device,
                          dit.bytes_per_image(*grids(width, height)[1]))
    model, config = load_model(encoder, device, dtype)
    codes = codebook(encoder)
    turns = None if dit is None else stages_of(model, dit, encoder, device, dtype, wait, ar_bytes)

    def build(size) -> LoadedModel:
        w, h = (size, size) if isinstance(size, int) else size
        check_size(w, h)
        adapter = GlmImageAdapter(model, processor, w, h, config, sampling, codes)
        adapter.turns = turns
        info = {"resolution": w if w == h else None, "width": w, "height": h, "grid": adapter.layout.grid,
                "preview_grid": adapter.preview, "prior_grid": adapter.large, "processor": str(where)}
        # the modules ComfyUI's memory manager moves: the AR stage's (the DiT's come and go with its turns)
        modules = {"glm_image_ar": model}
        if dit is None:
            info["no_decoder"] = no_decoder(missing)
            decode, per_image = None, 0
        else:
            decode = PriorDecode(dit, adapter)
            info.update(dit_steps=decode.steps, dit_guidance=decode.guidance, dit_seed=decode.seed,
                        diffusers=dit.version, stages=turns.wait)
            per_image = dit.bytes_per_image(*adapter.large)
        name = f"GLM-Image ({release.name})" if dit is not None else f"GLM-Image AR ({release.name})"
        return LoadedModel(family=FAMILY_NAME, name=name, adapter=adapter, decode=decode, condition="text",
                           resolutions=tuple(sorted({*SIZES, w, h})), resize=build, info=info, modules=modules,
                           decode_bytes_per_image=per_image, turns=turns)

    return build((width, height))


def _load(hit: Detected, o: LoadOptions):
    return load(hit.path, o.device, o.storage or o.dtype, o.width or o.resolution, o.height or o.resolution)


def reads(name: str) -> bool:
    """The tensors of the AR model's shards this family reads: the language model, the head and the VQ codebook."""
    return name.startswith(KEEP) or name == CODEBOOK


FAMILY = Family(
    FAMILY_NAME, detect=_detect, load=_load, square=False, reads=reads,
    needs="a GLM-Image folder (zai-org/GLM-Image, diffusers layout: model_index.json of GlmImagePipeline, "
          "vision_language_encoder/ with config.json of model_type 'glm_image' and safetensors, processor/), or its "
          "vision_language_encoder folder with processor/ beside it, on transformers >= 5.0; with the release's "
          "transformer/, vae/, text_encoder/, tokenizer/ and scheduler/ the DiT stage decodes (diffusers >= 0.37), "
          "without them the AR stage samples the prior tokens only")
