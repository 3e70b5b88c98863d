"""Tiny random Chameleon-architecture folders in transformers' converted format
(Lumina-mGPT and Anole flavours), with a word-level tokenizer whose special and
image tokens sit at ids unlike the real ones, so nothing id-specific can pass."""
from __future__ import annotations

import json
import pathlib
import random

import torch

WORDS = ("generate an image of according to the following prompt: a red fox in snow blue sky cat on mat "
         "64x64 96x64 64x96 512x512").split()
CODES = 64
ARCHITECTURES = {"lumina": "ChameleonXLLMXForConditionalGeneration", "anole": "ChameleonForConditionalGeneration"}


def image_token_name(code: int) -> str:
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def vocabulary(seed: int = 0, with_images: bool = True) -> dict[str, int]:
    names = ["<s>", "</s>", "<pad>", "<unk>"] + WORDS
    images = [image_token_name(c) for c in range(CODES)] if with_images else []
    random.Random(seed).shuffle(images)  # token id order unlike code order
    names += images + ["<eoss>", "<racm3:break>", "<reserved08706>", "<reserved08799>", "<image>"]
    names += [f"<reserved{8800 + n:05d}>" for n in range(1, 41)]
    return {name: i for i, name in enumerate(names)}


def write_tokenizer(folder: pathlib.Path, vocab: dict[str, int]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": [n for n in vocab if n.startswith("<") and n not in
                                                           ("<s>", "</s>", "<pad>", "<unk>")]})
    fast.save_pretrained(str(folder))


def tiny_chameleon(flavour: str = "lumina", seed: int = 0, with_images: bool = True):
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    vocab = vocabulary(seed, with_images)
    torch.manual_seed(seed)
    config = ChameleonConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, vocabulary_map=vocab, bos_token_id=0,
        eos_token_id=1, pad_token_id=2,
        vq_config={"embed_dim": 8, "num_embeddings": CODES, "latent_channels": 16, "base_channels": 32,
                   "channel_multiplier": [1, 2], "num_res_blocks": 1, "resolution": 32},
    )
    model = ChameleonForConditionalGeneration(config).eval()
    with torch.no_grad():  # spread the logits: random init is nearly uniform
        model.lm_head.weight.mul_(40)
    return model, vocab


def write_chameleon(folder: pathlib.Path, flavour: str = "lumina", seed: int = 0, with_images: bool = True,
                    vqgan: bool = True) -> pathlib.Path:
    """A converted-format folder; with ``vqgan`` also ``tokenizer/vqgan.yaml`` + ``vqgan.ckpt``
    whose codebook matches the vocabulary's image tokens."""
    model, vocab = tiny_chameleon(flavour, seed, with_images)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = [ARCHITECTURES[flavour]]  # what the real folders name
    (folder / "config.json").write_text(json.dumps(cfg))
    write_tokenizer(folder, vocab)
    if vqgan:
        write_tiny_vqgan(folder / "tokenizer", CODES, seed)
    return folder


def write_tiny_vqgan(folder: pathlib.Path, codes: int = CODES, seed: int = 0):
    """Meta's layout with the real downsampling (16: five levels), narrow channels."""
    from spec_ar.decoders.vqgan import VQGANSpec

    from .vqgan_files import write_vqgan

    spec = VQGANSpec(embed_dim=8, n_embed=codes, z_channels=16, ch=32, ch_mult=(1, 1, 1, 1, 1), num_res_blocks=1,
                     attn_resolutions=(), resolution=64)
    return write_vqgan(folder, spec, seed)
