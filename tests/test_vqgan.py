"""Chameleon's VQGAN: Meta's yaml + ckpt load, decoding follows taming's layout, bad files are refused."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
import yaml

from spec_ar.decoders.vqgan import VQGANDecoder, VQGANModel, VQGANSpec, find_vqgan
from spec_ar.formats.checkpoints import CheckpointError

from .vqgan_files import TINY, TINY_ATTN, TINY_FLAT, Callback, random_vqgan, write_vqgan, yaml_text

SPECS = {"tiny": TINY, "attn": TINY_ATTN, "flat": TINY_FLAT}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("vqgan")
    return {name: write_vqgan(root / name, spec, seed=i) for i, (name, spec) in enumerate(SPECS.items())}


def _codes(spec: VQGANSpec, b=2, h=2, w=3, seed=0):
    return torch.randint(0, spec.n_embed, (b, h, w), generator=torch.Generator().manual_seed(seed))


# -- the architecture ----------------------------------------------------------
def test_the_released_config_has_metas_module_names_and_shapes():
    spec = VQGANSpec.from_config(yaml.safe_load(yaml_text(VQGANSpec())))
    assert spec == VQGANSpec() and spec.downsample == 16 and spec.ch_mult == (1, 1, 2, 2, 4)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in VQGANModel(spec).state_dict().items()}
    assert shapes["quantize.embedding.weight"] == (8192, 256)
    assert shapes["quant_conv.weight"] == (256, 256, 1, 1) and shapes["post_quant_conv.weight"] == (256, 256, 1, 1)
    assert shapes["decoder.conv_in.weight"] == (512, 256, 3, 3)
    assert shapes["decoder.up.4.block.0.conv1.weight"] == (512, 512, 3, 3)  # up[4]: lowest resolution, widest
    assert shapes["decoder.up.3.block.0.nin_shortcut.weight"] == (256, 512, 1, 1)
    assert shapes["decoder.up.1.block.0.nin_shortcut.weight"] == (128, 256, 1, 1)
    assert shapes["decoder.up.0.block.2.conv2.weight"] == (128, 128, 3, 3)  # three blocks per decoder level
    assert "decoder.up.0.upsample.conv.weight" not in shapes and "decoder.up.1.upsample.conv.weight" in shapes
    assert shapes["decoder.mid.attn_1.q.weight"] == (512, 512, 1, 1)
    assert shapes["decoder.conv_out.weight"] == (3, 128, 3, 3)
    assert shapes["encoder.down.0.downsample.conv.weight"] == (128, 128, 3, 3)
    assert "encoder.down.4.downsample.conv.weight" not in shapes and "encoder.down.0.block.2.conv1.weight" not in shapes
    assert shapes["encoder.down.4.block.0.conv1.weight"] == (512, 256, 3, 3)
    assert shapes["encoder.conv_out.weight"] == (256, 512, 3, 3)
    assert not any(".attn.0." in k for k in shapes)  # no attention resolutions


def test_attention_sits_at_the_listed_resolutions():
    keys = VQGANModel(TINY_ATTN).state_dict()
    levels = {(k.split(".")[0], int(k.split(".")[2])) for k in keys if ".attn.0.q.weight" in k}
    assert levels == {("encoder", 2), ("decoder", 2)}  # side 32 / 4 = 8 at level 2 only
    assert "decoder.up.2.attn.1.q.weight" in keys and "encoder.down.2.attn.0.proj_out.weight" in keys


# -- loading and decoding --------------------------------------------------------
@pytest.mark.parametrize("name", list(SPECS))
def test_loading_gives_the_written_weights_and_decodes_to_unit_range(files, name):
    spec, (yaml_path, ckpt_path) = SPECS[name], files[name]
    dec = VQGANDecoder.load(yaml_path, ckpt_path)
    assert dec.spec == spec and dec.source == str(ckpt_path) and dec.device == torch.device("cpu")
    written = random_vqgan(spec, seed=list(SPECS).index(name)).state_dict()
    loaded = dec.model.state_dict()
    assert written.keys() == loaded.keys()
    for k, v in written.items():
        assert torch.equal(v, loaded[k]), k
    assert dec.codebook().shape == (spec.n_embed, spec.embed_dim) and dec.codebook().dtype == torch.float32
    assert torch.equal(dec.codebook(), written["quantize.embedding.weight"])  # as stored, not normalised
    codes = _codes(spec)
    images = dec.decode(codes)
    ds = spec.downsample
    assert images.shape == (2, 3, 2 * ds, 3 * ds) and images.dtype == torch.float32
    assert 0 <= images.min() and images.max() <= 1 and images.std() > 0.01
    with torch.no_grad():
        raw = dec.model.decode_codes(codes)
    assert torch.allclose(images, ((raw + 1) / 2).clamp(0, 1))
    assert raw.min() < 0 < raw.max()  # the model's own range is [-1, 1], not [0, 1]


def test_a_folder_is_found_directly_or_under_tokenizer_or_vqgan(tmp_path):
    direct = write_vqgan(tmp_path / "a", seed=3)
    nested = write_vqgan(tmp_path / "b" / "tokenizer", seed=3)
    other = write_vqgan(tmp_path / "c" / "vqgan", seed=3)
    assert find_vqgan(tmp_path / "a") == direct and find_vqgan(tmp_path / "b") == nested
    assert find_vqgan(tmp_path / "c") == other and find_vqgan(tmp_path) is None
    codes = _codes(TINY)
    ref = VQGANDecoder.load(*direct).decode(codes)
    assert torch.equal(VQGANDecoder.load(tmp_path / "b").decode(codes), ref)
    assert torch.equal(VQGANDecoder.load(other[0]).decode(codes), ref)  # the ckpt next to the yaml


def test_decoder_only_weights_load(files, tmp_path):
    yaml_path, ckpt_path = files["attn"]
    sd = torch.load(ckpt_path, map_location="cpu", weights_only=True)["state_dict"]
    torch.save({"state_dict": {k: v for k, v in sd.items() if not k.startswith(("encoder.", "quant_conv."))}},
               tmp_path / "vqgan.ckpt")
    dec = VQGANDecoder.load(yaml_path, tmp_path / "vqgan.ckpt")
    assert not hasattr(dec.model, "encoder")
    assert torch.equal(dec.decode(_codes(TINY_ATTN)), VQGANDecoder.load(*files["attn"]).decode(_codes(TINY_ATTN)))


def test_bfloat16_weights_still_decode_to_float32(files):
    dec = VQGANDecoder.load(*files["tiny"], dtype=torch.bfloat16)
    ref = VQGANDecoder.load(*files["tiny"]).decode(_codes(TINY))
    images = dec.decode(_codes(TINY))
    assert images.dtype == torch.float32 and (images - ref).abs().max() < 0.1
    assert dec.codebook().dtype == torch.float32


# taming's Decoder written out with functional ops on the checkpoint's tensors ``sd``
def _conv(sd, x, name, pad=1):
    return F.conv2d(x, sd[f"{name}.weight"], sd[f"{name}.bias"], padding=pad)


def _norm(sd, x, name, swish=True):
    y = F.group_norm(x, 32, sd[f"{name}.weight"], sd[f"{name}.bias"], eps=1e-6)
    return y * torch.sigmoid(y) if swish else y


def _resnet(sd, x, name):
    h = _conv(sd, _norm(sd, x, f"{name}.norm1"), f"{name}.conv1")
    h = _conv(sd, _norm(sd, h, f"{name}.norm2"), f"{name}.conv2")
    return h + (_conv(sd, x, f"{name}.nin_shortcut", 0) if f"{name}.nin_shortcut.weight" in sd else x)


def _attention(sd, x, name):
    b, c, hh, ww = x.shape
    y = _norm(sd, x, f"{name}.norm", swish=False)
    q, k, v = (_conv(sd, y, f"{name}.{m}", 0).reshape(b, c, hh * ww) for m in "qkv")
    weights = torch.softmax(torch.bmm(q.transpose(1, 2), k) / c ** 0.5, dim=2)  # [b, query, key]
    return x + _conv(sd, torch.bmm(v, weights.transpose(1, 2)).reshape(b, c, hh, ww), f"{name}.proj_out", 0)


def _upsample(sd, x, name):
    return _conv(sd, F.interpolate(x, scale_factor=2.0, mode="nearest"), f"{name}.conv")


def _start(sd, codes):
    """Codebook lookup, post_quant_conv, conv_in and the middle blocks."""
    z = sd["quantize.embedding.weight"][codes].permute(0, 3, 1, 2)
    x = _conv(sd, _conv(sd, z, "post_quant_conv", 0), "decoder.conv_in")
    x = _resnet(sd, x, "decoder.mid.block_1")
    return _resnet(sd, _attention(sd, x, "decoder.mid.attn_1"), "decoder.mid.block_2")


def _finish(sd, x):
    x = _conv(sd, _norm(sd, x, "decoder.norm_out"), "decoder.conv_out")
    return ((x + 1) / 2).clamp(0, 1)


def _reference_decode(sd, levels: int, codes: torch.Tensor) -> torch.Tensor:
    x = _start(sd, codes)
    for i in range(levels - 1, -1, -1):  # up[levels - 1] is the lowest resolution
        j = 0
        while f"decoder.up.{i}.block.{j}.conv1.weight" in sd:
            x = _resnet(sd, x, f"decoder.up.{i}.block.{j}")
            if f"decoder.up.{i}.attn.{j}.q.weight" in sd:
                x = _attention(sd, x, f"decoder.up.{i}.attn.{j}")
            j += 1
        if i != 0:
            x = _upsample(sd, x, f"decoder.up.{i}.upsample")
    return _finish(sd, x)


def test_two_levels_written_out_by_hand_match_decode(files):
    """The explicit order: up.1 (wide, low resolution), its upsample, then up.0."""
    sd = torch.load(files["tiny"][1], map_location="cpu", weights_only=True)["state_dict"]
    assert sd["decoder.up.1.block.0.conv1.weight"].shape[0] == 64 and sd["decoder.up.0.block.0.conv1.weight"].shape[0] == 32
    codes = _codes(TINY)
    x = _start(sd, codes)
    x = _resnet(sd, _resnet(sd, x, "decoder.up.1.block.0"), "decoder.up.1.block.1")
    x = _upsample(sd, x, "decoder.up.1.upsample")
    x = _resnet(sd, _resnet(sd, x, "decoder.up.0.block.0"), "decoder.up.0.block.1")
    by_hand = _finish(sd, x)
    images = VQGANDecoder.load(*files["tiny"]).decode(codes)
    assert images.shape == by_hand.shape == (2, 3, 4, 6)
    assert (images - by_hand).abs().max() < 1e-5


@pytest.mark.parametrize("name", ["attn", "flat"])
def test_functional_reference_matches_decode(files, name):
    """With attention in the up path, and with equal widths where only ``up``'s order differs."""
    sd = torch.load(files[name][1], map_location="cpu", weights_only=True)["state_dict"]
    codes = _codes(SPECS[name])
    ref = _reference_decode(sd, len(SPECS[name].ch_mult), codes)
    assert (VQGANDecoder.load(*files[name]).decode(codes) - ref).abs().max() < 1e-5
    if name == "flat":  # the reversed order gives another image
        swapped = {k.replace("decoder.up.0.", "decoder.up.X.").replace("decoder.up.1.", "decoder.up.0.")
                   .replace("decoder.up.X.", "decoder.up.1."): v for k, v in sd.items()}
        swapped["decoder.up.1.upsample.conv.weight"] = sd["decoder.up.1.upsample.conv.weight"]
        swapped["decoder.up.1.upsample.conv.bias"] = sd["decoder.up.1.upsample.conv.bias"]
        assert (_reference_decode(swapped, 2, codes) - ref).abs().max() > 1e-3


def test_encode_gives_the_nearest_codes():
    model = random_vqgan(TINY_ATTN, seed=5)
    images = torch.rand(2, 3, 32, 24) * 2 - 1
    with torch.no_grad():
        codes = model.encode(images)
        z = model.quant_conv(model.encoder(images))
    assert codes.shape == (2, 8, 6) and codes.dtype == torch.int64
    flat = z.permute(0, 2, 3, 1).reshape(-1, TINY_ATTN.embed_dim)
    assert torch.equal(codes.flatten(), torch.cdist(flat, model.quantize.embedding.weight).argmin(1))
    with torch.no_grad():
        assert model.decode_codes(codes).shape == (2, 3, 32, 24)


# -- bad input -------------------------------------------------------------------
def test_a_yaml_that_disagrees_with_the_weights_is_one_clear_error(files, tmp_path):
    yaml_path, ckpt_path = write_vqgan(tmp_path, TINY)
    yaml_path.write_text(yaml_text(dataclasses.replace(TINY, n_embed=80)))
    with pytest.raises(CheckpointError) as err:
        VQGANDecoder.load(yaml_path, ckpt_path)
    msg = str(err.value)
    assert str(ckpt_path) in msg and "vqgan.yaml" in msg
    assert "n_embed is 80 in the yaml but 64 in quantize.embedding.weight" in msg
    for wrong, words in ((dict(ch_mult=(1, 2, 2)), "3 levels in the yaml but the decoder has 2"),
                         (dict(num_res_blocks=2), "num_res_blocks is 2 in the yaml but the decoder has 2 blocks"),
                         (dict(z_channels=32), "z_channels is 32 in the yaml but 16"),
                         (dict(attn_resolutions=(16,)), "put attention in decoder levels [1] but the checkpoint "
                                                        "has it in []"),
                         (dict(ch=64), "ch * ch_mult[-1] is 128 in the yaml but 64 in decoder.conv_in.weight")):
        yaml_path.write_text(yaml_text(dataclasses.replace(TINY, **wrong)))
        with pytest.raises(CheckpointError, match="weights do not match") as err:
            VQGANDecoder.load(yaml_path, ckpt_path)
        assert words in str(err.value), str(err.value)


def test_missing_files_and_keys_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="no vqgan.yaml with vqgan.ckpt here, nor under tokenizer/"):
        VQGANDecoder.load(tmp_path)
    yaml_path, ckpt_path = write_vqgan(tmp_path / "t", TINY)
    ckpt_path.unlink()
    with pytest.raises(CheckpointError, match=r"vqgan\.ckpt: no such file"):
        VQGANDecoder.load(yaml_path)
    with pytest.raises(CheckpointError, match=r"nope\.yaml: no such file"):
        VQGANDecoder.load(tmp_path / "nope.yaml", ckpt_path)
    yaml_path.write_text(yaml_text(TINY).replace("      ch: 32\n", ""))
    with pytest.raises(CheckpointError, match="missing model.params.ddconfig.ch$"):
        VQGANSpec.from_yaml(yaml_path)
    yaml_path.write_text(yaml_text(TINY).replace("ch: 32", "ch: [32"))
    with pytest.raises(CheckpointError, match="cannot be parsed as yaml"):
        VQGANSpec.from_yaml(yaml_path)
    yaml_path.write_text("model:\n  params: {embed_dim: 8}\n")
    with pytest.raises(CheckpointError, match="no model.params.ddconfig"):
        VQGANSpec.from_yaml(yaml_path)
    torch.save({"state_dict": {"encoder.conv_in.weight": torch.zeros(1)}}, ckpt_path)
    yaml_path.write_text(yaml_text(TINY))
    with pytest.raises(CheckpointError, match="not a VQGAN checkpoint"):
        VQGANDecoder.load(yaml_path, ckpt_path)


def test_a_checkpoint_pickling_objects_is_refused_without_running_them(tmp_path):
    marker = tmp_path / "ran"
    yaml_path, ckpt_path = write_vqgan(tmp_path, TINY, extra={"callbacks": {"ckpt": Callback(str(marker))}})
    with pytest.raises(CheckpointError) as err:
        VQGANDecoder.load(yaml_path, ckpt_path)
    msg = str(err.value)
    assert msg.startswith(str(ckpt_path)) and "tests.vqgan_files._touch" in msg and "weights-only" in msg
    assert not marker.exists()


def test_codes_out_of_range_are_refused(files):
    dec = VQGANDecoder.load(*files["tiny"])
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        dec.decode(torch.full((1, 2, 2), 64))
    with pytest.raises(ValueError, match=r"\[B, h, w\]"):
        dec.decode(torch.zeros(4, dtype=torch.long))


# -- yaml -----------------------------------------------------------------------------
def test_a_yaml_that_would_build_python_objects_is_refused(files, tmp_path):
    """Tokenizer configs are read with ``yaml.safe_load``: a tag that would construct a
    Python object is an error naming the file, and nothing runs."""
    yaml_path, ckpt_path = files["attn"]
    bad = tmp_path / "vqgan.yaml"
    bad.write_text(yaml_path.read_text() + "hook: !!python/object/apply:os.system ['touch ran']\n")
    with pytest.raises(CheckpointError, match="cannot be parsed as yaml"):
        VQGANDecoder.load(bad, ckpt_path)
    assert not (tmp_path / "ran").exists()
