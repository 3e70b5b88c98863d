"""Meta's original release layout for Chameleon / Anole, converted in memory to
transformers' ``ChameleonForConditionalGeneration`` (no files are written).

The layout (Meta's Chameleon download; GAIR's ``Anole-7b-v0.1`` ships in it)::

    models/7b/params.json            architecture (possibly nested under "model")
    models/7b/consolidate_params.json   optional, merged over params.json
    models/7b/consolidated.pth       or consolidated.00.pth, .01.pth ... (model-parallel shards)
    tokenizer/text_tokenizer.json    a ``tokenizers`` JSON; its vocab holds the IMGIMG...Z image tokens
    tokenizer/vqgan.yaml, vqgan.ckpt the image tokenizer (the pictures come from ``decoders/vqgan.py``)

``params.json`` + ``consolidated.pth`` may also sit directly in the folder.  The
conversion is the one transformers' ``convert_chameleon_weights_to_hf.py`` performs:

* Meta's attention applies rotary embeddings to interleaved pairs ``(x0, x1), (x2, x3) ...``
  of each head; transformers' to the two halves ``(x_i, x_{i + d/2})``.  So the rows of
  ``wq`` / ``wk`` are reordered per head: interleaved row ``2p + i`` becomes half-split
  row ``i * d/2 + p``.
* Meta normalises q and k per head with one LayerNorm over ``head_dim`` per
  model-parallel shard (``attention.q_normalization`` / ``k_normalization``, weight and
  bias of ``head_dim``); transformers keeps a (heads, head_dim) weight and bias.  Each
  shard's vector gets the same reordering and is repeated for that shard's heads.
* Shards are joined the Megatron way: ``wq wk wv w1 w3 output`` along their output rows,
  ``wo w2`` and ``tok_embeddings`` along their input columns; norms (replicated) averaged.
* The FFN width is ``multiple_of * ceil(int(ffn_dim_multiplier * int(8 * dim / 3)) / multiple_of)``
  (11008 for the 7B: dim 4096, multiple_of 256, multiplier 1).
* ``max_position_embeddings`` is 16384 when ``rope_theta > 10000``, else 4096.
* The vocabulary map is the tokenizer's ``model.vocab`` with ``<reserved08707>`` renamed
  ``<image>`` (transformers' image placeholder); the tokenizer gets the same rename.
* ``model.vqmodel`` (transformers' VQ *encoder*, for image inputs; not used to generate)
  is absent from ``consolidated.pth``: it is filled from ``vqgan.ckpt``'s ``encoder.*``,
  ``quant_conv.*``, ``quantize.*`` and ``post_quant_conv.*`` (same names), its config
  from ``vqgan.yaml``.  Without a VQGAN it stays randomly initialised (a warning says so).

Two departures from the converter, both where it is wrong outside the released
models: with ``n_kv_heads`` set, the key/value width is ``head_dim * n_kv_heads`` (the
converter computes ``dim // n_kv_heads``, right only when ``n_heads == n_kv_heads ** 2``);
and the vocabulary size is ``params.json``'s ``vocab_size`` (the converter hard-codes
65536).  The bos / eos / pad ids of the config are the tokenizer's ``<s>``, ``</s>``,
``<pad>``.
"""
from __future__ import annotations

import json
import logging
import pathlib
import re
from collections.abc import Mapping

import torch

from ..formats.checkpoints import CheckpointError, empty_model, load_file, read_weights, state_dict
from .storage import checkpoint_ranges, drop_pages, full_dtype, place

log = logging.getLogger(__name__)

PARAMS, CONSOLIDATE_PARAMS, TEXT_TOKENIZER = "params.json", "consolidate_params.json", "text_tokenizer.json"
SINGLE = "consolidated.pth"
SHARD = re.compile(r"consolidated\.(\d+)\.pth")
IMAGE_PLACEHOLDER, RESERVED_IMAGE = "<image>", "<reserved08707>"
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
                  "sep_token": "<reserved08706>"}  # the converter makes <reserved08706> the separator
VQ_PREFIXES = ("encoder.", "quant_conv.", "quantize.", "post_quant_conv.")
ARCHITECTURE = "ChameleonForConditionalGeneration"


# -- finding the files --------------------------------------------------------------
def _has_model_files(d: pathlib.Path) -> bool:
    return (d / PARAMS).is_file() or (d / SINGLE).is_file() or any(SHARD.fullmatch(p.name) for p in d.glob("*.pth"))


def _model_dirs(folder: pathlib.Path) -> list[pathlib.Path]:
    """Folders holding params.json or consolidated*.pth: ``folder`` itself, or ``folder/models/<size>``."""
    if _has_model_files(folder):
        return [folder]
    models = folder / "models"
    if not models.is_dir():
        return []
    return [d for d in sorted(models.iterdir()) if d.is_dir() and _has_model_files(d)]


def _is_converted(folder: pathlib.Path) -> bool:
    """A transformers ``config.json`` (one naming a ``model_type``) is there."""
    try:
        return bool(json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type"))
    except (OSError, ValueError, AttributeError):
        return False


def is_meta_layout(folder) -> bool:
    """Whether ``folder`` is in Meta's layout (``models/<size>/`` or flat), not transformers'
    converted format (a ``config.json`` with a ``model_type`` takes precedence)."""
    folder = pathlib.Path(folder)
    return folder.is_dir() and not _is_converted(folder) and bool(_model_dirs(folder))


def _tokenizer_dirs(folder: pathlib.Path, model_dir: pathlib.Path) -> list[pathlib.Path]:
    dirs = [folder / "tokenizer", folder]
    if model_dir == folder and folder.parent.name == "models":  # pointed at models/7b of a full download
        dirs.append(folder.parent.parent / "tokenizer")
    return dirs


def find_meta_files(folder) -> dict:
    """The files of Meta's layout in ``folder``: ``model_dir``, ``params``, ``consolidate_params``
    (or None), ``shards`` (one or more consolidated files, in order), ``tokenizer``
    (text_tokenizer.json), ``tokenizer_dir`` and ``vqgan`` (``(vqgan.yaml, vqgan.ckpt)`` or
    None).  One :class:`CheckpointError` names everything that is missing."""
    from ..decoders.vqgan import find_vqgan

    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such folder")
    dirs = _model_dirs(folder)
    if not dirs:
        raise CheckpointError(f"{folder}: not Meta's Chameleon layout: no {PARAMS} or {SINGLE} here or in "
                              "models/<size>/")
    if len(dirs) > 1:
        raise CheckpointError(f"{folder}: holds several models ({', '.join(d.name for d in dirs)} under models/); "
                              f"point at one of them, e.g. {dirs[0]}")
    model_dir = dirs[0]
    missing = []
    params = model_dir / PARAMS
    if not params.is_file():
        missing.append(str(params))
    numbered = {int(m.group(1)): p for p in model_dir.glob("*.pth") if (m := SHARD.fullmatch(p.name))}
    if (model_dir / SINGLE).is_file():
        if numbered:
            raise CheckpointError(f"{model_dir}: has both {SINGLE} and numbered shards ({numbered[min(numbered)].name} "
                                  "...); keep one set")
        shards = [model_dir / SINGLE]
    elif numbered:
        width = len(numbered[min(numbered)].name) - len("consolidated..pth")
        gaps = [i for i in range(max(numbered) + 1) if i not in numbered]
        missing += [str(model_dir / f"consolidated.{i:0{width}d}.pth") for i in gaps]
        shards = [numbered[i] for i in sorted(numbered)]
    else:
        missing.append(f"{model_dir / SINGLE} (or consolidated.00.pth, .01.pth ... shards)")
        shards = []
    tokenizer_dirs = _tokenizer_dirs(folder, model_dir)
    tokenizer = next((d / TEXT_TOKENIZER for d in tokenizer_dirs if (d / TEXT_TOKENIZER).is_file()), None)
    if tokenizer is None:
        missing.append(str(tokenizer_dirs[0] / TEXT_TOKENIZER))
    if missing:
        raise CheckpointError(f"{folder}: Meta's Chameleon layout is incomplete, missing {'; '.join(missing)}")
    consolidate = model_dir / CONSOLIDATE_PARAMS
    return {"model_dir": model_dir, "params": params,
            "consolidate_params": consolidate if consolidate.is_file() else None, "shards": shards,
            "tokenizer": tokenizer, "tokenizer_dir": tokenizer.parent, "vqgan": find_vqgan(tokenizer.parent)}


def _read_json(path: pathlib.Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: cannot be read as JSON ({err})") from err


def read_params(files: dict) -> dict:
    """params.json (with consolidate_params.json over it), the ``model`` section merged flat."""
    raw = _read_json(files["params"])
    if not isinstance(raw, dict):
        raise CheckpointError(f"{files['params']}: expected a JSON object")
    if files.get("consolidate_params"):
        extra = _read_json(files["consolidate_params"])
        raw = {**raw, **(extra if isinstance(extra, dict) else {})}
    inner = raw.get("model")
    flat = {k: v for k, v in raw.items() if k != "model"}
    if isinstance(inner, dict):
        flat.update(inner)
    return flat


def read_vocab(tokenizer_json: dict, source="text_tokenizer.json") -> dict[str, int]:
    vocab = (tokenizer_json.get("model") or {}).get("vocab") if isinstance(tokenizer_json, dict) else None
    if not isinstance(vocab, dict) or not vocab:
        raise CheckpointError(f"{source}: not a tokenizers JSON with a vocabulary (model.vocab)")
    return {str(k): int(v) for k, v in vocab.items()}


# -- the config ---------------------------------------------------------------------
def ffn_width(dim: int, ffn_dim_multiplier=None, multiple_of=None) -> int:
    """Meta's SwiGLU width: 2/3 of 4 * dim, scaled, rounded up to ``multiple_of``."""
    multiplier = 1.0 if ffn_dim_multiplier is None else float(ffn_dim_multiplier)
    multiple_of = 256 if multiple_of is None else int(multiple_of)
    width = int(multiplier * int(8 * dim / 3))
    return multiple_of * -(-width // multiple_of)


def vq_config_of(spec) -> dict:
    """transformers' ``ChameleonVQVAEConfig`` fields from a :class:`~..decoders.vqgan.VQGANSpec`."""
    return {"embed_dim": spec.embed_dim, "num_embeddings": spec.n_embed, "double_latent": False,
            "latent_channels": spec.z_channels, "resolution": spec.resolution, "in_channels": spec.in_channels,
            "base_channels": spec.ch, "channel_multiplier": list(spec.ch_mult), "num_res_blocks": spec.num_res_blocks,
            "attn_resolutions": list(spec.attn_resolutions), "dropout": float(spec.dropout)}


def translate_config(params: dict, vocab: dict, vq_config: dict | None = None, source="params.json") -> dict:
    """Keyword arguments for ``ChameleonConfig`` from Meta's params (``model`` section merged
    flat, or nested as shipped) and the tokenizer's vocabulary."""
    if isinstance(params.get("model"), dict):
        params = {**{k: v for k, v in params.items() if k != "model"}, **params["model"]}
    lacking = [k for k in ("dim", "n_layers", "n_heads") if params.get(k) is None]
    if lacking:
        raise CheckpointError(f"{source}: missing {', '.join(lacking)}")
    dim, layers, heads = int(params["dim"]), int(params["n_layers"]), int(params["n_heads"])
    kv_heads = int(params["n_kv_heads"]) if params.get("n_kv_heads") is not None else heads
    if dim % heads or (dim // heads) % 2:
        raise CheckpointError(f"{source}: dim {dim} is not n_heads {heads} times an even head size")
    if heads % kv_heads:
        raise CheckpointError(f"{source}: n_heads {heads} is not a multiple of n_kv_heads {kv_heads}")
    if params.get("qk_normalization") is False:
        raise CheckpointError(f"{source}: qk_normalization is false, but transformers' Chameleon always normalises "
                              "q and k (Meta's released models all do)")
    vocab = dict(vocab)
    if RESERVED_IMAGE in vocab:  # as the converter: the image placeholder takes this reserved id
        vocab[IMAGE_PLACEHOLDER] = vocab.pop(RESERVED_IMAGE)
    vocab_size = int(params["vocab_size"]) if params.get("vocab_size") else max(vocab.values()) + 1
    if max(vocab.values()) >= vocab_size:
        raise CheckpointError(f"{source}: vocab_size {vocab_size} is smaller than the tokenizer's vocabulary "
                              f"(ids up to {max(vocab.values())})")
    theta = float(params.get("rope_theta") or 10000.0)
    config = {
        "vocab_size": vocab_size, "hidden_size": dim,
        "intermediate_size": ffn_width(dim, params.get("ffn_dim_multiplier"), params.get("multiple_of")),
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "rms_norm_eps": float(params.get("norm_eps") or 1e-5), "rope_theta": theta,
        "max_position_embeddings": 16384 if theta > 10000.0 else 4096,
        "model_parallel_size": int(params.get("model_parallel_size") or 1),
        "swin_norm": bool(params.get("swin_norm", False)), "attention_bias": False, "tie_word_embeddings": False,
        "vocabulary_map": vocab,
        "bos_token_id": vocab.get("<s>"), "eos_token_id": vocab.get("</s>"), "pad_token_id": vocab.get("<pad>"),
    }
    if vq_config is not None:
        config["vq_config"] = dict(vq_config)
    else:  # transformers' default is Meta's VQGAN; match the codebook to the image tokens
        codes = sum(1 for k in vocab if k.startswith("IMGIMG") and k.endswith("Z"))
        config["vq_config"] = {"num_embeddings": codes} if codes else {}
    return config


def read_config(folder) -> dict:
    """What ``config.json`` would say after conversion (``architectures``, ``vocabulary_map``
    ...), from params.json and the tokenizer only: no weights are read."""
    from ..decoders.vqgan import VQGANSpec

    files = find_meta_files(folder)
    vocab = read_vocab(_read_json(files["tokenizer"]), str(files["tokenizer"]))
    vq = vq_config_of(VQGANSpec.from_yaml(files["vqgan"][0])) if files["vqgan"] else None
    config = translate_config(read_params(files), vocab, vq, str(files["params"]))
    return {"model_type": "chameleon", "architectures": [ARCHITECTURE], **config}


# -- the weights --------------------------------------------------------------------
def _get(config, key):
    return config[key] if isinstance(config, Mapping) else getattr(config, key)


def _expected_shapes(config, n: int) -> dict[str, tuple[int, ...]]:
    """Meta's names and the shape of each in one of ``n`` shards."""
    dim, heads = _get(config, "hidden_size"), _get(config, "num_attention_heads")
    kv = _get(config, "num_key_value_heads")
    hd, inter, vocab = dim // heads, _get(config, "intermediate_size"), _get(config, "vocab_size")
    out = {"tok_embeddings.weight": (vocab, dim // n), "norm.weight": (dim,), "output.weight": (vocab // n, dim)}
    for i in range(_get(config, "num_hidden_layers")):
        p = f"layers.{i}."
        out.update({p + "attention.wq.weight": (heads * hd // n, dim), p + "attention.wk.weight": (kv * hd // n, dim),
                    p + "attention.wv.weight": (kv * hd // n, dim), p + "attention.wo.weight": (dim, heads * hd // n),
                    p + "feed_forward.w1.weight": (inter // n, dim), p + "feed_forward.w2.weight": (dim, inter // n),
                    p + "feed_forward.w3.weight": (inter // n, dim), p + "attention_norm.weight": (dim,),
                    p + "ffn_norm.weight": (dim,)})
        for qk in ("q", "k"):
            for what in ("weight", "bias"):
                out[f"{p}attention.{qk}_normalization.{what}"] = (hd,)
    return out


def _listing(items: list[str], at_most: int = 5) -> str:
    more = f" and {len(items) - at_most} more" if len(items) > at_most else ""
    return ", ".join(items[:at_most]) + more


def check_shapes(shards: list[dict], config, source="consolidated.pth", params_source="params.json") -> None:
    """One :class:`CheckpointError` saying how the weights disagree with the params, if they do."""
    n = len(shards)
    heads, kv = _get(config, "num_attention_heads"), _get(config, "num_key_value_heads")
    dims = {"n_heads": heads, "n_kv_heads": kv, "dim": _get(config, "hidden_size"),
            "FFN width": _get(config, "intermediate_size"), "vocab_size": _get(config, "vocab_size")}
    odd = [f"{name} {v}" for name, v in dims.items() if v % n]
    if odd:
        raise CheckpointError(f"{source}: {n} shards cannot split {', '.join(odd)} of {params_source} evenly")
    expected = _expected_shapes(config, n)
    missing, wrong = [], []
    for i, shard in enumerate(shards):
        where = f" (shard {i})" if n > 1 else ""
        missing += [k + where for k in expected if k not in shard]
        wrong += [f"{k}{where} {list(shard[k].shape)} (expected {list(v)})" for k, v in expected.items()
                  if k in shard and tuple(shard[k].shape) != v]
    if missing or wrong:
        parts = ([f"missing {_listing(missing)}"] if missing else []) + ([f"wrong shapes: {_listing(wrong)}"]
                                                                          if wrong else [])
        ffn = (f"; FFN width {dims['FFN width']} from dim, ffn_dim_multiplier and multiple_of"
               if any(".feed_forward." in w for w in wrong) else "")
        raise CheckpointError(f"{source}: does not match the architecture in {params_source} "
                              f"({_get(config, 'num_hidden_layers')} layers, dim {dims['dim']}, {heads} heads, "
                              f"{kv} kv heads{ffn}): {'; '.join(parts)}")


def repeat_per_head(per_shard: torch.Tensor, n_heads: int) -> torch.Tensor:
    """q/k norm rows ``[shards, head_dim]`` -> ``[n_heads, head_dim]``: shard i's row for each of
    its ``n_heads // shards`` consecutive heads (the model-parallel split of the heads)."""
    return per_shard.repeat_interleave(n_heads // per_shard.shape[0], 0)


def remap_meta_keys(state_dict, config, source="consolidated.pth", params_source="params.json") -> dict:
    """transformers' state dict (``model.*``, ``lm_head.weight``; no ``model.vqmodel.*``) from
    Meta's consolidated weights: one dict, or a list of model-parallel shards in order.  The shards'
    dicts are emptied as they are read, so each source tensor can be freed as soon as its
    transformers counterpart exists (one layer's q and k are held twice, not the whole model)."""
    shards = [state_dict] if isinstance(state_dict, Mapping) else list(state_dict)
    check_shapes(shards, config, source, params_source)
    n = len(shards)
    heads, kv = _get(config, "num_attention_heads"), _get(config, "num_key_value_heads")
    hd = _get(config, "hidden_size") // heads
    used = set(_expected_shapes(config, n))
    unused = sorted({k for s in shards for k in s} - used)

    def joined(key, dim):  # Megatron shards: split along output rows (0) or input columns (1)
        return shards[0].pop(key) if n == 1 else torch.cat([s.pop(key) for s in shards], dim)

    def replicated(key):
        return shards[0].pop(key) if n == 1 else torch.stack([s.pop(key) for s in shards]).mean(0)

    mapped = checkpoint_ranges()

    def half_split(w, n_heads):  # per head, interleaved row 2p + i -> row i * hd/2 + p
        out = w.reshape(n_heads, hd // 2, 2, -1).transpose(1, 2).reshape(w.shape)  # a copy
        drop_pages(w, mapped)  # a memory-mapped source's pages, read once for the copy, are not kept
        return out

    def head_norm(key, n_heads):  # each shard's [hd] vector, reordered likewise, for each of its heads
        per_shard = torch.stack([s.pop(key) for s in shards]).reshape(n, hd // 2, 2).transpose(1, 2).reshape(n, hd)
        return repeat_per_head(per_shard, n_heads)

    out = {"model.embed_tokens.weight": joined("tok_embeddings.weight", 1),
           "model.norm.weight": replicated("norm.weight"), "lm_head.weight": joined("output.weight", 0)}
    for i in range(_get(config, "num_hidden_layers")):
        src, dst = f"layers.{i}.", f"model.layers.{i}."
        out.update({
            dst + "self_attn.q_proj.weight": half_split(joined(src + "attention.wq.weight", 0), heads),
            dst + "self_attn.k_proj.weight": half_split(joined(src + "attention.wk.weight", 0), kv),
            dst + "self_attn.v_proj.weight": joined(src + "attention.wv.weight", 0),
            dst + "self_attn.o_proj.weight": joined(src + "attention.wo.weight", 1),
            dst + "mlp.gate_proj.weight": joined(src + "feed_forward.w1.weight", 0),
            dst + "mlp.down_proj.weight": joined(src + "feed_forward.w2.weight", 1),
            dst + "mlp.up_proj.weight": joined(src + "feed_forward.w3.weight", 0),
            dst + "input_layernorm.weight": replicated(src + "attention_norm.weight"),
            dst + "post_attention_layernorm.weight": replicated(src + "ffn_norm.weight"),
        })
        for qk, count in (("q", heads), ("k", kv)):
            for what in ("weight", "bias"):
                out[f"{dst}self_attn.{qk}_norm.{what}"] = head_norm(f"{src}attention.{qk}_normalization.{what}",
                                                                    count)
    if unused:
        log.warning("%s: ignoring %d tensors transformers' Chameleon has no place for: %s", source, len(unused),
                    _listing(unused))
    return out


# -- the tokenizer ------------------------------------------------------------------
def build_tokenizer(tokenizer_json: dict):
    """A ``PreTrainedTokenizerFast`` over text_tokenizer.json (``<reserved08707>`` renamed
    ``<image>`` as the converter does), bos / eos / pad / unk / sep from its specials."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    data = json.loads(json.dumps(tokenizer_json))  # a copy to rename in
    vocab = data["model"]["vocab"]
    if RESERVED_IMAGE in vocab and IMAGE_PLACEHOLDER not in vocab:
        vocab[IMAGE_PLACEHOLDER] = vocab.pop(RESERVED_IMAGE)
        for token in data.get("added_tokens") or []:
            if token.get("content") == RESERVED_IMAGE:
                token["content"] = IMAGE_PLACEHOLDER
    specials = {role: name for role, name in SPECIAL_TOKENS.items() if name in vocab}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)), **specials)


# -- the model ----------------------------------------------------------------------
def _fill_vqmodel(model, config, vqgan) -> None:
    """The VQ encoder from ``vqgan.ckpt`` (same names as the checkpoint), or a random one."""
    vq = model.model.vqmodel
    if vqgan is not None:
        ckpt = vqgan[1]
        sd = {k: v for k, v in state_dict(load_file(ckpt), wrappers=("state_dict", "model")).items()
              if k.startswith(VQ_PREFIXES)}
        if any(k.startswith("encoder.") for k in sd):
            try:
                vq.load_state_dict(sd, strict=True, assign=True)
                return
            except RuntimeError as err:
                raise CheckpointError(f"{ckpt}: its encoder does not fit {vqgan[0]} "
                                      f"({str(err).strip().splitlines()[-1].strip()})") from err
        log.warning("%s: no encoder weights; transformers' VQ encoder (model.vqmodel, used only to read input "
                    "images) stays randomly initialised", ckpt)
    else:
        log.warning("no tokenizer/vqgan.yaml + vqgan.ckpt: transformers' VQ encoder (model.vqmodel, used only to "
                    "read input images) stays randomly initialised")
    with torch.device("cpu"):
        model.model.vqmodel = type(vq)._from_config(config.vq_config)


def load_model(folder, device="cpu", dtype=torch.float32):
    """``(ChameleonForConditionalGeneration, tokenizer)`` from Meta's layout.  Every ``.pth`` is read
    weights-only, memory-mapped where it can be (one file, already in ``dtype``), else in ``dtype`` one
    tensor at a time, the conversion freeing each source tensor as it goes; the model is built with its
    parameters on the meta device and given the converted tensors themselves (its buffers, the rotary
    tables, computed by its own code): no float32 stage and no second copy of the weights."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from ..decoders.vqgan import VQGANSpec

    files = find_meta_files(folder)
    tokenizer_json = _read_json(files["tokenizer"])
    vocab = read_vocab(tokenizer_json, str(files["tokenizer"]))
    vq = vq_config_of(VQGANSpec.from_yaml(files["vqgan"][0])) if files["vqgan"] else None
    kwargs = translate_config(read_params(files), vocab, vq, str(files["params"]))
    config = ChameleonConfig(**kwargs)
    paths = files["shards"]
    source = str(paths[0]) if len(paths) == 1 else f"{files['model_dir']}/consolidated.*.pth ({len(paths)} shards)"
    # one file: memory-mapped where no conversion is needed (the q/k reordering copies only those two and gives
    # back their file pages); several: read whole, as the Megatron shards are joined into new tensors anyway
    shards = [read_weights([p], full_dtype(dtype, device), lazy=len(paths) == 1) for p in paths]
    weights = remap_meta_keys(shards, config, source, str(files["params"]))
    del shards
    model = empty_model(ChameleonForConditionalGeneration, config)
    result = model.load_state_dict(weights, strict=False, assign=True)
    del weights  # the model holds the only references: moving it to a GPU frees each tensor as it goes
    missing = [k for k in result.missing_keys if not k.startswith("model.vqmodel.")]
    if missing or result.unexpected_keys:
        parts = ([f"missing {_listing(missing)}"] if missing else []) + (
            [f"unexpected {_listing(result.unexpected_keys)}"] if result.unexpected_keys else [])
        raise CheckpointError(f"{source}: the converted weights do not fit transformers' Chameleon: "
                              f"{'; '.join(parts)}")
    _fill_vqmodel(model, config, files["vqgan"])
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:  # a transformers version with state this conversion does not know of
        raise RuntimeError(f"Chameleon conversion left tensors unset: {_listing(left)}")
    return place(model, dtype, device).eval(), build_tokenizer(tokenizer_json)
