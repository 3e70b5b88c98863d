"""Tiny random GLM-Image folders in the release's diffusers layout (zai-org/GLM-Image), the AR stage, and with
``dit_stage=True`` the DiT stage too:

* ``model_index.json`` (``GlmImagePipeline``, every component the release lists);
* ``vision_language_encoder/``: ``config.json`` (``model_type "glm_image"``, ``GlmImageForConditionalGeneration``),
  ``generation_config.json`` (sampling on, temperature 0.9, top-p 0.75, the image end as end id) and the weights
  as two bfloat16 safetensors shards with their index; the whole model transformers builds (text model, head,
  vision encoder, VQ model), so that transformers' own ``from_pretrained`` reads it;
* ``processor/``: a ``GlmImageProcessor`` saved by transformers (its PIL image processor, a fast tokenizer, a chat
  template), as ``GlmImageProcessor.from_pretrained`` (the diffusers pipeline's ``processor``) reads it;
* with ``dit_stage=True`` (:func:`write_dit`, diffusers needed): ``transformer/`` (``GlmImageTransformer2DModel``),
  ``vae/`` (``AutoencoderKL``), ``text_encoder/`` (``T5EncoderModel``), ``tokenizer/`` (``ByT5Tokenizer``) and
  ``scheduler/`` (``FlowMatchEulerDiscreteScheduler``), each its library's ``save_pretrained`` (safetensors and
  JSON), at the sizes of diffusers' own GLM-Image pipeline test (``tests/pipelines/glm_image``: DiT patch 2, two
  layers of two 8-wide heads, a four-level VAE with 4 latent channels: 8 x 2 = 16 px per upsampled prior token,
  32 per large-grid token as in the release), the T5 a two-layer 32-wide ByT5 (384 ids), the DiT's prior codebook
  the tiny AR model's ``CODES``; weights drawn from one seeded generator in name order (not the libraries'
  initialisation, which leaves parts zero), the VAE's latents mean and std not 0 and 1.

The sizes are those of transformers' own GLM-Image tests (``tests/models/glm_image``: 2 layers, 2 heads, 1 key/value
head, M-RoPE sections of three parts) scaled to keep the release's partial rotary factor 0.5 (head width 32, 16
rotary dims, sections ``[2, 3, 3]``: the release's ``[8, 12, 12]`` a quarter as wide).  The vocabulary keeps the
release's order: ids ``0 .. CODES - 1`` are the image codes ``<|dit_token_N|>``, then the image start and end
(``<|dit_token_CODES|>``, ``<|dit_token_CODES+1|>``: 16384 and 16385 in the release), then more ``<|dit_token_N|>``
up to the head's ``VISION_VOCAB`` ids (16512 in the release), then the text tokens (byte-level BPE over a few words)
and GLM's specials (``<sop>``, ``<eop>``, ``<|image|>``, ...).  The tokenizer's BOS is the image start, as the
release's processor appends it.  The chat template renders a user turn's text as it is (the suffix
``<sop>H W<eop><sop>h w<eop><|dit_token_16384|>`` is the processor's own); the release's template is not
reproduced, and need not be: the pack calls the release's processor, whatever template it ships.  The small files'
logic (tokenizer, processor, chat template, model index, generation config, scheduler) is the full-size writer's
(``spec_ar.bench.scale_checkpoints.glm_image``) at these sizes.

Weights are drawn from one seeded generator in name order (not from transformers' initialisation, which may change
between releases), so the reference recorded from them (``glm_image_reference.py``) stays valid.
"""
from __future__ import annotations

import json
import pathlib

import torch

from spec_ar.bench.scale_checkpoints import glm_image as release

CODES = 64  # image codes (16384 in the release)
VISION_VOCAB = 80  # the head's ids (16512 in the release): codes, image start and end, more dit tokens
START, END = CODES, CODES + 1
TEXT = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1}


def glm_config(vocab_size: int, specials: dict, **text) -> dict:
    """The ``GlmImageConfig`` fields of the tiny model (the release's layout, transformers' test sizes)."""
    return release.glm_settings(
        {**TEXT, **text, "vocab_size": vocab_size, "vision_vocab_size": VISION_VOCAB, "max_position_embeddings": 4096,
         "rms_norm_eps": 1e-5, "attention_bias": True,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                             "partial_rotary_factor": 0.5}},
        {"depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 32, "patch_size": 16, "image_size": 64,
         "spatial_merge_size": 1},
        {"embed_dim": 16, "num_embeddings": CODES, "latent_channels": 32}, specials, START, END)


def random_state(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Every tensor of ``model``'s state drawn in name order from one generator, in bfloat16."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in sorted(model.state_dict().items()):
        if not t.is_floating_point():
            out[name] = t
            continue
        if name.endswith("norm.weight") or name.endswith("norm1.weight") or name.endswith("norm2.weight"):
            value = 1 + 0.1 * torch.randn(t.shape, generator=g)
        elif name.endswith(".bias"):
            value = 0.1 * torch.randn(t.shape, generator=g)
        elif "embed" in name or name == "lm_head.weight":  # spread the logits so that greedy picks vary
            value = 2.0 * torch.randn(t.shape, generator=g)
        else:
            value = 0.3 * torch.randn(t.shape, generator=g)
        out[name] = value.to(torch.bfloat16)
    return out


def generation(specials: dict) -> dict:
    """generation_config.json as the release's vision_language_encoder holds it (sampling settings and ids)."""
    return release.generation_settings(specials, START, END)


def drawn(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``module`` with every floating tensor of its state drawn in name order from one generator (float32)."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, t in sorted(module.state_dict().items()):
        if not t.is_floating_point():
            state[name] = t
        elif "norm" in name and name.endswith(".weight"):
            state[name] = 1 + 0.1 * torch.randn(t.shape, generator=g)
        elif name.endswith(".bias"):
            state[name] = 0.1 * torch.randn(t.shape, generator=g)
        else:
            state[name] = min(0.5, 1.5 / max(1, t[0].numel()) ** 0.5) * torch.randn(t.shape, generator=g)
    module.load_state_dict(state)
    return module


def write_dit(folder: pathlib.Path, seed: int = 1) -> pathlib.Path:
    """The DiT stage's folders of the release in ``folder`` (see the module's docstring)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, GlmImageTransformer2DModel
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    t5 = T5EncoderModel(T5Config(vocab_size=384, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                                 relative_attention_num_buckets=8, dropout_rate=0.0, feed_forward_proj="gated-gelu"))
    drawn(t5, seed).save_pretrained(str(folder / "text_encoder"))
    ByT5Tokenizer().save_pretrained(str(folder / "tokenizer"))
    transformer = GlmImageTransformer2DModel(
        patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
        text_embed_dim=32, time_embed_dim=16, condition_dim=8, prior_vq_quantizer_codebook_size=CODES)
    drawn(transformer, seed + 1).save_pretrained(str(folder / "transformer"))
    vae = AutoencoderKL(**release.vae_settings((4, 8, 16, 16), 4, [0.1, -0.2, 0.0, 0.3], [1.5, 0.8, 1.0, 1.2],
                                                norm_num_groups=4, sample_size=128))
    drawn(vae, seed + 2).save_pretrained(str(folder / "vae"))
    FlowMatchEulerDiscreteScheduler(**release.SCHEDULER).save_pretrained(str(folder / "scheduler"))
    return folder


def write_glm_image(folder: pathlib.Path, seed: int = 0, generation_config: dict | None = None, dit_stage: bool = False,
                    **text) -> pathlib.Path:
    """The diffusers-layout folder (the AR stage; ``dit_stage``: the DiT stage's folders too, :func:`write_dit`);
    ``generation_config``: the file to write instead."""
    from transformers import GlmImageConfig, GlmImageForConditionalGeneration

    from .liquid_files import write_two_shards

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer, specials = release.write_processor(folder / "processor", VISION_VOCAB, START, END)
    cfg = glm_config(len(tokenizer), specials, **text)
    config = GlmImageConfig(**cfg)
    with torch.device("meta"):
        model = GlmImageForConditionalGeneration(config)
    sd = random_state(model, seed)
    encoder = folder / "vision_language_encoder"
    encoder.mkdir(exist_ok=True)
    write_two_shards(encoder, sd)
    (encoder / "config.json").write_text(json.dumps(release.encoder_settings(config), indent=2))
    (encoder / "generation_config.json").write_text(json.dumps(generation_config or generation(specials), indent=2))
    (folder / "model_index.json").write_text(json.dumps(release.MODEL_INDEX, indent=2))
    if dit_stage:
        write_dit(folder)
    return folder
