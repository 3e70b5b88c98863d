"""SimpleAR (``simplear-1.5b``): ``original`` (Daniel0724/SimpleAR-1.5B-RL: ``SimpARForCausalLM`` / ``model_type:
qwen2``, Qwen2.5-1.5B's vocabulary grown by SimpleAR's 7 specials and the 64,000 codes, tied embeddings, a
Qwen2.5-sized byte-level tokenizer), with NVIDIA's Cosmos DV8x16x16 ``decoder.jit`` (TorchScript, the release's
size) in the folder, where ``spec-ar download`` puts it."""
from __future__ import annotations

import torch

from .bpe import bpe_tokenizer, fill_ids, save_tokenizer, text_vocabulary
from .json_files import write_config, write_json
from .scaling import scaled_channels, scaled_text
from .stats import write_weights
from .tensors import meta_state, specs_of
from .weight_files import record_shards, write_sharded

# Sources (what each mark means: __init__.py):
#  [S]  SimpleAR's code (wdrink/SimpleAR @d56b6e5): the tokenizer grows by 7 specials (<|t2i|> ... <|sov|>) after
#       Qwen2.5's 151665 ids and the embedding by len(tokenizer) + 64000 (train.py); NVIDIA's DV config
#       (Cosmos-Tokenizer networks/configs.py ``discrete_video``, bench/cosmos_archive.DV).
#  [R]  Qwen2.5-1.5B's config.json and special ids.
CONFIGS = {
    "simplear-1.5b": {
        "release": ("Daniel0724/SimpleAR-1.5B-RL (Qwen2.5-1.5B + 64000 image codes) + "
                    "nvidia/Cosmos-1.0-Tokenizer-DV8x16x16"),
        "layouts": ("original",),
        "text": dict(vocab_size=151672 + 64000, hidden_size=1536, intermediate_size=8960,  # [S], [R]
                     num_hidden_layers=28,  # [R]
                     num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=131072,  # [R] Qwen2.5-1.5B
                     rms_norm_eps=1e-6, rope_theta=1000000.0),  # [R]
        "text_ids": 151672,  # [S]
        "cosmos": {"n_embed": 64000},  # the decoder: bench/cosmos_archive.DV [S]
        "image_tokens": 4096,  # 64 x 64 at 1024 px [S]
        "ids": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,  # [R]
                "<|t2i|>": 151665, "<|i2t|>": 151666, "<|soi|>": 151667, "<|vtokens|>": 151668,  # [S]
                "<|t2v|>": 151669, "<|v2t|>": 151670, "<|sov|>": 151671},  # [S]
        "shard_gb": {"original": 5.0},
    },
}


def simplear_config(cfg: dict, scale: float):
    from transformers import Qwen2Config

    text = scaled_text(cfg["text"], scale)
    text["vocab_size"] = cfg["text_ids"] + cfg["cosmos"]["n_embed"]  # the scaled model keeps the real vocabulary
    eos = cfg["ids"]["<|endoftext|>"]
    config = Qwen2Config(**text, bos_token_id=eos, eos_token_id=eos, tie_word_embeddings=True,
                         use_sliding_window=False, sliding_window=text["max_position_embeddings"])
    config.architectures = ["SimpARForCausalLM"]
    return config


def write_release(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log):
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

    from ..cosmos_archive import DV, write_archive

    config = simplear_config(cfg, scale)
    specs = [s for s in specs_of(meta_state(Qwen2ForCausalLM, config)) if s.name != "lm_head.weight"]  # tied
    ids = cfg["ids"]
    vocab = fill_ids({**text_vocabulary(ids["<|endoftext|>"]), **ids}, cfg["text_ids"], "<|reserved_{}|>")
    added = [n for n, i in vocab.items() if i >= ids["<|endoftext|>"]]
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe_tokenizer(vocab, added), eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>",
                                   additional_special_tokens=[n for n in ids if n != "<|endoftext|>"])
    save_tokenizer(fast, out, stats)
    write_config(out, config, dtype, stats)
    write_json(out / "generation_config.json",
               {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|endoftext|>"]}, stats)
    cosmos = dict(DV)
    if scale != 1:
        cosmos["channels"] = scaled_channels(cosmos["channels"], scale)
    stats.add(write_archive(out, cosmos, seed, torch.float32))  # where `spec-ar download` puts it
    record_shards(result, out, specs, dtype, max_bytes, "safetensors")
    write_weights(result, stats, specs, dtype, log,
                  lambda: write_sharded(out, specs, dtype, seed, max_bytes, "safetensors", stats, log))
