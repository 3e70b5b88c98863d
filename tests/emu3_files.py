"""A tiny random Emu3 folder in the converted transformers format (``Emu3-community/Emu3-Gen-hf``).

What the real folder holds, scaled down: ``config.json`` (``model_type: emu3``, text and VQ sub-configs and the
whole vocabulary as ``vocabulary_map``), ``model.safetensors``, ``generation_config.json``,
``preprocessor_config.json`` and a byte-level BPE tokenizer (``vocab.json``, ``merges.txt``,
``tokenizer_config.json`` with the added tokens and the named image tokens ``boi_token``/``eoi_token``/
``eof_token``/``image_token``/``image_wrapper_token``).

The real vocabulary has 151643 text ids, the special tokens (``<|endoftext|>``, ``<|extra_200|>`` = end of line,
``<|extra_201|>`` = end of frame, ``<|extra_203|>`` = BOS, ``<|extra_204|>`` = EOS, ``<|image start|>``, ...)
and 32768 ``<|visual token NNNNNN|>`` tokens.  Here the text part is the 256 byte symbols (id = byte value)
and the merged tokens of :data:`MERGES` (among them ``90``, which the real vocabulary also holds whole), and
the visual tokens get their ids in a shuffled order, so a loader that assumes ``id = offset + code`` fails.

:func:`write_baai_converted_tokenizer` writes a tokenizer alone, with the same text part and the special
tokens at the ids BAAI's tokenizer gives them, as transformers' converter writes it.
"""
from __future__ import annotations

import json
import pathlib

import torch

PAD, EOL, EOF, BOS, EOS = "<|endoftext|>", "<|extra_200|>", "<|extra_201|>", "<|extra_203|>", "<|extra_204|>"
BOI, EOI, WRAPPER, IMAGE = "<|image start|>", "<|image end|>", "<|image token|>", "<image>"
NAMED = {"boi_token": BOI, "eoi_token": EOI, "eof_token": EOF, "image_token": IMAGE, "image_wrapper_token": WRAPPER}
CODES = 64  # codebook size of the tiny VQ (the real one: 32768)


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for bytes (GPT-2's table)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


#: merges of the tiny BPE, in rank order (byte-level symbols: Ġ is the space): "90" merged whole as in the
#: real vocabulary, " cat" from " c" + "at", and ".W" (punctuation glued to a letter, as BAAI's split allows)
MERGES = [("9", "0"), ("a", "t"), ("Ġ", "c"), ("Ġc", "at"), (".", "W")]


def text_vocabulary() -> dict[str, int]:
    """Byte symbols at their byte values, then the merged tokens: the same ids in both tiny tokenizers."""
    vocab = {s: i for i, s in enumerate(byte_symbols())}
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    return vocab


def vocabulary(codes: int = CODES, seed: int = 0) -> dict[str, int]:
    vocab = text_vocabulary()
    for tok in (PAD, EOL, EOF, BOS, EOS, WRAPPER, BOI, EOI):
        vocab[tok] = len(vocab)
    base = len(vocab)
    order = torch.randperm(codes, generator=torch.Generator().manual_seed(seed)).tolist()
    vocab.update({f"<|visual token {c:06d}|>": base + order[c] for c in range(codes)})
    vocab[IMAGE] = len(vocab)
    return vocab


def write_tokenizer(folder: pathlib.Path, vocab: dict[str, int]) -> None:
    """``vocab.json`` + ``merges.txt`` (byte-level BPE over :func:`text_vocabulary` and :data:`MERGES`) and a
    ``tokenizer_config.json`` that names the special tokens as the converted repo does."""
    folder.mkdir(parents=True, exist_ok=True)
    text = text_vocabulary()
    (folder / "vocab.json").write_text(json.dumps(vocab))  # the specials too, as the converter writes it
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES))
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for s, i in vocab.items() if s not in text}
    config = {"added_tokens_decoder": added, "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": PAD,
              "clean_up_tokenization_spaces": False, "add_prefix_space": False, "errors": "replace",
              "extra_special_tokens": NAMED, **NAMED, "model_max_length": 1 << 30,
              "processor_class": "Emu3Processor", "tokenizer_class": "GPT2Tokenizer"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": PAD, **NAMED}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=1))


def tiny_config(vocab: dict[str, int], codes: int = CODES) -> dict:
    """Config keyword arguments: 2 layers of width 32; a 4-level VQ (spatial downsample 8, 32 channels so
    that GroupNorm's 32 groups fit, ``hidden_size = base_channels * channel_multiplier[-1]``)."""
    text = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=9216,
                pad_token_id=vocab[PAD], bos_token_id=vocab[BOS], eos_token_id=vocab[EOS],
                attention_dropout=0.0, tie_word_embeddings=False)
    vq = dict(codebook_size=codes, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 1, 1, 1],
              num_res_blocks=1, attn_resolutions=[3], hidden_size=32, num_attention_heads=1,
              temporal_downsample_factor=4)
    return {"text_config": text, "vq_config": vq, "vocabulary_map": vocab, "tie_word_embeddings": False}


def tiny_emu3_vq(seed: int = 0, **overrides):
    """An ``Emu3VQVAE`` alone with :func:`tiny_config`'s VQ settings (``overrides`` replace some), random weights."""
    from transformers import Emu3VQVAEConfig
    from transformers.models.emu3.modeling_emu3 import Emu3VQVAE

    torch.manual_seed(seed)
    return Emu3VQVAE(Emu3VQVAEConfig(**{**tiny_config({PAD: 0, BOS: 1, EOS: 2})["vq_config"], **overrides})).eval()


def tiny_emu3(seed: int = 0, codes: int = CODES):
    """``(Emu3ForConditionalGeneration, vocabulary)`` with random weights, scaled so that the
    next-token choices are clear-cut (greedy comparisons are then robust to float noise)."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    vocab = vocabulary(codes, seed)
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(Emu3Config(**tiny_config(vocab, codes))).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 1.0)
        model.get_input_embeddings().weight.normal_(0, 1.0)
        model.model.vqmodel.quantize.embedding.weight.normal_(0, 1.0)
    return model, vocab


def write_emu3(folder: str | pathlib.Path, seed: int = 0, codes: int = CODES) -> pathlib.Path:
    """A converted Emu3 folder (config.json, model.safetensors, generation_config.json, tokenizer)."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model, vocab = tiny_emu3(seed, codes)
    model.save_pretrained(str(folder))
    write_tokenizer(folder, vocab)
    (folder / "preprocessor_config.json").write_text(json.dumps({  # as released: pixels normalised to [-1, 1]
        "image_processor_type": "Emu3ImageProcessor", "processor_class": "Emu3Processor", "do_convert_rgb": True,
        "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3, "rescale_factor": 1 / 255, "resample": 3, "spatial_factor": 8,
        "min_pixels": 256 * 256, "max_pixels": 1024 * 1024}, indent=1))
    return folder


#: where BAAI's tokenizer puts its special tokens (``SPECIAL_START_ID`` of ``emu3/mllm/tokenization_emu3.py``,
#: baaivision/Emu3 @f6ea9aaa): <|endoftext|>, <|im_start|>, <|im_end|>, <|extra_0|> ... <|extra_204|>, then the
#: lines of ``emu3_vision_tokens.txt``
BAAI_SPECIAL_START = 151643
#: the tiny ``emu3_vision_tokens.txt`` behind :func:`baai_vocabulary` (our order; the real file's is not known here)
BAAI_VISION_TOKENS = [BOI, EOI, WRAPPER] + [f"<|visual token {c:06d}|>" for c in range(8)]


def baai_vocabulary() -> dict[str, int]:
    """:func:`text_vocabulary` plus the special tokens at the ids BAAI's tokenizer gives them."""
    vocab = text_vocabulary()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(205)]
    vocab.update({name: BAAI_SPECIAL_START + i for i, name in enumerate(specials + BAAI_VISION_TOKENS)})
    return vocab


def write_baai_converted_tokenizer(folder: str | pathlib.Path) -> pathlib.Path:
    """A tokenizer alone, as transformers' ``convert_emu3_weights_to_hf.py`` converts BAAI's: the vocabulary
    with the specials at BAAI's ids, the merges, BOS / EOS / pad named; split by GPT-2's byte-level pattern."""
    folder = pathlib.Path(folder)
    write_tokenizer(folder, baai_vocabulary())
    return folder
