"""GLM-Image (``glm-image``): ``diffusers`` (zai-org/GLM-Image, the release's diffusers layout, which the pack's
loaders read: loaders/glm_image.py for the AR stage, decoders/glm_dit.py for the DiT stage):

* ``model_index.json`` (``GlmImagePipeline``, every component the release lists);
* ``vision_language_encoder/``: transformers' ``GlmImageForConditionalGeneration`` (``model_type "glm_image"``: the
  9B GLM-4-shaped text model and its 16,512-id head, the vision encoder and the VQ model, which the pack does not
  read but the release carries), ``config.json``, ``generation_config.json``, safetensors shards + their index;
* ``processor/``: a ``GlmImageProcessor`` saved by transformers (its image processor, a fast tokenizer, the chat
  template): the vocabulary's first 16,512 ids the ``<|dit_token_N|>`` of the head (the codes 0..16383, the image
  start and end 16384 / 16385, more dit tokens), then the text ids: a small byte-level BPE, GLM-4's specials at
  their ids shifted by 16,512 (``<|endoftext|>`` 167841, ``<|image|>`` 167855: transformers' defaults) and
  unreachable fillers up to 168,064;
* ``transformer/``: diffusers' ``GlmImageTransformer2DModel`` (the 7B DiT), ``config.json``, safetensors shards +
  ``diffusion_pytorch_model.safetensors.index.json``;
* ``vae/`` (``AutoencoderKL``), ``text_encoder/`` (the ByT5 glyph encoder, ``T5EncoderModel``), ``tokenizer/``
  (``ByT5Tokenizer``), ``scheduler/`` (``FlowMatchEulerDiscreteScheduler``).

The tiny test writer (tests/glm_image_files.py) shares the small files' logic here (:func:`write_processor`,
:func:`tokenizer_object`, :func:`chat_template`, :func:`glm_settings`, :func:`generation_settings`,
:data:`MODEL_INDEX`, :data:`SCHEDULER`) at its own sizes.  ``--layers N``: the AR text model and the DiT N blocks
deep each (the DiT at most its 30), every width the real one; the vision encoder, VQ model, glyph encoder and VAE as
they are.  ``--scale s``: whole heads of the real head sizes, depths and convolution widths times ``s``; the
vocabularies, codebooks, patch sizes and the VAE's levels (32 px per large-grid token) kept."""
from __future__ import annotations

import json
import pathlib

import torch

from .bpe import SPLIT, byte_symbols, word_merges
from .json_files import write_config, write_json
from .scaling import scaled, scaled_channels, scaled_text
from .stats import Stats, write_weights
from .tensors import specs_of
from .weight_files import record_shards, write_sharded

# Sources (what each mark means: __init__.py):
#  [T]  transformers 5.24's GlmImageConfig() defaults (text model, vision encoder, VQ model; the image start / end,
#       the pad id 167841 and <|image|> 167855), checked against the installed version at every write
#       (:func:`check_defaults`).
#  [R]  recalled, not re-read offline: the release's rope_parameters (M-RoPE sections [8, 12, 12] over half of the
#       128-wide heads: partial_rotary_factor 0.5; transformers' default sections need it); GLM-4's special ids
#       (151329 <|endoftext|> ... 151340 <|end_of_image|>, 151343 <|image|>); google/byt5-small's config.json (the
#       glyph encoder: its encoder as T5EncoderModel); the release's 4 AR and 3 DiT shards.
#  [F]  FastVideo's GlmImageDiTArchConfig (and sglang's GlmImageArchConfig, the same values): the 7B DiT.
#  [P]  diffusers 0.42.1's GlmImagePipeline: calculate_shift's defaults (base_image_seq_len 256, base_shift 0.25,
#       max_shift 0.75, which the scheduler's config feeds), mu passed (dynamic shifting), the VAE scale
#       2 ** (levels - 1) times the patch times 2 = 32 px per large-grid token (decoders/glm_dit.py checks it).
#  [N]  the pack: loaders/glm_image.py (sampling settings 0.9 / 0.75, the end as eos, the start as BOS),
#       tests/glm_image_files.py (the vocabulary's order, the scheduler's time_shift_type "linear").
#  [D]  derived: the text ids start after the head's 16512 (168064 = 16512 + GLM-4's 151552), GLM-4's specials at
#       16512 + their GLM-4 ids (which gives transformers' 167841 and 167855), fillers elsewhere.
#  [A]  assumed: the VAE's widths (block_out_channels [128, 256, 512, 512], 2 blocks per level, 32 groups), its
#       latents_mean / latents_std values and sample_size; every weight file in the run's dtype (bfloat16).
CONFIGS = {
    "glm-image": {
        "release": ("zai-org/GLM-Image (9B AR GlmImageForConditionalGeneration + 7B GlmImageTransformer2DModel DiT, "
                    "diffusers layout)"),
        "layouts": ("diffusers",),
        "text": dict(vocab_size=168064, hidden_size=4096, intermediate_size=13696, num_hidden_layers=40,  # [T]
                     num_attention_heads=32, num_key_value_heads=2, vision_vocab_size=16512,  # [T]
                     max_position_embeddings=131072, rms_norm_eps=1e-5, attention_bias=True,  # [T]
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0,  # [T]
                                      "mrope_section": [8, 12, 12], "partial_rotary_factor": 0.5}),  # [R]
        "vision": dict(depth=40, hidden_size=1536, num_heads=16, intermediate_size=6144, patch_size=16,  # [T]
                       image_size=2048, spatial_merge_size=1),  # [T]
        "vq": dict(embed_dim=2048, num_embeddings=16384, latent_channels=1536),  # [T]
        "ids": {"image_start": 16384, "image_end": 16385, "<|endoftext|>": 167841, "<|image|>": 167855},  # [T]
        "glm4_ids": {"<|endoftext|>": 151329, "<|image|>": 151343},  # the first 12 specials in a row from 151329 [R]
        "dit": dict(patch_size=2, in_channels=16, out_channels=16, num_layers=30, attention_head_dim=128,  # [F]
                    num_attention_heads=32, text_embed_dim=1472, time_embed_dim=512, condition_dim=256,  # [F]
                    prior_vq_quantizer_codebook_size=16384),  # [F]
        "glyph": dict(vocab_size=384, d_model=1472, d_kv=64, d_ff=3584, num_layers=12, num_decoder_layers=4,  # [R]
                      num_heads=6, relative_attention_num_buckets=32, relative_attention_max_distance=128,  # [R]
                      feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, dropout_rate=0.1,  # [R]
                      tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0),  # [R]
        "vae": dict(block_out_channels=[128, 256, 512, 512], layers_per_block=2, latent_channels=16,  # [P] 4 levels
                    norm_num_groups=32, sample_size=1024,  # [A]
                    latents_mean=[round(0.05 * (i % 5 - 2), 2) for i in range(16)],  # [A]
                    latents_std=[round(0.8 + 0.05 * (i % 8), 2) for i in range(16)]),  # [A]
        "image_tokens": 16 * 16 + 32 * 32 + 1,  # 1024 px: the preview grid, the large grid, the end [N]
        # 5.5 GB: the release's 4 AR shards and 3 DiT shards [R] (5 GB would make 5 AR shards)
        "shard_gb": {"diffusers": 5.5},
    },
}
ENCODER, PROCESSOR = "vision_language_encoder", "processor"
#: the folders holding weights, each read by its own class
WEIGHT_PARTS = (ENCODER, "transformer", "vae", "text_encoder")
#: each weight folder's file stem (transformers' model*.safetensors, diffusers' diffusion_pytorch_model*)
STEMS = {ENCODER: "model", "transformer": "diffusion_pytorch_model", "vae": "diffusion_pytorch_model",
         "text_encoder": "model"}
MODEL_INDEX = {"_class_name": "GlmImagePipeline", "_diffusers_version": "0.37.0.dev0",
               "processor": ["transformers", "GlmImageProcessor"],
               "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
               "text_encoder": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", "ByT5Tokenizer"],
               "transformer": ["diffusers", "GlmImageTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"],
               "vision_language_encoder": ["transformers", "GlmImageForConditionalGeneration"]}
#: FlowMatchEulerDiscreteScheduler's settings: the pipeline's shift defaults [P], dynamic shifting, linear [N]
SCHEDULER = dict(base_shift=0.25, max_shift=0.75, base_image_seq_len=256, use_dynamic_shifting=True,
                 time_shift_type="linear")
#: GLM-4's specials in id order (the first 12 from <|endoftext|> in a row, <|image|> later [R])
GLM_SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|image|>"]
#: the words the small BPE merges whole (prompts merge somewhat)
WORDS = ("a red fox in snow blue sky cat on mat lighthouse at dawn photo of an astronaut riding horse mars "
         "poster with the word hello").split()


def dit(i: int) -> str:
    return f"<|dit_token_{i}|>"


def chat_template(start: int, end: int) -> str:
    """A chat template rendering a user turn's text as it is (an image as start, ``<|image|>``, end); the release's
    own is not reproduced, and need not be: the pack calls the release's processor, whatever template it ships."""
    return ("{%- for message in messages -%}{%- if message.content is string -%}{{ message.content }}"
            "{%- else -%}{%- for item in message.content -%}{%- if item.type == 'image' -%}"
            + dit(start) + "<|image|>" + dit(end) +
            "{%- elif item.type == 'text' -%}{{ item.text }}{%- endif -%}{%- endfor -%}{%- endif -%}"
            "{%- endfor -%}")


def tokenizer_object(vision_vocab: int, specials: dict[str, int] | None = None, vocab_size: int | None = None):
    """A fast tokenizer: dit tokens at ids 0 .. ``vision_vocab`` - 1, byte-level BPE text after them (:data:`WORDS`
    merged whole), GLM's specials at ``specials``' ids (default: right after the text, in :data:`GLM_SPECIALS`'
    order), unreachable fillers for the ids below ``vocab_size`` nothing else holds (and the specials then in the
    model's vocabulary as well, at their ids); ``(tokenizer, ids of the specials)``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {dit(i): i for i in range(vision_vocab)}  # in the model's vocabulary, and added (special) below
    vocab.update({s: vision_vocab + i for i, s in enumerate(byte_symbols())})
    merges = word_merges(WORDS, vocab)
    if specials is None:
        specials = {s: len(vocab) + i for i, s in enumerate(GLM_SPECIALS)}
    elif min(specials.values()) < len(vocab):
        raise ValueError(f"GLM's specials from id {min(specials.values())} overlap the {len(vocab)} ids before them")
    if vocab_size is not None:  # the specials in the model's vocabulary too (else they would be numbered after it)
        at = {i: s for s, i in specials.items()}
        for i in range(len(vocab), vocab_size):  # fillers: no merge reaches them, no text holds them
            vocab[at.get(i, f"<|unused_{i}|>")] = i
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    spec = json.loads(tok.to_str())
    names = [(i, dit(i)) for i in range(vision_vocab)] + [(i, s) for s, i in specials.items()]
    spec["added_tokens"] = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, s in names]
    return Tokenizer.from_str(json.dumps(spec)), specials


def write_processor(folder: pathlib.Path, vision_vocab: int, start: int, end: int,
                    specials: dict[str, int] | None = None, vocab_size: int | None = None):
    """``processor/``: a ``GlmImageProcessor`` (transformers' PIL image processor, the tokenizer of
    :func:`tokenizer_object` with the image start as its BOS, :func:`chat_template`) as transformers saves it;
    ``(tokenizer, ids of GLM's specials)``."""
    from transformers import GlmImageProcessor, PreTrainedTokenizerFast
    from transformers.models.glm_image import GlmImageImageProcessorPil

    tok, specials = tokenizer_object(vision_vocab, specials, vocab_size)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=dit(start), eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        padding_side="left", extra_special_tokens={"image_token": "<|image|>", "grid_bos_token": "<sop>",
                                                   "grid_eos_token": "<eop>"})
    processor = GlmImageProcessor(image_processor=GlmImageImageProcessorPil(), tokenizer=tokenizer,
                                  chat_template=chat_template(start, end))
    processor.save_pretrained(str(folder))
    return tokenizer, specials


def glm_settings(text: dict, vision: dict, vq: dict, specials: dict, start: int, end: int) -> dict:
    """The ``GlmImageConfig`` fields: the parts' settings and the ids (pad: ``<|endoftext|>``, eos: the image
    end, ``<|image|>``, the image start and end)."""
    return {"text_config": {**text, "pad_token_id": specials["<|endoftext|>"], "eos_token_id": end},
            "vision_config": vision, "vq_config": vq, "image_token_id": specials["<|image|>"],
            "image_start_token_id": start, "image_end_token_id": end}


def encoder_settings(config, dtype: str = "bfloat16") -> dict:
    """config.json of ``vision_language_encoder/``: the configuration's fields, its class and dtype."""
    saved = config.to_dict()
    saved.update(architectures=["GlmImageForConditionalGeneration"], dtype=dtype)
    return saved


def generation_settings(specials: dict, start: int, end: int) -> dict:
    """generation_config.json as the release's vision_language_encoder holds it (sampling settings and ids) [N]."""
    return {"_from_model_config": False, "do_sample": True, "temperature": 0.9, "top_p": 0.75,
            "eos_token_id": end, "pad_token_id": specials["<|endoftext|>"], "bos_token_id": start,
            "transformers_version": "5.0.0.dev0"}


def vae_settings(block_out_channels, latent_channels: int, latents_mean, latents_std, norm_num_groups: int,
                 sample_size: int, layers_per_block: int = 1) -> dict:
    """``AutoencoderKL``'s arguments: RGB in and out, one encoder / decoder block per width."""
    levels = len(block_out_channels)
    return dict(block_out_channels=tuple(block_out_channels), in_channels=3, out_channels=3,
                down_block_types=["DownEncoderBlock2D"] * levels, up_block_types=["UpDecoderBlock2D"] * levels,
                latent_channels=latent_channels, norm_num_groups=norm_num_groups, sample_size=sample_size,
                latents_mean=list(latents_mean), latents_std=list(latents_std), layers_per_block=layers_per_block)


# -- the full-size release -------------------------------------------------------------------------------------
def check_defaults(cfg: dict | None = None) -> None:
    """The values marked [T] (of :data:`CONFIGS`, the full size) are the installed transformers' ``GlmImageConfig()``
    defaults (or one error)."""
    from transformers import GlmImageConfig

    cfg = cfg or CONFIGS["glm-image"]
    config = GlmImageConfig()
    want = {**{f"text.{k}": getattr(config.text_config, k) for k in cfg["text"] if k != "rope_parameters"},
            "text.rope_theta": config.text_config.rope_parameters["rope_theta"],
            **{f"vision.{k}": getattr(config.vision_config, k) for k in cfg["vision"]},
            **{f"vq.{k}": getattr(config.vq_config, k) for k in cfg["vq"]},
            "image_start": config.image_start_token_id, "image_end": config.image_end_token_id,
            "<|endoftext|>": config.text_config.pad_token_id, "<|image|>": config.image_token_id}
    have = {**{f"text.{k}": v for k, v in cfg["text"].items() if k != "rope_parameters"},
            "text.rope_theta": cfg["text"]["rope_parameters"]["rope_theta"],
            **{f"vision.{k}": v for k, v in cfg["vision"].items()}, **{f"vq.{k}": v for k, v in cfg["vq"].items()},
            **cfg["ids"]}
    wrong = {k: (have[k], want[k]) for k in want if have[k] != want[k]}
    if wrong:
        import transformers

        raise ValueError(f"GLM-Image: transformers {transformers.__version__}'s GlmImageConfig defaults are not "
                         f"this module's [T] values (ours, theirs): {wrong}")


def special_ids(cfg: dict) -> dict[str, int]:
    """GLM's specials at 16512 + their GLM-4 ids [D], checked against transformers' pad and ``<|image|>`` ids."""
    text_start = cfg["text"]["vision_vocab_size"]
    first = text_start + cfg["glm4_ids"]["<|endoftext|>"]
    ids = {name: first + i for i, name in enumerate(GLM_SPECIALS[:-1])}
    ids["<|image|>"] = text_start + cfg["glm4_ids"]["<|image|>"]
    wrong = {k: (ids[k], cfg["ids"][k]) for k in ("<|endoftext|>", "<|image|>") if ids[k] != cfg["ids"][k]}
    if wrong or max(ids.values()) >= cfg["text"]["vocab_size"]:
        raise ValueError(f"GLM-Image vocabulary: the specials' ids {wrong} are not transformers' (or past "
                         f"{cfg['text']['vocab_size']})")
    return ids


def part_settings(cfg: dict, scale: float) -> dict[str, dict]:
    """Each weight folder's settings at ``scale``: the ``GlmImageConfig`` fields (``vision_language_encoder``),
    the DiT's and the VAE's arguments, the glyph encoder's ``T5Config`` fields."""
    text = scaled_text(cfg["text"], scale)
    vision, vq = dict(cfg["vision"]), dict(cfg["vq"])
    dit_args, glyph, vae = dict(cfg["dit"]), dict(cfg["glyph"]), dict(cfg["vae"])
    if scale != 1:
        head = vision["hidden_size"] // vision["num_heads"]
        heads = scaled(vision["num_heads"], scale)
        vision.update(num_heads=heads, hidden_size=heads * head, depth=scaled(vision["depth"], scale),
                      intermediate_size=scaled_channels(vision["intermediate_size"], scale))
        vq.update(embed_dim=scaled_channels(vq["embed_dim"], scale), latent_channels=vision["hidden_size"])
        dit_args.update(num_attention_heads=scaled(dit_args["num_attention_heads"], scale),
                        num_layers=scaled(dit_args["num_layers"], scale))
        glyph.update(d_model=scaled_channels(glyph["d_model"], scale), d_ff=scaled_channels(glyph["d_ff"], scale),
                     num_heads=scaled(glyph["num_heads"], scale), num_layers=scaled(glyph["num_layers"], scale))
        vae.update(block_out_channels=[scaled_channels(c, scale) for c in vae["block_out_channels"]],
                   layers_per_block=scaled(vae["layers_per_block"], scale))
    dit_args["text_embed_dim"] = glyph["d_model"]  # the glyph encoder's width
    start, end = cfg["ids"]["image_start"], cfg["ids"]["image_end"]
    return {ENCODER: glm_settings(text, vision, vq, special_ids(cfg), start, end), "transformer": dit_args,
            "vae": vae_settings(**vae), "text_encoder": glyph}


def part_models(settings: dict[str, dict]) -> dict[str, object]:
    """Each weight folder's model built on the meta device (nothing allocated) from its settings (or its
    config.json's): transformers' and diffusers' own classes, as the pack's loaders build them."""
    from diffusers import AutoencoderKL, GlmImageTransformer2DModel
    from transformers import GlmImageConfig, GlmImageForConditionalGeneration, T5Config, T5EncoderModel

    glm = GlmImageConfig(**{k: v for k, v in settings[ENCODER].items() if k != "model_type"})
    glyph = T5Config.from_dict(settings["text_encoder"])
    glyph.architectures = ["T5EncoderModel"]
    with torch.device("meta"):
        return {ENCODER: GlmImageForConditionalGeneration(glm),
                "transformer": GlmImageTransformer2DModel.from_config(settings["transformer"]),
                "vae": AutoencoderKL.from_config(settings["vae"]), "text_encoder": T5EncoderModel(glyph)}


def saved_state(model) -> dict[str, torch.Tensor]:
    """``model``'s tensors as ``save_pretrained`` writes them: the second name of a tied parameter (T5's
    ``encoder.embed_tokens.weight``, the same parameter as ``shared.weight``) left out."""
    tied = ({n for n, _ in model.named_parameters(remove_duplicate=False)} -
            {n for n, _ in model.named_parameters()})
    return {k: v for k, v in model.state_dict().items() if k not in tied}


def folder_settings(folder: pathlib.Path) -> dict[str, dict]:
    """The written weight folders' config.json files."""
    return {part: json.loads((folder / part / "config.json").read_text()) for part in WEIGHT_PARTS}


def parameter_counts(cfg: dict, scale: float = 1.0) -> dict[str, int]:
    """Parameters per part at ``scale`` (from the meta device): the AR stage's language model and head (what the
    pack reads), its vision encoder and VQ model, the DiT, the glyph encoder, the VAE."""
    models = part_models(part_settings(cfg, scale))
    ar = saved_state(models[ENCODER])
    count = {"AR language model + head": ("model.language_model.", "lm_head."), "AR vision encoder": ("model.visual.",),
             "AR VQ model": ("model.vqmodel.",)}
    out = {what: sum(v.numel() for k, v in ar.items() if k.startswith(prefixes)) for what, prefixes in count.items()}
    for part, what in (("transformer", "DiT"), ("text_encoder", "glyph encoder"), ("vae", "VAE")):
        out[what] = sum(v.numel() for v in saved_state(models[part]).values())
    return out


def _add_folder(folder: pathlib.Path, stats: Stats) -> None:
    for path in sorted(folder.iterdir()):
        if path.is_file() and path not in stats.files:
            stats.add(path)


def write_release(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log):
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import ByT5Tokenizer

    check_defaults()  # the full size's values, whatever depth or scale is written
    settings = part_settings(cfg, scale)
    models = part_models(settings)
    dtype_name = str(dtype).replace("torch.", "")
    write_json(out / "model_index.json", MODEL_INDEX, stats)
    text = cfg["text"]
    start, end = cfg["ids"]["image_start"], cfg["ids"]["image_end"]
    tokenizer, specials = write_processor(out / PROCESSOR, text["vision_vocab_size"], start, end, special_ids(cfg),
                                          text["vocab_size"])
    names = [dit(start), dit(end), *specials]
    got = dict(zip(names, tokenizer.convert_tokens_to_ids(names)))
    if len(tokenizer) != text["vocab_size"] or got != {dit(start): start, dit(end): end, **specials}:
        raise AssertionError(f"GLM-Image's tokenizer: {len(tokenizer)} ids, the specials at {got}")
    _add_folder(out / PROCESSOR, stats)
    ByT5Tokenizer().save_pretrained(str(out / "tokenizer"))
    _add_folder(out / "tokenizer", stats)
    FlowMatchEulerDiscreteScheduler(**SCHEDULER).save_pretrained(str(out / "scheduler"))
    _add_folder(out / "scheduler", stats)
    encoder = out / ENCODER
    write_json(encoder / "config.json", encoder_settings(models[ENCODER].config, dtype_name), stats)
    write_json(encoder / "generation_config.json", generation_settings(specials, start, end), stats)
    for part in ("transformer", "vae"):
        models[part].save_config(str(out / part))  # diffusers' config.json (class, version, every argument)
        stats.add(out / part / "config.json")
    (out / "text_encoder").mkdir()
    write_config(out / "text_encoder", models["text_encoder"].config, dtype, stats)
    parts = []  # (folder, specs, largest shard, stem)
    for part in WEIGHT_PARTS:
        specs = specs_of(saved_state(models[part]))
        if part != ENCODER:  # drawn from seeds of their own (names may repeat across the parts)
            for s in specs:
                s.sources = (f"{part}/{s.name}",)
        sharded = part in (ENCODER, "transformer")  # the VAE and the glyph encoder: one file each [R]
        parts.append((out / part, specs, max_bytes if sharded else None, STEMS[part]))
        record_shards(result, out / part, specs, dtype, parts[-1][2], "safetensors", STEMS[part])
    del models

    def write_all():
        for folder, specs, largest, stem in parts:
            log(f" {folder.name}/")
            write_sharded(folder, specs, dtype, seed, largest, "safetensors", stats, log, stem)

    write_weights(result, stats, [s for _, specs, _, _ in parts for s in specs], dtype, log, write_all)
