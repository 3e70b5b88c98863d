"""The verified distribution equals a plain re-implementation of each rule."""
from __future__ import annotations

import pytest
import torch

from spec_ar.sampling import DecodeConfig, TokenLayout
from spec_ar.sampling.processing import build_pipeline, kth_largest


def reference(logits, cfg, allowed, forced_tok, temperature, top_k, top_p):
    c, u = logits.double()
    z = u + cfg * (c - u)
    z[:, :, ~allowed] = float("-inf")
    out = torch.empty_like(z)
    for b in range(z.shape[0]):
        for j in range(z.shape[1]):
            row = z[b, j].clone()
            if forced_tok[b, j] >= 0:
                out[b, j] = 0
                out[b, j, forced_tok[b, j]] = 1
                continue
            row = row / temperature
            if top_k:
                kth = torch.sort(row, descending=True).values[top_k - 1]
                row[row < kth] = float("-inf")
            if top_p < 1:
                srt, idx = torch.sort(row, descending=True)
                pr = torch.softmax(srt, 0)
                before = pr.cumsum(0) - pr
                drop = before >= top_p
                drop[0] = False
                row[idx[drop]] = float("-inf")
            out[b, j] = torch.softmax(row, 0)
    return out


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, 1.0), (0.7, 20, 1.0), (1.3, None, 0.8), (1.0, 50, 0.9)])
def test_pipeline_matches_reference(temperature, top_k, top_p):
    g = torch.Generator().manual_seed(0)
    V, B, L = 300, 3, 6
    image = torch.arange(V) < 256  # 44 non-image ids
    forced = {5: 256, 11: 257}
    layout = TokenLayout.raster(2, 5, V, torch.arange(256), forced, row_stride=6, length=12)
    logits = torch.randn(2, B, L, V, generator=g) * 3
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11], [3, 4, 5, 6, 7, 8]])
    cfg = DecodeConfig(cfg_scale=3.0, temperature=temperature, top_k=top_k, top_p=top_p)
    pipe = build_pipeline(cfg.with_defaults({}), layout, "linear", torch.device("cpu"), pad=8)
    got = pipe(logits.clone(), positions)
    forced_tok = layout.forced[positions]
    want = reference(logits, 3.0, image, forced_tok, temperature, top_k, top_p)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)


def test_without_guidance_the_conditional_branch_is_used_alone():
    layout = TokenLayout.raster(1, 4, 16)
    pipe = build_pipeline(DecodeConfig().with_defaults({}), layout, "linear", torch.device("cpu"), pad=4)
    logits = torch.randn(1, 1, 4, 16)
    torch.testing.assert_close(pipe(logits.clone(), torch.arange(4).view(1, 4)), torch.softmax(logits[0], -1))


def test_bfloat16_logits_become_float32_probabilities():
    layout = TokenLayout.raster(1, 4, 16)
    pipe = build_pipeline(DecodeConfig(cfg_scale=4.0, top_k=3).with_defaults({}), layout, "linear",
                          torch.device("cpu"), pad=4)
    gen = torch.Generator().manual_seed(0)
    # distinct logits, the same in both branches: random bfloat16 values can tie at the k-th and keep 4
    distinct = torch.stack([torch.randperm(16, generator=gen) for _ in range(8)]).view(1, 2, 4, 16)
    probs = pipe(distinct.expand(2, -1, -1, -1).bfloat16(), torch.arange(4).repeat(2, 1))
    assert probs.dtype == torch.float32
    assert ((probs > 0).sum(-1) == 3).all()


def test_kth_largest_matches_topk_and_keeps_ties():
    x = torch.randn(7, 1000)
    torch.testing.assert_close(kth_largest(x, 37), torch.topk(x, 37).values[:, -1:])
    tied = torch.tensor([[3.0, 1.0, 3.0, 2.0, 3.0]])
    assert kth_largest(tied, 2).item() == 3.0


def test_greedy_keeps_only_the_argmax():
    layout = TokenLayout.raster(1, 4, 16)
    pipe = build_pipeline(DecodeConfig(temperature=0.0).with_defaults({}), layout, "linear", torch.device("cpu"), pad=4)
    logits = torch.randn(1, 1, 4, 16)
    probs = pipe(logits.clone(), torch.arange(4).view(1, 4))
    assert torch.equal(probs.argmax(-1), logits[0].argmax(-1)) and torch.equal(probs.max(-1).values, torch.ones(1, 4))


def test_other_guidance_styles():
    from spec_ar.sampling.processing import ImageTextGuidance, LogSoftmaxGuidance

    z = torch.randn(3, 1, 2, 8)
    torch.testing.assert_close(ImageTextGuidance(3.0, 1.2)(z), z[2] + 1.2 * (z[1] - z[2]) + 3.0 * (z[0] - z[1]))
    lp = torch.log_softmax(z[:2], -1)
    torch.testing.assert_close(LogSoftmaxGuidance(2.5)(z[:2]), lp[1] + 2.5 * (lp[0] - lp[1]))


def test_a_scale_per_position_mixes_each_position_with_its_own_and_the_last_past_the_end():
    layout = TokenLayout.raster(1, 4, 16)
    scales = torch.tensor([2.0, 3.0, 5.0, 7.0])
    pipe = build_pipeline(DecodeConfig(cfg_scale=2.0).with_defaults({}), layout, "linear", torch.device("cpu"),
                          pad=4, scales=scales)
    logits = torch.randn(2, 1, 6, 16, dtype=torch.float64).float()
    positions = torch.tensor([[0, 1, 2, 3, 4, 7]])  # the last two past the stream's end
    want = [torch.softmax(logits[1, 0, i] + s * (logits[0, 0, i] - logits[1, 0, i]), -1)
            for i, s in enumerate([2.0, 3.0, 5.0, 7.0, 7.0, 7.0])]
    torch.testing.assert_close(pipe(logits.clone(), positions)[0], torch.stack(want))
    with pytest.raises(Exception, match="linear guidance only"):
        build_pipeline(DecodeConfig(cfg_scale=2.0).with_defaults({}), layout, "log_softmax", torch.device("cpu"),
                       pad=4, scales=scales)
