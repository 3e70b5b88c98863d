"""The transformers families take their KV cache by the keyword the installed
transformers names (``cache`` where ``past_key_values`` is deprecated, to go in
5.40), so decoding raises no deprecation warning and keeps working past it."""
from __future__ import annotations

import warnings

import pytest
import torch
import transformers

from spec_ar.loaders import chameleon, emu3, janus
from spec_ar.loaders.hf_cache import cache_argument
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

from .chameleon_files import write_chameleon
from .checkpoints import tiny_janus, write_janus
from .emu3_files import write_emu3


def load(family, folder):
    if family == "janus":
        return janus.load(write_janus(folder / "Janus-Pro-tiny", *tiny_janus(seed=3)))
    if family == "lumina":
        return chameleon.load(write_chameleon(folder / "Lumina-mGPT-7B-768", "lumina"), width=96, height=64)
    return emu3.load(write_emu3(folder / "Emu3-Gen-tiny", seed=1), resolution=32)


@pytest.mark.parametrize("family", ["janus", "lumina", "emu3"])
def test_decoding_raises_no_cache_deprecation_warning(family, tmp_path):
    model = load(family, tmp_path)
    inner = "lm" if family == "janus" else "inner"
    named = cache_argument(getattr(model.adapter, inner))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for mode in ("ar", "sjd"):  # prefill, windows, rollbacks
            SpeculativeDecoder(model.adapter, DecodeConfig(mode=mode, window=4)).generate(["a red circle"], seeds=0)
    about_cache = [str(w.message) for w in caught if "past_key_values" in str(w.message)]
    assert about_cache == [], f"transformers {transformers.__version__}, cache passed as {named!r}"


def test_the_cache_keyword_follows_the_forward_signature():
    class Old(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None, use_cache=None):
            return input_ids

    class New(torch.nn.Module):
        def forward(self, input_ids, cache=None, use_cache=None):
            return input_ids

    assert cache_argument(Old()) == "past_key_values" and cache_argument(New()) == "cache"
