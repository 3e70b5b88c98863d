"""Janus-Pro-7B (``janus-pro-7b``): ``original`` (deepseek-ai/Janus-Pro-7B: ``model_type: multi_modality``, torch
pickle shards ``pytorch_model-0000X-of-0000N.bin`` + ``pytorch_model.bin.index.json``, original key names with the
fused SigLIP ``qkv``, the unused ``attn_pool`` head and the VQ's ``codebook_used`` buffer) or ``converted``
(deepseek-community/Janus-Pro-7B: ``model_type: janus``, safetensors shards + index)."""
from __future__ import annotations

import pathlib
import re

from .bpe import bpe_tokenizer, fill_ids, save_tokenizer, text_vocabulary
from .json_files import write_config, write_json
from .scaling import scaled, scaled_channels, scaled_text
from .stats import Stats, write_weights
from .tensors import TensorSpec, init_of, meta_state, specs_of
from .weight_files import record_shards, write_sharded

# Sources (what each mark means: __init__.py):
#  [T]  JanusVisionConfig / JanusVQVAEConfig: the Janus-Pro towers (1B projection widths).
#  [C]  convert_janus_weights_to_hf.py: the 7B projection widths are the original config's aligner / gen_aligner /
#       gen_head n_embed = LLM width.
#  [N]  pad 100015, <begin_of_image> 100016.
#  [R]  deepseek-ai/Janus-Pro-7B's language_config: 30 layers, width 4096, FFN 11008, 32 heads, vocab 102400, 16384
#       positions; the DeepSeek-LLM-7B base; the parameter count it gives (7.42B) matches the release's.
#  [D]  <|User|>, <|Assistant|>, <end_of_image>.
CONFIGS = {
    "janus-pro-7b": {
        "release": "deepseek-ai/Janus-Pro-7B (original), deepseek-community/Janus-Pro-7B (converted)",
        "layouts": ("original", "converted"),
        "text": dict(vocab_size=102400, hidden_size=4096, intermediate_size=11008, num_hidden_layers=30,  # [R]
                     num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=16384,  # [R]
                     rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu"),  # LlamaConfig defaults [T]
        "vision": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, image_size=384,  # [T]
                       patch_size=16, mlp_ratio=4.0, depth=2),  # [T] siglip_large_patch16_384
        "vq": dict(embed_dim=8, num_embeddings=16384, latent_channels=256, base_channels=128,  # [T]
                   channel_multiplier=[1, 1, 2, 2, 4], num_res_blocks=2),  # [T], [N] (VQ-16)
        "image_tokens": 576,  # 24 x 24 at 384 px [T], [N]
        "ids": {"<｜begin▁of▁sentence｜>": 100000, "<｜end▁of▁sentence｜>": 100001,  # [R] (BOS 100000 in the
                "<｜▁pad▁｜>": 100015, "<begin_of_image>": 100016,  # reference's encodings) [N]
                "<image_placeholder>": 100581,  # JanusConfig.image_token_id default [T]
                "<end_of_image>": 100593, "<|User|>": 100588, "<|Assistant|>": 100589},  # [D]
        "shard_gb": {"original": 10.0, "converted": 5.0},  # save_pretrained's default then (4.33) and now
    },
}


def janus_vocabulary(cfg: dict) -> dict[str, int]:
    ids = cfg["ids"]
    vocab = text_vocabulary(100000)  # DeepSeek-LLM's text ids 0..99999, then its added tokens [R]
    vocab.update(ids)
    return fill_ids(vocab, max(ids.values()) + 1, "<｜reserved▁{}｜>")


def write_janus_tokenizer(folder: pathlib.Path, cfg: dict, stats: Stats) -> dict[str, int]:
    """DeepSeek's tokenizer shape (``LlamaTokenizerFast`` over byte-level BPE, BOS added by the post-processor),
    the real vocabulary size of the tokenizer (100000 text ids + added tokens; the model's embedding has
    102400 rows)."""
    from transformers import PreTrainedTokenizerFast

    vocab = janus_vocabulary(cfg)
    names = list(cfg["ids"])
    tok = bpe_tokenizer(vocab, [n for n in vocab if vocab[n] >= 100000], bos=names[0])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=names[0], eos_token=names[1], pad_token=names[2],
                                   additional_special_tokens=["<|User|>", "<|Assistant|>", "<begin_of_image>",
                                                              "<end_of_image>", "<image_placeholder>"],
                                   model_max_length=16384)
    save_tokenizer(fast, folder, stats)
    return vocab


def janus_config(cfg: dict, scale: float, vocab: dict[str, int]):
    from transformers import JanusConfig

    text = scaled_text(cfg["text"], scale)
    v = dict(cfg["vision"])
    if scale != 1.0:
        heads = scaled(v["num_attention_heads"], scale)
        v.update(hidden_size=heads * (v["hidden_size"] // v["num_attention_heads"]), num_attention_heads=heads,
                 num_hidden_layers=scaled(v["num_hidden_layers"], scale))
    v.update(projection_dim=text["hidden_size"], num_image_tokens=cfg["image_tokens"])
    vq = dict(cfg["vq"])
    if scale != 1.0:
        vq.update(base_channels=scaled_channels(vq["base_channels"], scale),
                  latent_channels=scaled_channels(vq["latent_channels"], scale))
    vq.update(projection_dim=text["hidden_size"], image_token_embed_dim=text["hidden_size"])
    ids = cfg["ids"]
    text.update(model_type="llama", bos_token_id=ids["<｜begin▁of▁sentence｜>"],
                eos_token_id=ids["<｜end▁of▁sentence｜>"], pad_token_id=ids["<｜▁pad▁｜>"],
                tie_word_embeddings=False)
    config = JanusConfig(text_config=text, vision_config=v, vq_config=vq, image_token_id=ids["<image_placeholder>"],
                         tie_word_embeddings=False)
    config.architectures = ["JanusForConditionalGeneration"]
    return config


JANUS_TO_ORIGINAL = [  # transformers' names -> deepseek-ai's: the inverse of loaders/janus.py's _KEY_RULES
    (r"^model\.vision_model\.encoder\.layers\.(\d+)\.self_attn\.projection_layer",
     r"vision_model.vision_tower.blocks.\1.attn.proj"),
    (r"^model\.vision_model\.encoder\.layers\.(\d+)\.layer_norm(\d)", r"vision_model.vision_tower.blocks.\1.norm\2"),
    (r"^model\.vision_model\.encoder\.layers\.(\d+)\.", r"vision_model.vision_tower.blocks.\1."),
    (r"^model\.vision_model\.embeddings\.patch_embedding", "vision_model.vision_tower.patch_embed.proj"),
    (r"^model\.vision_model\.post_layernorm", "vision_model.vision_tower.norm"),
    (r"^model\.vqmodel\.decoder\.up\.(\d+)\.block", r"gen_vision_model.decoder.conv_blocks.\1.res"),
    (r"^model\.vqmodel\.encoder\.down\.(\d+)\.block", r"gen_vision_model.encoder.conv_blocks.\1.res"),
    (r"^model\.vqmodel\.decoder\.up", "gen_vision_model.decoder.conv_blocks"),
    (r"^model\.vqmodel\.encoder\.down", "gen_vision_model.encoder.conv_blocks"),
    (r"^model\.vqmodel\.(\w+)\.mid\.block_1", r"gen_vision_model.\1.mid.0"),
    (r"^model\.vqmodel\.(\w+)\.mid\.attn_1", r"gen_vision_model.\1.mid.1"),
    (r"^model\.vqmodel\.(\w+)\.mid\.block_2", r"gen_vision_model.\1.mid.2"),
    (r"^model\.vqmodel", "gen_vision_model"),
    (r"^model\.generation_aligner\.fc1", "gen_aligner.layers.0"),
    (r"^model\.generation_aligner\.hidden_layers\.0", "gen_aligner.layers.2"),
    (r"^model\.aligner\.fc1", "aligner.layers.0"),
    (r"^model\.aligner\.hidden_layers\.0", "aligner.layers.2"),
    (r"^model\.generation_head\.proj_out", "gen_head.output_mlp_projector"),
    (r"^model\.generation_head\.", "gen_head."),
    (r"^model\.generation_embeddings", "gen_embed"),
    (r"^model\.language_model\.", "language_model.model."),
    (r"^lm_head\.weight", "language_model.lm_head.weight"),
]


def janus_original_specs(converted: list[TensorSpec], vision_width: int) -> list[TensorSpec]:
    """deepseek-ai's tensors for transformers' ``converted`` ones, drawn from the same seeds: original names,
    the SigLIP q|k|v fused (``attn.qkv``), ``pos_embed`` with its batch axis, plus what the converter drops:
    the attention-pooling head (timm's ``AttentionPoolLatent``, ``global_pool="map"``) and the VQ's
    ``quantize.codebook_used`` usage buffer (65536 entries)."""
    out, fused = [], {}
    for s in converted:
        m = re.match(r"model\.vision_model\.encoder\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)", s.name)
        if m:
            fused.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = s
            if len(fused[(m.group(1), m.group(3))]) == 3:
                parts = fused[(m.group(1), m.group(3))]
                q = parts["q"]
                out.append(TensorSpec(f"vision_model.vision_tower.blocks.{m.group(1)}.attn.qkv.{m.group(3)}",
                                      (3 * q.shape[0], *q.shape[1:]), q.init, sources=tuple(parts[c].name
                                                                                           for c in "qkv")))
            continue
        if s.name == "model.vision_model.embeddings.position_embedding.weight":
            out.append(TensorSpec("vision_model.vision_tower.pos_embed", (1, *s.shape), s.init, sources=(s.name,)))
            continue
        name = s.name
        for pattern, repl in JANUS_TO_ORIGINAL:
            name = re.sub(pattern, repl, name)
        out.append(TensorSpec(name, s.shape, s.init, sources=(s.name,)))
    w = vision_width
    pool = "vision_model.vision_tower.attn_pool."
    for name, shape in ((pool + "latent", (1, 1, w)), (pool + "q.weight", (w, w)), (pool + "q.bias", (w,)),
                        (pool + "kv.weight", (2 * w, w)), (pool + "kv.bias", (2 * w,)), (pool + "proj.weight", (w, w)),
                        (pool + "proj.bias", (w,)), (pool + "norm.weight", (w,)), (pool + "norm.bias", (w,)),
                        (pool + "mlp.fc1.weight", (4 * w, w)), (pool + "mlp.fc1.bias", (4 * w,)),
                        (pool + "mlp.fc2.weight", (w, 4 * w)), (pool + "mlp.fc2.bias", (w,))):
        out.append(TensorSpec(name, shape, init_of(name, shape)))
    out.append(TensorSpec("gen_vision_model.quantize.codebook_used", (65536,), "zeros"))
    return out


def write_release(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log):
    from transformers import JanusForConditionalGeneration

    vocab = write_janus_tokenizer(out, cfg, stats)
    config = janus_config(cfg, scale, vocab)
    specs = specs_of(meta_state(JanusForConditionalGeneration, config))
    ids = cfg["ids"]
    text, vision = config.text_config, config.vision_config
    if layout == "converted":
        write_config(out, config, dtype, stats)
        write_json(out / "generation_config.json", {
            "bos_token_id": ids["<｜begin▁of▁sentence｜>"], "eos_token_id": ids["<｜end▁of▁sentence｜>"],
            "pad_token_id": ids["<｜▁pad▁｜>"], "boi_token_id": ids["<begin_of_image>"], "guidance_scale": 5,
            "temperature": 1, "generation_kwargs": {"boi_token_id": ids["<begin_of_image>"]}}, stats)
        write_json(out / "preprocessor_config.json", {
            "image_processor_type": "JanusImageProcessor", "processor_class": "JanusProcessor", "do_normalize": True,
            "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "min_size": 14, "rescale_factor": 1 / 255,
            "size": {"height": vision.image_size, "width": vision.image_size}, "do_resize": True,
            "do_rescale": True, "do_convert_rgb": True, "background_color": [127, 127, 127]}, stats)
        kind = "safetensors"
    else:
        specs = janus_original_specs(specs, vision.hidden_size)
        lang = {"hidden_size": text.hidden_size, "intermediate_size": text.intermediate_size,
                "max_position_embeddings": text.max_position_embeddings, "model_type": "llama",
                "num_attention_heads": text.num_attention_heads, "num_hidden_layers": text.num_hidden_layers,
                "num_key_value_heads": text.num_key_value_heads, "torch_dtype": "bfloat16",
                "vocab_size": text.vocab_size}
        hidden, book = text.hidden_size, config.vq_config.num_embeddings
        write_json(out / "config.json", {  # deepseek-ai's config.json: towers named, widths in the aligners and head
            "aligner_config": {"cls": "MlpProjector", "model_type": "aligner",
                               "params": {"depth": 2, "input_dim": vision.hidden_size, "n_embed": hidden,
                                          "projector_type": "mlp_gelu"}},
            "architectures": ["MultiModalityCausalLM"],
            "gen_aligner_config": {"cls": "MlpProjector", "model_type": "gen_aligner",
                                   "params": {"depth": 2, "input_dim": config.vq_config.embed_dim, "n_embed": hidden,
                                              "projector_type": "mlp_gelu"}},
            "gen_head_config": {"cls": "vision_head", "model_type": "gen_head",
                                "params": {"image_token_embed": hidden, "image_token_size": book, "n_embed": hidden}},
            "gen_vision_config": {"cls": "VQ-16", "model_type": "gen_vision",
                                  "params": {"image_token_size": book, "n_embed": config.vq_config.embed_dim}},
            "language_config": lang, "model_type": "multi_modality", "torch_dtype": "bfloat16",
            "transformers_version": "4.33.1",
            "vision_config": {"cls": "CLIPVisionTower", "model_type": "vision",
                              "params": {"image_size": vision.image_size, "model_name": "siglip_large_patch16_384",
                                         "select_feature": "same", "select_layer": -1}}}, stats)
        write_json(out / "preprocessor_config.json", {
            "background_color": [127, 127, 127], "do_normalize": True, "image_mean": [0.5] * 3,
            "image_processor_type": "VLMImageProcessor", "image_size": vision.image_size, "image_std": [0.5] * 3,
            "min_size": 14, "processor_class": "VLChatProcessor", "rescale_factor": 1 / 255}, stats)
        write_json(out / "processor_config.json", {
            "add_special_token": False, "ignore_id": -100, "image_tag": "<image_placeholder>", "mask_prompt": True,
            "num_image_tokens": vision.num_image_tokens, "processor_class": "VLChatProcessor",
            "sft_format": "deepseek"}, stats)
        kind = "bin"
    record_shards(result, out, specs, dtype, max_bytes, kind)
    write_weights(result, stats, specs, dtype, log,
                  lambda: write_sharded(out, specs, dtype, seed, max_bytes, kind, stats, log))
