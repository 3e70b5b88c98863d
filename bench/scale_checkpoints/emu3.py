"""Emu3-Gen (``emu3-gen``): ``converted`` (Emu3-community/Emu3-Gen-hf, 8B: ``model_type: emu3``, the MoVQ VAE
included, vocab.json + merges.txt tokenizer)."""
from __future__ import annotations

import pathlib

from .bpe import MERGES, text_vocabulary
from .json_files import write_config, write_json
from .scaling import scaled_channels, scaled_text
from .stats import Stats, write_weights
from .tensors import meta_state, specs_of
from .weight_files import record_shards, write_sharded

# Sources (what each mark means: __init__.py):
#  [T]  Emu3TextConfig / Emu3VQVAEConfig: Emu3's (checkpoint Emu3-community/Emu3-Chat-hf, the same 8B
#       architecture as Emu3-Gen).
#  [C]  convert_emu3_weights_to_hf.py: tokenizer files, specials <|extra_203|> BOS, <|extra_204|> EOS, <|endoftext|>
#       pad.
#  [N]  the BAAI special ids from 151643; image grids.
#  [D]  the order of <|image start|>, <|image end|>, <|image token|> and the visual tokens after the 208 BAAI
#       specials, which exactly fills vocab 184622.
CONFIGS = {
    "emu3-gen": {
        "release": "Emu3-community/Emu3-Gen-hf (BAAI/Emu3-Gen converted), 8B",
        "layouts": ("converted",),
        "text": dict(vocab_size=184622, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,  # [T]
                     num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=9216,  # [T]
                     rms_norm_eps=1e-5, rope_theta=1000000.0),  # [T]
        "vq": dict(codebook_size=32768, embed_dim=4, latent_channels=4, base_channels=256,  # [T], [N]
                   channel_multiplier=[1, 2, 2, 4], num_res_blocks=2, attn_resolutions=[3], hidden_size=1024,
                   num_attention_heads=1, temporal_downsample_factor=4),  # [T] (downsample 8 [N])
        "image_tokens": 8190,  # 720 px: 90 rows of 90 + end-of-line [N]
        "ids": {"<|endoftext|>": 151643, "<|extra_200|>": 151846, "<|extra_201|>": 151847,  # [N], [C]
                "<|extra_203|>": 151849, "<|extra_204|>": 151850,  # BOS / EOS = Emu3TextConfig's [T]
                "<|image start|>": 151851, "<|image end|>": 151852, "<|image token|>": 151853,  # [D]
                "<|visual token 000000|>": 151854},  # codes in order up to 184621 [D]
        "shard_gb": {"converted": 5.0},
    },
}


def emu3_vocabulary(cfg: dict, size: int, codes: int) -> dict[str, int]:
    ids = cfg["ids"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(205)]
    vocab = text_vocabulary(ids["<|endoftext|>"])  # Qwen's 151643 text ids [N]
    vocab.update({s: ids["<|endoftext|>"] + i for i, s in enumerate(specials)})
    for name in ("<|image start|>", "<|image end|>", "<|image token|>"):
        vocab[name] = ids[name]
    first = ids["<|visual token 000000|>"]
    vocab.update({f"<|visual token {c:06d}|>": first + c for c in range(codes)})
    if max(vocab.values()) + 1 != size:
        raise ValueError(f"Emu3 vocabulary: {max(vocab.values()) + 1} ids for vocab_size {size}")
    return vocab


EMU3_NAMED = {"boi_token": "<|image start|>", "eoi_token": "<|image end|>", "eof_token": "<|extra_201|>",
              "image_token": "<image>", "image_wrapper_token": "<|image token|>"}


def write_emu3_tokenizer(folder: pathlib.Path, vocab: dict[str, int], stats: Stats) -> None:
    """As Emu3-Gen-hf holds it: vocab.json (specials included) + merges.txt, a GPT2Tokenizer
    tokenizer_config.json naming the image tokens, every special and visual token an added token, and
    ``<image>`` (the processor's placeholder) added after the model's vocabulary."""
    text_end = vocab["<|endoftext|>"]
    write_json(folder / "vocab.json", vocab, stats)
    merges = [(a, b) for a, b in MERGES if a in vocab and b in vocab and a + b in vocab]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    stats.add(folder / "merges.txt")
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for s, i in vocab.items() if i >= text_end}
    added[str(len(vocab))] = {"content": "<image>", "lstrip": False, "normalized": False, "rstrip": False,
                              "single_word": False, "special": True}
    special = {"bos_token": "<|extra_203|>", "eos_token": "<|extra_204|>", "pad_token": "<|endoftext|>",
               "unk_token": "<|endoftext|>"}
    write_json(folder / "tokenizer_config.json", {
        "added_tokens_decoder": added, **special, "clean_up_tokenization_spaces": False, "add_prefix_space": False,
        "errors": "replace", "extra_special_tokens": EMU3_NAMED, **EMU3_NAMED, "model_max_length": 1 << 30,
        "processor_class": "Emu3Processor", "tokenizer_class": "GPT2Tokenizer"}, stats)
    write_json(folder / "special_tokens_map.json", {**special, **EMU3_NAMED}, stats)


def emu3_config(cfg: dict, scale: float, vocab: dict[str, int]):
    from transformers import Emu3Config

    text = scaled_text(cfg["text"], scale)
    ids = cfg["ids"]
    text.update(pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|extra_203|>"],
                eos_token_id=ids["<|extra_204|>"], attention_dropout=0.1, tie_word_embeddings=False)
    vq = dict(cfg["vq"])
    if scale != 1.0:
        vq["base_channels"] = scaled_channels(vq["base_channels"], scale)
    vq["hidden_size"] = vq["base_channels"] * vq["channel_multiplier"][-1]  # transformers requires it [N]
    config = Emu3Config(text_config=text, vq_config=vq, vocabulary_map=vocab, tie_word_embeddings=False)
    config.architectures = ["Emu3ForConditionalGeneration"]
    return config


def write_release(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log):
    from transformers import Emu3ForConditionalGeneration

    vocab = emu3_vocabulary(cfg, cfg["text"]["vocab_size"], cfg["vq"]["codebook_size"])
    write_emu3_tokenizer(out, vocab, stats)
    config = emu3_config(cfg, scale, vocab)
    specs = specs_of(meta_state(Emu3ForConditionalGeneration, config))
    write_config(out, config, dtype, stats)
    ids = cfg["ids"]
    write_json(out / "generation_config.json", {"bos_token_id": ids["<|extra_203|>"],
                                                "eos_token_id": ids["<|extra_204|>"],
                                                "pad_token_id": ids["<|endoftext|>"]}, stats)
    write_json(out / "preprocessor_config.json", {  # as released: pixels normalised to [-1, 1]
        "image_processor_type": "Emu3ImageProcessor", "processor_class": "Emu3Processor", "do_convert_rgb": True,
        "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
        "rescale_factor": 1 / 255, "resample": 3, "spatial_factor": 8, "min_pixels": 512 * 512,
        "max_pixels": 1024 * 1024}, stats)
    record_shards(result, out, specs, dtype, max_bytes, "safetensors")
    write_weights(result, stats, specs, dtype, log,
                  lambda: write_sharded(out, specs, dtype, seed, max_bytes, "safetensors", stats, log))
