"""SBER-MoVQGAN (Lumina-mGPT 2.0's tokenizer) against the reference decoder's pixels on the same codes
(``reference/movqgan.json``, recorded by ``movqgan_reference.py`` from Lumina-mGPT 2.0's own code)."""
import json
import pathlib

import pytest
import torch

from spec_ar.decoders.movqgan import MoVQGANDecoder, MoVQSpec
from spec_ar.formats.checkpoints import CheckpointError

from .movqgan_files import SPEC, random_state, write_movqgan

REFERENCE = pathlib.Path(__file__).parent / "reference" / "movqgan.json"


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    return MoVQGANDecoder.load(write_movqgan(tmp_path_factory.mktemp("movqgan") / "movqgan_tiny.ckpt"))


def test_the_architecture_is_read_from_the_tensors(decoder):
    assert decoder.spec == SPEC and decoder.spec.downsample == 8


def test_pixels_equal_the_reference_decoders(decoder):
    for image in json.loads(REFERENCE.read_text())["images"]:
        h, w = image["grid"]
        ours = decoder.decode(torch.tensor(image["codes"]).view(1, h, w))[0].permute(1, 2, 0)  # [H, W, 3] in [0, 1]
        reference = torch.tensor(image["uint8"], dtype=torch.float32)  # ((x + 1) * 127.5).round() as uint8
        assert ours.shape == reference.shape == (8 * h, 8 * w, 3)
        assert ((ours * 255).round() - reference).abs().max() <= 1, (h, w)
        assert reference.std() > 5  # a picture, not a flat field


def test_a_batch_decodes_as_its_images_one_by_one(decoder):
    codes = torch.randint(0, 64, (3, 2, 4), generator=torch.Generator().manual_seed(0))
    batch = decoder.decode(codes)
    alone = torch.cat([decoder.decode(c[None]) for c in codes])
    assert torch.allclose(batch, alone, atol=1e-5)


def test_other_releases_and_wrapped_checkpoints_load(tmp_path):
    wide = MoVQSpec(ch=32, ch_mult=(1, 2, 2, 4), num_res_blocks=2, attn_levels=(3,), n_embed=16)  # 102M's depth
    path = tmp_path / "wrapped.ckpt"
    torch.save({"state_dict": random_state(1, wide)}, path)  # a training checkpoint's wrapper
    assert MoVQGANDecoder.load(path).spec == wide


def test_bad_checkpoints_are_one_clear_error_each(tmp_path):
    state = random_state()
    del state["decoder.conv_in.weight"]
    torch.save(state, tmp_path / "a.ckpt")
    with pytest.raises(CheckpointError, match="not a MoVQGAN checkpoint .*decoder.conv_in.weight"):
        MoVQGANDecoder.load(tmp_path / "a.ckpt")
    state = random_state()
    del state["decoder.up.1.block.1.conv1.weight"]
    torch.save(state, tmp_path / "b.ckpt")
    with pytest.raises(CheckpointError, match="do not fit the architecture"):
        MoVQGANDecoder.load(tmp_path / "b.ckpt")


def test_codes_out_of_range_are_refused(decoder):
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 64\)"):
        decoder.decode(torch.full((1, 2, 2), 64))
