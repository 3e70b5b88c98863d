"""Every family's tiny random-weight model in one dict, for the tests that hold a decode path or
the engine's step to the same tokens on each; and a model small enough to enumerate its joint."""
from __future__ import annotations

import itertools
import math
import pathlib

import torch

from spec_ar.loaders import chameleon, emu3, embedded, janus, liquid, llamagen, lumina2, simplear
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

from .chameleon_files import write_chameleon
from .checkpoints import random_gpt, tiny_gpt_spec, tiny_janus, write_gpt, write_janus, write_t5, write_vq
from .emu3_files import write_emu3
from .liquid_files import write_liquid
from .lumina2_files import write_lumina2
from .simplear_files import write_simplear

PROMPTS = ["a cat", "a dog on a hill at night"]  # different lengths: left padding on the static path too


def tiny_families(d: pathlib.Path) -> dict:
    """The families' tiny models, their files written under ``d``."""
    model, tok = tiny_janus(seed=3)
    t2i = write_gpt(d / "t2i.pt", random_gpt(tiny_gpt_spec("t2i", cond_tokens=120), seed=1))
    return {
        "embedded": embedded.load(),
        "llamagen-c2i": llamagen.load(write_gpt(d / "c2i.pt", random_gpt(tiny_gpt_spec("c2i"), seed=2)),
                                      write_vq(d / "vq.pt"), resolution=128),
        "llamagen-t2i": llamagen.load(t2i, write_vq(d / "vq.pt"), write_t5(d / "t5"), resolution=256),
        "janus": janus.load(write_janus(d / "Janus-Pro-tiny", model, tok)),
        "lumina": chameleon.load(write_chameleon(d / "Lumina-mGPT-7B-768", "lumina"), width=96, height=64),
        "anole": chameleon.load(write_chameleon(d / "Anole-7b-hf", "anole", seed=1)),
        "emu3": emu3.load(write_emu3(d / "Emu3-Gen-tiny", seed=1), resolution=64),
        "liquid": liquid.load(write_liquid(d / "Liquid_V1_7B", seed=1)),
        "lumina2": lumina2.load(write_lumina2(d / "Lumina-mGPT-2.0", seed=1), width=64, height=32),
        "simplear": simplear.load(write_simplear(d / "SimpleAR-tiny", seed=1), width=64, height=48),
    }


def conditions(model):
    return [3, 7] if model.condition == "class" else ["a red circle", "a blue square on a striped background"] \
        if model.family == "embedded" else PROMPTS


def enumerable_llamagen(seed: int = 0):
    """A class-conditional LlamaGen GPT with 4 image tokens of 3 ids (81 streams to
    enumerate; 16 under top-k 2), weights drawn so that its conditionals differ."""
    spec = llamagen.GPTSpec(dim=16, n_layer=1, n_head=2, ffn_hidden=32, vocab_size=3, kind="c2i", num_classes=2)
    torch.manual_seed(seed)
    gpt = llamagen.LlamaGenGPT(spec)
    with torch.no_grad():
        for p in gpt.parameters():
            p.normal_(0, 0.3)
    return llamagen.LlamaGenAdapter(gpt.eval(), 2, codebook=torch.randn(3, 4))


def exact_joint(adapter, settings: dict) -> dict[tuple, float]:
    """Every stream of :func:`enumerable_llamagen` (class 1) -> its probability under ``settings``."""
    streams = torch.tensor(list(itertools.product(range(3), repeat=4)))
    scorer = SpeculativeDecoder(adapter, DecodeConfig(**settings))
    ll = scorer.target_log_likelihood([1] * len(streams), streams).sum(1)
    exact = {tuple(s): math.exp(v) for s, v in zip(streams.tolist(), ll.tolist()) if v > -math.inf}
    assert abs(sum(exact.values()) - 1.0) < 1e-4 and max(exact.values()) < 0.2
    return exact
