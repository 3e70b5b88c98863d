"""The embedded model's recipe: dataset size, architecture sizes and training steps.

``config.json`` stores it and the loader (``loaders/embedded.py``) rebuilds the
architecture from it, so it lives apart from training and imports nothing.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    seed: int = 0
    images: int = 24000
    size: int = 64
    drop: float = 0.3  # share of captions missing the position / the background phrase
    # VQ tokenizer
    vq_ch: int = 32
    vq_mult: tuple[int, ...] = (1, 2, 2)
    vq_enc_blocks: int = 1
    vq_dec_blocks: int = 2
    # the decoder's channel multipliers: wider than the encoder's at full resolution, where GroupNorm's 32 groups
    # of a 32-channel map are one channel each (instance norm), which the decoder could only steer with spikes
    # that decode as small round spots (StyleGAN2's "droplets"); two channels a group carry the scale
    vq_dec_mult: tuple[int, ...] = (2, 2, 2)
    vq_z: int = 32
    codebook: int = 512
    code_dim: int = 8
    vq_steps: int = 800
    vq_batch: int = 32
    vq_lr: float = 4e-4
    commit: float = 0.25
    object_weight: float = 6.0  # extra reconstruction weight on (and just around) the object
    vq_encoder_padding: str = "replicate"  # zeros gave codes that depend on the distance to the border
    # the decoder, on the codes of the dataset: replicate padding, then fine-tuned (train_decoder)
    vq_decoder_padding: str = "replicate"
    vq_decoder_steps: int = 400
    vq_decoder_lr: float = 4e-4
    # share of each batch whose code maps (and target images) are two dataset pictures cut together along
    # code-cell lines: arrangements of codes the encoder never writes, as the GPT's pictures have
    vq_decoder_mix: float = 0.5
    # text encoder and GPT
    text_dim: int = 128
    text_layers: int = 2
    words: int = 16  # condition tokens (words + </s>)
    dim: int = 192
    layers: int = 6
    gpt_steps: int = 2000
    gpt_batch: int = 32
    gpt_lr: float = 6e-4
    cond_drop: float = 0.1
    # judge
    judge_images: int = 20000
    judge_epochs: int = 4

    @property
    def grid(self) -> int:
        return self.size // 2 ** (len(self.vq_mult) - 1)
