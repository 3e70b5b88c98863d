"""Tiny random Lumina-mGPT 2.0 folders in the release layout (Alpha-VLLM/Lumina-mGPT-2.0): the authors'
Chameleon fork's config (``model_type: chameleon``, ``ChameleonXLLMXForConditionalGeneration``, the fork-only
fields ``model_parallel_size``, ``mask_image_logits``, ``dropout``, ``z_loss_weight``), q/k norms stored one
row per model-parallel shard (``[model_parallel_size, head_dim]``, as the fork's ``ChameleonLayerNorm``), no
VQ-VAE weights (the fork's training deletes it), bfloat16 safetensors shards with an index, and a tokenizer
whose specials sit at the ids the reference code hard-codes (``<racm3:break>`` 151665, ``<eoss>`` 151666,
``<reserved08799>`` 151670; Qwen2.5's ``<|endoftext|>`` 151643 as EOS, no BOS) over a few words; image
tokens are 155000 + code, 16384 codes, as the reference's logits processor assumes.  SBER-MoVQGAN goes where
the reference's ``get_movqgan_model`` reads it (``movqgan/270M/movqgan_270M.ckpt``), tiny but with the
release's 16384 codes.

Weights are drawn from one seeded generator in name order (not from transformers' initialisation, which
may change between releases), so the reference outputs recorded from them (``lumina2_reference.py``) stay valid.
"""
from __future__ import annotations

import json
import pathlib

import torch

WORDS = ("Generate an image of according to the following prompt: a red fox in snow blue sky cat on mat , "
         "lighthouse at dawn").split()
SIZES_PX = (32, 64, 96, 128, 256, 512, 768, 1024)
SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<racm3:break>": 151665,
            "<eoss>": 151666, "<reserved08796>": 151667, "<reserved08797>": 151668, "<reserved08798>": 151669,
            "<reserved08799>": 151670, "<reserved08706>": 151900}
SPECIALS.update({f"<reserved{8800 + n:05d}>": 151671 + n for n in range(0, 41)})
VOCAB_SIZE = 172032
CODES = 16384
SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2}
MODEL_PARALLEL = 2


def vocabulary() -> dict[str, int]:
    vocab = {"<unk>": 0}
    for word in WORDS + [f"{w}x{h}" for w in SIZES_PX for h in SIZES_PX]:
        vocab.setdefault(word, len(vocab))
    vocab.update(SPECIALS)
    return vocab


def write_tokenizer(folder: pathlib.Path) -> dict[str, int]:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = vocabulary()
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": [n for n in SPECIALS if n != "<|endoftext|>"]})
    fast.save_pretrained(str(folder))
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"  # a name transformers 4.46 (the reference's) knows too
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    return vocab


def config(vocab: dict[str, int], **sizes) -> dict:
    """config.json as the fork's ``ChameleonXLLMXConfig`` saves it (the vocabulary map: the tokenizer's)."""
    return {"architectures": ["ChameleonXLLMXForConditionalGeneration"], "model_type": "chameleon",
            "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": 151643,
            "pad_token_id": 151643, "hidden_act": "silu", **{**SIZES, **sizes}, "initializer_range": 0.02,
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_scaling": None, "rope_theta": 10000.0,
            "qk_layernorm": True, "model_parallel_size": MODEL_PARALLEL, "swin_norm": False, "mlp_bias": False,
            "mask_image_logits": True, "dropout": 0.0, "z_loss_weight": 0.0, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "transformers_version": "4.46.2", "use_cache": True,
            "vocab_size": VOCAB_SIZE, "vocabulary_map": vocab,
            "vq_config": {"embed_dim": 4, "num_embeddings": 64, "double_latent": False, "latent_channels": 4,
                          "resolution": 32, "in_channels": 3, "base_channels": 32, "channel_multiplier": [1, 2],
                          "num_res_blocks": 1, "attn_resolutions": None, "dropout": 0.0, "attn_type": "vanilla",
                          "initializer_range": 0.02, "model_type": "chameleon_vqgan"}}


def random_weights(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """The language model's tensors in the fork's layout, drawn in name order from one generator, in bfloat16."""
    h, f, heads, kv = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                        "num_key_value_heads"))
    hd, mp = h // heads, cfg["model_parallel_size"]
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], h), "model.norm.weight": (h,),
              "lm_head.weight": (cfg["vocab_size"], h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.k_proj.weight": (kv * hd, h),
                       p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.o_proj.weight": (h, heads * hd),
                       p + "self_attn.q_norm.weight": (mp, hd), p + "self_attn.q_norm.bias": (mp, hd),
                       p + "self_attn.k_norm.weight": (mp, hd), p + "self_attn.k_norm.bias": (mp, hd),
                       p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                       p + "mlp.down_proj.weight": (h, f)})
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(shapes):
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            value = 1 + 0.1 * torch.randn(shapes[name], generator=g)
        elif name.endswith(".bias"):
            value = 0.1 * torch.randn(shapes[name], generator=g)
        elif name == "lm_head.weight":  # spread the logits: greedy picks should vary
            value = 3.0 * torch.randn(shapes[name], generator=g)
        else:
            value = 0.3 * torch.randn(shapes[name], generator=g)
        out[name] = value.to(torch.bfloat16)
    return out


def write_lumina2(folder: pathlib.Path, seed: int = 0, movqgan: bool = True, **sizes) -> pathlib.Path:
    from .liquid_files import write_two_shards
    from .movqgan_files import SPEC, write_movqgan

    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder)
    cfg = config(vocab, **sizes)
    sd = random_weights(cfg, seed)
    write_two_shards(folder, sd)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({
        "_from_model_config": True, "eos_token_id": 151643, "pad_token_id": 151643, "transformers_version": "4.46.2"}))
    if movqgan:
        from dataclasses import replace

        write_movqgan(folder / "movqgan" / "270M" / "movqgan_270M.ckpt", seed, replace(SPEC, n_embed=CODES))
    return folder
