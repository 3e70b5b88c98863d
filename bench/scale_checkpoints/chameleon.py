"""The Chameleon family: Lumina-mGPT-7B-768 and Anole-7b.

* ``lumina-mgpt-7b-768``: ``original`` (Alpha-VLLM/Lumina-mGPT-7B-768 as Lumina saves it: ``ChameleonXLLMX``
  config, q/k norms ``[model_parallel_size, head_dim]`` (:func:`...loaders.chameleon.norm_repeats`), no
  ``model.vqmodel.*``) or ``converted`` (transformers' Chameleon save, q/k norms per head);
  both with Meta's VQGAN in ``tokenizer/vqgan.yaml`` + ``vqgan.ckpt``;
* ``anole-7b``: ``original`` (GAIR/Anole-7b-v0.1 in Meta's layout: ``models/7b/params.json`` +
  ``consolidated.pth``, ``tokenizer/text_tokenizer.json``, ``tokenizer/vqgan.*``) or ``converted``
  (transformers' Chameleon save).
"""
from __future__ import annotations

import pathlib
import re
import time

import torch

from .bpe import bpe_tokenizer, save_tokenizer, text_vocabulary
from .json_files import write_config, write_json
from .scaling import meta_ffn, scaled_text
from .stats import Stats, peak_rss, write_weights
from .tensors import TensorSpec, meta_state, specs_of
from .vqgan import vqgan_spec, write_vqgan
from .weight_files import record_shards, write_sharded, write_torch

# Sources (what each mark means: __init__.py):
#  [T]  ChameleonConfig / ChameleonVQVAEConfig: Chameleon-7B's.
#  [C]  convert_chameleon_weights_to_hf.py: VOCAB_SIZE 65536, FFN width
#       multiple_of * ceil(int(multiplier * int(8 * dim / 3)) / multiple_of), max_position_embeddings 4096 for
#       rope_theta 10000, tokenizer pad id 1, <reserved08707> -> <image>.
#  [N]  image ids 4..8195, <eoss> 8196, <racm3:break> 8197, <reserved08706> 8710, <reserved08799> 8803; image grids.
#  [D]  <s>/</s>/<unk> and the IMGIMG code order.
CONFIGS = {
    "lumina-mgpt-7b-768": {
        "release": "Alpha-VLLM/Lumina-mGPT-7B-768 (original); transformers' Chameleon save (converted)",
        "layouts": ("original", "converted"),
        "text": dict(vocab_size=65536, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,  # [T], [C]
                     num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5,  # [T], [C]
                     rope_theta=10000.0, multiple_of=256, ffn_dim_multiplier=1.0),  # -> FFN 11008 [C]
        "vq": dict(embed_dim=256, n_embed=8192, z_channels=256, ch=128, ch_mult=[1, 1, 2, 2, 4],  # [T], [N]
                   num_res_blocks=2, attn_resolutions=[], resolution=512),  # [T] (no attention [N])
        "image_tokens": 2352,  # 768 px: 48 rows of 48 + end-of-line (+ 2 size tokens, end) [N]
        "shard_gb": {"original": 5.0, "converted": 5.0},
    },
    "anole-7b": {
        "release": "GAIR/Anole-7b-v0.1 (original: Meta's layout); transformers' Chameleon save (converted)",
        "layouts": ("original", "converted"),
        "text": dict(vocab_size=65536, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,  # [T], [C]
                     num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5,  # [T], [C]
                     rope_theta=10000.0, multiple_of=256, ffn_dim_multiplier=1.0),  # -> FFN 11008 [C]
        "vq": dict(embed_dim=256, n_embed=8192, z_channels=256, ch=128, ch_mult=[1, 1, 2, 2, 4],  # [T], [N]
                   num_res_blocks=2, attn_resolutions=[], resolution=512),
        "image_tokens": 1024,  # 32 x 32 at 512 px [N]
        "shard_gb": {"original": None, "converted": 5.0},  # Meta's 7B: one consolidated.pth
    },
}


def image_token_name(code: int) -> str:
    """Chameleon's image token for VQ code ``code``: IMGIMG, the code's digits as letters A-J, Z."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


RESERVED = range(8194, 8194 + 1024)  # <reserved08194> (id 8198) ... ; id = n + 4 [N] (8706 -> 8710, 8799 -> 8803)


def chameleon_vocabulary(size: int, codes: int, meta: bool) -> dict[str, int]:
    """Chameleon's 65536 ids: <s> <pad> </s> <unk> (0-3; pad 1 [C]), IMGIMG...Z at 4..8195, <eoss> 8196,
    <racm3:break> 8197, <reserved{n}> at n + 4, then text.  ``meta``: Meta's names (``<reserved08707>``);
    else transformers' (``<image>`` for it)."""
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({image_token_name(c): 4 + c for c in range(codes)})
    vocab.update({"<eoss>": 4 + codes, "<racm3:break>": 5 + codes})
    for n in RESERVED:
        vocab[f"<reserved{n:05d}>"] = n + 4
    if not meta:
        vocab["<image>"] = vocab.pop("<reserved08707>")
    start = max(vocab.values()) + 1
    vocab.update(text_vocabulary(size - start, start, vocab))
    return dict(sorted(vocab.items(), key=lambda kv: kv[1]))


def chameleon_tokenizer(vocab: dict[str, int]):
    return bpe_tokenizer(vocab, [n for n in vocab if n.startswith("<") and n.endswith(">")])


def write_chameleon_tokenizer(folder: pathlib.Path, vocab: dict[str, int], stats: Stats) -> None:
    """As transformers' converter saves it (``LlamaTokenizerFast`` from text_tokenizer.json: sep
    <reserved08706>, pad <pad>)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=chameleon_tokenizer(vocab), bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>", sep_token="<reserved08706>")
    save_tokenizer(fast, folder, stats)


def chameleon_config(cfg: dict, scale: float, vocab: dict[str, int], vq_spec, lumina: bool):
    from transformers import ChameleonConfig

    from ...loaders.chameleon_meta import vq_config_of

    text = scaled_text(cfg["text"], scale)
    inter = meta_ffn(text["hidden_size"], text.pop("ffn_dim_multiplier"), text.pop("multiple_of"))
    config = ChameleonConfig(**text, intermediate_size=inter, vocabulary_map=vocab, vq_config=vq_config_of(vq_spec),
                             model_parallel_size=1, swin_norm=False, tie_word_embeddings=False)
    config.architectures = ["ChameleonXLLMXForConditionalGeneration" if lumina else "ChameleonForConditionalGeneration"]
    return config


def _interleave_rows(heads: int):
    """transformers' half-split rotary rows per head -> Meta's interleaved ones (row h*hd + 2p + c holds
    transformers' row h*hd + c*hd/2 + p): the inverse of chameleon_meta.remap_meta_keys' ``half_split``.
    Returns a view (no copy) whose row-major order is Meta's tensor."""
    def rearrange(w: torch.Tensor) -> torch.Tensor:
        hd = w.shape[0] // heads
        return w.view(heads, 2, hd // 2, -1).transpose(1, 2)
    return rearrange


def meta_chameleon_specs(converted: list[TensorSpec], config) -> list[TensorSpec]:
    """Meta's consolidated tensors (one model-parallel shard) for transformers' ``converted`` ones, drawn from
    the same seeds (``wq`` / ``wk`` rows interleaved per head, q/k norms one ``[head_dim]`` vector each)."""
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    names = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"self_attn.q_proj.weight": "attention.wq.weight", "self_attn.k_proj.weight": "attention.wk.weight",
             "self_attn.v_proj.weight": "attention.wv.weight", "self_attn.o_proj.weight": "attention.wo.weight",
             "mlp.gate_proj.weight": "feed_forward.w1.weight", "mlp.down_proj.weight": "feed_forward.w2.weight",
             "mlp.up_proj.weight": "feed_forward.w3.weight", "input_layernorm.weight": "attention_norm.weight",
             "post_attention_layernorm.weight": "ffn_norm.weight",
             "self_attn.q_norm.weight": "attention.q_normalization.weight",
             "self_attn.q_norm.bias": "attention.q_normalization.bias",
             "self_attn.k_norm.weight": "attention.k_normalization.weight",
             "self_attn.k_norm.bias": "attention.k_normalization.bias"}
    out = []
    for s in converted:
        if s.name.startswith("model.vqmodel."):
            continue  # Meta keeps the VQ in tokenizer/vqgan.ckpt
        m = re.match(r"model\.layers\.(\d+)\.(.+)", s.name)
        if m is None:
            out.append(TensorSpec(names[s.name], s.shape, s.init, sources=(s.name,)))
            continue
        new = f"layers.{m.group(1)}.{layer[m.group(2)]}"
        if "_norm." in m.group(2) and "self_attn" in m.group(2):  # [heads, hd] (all rows alike) -> [hd]
            out.append(TensorSpec(new, s.shape[1:], s.init, sources=(s.name,)))
        elif m.group(2) in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
            n = heads if m.group(2).startswith("self_attn.q") else kv
            out.append(TensorSpec(new, s.shape, s.init, sources=(s.name,), rearrange=_interleave_rows(n)))
        else:
            out.append(TensorSpec(new, s.shape, s.init, sources=(s.name,)))
    return out


def lumina_original_specs(converted: list[TensorSpec], model_parallel_size: int = 1) -> list[TensorSpec]:
    """Lumina-mGPT's save of the same model: no ``model.vqmodel.*`` (its training deletes the VQ encoder), q/k
    norms ``[model_parallel_size, head_dim]``."""
    out = []
    for s in converted:
        if s.name.startswith("model.vqmodel."):
            continue
        if re.fullmatch(r"model\.layers\.\d+\.self_attn\.[qk]_norm\.(weight|bias)", s.name):
            out.append(TensorSpec(s.name, (model_parallel_size, s.shape[1]), s.init, sources=(s.name,)))
        else:
            out.append(TensorSpec(s.name, s.shape, s.init, sources=(s.name,)))
    return out


def _vq_seed(specs: list[TensorSpec]) -> None:
    """transformers' ``model.vqmodel.*`` drawn as vqgan.ckpt's tensors of the same name (the converter copies them)."""
    for s in specs:
        if s.name.startswith("model.vqmodel."):
            s.sources = ("vqgan." + s.name[len("model.vqmodel."):],)


def write_release(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log):
    from transformers import ChameleonForConditionalGeneration

    lumina = family.startswith("lumina")
    meta = family == "anole-7b" and layout == "original"
    spec = vqgan_spec(cfg, scale)
    vocab = chameleon_vocabulary(cfg["text"]["vocab_size"], spec.n_embed, meta=False)
    config = chameleon_config(cfg, scale, vocab, spec, lumina)
    specs = specs_of(meta_state(ChameleonForConditionalGeneration, config))
    _vq_seed(specs)
    tok_dir = out / "tokenizer"
    write_vqgan(tok_dir, spec, seed, stats)
    if meta:  # Meta's layout: models/7b/{params.json, consolidated.pth}, tokenizer/text_tokenizer.json
        meta_vocab = chameleon_vocabulary(cfg["text"]["vocab_size"], spec.n_embed, meta=True)
        chameleon_tokenizer(meta_vocab).save(str(tok_dir / "text_tokenizer.json"))
        stats.add(tok_dir / "text_tokenizer.json")
        t = cfg["text"]
        model_dir = out / "models" / "7b"
        write_json(model_dir / "params.json", {"model_parallel_size": 1, "model": {
            "dim": config.hidden_size, "n_layers": config.num_hidden_layers, "n_heads": config.num_attention_heads,
            "n_kv_heads": config.num_key_value_heads, "vocab_size": config.vocab_size, "multiple_of": t["multiple_of"],
            "ffn_dim_multiplier": t["ffn_dim_multiplier"], "norm_eps": t["rms_norm_eps"], "rope_theta": t["rope_theta"],
            "qk_normalization": True, "swin_norm": False}}, stats)
        specs = meta_chameleon_specs(specs, config)
        path = model_dir / "consolidated.pth"
        result.expected[str(path)] = {s.name: list(s.shape) for s in specs}

        def write_meta():
            t0 = time.perf_counter()
            write_torch(path, {s.name: s for s in specs}, dtype, seed)
            stats.add(path)
            log(f"  consolidated.pth: {len(specs)} tensors, {path.stat().st_size / 1e9:.2f} GB in "
                f"{time.perf_counter() - t0:.1f} s, peak RSS so far {peak_rss() / 2**30:.2f} GiB")

        write_weights(result, stats, specs, dtype, log, write_meta)
        return
    write_chameleon_tokenizer(out, vocab, stats)
    if lumina and layout == "original":
        specs = lumina_original_specs(specs)
        write_json(out / "config.json", lumina_config(config, spec, dtype), stats)
        write_json(out / "generation_config.json", {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": 2,
                                                    "transformers_version": "4.43.3"}, stats)
    else:
        write_config(out, config, dtype, stats)
        write_json(out / "generation_config.json", {"bos_token_id": config.bos_token_id,
                                                    "eos_token_id": config.eos_token_id}, stats)
    record_shards(result, out, specs, dtype, max_bytes, "safetensors")
    write_weights(result, stats, specs, dtype, log,
                  lambda: write_sharded(out, specs, dtype, seed, max_bytes, "safetensors", stats, log))


def lumina_config(config, spec, dtype) -> dict:
    """config.json as Lumina-mGPT's training code saves its releases (Alpha-VLLM/Lumina-mGPT @104abe45,
    ``ChameleonXLLMXConfig``: its ``ChameleonConfig`` plus ``z_loss_weight``; bos / eos the class defaults;
    ``vq_config`` as its converter writes it from vqgan.yaml, yaml keys beside their renamed copies), as
    tests/chameleon_files.py's ``lumina_config`` describes it."""
    return {
        "architectures": ["ChameleonXLLMXForConditionalGeneration"], "model_type": "chameleon",
        "z_loss_weight": 1e-05, "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
        "eos_token_id": 2, "pad_token_id": None, "dropout": 0.05, "hidden_act": "silu",
        "hidden_size": config.hidden_size, "initializer_range": 0.02, "intermediate_size": config.intermediate_size,
        "mask_image_logits": False, "max_position_embeddings": config.max_position_embeddings, "mlp_bias": False,
        "model_parallel_size": 1, "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers, "num_key_value_heads": config.num_key_value_heads,
        "rms_norm_eps": config.rms_norm_eps, "rope_scaling": None, "rope_theta": 10000.0, "swin_norm": False,
        "tie_word_embeddings": False, "torch_dtype": str(dtype).replace("torch.", ""),
        "transformers_version": "4.43.3", "use_cache": True, "vocab_size": config.vocab_size,
        "vocabulary_map": config.vocabulary_map,
        "vq_config": {"embed_dim": spec.embed_dim, "n_embed": spec.n_embed, "num_embeddings": spec.n_embed,
                      "double_z": False, "double_latent": False, "z_channels": spec.z_channels,
                      "latent_channels": spec.z_channels, "resolution": spec.resolution, "in_channels": 3,
                      "out_ch": 3, "out_channels": 3, "ch": spec.ch, "base_channels": spec.ch,
                      "ch_mult": list(spec.ch_mult), "channel_multiplier": list(spec.ch_mult),
                      "num_res_blocks": spec.num_res_blocks, "attn_resolutions": list(spec.attn_resolutions),
                      "dropout": 0.0},
    }
