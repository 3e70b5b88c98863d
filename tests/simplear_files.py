"""Tiny random SimpleAR folders in the release layout (Daniel0724/SimpleAR-{0.5B,1.5B}-{SFT,RL}): a Qwen2.5
folder (``model_type: qwen2``, ``SimpARForCausalLM``, tied embeddings, q/k/v biases) whose vocabulary is the
tokenizer's followed by the Cosmos DV tokenizer's 64,000 codes (SimpleAR's training grows it by
``len(tokenizer) + 64000``), a Qwen2.5-shaped byte-level BPE tokenizer written as a fast tokenizer saves it
(``tokenizer.json`` and the ``vocab.json`` / ``merges.txt`` the reference's ``use_fast=False`` reads): a few
words over the 256 byte symbols, Qwen2.5's 22 specials after the vocabulary, then the 7 SimpleAR adds
(``<|t2i|>`` ... ``<|sov|>``); bfloat16 safetensors shards with an index; and NVIDIA's
Cosmos-1.0-Tokenizer-DV8x16x16 (tiny, with the release's FSQ levels) where the reference reads it,
``Cosmos-1.0-Tokenizer-DV8x16x16/decoder.jit`` beside the model.

Weights are drawn from one seeded generator in name order (not from transformers' initialisation, which
may change between releases), so the reference outputs recorded from them (``simplear_reference.py``) stay valid.
"""
from __future__ import annotations

import json
import pathlib

import torch

from spec_ar.bench.scale_checkpoints.bpe import SPLIT, byte_symbols, word_merges  # SPLIT: Qwen2's split

CODES = 64000  # the FSQ levels 8 x 8 x 8 x 5 x 5 x 5 of the release's tokenizer
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                 "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
SIMPLEAR_SPECIALS = ["<|t2i|>", "<|i2t|>", "<|soi|>", "<|vtokens|>", "<|t2v|>", "<|v2t|>", "<|sov|>"]
WORDS = ("A An highly realistic image of aerial view overexposed low quality deformation a poor composition bad "
         "hands teeth eyes limbs distortion red fox in snow blue sky cat on mat lighthouse at dawn").split()
SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2}
DECODER_FOLDER = "Cosmos-1.0-Tokenizer-DV8x16x16"


def bpe_vocabulary() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The 256 byte symbols, then every word built up letter by letter, then each joined to the space before
    it (``Ġ``), with the merges that build them."""
    vocab = {s: i for i, s in enumerate(byte_symbols())}
    return vocab, word_merges(WORDS, vocab)


def write_tokenizer(folder: pathlib.Path) -> int:
    """The tokenizer files; returns ``len(tokenizer)`` (text ids, specials included)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab, merges = bpe_vocabulary()
    tok = Tokenizer(models.BPE(vocab, merges, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = QWEN_SPECIALS + SIMPLEAR_SPECIALS
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in specials])
    folder.mkdir(parents=True, exist_ok=True)
    spec = json.loads(tok.to_str())
    spec["model"]["merges"] = [f"{a} {b}" for a, b in spec["model"]["merges"]]
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False, indent=2))
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    ids = {s: len(vocab) + i for i, s in enumerate(specials)}
    (folder / "added_tokens.json").write_text(json.dumps(ids, indent=2))
    decoder = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                        "special": True} for s, i in ids.items()}
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder,
        "additional_special_tokens": SIMPLEAR_SPECIALS, "bos_token": None, "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>", "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
        "padding_side": "right", "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None}, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "additional_special_tokens": SIMPLEAR_SPECIALS, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
        indent=2))
    return len(vocab) + len(specials)


def config(text_ids: int, codes: int = CODES, **sizes) -> dict:
    """config.json as SimpleAR's release holds it (Qwen2.5's, the vocabulary grown by the codes; BOS and EOS
    ids: ``<|endoftext|>``'s, 151643 in the release)."""
    eos = text_ids - len(QWEN_SPECIALS) - len(SIMPLEAR_SPECIALS)
    return {"architectures": ["SimpARForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0,
            "bos_token_id": eos, "eos_token_id": eos, "hidden_act": "silu", **{**SIZES, **sizes},
            "initializer_range": 0.02, "max_position_embeddings": 32768, "max_window_layers": 21,
            "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 32768,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.47.0.dev0",
            "use_cache": True, "use_sliding_window": False, "vocab_size": text_ids + codes}


def random_weights(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Qwen2's tensors (no ``lm_head``: tied) drawn in name order from one generator, in bfloat16."""
    h, f, heads, kv = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                        "num_key_value_heads"))
    hd = h // heads
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], h), "model.norm.weight": (h,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.q_proj.bias": (heads * hd,),
                       p + "self_attn.k_proj.weight": (kv * hd, h), p + "self_attn.k_proj.bias": (kv * hd,),
                       p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.v_proj.bias": (kv * hd,),
                       p + "self_attn.o_proj.weight": (h, heads * hd),
                       p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                       p + "mlp.down_proj.weight": (h, f)})
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(shapes):
        if name.endswith("norm.weight"):
            value = 1 + 0.1 * torch.randn(shapes[name], generator=g)
        elif name.endswith(".bias"):
            value = 0.1 * torch.randn(shapes[name], generator=g)
        elif "embed" in name:  # read back by the tied head: spread the logits so greedy picks vary
            value = 3.0 * torch.randn(shapes[name], generator=g)
        else:
            value = 0.3 * torch.randn(shapes[name], generator=g)
        out[name] = value.to(torch.bfloat16)
    return out


def instruct_generation(**fields) -> dict:
    """generation_config.json as Qwen2.5-0.5B-Instruct ships it (a SimpleAR release fine-tuned from it may keep
    it), with this tokenizer's ids: sampling settings, its two end ids (``<|im_end|>``, ``<|endoftext|>``), and a
    repetition penalty of 1.1; ``fields`` added or replaced."""
    eos = len(bpe_vocabulary()[0])  # <|endoftext|>: the first special after the vocabulary
    im_end = eos + QWEN_SPECIALS.index("<|im_end|>")
    return {"bos_token_id": eos, "pad_token_id": eos, "do_sample": True, "eos_token_id": [im_end, eos],
            "repetition_penalty": 1.1, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
            "transformers_version": "4.37.0", **fields}


def write_simplear(folder: pathlib.Path, seed: int = 0, decoder: bool = True, codes: int = CODES,
                   generation: dict | None = None, **sizes) -> pathlib.Path:
    """A SimpleAR folder; its Cosmos decoder (``decoder``) beside it, where the reference script reads it.
    ``generation``: the generation_config.json to write (default: the special ids only)."""
    from .liquid_files import write_two_shards

    folder.mkdir(parents=True, exist_ok=True)
    text_ids = write_tokenizer(folder)
    cfg = config(text_ids, codes, **sizes)
    write_two_shards(folder, random_weights(cfg, seed))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    if generation is None:
        generation = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
                      "transformers_version": "4.47.0.dev0"}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    if decoder:
        from .cosmos_files import write_cosmos_decoder

        write_cosmos_decoder(folder.parent / DECODER_FOLDER)
    return folder
