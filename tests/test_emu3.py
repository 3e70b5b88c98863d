"""Emu3 through transformers: cache, greedy decoding, layout and guidance against the model's own forward."""
from __future__ import annotations

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from spec_ar.decoders.blocks import unit_range
from spec_ar.loaders import emu3
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder
from spec_ar.sampling.processing import GUIDANCE, LogSoftmaxGuidance

from .emu3_files import tiny_emu3_vq, write_emu3

PROMPTS = ["a red circle", "a blue cat in the top left on striped background"]
NEGATIVES = ["blurry", "dark, low quality"]
RES, GRID = 32, 4  # 4 x 4 tokens at the tiny VQ's downsample 8
MODES = ("ar", "sjd", "gsd", "lantern", "vvs")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return emu3.load(write_emu3(tmp_path_factory.mktemp("emu3") / "Emu3-Gen-tiny", seed=1), resolution=RES)


def hf_logits(model, ids: list[int], stream: torch.Tensor) -> torch.Tensor:
    """transformers' forward on the whole unpadded sequence: logits ``[T, V]`` of the stream positions."""
    full = torch.tensor([ids + stream.tolist()])
    return model(input_ids=full).logits[0, len(ids) - 1:-1].float()


def random_streams(ad, batch: int, seed=0) -> torch.Tensor:
    """Valid streams: random visual tokens at free positions, the forced ones elsewhere."""
    g = torch.Generator().manual_seed(seed)
    vis = ad.vocab.code2id
    lay = ad.layout
    tokens = vis[torch.randint(0, vis.numel(), (batch, lay.length), generator=g)]
    return torch.where(lay.forced >= 0, lay.forced, tokens)


@torch.no_grad()
def test_window_logits_equal_full_forward_and_token_by_token(loaded):
    ad, model = loaded.adapter, loaded.adapter.model
    streams = random_streams(ad, 2)
    rows = [ad.prompt_ids(p) for p in PROMPTS + NEGATIVES]
    ref = torch.stack([hf_logits(model, r, streams[i % 2]) for i, r in enumerate(rows)]).view(2, 2, -1, ad.vocab_size)
    tol = dict(atol=1e-4, rtol=1e-4)

    first = ad.prefill(PROMPTS, NEGATIVES, guided=True)
    window = ad.forward(streams[:, :9])  # positions 1..9 in one forward
    torch.testing.assert_close(torch.cat([first.unsqueeze(2), window], 2), ref[:, :, :10], **tol)
    # ragged rollback: sample 0 keeps 4 of the 9 rows, sample 1 all 9; then continue
    ad.rollback([5, 0])
    assert ad.cache_lengths().tolist() == [4, 9]
    nxt = ad.forward(torch.stack([streams[0, 4:10], streams[1, 9:15]]))
    torch.testing.assert_close(nxt[:, 0], ref[:, 0, 5:11], **tol)
    torch.testing.assert_close(nxt[:, 1], ref[:, 1, 10:16], **tol)

    ad.prefill(PROMPTS, NEGATIVES, guided=True)  # one token per forward gives the same rows
    steps = torch.cat([ad.forward(streams[:, t:t + 1]) for t in range(12)], 2)
    torch.testing.assert_close(steps, ref[:, :, 1:13], **tol)
    ad.release()


@torch.no_grad()
def greedy_reference(model, ad, prompt: str) -> torch.Tensor:
    """A plain greedy loop over transformers' forward on the full sequence: the forced token at
    structural positions, the best visual token elsewhere."""
    ids = ad.prompt_ids(prompt)
    vis = ad.vocab.code2id
    out = []
    for t in range(ad.layout.length):
        logits = model(input_ids=torch.tensor([ids + out])).logits[0, -1]
        forced = int(ad.layout.forced[t])
        out.append(forced if forced >= 0 else int(vis[logits[vis].argmax()]))
    return torch.tensor(out)


def test_greedy_ar_equals_plain_greedy_loop(loaded):
    ad = loaded.adapter
    ours = SpeculativeDecoder(ad, DecodeConfig(mode="ar", top_k=1, cfg_scale=1.0)).generate(PROMPTS)
    ref = torch.stack([greedy_reference(ad.model, ad, p) for p in PROMPTS])
    free = ad.layout.forced < 0
    assert torch.equal(ours.tokens[:, free], ref[:, free])
    assert len(set(ref[:, free].flatten().tolist())) > 4, "a non-trivial token stream"


def test_guided_greedy_ar_equals_transformers_generate_with_negative_prompt(loaded):
    """The reference pipeline: ``generate`` with a negative prompt (log-softmax CFG 3) and a
    prefix constraint for the layout."""
    ad, model, lay = loaded.adapter, loaded.adapter.model, loaded.adapter.layout
    ids = torch.tensor([ad.prompt_ids(PROMPTS[1])])
    neg = torch.tensor([ad.prompt_ids(NEGATIVES[0])])
    vis = ad.vocab.code2id.tolist()

    def allowed(batch_id, seq):
        t = seq.shape[0] - ids.shape[1]
        tok = int(lay.forced[t]) if t < lay.length else ad.tokenizer.eos_token_id
        return [tok] if tok >= 0 else vis

    ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=lay.length,
                         do_sample=False, prefix_allowed_tokens_fn=allowed, guidance_scale=3.0,
                         negative_prompt_ids=neg, negative_prompt_attention_mask=torch.ones_like(neg))
    ours = SpeculativeDecoder(ad, DecodeConfig(mode="ar", top_k=1)).generate(PROMPTS[1:], NEGATIVES[:1])
    assert torch.equal(ours.tokens[0], ref[0, ids.shape[1]:])


@pytest.mark.parametrize("batch", [1, 2])
def test_every_mode_decodes_images_with_forced_tokens_in_place(loaded, batch):
    ad = loaded.adapter
    v, W, stride = ad.vocab, GRID, GRID + 1
    eol_at = [r * stride + W for r in range(GRID)]
    free = ad.layout.forced < 0
    assert int(free.sum()) == GRID * GRID and ad.layout.length == GRID * stride + 2
    grids = []
    for mode in MODES:
        cfg = DecodeConfig(mode=mode, window=4, lantern_k=20)
        res = SpeculativeDecoder(ad, cfg).generate(PROMPTS[:batch], seeds=2)
        tok = res.tokens
        assert (tok[:, eol_at] == v.eol).all(), mode
        assert (tok[:, -2] == v.eof).all() and (tok[:, -1] == v.eoi).all(), mode
        assert not (tok[:, free] == v.eol).any(), mode
        assert (v.id2code[tok[:, free]] >= 0).all(), f"{mode}: only visual tokens at free positions"
        grids.append(res.image_tokens(ad.layout))
    images = loaded.decode(torch.cat(grids))  # one VQ call for every mode (the VQ dominates CPU time)
    assert images.shape == (len(MODES) * batch, 3, RES, RES)
    assert 0 <= float(images.min()) and float(images.max()) <= 1


@torch.no_grad()
def test_decode_matches_transformers_decode_image_tokens(loaded):
    """Our id -> code map (ids are shuffled in the tiny vocabulary) against transformers' own."""
    ad = loaded.adapter
    streams = random_streams(ad, 2, seed=4)
    ours = loaded.decode(streams[:, ad.layout.forced < 0].view(2, GRID, GRID))
    eos = torch.full((2, 1), ad.tokenizer.eos_token_id)
    pixels = ad.model.decode_image_tokens(image_tokens=torch.cat([streams, eos], 1), height=GRID, width=GRID)
    torch.testing.assert_close(ours, ((pixels.float() + 1) / 2).clamp(0, 1))


@torch.no_grad()
def test_negative_prompts_drive_the_log_softmax_guidance(loaded):
    ad = loaded.adapter
    assert ad.guidance == "log_softmax" and GUIDANCE[ad.guidance] is LogSoftmaxGuidance
    assert ad.sampling_defaults["cfg_scale"] == 3.0 and ad.sampling_defaults["top_k"] == 2048
    a = ad.prefill(PROMPTS, NEGATIVES, guided=True)
    b = ad.prefill(PROMPTS, ["text, watermark", NEGATIVES[1]], guided=True)
    assert torch.equal(a[0], b[0]), "the conditional branch ignores the negative prompt"
    assert not torch.allclose(a[1, 0], b[1, 0]) and torch.allclose(a[1, 1], b[1, 1])
    default = ad.prefill(PROMPTS, None, guided=True)
    torch.testing.assert_close(default, ad.prefill(PROMPTS, [emu3.DEFAULT_NEGATIVE] * 2, guided=True))
    assert ad.prefill(PROMPTS, None, guided=False).shape == (1, 2, ad.vocab_size)
    ad.release()

    dec = SpeculativeDecoder(ad, DecodeConfig(mode="ar"))  # the family's cfg 3.0
    mix = dec.pipeline.guidance
    assert isinstance(mix, LogSoftmaxGuidance) and mix.scale == 3.0
    lp = torch.log_softmax(a, -1)
    torch.testing.assert_close(mix(a), lp[1] + 3.0 * (lp[0] - lp[1]))
    assert not torch.allclose(mix(a)[0], mix(b)[0]), "a different negative prompt changes the guided logits"
    with pytest.raises(ValueError, match="negative prompt must be text"):
        ad.check_conditions(PROMPTS, [3, None])


def test_resolution_must_be_a_multiple_of_the_downsample(loaded):
    assert loaded.family == "emu3" and loaded.condition == "text" and loaded.info == {"resolution": RES, "grid": GRID}
    assert 720 in loaded.resolutions and all(r % 8 == 0 for r in loaded.resolutions)
    with pytest.raises(ValueError, match=r"multiple of 8 pixels .* from 8 to 752.*\(got 36\)"):
        loaded.resize(36)
    bigger = loaded.resize(40)
    assert bigger.info["grid"] == 5 and bigger.adapter.layout.length == 5 * 6 + 2
    assert bigger.modules["emu3"] is loaded.modules["emu3"], "resizing reuses the loaded model"


@torch.no_grad()
def full_stack_decode(vq, codes: torch.Tensor) -> torch.Tensor:
    """The previous decode, through transformers: ``Emu3VQVAE.decode`` of the latent frame as a one-frame
    video; its temporal stack upsamples 1 frame to 4 and the 2D decoder decodes all of them.  Returns the
    whole video ``[B, 4, 3, H, W]``; the picture is frame 0 (what ``decode`` returns for an image)."""
    video = vq.decode(codes.unsqueeze(1))
    assert video.shape[1] == vq.config.temporal_downsample_factor == 4
    return video


@torch.no_grad()
def test_decode_equals_frame_zero_of_the_four_frame_decode_and_decodes_one_frame(loaded):
    ad = loaded.adapter
    vq = ad.model.model.vqmodel
    codes = torch.randint(0, vq.config.codebook_size, (2, 6, 5), generator=torch.Generator().manual_seed(5))
    video = full_stack_decode(vq, codes)
    assert video.shape == (2, 4, 3, 48, 40)
    assert not torch.allclose(video[:, 0], video[:, 1], atol=1e-3), "the frames differ: which one is kept matters"
    assert torch.equal(vq.decode(codes), video[:, 0]), "transformers' image decode keeps frame 0"

    frames = []
    hook = vq.decoder.conv_out.register_forward_hook(lambda module, args, out: frames.append(out.shape[0]))
    try:
        ours = emu3.decode_first_frame(vq, codes)
        pictures = loaded.decode(ad.vocab.code2id[codes])  # visual token ids -> [0, 1]
    finally:
        hook.remove()
    assert frames == [2, 2], "one frame per image through the 2D decoder (the previous decode: 4)"
    torch.testing.assert_close(ours, video[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pictures, unit_range(video[:, 0] * 0.5 + 0.5), atol=1e-5, rtol=1e-5)


class LiveTensorBytes(TorchDispatchMode):
    """Bytes of the tensors that the ops run under it made and that are still alive, after each op, and
    their peak (each storage counted once, views included; ``keep``: tensors not to count, the weights)."""

    def __init__(self, keep=()):
        super().__init__()
        self.skip = {t.untyped_storage().data_ptr() for t in keep}
        self.live, self.peak = {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key not in self.skip and (key not in self.live or self.live[key][0].expired()):
                    self.live[key] = (StorageWeakRef(storage), storage.nbytes())
        self.live = {k: v for k, v in self.live.items() if not v[0].expired()}
        self.peak = max(self.peak, sum(n for _, n in self.live.values()))
        return out


def measured_peak(vq, decode, *args) -> tuple[int, torch.Tensor]:
    """The peak bytes of the tensors ``decode(*args)`` makes (the weights of ``vq`` left out), and its result."""
    with torch.no_grad(), LiveTensorBytes(keep=[*vq.parameters(), *vq.buffers()]) as live:
        out = decode(*args)
    return live.peak, out


@pytest.mark.parametrize("side", [128, 256])
def test_decode_memory_estimate_within_1_5x_of_the_measured_peak(loaded, side):
    """The tiny model (32 channels at every level) through the loaded model's own decode."""
    model = loaded.resize(side)
    vq = model.adapter.model.model.vqmodel
    grid = side // 8
    tokens = model.adapter.vocab.code2id[torch.randint(0, vq.config.codebook_size, (1, grid, grid))]
    peak = measured_peak(vq, model.decode, tokens)[0]
    assert peak > 30 * side * side, "the decode's activations were counted"
    assert peak / 1.5 <= model.decode_bytes_per_image <= 1.5 * peak


def test_decode_memory_estimate_with_the_released_vq_layout():
    """Emu3-Gen's VQ layout (channel multipliers 1, 2, 2, 4, two blocks a level, attention at the coarsest
    level) at 32 base channels: the peak is the first full-resolution block, twice as wide as the output;
    the previous four-frame decode held more than 6 times as much, for the same picture."""
    vq = tiny_emu3_vq(base_channels=32, channel_multiplier=[1, 2, 2, 4], num_res_blocks=2, hidden_size=128)
    g = torch.Generator().manual_seed(1)
    for side in (96, 128):
        codes = torch.randint(0, vq.config.codebook_size, (1, side // 8, side // 8), generator=g)
        peak = measured_peak(vq, emu3.decode_first_frame, vq, codes)[0]
        estimate = emu3.decode_bytes(vq.config, side, torch.float32)
        assert peak / 1.5 <= estimate <= 1.5 * peak, side
    ours, image = measured_peak(vq, emu3.decode_first_frame, vq, codes[:, :8, :8])
    before, video = measured_peak(vq, full_stack_decode, vq, codes[:, :8, :8])
    torch.testing.assert_close(image, video[:, 0], atol=1e-5, rtol=1e-5)
    assert before > 6 * ours
