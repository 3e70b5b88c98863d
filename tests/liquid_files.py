"""Tiny random Liquid folders in the release layout (Junfeng5/Liquid_V1_7B): transformers' Gemma
(``GemmaForCausalLM``, ``model_type: gemma``, tied embeddings, ``hidden_act: gelu`` as Gemma's config says)
whose vocabulary is the text tokenizer's followed by the VQGAN's codes, a Gemma-shaped tokenizer
(``tokenizer.json``: BPE over ``▁``-joined pieces with byte fallback, BOS added by the post-processor;
``<boi>``, ``<eoi>``, ``<unconditional>`` at ids 7-9, where Liquid renamed Gemma's ``<unused*>``), bfloat16
safetensors shards with an index, and Meta's VQGAN (``chameleon/vqgan.yaml`` + ``vqgan.ckpt``, where Liquid's
inference script reads it) with as many codes as the vocabulary has image tokens.

The weights are drawn from one seeded generator in name order (not from transformers' initialisation, which
may change between releases), so the reference outputs recorded from them (``liquid_reference.py``) stay valid.
"""
from __future__ import annotations

import json
import pathlib

import torch

CODES = 64
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<2mass>", "[@BOS@]", "<boi>", "<eoi>", "<unconditional>"]
WORDS = ("a red fox in snow blue sky cat on mat Generate an image based on this description . , "
         "lighthouse at dawn").split()
SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 4, "head_dim": 8}


def _bpe_vocabulary() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Specials, Gemma's byte-fallback pieces, then every word (plain and ``▁``-prefixed) built up letter by
    letter, with the merges that build it."""
    vocab = {name: i for i, name in enumerate(SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    merges, boundaries = [], []
    for word in WORDS:  # the word built letter by letter, then joined to the word boundary before it
        for ch in "▁" + word:
            vocab.setdefault(ch, len(vocab))
        current = word[0]
        for ch in word[1:]:
            if (current, ch) not in merges:
                merges.append((current, ch))
            current += ch
            vocab.setdefault(current, len(vocab))
        boundaries.append(("▁", word))
        vocab.setdefault("▁" + word, len(vocab))
    merges += boundaries  # after every word's own merges: a boundary joins whole words where it can
    return vocab, merges


def write_tokenizer(folder: pathlib.Path) -> int:
    """Gemma's tokenizer files with Liquid's renamed specials; returns the number of text ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    vocab, merges = _bpe_vocabulary()
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", 2)])
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in SPECIALS])
    folder.mkdir(parents=True, exist_ok=True)
    # in the format Gemma's release has (merges as "a b" strings), which tokenizers 0.15 (Liquid's pin) reads too
    spec = json.loads(tok.to_str())
    spec["model"]["merges"] = [f"{a} {b}" for a, b in spec["model"]["merges"]]
    spec["model"].pop("ignore_merges", None)
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False, indent=2))
    decoder = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                        "special": True} for i, s in enumerate(SPECIALS)}
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": decoder, "bos_token": "<bos>",
        "clean_up_tokenization_spaces": False, "eos_token": "<eos>", "legacy": None, "model_max_length": 1000000,
        "pad_token": "<pad>", "sp_model_kwargs": {}, "spaces_between_special_tokens": False,
        "tokenizer_class": "GemmaTokenizer", "unk_token": "<unk>", "use_default_system_prompt": False}, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}, indent=2))
    return tok.get_vocab_size(with_added_tokens=True)


def config(text_ids: int, codes: int = CODES, **sizes) -> dict:
    """config.json as Liquid's release holds it (Gemma-7B's, the vocabulary grown by the codes)."""
    return {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "attention_bias": False,
            "attention_dropout": 0.0, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
            "hidden_act": "gelu", "hidden_activation": None, **{**SIZES, **sizes}, "initializer_range": 0.02,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 10000.0,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.39.2",
            "use_cache": True, "vocab_size": text_ids + codes}


def random_weights(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Gemma's tensors (no ``lm_head``: tied) drawn in name order from one generator, in bfloat16."""
    h, f, heads, kv, hd = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                            "num_key_value_heads", "head_dim"))
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], h), "model.norm.weight": (h,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.k_proj.weight": (kv * hd, h),
                       p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.o_proj.weight": (h, heads * hd),
                       p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                       p + "mlp.down_proj.weight": (h, f)})
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(shapes):
        # norms scale by (1 + w); the embedding is multiplied by sqrt(hidden) and read back by the tied head
        std = 0.2 if "norm" in name else (0.3 if "embed" in name else 0.25)
        out[name] = (torch.randn(shapes[name], generator=g) * std).to(torch.bfloat16)
    return out


def write_two_shards(folder: pathlib.Path, sd: dict[str, torch.Tensor]) -> None:
    """``sd`` as a release saves it: two safetensors shards (names in order) and their index."""
    from safetensors.torch import save_file

    names = sorted(sd)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, part in enumerate(halves):
        file = f"model-{i + 1:05d}-of-{len(halves):05d}.safetensors"
        save_file({n: sd[n].contiguous() for n in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in sd.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def write_liquid(folder: pathlib.Path, seed: int = 0, codes: int = CODES, vqgan: bool = True, **sizes) -> pathlib.Path:
    from .chameleon_files import write_tiny_vqgan

    folder.mkdir(parents=True, exist_ok=True)
    text_ids = write_tokenizer(folder)
    cfg = config(text_ids, codes, **sizes)
    sd = random_weights(cfg, seed)
    write_two_shards(folder, sd)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({
        "_from_model_config": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "do_sample": True,
        "transformers_version": "4.39.2"}))
    if vqgan:
        write_tiny_vqgan(folder / "chameleon", codes, seed)
    return folder
