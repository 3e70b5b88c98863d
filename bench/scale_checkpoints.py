"""Random-weight checkpoints with the real 7B / 8B configurations, in each family's release layout.

    python -m spec_ar.bench.scale_checkpoints --family janus-pro-7b --out DIR [--layout converted|original]
        [--dtype bfloat16] [--scale 1.0] [--seed 0] [--shard-gb 5] [--check]

Families (``--layout``, the first one the default: the layout the main release ships):

* ``janus-pro-7b``: ``original`` (deepseek-ai/Janus-Pro-7B: ``model_type: multi_modality``, torch pickle shards
  ``pytorch_model-0000X-of-0000N.bin`` + ``pytorch_model.bin.index.json``, original key names with the fused
  SigLIP ``qkv``, the unused ``attn_pool`` head and the VQ's ``codebook_used`` buffer) or ``converted``
  (deepseek-community/Janus-Pro-7B: ``model_type: janus``, safetensors shards + index);
* ``lumina-mgpt-7b-768``: ``original`` (Alpha-VLLM/Lumina-mGPT-7B-768 as Lumina saves it: ``ChameleonXLLMX``
  config, q/k norms ``[model_parallel_size, head_dim]`` (:func:`..loaders.chameleon.norm_repeats`), no
  ``model.vqmodel.*``) or ``converted`` (transformers' Chameleon save, q/k norms per head);
  both with Meta's VQGAN in ``tokenizer/vqgan.yaml`` + ``vqgan.ckpt``;
* ``anole-7b``: ``original`` (GAIR/Anole-7b-v0.1 in Meta's layout: ``models/7b/params.json`` +
  ``consolidated.pth``, ``tokenizer/text_tokenizer.json``, ``tokenizer/vqgan.*``) or ``converted``
  (transformers' Chameleon save);
* ``emu3-gen``: ``converted`` (Emu3-community/Emu3-Gen-hf, 8B: ``model_type: emu3``, the MoVQ VAE included,
  vocab.json + merges.txt tokenizer);
* ``liquid-7b``: ``original`` (Junfeng5/Liquid_V1_7B: ``GemmaForCausalLM``, Gemma-7B's vocabulary grown by the
  8192 VQ codes, tied embeddings, a Gemma tokenizer.json with ``<boi>`` / ``<eoi>`` / ``<unconditional>`` at ids
  7-9), with Meta's VQGAN in ``chameleon/vqgan.yaml`` + ``vqgan.ckpt`` where Liquid's script reads it;
* ``lumina-mgpt-2.0``: ``original`` (Alpha-VLLM/Lumina-mGPT-2.0 as the authors' fork saves it:
  ``ChameleonXLLMX`` config with the fork's fields, q/k norms ``[model_parallel_size, head_dim]``, no VQ-VAE, a
  Qwen2.5-sized tokenizer with Chameleon's specials, image ids 155000 + code named by no entry; its text
  model's sizes assumed, see [A]), with SBER-MoVQGAN 270M's decoder in ``movqgan/270M/movqgan_270M.ckpt``;
* ``simplear-1.5b``: ``original`` (Daniel0724/SimpleAR-1.5B-RL: ``SimpARForCausalLM`` / ``model_type: qwen2``,
  Qwen2.5-1.5B's vocabulary grown by SimpleAR's 7 specials and the 64,000 codes, tied embeddings, a Qwen2.5-sized
  byte-level tokenizer), with NVIDIA's Cosmos DV8x16x16 ``decoder.jit`` (TorchScript, the release's size) in the
  folder, where ``spec-ar download`` puts it.

Tensor names and shapes come from the transformers model built on the meta device from the configuration
(:data:`CONFIGS`), mapped to the original names where a layout needs them; nothing is allocated for them.
Weights are written tensor by tensor: safetensors files are streamed in chunks of :data:`CHUNK` elements (the
header is known in advance), torch pickles (``.bin``, ``.pth``, ``.ckpt``) are written as torch.save writes them
(``data.pkl`` pickled from placeholders, then one zip record per tensor), so the writer holds one chunk
(safetensors) or one tensor (torch pickles) at a time.  Values: ``normal_(0, 0.02)`` per tensor from a
generator seeded by ``--seed`` and the tensor's name, norms 1, biases 0 (an initialised model: finite
activations), convolution kernels ``1 / sqrt(fan_in)`` and VQ codebooks 1 (so VQ decoders make varied
pictures).  Tensors that hold the same weights in two layouts (Janus' original vs converted names, Meta's
interleaved ``wq`` rows vs transformers' half-split ones) are drawn from the same seeds, so both layouts of
a family load to the same model.

Tokenizers are built offline (byte-level BPE over the 256 byte symbols and a few merges, unreachable filler
entries up to the real vocabulary size) with the special tokens at their real ids where known (see
:data:`CONFIGS`).  ``--scale s`` shrinks widths (whole heads of the real head size) and depths by ``s`` (at
least one of each), keeping vocabularies, codebooks, downsampling and image grids; ``--check`` reads back
only the headers and indexes (no weights) and checks them against the loaders' key mappings.
Prints the bytes written, the time and the writer's peak resident memory (:func:`peak_rss`).
"""
from __future__ import annotations

import argparse
import collections
import contextvars
import json
import math
import os
import pathlib
import pickle
import queue
import re
import resource
import struct
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

import torch

# -- the configurations ------------------------------------------------------------------------------------------
# Sources (each value below names one):
#  [T]  the defaults of transformers' config classes (read in transformers 5.24; tests/test_scale_checkpoints.py
#       checks them against the installed version): ChameleonConfig / ChameleonVQVAEConfig are Chameleon-7B's,
#       Emu3TextConfig / Emu3VQVAEConfig Emu3's (checkpoint Emu3-community/Emu3-Chat-hf, the same 8B architecture
#       as Emu3-Gen), JanusVisionConfig / JanusVQVAEConfig the Janus-Pro towers (1B projection widths).
#  [C]  transformers' converters: convert_chameleon_weights_to_hf.py (VOCAB_SIZE 65536, FFN width
#       multiple_of * ceil(int(multiplier * int(8 * dim / 3)) / multiple_of), max_position_embeddings 4096 for
#       rope_theta 10000, tokenizer pad id 1, <reserved08707> -> <image>); convert_janus_weights_to_hf.py (the
#       7B projection widths are the original config's aligner / gen_aligner / gen_head n_embed = LLM width);
#       convert_emu3_weights_to_hf.py (tokenizer files, specials <|extra_203|> BOS, <|extra_204|> EOS,
#       <|endoftext|> pad).
#  [N]  /work/shared/notes/model-formats.md and the loaders' docstrings (token ids read from the references:
#       Janus pad 100015, <begin_of_image> 100016; Chameleon image ids 4..8195, <eoss> 8196, <racm3:break> 8197,
#       <reserved08706> 8710, <reserved08799> 8803; Emu3's BAAI special ids from 151643; image grids).
#  [R]  the release's own config.json as published (deepseek-ai/Janus-Pro-7B language_config: 30 layers, width
#       4096, FFN 11008, 32 heads, vocab 102400, 16384 positions; the DeepSeek-LLM-7B base) -- recalled, not
#       re-read offline; the parameter count it gives (7.42B) matches the release's.
#  [D]  derived, not read anywhere: ids the references do not fix (Janus <|User|>, <|Assistant|>,
#       <end_of_image>; Chameleon's <s>/</s>/<unk> and the IMGIMG code order; Emu3's order of
#       <|image start|>, <|image end|>, <|image token|> and the visual tokens after the 208 BAAI specials,
#       which exactly fills vocab 184622).
#  [M]  Lumina-mGPT 2.0's code (Alpha-VLLM/Lumina-mGPT-2.0 @f44a4d7): image ids 155000 + code (16384 codes, its
#       logits processor), <racm3:break> 151665, <eoss> 151666, <reserved08799> 151670 (hard-coded in
#       inference_solver.py), the MoVQGAN 270M ddconfig (movqgan/__init__.py).
#  [A]  assumed: what no published file here fixes.  Lumina-mGPT 2.0's config.json is not in its repository (its
#       training builds the model from a config_new.json it does not ship): the text model is taken as Chameleon-7B
#       (the architecture the authors forked, "7B" in their report), its vocabulary the smallest multiple of 1024
#       past the last image id (172032), 10240 positions (its generate() allows 10240 new tokens).
#  [S]  SimpleAR's code (wdrink/SimpleAR @d56b6e5): the tokenizer grows by 7 specials (<|t2i|> ... <|sov|>) after
#       Qwen2.5's 151665 ids and the embedding by len(tokenizer) + 64000 (train.py); NVIDIA's DV config
#       (Cosmos-Tokenizer networks/configs.py ``discrete_video``, bench/cosmos_archive.DV).
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
    "emu3-gen": {
        "release": "Emu3-community/Emu3-Gen-hf (BAAI/Emu3-Gen converted), 8B",
        "layouts": ("converted",),
        "text": dict(vocab_size=184622, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,  # [T]
                     num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=9216,  # [T]
                     rms_norm_eps=1e-5, rope_theta=1000000.0),  # [T]
        "vq": dict(codebook_size=32768, embed_dim=4, latent_channels=4, base_channels=256,  # [T], [N]
                   channel_multiplier=[1, 2, 2, 4], num_res_blocks=2, attn_resolutions=[3], hidden_size=1024,
                   num_attention_heads=1, temporal_downsample_factor=4),  # [T] (downsample 8 [N])
        "image_tokens": 8190,  # 720 px: 90 rows of 90 + end-of-line [N]
        "ids": {"<|endoftext|>": 151643, "<|extra_200|>": 151846, "<|extra_201|>": 151847,  # [N], [C]
                "<|extra_203|>": 151849, "<|extra_204|>": 151850,  # BOS / EOS = Emu3TextConfig's [T]
                "<|image start|>": 151851, "<|image end|>": 151852, "<|image token|>": 151853,  # [D]
                "<|visual token 000000|>": 151854},  # codes in order up to 184621 [D]
        "shard_gb": {"converted": 5.0},
    },
    "lumina-mgpt-2.0": {
        "release": "Alpha-VLLM/Lumina-mGPT-2.0 (7B, the authors' Chameleon fork) + ai-forever/MoVQGAN 270M",
        "layouts": ("original",),
        "text": dict(vocab_size=172032, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,  # [A]
                     num_key_value_heads=32, max_position_embeddings=10240, rms_norm_eps=1e-5,  # [A]
                     rope_theta=10000.0, multiple_of=256, ffn_dim_multiplier=1.0),  # -> FFN 11008 [A]
        "movqgan": dict(ch=256, ch_mult=(1, 2, 2, 4), num_res_blocks=2, attn_levels=(3,), z_channels=4,  # [M]
                        embed_dim=4, n_embed=16384),  # [M]
        "image_tokens": 9315,  # 768 px: 96 rows of 96 + row end, 2 size tokens, end [M]
        "ids": {"<|endoftext|>": 151643, "<racm3:break>": 151665, "<eoss>": 151666, "<reserved08796>": 151667,  # [M]
                "<reserved08797>": 151668, "<reserved08798>": 151669, "<reserved08799>": 151670,  # [M]
                "<reserved08706>": 151671},  # [D]; the size tokens <reserved08800 + n> follow [D]
        "image_base": 155000,  # [M]
        "shard_gb": {"original": 5.0},
    },
    "liquid-7b": {
        "release": "Junfeng5/Liquid_V1_7B (Gemma-7B + 8192 image codes), 8.5B",
        "layouts": ("original",),
        "text": dict(vocab_size=264192, hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,  # [T], [N]
                     num_attention_heads=16, num_key_value_heads=16, head_dim=256, max_position_embeddings=8192,
                     rms_norm_eps=1e-6, rope_theta=10000.0),  # GemmaConfig's defaults are Gemma-7B's [T]
        "text_ids": 256000,  # Gemma's tokenizer; image token = 256000 + code [N]
        "vq": dict(embed_dim=256, n_embed=8192, z_channels=256, ch=128, ch_mult=[1, 1, 2, 2, 4],  # [T], [N]
                   num_res_blocks=2, attn_resolutions=[], resolution=512),  # Chameleon's VQGAN [N]
        "image_tokens": 1024,  # 32 x 32 at 512 px [N]
        "ids": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4, "<2mass>": 5, "[@BOS@]": 6,  # [R]
                "<boi>": 7, "<eoi>": 8, "<unconditional>": 9},  # [N]
        "shard_gb": {"original": 5.0},
    },
    "simplear-1.5b": {
        "release": ("Daniel0724/SimpleAR-1.5B-RL (Qwen2.5-1.5B + 64000 image codes) + "
                    "nvidia/Cosmos-1.0-Tokenizer-DV8x16x16"),
        "layouts": ("original",),
        "text": dict(vocab_size=151672 + 64000, hidden_size=1536, intermediate_size=8960,  # [S], [R]
                     num_hidden_layers=28,  # [R]
                     num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=131072,  # [R] Qwen2.5-1.5B
                     rms_norm_eps=1e-6, rope_theta=1000000.0),  # [R]
        "text_ids": 151672,  # [S]
        "cosmos": {"n_embed": 64000},  # the decoder: bench/cosmos_archive.DV [S]
        "image_tokens": 4096,  # 64 x 64 at 1024 px [S]
        "ids": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,  # [R]
                "<|t2i|>": 151665, "<|i2t|>": 151666, "<|soi|>": 151667, "<|vtokens|>": 151668,  # [S]
                "<|t2v|>": 151669, "<|v2t|>": 151670, "<|sov|>": 151671},  # [S]
        "shard_gb": {"original": 5.0},
    },
}
ALIASES = {"janus": "janus-pro-7b", "janus-pro": "janus-pro-7b", "lumina": "lumina-mgpt-7b-768",
           "lumina-mgpt": "lumina-mgpt-7b-768", "anole": "anole-7b", "emu3": "emu3-gen", "emu3-gen-8b": "emu3-gen",
           "liquid": "liquid-7b", "lumina2": "lumina-mgpt-2.0", "simplear": "simplear-1.5b"}
FAMILY_OF = {"janus-pro-7b": "janus", "lumina-mgpt-7b-768": "lumina", "anole-7b": "anole", "emu3-gen": "emu3",
             "liquid-7b": "liquid", "lumina-mgpt-2.0": "lumina2", "simplear-1.5b": "simplear"}

CHUNK = 1 << 23  # elements drawn (and written) at a time: 16 MB of bfloat16
STD = 0.02
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
ST_DTYPE = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64"}
STORAGE = {torch.bfloat16: "BFloat16Storage", torch.float16: "HalfStorage", torch.float32: "FloatStorage",
           torch.int64: "LongStorage"}


# -- tensors to write --------------------------------------------------------------------------------------------
@dataclass
class TensorSpec:
    """One tensor of a file: its name and shape, how it is initialised (``normal``, ``ones``, ``zeros``), the
    seed keys its values are drawn from in order (one key: the whole tensor; several: equal parts along dim 0,
    e.g. a fused q|k|v), and a rearrangement applied to the whole tensor (only in torch pickles)."""

    name: str
    shape: tuple[int, ...]
    init: str = "normal"
    dtype: torch.dtype | None = None  # None: the run's dtype
    sources: tuple[str, ...] = ()
    rearrange: Callable[[torch.Tensor], torch.Tensor] | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def nbytes(self, dtype: torch.dtype) -> int:
        return self.numel * (self.dtype or dtype).itemsize


def init_of(name: str, shape) -> str:
    """Norm weights 1, biases 0, batch-norm statistics those of a fresh BatchNorm (mean 0, variance 1, count 0),
    the training statistic ``codebook_used`` 0, everything else normal."""
    if name.endswith((".bias", "codebook_used", "running_mean", "num_batches_tracked")):
        return "zeros"
    if name.endswith("running_var"):
        return "ones"
    leaf = name.rsplit(".", 2)
    if name.endswith(".weight") and ("norm" in leaf[-2] or "normalization" in leaf[-2]) and (
            len(shape) == 1 or re.search(r"[qk]_norm\.weight$", name)):
        return "ones"
    return "normal"


def std_of(name: str, shape) -> float:
    """:data:`STD` (transformers' ``initializer_range``) for embeddings and linear layers; convolution kernels
    ``1 / sqrt(fan_in)`` and VQ codebooks unit scale, so that the VQ decoders' activations keep their size
    (at 0.02 they vanish in Emu3's spatially-conditioned norms and every picture comes out flat grey)."""
    if name.endswith("quantize.embedding.weight"):
        return 1.0
    if len(shape) >= 3 and name.endswith(".weight"):
        return 1.0 / math.sqrt(math.prod(shape[1:]))
    return STD


def specs_of(state: dict[str, torch.Tensor]) -> list[TensorSpec]:
    """The tensors of a (meta-device) state dict; integer buffers (BatchNorm's ``num_batches_tracked``) keep
    their dtype, floating ones take the run's."""
    return [TensorSpec(k, tuple(v.shape), init_of(k, v.shape), dtype=None if v.is_floating_point() else v.dtype)
            for k, v in state.items()]


def _generator(seed: int, key: str) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(key.encode())) & 0x7FFF_FFFF_FFFF_FFFF)


def _parts(spec: TensorSpec) -> list[tuple[str, int]]:
    keys = spec.sources or (spec.name,)
    return [(k, spec.numel // len(keys)) for k in keys]


def _draws(spec: TensorSpec, seed: int):
    """``(count, generator)`` per piece: each seed key's generator draws :data:`CHUNK`-sized pieces in order,
    so the values are the same however the pieces are gathered (streamed, or into one tensor)."""
    for key, n in _parts(spec):
        g = _generator(seed, key) if spec.init == "normal" else None
        for start in range(0, n, CHUNK):
            yield min(CHUNK, n - start), g


def _fill(view: torch.Tensor, spec: TensorSpec, g) -> None:
    if spec.init == "ones":
        view.fill_(1)
    elif spec.init == "zeros":
        view.zero_()
    else:
        view.normal_(0.0, std_of(spec.name, spec.shape), generator=g)


class _Ring:
    """A few reusable chunk buffers per dtype, handed out in turn (and :class:`_Arena` for whole tensors): with
    a fresh tensor for every piece or tensor, glibc's heap grew with the bytes written (sizes under its 32 MB
    mmap threshold are carved from the heap and, interleaved with small allocations, not all given back): a
    full-size Janus writer passed 4 GB.  ``size`` must exceed the buffers in flight (queued + being written +
    being filled)."""

    def __init__(self, size: int = 4):
        self.size, self.buffers, self.turn = size, {}, 0

    def next(self, dtype: torch.dtype, n: int) -> torch.Tensor:
        if dtype.itemsize > 4:  # int64 counters: a few elements, not worth 4 x 64 MB of buffers
            return torch.empty(n, dtype=dtype)
        if dtype not in self.buffers:
            self.buffers[dtype] = [torch.empty(CHUNK, dtype=dtype) for _ in range(self.size)]
        ring = self.buffers[dtype]
        self.turn = (self.turn + 1) % self.size
        return ring[self.turn][:n]


def chunks(spec: TensorSpec, dtype: torch.dtype, seed: int, ring: _Ring | None = None):
    """The tensor's values, flat, in pieces of at most :data:`CHUNK` elements (drawn into ``ring``'s
    buffers when given: a piece is valid until ``ring.size - 1`` further pieces are drawn)."""
    dtype = spec.dtype or dtype
    for m, g in _draws(spec, seed):
        view = ring.next(dtype, m) if ring is not None else torch.empty(m, dtype=dtype)
        _fill(view, spec, g)
        yield view


class _Arena:
    """One reusable byte buffer, grown to the largest request: whole tensors drawn into it one after another."""

    def __init__(self):
        self.buffer = torch.empty(0, dtype=torch.uint8)

    def take(self, nbytes: int) -> torch.Tensor:
        if self.buffer.numel() < nbytes:
            self.buffer = torch.empty(0, dtype=torch.uint8)  # the old one first
            self.buffer = torch.empty(nbytes, dtype=torch.uint8)
        return self.buffer[:nbytes]


def materialize(spec: TensorSpec, dtype: torch.dtype, seed: int, arena: _Arena | None = None,
                scratch: _Arena | None = None) -> torch.Tensor:
    """The whole tensor (for a torch pickle record), in ``arena``'s buffer when given (valid until the next
    call), rearranged through ``scratch``'s."""
    dtype = spec.dtype or dtype
    nbytes = spec.numel * dtype.itemsize
    flat = (arena.take(nbytes).view(dtype) if arena is not None else torch.empty(spec.numel, dtype=dtype))
    at = 0
    for m, g in _draws(spec, seed):
        _fill(flat[at:at + m], spec, g)
        at += m
    out = flat.view(spec.shape)
    if spec.rearrange is None:
        return out
    view = spec.rearrange(out)  # a view whose row-major order is the tensor to write
    dst = scratch.take(nbytes).view(dtype) if scratch is not None else torch.empty(spec.numel, dtype=dtype)
    dst.view(view.shape).copy_(view)
    return dst.view(spec.shape)


# -- writers -----------------------------------------------------------------------------------------------------
class Stats:
    """Bytes and files written."""

    def __init__(self):
        self.bytes, self.files = 0, []

    def add(self, path: pathlib.Path):
        self.files.append(path)
        self.bytes += path.stat().st_size


def _release_cache(f) -> None:
    """Flush to disk and drop the file's pages from the page cache (other processes share the memory)."""
    f.flush()
    os.fsync(f.fileno())
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


class _BackgroundWriter:
    """Writes buffers to a file on a second thread (drawing and writing overlap), two pieces in flight at most."""

    IN_FLIGHT = 2  # queued pieces; one more is being written

    def __init__(self, f):
        self.f, self.q, self.error = f, queue.Queue(maxsize=self.IN_FLIGHT), None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            if self.error is None:
                try:
                    self.f.write(item)
                except BaseException as err:  # reported by close()
                    self.error = err

    def write(self, tensor: torch.Tensor):
        if self.error is not None:
            raise self.error
        self.q.put(tensor.contiguous().view(torch.uint8).numpy())

    def close(self):
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


def write_holes(path: pathlib.Path, shapes: dict[str, tuple[int, ...]], dtype: str = "BF16") -> int:
    """A safetensors file declaring ``shapes`` whose data is a sparse hole (every value zero): a model of
    any size on disk in no space, for what reads headers (detection, sizing) or redraws the values after
    loading.  Returns the bytes it declares."""
    itemsize = {"BF16": 2, "F16": 2, "F32": 4}[dtype]
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = itemsize * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    return offset


def llamagen_shapes(dim: int, layers: int, ffn: int, vocab: int = 16384, classes: int = 1000) -> dict:
    """Tensor shapes of a LlamaGen c2i GPT of the given size (its checkpoint names)."""
    shapes = {"tok_embeddings.weight": (vocab, dim), "cls_embedding.embedding_table.weight": (classes + 1, dim),
              "norm.weight": (dim,), "output.weight": (vocab, dim)}
    for i in range(layers):
        shapes.update({f"layers.{i}.{key}": shape for key, shape in (
            ("attention.wqkv.weight", (3 * dim, dim)), ("attention.wo.weight", (dim, dim)),
            ("feed_forward.w1.weight", (ffn, dim)), ("feed_forward.w3.weight", (ffn, dim)),
            ("feed_forward.w2.weight", (dim, ffn)), ("attention_norm.weight", (dim,)), ("ffn_norm.weight", (dim,)))})
    return shapes


#: set by ``write(..., holes=True)``: safetensors weights written as headers over sparse holes (all zeros)
_HOLES = contextvars.ContextVar("holes", default=False)


def write_safetensors(path: pathlib.Path, specs: list[TensorSpec], dtype: torch.dtype, seed: int,
                      metadata: dict | None = None) -> None:
    """A safetensors file written as a stream: 8-byte little-endian header length, the JSON header (names,
    dtypes, shapes, byte ranges; padded with spaces to 8 bytes), then each tensor's bytes in order."""
    header, offset = {"__metadata__": metadata or {"format": "pt"}}, 0
    for s in specs:
        if s.rearrange is not None:
            raise ValueError(f"{s.name}: a rearranged tensor cannot be streamed")
        n = s.nbytes(dtype)
        header[s.name] = {"dtype": ST_DTYPE[s.dtype or dtype], "shape": list(s.shape), "data_offsets": [offset,
                                                                                                         offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    if _HOLES.get():  # the header, then a sparse hole: the file's size in no space, every value zero
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)
        return
    ring = _Ring(_BackgroundWriter.IN_FLIGHT + 2)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        out = _BackgroundWriter(f)
        try:
            for s in specs:
                for piece in chunks(s, dtype, seed, ring):
                    out.write(piece)
        finally:
            out.close()
        _release_cache(f)


class _Storage:
    """Stands for a tensor's storage in the pickle (``persistent_id`` names it, as torch.save does)."""

    def __init__(self, key: str, dtype: torch.dtype, numel: int):
        self.key, self.dtype, self.numel = key, dtype, numel


class _Tensor:
    """Pickles as torch.save pickles a contiguous CPU tensor: ``_rebuild_tensor_v2(storage, 0, size, stride,
    False, OrderedDict())``."""

    def __init__(self, storage: _Storage, shape: tuple[int, ...]):
        self.storage, self.shape = storage, tuple(shape)

    def __reduce_ex__(self, protocol):
        stride, acc = [], 1
        for d in reversed(self.shape):
            stride.append(acc)
            acc *= d
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, self.shape, tuple(reversed(stride)), False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", getattr(torch, STORAGE[obj.dtype]), obj.key, "cpu", obj.numel)
        return None


def write_torch(path: pathlib.Path, tree, dtype: torch.dtype, seed: int) -> None:
    """A torch.save zip file of ``tree`` (dicts / lists with :class:`TensorSpec` leaves and plain values),
    written without holding more than one tensor: the pickle refers to storages by key, then each
    tensor is drawn and written as its own record."""
    import io

    specs: list[tuple[_Storage, TensorSpec]] = []

    def convert(node):
        if isinstance(node, TensorSpec):
            storage = _Storage(str(len(specs)), node.dtype or dtype, node.numel)
            specs.append((storage, node))
            return _Tensor(storage, node.shape)
        if isinstance(node, dict):
            return {k: convert(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(convert(v) for v in node)
        return node

    obj = convert(tree)
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(obj)  # torch.save's default protocol
    data = buf.getvalue()
    with torch.serialization._open_zipfile_writer(str(path)) as zf:  # what torch.save itself uses
        zf.write_record("data.pkl", data, len(data))
        zf.write_record(".format_version", "1", 1)
        alignment = getattr(torch.serialization, "_get_storage_alignment", None)
        if alignment is not None:
            text = str(alignment())
            zf.write_record(".storage_alignment", text, len(text))
        zf.write_record("byteorder", sys.byteorder, len(sys.byteorder))
        arena, scratch = _Arena(), _Arena()  # reused: one allocation of the largest tensor
        for storage, spec in specs:
            tensor = materialize(spec, dtype, seed, arena, scratch)
            at = tensor.storage_offset() * tensor.element_size()  # the arena's bytes that hold it: a view
            zf.write_record(f"data/{storage.key}", tensor.untyped_storage()[at:at + tensor.nbytes], tensor.nbytes)
            del tensor
    with open(path, "rb+") as f:
        _release_cache(f)


def shard(specs: list[TensorSpec], dtype: torch.dtype, max_bytes: float | None) -> list[list[TensorSpec]]:
    """save_pretrained's split: in order, a new shard when the next tensor would pass ``max_bytes``."""
    shards, size = [[]], 0
    for s in specs:
        n = s.nbytes(dtype)
        if max_bytes and shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += n
    return shards


def write_sharded(folder: pathlib.Path, specs: list[TensorSpec], dtype: torch.dtype, seed: int,
                  max_bytes: float | None, kind: str, stats: Stats, log=print) -> list[pathlib.Path]:
    """transformers' sharded layout: ``model-0000X-of-0000N.safetensors`` + ``model.safetensors.index.json``
    (``kind`` "safetensors") or ``pytorch_model-0000X-of-0000N.bin`` + ``pytorch_model.bin.index.json``
    ("bin"); one file without an index when it fits one shard."""
    parts = shard(specs, dtype, max_bytes)
    stem, suffix = ("model", "safetensors") if kind == "safetensors" else ("pytorch_model", "bin")
    names = ([f"{stem}.{suffix}"] if len(parts) == 1 else
             [f"{stem}-{i + 1:05d}-of-{len(parts):05d}.{suffix}" for i in range(len(parts))])
    weight_map, paths = {}, []
    for name, part in zip(names, parts):
        path = folder / name
        t = time.perf_counter()
        if kind == "safetensors":
            write_safetensors(path, part, dtype, seed)
        else:
            write_torch(path, {s.name: s for s in part}, dtype, seed)
        stats.add(path)
        paths.append(path)
        weight_map.update({s.name: name for s in part})
        log(f"  {name}: {len(part)} tensors, {path.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t:.1f} s, "
            f"peak RSS so far {peak_rss() / 2**30:.2f} GiB")
    if len(parts) > 1:
        index = folder / f"{stem}.{suffix}.index.json"
        total = sum(s.nbytes(dtype) for s in specs)
        index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        stats.add(index)
    return paths


def peak_rss() -> int:
    """This process's peak resident memory in bytes: Linux's ``VmHWM`` (the high-water mark of this program's
    memory), else ``getrusage``'s ``ru_maxrss`` (KiB on Linux, bytes on macOS).  On Linux ``ru_maxrss``
    carries over through exec, so a writer started from a big process (a test runner holding models) would
    report its parent's peak; ``VmHWM`` starts afresh with the program."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def _json(path: pathlib.Path, obj, stats: Stats) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False))
    stats.add(path)


# -- scaling -----------------------------------------------------------------------------------------------------
def _n(value: int, scale: float, minimum: int = 1) -> int:
    return max(minimum, int(round(value * scale)))


def _channels(value: int, scale: float, multiple: int = 32) -> int:
    """Convolution widths: multiples of 32 (GroupNorm's groups), at least 32."""
    return max(multiple, multiple * int(round(value * scale / multiple)))


def scaled_text(text: dict, scale: float) -> dict:
    """The LLM at ``scale``: whole heads of the real head size, the kv heads' share kept, depth scaled."""
    t = dict(text)
    if scale == 1.0:
        return t
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    ratio = text["num_attention_heads"] // text["num_key_value_heads"]
    heads = _n(text["num_attention_heads"], scale)
    kv = max(1, heads // ratio)
    heads = kv * ratio if heads >= ratio else heads
    t.update(num_attention_heads=heads, num_key_value_heads=kv if heads % kv == 0 else heads,
             hidden_size=heads * head_dim, num_hidden_layers=_n(text["num_hidden_layers"], scale))
    if "intermediate_size" in text:  # Meta's formula otherwise (multiple_of, ffn_dim_multiplier)
        t["intermediate_size"] = 256 * -(-int(text["intermediate_size"] * t["hidden_size"] / text["hidden_size"])
                                         // 256)
    return t


def meta_ffn(dim: int, multiplier: float, multiple_of: int) -> int:
    """Meta's SwiGLU width (= chameleon_meta.ffn_width): 11008 for dim 4096."""
    return multiple_of * -(-int(multiplier * int(8 * dim / 3)) // multiple_of)


# -- tokenizers --------------------------------------------------------------------------------------------------
def byte_symbols() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for bytes (GPT-2's table)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


#: merges of the small byte-level BPE (Ġ space, Ċ newline): enough that prompts merge somewhat
MERGES = [("Ċ", "Ċ"), ("Ġ", "a"), ("Ġ", "c"), ("a", "t"), ("Ġc", "at"), ("Ġ", "r"), ("e", "d"), ("Ġr", "ed"),
          ("9", "0"), ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("o", "r")]


def text_vocabulary(size: int, start: int = 0, taken=()) -> dict[str, int]:
    """Byte symbols, merged tokens, then unreachable fillers: ``size`` entries with ids from ``start``."""
    vocab, taken = {}, set(taken)
    for s in byte_symbols() + [a + b for a, b in MERGES]:
        if s not in vocab:
            vocab[s] = start + len(vocab)
    while len(vocab) < size:
        name = f"ĠTOK{start + len(vocab)}"
        vocab[name if name not in taken else name + "_"] = start + len(vocab)
    return vocab


def fill_ids(vocab: dict[str, int], upto: int, pattern: str) -> dict[str, int]:
    """``vocab`` plus named fillers for every id below ``upto`` it lacks (ids must be contiguous)."""
    have = set(vocab.values())
    out = dict(vocab)
    for i in range(upto):
        if i not in have:
            out[pattern.format(i)] = i
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def _bpe(vocab: dict[str, int], added: list[str], bos: str | None = None):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    merges = [(a, b) for a, b in MERGES if a in vocab and b in vocab and a + b in vocab]
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(a, special=True, normalized=False) for a in added])
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    return tok


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
    tok = _bpe(vocab, [n for n in vocab if vocab[n] >= 100000], bos=names[0])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=names[0], eos_token=names[1], pad_token=names[2],
                                   additional_special_tokens=["<|User|>", "<|Assistant|>", "<begin_of_image>",
                                                              "<end_of_image>", "<image_placeholder>"],
                                   model_max_length=16384)
    _save_tokenizer(fast, folder, stats)
    return vocab


def _save_tokenizer(fast, folder: pathlib.Path, stats: Stats) -> None:
    for path in fast.save_pretrained(str(folder)):
        if pathlib.Path(path).is_file() and pathlib.Path(path) not in stats.files:
            stats.add(pathlib.Path(path))


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
    return _bpe(vocab, [n for n in vocab if n.startswith("<") and n.endswith(">")])


def write_chameleon_tokenizer(folder: pathlib.Path, vocab: dict[str, int], stats: Stats) -> None:
    """As transformers' converter saves it (``LlamaTokenizerFast`` from text_tokenizer.json: sep
    <reserved08706>, pad <pad>)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=chameleon_tokenizer(vocab), bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>", sep_token="<reserved08706>")
    _save_tokenizer(fast, folder, stats)


def emu3_vocabulary(cfg: dict, size: int, codes: int) -> dict[str, int]:
    ids = cfg["ids"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(205)]
    vocab = text_vocabulary(ids["<|endoftext|>"])  # Qwen's 151643 text ids [N]
    vocab.update({s: ids["<|endoftext|>"] + i for i, s in enumerate(specials)})
    for name in ("<|image start|>", "<|image end|>", "<|image token|>"):
        vocab[name] = ids[name]
    first = ids["<|visual token 000000|>"]
    vocab.update({f"<|visual token {c:06d}|>": first + c for c in range(codes)})
    if max(vocab.values()) + 1 != size:
        raise ValueError(f"Emu3 vocabulary: {max(vocab.values()) + 1} ids for vocab_size {size}")
    return vocab


EMU3_NAMED = {"boi_token": "<|image start|>", "eoi_token": "<|image end|>", "eof_token": "<|extra_201|>",
              "image_token": "<image>", "image_wrapper_token": "<|image token|>"}


def write_emu3_tokenizer(folder: pathlib.Path, vocab: dict[str, int], stats: Stats) -> None:
    """As Emu3-Gen-hf holds it: vocab.json (specials included) + merges.txt, a GPT2Tokenizer
    tokenizer_config.json naming the image tokens, every special and visual token an added token, and
    ``<image>`` (the processor's placeholder) added after the model's vocabulary."""
    text_end = vocab["<|endoftext|>"]
    _json(folder / "vocab.json", vocab, stats)
    merges = [(a, b) for a, b in MERGES if a in vocab and b in vocab and a + b in vocab]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    stats.add(folder / "merges.txt")
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for s, i in vocab.items() if i >= text_end}
    added[str(len(vocab))] = {"content": "<image>", "lstrip": False, "normalized": False, "rstrip": False,
                              "single_word": False, "special": True}
    special = {"bos_token": "<|extra_203|>", "eos_token": "<|extra_204|>", "pad_token": "<|endoftext|>",
               "unk_token": "<|endoftext|>"}
    _json(folder / "tokenizer_config.json", {
        "added_tokens_decoder": added, **special, "clean_up_tokenization_spaces": False, "add_prefix_space": False,
        "errors": "replace", "extra_special_tokens": EMU3_NAMED, **EMU3_NAMED, "model_max_length": 1 << 30,
        "processor_class": "Emu3Processor", "tokenizer_class": "GPT2Tokenizer"}, stats)
    _json(folder / "special_tokens_map.json", {**special, **EMU3_NAMED}, stats)


# -- Meta's VQGAN (Chameleon family) -----------------------------------------------------------------------------
def vqgan_spec(cfg: dict, scale: float):
    from ..decoders.vqgan import VQGANSpec

    vq = cfg["vq"]
    return VQGANSpec(embed_dim=_channels(vq["embed_dim"], scale, 8) if scale != 1 else vq["embed_dim"],
                     n_embed=vq["n_embed"], z_channels=_channels(vq["z_channels"], scale) if scale != 1 else
                     vq["z_channels"], ch=_channels(vq["ch"], scale) if scale != 1 else vq["ch"],
                     ch_mult=tuple(vq["ch_mult"]), num_res_blocks=vq["num_res_blocks"],
                     attn_resolutions=tuple(vq["attn_resolutions"]), resolution=vq["resolution"])


def vqgan_yaml(spec) -> str:
    """vqgan.yaml as Meta ships it (taming-transformers keys; ``ckpt_path`` and a loss config, which
    transformers' converter deletes)."""
    ch_mult = "".join(f"\n      - {m}" for m in spec.ch_mult)
    attn = "[" + ", ".join(str(r) for r in spec.attn_resolutions) + "]"
    return f"""model:
  base_learning_rate: 4.5e-06
  target: taming.models.vqgan.VQModel
  params:
    embed_dim: {spec.embed_dim}
    n_embed: {spec.n_embed}
    ddconfig:
      double_z: false
      z_channels: {spec.z_channels}
      resolution: {spec.resolution}
      in_channels: {spec.in_channels}
      out_ch: {spec.out_ch}
      ch: {spec.ch}
      ch_mult:{ch_mult}
      num_res_blocks: {spec.num_res_blocks}
      attn_resolutions: {attn}
      dropout: {spec.dropout}
    lossconfig:
      target: taming.modules.losses.vqperceptual.VQLPIPSWithDiscriminator
      params:
        disc_conditional: false
        disc_in_channels: 3
        disc_start: 100000000
        disc_weight: 0.2
        codebook_weight: 1.0
"""


def vqgan_specs(spec) -> list[TensorSpec]:
    from ..decoders.vqgan import VQGANModel

    with torch.device("meta"):
        model = VQGANModel(spec)
    out = specs_of(model.state_dict())
    for s in out:
        s.dtype = torch.float32  # a training checkpoint: float32 whatever --dtype says
        s.sources = ("vqgan." + s.name,)
    return out


def write_vqgan(folder: pathlib.Path, spec, seed: int, stats: Stats) -> None:
    """``tokenizer/vqgan.yaml`` + ``vqgan.ckpt`` (``{"state_dict": ..., "global_step": ...}``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vqgan.yaml").write_text(vqgan_yaml(spec))
    stats.add(folder / "vqgan.yaml")
    tree = {"state_dict": {s.name: s for s in vqgan_specs(spec)}, "global_step": 0, "epoch": 0}
    write_torch(folder / "vqgan.ckpt", tree, torch.float32, seed)
    stats.add(folder / "vqgan.ckpt")


# -- the transformers models on the meta device ------------------------------------------------------------------
def _set_dtype(config, dtype: torch.dtype) -> None:
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    setattr(config, "dtype" if (major, minor) >= (4, 56) else "torch_dtype", dtype)  # renamed in 4.56


def meta_state(cls, config) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        model = cls(config)
    return model.state_dict()


def janus_config(cfg: dict, scale: float, vocab: dict[str, int]):
    from transformers import JanusConfig

    text = scaled_text(cfg["text"], scale)
    v = dict(cfg["vision"])
    if scale != 1.0:
        heads = _n(v["num_attention_heads"], scale)
        v.update(hidden_size=heads * (v["hidden_size"] // v["num_attention_heads"]), num_attention_heads=heads,
                 num_hidden_layers=_n(v["num_hidden_layers"], scale))
    v.update(projection_dim=text["hidden_size"], num_image_tokens=cfg["image_tokens"])
    vq = dict(cfg["vq"])
    if scale != 1.0:
        vq.update(base_channels=_channels(vq["base_channels"], scale),
                  latent_channels=_channels(vq["latent_channels"], scale))
    vq.update(projection_dim=text["hidden_size"], image_token_embed_dim=text["hidden_size"])
    ids = cfg["ids"]
    text.update(model_type="llama", bos_token_id=ids["<｜begin▁of▁sentence｜>"],
                eos_token_id=ids["<｜end▁of▁sentence｜>"], pad_token_id=ids["<｜▁pad▁｜>"],
                tie_word_embeddings=False)
    config = JanusConfig(text_config=text, vision_config=v, vq_config=vq, image_token_id=ids["<image_placeholder>"],
                         tie_word_embeddings=False)
    config.architectures = ["JanusForConditionalGeneration"]
    return config


def chameleon_config(cfg: dict, scale: float, vocab: dict[str, int], vq_spec, lumina: bool):
    from transformers import ChameleonConfig

    from ..loaders.chameleon_meta import vq_config_of

    text = scaled_text(cfg["text"], scale)
    inter = meta_ffn(text["hidden_size"], text.pop("ffn_dim_multiplier"), text.pop("multiple_of"))
    config = ChameleonConfig(**text, intermediate_size=inter, vocabulary_map=vocab, vq_config=vq_config_of(vq_spec),
                             model_parallel_size=1, swin_norm=False, tie_word_embeddings=False)
    config.architectures = ["ChameleonXLLMXForConditionalGeneration" if lumina else "ChameleonForConditionalGeneration"]
    return config


def emu3_config(cfg: dict, scale: float, vocab: dict[str, int]):
    from transformers import Emu3Config

    text = scaled_text(cfg["text"], scale)
    ids = cfg["ids"]
    text.update(pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|extra_203|>"],
                eos_token_id=ids["<|extra_204|>"], attention_dropout=0.1, tie_word_embeddings=False)
    vq = dict(cfg["vq"])
    if scale != 1.0:
        vq["base_channels"] = _channels(vq["base_channels"], scale)
    vq["hidden_size"] = vq["base_channels"] * vq["channel_multiplier"][-1]  # transformers requires it [N]
    config = Emu3Config(text_config=text, vq_config=vq, vocabulary_map=vocab, tie_word_embeddings=False)
    config.architectures = ["Emu3ForConditionalGeneration"]
    return config


def write_config(folder: pathlib.Path, config, dtype: torch.dtype, stats: Stats, extra: dict | None = None) -> None:
    """config.json as ``save_pretrained`` writes it (this transformers version), plus ``extra``."""
    _set_dtype(config, dtype)
    config.save_pretrained(str(folder))
    if extra:
        data = json.loads((folder / "config.json").read_text())
        data.update(extra)
        (folder / "config.json").write_text(json.dumps(data, indent=2, ensure_ascii=False))
    stats.add(folder / "config.json")


# -- name mappings for the original layouts ----------------------------------------------------------------------
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


# -- the families ------------------------------------------------------------------------------------------------
@dataclass
class Written:
    family: str
    layout: str
    folder: pathlib.Path
    scale: float
    dtype: torch.dtype
    bytes: int = 0
    files: list = field(default_factory=list)
    seconds: float = 0.0
    weight_seconds: float = 0.0
    peak_rss: int = 0
    rss_before_weights: int = 0
    tensors: int = 0
    parameters: int = 0
    expected: dict = field(default_factory=dict)  # weight file -> {name: shape}

    def summary(self) -> dict:
        return {"family": self.family, "layout": self.layout, "folder": str(self.folder), "scale": self.scale,
                "dtype": str(self.dtype).replace("torch.", ""), "files": len(self.files), "bytes": self.bytes,
                "tensors": self.tensors, "parameters": self.parameters, "seconds": round(self.seconds, 2),
                "weight_seconds": round(self.weight_seconds, 2), "peak_rss_bytes": self.peak_rss,
                "rss_before_weights_bytes": self.rss_before_weights}


def resolve(family: str) -> str:
    family = ALIASES.get(family, family)
    if family not in CONFIGS:
        raise ValueError(f"unknown family {family!r}: one of {', '.join(CONFIGS)}")
    return family


def write(family: str, out, layout: str | None = None, dtype: torch.dtype = torch.bfloat16, scale: float = 1.0,
          seed: int = 0, shard_gb: float | None = None, log=print, holes: bool = False) -> Written:
    """Write ``family`` in ``layout`` into the folder ``out`` (created; must be empty or new).  ``holes``: the
    safetensors weights as headers over sparse holes (every value zero, no disk space, written at once): for
    what needs the files' layout and sizes but not their values, or redraws the values after loading
    (``spec-ar bench gpu``); torch pickles are written in full."""
    family = resolve(family)
    cfg = CONFIGS[family]
    layout = layout or cfg["layouts"][0]
    if layout not in cfg["layouts"]:
        raise ValueError(f"{family} has the layouts {', '.join(cfg['layouts'])} (not {layout!r})")
    if not 0 < scale <= 1:
        raise ValueError(f"--scale must be in (0, 1] (got {scale})")
    out = pathlib.Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: not empty")
    out.mkdir(parents=True, exist_ok=True)
    default_gb = cfg["shard_gb"].get(layout)
    max_bytes = None if default_gb is None and shard_gb is None else (shard_gb or default_gb) * 1e9
    result = Written(family, layout, out, scale, dtype)
    stats = Stats()
    start = time.perf_counter()
    fn = {"janus-pro-7b": _write_janus, "lumina-mgpt-7b-768": _write_chameleon, "anole-7b": _write_chameleon,
          "emu3-gen": _write_emu3, "liquid-7b": _write_liquid, "lumina-mgpt-2.0": _write_lumina2,
          "simplear-1.5b": _write_simplear}[family]
    token = _HOLES.set(holes)
    try:
        fn(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log)
    finally:
        _HOLES.reset(token)
    result.seconds = time.perf_counter() - start
    result.bytes, result.files = stats.bytes, [str(p) for p in stats.files]
    result.peak_rss = peak_rss()
    return result


def _weights(result: Written, stats: Stats, specs: list[TensorSpec], dtype, log, write_fn):
    """Run ``write_fn`` (which writes the weight files), recording time, RSS and what each file should hold."""
    result.rss_before_weights = peak_rss()
    result.tensors = len(specs)
    result.parameters = sum(s.numel for s in specs)
    log(f"writing {len(specs)} tensors, {result.parameters / 1e9:.3f} B parameters, "
        f"{sum(s.nbytes(dtype) for s in specs) / 1e9:.2f} GB")
    t = time.perf_counter()
    write_fn()
    result.weight_seconds = time.perf_counter() - t


def _record(result: Written, folder: pathlib.Path, specs: list[TensorSpec], dtype, max_bytes, kind: str):
    parts = shard(specs, dtype, max_bytes)
    stem, suffix = ("model", "safetensors") if kind == "safetensors" else ("pytorch_model", "bin")
    names = ([f"{stem}.{suffix}"] if len(parts) == 1 else
             [f"{stem}-{i + 1:05d}-of-{len(parts):05d}.{suffix}" for i in range(len(parts))])
    for name, part in zip(names, parts):
        result.expected[str(folder / name)] = {s.name: list(s.shape) for s in part}


def _write_janus(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log):
    from transformers import JanusForConditionalGeneration

    vocab = write_janus_tokenizer(out, cfg, stats)
    config = janus_config(cfg, scale, vocab)
    specs = specs_of(meta_state(JanusForConditionalGeneration, config))
    ids = cfg["ids"]
    text, vision = config.text_config, config.vision_config
    if layout == "converted":
        write_config(out, config, dtype, stats)
        _json(out / "generation_config.json", {
            "bos_token_id": ids["<｜begin▁of▁sentence｜>"], "eos_token_id": ids["<｜end▁of▁sentence｜>"],
            "pad_token_id": ids["<｜▁pad▁｜>"], "boi_token_id": ids["<begin_of_image>"], "guidance_scale": 5,
            "temperature": 1, "generation_kwargs": {"boi_token_id": ids["<begin_of_image>"]}}, stats)
        _json(out / "preprocessor_config.json", {
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
        _json(out / "config.json", {  # deepseek-ai's config.json: towers named, widths in the aligners and head
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
        _json(out / "preprocessor_config.json", {
            "background_color": [127, 127, 127], "do_normalize": True, "image_mean": [0.5] * 3,
            "image_processor_type": "VLMImageProcessor", "image_size": vision.image_size, "image_std": [0.5] * 3,
            "min_size": 14, "processor_class": "VLChatProcessor", "rescale_factor": 1 / 255}, stats)
        _json(out / "processor_config.json", {
            "add_special_token": False, "ignore_id": -100, "image_tag": "<image_placeholder>", "mask_prompt": True,
            "num_image_tokens": vision.num_image_tokens, "processor_class": "VLChatProcessor",
            "sft_format": "deepseek"}, stats)
        kind = "bin"
    _record(result, out, specs, dtype, max_bytes, kind)
    _weights(result, stats, specs, dtype, log,
             lambda: write_sharded(out, specs, dtype, seed, max_bytes, kind, stats, log))


def _write_chameleon(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log):
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
        _json(model_dir / "params.json", {"model_parallel_size": 1, "model": {
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

        _weights(result, stats, specs, dtype, log, write_meta)
        return
    write_chameleon_tokenizer(out, vocab, stats)
    if lumina and layout == "original":
        specs = lumina_original_specs(specs)
        _json(out / "config.json", lumina_config(config, spec, dtype), stats)
        _json(out / "generation_config.json", {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": 2,
                                               "transformers_version": "4.43.3"}, stats)
    else:
        write_config(out, config, dtype, stats)
        _json(out / "generation_config.json", {"bos_token_id": config.bos_token_id,
                                               "eos_token_id": config.eos_token_id}, stats)
    _record(result, out, specs, dtype, max_bytes, "safetensors")
    _weights(result, stats, specs, dtype, log,
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


def _write_emu3(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log):
    from transformers import Emu3ForConditionalGeneration

    vocab = emu3_vocabulary(cfg, cfg["text"]["vocab_size"], cfg["vq"]["codebook_size"])
    write_emu3_tokenizer(out, vocab, stats)
    config = emu3_config(cfg, scale, vocab)
    specs = specs_of(meta_state(Emu3ForConditionalGeneration, config))
    write_config(out, config, dtype, stats)
    ids = cfg["ids"]
    _json(out / "generation_config.json", {"bos_token_id": ids["<|extra_203|>"], "eos_token_id": ids["<|extra_204|>"],
                                           "pad_token_id": ids["<|endoftext|>"]}, stats)
    _json(out / "preprocessor_config.json", {  # as released: pixels normalised to [-1, 1]
        "image_processor_type": "Emu3ImageProcessor", "processor_class": "Emu3Processor", "do_convert_rgb": True,
        "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
        "rescale_factor": 1 / 255, "resample": 3, "spatial_factor": 8, "min_pixels": 512 * 512,
        "max_pixels": 1024 * 1024}, stats)
    _record(result, out, specs, dtype, max_bytes, "safetensors")
    _weights(result, stats, specs, dtype, log,
             lambda: write_sharded(out, specs, dtype, seed, max_bytes, "safetensors", stats, log))


def liquid_config(cfg: dict, scale: float):
    from transformers import GemmaConfig

    text = scaled_text(cfg["text"], scale)
    text["vocab_size"] = cfg["text_ids"] + cfg["vq"]["n_embed"]  # the scaled model keeps the real vocabulary
    ids = cfg["ids"]
    config = GemmaConfig(**text, pad_token_id=ids["<pad>"], bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"],
                         tie_word_embeddings=True)
    config.architectures = ["GemmaForCausalLM"]
    return config


def write_liquid_tokenizer(folder: pathlib.Path, cfg: dict, stats: Stats) -> None:
    """Gemma's tokenizer shape with Liquid's names: ``tokenizer.json`` (BPE over ``▁``-joined pieces with byte
    fallback, the space normalised to ``▁``, BOS added by the post-processor) of ``text_ids`` entries: the
    specials, 256 byte pieces, letters and a few merges, then unreachable fillers; a ``GemmaTokenizer``
    tokenizer_config.json naming the added tokens."""
    ids, size = cfg["ids"], cfg["text_ids"]
    by_id = {i: n for n, i in ids.items()}
    vocab = {by_id.get(i, f"<unused{i}>"): i for i in range(10)}
    vocab.update({f"<0x{b:02X}>": 10 + b for b in range(256)})
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.,", "▁a", "▁c", "at", "▁cat", "▁r", "ed",
              "▁red"]
    vocab.update({p: len(vocab) + i for i, p in enumerate(pieces)})
    merges = ["▁ a", "▁ c", "a t", "▁c at", "▁ r", "e d", "▁r ed"]
    vocab.update({f"<fill{i}>": i for i in range(len(vocab), size)})
    added = [{"id": i, "content": by_id.get(i, f"<unused{i}>"), "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for i in range(10)]
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}, "pre_tokenizer": None,
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}},
                                        {"SpecialToken": {"id": "<bos>", "type_id": 1}},
                                        {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<bos>": {"id": "<bos>", "ids": [ids["<bos>"]],
                                                            "tokens": ["<bos>"]}}},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "vocab": vocab,
                      "merges": merges}}
    _json(folder / "tokenizer.json", spec, stats)
    _json(folder / "tokenizer_config.json", {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>", "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
        "model_max_length": 1000000000000000019884624838656, "tokenizer_class": "GemmaTokenizer"}, stats)
    _json(folder / "special_tokens_map.json", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                                               "unk_token": "<unk>"}, stats)


def _write_liquid(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log):
    from transformers import GemmaForCausalLM

    config = liquid_config(cfg, scale)
    specs = [s for s in specs_of(meta_state(GemmaForCausalLM, config)) if s.name != "lm_head.weight"]  # tied
    write_vqgan(out / "chameleon", vqgan_spec(cfg, scale), seed, stats)
    write_liquid_tokenizer(out, cfg, stats)
    write_config(out, config, dtype, stats, {"hidden_act": "gelu", "hidden_activation": None})  # as released [N]
    ids = cfg["ids"]
    _json(out / "generation_config.json", {"bos_token_id": ids["<bos>"], "eos_token_id": ids["<eos>"],
                                           "pad_token_id": ids["<pad>"]}, stats)
    _record(result, out, specs, dtype, max_bytes, "safetensors")
    _weights(result, stats, specs, dtype, log,
             lambda: write_sharded(out, specs, dtype, seed, max_bytes, "safetensors", stats, log))


def lumina2_vocabulary(cfg: dict) -> dict[str, int]:
    """Qwen2.5-sized text ids (byte-level BPE fillers up to <|endoftext|>), then the specials at their ids, the
    size tokens after them; image ids are named by no entry (the reference adds them by number)."""
    ids = cfg["ids"]
    vocab = text_vocabulary(ids["<|endoftext|>"])
    vocab.update(ids)
    top = max(ids.values())
    vocab.update({f"<reserved{8800 + n:05d}>": top + 1 + n for n in range(64)})  # up to 2016 px [D]
    return vocab


def lumina2_config(cfg: dict, scale: float, dtype: torch.dtype) -> dict:
    """config.json as the fork's ``ChameleonXLLMXConfig`` saves it (``model_parallel_size``, ``mask_image_logits``,
    ``dropout``, ``z_loss_weight``), the vocabulary map the tokenizer's (no IMGIMG names)."""
    text = scaled_text(cfg["text"], scale)
    inter = meta_ffn(text["hidden_size"], text.pop("ffn_dim_multiplier"), text.pop("multiple_of"))
    ids = cfg["ids"]
    return {"architectures": ["ChameleonXLLMXForConditionalGeneration"], "model_type": "chameleon", **text,
            "intermediate_size": inter, "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None,
            "eos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"], "hidden_act": "silu",
            "initializer_range": 0.02, "qk_layernorm": True, "model_parallel_size": 1, "swin_norm": False,
            "mlp_bias": False, "mask_image_logits": True, "dropout": 0.0, "z_loss_weight": 0.0,
            "tie_word_embeddings": False, "torch_dtype": str(dtype).replace("torch.", ""),
            "transformers_version": "4.46.2", "use_cache": True, "vocabulary_map": lumina2_vocabulary(cfg)}


def movqgan_specs(cfg: dict, scale: float) -> list[TensorSpec]:
    """``movqgan_270M.ckpt``'s decoder side (what the pack reads), float32 as released."""
    from ..decoders.movqgan import MoVQModel, MoVQSpec

    m = dict(cfg["movqgan"])
    if scale != 1:
        m["ch"] = _channels(m["ch"], scale)
    with torch.device("meta"):
        model = MoVQModel(MoVQSpec(**m))
    out = specs_of(model.state_dict())
    for s in out:
        s.dtype = torch.float32
        s.sources = ("movqgan." + s.name,)
    return out


def _write_lumina2(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log):
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    settings = lumina2_config(cfg, scale, dtype)
    _json(out / "config.json", settings, stats)
    ids = cfg["ids"]
    _json(out / "generation_config.json", {"_from_model_config": True, "eos_token_id": ids["<|endoftext|>"],
                                           "pad_token_id": ids["<|endoftext|>"], "transformers_version": "4.46.2"},
          stats)
    vocab = settings["vocabulary_map"]
    fast_vocab = {k: v for k, v in vocab.items() if not (k.startswith("<") and k.endswith(">"))}
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=_bpe(vocab, [n for n in vocab if n not in fast_vocab]),
                                   eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    _save_tokenizer(fast, out, stats)
    movq = out / "movqgan" / "270M" / "movqgan_270M.ckpt"  # where the reference's get_movqgan_model reads it
    movq.parent.mkdir(parents=True, exist_ok=True)
    write_torch(movq, {s.name: s for s in movqgan_specs(cfg, scale)}, torch.float32, seed)
    stats.add(movq)
    config = ChameleonConfig(**{k: v for k, v in settings.items() if k not in ("architectures", "model_type")})
    specs = lumina_original_specs(specs_of(meta_state(ChameleonForConditionalGeneration, config)))
    _record(result, out, specs, dtype, max_bytes, "safetensors")
    _weights(result, stats, specs, dtype, log,
             lambda: write_sharded(out, specs, dtype, seed, max_bytes, "safetensors", stats, log))


def simplear_config(cfg: dict, scale: float):
    from transformers import Qwen2Config

    text = scaled_text(cfg["text"], scale)
    text["vocab_size"] = cfg["text_ids"] + cfg["cosmos"]["n_embed"]  # the scaled model keeps the real vocabulary
    eos = cfg["ids"]["<|endoftext|>"]
    config = Qwen2Config(**text, bos_token_id=eos, eos_token_id=eos, tie_word_embeddings=True,
                         use_sliding_window=False, sliding_window=text["max_position_embeddings"])
    config.architectures = ["SimpARForCausalLM"]
    return config


def _write_simplear(family, cfg, layout, out, dtype, scale, seed, max_bytes, stats, result, log):
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

    from .cosmos_archive import DV, write_archive

    config = simplear_config(cfg, scale)
    specs = [s for s in specs_of(meta_state(Qwen2ForCausalLM, config)) if s.name != "lm_head.weight"]  # tied
    ids = cfg["ids"]
    vocab = fill_ids({**text_vocabulary(ids["<|endoftext|>"]), **ids}, cfg["text_ids"], "<|reserved_{}|>")
    added = [n for n, i in vocab.items() if i >= ids["<|endoftext|>"]]
    fast = PreTrainedTokenizerFast(tokenizer_object=_bpe(vocab, added), eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>",
                                   additional_special_tokens=[n for n in ids if n != "<|endoftext|>"])
    _save_tokenizer(fast, out, stats)
    write_config(out, config, dtype, stats)
    _json(out / "generation_config.json", {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|endoftext|>"]},
          stats)
    cosmos = dict(DV)
    if scale != 1:
        cosmos["channels"] = _channels(cosmos["channels"], scale)
    stats.add(write_archive(out, cosmos, seed, torch.float32))  # where `spec-ar download` puts it
    _record(result, out, specs, dtype, max_bytes, "safetensors")
    _weights(result, stats, specs, dtype, log,
             lambda: write_sharded(out, specs, dtype, seed, max_bytes, "safetensors", stats, log))


#: families whose release is a plain transformers causal LM with its output layer tied to the embedding
TIED_CAUSAL_LMS = {"liquid-7b": ("GemmaConfig", "GemmaForCausalLM"),
                   "simplear-1.5b": ("Qwen2Config", "Qwen2ForCausalLM")}


def tied_causal_lm_state(family: str, config) -> dict:
    """Meta tensors of a :data:`TIED_CAUSAL_LMS` model (``config``: a config object, or a folder to read it
    from), without ``lm_head.weight``: tied, it is not in the files."""
    import transformers

    config_class, model_class = (getattr(transformers, name) for name in TIED_CAUSAL_LMS[family])
    if isinstance(config, (str, pathlib.Path)):
        config = config_class.from_pretrained(str(config))
    state = meta_state(model_class, config)
    state.pop("lm_head.weight")
    return state


def planned_parameters(family: str, scale: float = 1.0) -> int:
    """Parameters of the family's transformers model (converted layout) at ``scale``, from the meta device:
    nothing is allocated or written."""
    from transformers import (ChameleonForConditionalGeneration, Emu3ForConditionalGeneration,
                              JanusForConditionalGeneration)

    family = resolve(family)
    cfg = CONFIGS[family]
    if family == "janus-pro-7b":
        state = meta_state(JanusForConditionalGeneration, janus_config(cfg, scale, {}))
    elif family == "emu3-gen":
        vocab = emu3_vocabulary(cfg, cfg["text"]["vocab_size"], cfg["vq"]["codebook_size"])
        state = meta_state(Emu3ForConditionalGeneration, emu3_config(cfg, scale, vocab))
    elif family in TIED_CAUSAL_LMS:
        state = tied_causal_lm_state(family, {"liquid-7b": liquid_config, "simplear-1.5b": simplear_config}[family](
            cfg, scale))
    elif family == "lumina-mgpt-2.0":
        from transformers import ChameleonConfig

        settings = lumina2_config(cfg, scale, torch.bfloat16)
        config = ChameleonConfig(**{k: v for k, v in settings.items() if k not in ("architectures", "model_type")})
        state = {k: v for k, v in meta_state(ChameleonForConditionalGeneration, config).items()
                 if not k.startswith("model.vqmodel.")}  # not in the release
    else:
        spec = vqgan_spec(cfg, scale)
        vocab = chameleon_vocabulary(cfg["text"]["vocab_size"], spec.n_embed, meta=False)
        state = meta_state(ChameleonForConditionalGeneration, chameleon_config(cfg, scale, vocab, spec, False))
    return sum(v.numel() for v in state.values())


# -- reading back headers only -----------------------------------------------------------------------------------
def header_shapes(path: pathlib.Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a weight file without reading its data: the safetensors header, or the
    pickle of a torch zip (tensors memory-mapped, never touched)."""
    path = pathlib.Path(path)
    if path.suffix == ".safetensors":
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if path.stat().st_size != 8 + n + end:
            raise ValueError(f"{path}: {path.stat().st_size} bytes, the header says {8 + n + end}")
        return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    from ..formats.checkpoints import state_dict

    return {k: tuple(v.shape) for k, v in state_dict(obj, wrappers=("state_dict",)).items()}


def check(folder, family: str, layout: str | None = None, expected: dict | None = None, log=print) -> dict:
    """Header-level checks of a written folder (no weights read): the pack detects it as ``family``, the index
    names every tensor of every shard and their total size, the shapes are ``expected`` (file -> {name: shape})
    if given, and the loaders' own key mapping of the original layouts (Janus' remap, Meta's conversion,
    Lumina's norm rows) gives exactly the tensors transformers' model (built on the meta device from the
    folder's configuration) expects."""
    from ..formats.checkpoints import read_json, weight_files
    from ..loaders.detect import detect

    family = resolve(family)
    layout = layout or CONFIGS[family]["layouts"][0]
    folder = pathlib.Path(folder)
    report = {}
    hit = detect(folder)
    if hit.family != FAMILY_OF[family]:
        raise AssertionError(f"{folder}: detected as {hit.family}, not {FAMILY_OF[family]}")
    report["detected"] = hit.family
    if family == "anole-7b" and layout == "original":
        from ..loaders import chameleon_meta

        files = chameleon_meta.find_meta_files(folder)
        shapes = {str(p): header_shapes(p) for p in files["shards"]}
    else:
        files = weight_files(folder)
        shapes = {str(p): header_shapes(p) for p in files}
        for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            if (folder / index).is_file():
                data = read_json(folder / index)
                wmap = data["weight_map"]
                listed = {(name, folder / f) for name, f in wmap.items()}
                held = {(name, pathlib.Path(f)) for f, names in shapes.items() for name in names}
                if listed != held:
                    raise AssertionError(f"{index}: the weight map and the shards disagree "
                                         f"({len(listed - held)} listed only, {len(held - listed)} held only)")
                report["index_tensors"] = len(wmap)
                report["index_total_size"] = data["metadata"]["total_size"]
    if expected is not None:
        got = {f: {k: list(v) for k, v in s.items()} for f, s in shapes.items()}
        if got != {str(k): v for k, v in expected.items()}:
            raise AssertionError(f"{folder}: the files' tensors are not the ones planned")
    merged = {k: v for s in shapes.values() for k, v in s.items()}
    report["tensors"] = len(merged)
    report["parameters"] = sum(math.prod(v) for v in merged.values())
    want, have = _expected_model_shapes(folder, family, layout, merged)
    if want != have:
        missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
        wrong = sorted(k for k in set(want) & set(have) if want[k] != have[k])
        raise AssertionError(f"{folder}: mapped tensors do not fit transformers' model: missing {missing[:4]}, "
                             f"unexpected {extra[:4]}, wrong shapes {wrong[:4]}")
    report["model_tensors"] = len(want)
    log(f"check {folder}: detected {hit.family}; {report['tensors']} tensors, {report['parameters'] / 1e9:.3f} B "
        f"parameters in {len(shapes)} file(s); they map onto transformers' model ({len(want)} tensors)")
    return report


def _meta_tensors(shapes: dict) -> dict[str, torch.Tensor]:
    return {k: torch.empty(v, device="meta") for k, v in shapes.items()}


def _expected_model_shapes(folder: pathlib.Path, family: str, layout: str, shapes: dict):
    """(shapes transformers' model holds, shapes the folder's tensors give after the loader's mapping)."""
    from ..formats.checkpoints import read_json, tokenizer_from_pretrained

    if family == "janus-pro-7b":
        from transformers import JanusConfig, JanusForConditionalGeneration

        from ..loaders import janus

        cfg = read_json(folder / "config.json")
        if layout == "original":
            tokenizer = tokenizer_from_pretrained(folder)
            meta = _meta_tensors(shapes)
            config = JanusConfig(**janus.translate_config(cfg, meta, tokenizer))
            mapped = {k: tuple(v.shape) for k, v in janus.remap_original_keys(meta).items()}
        else:
            config = JanusConfig.from_pretrained(str(folder))
            mapped = shapes
        want = meta_state(JanusForConditionalGeneration, config)
    elif family == "anole-7b" and layout == "original":
        from transformers import ChameleonConfig, ChameleonForConditionalGeneration

        from ..decoders.vqgan import VQGANSpec
        from ..loaders import chameleon_meta

        files = chameleon_meta.find_meta_files(folder)
        vocab = chameleon_meta.read_vocab(json.loads(files["tokenizer"].read_text()))
        vq = chameleon_meta.vq_config_of(VQGANSpec.from_yaml(files["vqgan"][0]))
        config = ChameleonConfig(**chameleon_meta.translate_config(chameleon_meta.read_params(files), vocab, vq))
        mapped = {k: tuple(v.shape) for k, v in chameleon_meta.remap_meta_keys(_meta_tensors(shapes), config).items()}
        want = {k: v for k, v in meta_state(ChameleonForConditionalGeneration, config).items()
                if not k.startswith("model.vqmodel.")}  # filled from vqgan.ckpt
    elif family in ("anole-7b", "lumina-mgpt-7b-768", "lumina-mgpt-2.0"):
        from transformers import ChameleonConfig, ChameleonForConditionalGeneration

        from ..loaders import chameleon

        config = ChameleonConfig.from_pretrained(str(folder))
        repeats = chameleon.norm_repeats(shapes, config, str(folder))
        mapped = {k: ((repeats[k], v[1]) if k in repeats else v) for k, v in shapes.items()}
        want = meta_state(ChameleonForConditionalGeneration, config)
        if layout == "original":  # Lumina's save has no VQ encoder (transformers initialises it)
            want = {k: v for k, v in want.items() if not k.startswith("model.vqmodel.")}
    elif family in TIED_CAUSAL_LMS:
        mapped = shapes
        want = tied_causal_lm_state(family, folder)
    else:
        from transformers import Emu3Config, Emu3ForConditionalGeneration

        config = Emu3Config.from_pretrained(str(folder))
        mapped = shapes
        want = meta_state(Emu3ForConditionalGeneration, config)
    return {k: tuple(v.shape) for k, v in want.items()}, {k: tuple(v) for k, v in mapped.items()}


# -- command line ------------------------------------------------------------------------------------------------
def table() -> str:
    """The configurations, one line per family (full size)."""
    lines = []
    for name, c in CONFIGS.items():
        t = c["text"]
        inter = t.get("intermediate_size") or meta_ffn(t["hidden_size"], t["ffn_dim_multiplier"], t["multiple_of"])
        vq = c.get("vq") or c.get("movqgan") or c["cosmos"]
        lines.append(f"{name}: {t['num_hidden_layers']} layers, width {t['hidden_size']}, {t['num_attention_heads']} "
                     f"heads / {t['num_key_value_heads']} kv, FFN {inter}, vocab {t['vocab_size']}, "
                     f"VQ codes {vq.get('num_embeddings') or vq.get('n_embed') or vq.get('codebook_size')}, "
                     f"{c['image_tokens']} image-stream tokens; layouts {', '.join(c['layouts'])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spec_ar.bench.scale_checkpoints", description=__doc__.split("\n")[0],
                                 epilog="families:\n" + table(), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", required=True, help=f"one of {', '.join(CONFIGS)}")
    ap.add_argument("--out", required=True, help="a new or empty folder")
    ap.add_argument("--layout", choices=["converted", "original"], help="default: the family's release layout")
    ap.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    ap.add_argument("--scale", type=float, default=1.0, help="widths and depths times this (0 < s <= 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-gb", type=float, default=None,
                    help="largest weight shard in GB (default: the release's, 5 or 10; Meta's layout: one file)")
    ap.add_argument("--holes", action="store_true", help="safetensors weights as headers over sparse holes "
                    "(every value zero, no disk space): for loading and sizing, not for logits")
    ap.add_argument("--check", action="store_true", help="then read back the headers and indexes and check them")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON line at the end")
    args = ap.parse_args(argv)
    try:
        family = resolve(args.family)
    except ValueError as err:
        ap.error(str(err))
    result = write(family, args.out, args.layout, DTYPES[args.dtype], args.scale, args.seed, args.shard_gb,
                   holes=args.holes)
    print(f"wrote {result.family} ({result.layout} layout, scale {result.scale}) to {result.folder}: "
          f"{result.bytes / 1e9:.3f} GB in {len(result.files)} files, {result.parameters / 1e9:.3f} B parameters; "
          f"{result.seconds:.1f} s ({result.weight_seconds:.1f} s weights, "
          f"{result.bytes / 1e6 / max(result.seconds, 1e-9):.0f} MB/s); writer peak RSS "
          f"{result.peak_rss / 2**30:.2f} GiB ({result.rss_before_weights / 2**30:.2f} GiB before the weights)")
    summary = result.summary()
    if args.check:
        summary["check"] = check(result.folder, family, result.layout, result.expected)
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
