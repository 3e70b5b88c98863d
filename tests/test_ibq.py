"""Emu3.5's IBQ vision tokenizer (``decoders/ibq.py``) against the authors' decoder on the same codes
(``reference/ibq.json``, recorded by ``ibq_reference.py`` from baaivision/Emu3.5's own code), its release
layout (``config.yaml`` + ``model.ckpt``), where it is found beside an Emu3.5 folder, and the files it
refuses."""
import json
import pathlib

import pytest
import torch
import yaml

from spec_ar.decoders.blocks import decoder_bytes
from spec_ar.decoders.ibq import CKPT_NAME, CONFIG_NAME, DECODER_SIDE, IBQDecoder, IBQSpec, find_ibq
from spec_ar.formats.checkpoints import CheckpointError

from .ibq_files import CONFIG, DDCONFIG, N_EMBED, SPEC, random_state, write_config, write_ibq

REFERENCE = pathlib.Path(__file__).parent / "reference" / "ibq.json"
#: float32 against the reference's float output, in its [-1, 1] units (measured: 7e-6, the record's 6 decimals
#: and attention computed by SDPA here, by bmm and softmax there)
FLOAT_TOL = 1e-4
#: bfloat16 against float32, on [0, 1] pixels (measured on the tiny model: at most 0.037, 0.004 on average)
BF16_MAX, BF16_MEAN = 0.06, 0.01


def reference_images():
    return json.loads(REFERENCE.read_text())["images"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_ibq(tmp_path_factory.mktemp("models") / "Emu3.5-VisionTokenizer")


@pytest.fixture(scope="module")
def decoder(folder):
    return IBQDecoder.load(folder)


def authors_uint8(x: torch.Tensor) -> torch.Tensor:
    """``decode_image``'s pixels from a float output ``[3, H, W]``: ``((x + 1) * 127.5).clamp(0, 255)`` cast to
    uint8 (truncated), ``[H, W, 3]``."""
    return ((x.permute(1, 2, 0) + 1.0) * 127.5).clamp(0, 255).to(torch.uint8)


def check_against_reference(decoder, device="cpu"):
    for image in reference_images():
        h, w = image["grid"]
        codes = torch.tensor(image["codes"]).view(1, h, w)
        ours = decoder.model.decode_codes(codes.to(device)).float().cpu()[0]
        reference = torch.tensor(image["float"])
        assert ours.shape == reference.shape == (3, 16 * h, 16 * w)
        assert (ours - reference).abs().max() <= FLOAT_TOL, (h, w)
        # the uint8 pixels: equal, but where the reference sits on a level's edge (truncation flips there)
        pixels, recorded = authors_uint8(ours).int(), torch.tensor(image["uint8"])
        scaled = (reference.permute(1, 2, 0) + 1.0) * 127.5
        on_edge = (scaled - scaled.round()).abs() <= FLOAT_TOL * 127.5
        assert (pixels == recorded)[~on_edge].all() and (pixels - recorded).abs().max() <= 1, (h, w)
        assert recorded.float().std() > 30  # a picture, not a flat field
        # the decoder interface: [0, 1], the same values
        unit = decoder.decode(codes.to(device))[0].permute(1, 2, 0).cpu()
        assert unit.dtype == torch.float32 and 0 <= unit.min() and unit.max() <= 1
        assert (unit * 255 - recorded).abs().max() <= 1 + 1e-3


def test_the_architecture_is_read_from_config_yaml(decoder):
    assert decoder.spec == SPEC and decoder.spec.downsample == 16 and decoder.spec.n_embed == N_EMBED
    recorded = yaml.safe_load(json.loads(REFERENCE.read_text())["config"])
    assert recorded == CONFIG  # the reference decoded the file these tests write


def test_pixels_equal_the_authors_decoders(decoder):
    check_against_reference(decoder)
    assert {tuple(image["grid"]) for image in reference_images()} == {(3, 3), (2, 5)}  # one grid not square


def test_only_the_decoding_half_is_read(folder, decoder):
    read = set(decoder.model.state_dict())
    stored = set(random_state())
    assert read == {k for k in stored if k.startswith(DECODER_SIDE)}
    assert {k.split(".")[0] for k in stored - read} == {"encoder", "quant_conv"}


def test_bfloat16_is_close_to_float32(folder, decoder):
    half = IBQDecoder.load(folder, dtype=torch.bfloat16)
    assert half.model.post_quant_conv.weight.dtype == torch.bfloat16
    for image in reference_images():
        codes = torch.tensor(image["codes"])[None]
        ours, full = half.decode(codes), decoder.decode(codes)
        assert ours.dtype == torch.float32 and ours.shape == full.shape
        diff = (ours - full).abs()
        assert diff.max() <= BF16_MAX and diff.mean() <= BF16_MEAN, (diff.max(), diff.mean())
    assert half.bytes_per_image((2, 5)) * 2 == decoder.bytes_per_image((2, 5))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_in_float32_and_bfloat16(folder, decoder):
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # float32 as float32, as on the CPU
        full = IBQDecoder.load(folder, device="cuda")
        assert full.device.type == "cuda"
        check_against_reference(full, "cuda")
    half = IBQDecoder.load(folder, device="cuda", dtype=torch.bfloat16)
    for image in reference_images():
        codes = torch.tensor(image["codes"])[None].cuda()
        diff = (half.decode(codes).cpu() - decoder.decode(codes.cpu())).abs()
        assert diff.max() <= BF16_MAX and diff.mean() <= BF16_MEAN


def test_a_batch_decodes_as_its_images_one_by_one(decoder):
    codes = torch.randint(0, N_EMBED, (3, 2, 4), generator=torch.Generator().manual_seed(0))
    batch = decoder.decode(codes)
    assert batch.shape == (3, 3, 32, 64)
    assert torch.allclose(batch, torch.cat([decoder.decode(c[None]) for c in codes]), atol=1e-5)


def test_memory_per_image_is_the_last_levels_activations(decoder):
    assert decoder.bytes_per_image((2, 5)) == decoder_bytes(32 * 80, 32, 4)
    assert decoder.bytes_per_image((64, 64)) == 16 * 16 * decoder.bytes_per_image((4, 4))


def test_checkpoint_layouts_the_authors_accept_load(tmp_path, decoder):
    codes = torch.tensor(reference_images()[1]["codes"])[None]
    plain = IBQDecoder.load(write_ibq(tmp_path / "plain", wrapped=False))  # the bare state dict
    assert torch.equal(plain.decode(codes), decoder.decode(codes))
    halves = {k: v for k, v in random_state().items() if k.startswith(DECODER_SIDE)}  # decoding half only
    assert torch.equal(IBQDecoder.load(write_ibq(tmp_path / "half", state=halves)).decode(codes), decoder.decode(codes))
    # either file of the folder names it
    assert IBQDecoder.load(tmp_path / "plain" / CONFIG_NAME).spec == IBQDecoder.load(tmp_path / "plain" / CKPT_NAME).spec


# -- refused ------------------------------------------------------------------------------
def damaged(tmp_path, drop=(), config=CONFIG, **replace):
    state = random_state()
    for k in drop:
        del state[k]
    state.update(replace)
    return write_ibq(tmp_path / "Emu3.5-VisionTokenizer", config=config, state=state)


@pytest.mark.parametrize("case,names", [
    ({"drop": ["quantize.embedding.weight"]}, ["not an IBQ tokenizer checkpoint", "quantize.embedding.weight"]),
    ({"drop": ["decoder.up.4.attn.0.q.weight"]}, ["missing: decoder.up.4.attn.0.q.weight"]),
    ({"drop": ["decoder.up.2.block.1.norm2.bias", "post_quant_conv.bias"]},
     ["missing: post_quant_conv.bias, decoder.up.2.block.1.norm2.bias"]),
    ({"decoder.up.0.attn.0.q.weight": torch.zeros(32, 32, 1, 1)},
     ["not in the configured architecture: decoder.up.0.attn.0.q.weight"]),
    ({"decoder.mid.block_1.conv1.weight": torch.zeros(128, 128, 1, 1)},
     ["wrong shapes: decoder.mid.block_1.conv1.weight [128, 128, 1, 1] (expected [128, 128, 3, 3])"]),
    ({"config": {**CONFIG, "n_embed": 128}}, ["n_embed is 128 in the configuration but quantize.embedding.weight is [96, 256]"]),
    ({"config": {**CONFIG, "ddconfig": {**DDCONFIG, "z_channels": 8}}},
     ["ddconfig.z_channels is 8 in the configuration but post_quant_conv.weight is [16, 256, 1, 1]"]),
    ({"config": {**CONFIG, "ddconfig": {**DDCONFIG, "num_res_blocks": 2}}},
     ["ddconfig.num_res_blocks is 2 but the decoder has 2 blocks per level"]),
], ids=["no-codebook", "no-attention", "two-missing", "extra-attention", "wrong-shape", "n_embed", "z_channels",
        "blocks"])
def test_a_bad_checkpoint_is_refused_by_name(tmp_path, case, names):
    case = dict(case)
    folder = damaged(tmp_path, drop=case.pop("drop", ()), config=case.pop("config", CONFIG), **case)
    with pytest.raises(CheckpointError) as err:
        IBQDecoder.load(folder)
    for name in [str(folder / CKPT_NAME), *names]:
        assert name in str(err.value)


@pytest.mark.parametrize("edit,names", [
    (lambda c: {k: v for k, v in c.items() if k != "ddconfig"}, ["not an IBQ tokenizer configuration", "ddconfig"]),
    (lambda c: {**c, "ddconfig": {k: v for k, v in DDCONFIG.items() if k != "ch"}}, ["missing ddconfig.ch"]),
    (lambda c: {k: v for k, v in c.items() if k != "n_embed"}, ["missing n_embed"]),
    (lambda c: {**c, "ddconfig": {**DDCONFIG, "ch_mult": "1,1,2"}}, ["bad ddconfig.ch_mult: '1,1,2'"]),
    (lambda c: {**c, "ddconfig": {**DDCONFIG, "resamp_with_conv": False}}, ["ddconfig.resamp_with_conv is False"]),
    (lambda c: {**c, "ddconfig": {**DDCONFIG, "give_pre_end": True}}, ["ddconfig.give_pre_end is True"]),
    (lambda c: {**c, "ddconfig": {**DDCONFIG, "ch": 24}}, ["not multiples of 32"]),
    (lambda c: [1, 2], ["not an IBQ tokenizer configuration"]),
], ids=["no-ddconfig", "no-ch", "no-n_embed", "bad-ch_mult", "no-resample-conv", "pre-end", "widths", "a-list"])
def test_a_bad_config_is_refused_by_name_before_the_checkpoint_is_read(tmp_path, edit, names):
    folder = tmp_path / "Emu3.5-VisionTokenizer"
    write_config(folder, edit(CONFIG))
    (folder / CKPT_NAME).write_bytes(b"not read")
    with pytest.raises(CheckpointError) as err:
        IBQDecoder.load(folder)
    for name in [str(folder / CONFIG_NAME), *names]:
        assert name in str(err.value)


def test_unreadable_files_are_refused_by_name(tmp_path):
    folder = tmp_path / "tok"
    write_config(folder)
    with pytest.raises(CheckpointError, match=f"{folder}: no model.ckpt here"):
        IBQDecoder.load(folder)
    torch.save({"state_dict": random_state()}, folder / CKPT_NAME)
    (folder / CKPT_NAME).write_bytes((folder / CKPT_NAME).read_bytes()[:100_000])  # an interrupted download
    with pytest.raises(CheckpointError, match=f"{folder / CKPT_NAME}: cannot be read as a weights-only checkpoint"):
        IBQDecoder.load(folder)
    torch.save([torch.zeros(1)], folder / CKPT_NAME)
    with pytest.raises(CheckpointError, match=f"{folder / CKPT_NAME}: expected a dict of tensors, found list"):
        IBQDecoder.load(folder)
    (folder / CONFIG_NAME).write_text("ddconfig: [unclosed\n")
    with pytest.raises(CheckpointError, match=f"{folder / CONFIG_NAME}: cannot be parsed as yaml"):
        IBQDecoder.load(folder)


class _Exploit:
    """A pickled object whose unpickling would create a file."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_a_pickle_carrying_more_than_tensors_is_refused_unrun(tmp_path):
    folder = write_ibq(tmp_path / "Emu3.5-VisionTokenizer")
    marker = tmp_path / "ran"
    state = random_state()
    torch.save({"state_dict": state, "callbacks": _Exploit(marker)}, folder / CKPT_NAME)
    with pytest.raises(CheckpointError) as err:
        IBQDecoder.load(folder)
    assert str(folder / CKPT_NAME) in str(err.value) and "weights-only" in str(err.value)
    assert not marker.exists()


def test_codes_out_of_range_are_refused(decoder):
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 96\)"):
        decoder.decode(torch.full((1, 2, 2), N_EMBED))
    with pytest.raises(ValueError, match=r"codes must be \[B, h, w\]"):
        decoder.decode(torch.zeros(4, dtype=torch.long))


# -- found beside or inside an Emu3.5 folder ------------------------------------------------
def emu35_folder(root: pathlib.Path) -> pathlib.Path:
    model = root / "Emu3.5-Image"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "Emu3"}')
    return model


def test_found_beside_inside_or_given(tmp_path):
    model = emu35_folder(tmp_path / "a")
    assert find_ibq(model) is None
    beside = write_ibq(tmp_path / "a" / "Emu3.5-VisionTokenizer")
    assert find_ibq(model) == beside
    inside = write_ibq(model / "vision_tokenizer")
    assert find_ibq(model) == inside  # inside the model folder first
    assert find_ibq(model, vq=beside) == beside and find_ibq(model, vq=beside / CKPT_NAME) == beside / CKPT_NAME
    assert find_ibq(model, vq=tmp_path / "a") == beside  # a folder holding it under its hub name
    assert find_ibq(model, vq=tmp_path / "nothing") is None
    assert IBQDecoder.load(find_ibq(model)).spec == SPEC


def test_found_by_its_contents_under_another_name(tmp_path):
    model = emu35_folder(tmp_path)
    other = tmp_path / "a-vqgan"  # config.yaml + model.ckpt of something else: not taken
    other.mkdir()
    (other / CONFIG_NAME).write_text(yaml.safe_dump({"model": {"params": {"embed_dim": 4}}}))
    (other / CKPT_NAME).write_bytes(b"")
    assert find_ibq(model) is None
    renamed = write_ibq(tmp_path / "my-tokenizer")
    assert find_ibq(model) == renamed
    assert IBQSpec.from_yaml(renamed / CONFIG_NAME).n_embed == N_EMBED  # the code count without the weights
