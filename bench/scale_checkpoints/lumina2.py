"""Lumina-mGPT 2.0 (``lumina-mgpt-2.0``): ``original`` (Alpha-VLLM/Lumina-mGPT-2.0 as the authors' fork saves it:
``ChameleonXLLMX`` config with the fork's fields, q/k norms ``[model_parallel_size, head_dim]``, no VQ-VAE, a
Qwen2.5-sized tokenizer with Chameleon's specials, image ids 155000 + code named by no entry; its text model's sizes
assumed, see [A] below), with SBER-MoVQGAN 270M's decoder in ``movqgan/270M/movqgan_270M.ckpt``."""
from __future__ import annotations

import torch

from .bpe import bpe_tokenizer, save_tokenizer, text_vocabulary
from .chameleon import lumina_original_specs
from .json_files import write_json
from .scaling import meta_ffn, scaled_channels, scaled_text
from .stats import write_weights
from .tensors import TensorSpec, meta_state, specs_of
from .weight_files import record_shards, write_sharded, write_torch

# Sources (what each mark means: __init__.py):
#  [M]  Lumina-mGPT 2.0's code (Alpha-VLLM/Lumina-mGPT-2.0 @f44a4d7): image ids 155000 + code (16384 codes, its
#       logits processor), <racm3:break> 151665, <eoss> 151666, <reserved08799> 151670 (hard-coded in
#       inference_solver.py), the MoVQGAN 270M ddconfig (movqgan/__init__.py).
#  [A]  assumed: what no published file here fixes.  Lumina-mGPT 2.0's config.json is not in its repository (its
#       training builds the model from a config_new.json it does not ship): the text model is taken as Chameleon-7B
#       (the architecture the authors forked, "7B" in their report), its vocabulary the smallest multiple of 1024
#       past the last image id (172032), 10240 positions (its generate() allows 10240 new tokens).
#  [D]  <reserved08706>'s id and the size tokens after it.
CONFIGS = {
    "lumina-mgpt-2.0": {
        "release": "Alpha-VLLM/Lumina-mGPT-2.0 (7B, the authors' Chameleon fork) + ai-forever/MoVQGAN 270M",
        "layouts": ("original",),
        "text": dict(vocab_size=172032, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,  # [A]
                     num_key_value_heads=32, max_position_embeddings=10240, rms_norm_eps=1e-5,  # [A]
                     rope_theta=10000.0, multiple_of=256, ffn_dim_multiplier=1.0),  # -> FFN 11008 [A]
        "movqgan": dict(ch=256, ch_mult=(1, 2, 2, 4), num_res_blocks=2, attn_levels=(3,), z_channels=4,  # [M]
                        embed_dim=4, n_embed=16384),  # [M]
        "image_tokens": 9315,  # 768 px: 96 rows of 96 + row end, 2 size tokens, end [M]
        "ids": {"<|endoftext|>": 151643, "<racm3:break>": 151665, "<eoss>": 151666, "<reserved08796>": 151667,  # [M]
                "<reserved08797>": 151668, "<reserved08798>": 151669, "<reserved08799>": 151670,  # [M]
                "<reserved08706>": 151671},  # [D]; the size tokens <reserved08800 + n> follow [D]
        "image_base": 155000,  # [M]
        "shard_gb": {"original": 5.0},
    },
}


def lumina2_vocabulary(cfg: dict) -> dict[str, int]:
    """Qwen2.5-sized text ids (byte-level BPE fillers up to <|endoftext|>), then the specials at their ids, the
    size tokens after them; image ids are named by no entry (the reference adds them by number)."""
    ids = cfg["ids"]
    vocab = text_vocabulary(ids["<|endoftext|>"])
    vocab.update(ids)
    top = max(ids.values())
    vocab.update({f"<reserved{8800 + n:05d}>": top + 1 + n for n in range(64)})  # up to 2016 px [D]
    return vocab


def lumina2_config(cfg: dict, scale: float, dtype: torch.dtype) -> dict:
    """config.json as the fork's ``ChameleonXLLMXConfig`` saves it (``model_parallel_size``, ``mask_image_logits``,
    ``dropout``, ``z_loss_weight``), the vocabulary map the tokenizer's (no IMGIMG names)."""
    text = scaled_text(cfg["text"], scale)
    inter = meta_ffn(text["hidden_size"], text.pop("ffn_dim_multiplier"), text.pop("multiple_of"))
    ids = cfg["ids"]
    return {"architectures": ["ChameleonXLLMXForConditionalGeneration"], "model_type": "chameleon", **text,
            "intermediate_size": inter, "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None,
            "eos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"], "hidden_act": "silu",
            "initializer_range": 0.02, "qk_layernorm": True, "model_parallel_size": 1, "swin_norm": False,
            "mlp_bias": False, "mask_image_logits": True, "dropout": 0.0, "z_loss_weight": 0.0,
            "tie_word_embeddings": False, "torch_dtype": str(dtype).replace("torch.", ""),
            "transformers_version": "4.46.2", "use_cache": True, "vocabulary_map": lumina2_vocabulary(cfg)}


def movqgan_specs(cfg: dict, scale: float) -> list[TensorSpec]:
    """``movqgan_270M.ckpt``'s decoder side (what the pack reads), float32 as released."""
    from ...decoders.movqgan import MoVQModel, MoVQSpec

    m = dict(cfg["movqgan"])
    if scale != 1:
        m["ch"] = scaled_channels(m["ch"], scale)
    with torch.device("meta"):
        model = MoVQModel(MoVQSpec(**m))
    out = specs_of(model.state_dict())
    for s in out:
        s.dtype = torch.float32
        s.sources = ("movqgan." + s.name,)
    return out


def write_release(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log):
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    settings = lumina2_config(cfg, scale, dtype)
    write_json(out / "config.json", settings, stats)
    ids = cfg["ids"]
    write_json(out / "generation_config.json", {"_from_model_config": True, "eos_token_id": ids["<|endoftext|>"],
                                                "pad_token_id": ids["<|endoftext|>"], "transformers_version": "4.46.2"},
               stats)
    vocab = settings["vocabulary_map"]
    fast_vocab = {k: v for k, v in vocab.items() if not (k.startswith("<") and k.endswith(">"))}
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=bpe_tokenizer(vocab, [n for n in vocab if n not in fast_vocab]),
                                   eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    save_tokenizer(fast, out, stats)
    movq = out / "movqgan" / "270M" / "movqgan_270M.ckpt"  # where the reference's get_movqgan_model reads it
    movq.parent.mkdir(parents=True, exist_ok=True)
    write_torch(movq, {s.name: s for s in movqgan_specs(cfg, scale)}, torch.float32, seed)
    stats.add(movq)
    config = ChameleonConfig(**{k: v for k, v in settings.items() if k not in ("architectures", "model_type")})
    specs = lumina_original_specs(specs_of(meta_state(ChameleonForConditionalGeneration, config)))
    record_shards(result, out, specs, dtype, max_bytes, "safetensors")
    write_weights(result, stats, specs, dtype, log,
                  lambda: write_sharded(out, specs, dtype, seed, max_bytes, "safetensors", stats, log))
