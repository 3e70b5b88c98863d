"""Tiny random-weight checkpoints written in the real on-disk formats."""
from __future__ import annotations

import argparse
import json
import pathlib

import torch

from spec_ar.decoders.vq16 import VQModel, VQSpec
from spec_ar.loaders.llamagen import GPTSpec, LlamaGenGPT
from spec_ar.bench.scale_checkpoints.janus import JANUS_TO_ORIGINAL
from spec_ar.bench.scale_checkpoints.llamagen import llamagen_shapes  # noqa: F401 (re-exported)
from spec_ar.bench.scale_checkpoints.weight_files import write_holes as write_sparse_safetensors  # noqa: F401

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
        # training checkpoints also carry their argparse arguments
        torch.save(sd if wrapper is None else {wrapper: sd, "steps": 1000, "args": argparse.Namespace(lr=1e-4)}, path)
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


JANUS_SPECIAL = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<|User|>", "<|Assistant|>",
                 "<begin_of_image>", "<end_of_image>", "<image_placeholder>", "<unk>"]


#: merges of the tiny byte-level BPE (byte-level symbols: Ġ space, Ċ newline); "ĊĊ" is the template's blank line
JANUS_MERGES = [("Ċ", "Ċ"), ("Ġ", "a"), ("Ġ", "c"), ("a", "t"), ("Ġc", "at"), ("Ġ", "r"), ("e", "d"), ("Ġr", "ed")]


def janus_tokenizer():
    """A tiny tokenizer shaped like DeepSeek's (deepseek-ai/Janus-Pro): byte-level BPE over the 256 byte
    symbols and :data:`JANUS_MERGES`, the special tokens after them, BOS added by the post-processor (as
    ``LlamaTokenizerFast`` adds it).  Like the real one it sees every space and newline, so a prompt's
    surrounding whitespace changes its ids unless stripped."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from .emu3_files import byte_symbols

    vocab = {sym: i for i, sym in enumerate(byte_symbols())}
    for a, b in JANUS_MERGES:
        vocab[a + b] = len(vocab)
    vocab.update({t: len(vocab) + i for i, t in enumerate(JANUS_SPECIAL)})
    tok = Tokenizer(models.BPE(vocab, JANUS_MERGES))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    bos = JANUS_SPECIAL[0]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=JANUS_SPECIAL[1],
                                   pad_token=JANUS_SPECIAL[2], unk_token="<unk>",
                                   additional_special_tokens=JANUS_SPECIAL[3:8])


def tiny_janus(seed=0, hidden=32, intermediate=64, layers=2, heads=4, kv_heads=2):
    """A tiny random JanusForConditionalGeneration (4x4 image tokens, 64 codes); the language
    model's sizes can be widened."""
    from transformers import JanusConfig, JanusForConditionalGeneration

    tok = janus_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in JANUS_SPECIAL}
    cfg = JanusConfig(
        text_config=dict(model_type="llama", vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         bos_token_id=ids[JANUS_SPECIAL[0]], eos_token_id=ids[JANUS_SPECIAL[1]],
                         pad_token_id=ids[JANUS_SPECIAL[2]], tie_word_embeddings=False),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, image_size=16, patch_size=4,
                           projection_dim=hidden, num_image_tokens=16, mlp_ratio=2.0),
        vq_config=dict(embed_dim=8, num_embeddings=64, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 1], num_res_blocks=1, projection_dim=hidden, image_token_embed_dim=hidden),
        image_token_id=ids["<image_placeholder>"], tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # distinct logits, so greedy choices are clear-cut
        model.model.generation_head.vision_head.weight.mul_(40)
        model.model.generation_embeddings.weight.mul_(20)
    model.generation_config.bos_token_id = ids[JANUS_SPECIAL[0]]
    model.generation_config.pad_token_id = ids[JANUS_SPECIAL[2]]
    model.generation_config.generation_kwargs = {"boi_token_id": ids["<begin_of_image>"]}
    return model, tok


def write_janus(folder: pathlib.Path, model, tok) -> pathlib.Path:
    """A converted (``model_type: janus``) folder."""
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


_TO_ORIGINAL = JANUS_TO_ORIGINAL  # transformers names -> deepseek-ai's (the scale writer's map)


def write_original_janus(folder: pathlib.Path, model, tok) -> pathlib.Path:
    """The same weights as deepseek-ai ships them: ``model_type: multi_modality``,
    original key names, fused vision ``qkv``, ``pytorch_model.bin``."""
    import re

    folder.mkdir(parents=True, exist_ok=True)
    sd, fused = {}, {}
    for key, value in model.state_dict().items():
        if key == "model.vision_model.embeddings.position_embedding.weight":
            sd["vision_model.vision_tower.pos_embed"] = value.unsqueeze(0)
            continue
        m = re.match(r"model\.vision_model\.encoder\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)", key)
        if m:
            fused.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = value
            continue
        for pattern, repl in _TO_ORIGINAL:
            key = re.sub(pattern, repl, key)
        sd[key] = value
    for (layer, kind), parts in fused.items():
        sd[f"vision_model.vision_tower.blocks.{layer}.attn.qkv.{kind}"] = torch.cat([parts[c] for c in "qkv"])
    torch.save(sd, folder / "pytorch_model.bin")
    t = model.config.text_config
    lang = {k: getattr(t, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                       "num_attention_heads", "num_key_value_heads", "hidden_act",
                                       "max_position_embeddings", "rms_norm_eps")}
    lang["rope_theta"] = getattr(t, "rope_theta", None) or (getattr(t, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    vision, vq = model.config.vision_config, model.config.vq_config
    write_json(folder / "config.json", {
        "model_type": "multi_modality", "language_config": lang,
        "vision_config": {"cls": "CLIPVisionTower", "model_type": "vision",
                          "params": {"image_size": vision.image_size, "model_name": "siglip_large_patch16_384"}},
        "aligner_config": {"cls": "MlpProjector", "model_type": "aligner",
                           "params": {"depth": 2, "input_dim": vision.hidden_size, "n_embed": t.hidden_size,
                                      "projector_type": "mlp_gelu"}},
        "gen_vision_config": {"cls": "VQ-16", "model_type": "gen_vision",
                              "params": {"image_token_size": vq.num_embeddings, "n_embed": vq.embed_dim}},
        "gen_aligner_config": {"cls": "MlpProjector", "model_type": "gen_aligner",
                               "params": {"depth": 2, "input_dim": vq.embed_dim, "n_embed": t.hidden_size,
                                          "projector_type": "mlp_gelu"}},
        "gen_head_config": {"cls": "vision_head", "model_type": "gen_head",
                            "params": {"image_token_embed": vq.image_token_embed_dim,
                                       "image_token_size": vq.num_embeddings, "n_embed": t.hidden_size}},
    })
    tok.save_pretrained(str(folder))
    return folder


def write_lantern_head(folder: pathlib.Path, hidden=128, heads=2, intermediate=256, vocab=1024, input_type="t2i",
                       seed=0, layers=1) -> pathlib.Path:
    """A draft head as LANTERN releases its drafters (``llamagen_drafter``): the
    target's Llama config with one layer and ``input_type``, and a ``pytorch_model.bin``
    with the authors' key names (no input norm in layer 0, no final norm, fc with bias)."""
    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", {
        "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": hidden, "caption_dim": 2048, "class_dropout_p": 0.0, "initializer_range": 0.02,
        "intermediate_size": intermediate, "max_position_embeddings": 2048, "model_type": "llama",
        "num_attention_heads": heads, "num_hidden_layers": layers, "num_key_value_heads": heads,
        "pretraining_tp": 1, "rms_norm_eps": 1e-06, "rope_scaling": None, "tie_word_embeddings": False,
        "torch_dtype": "float16", "use_cache": True, "vocab_size": vocab, "input_type": input_type})

    def w(*shape, scale=0.05):
        return torch.randn(*shape, generator=g) * scale

    sd = {"embed_tokens.weight": w(vocab, hidden, scale=0.3), "fc.weight": w(hidden, 2 * hidden),
          "fc.bias": w(hidden)}
    for i in range(layers):
        p = f"layers.{i}."
        sd.update({p + f"self_attn.{n}_proj.weight": w(hidden, hidden) for n in "qkvo"})
        sd.update({p + "mlp.gate_proj.weight": w(intermediate, hidden), p + "mlp.up_proj.weight": w(intermediate, hidden),
                   p + "mlp.down_proj.weight": w(hidden, intermediate),
                   p + "post_attention_layernorm.weight": 1 + w(hidden)})
        if i:
            sd[p + "input_layernorm.weight"] = 1 + w(hidden)
    torch.save(sd, folder / "pytorch_model.bin")
    return folder


def write_hf_llamagen(folder: pathlib.Path, gpt: LlamaGenGPT, grid: int) -> pathlib.Path:
    """A LlamaGen GPT as LANTERN's converted folders hold it (jadohu/LlamaGen-T2I):
    transformers' Llama names, wqkv split into q/k/v (rotary left interleaved),
    LlamaGen's own settings (cls_token_num, block_size, input_type) in config.json."""
    from safetensors.torch import save_file

    s = gpt.spec
    names = {"tok_embeddings.": "model.embed_tokens.", "cls_embedding.": "model.cls_embedding.", "norm.": "model.norm.",
             "output.": "lm_head.", "attention.wo.": "self_attn.o_proj.", "feed_forward.w1.": "mlp.gate_proj.",
             "feed_forward.w3.": "mlp.up_proj.", "feed_forward.w2.": "mlp.down_proj.",
             "attention_norm.": "input_layernorm.", "ffn_norm.": "post_attention_layernorm."}
    sd = {}
    for key, value in gpt.state_dict().items():
        if key.endswith("attention.wqkv.weight"):
            layer = key.split(".")[1]
            for name, part in zip("qkv", value.chunk(3)):
                sd[f"model.layers.{layer}.self_attn.{name}_proj.weight"] = part.clone()
            continue
        for old, new in names.items():
            if key.startswith(old) or f".{old}" in key:
                key = ("model." + key.replace(old, new)) if key.startswith("layers.") else key.replace(old, new, 1)
                break
        sd[key] = value.clone()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(folder / "model.safetensors"))
    write_json(folder / "config.json", {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": s.dim,
        "num_attention_heads": s.n_head, "num_key_value_heads": s.n_head, "num_hidden_layers": s.n_layer,
        "intermediate_size": s.ffn_hidden, "vocab_size": s.vocab_size, "rms_norm_eps": 1e-5, "block_size": grid * grid,
        "cls_token_num": s.cond_tokens, "input_type": s.kind, "caption_dim": s.caption_dim, "rope_base": 10000,
        "class_dropout_p": 0.1, "token_dropout_p": 0.1, "resid_dropout_p": 0.1, "ffn_dropout_p": 0.1})
    return folder


def write_lantern_anole_head(folder: pathlib.Path, hidden=32, heads=4, kv_heads=2, intermediate=64, vocab=100,
                             seed=0) -> pathlib.Path:
    """LANTERN's ``anole_drafter`` layout: Anole's Chameleon config with one layer, and a
    ``pytorch_model.bin`` with the authors' key names (an input norm in layer 0, q/k
    LayerNorms with a weight and bias per head, fc with bias)."""
    g = torch.Generator().manual_seed(seed)
    hd = hidden // heads
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", {
        "architectures": ["ChameleonForConditionalGeneration"], "attention_bias": False, "attention_dropout": 0.0,
        "boi_token_id": 8197, "bos_token_id": 1, "eoi_token_id": 8196, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": hidden, "image_token_id": 8711, "intermediate_size": intermediate,
        "max_position_embeddings": 4096, "mlp_bias": False, "model_parallel_size": 1, "model_type": "chameleon",
        "num_attention_heads": heads, "num_hidden_layers": 1, "num_key_value_heads": kv_heads, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 10000.0, "swin_norm": False, "tie_word_embeddings": False,
        "vocab_size": vocab, "vq_config": {"ch": 128, "ch_mult": [1, 1, 2, 2, 4], "model_type": "chameleon_vqgan"}})

    def w(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    p = "layers.0."
    sd = {"embed_tokens.weight": w(vocab, hidden, scale=1.0), "fc.weight": w(hidden, 2 * hidden), "fc.bias": w(hidden),
          p + "input_layernorm.weight": 1 + w(hidden), p + "post_attention_layernorm.weight": 1 + w(hidden),
          p + "self_attn.q_proj.weight": w(heads * hd, hidden), p + "self_attn.k_proj.weight": w(kv_heads * hd, hidden),
          p + "self_attn.v_proj.weight": w(kv_heads * hd, hidden), p + "self_attn.o_proj.weight": w(hidden, hidden),
          p + "self_attn.q_norm.weight": 1 + w(heads, hd), p + "self_attn.q_norm.bias": w(heads, hd),
          p + "self_attn.k_norm.weight": 1 + w(kv_heads, hd), p + "self_attn.k_norm.bias": w(kv_heads, hd),
          p + "mlp.gate_proj.weight": w(intermediate, hidden), p + "mlp.up_proj.weight": w(intermediate, hidden),
          p + "mlp.down_proj.weight": w(hidden, intermediate)}
    torch.save(sd, folder / "pytorch_model.bin")
    return folder


