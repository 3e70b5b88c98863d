"""Emu3 (BAAI Emu3-Gen) through transformers (>= 4.48), converted folders (``model_type: emu3``).

One decoder-only LM over text and image tokens: image tokens are ordinary vocabulary entries
``<|visual token NNNNNN|>`` (code ``NNNNNN`` of the MoVQ codebook, 32768 x 4) scored by the same ``lm_head``,
and ``Emu3VQVAE`` (spatial downsample 8) turns codes back into pixels: one frame of it, where transformers'
``decode`` upsamples the latent frame to a 4-frame video and keeps frame 0 (:func:`decode_first_frame`).
Ids are never assumed: the id <-> code map is transformers' own (``model.vocabulary_mapping.img2bpe``, built
from the names in ``config.vocabulary_map``) and the structural tokens are looked up by name in the tokenizer
and checked against that map.

Reference generation (BAAI's ``image_generation.py`` and the transformers port):

* condition ``<|extra_203|>{prompt}<|image start|>{H}*{W}<|image token|>`` (BOS written as text, sizes in
  tokens), all of it prefilled, tokenized as BAAI's own tokenizer does (:func:`baai_encode`);
* stream: ``H`` rows of ``W`` visual tokens, each row ended by end-of-line ``<|extra_200|>``, then end-of-frame
  ``<|extra_201|>`` and ``<|image end|>`` (all three forced here; EOS after them is not part of the stream);
* guidance 3.0 in log-softmax space (``UnbatchedClassifierFreeGuidanceLogitsProcessor``) against a *negative*
  prompt in the same template; top-k 2048; 720 x 720 pixels (``image_area`` 518400) -> 90 x 90 tokens.

Without a negative prompt the uncond branch uses the reference's :data:`DEFAULT_NEGATIVE`.  The reference also
appends :data:`POSITIVE_SUFFIX` to every prompt; that is left to the user (prompts are used as given).

Tokenization: BAAI's tokenizer (baaivision/Emu3 @f6ea9aaa, ``emu3/mllm/tokenization_emu3.py``) is tiktoken
with Qwen's split pattern, which cuts numbers into single digits (``\\p{N}``), after NFC normalisation;
the tokenizer that transformers' ``convert_emu3_weights_to_hf.py`` writes keeps the same vocabulary and merges
but splits with GPT-2's byte-level pattern, which keeps digit runs whole (``90``) and cuts punctuation off
the letters after it.  The model was trained on BAAI's split, so :func:`baai_encode` splits with BAAI's
pattern and BPE-merges each piece on its own with the converted vocabulary: the size header at 720 px is
``9 0 * 9 0``, as in the reference.

``generate`` cannot roll back rejected drafts per sample, so the adapter runs its own loop on a
:class:`~.hf_cache.StaticCache`, like :mod:`.janus`.
"""
from __future__ import annotations

import pathlib
import unicodedata

import regex  # installed with transformers
import torch

from ..decoders.blocks import unit_range
from ..formats.checkpoints import CheckpointError, from_pretrained, read_json, tokenizer_from_pretrained
from ..sampling.adapter import TokenLayout
from ..sampling.config import shorten
from .family import Detected, Family, transformers_config
from .hf_cache import TransformersAdapter
from .storage import full_dtype, place

DEFAULT_NEGATIVE = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, "
                    "cropped, worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, "
                    "username, blurry.")
POSITIVE_SUFFIX = " masterpiece, film grained, best quality."
#: structural tokens: tokenizer attribute (converted tokenizers name them) and the literal name as a fallback
TOKENS = {"boi": ("boi_token", "<|image start|>"), "eoi": ("eoi_token", "<|image end|>"),
          "wrapper": ("image_wrapper_token", "<|image token|>"), "eof": ("eof_token", "<|extra_201|>"),
          "eol": (None, "<|extra_200|>")}  # transformers hard-codes the end-of-line name too
#: BAAI's split pattern (``PAT_STR`` of ``emu3/mllm/tokenization_emu3.py`` @f6ea9aaa): digits one by one
BAAI_SPLIT = regex.compile(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                           r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
SPECIAL_FORM = regex.compile(r"(<\|[^<>|]*\|>)")  # the surface form of every BAAI special token
DEFAULT_RESOLUTION = 720  # the reference's image_area 518400 = 720 x 720
PRESETS = (256, 384, 512, 640, 720)
PROMPT_ROOM = 256  # positions kept for the prompt when sizing the largest image


def load_model(folder: str | pathlib.Path, device="cpu", dtype=torch.float32):
    """``(Emu3ForConditionalGeneration, tokenizer)`` from a converted folder."""
    from transformers import Emu3ForConditionalGeneration

    folder = pathlib.Path(folder)
    cfg_path = folder / "config.json"
    model_type = read_json(cfg_path).get("model_type") if cfg_path.is_file() else None
    if model_type != "emu3":
        raise CheckpointError(f"{folder}: config.json model_type {model_type!r} is not 'emu3' (a converted "
                              "Emu3 folder such as Emu3-community/Emu3-Gen-hf is needed)")
    tokenizer = tokenizer_from_pretrained(folder)
    # in the files' own dtype (memory-mapped, no copy), then converted or quantized a tensor at a time: asked for
    # another dtype, transformers would hold both copies at once
    model = from_pretrained(Emu3ForConditionalGeneration, folder, "an Emu3 model", "auto")
    return place(model, dtype, device).eval(), tokenizer


def _pixel_affine(folder: pathlib.Path) -> tuple[torch.Tensor, torch.Tensor]:
    """VQ output -> [0, 1] is ``x * std + mean`` with the image processor's per-channel values
    (0.5 and 0.5 in the released folders, which is also the fallback)."""
    path = folder / "preprocessor_config.json"
    cfg = read_json(path) if path.is_file() else {}
    return tuple(torch.tensor(cfg.get(key, 0.5), dtype=torch.float32).view(-1, 1, 1)
                 for key in ("image_mean", "image_std"))


def _byte_level_bpe(tokenizer, piece: str) -> list[int]:
    """``piece`` merged as one word by the tokenizer's byte-level BPE (no further split)."""
    from tokenizers import pre_tokenizers

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.model).__name__ != "BPE":  # a slow tokenizer: its own split within the piece
        return tokenizer(piece, add_special_tokens=False).input_ids
    symbols = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(piece)
    return [t.id for word, _ in symbols for t in backend.model.tokenize(word)]


def baai_encode(tokenizer, text: str, specials: dict[str, int]) -> list[int]:
    """``text`` as BAAI's tokenizer encodes it, with a converted tokenizer's ids: NFC, special tokens
    (``specials``: surface form -> id) kept whole wherever they appear, the rest split by
    :data:`BAAI_SPLIT` and each piece BPE-merged on its own."""
    ids = []
    for i, part in enumerate(SPECIAL_FORM.split(unicodedata.normalize("NFC", text))):
        if i % 2 and part in specials:
            ids.append(specials[part])
            continue
        for piece in BAAI_SPLIT.findall(part):
            ids += _byte_level_bpe(tokenizer, piece)
    return ids


def token_name(tokenizer, key: str) -> str:
    """The name of structural token ``key`` (:data:`TOKENS`): the tokenizer's own, else the literal."""
    attr, literal = TOKENS[key]
    name = getattr(tokenizer, attr, None) if attr else None
    return name if isinstance(name, str) else literal


def special_ids(tokenizer) -> dict[str, int]:
    """The tokenizer's added tokens of BAAI's special form ``<|...|>``: surface form -> id."""
    return {name: tid for name, tid in tokenizer.get_added_vocab().items() if SPECIAL_FORM.fullmatch(name)}


def condition_ids(tokenizer, prompt: str, rows: int, cols: int, specials: dict[str, int] | None = None) -> list[int]:
    """The reference condition ``<|extra_203|>{prompt}<|image start|>{rows}*{cols}<|image token|>`` as BAAI's
    tokenizer encodes it: special tokens are split off first, so each text part is encoded alone."""
    specials = special_ids(tokenizer) if specials is None else specials
    boi, wrapper = (tokenizer.convert_tokens_to_ids(token_name(tokenizer, k)) for k in ("boi", "wrapper"))
    return ([tokenizer.bos_token_id] + baai_encode(tokenizer, prompt, specials) + [boi]
            + baai_encode(tokenizer, f"{rows}*{cols}", specials) + [wrapper])


class Emu3Vocabulary:
    """Structural token ids and the visual token id <-> VQ code map, read and cross-checked at load time."""

    def __init__(self, model, tokenizer):
        vmap = model.config.vocabulary_map or {}
        self.ids = {}
        for key in TOKENS:
            name = token_name(tokenizer, key)
            tid = tokenizer.convert_tokens_to_ids(name)
            if tid is None or tid == tokenizer.unk_token_id or vmap.get(name, tid) != tid:
                raise CheckpointError(f"Emu3 tokenizer and config.vocabulary_map disagree on {name!r} "
                                      f"(tokenizer {tid}, vocabulary_map {vmap.get(name)})")
            self.ids[key] = tid
            setattr(self, key, tid)  # self.eol, self.eof, self.boi, self.eoi, self.wrapper
        if tokenizer.bos_token is None:
            raise CheckpointError("Emu3 tokenizer has no BOS token (<|extra_203|> in the released folders)")
        pad = tokenizer.pad_token_id
        self.pad = pad if pad is not None else model.config.text_config.pad_token_id  # any id: padding is masked
        self.specials = special_ids(tokenizer)
        img2bpe = model.vocabulary_mapping.img2bpe  # code -> token id, parsed from the token names
        codes = model.config.vq_config.codebook_size
        if sorted(img2bpe) != list(range(codes)):
            raise CheckpointError(f"Emu3 vocabulary: {len(img2bpe)} visual tokens do not cover the "
                                  f"{codes}-code VQ codebook")
        self.code2id = torch.tensor([img2bpe[c] for c in range(codes)], dtype=torch.long)
        vocab = model.get_output_embeddings().out_features
        self.id2code = torch.full((vocab,), -1, dtype=torch.long)
        self.id2code[self.code2id] = torch.arange(codes)


class Emu3Adapter(TransformersAdapter):
    guidance = "log_softmax"
    sampling_defaults = {"cfg_scale": 3.0, "top_k": 2048, "temperature": 1.0}

    def __init__(self, model, tokenizer, grid: int, vocab: Emu3Vocabulary | None = None,
                 pixel_affine: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.inner, self.head = model.model.text_model, model.lm_head
        self.device = next(model.parameters()).device
        self.vocab = vocab or Emu3Vocabulary(model, tokenizer)
        self.vocab_size = self.head.out_features
        self.rows = self.cols = grid
        v, W = self.vocab, grid
        stride = W + 1  # each row ends with end-of-line
        forced = {r * stride + W: v.eol for r in range(grid)}
        forced.update({grid * stride: v.eof, grid * stride + 1: v.eoi})
        self.layout = TokenLayout.raster(grid, W, self.vocab_size, image_ids=v.code2id, forced=forced,
                                         row_stride=stride, length=grid * stride + 2)
        self.id2code = v.id2code.to(self.device)
        self.mean, self.std = (t.to(self.device) for t in pixel_affine or (torch.tensor(0.5), torch.tensor(0.5)))
        self.cache = None

    def check_conditions(self, conditions, negatives):
        bad = [c for c in conditions if not isinstance(c, str)]
        if bad:
            raise ValueError(f"prompt must be text for Emu3 (got {shorten(bad[0])})")
        bad = [n for n in negatives or () if n is not None and not isinstance(n, str)]
        if bad:
            raise ValueError(f"negative prompt must be text for Emu3 (got {shorten(bad[0])})")

    def prompt_ids(self, prompt: str) -> list[int]:
        """The reference condition (:func:`condition_ids`)."""
        return condition_ids(self.tokenizer, prompt, self.rows, self.cols, self.vocab.specials)

    def condition_rows(self, conditions, negatives, guided):
        rows = [self.prompt_ids(p) for p in conditions]
        if guided:  # the uncond branch: the negative prompt in the same template
            negs = list(negatives) if negatives is not None else [None] * len(conditions)
            rows += [self.prompt_ids(DEFAULT_NEGATIVE if n is None else n) for n in negs]
        return rows

    def pad_id(self) -> int:
        return self.vocab.pad

    def token_vectors(self):
        # raw codebook rows: Emu3's quantizer picks codes by plain L2 distance (no normalisation)
        book = self.model.model.vqmodel.quantize.embedding.weight.detach().float()
        return self.vocab.code2id.clone(), book

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``[B, rows, cols]`` (visual token ids) -> images ``[B, 3, H, W]`` in [0, 1]."""
        codes = self.id2code[tokens.to(self.device)]
        if bool((codes < 0).any()):
            raise ValueError("Emu3 decode: the tokens include ids that are not visual tokens")
        pixels = decode_first_frame(self.model.model.vqmodel, codes)
        return unit_range(pixels.float() * self.std + self.mean)


@torch.no_grad()
def decode_first_frame(vq, codes: torch.Tensor) -> torch.Tensor:
    """Codes ``[B, h, w]`` -> pixels ``[B, 3, 8h, 8w]`` (the VQ's output range, [-1, 1]): the frame that
    ``Emu3VQVAE.decode`` returns for an image, computed alone and with fewer live tensors.

    Why transformers decodes 4 frames: the VQ-VAE is a video tokenizer, one latent frame stands for
    ``temporal_downsample_factor`` (4) frames.  ``Emu3VQVAE.decode`` (as BAAI's ``Emu3VisionVQModel.decode``)
    takes an image as one latent frame, runs the decoder's temporal stack on it (``time_res_stack``, then
    ``log2(4) = 2`` temporal upsamplers: nearest x2 in time, a 3x3x3 convolution, ``x * sigmoid(x)``), so
    1 frame becomes 4, runs the 2D decoder (``conv_in``, middle and up blocks, ``norm_out``, ``conv_out``)
    on the 4 frames as a batch and returns frame 0 (``video[:, 0]``).

    Why one frame is enough: every temporal convolution (``Emu3VQVAEConv3d``, ``post_quant_conv`` included)
    pads its input with 2 zero frames *before* and none after, so it is causal: output frame 0 reads input
    frame 0 and the padding only, and a nearest upsampler's frame 0 is its input's frame 0.  The 2D decoder
    treats frames as batch entries (spatial norm = per-sample GroupNorm, attention within a frame,
    convolutions), and the only batch-coupled layers, the temporal blocks' BatchNorm3d, run before the
    upsamplers, on the single latent frame in both paths: frames 1..3 never reach frame 0.  So the temporal
    stack here keeps frame 0 after each upsampler and the 2D decoder runs on that frame alone.

    The 2D decoder runs transformers' own modules (weights, convolutions, attention) but with the spatial
    norm's product and sum and the residual sums done in place (:func:`_spatial_norm`, :func:`_resnet`):
    the same arithmetic, so the same picture to float rounding, with at most 3 tensors of a block's widest
    shape live instead of 5.  :func:`decode_bytes` is the peak that follows.
    """
    batch, h, w = codes.shape
    quant = vq.quantize.embedding(codes.flatten()).view(batch, 1, h, w, -1).permute(0, 4, 1, 2, 3).contiguous()
    dec = vq.decoder
    states = torch.cat((vq.post_quant_conv(quant), quant))  # [2B, C, T=1, h, w], as the decoder concatenates
    for layer in dec.time_res_stack:
        states = layer(states)
    for layer in dec.time_conv:
        states = layer(states)[:, :, :1]  # T 1 -> 2 (nearest, causal conv): frame 0 depends on frame 0 only
        states = states * torch.sigmoid(states)
    hidden, quant = states[:, :, 0].chunk(2)
    mid = dec.middle_block
    hidden = _resnet(mid.block_1, dec.conv_in(hidden), quant)
    hidden = _attention(mid.attn_1, mid.attn_norm, hidden, quant)
    hidden = _resnet(mid.block_2, hidden, quant)
    levels = dec.up_block.up[::-1]  # transformers' order: the coarsest level first
    for i, level in enumerate(levels):
        for j, block in enumerate(level.block):
            hidden = _resnet(block, hidden, quant)
            if len(level.attn):
                hidden = _attention(level.attn[j], level.attn_norms[j], hidden, quant)
        if i != len(levels) - 1:
            hidden = level.upsample(hidden)
    hidden = _spatial_norm(dec.norm_out, hidden, quant)
    hidden *= torch.sigmoid(hidden)
    return dec.conv_out(hidden)


def _spatial_norm(norm, x: torch.Tensor, quant: torch.Tensor) -> torch.Tensor:
    """``Emu3VQVAESpatialNorm.forward``: ``group_norm(x) * conv_y(q) + conv_b(q)`` (``q`` the latent frame
    resized to ``x``), product and sum in place."""
    quant = torch.nn.functional.interpolate(quant, size=x.shape[-2:], mode="nearest")
    out = norm.norm_layer(x)
    out *= norm.conv_y(quant)
    out += norm.conv_b(quant)
    return out


def _resnet(block, x: torch.Tensor, quant: torch.Tensor) -> torch.Tensor:
    """``Emu3VQVAEResnetBlock.forward`` with spatial norms (every decoder block has them), in place where
    transformers allocates."""
    h = _spatial_norm(block.norm1, x, quant)
    h *= torch.sigmoid(h)
    h = block.conv1(h)  # its own statement: the input is let go before norm2 allocates
    h = _spatial_norm(block.norm2, h, quant)
    h *= torch.sigmoid(h)
    h = block.conv2(h)
    return h.add_(x if block.in_channels == block.out_channels else block.nin_shortcut(x))


def _attention(attn, norm, x: torch.Tensor, quant: torch.Tensor) -> torch.Tensor:
    """An attention step of the middle / up blocks: ``x + attn(spatial_norm(x))`` over the frame's pixels."""
    y = _spatial_norm(norm, x, quant)
    b, c, h, w = y.shape
    y = attn(y.view(b, c, h * w).transpose(1, 2))[0]
    return x + y.reshape(b, h, w, c).permute(0, 3, 1, 2)  # as transformers (at the coarse level: cheap)


#: what a process holds over the tensors :func:`decode_bytes` counts: oneDNN's reordered copies of a
#: convolution's input or output on CPU, memory freed but not yet returned by the allocator.  Resident
#: peaks of the decode measured on CPU (float32 and bfloat16, 128 to 720 px) were 1.1 to 1.35 times the count.
DECODE_OVERHEAD = 1.3


def decode_bytes(vq_config, side: int, dtype: torch.dtype, eager_attention: bool = False) -> int:
    """Peak memory of :func:`decode_first_frame` for one ``side`` x ``side`` image: the largest set of
    tensors live at once, walked over the decoder's levels, times :data:`DECODE_OVERHEAD`, plus a copy of
    the largest convolution weight (oneDNN reorders weights into its own layout on every CPU call).

    In elements, with ``P`` a level's pixels: a spatial-norm resnet block ``cin -> cout`` holds at most
    ``max(3 cin, 2 cin + cout, cin + 3 cout) P`` (its input, the normed tensor and a 1x1 convolution of
    the latent frame; then the input and a convolution's input and output); an upsampler ``9 c P`` (its
    input, the 2x nearest copy, the convolution's output); an attention step about ``7 c P`` (input, norm,
    q / k / v, output, projection), plus the ``[heads, P, P]`` weights with eager attention (SDPA does not
    build them); ``norm_out`` ``3 c P``; the latent frame resized to full resolution for the spatial norms.
    With Emu3-Gen's VQ (256 channels x ``(1, 2, 2, 4)``) the peak is the first full-resolution block
    (512 -> 256 channels): ``6 x 256 x side**2`` elements, 0.4 GB at 256 px and 3.2 GB at 720 px in
    float32 before the overhead (transformers' four-frame decode: ``4 x 10 x 256 x side**2``)."""
    mult = list(vq_config.channel_multiplier)
    channels = [vq_config.base_channels * m for m in mult]
    levels = len(mult)
    pixels = [side * side // 4 ** i for i in range(levels)]  # level i: downsampled 2 ** i
    latent = vq_config.embed_dim * side * side

    def attention(c, p):  # eager: the scores and the scaled scores in ``dtype``, the softmax in float32
        weights = vq_config.num_attention_heads * p * p * (2 + 4 // dtype.itemsize) if eager_attention else 0
        return 7 * c * p + weights

    cin, top = channels[-1], pixels[-1]
    peak = max(3 * cin * top, attention(cin, top))  # middle block
    weight = 9 * cin * cin
    for i in reversed(range(levels)):
        c = channels[i]
        for _ in range(vq_config.num_res_blocks + 1):
            peak = max(peak, pixels[i] * max(3 * cin, 2 * cin + c, cin + 3 * c))
            if i in vq_config.attn_resolutions:
                peak = max(peak, attention(c, pixels[i]))
            weight = max(weight, 9 * cin * c)
            cin = c
        if i:
            peak = max(peak, 9 * c * pixels[i])
    peak = max(peak, 3 * channels[0] * pixels[0])  # norm_out
    return int((DECODE_OVERHEAD * (peak + latent) + weight) * dtype.itemsize)


def allowed_resolutions(downsample: int, max_positions: int) -> range:
    """Square sizes whose stream (and a prompt) fits the model's positions, in steps of the downsample."""
    grid = 1
    while (grid + 1) * (grid + 2) + 3 + PROMPT_ROOM <= max_positions:
        grid += 1
    return range(downsample, grid * downsample + 1, downsample)


def load(folder, device="cpu", dtype=torch.float32, resolution: int | None = None):
    """A :class:`~.base.LoadedModel` for a converted Emu3 folder; ``resolution`` in pixels (square, a
    multiple of the VQ downsample; default 720, the reference's area)."""
    from .base import LoadedModel

    folder = pathlib.Path(folder)
    model, tokenizer = load_model(folder, device, dtype)
    vocab = Emu3Vocabulary(model, tokenizer)
    affine = _pixel_affine(folder)
    down = 2 ** (len(model.config.vq_config.channel_multiplier) - 1)
    allowed = allowed_resolutions(down, model.config.text_config.max_position_embeddings)
    presets = tuple(r for r in PRESETS if r in allowed)
    eager = getattr(model.model.vqmodel.config, "_attn_implementation", None) == "eager"

    def build(res: int) -> LoadedModel:
        if isinstance(res, bool) or not isinstance(res, int) or res not in allowed:
            raise ValueError(f"resolution must be a multiple of {down} pixels (Emu3's VQ downsample) from "
                             f"{allowed.start} to {allowed[-1]}, e.g. {', '.join(map(str, presets))} (got {res})")
        grid = res // down
        adapter = Emu3Adapter(model, tokenizer, grid, vocab, affine)
        return LoadedModel(family="emu3", name=f"Emu3 ({folder.name})", adapter=adapter, decode=adapter.decode,
                           condition="text", resolutions=tuple(sorted({*presets, res})), resize=build,
                           info={"resolution": res, "grid": grid}, modules={"emu3": model},
                           decode_bytes_per_image=decode_bytes(model.config.vq_config, res,
                                                               full_dtype(dtype, device), eager))

    if resolution is None:
        resolution = DEFAULT_RESOLUTION if DEFAULT_RESOLUTION in allowed else allowed[-1]
    return build(resolution)


def _detect(path: pathlib.Path) -> Detected | None:
    model_type = (transformers_config(path) or {}).get("model_type")
    return Detected("emu3", path, model_type) if model_type == "emu3" else None


FAMILY = Family(
    "emu3", detect=_detect,
    needs="an Emu3 folder in transformers' format (Emu3-Gen-hf): config.json with model_type 'emu3', weights "
          "(the VQ-VAE included) and tokenizer files",
    load=lambda hit, o: load(hit.path, o.device, o.storage or o.dtype, o.resolution))
