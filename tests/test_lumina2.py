"""Lumina-mGPT 2.0 on a tiny random folder in the release layout (``lumina2_files.py``), against what its authors'
code gave on the same folder (``reference/lumina2.json`` and ``lumina2_logits.safetensors``, recorded by
``lumina2_reference.py`` on transformers 4.46.2): prompt ids, teacher-forced logits of both guidance branches,
the greedy stream under the reference's decaying guidance, and the MoVQGAN's pixels."""
import json
import pathlib

import pytest
import torch

from spec_ar.formats.checkpoints import CheckpointError
from spec_ar.loaders import lumina2
from spec_ar.loaders.detect import detect, load_model
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder
from spec_ar.sampling.processing import NoGuidance, ScheduledGuidance

from .lumina2_files import write_lumina2

REFERENCE = pathlib.Path(__file__).parent / "reference"
MODES = ["ar", "sjd", "gsd", "lantern", "vvs"]


@pytest.fixture(scope="module")
def recorded():
    from safetensors.torch import load_file

    return (json.loads((REFERENCE / "lumina2.json").read_text()),
            load_file(str(REFERENCE / "lumina2_logits.safetensors")))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_lumina2(tmp_path_factory.mktemp("lumina2") / "Lumina-mGPT-2.0")


@pytest.fixture(scope="module")
def model(folder):
    return load_model(folder, width=64, height=64)


def test_detected_by_its_vocabulary_not_its_name(folder, tmp_path):
    from .chameleon_files import write_chameleon

    renamed = tmp_path / "Lumina-mGPT-7B-768"  # Lumina-mGPT's name: the contents decide
    renamed.symlink_to(folder, target_is_directory=True)
    assert detect(folder).family == detect(renamed).family == "lumina2"
    assert detect(write_chameleon(tmp_path / "lumina-1", "lumina")).family == "lumina"  # IMGIMG tokens: not 2.0


def test_prompt_ids_equal_the_reference(model, recorded):
    record, _ = recorded
    for key, ids in record["rows"].items():
        size, prompt = key.split(" ", 1)
        w, h = map(int, size.split("x"))
        ad = model.resize((w, h)).adapter
        # <racm3:break> ends ours (the reference samples it); the BOS is the pad id the reference's generate masks
        assert ad.prompt_ids(prompt) == ids[1:] + [ad.start] and ids[0] == ad.bos == ad.masked, key
    ad = model.adapter
    assert ad.unconditional_ids() == record["forced"][:1]
    assert ad.layout.forced[:2].tolist() == record["forced"][1:]  # the size tokens, forced
    grammar = [t if t >= 0 else None for t in ad.layout.forced.tolist()][2:]
    assert grammar == [None if t not in (151670, 151666) else t for t in record["stream"]]  # row ends, image end


def test_teacher_forced_logits_equal_the_reference(model, recorded):
    record, logits = recorded
    ad, ids = model.adapter, logits["ids"]
    stream = torch.tensor(record["forced"][1:] + record["stream"])
    n = logits["conditional"].shape[0]
    first = ad.prefill([record["greedy_prompt"]], None, guided=True)  # predicts the first size token
    rest = ad.forward(stream[: n + 1].view(1, -1))  # ... and on: position k + 1 from token k
    ours = torch.cat([first.unsqueeze(2), rest], 2)[:, 0, 2:]  # from the first image token, as recorded
    ad.release()
    for branch, name in enumerate(("conditional", "unconditional")):
        diff = (ours[branch][:, ids] - logits[name]).abs().max()
        assert diff < 1e-4, (name, float(diff))


@pytest.mark.parametrize("mode", ["ar", "sjd"])
def test_the_greedy_stream_is_the_references(model, recorded, mode):
    record, _ = recorded
    config = DecodeConfig(mode=mode, top_k=1, cfg_scale=record["cfg"], window=16)
    res = SpeculativeDecoder(model.adapter, config).generate([record["greedy_prompt"]], seeds=0)
    assert res.tokens[0].tolist() == record["forced"][1:] + record["stream"]
    assert len(set(record["stream"])) > 20  # not a constant image


def test_a_constant_guidance_scale_gives_another_stream(model, recorded):
    """The schedule is what the reference runs: a constant scale 7 strays from its stream."""
    record, _ = recorded
    ad = model.adapter
    ad.guidance_scales = lambda scale: None  # the instance's: scale everywhere
    try:
        res = SpeculativeDecoder(ad, DecodeConfig(mode="ar", top_k=1, cfg_scale=record["cfg"])).generate(
            [record["greedy_prompt"]], seeds=0)
    finally:
        del ad.guidance_scales
    assert res.tokens[0].tolist() != record["forced"][1:] + record["stream"]


def test_the_guidance_schedule_is_the_references():
    """``s = max(4, s (1 - n / (H W / 4)))`` at the n-th token after the image start, carried over."""
    s = lumina2.guidance_schedule(7.0, 8, 8, 75)
    assert s[:2].tolist() == [7.0, 7.0]  # the size tokens (forced: no mix matters)
    assert s[2].item() == pytest.approx(7.0 * (1 - 2 / 16)) and s[3].item() == pytest.approx(6.125 * (1 - 3 / 16))
    assert (s[4:] == 4.0).all()
    assert (lumina2.guidance_schedule(2.0, 8, 8, 75)[2:] == 4.0).all()  # below the floor reads as 4
    slow = lumina2.guidance_schedule(10.0, 96, 96, 96 * 97 + 3)  # 768 px: the decay takes a few dozen tokens
    assert 20 < int((slow > 4).sum()) < 80 and (slow[1:] <= slow[:-1]).all()


def test_guidance_is_scheduled_by_position_and_one_turns_it_off(model):
    ad = model.adapter
    mix = SpeculativeDecoder(ad, DecodeConfig(mode="ar", cfg_scale=7.0)).pipeline.guidance
    assert isinstance(mix, ScheduledGuidance) and mix.branches == 2
    logits = torch.randn(2, 1, 3, 5)
    positions = torch.tensor([[2, 3, 40]])
    want = torch.stack([logits[1, 0, i] + s * (logits[0, 0, i] - logits[1, 0, i])
                        for i, s in enumerate(mix.scales[positions[0]].tolist())])
    torch.testing.assert_close(mix(logits.clone(), positions)[0], want)
    assert isinstance(SpeculativeDecoder(ad, DecodeConfig(mode="ar", cfg_scale=1.0)).pipeline.guidance, NoGuidance)


def test_the_decoder_gives_the_reference_decoders_pixels(model, recorded):
    record, _ = recorded
    tokens = torch.tensor([record["forced"][1:] + record["stream"]])
    grid = tokens[:, model.adapter.layout.image_positions()].view(1, 8, 8)  # row ends and the end dropped
    ours = model.decode(grid)[0].permute(1, 2, 0)
    reference = torch.tensor(record["decoded_uint8"], dtype=torch.float32)  # show_images: ((x + 1) * 127.5).round()
    assert ours.shape == reference.shape == (64, 64, 3)
    assert ((ours * 255).round() - reference).abs().max() <= 1
    assert reference.std() > 1  # a picture, not a flat field


def test_every_mode_renders_a_batch(model):
    batch = 2
    ad, lay = model.adapter, model.adapter.layout
    for mode in MODES:
        config = DecodeConfig(mode=mode, window=16, lantern_k=8, group_size=4)
        res = SpeculativeDecoder(ad, config).generate(["a red fox in snow", "blue sky"][:batch], seeds=5)
        images = model.decode(res.image_tokens(lay))
        assert images.shape == (batch, 3, 64, 64) and 0 <= images.min() and images.max() <= 1, mode


def test_non_square_sizes_and_reference_defaults(model):
    wide = model.resize((96, 64))
    assert wide.adapter.layout.grid == (8, 12) and wide.info["width"] == 96 and wide.info["height"] == 64
    ad = model.adapter
    assert ad.sampling_defaults == {"cfg_scale": 4.0, "top_k": 4096, "temperature": 1.0}
    ids, vectors = ad.token_vectors()
    assert torch.equal(ids, torch.arange(155000, 155000 + 16384)) and vectors.shape == (16384, 4)


def test_bad_input_and_missing_files_get_one_clear_error_each(model, folder, tmp_path):
    ad = model.adapter
    with pytest.raises(ValueError, match="Lumina-mGPT 2.0 has no negative prompt"):
        ad.check_conditions(["a cat"], ["blurry"])
    with pytest.raises(ValueError, match="prompt must be non-empty text"):
        ad.check_conditions(["  "], None)
    with pytest.raises(ValueError, match="width must be a positive multiple of 32 pixels .*got 100"):
        load_model(folder, width=100, height=64)
    with pytest.raises(ValueError, match="768x768 needs 9315 image tokens, more than .* 2048 positions"):
        model.resize(768)
    assert load_model(folder).info["width"] == 320  # no size given: 768 does not fit the tiny model's positions
    lone = write_lumina2(tmp_path / "lone" / "Lumina", movqgan=False)
    with pytest.raises(CheckpointError, match="needs SBER-MoVQGAN .* movqgan/270M/ or give --vq"):
        load_model(lone, width=64, height=64)
    given = load_model(lone, vq=folder / "movqgan" / "270M" / "movqgan_270M.ckpt", width=64, height=64)
    assert given.info["vq"].endswith("movqgan_270M.ckpt")
    small = tmp_path / "small"
    small.mkdir()
    for f in folder.iterdir():
        if f.name != "config.json" and not f.suffix == ".safetensors":
            (small / f.name).symlink_to(f, target_is_directory=f.is_dir())
    cfg = json.loads((folder / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**cfg, "vocab_size": 160000}))  # told before the weights are read
    with pytest.raises(CheckpointError, match="the MoVQGAN has 16384 codes but .* vocabulary \\(160000 ids\\)"):
        lumina2.load(small, width=64, height=64)
