"""NVIDIA's Cosmos DV8x16x16 tokenizer (SimpleAR's): its TorchScript ``decoder.jit`` read without
``torch.jit.load``, and its decoder against NVIDIA's own code on the same codes (``reference/cosmos.json``
and ``cosmos.safetensors``, recorded by ``cosmos_reference.py``)."""
import json
import math
import pathlib
import pickle
import zipfile

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from spec_ar.decoders.cosmos import DV_LEVELS, CosmosDecoder, CosmosSpec, find_cosmos_decoder
from spec_ar.formats.checkpoints import CheckpointError
from spec_ar.formats.torchscript import load_torchscript_tensors

from .cosmos_files import ATTN_LEVELS, WIDTHS, write_cosmos_decoder

REFERENCE = pathlib.Path(__file__).parent / "reference" / "cosmos.json"
REFERENCE_TENSORS = REFERENCE.with_suffix(".safetensors")


class Tensors(nn.Module):
    """A module tree with what an archive can hold: parameters, buffers of several dtypes, a buffer that
    shares its storage with another, a submodule reached twice."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 3)
        self.again = self.linear
        self.register_buffer("levels", torch.tensor([8, 5, 5], dtype=torch.int32))
        self.register_buffer("bf16", torch.arange(4, dtype=torch.bfloat16))
        self.register_buffer("tail", self.bf16[1:])
        self.inner = nn.Sequential(nn.Conv2d(1, 2, 1), nn.GroupNorm(1, 2))

    def forward(self, x):
        return self.inner(self.linear(x).unsqueeze(0)) + self.again(x) + self.levels.sum()


def trace(module: nn.Module, example: torch.Tensor, path: pathlib.Path) -> pathlib.Path:
    torch.jit.trace(module.eval(), example).save(str(path))
    return path


def rezip(source: pathlib.Path, target: pathlib.Path, replace: dict[str, bytes]) -> pathlib.Path:
    """``source`` with the members named in ``replace`` given new contents."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            new.writestr(info.filename, replace.get(info.filename, old.read(info.filename)))
    return target


def test_the_reader_returns_every_tensor_of_the_module_tree(tmp_path):
    module = Tensors()
    path = trace(module, torch.randn(1, 3, 2), tmp_path / "tensors.jit")
    tensors = load_torchscript_tensors(path)
    expected = dict(module.state_dict(keep_vars=True))  # parameters and buffers, the shared module twice
    assert set(tensors) == set(expected)
    for name, tensor in expected.items():
        assert tensors[name].dtype == tensor.dtype and tensors[name].shape == tensor.shape, name
        assert torch.equal(tensors[name], tensor.detach()), name
    assert tensors["levels"].dtype == torch.int32 and tensors["bf16"].dtype == torch.bfloat16
    # a storage two tensors share is read once and stays shared
    assert tensors["tail"].untyped_storage().data_ptr() == tensors["bf16"].untyped_storage().data_ptr()
    assert tensors["tail"].storage_offset() == 1


def test_an_archive_that_would_run_code_is_refused_before_anything_runs(tmp_path):
    path = trace(Tensors(), torch.randn(1, 3, 2), tmp_path / "tensors.jit")
    marker = tmp_path / "opened-by-the-pickle"

    class Opens:
        def __reduce__(self):
            return open, (str(marker), "w")

    root = zipfile.ZipFile(path).namelist()[0].split("/")[0]
    bad = rezip(path, tmp_path / "bad.jit", {f"{root}/data.pkl": pickle.dumps(Opens(), protocol=2)})
    with pytest.raises(CheckpointError, match=r"bad\.jit: refused: its .*data\.pkl names io\.open"):
        load_torchscript_tensors(bad)
    assert not marker.exists()


def test_files_that_are_no_archive_are_one_clear_error_each(tmp_path):
    (tmp_path / "text.jit").write_text("not a zip")
    with pytest.raises(CheckpointError, match=r"text\.jit: not a TorchScript archive \(a zip file"):
        load_torchscript_tensors(tmp_path / "text.jit")
    with zipfile.ZipFile(tmp_path / "empty.jit", "w") as z:
        z.writestr("archive/version", "3")
    with pytest.raises(CheckpointError, match=r"empty\.jit: not a TorchScript archive \(no <name>/data\.pkl"):
        load_torchscript_tensors(tmp_path / "empty.jit")
    path = trace(Tensors(), torch.randn(1, 3, 2), tmp_path / "tensors.jit")
    weight = next(n for n in zipfile.ZipFile(path).namelist() if "/data/" in n and not n.endswith("/"))
    short = rezip(path, tmp_path / "short.jit", {weight: b"\0\0"})
    with pytest.raises(CheckpointError, match=r"short\.jit: storage .* holds 2 bytes where .* truncated"):
        load_torchscript_tensors(short)
    with pytest.raises(CheckpointError, match="no such file"):
        load_torchscript_tensors(tmp_path / "missing.jit")


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> pathlib.Path:
    return write_cosmos_decoder(tmp_path_factory.mktemp("cosmos"))


@pytest.fixture(scope="module")
def decoder(archive):
    return CosmosDecoder.load(archive)


def test_the_architecture_is_read_from_the_tensors(decoder, archive):
    assert decoder.spec == CosmosSpec(widths=WIDTHS, num_res_blocks=1, attn_levels=ATTN_LEVELS, z_channels=4,
                                      embedding_dim=6, levels=DV_LEVELS, patch_size=4)
    assert decoder.spec.downsample == 16 and decoder.spec.n_embed == 64000
    assert decoder.spec.upsampling(2) == (True, False) and decoder.spec.upsampling(1) == (True, True)
    assert find_cosmos_decoder(archive.parent) == archive and find_cosmos_decoder(archive.parent / "x") is None
    assert CosmosDecoder.load(archive.parent).spec == decoder.spec  # the folder of the download loads too


def test_pixels_equal_nvidias_decoder_on_the_same_codes(decoder):
    reference = load_file(str(REFERENCE_TENSORS))
    for image in json.loads(REFERENCE.read_text())["images"]:
        codes, key = torch.tensor(image["codes"]), image["key"]
        h, w = image["grid"]
        raw = decoder.model.decode_codes(codes)  # about [-1, 1], before the clamp
        assert raw.shape == reference[f"{key}.float"].shape == (image["batch"], 3, 16 * h, 16 * w)
        assert (raw - reference[f"{key}.float"]).abs().max() <= 1e-4, key
        ours = decoder.decode(codes)  # [B, 3, 16h, 16w] in [0, 1]
        pixels = (ours * 255 + 0.5).floor().permute(0, 2, 3, 1)  # as save_image(normalize, value_range=(-1, 1))
        saved = reference[f"{key}.uint8"].float()
        assert (pixels - saved).abs().max() <= 1, key
        assert saved.std() > 20  # a picture, not a flat field


def test_the_codebook_is_the_fsq_grid(decoder):
    book = decoder.codebook()
    assert book.shape == (64000, 6) and book.dtype == torch.float32
    recorded = json.loads(REFERENCE.read_text())["fsq"]  # NVIDIA's indices_to_codes
    assert torch.equal(book[torch.tensor(recorded["indices"])], torch.tensor(recorded["codes"]))
    index = torch.arange(64000)
    for d, (level, basis) in enumerate(zip(DV_LEVELS, [1, 8, 64, 512, 2560, 12800])):
        digit = index // basis % level
        assert torch.equal(book[:, d], (digit - level // 2) / (level // 2))
    assert len(set(map(tuple, book.tolist()))) == 64000


def test_a_batch_decodes_as_its_images_one_by_one(decoder):
    codes = torch.randint(0, 64000, (3, 2, 3), generator=torch.Generator().manual_seed(0))
    batch = decoder.decode(codes)
    alone = torch.cat([decoder.decode(c[None]) for c in codes])
    assert batch.shape == (3, 3, 32, 48) and torch.allclose(batch, alone, atol=1e-5)


def test_bad_codes_are_refused(decoder):
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 64000\)"):
        decoder.decode(torch.full((1, 2, 2), 64000))
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 64000\)"):
        decoder.decode(torch.full((1, 2, 2), -1))
    with pytest.raises(ValueError, match=r"codes must be \[B, h, w\]"):
        decoder.decode(torch.zeros(1, 1, 2, 2, dtype=torch.long))  # SimpleAR's [B, 1, h, w]: the frame axis


def test_archives_that_are_no_dv_decoder_are_refused(tmp_path, archive):
    other = trace(nn.Sequential(nn.Linear(4, 4)), torch.randn(1, 4), tmp_path / "decoder.jit")
    with pytest.raises(CheckpointError, match=r"decoder\.jit: not a Cosmos DV tokenizer's decoder \(no tensor "
                                              r"'post_quant_conv\.conv3d\.weight'"):
        CosmosDecoder.load(other)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"empty: no decoder\.jit .* in the folder"):
        CosmosDecoder.load(tmp_path / "empty")
    tensors = load_torchscript_tensors(archive)
    less = dict(tensors)
    del less["decoder.up.1.block.1.conv2.1.conv3d.weight"]
    with pytest.raises(CheckpointError, match=r"tiny: not a Cosmos DV decoder .* no tensor "
                                              r"'decoder\.up\.1\.block\.1\.conv2\.1\.conv3d\.weight'"):
        CosmosDecoder.from_tensors(less, source="tiny")
    cubic = dict(tensors, **{"decoder.mid.block_1.conv1.0.conv3d.weight": torch.zeros(8, 8, 3, 3, 3)})
    with pytest.raises(CheckpointError, match=r"'decoder\.mid\.block_1\.conv1\.0\.conv3d\.weight' has shape "
                                              r"\[8, 8, 3, 3, 3\] where a Cosmos DV decoder needs \[8, 8, 1, 3, 3\]"):
        CosmosDecoder.from_tensors(cubic, source="tiny")
    extra = dict(tensors, **{"decoder.up.0.upsample.conv1.conv3d.weight": torch.zeros(4, 4, 3, 1, 1)})
    with pytest.raises(CheckpointError, match=r"'decoder\.up\.0\.upsample\.conv1\.conv3d\.weight' is no part"):
        CosmosDecoder.from_tensors(extra, source="tiny")
    projected = dict(tensors, **{"inv_quant.quantizer._levels": torch.tensor([8, 5, 5], dtype=torch.int32)})
    with pytest.raises(CheckpointError, match=r"post_quant_conv takes 6 channels where the FSQ levels \[8, 5, 5\]"):
        CosmosDecoder.from_tensors(projected, source="tiny")


def test_bfloat16_archives_load_and_decode_in_any_dtype(tmp_path, decoder):
    path = write_cosmos_decoder(tmp_path, dtype=torch.bfloat16)
    assert load_torchscript_tensors(path)["decoder.conv_in.0.conv3d.weight"].dtype == torch.bfloat16
    as_float = CosmosDecoder.load(path)
    assert as_float.spec == decoder.spec and next(as_float.model.parameters()).dtype == torch.float32
    as_bf16 = CosmosDecoder.load(path, dtype=torch.bfloat16)
    assert next(as_bf16.model.parameters()).dtype == torch.bfloat16
    codes = torch.randint(0, 64000, (1, 2, 3), generator=torch.Generator().manual_seed(2))
    exact = decoder.decode(codes)
    for loaded, tolerance in ((as_float, 0.005), (as_bf16, 0.01)):  # rounded weights: close, not equal
        images = loaded.decode(codes)
        assert images.dtype == torch.float32 and images.shape == exact.shape
        assert (images - exact).abs().mean() < tolerance


def test_memory_per_image_is_the_last_levels_activations_or_the_middle_attention(decoder):
    itemsize = 4
    small = decoder.bytes_per_image((2, 3))
    # the last level's 4 channels at 4x4 features per code (the inverse Haar makes the 16x16 pixels)
    assert small >= 8 * (2 * 3 * 16) * WIDTHS[0] * itemsize
    big = decoder.bytes_per_image((64, 64))
    assert big >= (64 * 64) ** 2 * itemsize  # the middle's attention map over every code
    assert big > small
    assert math.isclose(decoder.bytes_per_image((3, 2)), small)
