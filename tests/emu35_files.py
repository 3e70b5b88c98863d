"""Tiny random Emu3.5 folders in the release layout (BAAI/Emu3.5-Image, BAAI/Emu3.5), with BAAI's tokenizer files.

What the release holds, scaled down: ``config.json`` as the authors' ``Emu3Config`` saves it (``model_type
"Emu3"``, ``architectures ["Emu3ForCausalLM"]``, ``head_dim`` a field of its own, their special ids, ``rope_theta``,
``rms_norm_eps``, ``attention_dropout`` 0.1 as their default: dropout that evaluation never runs), bfloat16
safetensors shards with their index (the release has 15; here 2), ``generation_config.json``.  Tensor names are the
authors' ``Emu3ForCausalLM``'s: ``model.embed_tokens``, ``model.layers.N.self_attn.{q,k,v,o}_proj`` (no biases),
``self_attn.{q,k}_norm`` (per head: ``[head_dim]``), ``mlp.{gate,up,down}_proj``, ``input_layernorm``,
``post_attention_layernorm``, ``model.norm``, an untied ``lm_head``.  Here 4 query heads of width 16 on a hidden
size of 32 (``heads * head_dim != hidden_size``, as in the 34B's 64 x 128 on 5120), 2 key/value heads.

The tokenizer files are BAAI's format (``src/tokenizer_emu3_ibq/`` of baaivision/Emu3.5, which the release does
not carry): ``emu3.tiktoken``, a base64 token and its rank per line, and ``emu3_vision_tokens.txt``, one special
token per line.  The authors' tokenizer puts its specials from id 151643 on and asserts that the ranks are
0..151642, so the tiny file has all 151,643: the 256 bytes at the ranks the real file gives them (GPT-2's byte
order: ``!`` is 0, the digits 15..24, ``*`` 9, the space 220), the words of the prompts below built up letter by
letter (so pieces merge pair by pair, and words the list lacks merge part way), a few tokens reachable only
whole, then filler tokens that no text can hold (a ``0xff`` byte: never in UTF-8).  The vision tokens file names
the image tokens (``<|image token|>``, ``<|image start|>``, ``<|image end|>``) and the ``CODES`` visual tokens in a
shuffled order, so a loader that assumes ``id = 151854 + code`` fails.  The vocabulary is then the real one's
layout: 151,854 + ``CODES`` ids, the grammar's ids at the real ids (``<|extra_203|>`` 151849, ``<|image start|>``
151852, ``<|image end|>`` 151853, ``<|image token|>`` 151851, ``<|extra_200|>`` 151846), which the authors'
logits processor hard-codes.

Weights are drawn from one seeded generator in name order (not from an initialisation that may change between
releases), so the reference outputs recorded from them (``emu35_reference.py``) stay valid.
"""
from __future__ import annotations

import base64
import json
import pathlib

import torch

SPECIAL_START = 151643
TEXT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(205)]
IMAGE_SPECIALS = ["<|image token|>", "<|image start|>", "<|image end|>"]
CODES = 64  # visual tokens of the tiny tokenizer (the release: 131072)
WORDS = ("You are a helpful assistant for t2i task USER ASSISTANT red fox in the snow blue sky cat on mat "
         "lighthouse at dawn , . : ! ?").split()
WHOLE = [b"zzq", b" zzq"]  # tokens no pair of smaller tokens builds: matched only as a whole piece
SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16}
TOKENIZER_FOLDER = "tokenizer_emu3_ibq"  # the authors' folder name, beside the model
VISION_FOLDER = "Emu3.5-VisionTokenizer"


def byte_order() -> list[int]:
    """The bytes in GPT-2's order (tiktoken's first 256 ranks): printable ones first, then the rest."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    return keep + [b for b in range(256) if b not in keep]


def bpe_ranks() -> dict[bytes, int]:
    """The tiny ``emu3.tiktoken``: token -> rank, ranks 0..151642."""
    ranks = {bytes([b]): i for i, b in enumerate(byte_order())}

    def add(token: bytes):
        ranks.setdefault(token, len(ranks))

    for word in WORDS:
        for spaced in (word.encode(), b" " + word.encode()):
            for n in range(2, len(spaced) + 1):  # built up from the left: each pair merge has a lower rank
                add(spaced[:n])
    for token in WHOLE:
        add(token)
    filler = 0
    while len(ranks) < SPECIAL_START:
        add(b"\xff" + filler.to_bytes(3, "big"))
        filler += 1
    return ranks


def vision_tokens(codes: int = CODES, seed: int = 0) -> list[str]:
    order = torch.randperm(codes, generator=torch.Generator().manual_seed(seed + 7)).tolist()
    return IMAGE_SPECIALS + [f"<|visual token {c:06d}|>" for c in order]


def write_tokenizer(folder: pathlib.Path, codes: int = CODES, seed: int = 0) -> int:
    """``emu3.tiktoken`` and ``emu3_vision_tokens.txt`` in ``folder``; returns the number of ids."""
    folder.mkdir(parents=True, exist_ok=True)
    ranks = bpe_ranks()
    (folder / "emu3.tiktoken").write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    names = vision_tokens(codes, seed)
    (folder / "emu3_vision_tokens.txt").write_text("".join(n + "\n" for n in names), encoding="utf-8")
    return SPECIAL_START + len(TEXT_SPECIALS) + len(names)


def special_id(name: str) -> int:
    return SPECIAL_START + (TEXT_SPECIALS + IMAGE_SPECIALS).index(name)


def config(codes: int = CODES, **fields) -> dict:
    """config.json as the authors' ``Emu3Config.save_pretrained`` writes it (their fields and special ids);
    ``fields`` replace some (sizes, ``rope_scaling`` ...)."""
    return {**base_config(codes), **fields}


def base_config(codes: int) -> dict:
    return {"architectures": ["Emu3ForCausalLM"], "model_type": "Emu3", "attention_dropout": 0.1,
            "bos_token_id": special_id("<|extra_203|>"), "eos_token_id": special_id("<|extra_204|>"),
            "pad_token_id": special_id("<|endoftext|>"), "img_token_id": special_id("<|image token|>"),
            "boi_token_id": special_id("<|image start|>"), "eoi_token_id": special_id("<|image end|>"),
            "eol_token_id": special_id("<|extra_200|>"), "eof_token_id": special_id("<|extra_201|>"),
            "hidden_act": "silu", **SIZES, "image_area": 1048576, "initializer_range": 0.02,
            "max_position_embeddings": 2048, "pretraining_tp": 1, "rms_norm_eps": 1e-6, "rope_scaling": None,
            "rope_theta": 5000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "transformers_version": "4.48.2", "use_cache": True,
            "vocab_size": SPECIAL_START + len(TEXT_SPECIALS) + len(IMAGE_SPECIALS) + codes}


def random_weights(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """The authors' tensors drawn in name order from one generator, in bfloat16; the q/k norms far from 1, so a
    model that skipped them would compute something else."""
    h, f, heads, kv, hd = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                            "num_key_value_heads", "head_dim"))
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], h), "model.norm.weight": (h,),
              "lm_head.weight": (cfg["vocab_size"], h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.k_proj.weight": (kv * hd, h),
                       p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.o_proj.weight": (h, heads * hd),
                       p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                       p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                       p + "mlp.down_proj.weight": (h, f)})
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(shapes):
        if "_norm." in name:  # q_norm, k_norm
            value = 1 + 0.5 * torch.randn(shapes[name], generator=g)
        elif name.endswith("norm.weight"):
            value = 1 + 0.1 * torch.randn(shapes[name], generator=g)
        elif "embed" in name or "lm_head" in name:  # spread the logits so greedy picks vary and are clear-cut
            value = 1.0 * torch.randn(shapes[name], generator=g)
        else:
            value = 0.3 * torch.randn(shapes[name], generator=g)
        out[name] = value.to(torch.bfloat16)
    return out


def write_emu35(folder: str | pathlib.Path, seed: int = 0, codes: int = CODES, tokenizer: str = "beside",
                vision: bool = True, **fields) -> pathlib.Path:
    """An Emu3.5 release folder.  ``tokenizer``: where BAAI's tokenizer files go: ``"beside"`` (a
    ``tokenizer_emu3_ibq`` folder beside the model, as in the authors' repository), ``"inside"`` (the model folder)
    or ``"none"``.  ``vision``: the IBQ vision tokenizer beside it (``Emu3.5-VisionTokenizer/``, written by
    ``tests/ibq_files.py``).  ``fields``: config.json's values that replace the tiny ones."""
    from .liquid_files import write_two_shards

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = config(codes, **fields)
    write_two_shards(folder, random_weights(cfg, seed))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({
        "bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"],
        "transformers_version": "4.48.2"}, indent=2))
    if tokenizer != "none":
        write_tokenizer(folder if tokenizer == "inside" else folder.parent / TOKENIZER_FOLDER, codes, seed)
    if vision:
        write_vision_tokenizer(folder.parent / VISION_FOLDER, codes, seed)
    return folder


def write_vision_tokenizer(folder: pathlib.Path, codes: int = CODES, seed: int = 0) -> pathlib.Path:
    """BAAI/Emu3.5-VisionTokenizer's layout (``config.yaml`` + ``model.ckpt``), tiny, with ``codes`` codes."""
    from .ibq_files import CONFIG, write_ibq

    return write_ibq(folder, seed=seed, config={**CONFIG, "n_embed": codes})
