"""Emu3.5-Image (``emu35-image``): ``original`` (BAAI/Emu3.5-Image, 34B: the authors' ``Emu3ForCausalLM``,
``model_type "Emu3"`` with per-head ``q_norm`` / ``k_norm`` and a ``head_dim`` field, Qwen3-32B's shape, an untied
head; safetensors shards + index), with BAAI's text tokenizer files ``emu3.tiktoken`` (151,643 BPE ranks) and
``emu3_vision_tokens.txt`` (the 3 image specials and 131,072 visual tokens) and the IBQ vision tokenizer
``Emu3.5-VisionTokenizer/`` (``config.yaml`` + ``model.ckpt``) in the folder, where ``spec-ar download`` puts
them.  ``--scale`` keeps the head size (128) and the width per head (80: ``heads x head_dim != hidden_size``, as in
the release)."""
from __future__ import annotations

import base64
import pathlib

import torch

from .bpe import MERGES, byte_symbols
from .json_files import write_json
from .scaling import scaled_channels, scaled_text
from .stats import Stats, write_weights
from .tensors import meta_state, specs_of
from .weight_files import record_shards, write_sharded, write_torch

# Sources (what each mark means: __init__.py):
#  [R]  BAAI/Emu3.5-Image's config.json as published (recalled, not re-read offline): Qwen3-32B's shape (64 layers,
#       width 5120, FFN 25600, 64 query heads of 128, 8 kv heads), vocab 282926, rms_norm_eps 1e-6, bfloat16,
#       untied head, 15 shards (34.1B parameters, 68 GB).
#  [E]  the authors' code (baaivision/Emu3.5 @8fcf1da): configuration_emu3.py's Emu3Config defaults (rope_theta,
#       attention_dropout, the special ids, which the tokenizer files' order gives), src/tokenizer_emu3_ibq/ (the
#       files' formats; the vision tokens file is the real one byte for byte: its 131,075 lines in order),
#       configs/example_config_t2i.py (image_area 1048576, the default 55*73 grid), src/vision_tokenizer/ibq.py
#       (IBQ(**config.yaml): ddconfig, n_embed, embed_dim and the training settings), and generation_utils.py's
#       decode_image (code vectors reshaped to 256 values: embed_dim 256).
#  [N]  the IBQ tokenizer's 131,072 codes and 16x downsampling (five levels), decoders/ibq.py and the loader's
#       docstrings.
#  [A]  assumed, not published anywhere read here: max_position_embeddings (the interleaved configs generate up to
#       32768 new tokens, configs/config.py, so the release's limit is past that; only a limit for the loader's size
#       check, nothing is allocated by it); the IBQ's widths (ch 256, z_channels 256, 4 blocks per level, attention
#       at 16: decoders/ibq.IBQSpec's defaults, 455M parameters, 271M on the decoding side) and its training
#       settings; model.ckpt as a Lightning checkpoint in float32.
#  [D]  the BPE ranks: GPT-2's 256 bytes first (as the real file), a few merges, then fillers no text holds.
CONFIGS = {
    "emu35-image": {
        "release": "BAAI/Emu3.5-Image (34B, Qwen3-32B-shaped) + BAAI/Emu3.5-VisionTokenizer (IBQ, 131072 codes)",
        "layouts": ("original",),
        "text": dict(vocab_size=282926, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,  # [R]
                     num_attention_heads=64, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,  # [R]
                     rope_theta=1000000.0,  # [E] (the class default; Qwen3-32B's too)
                     max_position_embeddings=65536),  # [A]
        "vq": dict(n_embed=131072, embed_dim=256,  # [N], [E]
                   ddconfig=dict(double_z=False, z_channels=256, resolution=256, in_channels=3, out_ch=3,  # [A]
                                 ch=256, ch_mult=[1, 1, 2, 2, 4], num_res_blocks=4, attn_resolutions=[16],  # [N], [A]
                                 dropout=0.0),
                   training=dict(beta=0.25, use_entropy_loss=True, cosine_similarity=False,  # [A]
                                 entropy_temperature=0.01, sample_minimization_weight=1.0,
                                 batch_maximization_weight=1.0)),
        "image_tokens": 55 * 74,  # the default 55*73 codes, a row end after each row but the last, then the end [E]
        "text_ranks": 151643,  # BPE ranks 0..151642; specials from 151643 on [E]
        "ids": {"<|endoftext|>": 151643, "<|extra_200|>": 151846, "<|extra_201|>": 151847,  # [E]
                "<|extra_203|>": 151849, "<|extra_204|>": 151850, "<|image token|>": 151851,  # BOS, EOS [E]
                "<|image start|>": 151852, "<|image end|>": 151853, "<|visual token 000000|>": 151854},  # [E]
        "image_area": 1048576,  # [E]
        # the release's 15 shards [R] (save_pretrained's 5 GB would make 14 of these tensors in this order)
        "shard_gb": {"original": 4.8},
    },
}
IMAGE_SPECIALS = ("<|image token|>", "<|image start|>", "<|image end|>")  # emu3_vision_tokens.txt's first lines [E]
TRANSFORMERS_VERSION = "4.48.2"  # the authors' pin, which their config.json and generation_config.json record [E]


def vision_lines(codes: int) -> list[str]:
    """``emu3_vision_tokens.txt``'s lines: the image specials, then the visual tokens in code order."""
    return [*IMAGE_SPECIALS, *(f"<|visual token {c:06d}|>" for c in range(codes))]


def special_names(codes: int) -> list[str]:
    """The special tokens in id order from 151643: the authors' text specials, then the vision tokens file."""
    from ...loaders.emu35 import TEXT_SPECIALS

    return [*TEXT_SPECIALS, *vision_lines(codes)]


def special_ids(cfg: dict) -> dict[str, int]:
    """Each special token's id (as the authors' tokenizer numbers them), checked against :data:`CONFIGS`' ids and
    the vocabulary size."""
    names = special_names(cfg["vq"]["n_embed"])
    ids = {name: cfg["text_ranks"] + i for i, name in enumerate(names)}
    wrong = {k: v for k, v in cfg["ids"].items() if ids.get(k) != v}
    if wrong or cfg["text_ranks"] + len(names) != cfg["text"]["vocab_size"]:
        raise ValueError(f"Emu3.5 vocabulary: {cfg['text_ranks'] + len(names)} ids for vocab_size "
                         f"{cfg['text']['vocab_size']}, ids {wrong} not where the tokenizer files put them")
    return ids


def bpe_ranks(size: int) -> dict[bytes, int]:
    """``emu3.tiktoken``'s token -> rank, ranks 0..size-1: the 256 bytes in GPT-2's order (the real file's first
    ranks), the small byte-level BPE's merges (so prompts merge somewhat), then 4-byte fillers starting with
    ``0xff`` (never in UTF-8: no text holds them)."""
    symbols = byte_symbols()
    to_byte = {s: b for b, s in enumerate(symbols)}
    order = sorted(range(256), key=lambda b: symbols[b] != chr(b))  # printable first, as GPT-2 ranks them
    ranks = {bytes([b]): i for i, b in enumerate(order)}
    for a, b in MERGES:
        ranks.setdefault(bytes(to_byte[c] for c in a + b), len(ranks))
    filler = 0
    while len(ranks) < size:
        ranks.setdefault(b"\xff" + filler.to_bytes(3, "big"), len(ranks))
        filler += 1
    return ranks


def write_tokenizer(folder: pathlib.Path, cfg: dict, stats: Stats) -> None:
    """BAAI's two files (the format of ``src/tokenizer_emu3_ibq/``): a base64 token and its rank per line, and one
    special token per line."""
    from ...loaders.emu35 import TIKTOKEN_FILE, VISION_TOKENS_FILE

    ranks = bpe_ranks(cfg["text_ranks"])
    (folder / TIKTOKEN_FILE).write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    lines = vision_lines(cfg["vq"]["n_embed"])
    (folder / VISION_TOKENS_FILE).write_text("".join(n + "\n" for n in lines), encoding="utf-8")
    stats.add(folder / TIKTOKEN_FILE)
    stats.add(folder / VISION_TOKENS_FILE)


def emu35_settings(cfg: dict, scale: float, dtype: torch.dtype) -> dict:
    """config.json as the authors' ``Emu3Config.save_pretrained`` writes it (their fields and special ids).  At
    ``scale`` < 1: whole kv groups of 128-wide heads, the width 80 per query head (5120 / 64) and the FFN in
    proportion, depth scaled (:func:`.scaling.scaled_text`, whose head size is width / heads, then the real
    ``head_dim`` put back)."""
    text = scaled_text(cfg["text"], scale)
    text["head_dim"] = cfg["text"]["head_dim"]
    ids = special_ids(cfg)
    return {"architectures": ["Emu3ForCausalLM"], "model_type": "Emu3", "attention_dropout": 0.1,  # [E]
            "bos_token_id": ids["<|extra_203|>"], "eos_token_id": ids["<|extra_204|>"],
            "pad_token_id": ids["<|endoftext|>"], "img_token_id": ids["<|image token|>"],
            "boi_token_id": ids["<|image start|>"], "eoi_token_id": ids["<|image end|>"],
            "eol_token_id": ids["<|extra_200|>"], "eof_token_id": ids["<|extra_201|>"], "hidden_act": "silu",
            **text, "image_area": cfg["image_area"], "initializer_range": 0.02, "pretraining_tp": 1,
            "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": str(dtype).replace("torch.", ""),
            "transformers_version": TRANSFORMERS_VERSION, "use_cache": True}


def emu35_model_config(settings: dict):
    """The ``Qwen3Config`` the pack's loader builds from config.json: its tensors are the release's."""
    from ...loaders.emu35 import qwen3_config

    return qwen3_config(settings, "config.json")


def ibq_config(cfg: dict, scale: float) -> dict:
    """config.yaml: ``IBQ(**cfg)``'s arguments; at ``scale`` < 1 narrower channels (codes, code size and
    downsampling kept)."""
    vq = cfg["vq"]
    dd = dict(vq["ddconfig"])
    if scale != 1:
        dd["ch"], dd["z_channels"] = scaled_channels(dd["ch"], scale), scaled_channels(dd["z_channels"], scale)
    return {"ddconfig": dd, "n_embed": vq["n_embed"], "embed_dim": vq["embed_dim"], **vq["training"]}


def ibq_specs(config: dict):
    """Every tensor of the authors' IBQ module (encoder, ``quant_conv``, ``quantize.embedding``,
    ``post_quant_conv``, decoder: taming's layout, as decoders/vqgan.py builds it), float32."""
    from ...decoders.vqgan import VQGANModel, VQGANSpec

    dd = config["ddconfig"]
    spec = VQGANSpec(embed_dim=config["embed_dim"], n_embed=config["n_embed"], z_channels=dd["z_channels"],
                     ch=dd["ch"], ch_mult=tuple(dd["ch_mult"]), num_res_blocks=dd["num_res_blocks"],
                     attn_resolutions=tuple(dd["attn_resolutions"]), resolution=dd["resolution"],
                     in_channels=dd["in_channels"], out_ch=dd["out_ch"], dropout=dd["dropout"])
    with torch.device("meta"):
        model = VQGANModel(spec, with_encoder=True)
    out = specs_of(model.state_dict())
    for s in out:
        s.dtype = torch.float32  # a training checkpoint [A]
        s.sources = ("ibq." + s.name,)
    return out


def write_ibq(folder: pathlib.Path, config: dict, seed: int, stats: Stats) -> None:
    """``Emu3.5-VisionTokenizer/``: config.yaml and model.ckpt (``{"state_dict": ...}``, which the authors' loader
    unwraps [A])."""
    import yaml

    from ...decoders.ibq import CKPT_NAME, CONFIG_NAME

    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_NAME).write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    stats.add(folder / CONFIG_NAME)
    write_torch(folder / CKPT_NAME, {"state_dict": {s.name: s for s in ibq_specs(config)}}, torch.float32, seed)
    stats.add(folder / CKPT_NAME)


def write_release(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log):
    from transformers import Qwen3ForCausalLM

    from ...decoders.ibq import FOLDER_NAMES

    settings = emu35_settings(cfg, scale, dtype)
    specs = specs_of(meta_state(Qwen3ForCausalLM, emu35_model_config(settings)))
    write_json(out / "config.json", dict(sorted(settings.items())), stats)  # save_pretrained sorts the keys
    write_json(out / "generation_config.json", {k: settings[k] for k in ("bos_token_id", "eos_token_id",
                                                                          "pad_token_id", "transformers_version")},
               stats)
    write_tokenizer(out, cfg, stats)
    write_ibq(out / FOLDER_NAMES[0], ibq_config(cfg, scale), seed, stats)  # where `spec-ar download` puts it
    record_shards(result, out, specs, dtype, max_bytes, "safetensors")
    write_weights(result, stats, specs, dtype, log,
                  lambda: write_sharded(out, specs, dtype, seed, max_bytes, "safetensors", stats, log))
