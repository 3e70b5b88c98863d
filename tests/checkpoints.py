"""Tiny random-weight checkpoints written in the real on-disk formats."""
from __future__ import annotations

import json
import pathlib

import torch

from spec_ar.decoders.vq16 import VQModel, VQSpec
from spec_ar.loaders.llamagen import GPTSpec, LlamaGenGPT

TINY_VQ = VQSpec(ch=32, ch_mult=(1, 1, 2, 2, 4), enc_blocks=2, dec_blocks=3, z_channels=32,
                 codebook_size=1024, embed_dim=8)


def tiny_gpt_spec(kind="c2i", vocab=1024, dim=128, n_layer=2, classes=10, caption_dim=32, cond_tokens=12):
    ffn = -(-int(2 * 4 * dim / 3) // 256) * 256
    extra = {"num_classes": classes} if kind == "c2i" else {"caption_dim": caption_dim, "cond_tokens": cond_tokens}
    return GPTSpec(dim=dim, n_layer=n_layer, n_head=max(1, dim // 64), ffn_hidden=ffn, vocab_size=vocab,
                   kind=kind, **extra)


def random_gpt(spec: GPTSpec, seed=0) -> LlamaGenGPT:
    torch.manual_seed(seed)
    gpt = LlamaGenGPT(spec)
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0, 0.3 if "embedding" in name or "tok_" in name else 0.08)
        if spec.kind == "t2i":
            gpt.cls_embedding.uncond_embedding.normal_(0, 1)
    return gpt.eval()


def write_gpt(path: pathlib.Path, gpt: LlamaGenGPT, wrapper: str | None = "model", freqs_cis: int | None = None):
    """As LlamaGen saves: ``{"model": sd}`` (or ``module``/``state_dict``/raw) in a
    ``.pt``; ``.safetensors`` gets the raw state dict."""
    sd = {k: v.clone() for k, v in gpt.state_dict().items()}
    if freqs_cis:  # old files carry the rotary table
        sd["freqs_cis"] = torch.zeros(gpt.spec.cond_tokens + freqs_cis ** 2, gpt.spec.head_dim // 2, 2)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(sd, str(path))
    else:
        torch.save(sd if wrapper is None else {wrapper: sd, "steps": 1000}, path)
    return path


def write_vq(path: pathlib.Path, spec: VQSpec = TINY_VQ, seed=0) -> pathlib.Path:
    torch.manual_seed(seed)
    model = VQModel(spec)
    sd = dict(model.state_dict())
    sd["quantize.codebook_used"] = torch.zeros(65536)  # the training statistic real files carry
    torch.save({"model": sd, "steps": 1}, path)
    return path


def write_t5(folder: pathlib.Path, d_model=32, seed=0) -> pathlib.Path:
    """A tiny T5 encoder and a word-level tokenizer that appends ``</s>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    folder.mkdir(parents=True, exist_ok=True)
    words = ("a red blue green circle square triangle in the top left right bottom on striped dotted "
             "background of cat dog").split()
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(str(folder))
    torch.manual_seed(seed)
    cfg = T5Config(vocab_size=len(vocab), d_model=d_model, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    T5EncoderModel(cfg).save_pretrained(str(folder))
    return folder


def write_json(path: pathlib.Path, obj) -> pathlib.Path:
    path.write_text(json.dumps(obj))
    return path
