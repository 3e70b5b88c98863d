"""Tiny random Chameleon-architecture folders in transformers' converted format
(Lumina-mGPT and Anole flavours), with a word-level tokenizer whose special and
image tokens sit at ids unlike the real ones, so nothing id-specific can pass."""
from __future__ import annotations

import json
import pathlib
import random

import torch

WORDS = ("Generate an image of according to the following prompt: a red fox in snow blue sky cat on mat "
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


TINY_SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2}


def tiny_chameleon(flavour: str = "lumina", seed: int = 0, with_images: bool = True, **sizes):
    """A random Chameleon over :func:`vocabulary`; ``sizes`` (config fields of :data:`TINY_SIZES`) widen it."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    vocab = vocabulary(seed, with_images)
    torch.manual_seed(seed)
    config = ChameleonConfig(
        vocab_size=len(vocab), **{**TINY_SIZES, **sizes}, max_position_embeddings=2048, vocabulary_map=vocab,
        bos_token_id=0, eos_token_id=1, pad_token_id=2,
        vq_config={"embed_dim": 8, "num_embeddings": CODES, "latent_channels": 16, "base_channels": 32,
                   "channel_multiplier": [1, 2], "num_res_blocks": 1, "resolution": 32},
    )
    model = ChameleonForConditionalGeneration(config).eval()
    with torch.no_grad():  # spread the logits: random init is nearly uniform
        model.lm_head.weight.mul_(40)
    return model, vocab


def write_chameleon(folder: pathlib.Path, flavour: str = "lumina", seed: int = 0, with_images: bool = True,
                    vqgan: bool = True, dtype: torch.dtype | None = None, **sizes) -> pathlib.Path:
    """A converted-format folder (weights in ``dtype``, default float32); with ``vqgan`` also
    ``tokenizer/vqgan.yaml`` + ``vqgan.ckpt`` whose codebook matches the vocabulary's image tokens."""
    model, vocab = tiny_chameleon(flavour, seed, with_images, **sizes)
    folder.mkdir(parents=True, exist_ok=True)
    (model if dtype is None else model.to(dtype)).save_pretrained(str(folder))
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


def lumina_config(model, model_parallel_size: int = 1) -> dict:
    """config.json as Lumina-mGPT's training code saves its releases (Alpha-VLLM/Lumina-mGPT @104abe45):
    ``ChameleonXLLMXConfig`` (``lumina_mgpt/model/configuration_xllmx_chameleon.py``: Lumina's own
    ``ChameleonConfig`` plus ``z_loss_weight``) with the fields its ``configuration_chameleon.py`` serialises
    (``model_parallel_size``, ``swin_norm``, ``mask_image_logits``, ``dropout``, ``mlp_bias``), the class
    defaults for the ids its converter never sets (``bos_token_id`` 1, ``eos_token_id`` 2, ``pad_token_id``
    None: not the tokenizer's), and ``vq_config`` as its converter writes it from ``vqgan.yaml`` (the yaml's
    keys beside their renamed copies)."""
    c = model.config
    vq = c.vq_config
    return {
        "architectures": [ARCHITECTURES["lumina"]], "model_type": "chameleon", "z_loss_weight": 1e-05,
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None,
        "dropout": 0.05, "hidden_act": "silu", "hidden_size": c.hidden_size, "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size, "mask_image_logits": False,
        "max_position_embeddings": c.max_position_embeddings, "mlp_bias": False,
        "model_parallel_size": model_parallel_size, "num_attention_heads": c.num_attention_heads,
        "num_hidden_layers": c.num_hidden_layers, "num_key_value_heads": c.num_key_value_heads,
        "rms_norm_eps": c.rms_norm_eps, "rope_scaling": None, "rope_theta": 10000.0, "swin_norm": False,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.3", "use_cache": True,
        "vocab_size": c.vocab_size, "vocabulary_map": c.vocabulary_map,
        "vq_config": {"embed_dim": vq.embed_dim, "n_embed": vq.num_embeddings, "num_embeddings": vq.num_embeddings,
                      "double_z": False, "double_latent": False, "z_channels": vq.latent_channels,
                      "latent_channels": vq.latent_channels, "resolution": vq.resolution, "in_channels": 3,
                      "out_ch": 3, "out_channels": 3, "ch": vq.base_channels, "base_channels": vq.base_channels,
                      "ch_mult": list(vq.channel_multiplier), "channel_multiplier": list(vq.channel_multiplier),
                      "num_res_blocks": vq.num_res_blocks, "attn_resolutions": list(vq.attn_resolutions or []),
                      "dropout": 0.0},
    }


def tiny_lumina_reference(seed: int = 0, model_parallel_size: int = 1, **sizes):
    """The tiny Lumina-mGPT as the reference runs it: transformers' Chameleon whose q/k norms are equal
    within each model-parallel shard's heads (what Lumina's per-shard rows mean), every weight rounded to
    bfloat16 (the dtype of the release files) and held in float32; ``sizes`` widen it (:func:`tiny_chameleon`)."""
    from .chameleon_meta_files import perturb

    model, vocab = tiny_chameleon("lumina", seed, **sizes)
    perturb(model, model_parallel_size, seed)
    with torch.no_grad():  # the weights only: rotary tables are computed, not stored
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16))
    return model, vocab


def write_lumina(folder: pathlib.Path, model_parallel_size: int = 1, seed: int = 0, vqgan: bool = True,
                 norm_rows: int | None = None, **sizes) -> pathlib.Path:
    """A Lumina-mGPT folder in Lumina's own layout, as its releases are saved (Alpha-VLLM/Lumina-mGPT
    @104abe45): bfloat16 safetensors shards with an index (``save_pretrained`` of its training checkpoint),
    no ``model.vqmodel.*`` weights (``finetune_solver.py`` deletes the VQ encoder before training), the
    q/k norms as its ``ChameleonLayerNorm`` stores them, ``[model_parallel_size, head_dim]`` (each shard's
    first head's row; its converter's ``.reshape(1, -1)`` for one shard), :func:`lumina_config`, the
    tokenizer, and Meta's VQGAN in ``tokenizer/`` as users set it up.  ``norm_rows`` writes that many
    rows instead (a file that fits no layout).  ``sizes`` widen the model (:func:`tiny_chameleon`)."""
    from safetensors.torch import save_file

    model, vocab = tiny_lumina_reference(seed, model_parallel_size, **sizes)
    rows = norm_rows or model_parallel_size
    folder.mkdir(parents=True, exist_ok=True)
    sd = {}
    for name, w in model.state_dict().items():
        if name.startswith("model.vqmodel."):
            continue
        if "_norm." in name and ".self_attn." in name:  # [heads, head_dim] -> one row per shard
            w = w[[s * (w.shape[0] // rows) for s in range(rows)]] if w.shape[0] % rows == 0 else w[:rows]
        sd[name] = w.to(torch.bfloat16).contiguous()
    names = sorted(sd)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, part in enumerate(halves):
        file = f"model-{i + 1:05d}-of-{len(halves):05d}.safetensors"
        save_file({n: sd[n] for n in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in sd.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (folder / "config.json").write_text(json.dumps(lumina_config(model, model_parallel_size), indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"_from_model_config": True, "bos_token_id": 1,
                                                               "eos_token_id": 2, "transformers_version": "4.43.3"}))
    write_tokenizer(folder, vocab)
    if vqgan:
        write_tiny_vqgan(folder / "tokenizer", CODES, seed)
    return folder
