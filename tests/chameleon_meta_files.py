"""Tiny random Chameleon models written in Meta's original release layout
(``models/7b/params.json`` + ``consolidated.pth``, ``tokenizer/text_tokenizer.json``,
``tokenizer/vqgan.yaml`` + ``vqgan.ckpt``), from a transformers model.

The mapping back to Meta's names is written here independently of the loader, with
explicit row indices, so that a wrong rotary permutation in the loader cannot cancel
out: transformers keeps each head's rotary pairs as halves ``(x_i, x_{i + d/2})``,
Meta interleaves them ``(x_{2p}, x_{2p + 1})``."""
from __future__ import annotations

import json
import pathlib

import torch

from .chameleon_files import CODES, tiny_chameleon, vocabulary, write_tiny_vqgan

RESERVED_IMAGE = "<reserved08707>"  # Meta's name for the id transformers calls <image>


def tiny_model(heads: int = 4, kv_heads: int = 2, swin_norm: bool = False, hidden: int = 32, inter: int = 64,
               layers: int = 2, seed: int = 0, rope_theta: float = 10000.0):
    """A tiny random transformers Chameleon over ``chameleon_files.vocabulary`` (the default is
    ``chameleon_files.tiny_chameleon``'s model: 4 heads, 2 kv heads, head size 8)."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    if (heads, kv_heads, swin_norm, hidden, inter, layers, rope_theta) == (4, 2, False, 32, 64, 2, 10000.0):
        return tiny_chameleon("anole", seed)
    vocab = vocabulary(seed)
    torch.manual_seed(seed)
    config = ChameleonConfig(
        vocab_size=len(vocab), hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, swin_norm=swin_norm, rope_theta=rope_theta,
        max_position_embeddings=4096, vocabulary_map=vocab, bos_token_id=0, eos_token_id=1, pad_token_id=2,
        vq_config={"embed_dim": 8, "num_embeddings": CODES, "latent_channels": 16, "base_channels": 32,
                   "channel_multiplier": [1, 2], "num_res_blocks": 1, "resolution": 32})
    model = ChameleonForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    return model, vocab


def perturb(model, shards: int = 1, seed: int = 0) -> None:
    """Random norms (RMS and q/k LayerNorm), so that each matters.  Meta's q/k norms have
    one [head_dim] vector per model-parallel shard, shared by that shard's heads: the
    transformers rows are set so (equal within each shard's group of heads)."""
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "vqmodel" in name:
                continue
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif "_norm." in name:  # q_norm / k_norm, [heads, head_dim]
                per_shard = torch.randn(shards, p.shape[1], generator=g) * 0.3 + (1.0 if name.endswith("weight")
                                                                                     else 0.0)
                group = p.shape[0] // shards
                for h in range(p.shape[0]):
                    p[h] = per_shard[h // group]


def _interleaved_order(heads: int, head_dim: int) -> list[int]:
    """For each Meta row (head h, pair p, component c at h*hd + 2p + c) the transformers row
    holding it (h*hd + c*hd/2 + p)."""
    half = head_dim // 2
    order = []
    for h in range(heads):
        for j in range(head_dim):
            pair, component = j // 2, j % 2
            order.append(h * head_dim + component * half + pair)
    return order


def meta_state_dicts(model, shards: int = 1, interleave: bool = True) -> list[dict[str, torch.Tensor]]:
    """Meta's consolidated weights, split into ``shards`` model-parallel parts.  With
    ``interleave=False`` the q/k rows and norms stay in transformers' order (a wrong file,
    to show that the order matters)."""
    cfg = model.config
    heads, kv, dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    hd = dim // heads
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    q_order = _interleaved_order(heads, hd) if interleave else list(range(heads * hd))
    k_order = _interleaved_order(kv, hd) if interleave else list(range(kv * hd))
    vec_order = _interleaved_order(1, hd) if interleave else list(range(hd))

    full = {"tok_embeddings.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"],
            "output.weight": sd["lm_head.weight"]}
    norms = {}  # [shards, hd] per name: each shard's first head's vector
    for i in range(cfg.num_hidden_layers):
        hf, meta = f"model.layers.{i}.", f"layers.{i}."
        full[meta + "attention.wq.weight"] = sd[hf + "self_attn.q_proj.weight"][q_order]
        full[meta + "attention.wk.weight"] = sd[hf + "self_attn.k_proj.weight"][k_order]
        full[meta + "attention.wv.weight"] = sd[hf + "self_attn.v_proj.weight"]
        full[meta + "attention.wo.weight"] = sd[hf + "self_attn.o_proj.weight"]
        full[meta + "feed_forward.w1.weight"] = sd[hf + "mlp.gate_proj.weight"]
        full[meta + "feed_forward.w2.weight"] = sd[hf + "mlp.down_proj.weight"]
        full[meta + "feed_forward.w3.weight"] = sd[hf + "mlp.up_proj.weight"]
        full[meta + "attention_norm.weight"] = sd[hf + "input_layernorm.weight"]
        full[meta + "ffn_norm.weight"] = sd[hf + "post_attention_layernorm.weight"]
        for qk, count in (("q", heads), ("k", kv)):
            for what in ("weight", "bias"):
                rows = sd[f"{hf}self_attn.{qk}_norm.{what}"]
                first_heads = rows[[s * (count // shards) for s in range(shards)]]
                norms[f"{meta}attention.{qk}_normalization.{what}"] = first_heads[:, vec_order]

    # Megatron's split: these along output rows, those along input columns, the rest copied
    rows_split = (".wq.", ".wk.", ".wv.", ".w1.", ".w3.", "output.")
    cols_split = (".wo.", ".w2.", "tok_embeddings.")
    out = [{} for _ in range(shards)]
    for name, w in full.items():
        if any(s in name for s in rows_split):
            parts = w.chunk(shards, 0)
        elif any(s in name for s in cols_split):
            parts = w.chunk(shards, 1)
        else:
            parts = [w] * shards
        for s in range(shards):
            out[s][name] = parts[s].clone()
    for name, per_shard in norms.items():
        for s in range(shards):
            out[s][name] = per_shard[s].clone()
    return out


def meta_params(config, shards: int = 1, nested: bool = True) -> dict:
    """params.json for ``config``.  The FFN width is Meta's formula
    ``multiple_of * ceil(int(multiplier * int(8 * dim / 3)) / multiple_of)``: with
    ``multiple_of`` = the width and a multiplier giving about half of it, it rounds up
    to exactly the width."""
    dim, inter = config.hidden_size, config.intermediate_size
    base = int(8 * dim / 3)
    theta = getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]
    model = {"dim": dim, "n_layers": config.num_hidden_layers, "n_heads": config.num_attention_heads,
             "n_kv_heads": config.num_key_value_heads, "vocab_size": config.vocab_size,
             "multiple_of": inter, "ffn_dim_multiplier": inter / 2 / base, "norm_eps": config.rms_norm_eps,
             "rope_theta": theta, "qk_normalization": True, "swin_norm": bool(config.swin_norm)}
    if nested:
        return {"model_parallel_size": shards, "model": model}
    return {"model_parallel_size": shards, **model}


def write_text_tokenizer(path: pathlib.Path, vocab: dict[str, int]) -> dict[str, int]:
    """A ``tokenizers`` JSON of ``vocab`` with ``<image>`` under Meta's name ``<reserved08707>``;
    the <...> entries are special tokens.  Returns the vocabulary as written."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    meta_vocab = {(RESERVED_IMAGE if name == "<image>" else name): i for name, i in vocab.items()}
    tok = Tokenizer(models.WordLevel(meta_vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(n, special=True) for n in meta_vocab if n.startswith("<")])
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return meta_vocab


def write_meta_chameleon(folder: pathlib.Path, model=None, vocab=None, shards: int = 1, flat: bool = False,
                         nested_params: bool = True, interleave: bool = True, vqgan: bool = True,
                         seed: int = 0) -> pathlib.Path:
    """Meta's layout of ``model`` (default: the tiny Anole of ``chameleon_files``) in ``folder``:
    ``models/7b/`` or, with ``flat``, params.json + consolidated file(s) in the folder itself.
    The model's norms should already be :func:`perturb`-ed for ``shards`` (its q/k norms
    must be equal within each shard's heads)."""
    if model is None:
        model, vocab = tiny_chameleon("anole", seed)
        perturb(model, shards, seed)
    folder = pathlib.Path(folder)
    model_dir = folder if flat else folder / "models" / "7b"
    model_dir.mkdir(parents=True, exist_ok=True)
    parts = meta_state_dicts(model, shards, interleave)
    if shards == 1:
        torch.save(parts[0], model_dir / "consolidated.pth")
    else:
        for i, part in enumerate(parts):
            torch.save(part, model_dir / f"consolidated.{i:02d}.pth")
    (model_dir / "params.json").write_text(json.dumps(meta_params(model.config, shards, nested_params)))
    write_text_tokenizer(folder / "tokenizer" / "text_tokenizer.json", vocab)
    if vqgan:
        write_tiny_vqgan(folder / "tokenizer", CODES, seed)
    return folder
