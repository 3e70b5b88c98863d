"""Requests are sized before allocation: the estimate bounds what decoding holds,
and a batch that does not fit is one error saying the largest that does."""
from __future__ import annotations

import pytest
import torch

from spec_ar.loaders import embedded
from spec_ar.loaders.base import decode_in_chunks
from spec_ar.sampling import ConfigError, DecodeConfig, SpeculativeDecoder, memory

from . import checkpoints as ck


@pytest.fixture(scope="module")
def model():
    return embedded.load()


def test_the_estimate_is_the_llamagen_cache_the_decode_allocates(model):
    decoder = SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd"))
    prompts = ["a red circle", "a blue square"]
    seen = []
    decoder.generate(prompts, seeds=0, callback=lambda e: seen.append(model.adapter.cache_bytes()))
    per_image = decoder.memory_per_image(prompts)
    assert per_image["KV cache"] * len(prompts) == max(seen)  # LlamaGen's cache is allocated whole, once
    assert per_image["decoding state"] > 0


def test_the_estimate_bounds_a_transformers_cache(tmp_path):
    from spec_ar.loaders import janus

    m, tok = ck.tiny_janus()
    loaded = janus.load(ck.write_janus(tmp_path / "Janus-Pro-1B", m, tok))
    decoder = SpeculativeDecoder(loaded.adapter, DecodeConfig(mode="sjd", window=8))
    prompts = ["a red circle", "a much longer prompt about a blue square on a plain background"]
    seen = []
    decoder.generate(prompts, seeds=0, callback=lambda e: seen.append(loaded.adapter.cache_bytes()))
    bound = decoder.memory_per_image(prompts)["KV cache"] * len(prompts)
    assert max(seen) <= bound < 10 * max(seen)  # a tiny model: the room for windows past the end dominates


def test_a_batch_that_does_not_fit_names_the_largest_that_does(model, monkeypatch):
    decoder = SpeculativeDecoder(model.adapter, DecodeConfig(mode="gsd"))
    need = sum(decoder.memory_per_image(["a red circle"]).values())
    monkeypatch.setattr(memory, "free_bytes", lambda device: int(10.5 * need / memory.HEADROOM))
    with pytest.raises(ConfigError, match=r"a batch of 11 images needs about .* \(KV cache .*, decoding state .*\) "
                                          r"but cpu has .* free; the largest batch that fits is 10"):
        decoder.generate(["a red circle"] * 11)
    assert len(decoder.generate(["a red circle"] * 10, seeds=0).reports) == 10  # the one it names does fit
    monkeypatch.setattr(memory, "free_bytes", lambda device: need // 2)
    with pytest.raises(ConfigError, match="not even one image fits"):
        decoder.generate(["a red circle"])


def test_the_real_free_memory_refuses_a_huge_batch_before_allocating(model):
    decoder = SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd"))
    free = memory.free_bytes("cpu")
    batch = int(2 * free // sum(decoder.memory_per_image(["a red circle"]).values()))
    with pytest.raises(ConfigError, match="the largest batch that fits is"):
        decoder.generate(["a red circle"] * batch)


def test_decoding_runs_in_chunks_that_fit(model, monkeypatch):
    tokens = torch.randint(0, 512, (5, 16, 16))
    calls = []

    def decode(t):
        calls.append(len(t))
        return model.decode(t)

    monkeypatch.setattr(memory, "free_bytes", lambda device: int(2.5 * model.decode_bytes_per_image / memory.HEADROOM))
    from spec_ar.loaders import base

    monkeypatch.setattr(base, "free_bytes", memory.free_bytes)
    images = decode_in_chunks(decode, tokens, model.decode_bytes_per_image, "cpu")
    assert calls == [2, 2, 1] and torch.allclose(images, model.decode(tokens), atol=1e-4)
    monkeypatch.setattr(memory, "free_bytes", lambda device: model.decode_bytes_per_image // 2)
    with pytest.raises(ConfigError, match="a decode of 1 image needs"):
        model.check_decoder_fits()


def test_memory_mapped_weights_count_as_used(tmp_path, monkeypatch):
    """Linux reports the pages of a memory-mapped checkpoint as available (a cache it
    may drop), yet decoding reads them every forward: the batch check counts them."""
    from safetensors.torch import load_file, save_file

    path = tmp_path / "weights.safetensors"
    save_file({"w": torch.zeros(64, 1024, 1024, dtype=torch.uint8)}, str(path))  # 64 MB
    monkeypatch.setattr(memory, "_cpu_available", lambda: 10 * 2**30)
    before = memory.free_bytes("cpu")
    mapped = load_file(str(path))  # safetensors maps the file
    assert memory.mapped_checkpoint_bytes() >= 64 * 2**20
    assert before - memory.free_bytes("cpu") >= 64 * 2**20
    del mapped
