"""NaN or infinity in the model's output is an error naming the step, never an image."""
from __future__ import annotations

import pytest
import torch

from spec_ar.sampling import DecodeConfig, NonFiniteError, SpeculativeDecoder

from .fakes import PoisonedAdapter

MODES = [dict(mode="ar"), dict(mode="sjd", window=3), dict(mode="gsd", window=3, group_size=3),
         dict(mode="lantern", window=3, lantern_k=2, lantern_delta=0.5), dict(mode="vvs", window=3, lantern_k=2)]


@pytest.mark.parametrize("kind", ["nan-row", "nan-entry", "inf"])
@pytest.mark.parametrize("at", [0, 3])  # the prefill's distribution, or a later one
@pytest.mark.parametrize("settings", MODES, ids=lambda s: s["mode"])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_broken_distribution_stops_decoding(kind, at, settings, batch):
    model = PoisonedAdapter(at, kind, length=6, forced=(2,))
    decoder = SpeculativeDecoder(model, DecodeConfig(cfg_scale=2.0, **settings))
    with pytest.raises(NonFiniteError) as err:
        decoder.generate([0, 1, 0][:batch], seeds=5)
    assert err.value.position == at and err.value.sample == 0
    assert f"stream position {at}" in str(err.value) and "bfloat16 or float32" in str(err.value)
    assert err.value.step == (0 if at == 0 else err.value.step) and err.value.step <= at


def test_the_error_names_the_first_bad_step_in_ar():
    model = PoisonedAdapter(4, "nan-row", length=6, forced=(2,))
    with pytest.raises(NonFiniteError) as err:
        SpeculativeDecoder(model, DecodeConfig(mode="ar")).generate([1], seeds=0)
    assert err.value.step == 4


def test_a_healthy_model_is_not_flagged():
    model = PoisonedAdapter(99, "nan-row", length=6, forced=(2,))  # a position past the stream
    for settings in MODES:
        res = SpeculativeDecoder(model, DecodeConfig(cfg_scale=2.0, **settings)).generate([0, 1], seeds=1)
        assert res.tokens.shape == (2, 6)


def test_float16_overflow_in_a_real_model_is_caught(tmp_path):
    """A tiny LlamaGen GPT in float16 whose output layer is scaled past float16's
    range: the logits overflow to inf for real, as large models do on GPUs."""
    from spec_ar.loaders.llamagen import LlamaGenAdapter, LlamaGenGPT

    from . import checkpoints as ck

    gpt = LlamaGenGPT(ck.tiny_gpt_spec("c2i", classes=10))
    torch.manual_seed(0)
    for p in gpt.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2)
    with torch.no_grad():
        gpt.output.weight.mul_(1e5)  # |logits| of order 1e5, past float16's 65504
    gpt = gpt.half().eval()
    adapter = LlamaGenAdapter(gpt, 4)
    for mode in ("ar", "sjd"):
        with pytest.raises(NonFiniteError, match="step 0 .*float16 weights overflow"):
            SpeculativeDecoder(adapter, DecodeConfig(mode=mode, cfg_scale=1.0)).generate([3], seeds=0)
    logits = adapter.gpt.output(torch.ones(1, gpt.spec.dim, dtype=torch.half))
    assert torch.isinf(logits).any()  # the overflow is real, not injected


def test_a_decoder_that_returns_nan_is_refused_naming_the_decode_step():
    from spec_ar.loaders.base import decode_in_chunks
    from spec_ar.sampling import NonFiniteImageError

    def decode(tokens):  # the second image of each call comes back broken
        images = torch.rand(len(tokens), 3, 8, 8)
        images[1:2, 0, 3, 3] = float("nan")
        return images

    tokens = torch.zeros(4, 2, 2, dtype=torch.long)
    with pytest.raises(NonFiniteImageError) as err:
        decode_in_chunks(decode, tokens, 0, "cpu")
    assert err.value.sample == 1 and err.value.step == "decode"
    assert str(err.value).startswith("the VQ decoder's output for image 1 of the batch (the decode step")
    assert isinstance(err.value, NonFiniteError)  # a user error on every surface, as a bad distribution is


@pytest.mark.parametrize("poison", [float("inf"), float("nan")])
def test_an_overflowing_real_decoder_is_an_error_not_a_black_picture(poison, tmp_path, monkeypatch, capsys):
    """The embedded model's VQ decoder with a poisoned output layer: infinity must not
    be clamped into a white or black picture, NaN not written as black."""
    from spec_ar.cli import main
    from spec_ar.loaders import detect
    from spec_ar.sampling import NonFiniteImageError

    model = detect.load_model("embedded")
    with torch.no_grad():
        model.modules["vq"].decoder.conv_out.bias[0] = poison
    tokens = torch.zeros(2, 16, 16, dtype=torch.long)
    with pytest.raises(NonFiniteImageError, match="image 0 of the batch"):
        model.decode_images(tokens)
    monkeypatch.setattr(detect, "load_model", lambda *a, **k: model)
    code = main(["render", "--model", "embedded", "--prompt", "a red circle", "--mode", "ar",
                 "--out", str(tmp_path / "out")])
    assert code == 2 and "the VQ decoder's output for image 0" in capsys.readouterr().err
    assert not list((tmp_path / "out").glob("*.png"))
