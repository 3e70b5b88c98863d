"""Janus and Janus-Pro (deepseek) through transformers (>= 4.52.1).

Image tokens come from a separate 16384-way generation head on the language
model's last hidden state; the next input is the generation aligner applied to
the generation embedding of the token (``prepare_embeddings_for_image_generation``),
not a text embedding.  The prompt is the reference's (deepseek-ai/Janus @1daa72fa,
``generation_inference.py`` with ``VLChatProcessor.apply_sft_template_for_multi_turn_prompts``
and the ``deepseek`` conversation template): BOS, ``<|User|>: {prompt}\\n\\n<|Assistant|>:``
with the user's text stripped of surrounding whitespace (an empty text gives
``<|User|>:<|Assistant|>:``), then ``<begin_of_image>``; the unconditional branch keeps BOS
and ``<begin_of_image>`` and pads (``<｜▁pad▁｜>``) everything between, and guidance mixes raw
logits (scale 5, temperature 1, no top-k in the reference).

``generate(generation_mode="image")`` uses a static cache that cannot roll
back, so the adapter runs its own loop on a :class:`~.hf_cache.StaticCache`.

Converted folders (``deepseek-community/Janus-Pro-1B``, ``model_type: janus``)
load directly.  Original folders (``deepseek-ai/Janus-Pro-7B``, ``model_type:
multi_modality``) load through :func:`remap_original_keys`, the key mapping of
transformers' ``convert_janus_weights_to_hf.py``, and :func:`translate_config`.
"""
from __future__ import annotations

import pathlib
import re

import torch

from ..decoders.blocks import unit_range
from ..formats.checkpoints import (CheckpointError, assign_weights, checked_weight_files, empty_model, hf_call,
                                   read_json, read_weights, tokenizer_from_pretrained)
from ..sampling.adapter import TokenLayout
from ..sampling.config import shorten
from .family import Detected, Family, transformers_config
from .hf_cache import TransformersAdapter
from .storage import full_dtype, place

TEMPLATE = "<|User|>: {prompt}\n\n<|Assistant|>:"
EMPTY_TEMPLATE = "<|User|>:<|Assistant|>:"  # a turn without content is written "role:"
BOI, PAD = "<begin_of_image>", "<｜▁pad▁｜>"


# -- original (multi_modality) checkpoints -------------------------------------------------
_KEY_RULES = [  # applied in order, as transformers' converter does
    (r"vision_model\.vision_tower\.blocks\.(\d+)\.attn", r"model.vision_model.encoder.layers.\1.self_attn"),
    (r"vision_model\.vision_tower\.blocks", "model.vision_model.encoder.layers"),
    (r"vision_model\.vision_tower\.pos_embed", "model.vision_model.embeddings.position_embedding.weight"),
    (r"vision_model\.vision_tower\.patch_embed\.proj", "model.vision_model.embeddings.patch_embedding"),
    (r"vision_model\.vision_tower\.norm", "model.vision_model.post_layernorm"),
    (r"(model\.vision_model\.encoder\.layers\.\d+)\.norm1", r"\1.layer_norm1"),
    (r"(model\.vision_model\.encoder\.layers\.\d+)\.norm2", r"\1.layer_norm2"),
    (r"(model\.vision_model\.encoder\.layers\.\d+\.self_attn)\.proj", r"\1.projection_layer"),
    (r"(model\.vision_model\.encoder\.layers\.\d+\.mlp)\.fc", r"\1.fc"),
    (r"gen_vision_model", "model.vqmodel"),
    (r"(model\.vqmodel\.decoder)\.conv_blocks", r"\1.up"),
    (r"(model\.vqmodel\.encoder)\.conv_blocks", r"\1.down"),
    (r"(model\.vqmodel\.\w+\.(?:up|down)\.\d+)\.res", r"\1.block"),
    (r"(model\.vqmodel\.\w+)\.mid\.0", r"\1.mid.block_1"),
    (r"(model\.vqmodel\.\w+)\.mid\.1", r"\1.mid.attn_1"),
    (r"(model\.vqmodel\.\w+)\.mid\.2", r"\1.mid.block_2"),
    (r"gen_aligner\.layers\.0", "model.generation_aligner.fc1"),
    (r"gen_aligner\.layers\.2", "model.generation_aligner.hidden_layers.0"),
    (r"^aligner\.layers\.0", "model.aligner.fc1"),
    (r"^aligner\.layers\.2", "model.aligner.hidden_layers.0"),
    (r"gen_head\.output_mlp_projector", "model.generation_head.proj_out"),
    (r"^gen_head\.", "model.generation_head."),
    (r"^gen_embed", "model.generation_embeddings"),
    (r"language_model\.model\.", "model.language_model."),
    (r"language_model\.lm_head\.weight", "lm_head.weight"),
]


def remap_original_keys(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Original deepseek-ai key names -> transformers' (fused vision ``qkv`` split;
    the unused attention-pooling head and the codebook-usage buffer dropped)."""
    out = {}
    for key, value in sd.items():
        if "attn_pool" in key or key.endswith("quantize.codebook_used"):
            continue
        new = key
        for pattern, repl in _KEY_RULES:
            new = re.sub(pattern, repl, new)
        if new.endswith(("self_attn.qkv.weight", "self_attn.qkv.bias")):
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0)):
                out[new.replace("qkv", part)] = chunk
        elif key.startswith("vision_model.vision_tower.pos_embed"):
            out[new] = value.squeeze(0)
        else:
            out[new] = value
    return out


def translate_config(original: dict, weights: dict[str, torch.Tensor], tokenizer) -> dict:
    """An original ``multi_modality`` config.json -> ``JanusConfig`` keyword
    arguments.  The original names its towers (``siglip_large_patch16_384``,
    ``VQ-16``) instead of sizing them, so sizes are read from the weights; the
    SigLIP tower only serves image understanding and its head count (not
    stored in the weights) is taken as width / 64."""
    lang = dict(original["language_config"])
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta")
    text = {k: lang[k] for k in keep if k in lang}
    text.update(model_type="llama", pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    w = weights
    patch = w["vision_model.vision_tower.patch_embed.proj.weight"]
    width = patch.shape[0]
    blocks = {int(m.group(1)) for k in w if (m := re.match(r"vision_model\.vision_tower\.blocks\.(\d+)\.", k))}
    image_size = original["vision_config"].get("params", {}).get("image_size", 384)
    vision = {"hidden_size": width, "num_hidden_layers": len(blocks), "num_attention_heads": max(1, width // 64),
              "patch_size": patch.shape[-1], "image_size": image_size,
              "mlp_ratio": w["vision_model.vision_tower.blocks.0.mlp.fc1.weight"].shape[0] / width,
              "projection_dim": w["aligner.layers.0.weight"].shape[0],
              "depth": sum(1 for k in w if re.match(r"aligner\.layers\.\d+\.weight", k)),
              "num_image_tokens": (image_size // patch.shape[-1]) ** 2}
    levels = sorted({int(k.split(".")[3]) for k in w if k.startswith("gen_vision_model.encoder.conv_blocks.")})
    base = w["gen_vision_model.encoder.conv_in.weight"].shape[0]
    book = w["gen_vision_model.quantize.embedding.weight"]
    head = w["gen_head.output_mlp_projector.weight"]
    vq = {"embed_dim": book.shape[1], "num_embeddings": book.shape[0], "base_channels": base,
          "channel_multiplier": [w[f"gen_vision_model.encoder.conv_blocks.{i}.res.0.conv1.weight"].shape[0]
                                 // base for i in levels],
          "num_res_blocks": len({k.split(".")[5] for k in w
                                 if k.startswith("gen_vision_model.encoder.conv_blocks.0.res.")}),
          "latent_channels": w["gen_vision_model.quant_conv.weight"].shape[1],
          "projection_dim": head.shape[0], "image_token_embed_dim": head.shape[1]}
    return {"text_config": text, "vision_config": vision, "vq_config": vq,
            "image_token_id": tokenizer.convert_tokens_to_ids("<image_placeholder>"), "tie_word_embeddings": False}


def load_model(folder: str | pathlib.Path, device="cpu", dtype=torch.float32):
    """``(JanusForConditionalGeneration, tokenizer)`` from a converted or original folder.

    Both are built with their parameters on the meta device and given the file's tensors, read
    in ``dtype`` one at a time: no float32 stage, no second copy (a 7B needs its own size in
    memory, not twice or four times it); the buffers no file stores are the model's own."""
    from transformers import JanusConfig, JanusForConditionalGeneration

    folder = pathlib.Path(folder)
    cfg = read_json(folder / "config.json")
    tokenizer = tokenizer_from_pretrained(folder)
    if cfg.get("model_type") == "janus":
        config = hf_call(lambda: JanusConfig.from_pretrained(str(folder), local_files_only=True), folder,
                         "a Janus configuration")
        files = checked_weight_files(folder)
        model = empty_model(JanusForConditionalGeneration, config)
        assign_weights(model, read_weights(files, full_dtype(dtype, device)), files[0] if len(files) == 1 else folder,
                       "a Janus model")
        _generation_config(model, folder)
    elif cfg.get("model_type") == "multi_modality":
        files = checked_weight_files(folder)
        weights = read_weights(files, full_dtype(dtype, device))
        config = JanusConfig(**translate_config(cfg, weights, tokenizer))
        model = empty_model(JanusForConditionalGeneration, config)
        remapped = remap_original_keys(weights)
        del weights  # the model is to hold the only references
        assign_weights(model, remapped, files[0] if len(files) == 1 else folder,
                       "transformers' Janus model (original deepseek-ai weights through the key remap)",
                       optional=("model.vision_model.",))  # the understanding tower: never run to generate
    else:
        raise CheckpointError(f"{folder}: config.json model_type {cfg.get('model_type')!r} is not Janus")
    return place(model, dtype, device).eval(), tokenizer


def _generation_config(model, folder: pathlib.Path) -> None:
    """The folder's generation_config.json, read as ``from_pretrained`` reads it, so that the model
    generates with transformers' own ``generate`` as a ``from_pretrained`` one does."""
    if (folder / "generation_config.json").is_file():
        from transformers import GenerationConfig

        model.generation_config = hf_call(lambda: GenerationConfig.from_pretrained(str(folder), local_files_only=True),
                                          folder, "a generation configuration")


class JanusAdapter(TransformersAdapter):
    guidance = "linear"
    sampling_defaults = {"cfg_scale": 5.0, "temperature": 1.0}

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        inner = model.model
        self.lm, self.head = inner.language_model, inner.generation_head
        self.device = next(model.parameters()).device
        self.vocab_size = inner.generation_embeddings.num_embeddings
        n = model.config.vision_config.num_image_tokens
        side = int(round(n ** 0.5))
        if side * side != n:
            raise CheckpointError(f"Janus config: {n} image tokens is not a square grid")
        self.layout = TokenLayout.raster(side, side, self.vocab_size)
        self.bos = tokenizer.bos_token_id
        self.boi = tokenizer.convert_tokens_to_ids(BOI)
        pad = tokenizer.convert_tokens_to_ids(PAD)
        self.pad = pad if pad != tokenizer.unk_token_id else tokenizer.pad_token_id
        if self.boi in (None, tokenizer.unk_token_id):
            raise CheckpointError(f"Janus tokenizer has no {BOI} token")
        self.cache = None

    def check_conditions(self, conditions, negatives):
        if negatives is not None:
            raise ValueError("Janus has no negative prompt: leave it empty")
        bad = [c for c in conditions if not isinstance(c, str)]
        if bad:
            raise ValueError(f"prompt must be text for Janus (got {shorten(bad[0])})")

    def prompt_ids(self, prompt: str) -> list[int]:
        """The reference prompt: BOS, the chat template around the stripped text (an empty text
        leaves the user turn empty), ``<begin_of_image>``."""
        text = prompt.strip()
        turn = TEMPLATE.format(prompt=text) if text else EMPTY_TEMPLATE
        return [self.bos] + self.tokenizer(turn, add_special_tokens=False).input_ids + [self.boi]

    def unconditional_ids(self, prompt_ids: list[int]) -> list[int]:
        """The reference's unconditional row: BOS and ``<begin_of_image>`` kept, every position between padded."""
        return [prompt_ids[0]] + [self.pad] * (len(prompt_ids) - 2) + [prompt_ids[-1]]

    @torch.no_grad()
    def prefill(self, conditions, negatives, guided):
        rows = [self.prompt_ids(p) for p in conditions]
        if guided:
            rows += [self.unconditional_ids(r) for r in rows]
        width = max(map(len, rows))
        ids = torch.tensor([[self.pad] * (width - len(r)) + r for r in rows], device=self.device)
        pad_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
        self.batch = len(conditions)
        self.prompt_lengths = pad_mask[: self.batch].sum(1).cpu()
        self.prompt_rows = (ids, pad_mask)  # a draft head that reads the prompt takes them
        self.cache = self._new_cache(self.lm, len(rows), width)
        embeds = self.model.get_input_embeddings()(ids)
        hidden = self._keep(self.lm(inputs_embeds=embeds, **self.cache.prefill_inputs(pad_mask)).last_hidden_state)
        self.cache.commit()
        return self._logits(hidden[:, -1])

    @torch.no_grad()
    def _hidden(self, tokens, cache_inputs):
        rows = self.cache.kv.rows
        embeds = self.model.prepare_embeddings_for_image_generation(tokens.repeat(rows // tokens.shape[0], 1))
        return self.lm(inputs_embeds=embeds, **cache_inputs).last_hidden_state

    @torch.no_grad()
    def input_embeddings(self):  # image tokens enter through the generation embedding and aligner
        ids = torch.arange(self.vocab_size, device=self.device).unsqueeze(0)
        return self.model.prepare_embeddings_for_image_generation(ids)[0]

    def token_vectors(self):
        book = self.model.model.vqmodel.quantize.embedding.weight.detach().float()
        return torch.arange(book.shape[0]), torch.nn.functional.normalize(book, dim=-1)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``[B, rows, cols]`` -> images ``[B, 3, H, W]`` in [0, 1]."""
        pixels = self.model.model.vqmodel.decode(tokens.flatten(1).to(self.device))
        return unit_range((pixels.float() + 1) / 2)


def load(folder, device="cpu", dtype=torch.float32):
    from .base import LoadedModel, vq_decoder_bytes

    model, tokenizer = load_model(folder, device, dtype)
    adapter = JanusAdapter(model, tokenizer)
    side = adapter.layout.grid[0]
    down = 2 ** (len(model.config.vq_config.channel_multiplier) - 1)
    return LoadedModel(family="janus", name=f"Janus ({pathlib.Path(folder).name})", adapter=adapter,
                       decode=adapter.decode, condition="text", resolutions=(side * down,),
                       info={"resolution": side * down, "grid": side}, modules={"janus": model},
                       decode_bytes_per_image=vq_decoder_bytes(model.config.vq_config, side * down,
                                                               full_dtype(dtype, device)))


def _detect(path: pathlib.Path) -> Detected | None:
    model_type = (transformers_config(path) or {}).get("model_type")
    return Detected("janus", path, model_type) if model_type in ("janus", "multi_modality") else None


FAMILY = Family(
    "janus", detect=_detect,
    needs="a Janus / Janus-Pro folder: config.json with model_type 'janus' (converted) or 'multi_modality' "
          "(deepseek-ai original), weights and tokenizer files",
    load=lambda hit, o: load(hit.path, o.device, o.storage or o.dtype))
