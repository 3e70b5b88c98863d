"""Liquid (``liquid-7b``): ``original`` (Junfeng5/Liquid_V1_7B: ``GemmaForCausalLM``, Gemma-7B's vocabulary grown by
the 8192 VQ codes, tied embeddings, a Gemma tokenizer.json with ``<boi>`` / ``<eoi>`` / ``<unconditional>`` at ids
7-9), with Meta's VQGAN in ``chameleon/vqgan.yaml`` + ``vqgan.ckpt`` where Liquid's script reads it."""
from __future__ import annotations

import pathlib

from .json_files import write_config, write_json
from .scaling import scaled_text
from .stats import Stats, write_weights
from .tensors import meta_state, specs_of
from .vqgan import vqgan_spec, write_vqgan
from .weight_files import record_shards, write_sharded

# Sources (what each mark means: __init__.py):
#  [T]  GemmaConfig's defaults: Gemma-7B's.
#  [N]  the image tokens 256000 + code, the VQGAN, the grid; [R] the ids of Gemma's tokenizer.
CONFIGS = {
    "liquid-7b": {
        "release": "Junfeng5/Liquid_V1_7B (Gemma-7B + 8192 image codes), 8.5B",
        "layouts": ("original",),
        "text": dict(vocab_size=264192, hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,  # [T], [N]
                     num_attention_heads=16, num_key_value_heads=16, head_dim=256, max_position_embeddings=8192,
                     rms_norm_eps=1e-6, rope_theta=10000.0),  # GemmaConfig's defaults are Gemma-7B's [T]
        "text_ids": 256000,  # Gemma's tokenizer; image token = 256000 + code [N]
        "vq": dict(embed_dim=256, n_embed=8192, z_channels=256, ch=128, ch_mult=[1, 1, 2, 2, 4],  # [T], [N]
                   num_res_blocks=2, attn_resolutions=[], resolution=512),  # Chameleon's VQGAN [N]
        "image_tokens": 1024,  # 32 x 32 at 512 px [N]
        "ids": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4, "<2mass>": 5, "[@BOS@]": 6,  # [R]
                "<boi>": 7, "<eoi>": 8, "<unconditional>": 9},  # [N]
        "shard_gb": {"original": 5.0},
    },
}


def liquid_config(cfg: dict, scale: float):
    from transformers import GemmaConfig

    text = scaled_text(cfg["text"], scale)
    text["vocab_size"] = cfg["text_ids"] + cfg["vq"]["n_embed"]  # the scaled model keeps the real vocabulary
    ids = cfg["ids"]
    config = GemmaConfig(**text, pad_token_id=ids["<pad>"], bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"],
                         tie_word_embeddings=True)
    config.architectures = ["GemmaForCausalLM"]
    return config


def write_liquid_tokenizer(folder: pathlib.Path, cfg: dict, stats: Stats) -> None:
    """Gemma's tokenizer shape with Liquid's names: ``tokenizer.json`` (BPE over ``▁``-joined pieces with byte
    fallback, the space normalised to ``▁``, BOS added by the post-processor) of ``text_ids`` entries: the
    specials, 256 byte pieces, letters and a few merges, then unreachable fillers; a ``GemmaTokenizer``
    tokenizer_config.json naming the added tokens."""
    ids, size = cfg["ids"], cfg["text_ids"]
    by_id = {i: n for n, i in ids.items()}
    vocab = {by_id.get(i, f"<unused{i}>"): i for i in range(10)}
    vocab.update({f"<0x{b:02X}>": 10 + b for b in range(256)})
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.,", "▁a", "▁c", "at", "▁cat", "▁r", "ed",
              "▁red"]
    vocab.update({p: len(vocab) + i for i, p in enumerate(pieces)})
    merges = ["▁ a", "▁ c", "a t", "▁c at", "▁ r", "e d", "▁r ed"]
    vocab.update({f"<fill{i}>": i for i in range(len(vocab), size)})
    added = [{"id": i, "content": by_id.get(i, f"<unused{i}>"), "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for i in range(10)]
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}, "pre_tokenizer": None,
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}},
                                        {"SpecialToken": {"id": "<bos>", "type_id": 1}},
                                        {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<bos>": {"id": "<bos>", "ids": [ids["<bos>"]],
                                                            "tokens": ["<bos>"]}}},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "vocab": vocab,
                      "merges": merges}}
    write_json(folder / "tokenizer.json", spec, stats)
    write_json(folder / "tokenizer_config.json", {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>", "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
        "model_max_length": 1000000000000000019884624838656, "tokenizer_class": "GemmaTokenizer"}, stats)
    write_json(folder / "special_tokens_map.json", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                                                    "unk_token": "<unk>"}, stats)


def write_release(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log):
    from transformers import GemmaForCausalLM

    config = liquid_config(cfg, scale)
    specs = [s for s in specs_of(meta_state(GemmaForCausalLM, config)) if s.name != "lm_head.weight"]  # tied
    write_vqgan(out / "chameleon", vqgan_spec(cfg, scale), seed, stats)
    write_liquid_tokenizer(out, cfg, stats)
    write_config(out, config, dtype, stats, {"hidden_act": "gelu", "hidden_activation": None})  # as released [N]
    ids = cfg["ids"]
    write_json(out / "generation_config.json", {"bos_token_id": ids["<bos>"], "eos_token_id": ids["<eos>"],
                                                "pad_token_id": ids["<pad>"]}, stats)
    record_shards(result, out, specs, dtype, max_bytes, "safetensors")
    write_weights(result, stats, specs, dtype, log,
                  lambda: write_sharded(out, specs, dtype, seed, max_bytes, "safetensors", stats, log))
