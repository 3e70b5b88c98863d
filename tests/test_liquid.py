"""Liquid on a tiny random folder in the release layout (``liquid_files.py``), against what Liquid's own
code gave on the same folder (``reference/liquid.json`` and ``liquid_logits.safetensors``, recorded by
``liquid_reference.py`` on transformers 4.39.2): prompt rows, teacher-forced logits, the greedy stream and
the decoder's pixels."""
import json
import pathlib

import pytest
import torch

from spec_ar.formats.checkpoints import CheckpointError
from spec_ar.loaders import liquid
from spec_ar.loaders.detect import detect, load_model
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

from .liquid_files import write_liquid

REFERENCE = pathlib.Path(__file__).parent / "reference"
MODES = ["ar", "sjd", "gsd", "lantern", "vvs"]


@pytest.fixture(scope="module")
def recorded():
    from safetensors.torch import load_file

    return json.loads((REFERENCE / "liquid.json").read_text()), load_file(str(REFERENCE / "liquid_logits.safetensors"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_liquid(tmp_path_factory.mktemp("liquid") / "Liquid_V1_7B")


@pytest.fixture(scope="module")
def model(folder):
    return load_model(folder)


def test_detected_by_its_tokenizer_not_its_name(folder, tmp_path):
    assert detect(folder).family == "liquid"
    renamed = tmp_path / "gemma-7b"
    renamed.symlink_to(folder, target_is_directory=True)
    assert detect(renamed).family == "liquid"
    gemma = tmp_path / "plain-gemma"  # Gemma's own tokenizer: no <boi>, no <unconditional>
    gemma.mkdir()
    for f in folder.iterdir():
        if f.is_file():
            text = f.read_text(encoding="utf-8", errors="ignore") if f.suffix == ".json" else None
            if text is not None and f.name.startswith("tokenizer"):
                text = text.replace("<boi>", "<unused0>").replace("<unconditional>", "<unused2>")
                (gemma / f.name).write_text(text, encoding="utf-8")
            else:
                (gemma / f.name).symlink_to(f)
    with pytest.raises(CheckpointError, match="not a model this pack recognises .*model_type 'gemma'"):
        detect(gemma)


def test_prompt_rows_equal_the_reference(model, recorded):
    record, _ = recorded
    ad = model.adapter
    assert ad.text_ids == record["text_ids"] and ad.codes == 64
    for prompt, rows in record["rows"].items():
        ad.prefill([prompt] * 4, None, guided=True)  # the reference's batch: four samples, four unconditional rows
        ids, mask = ad.prompt_rows
        assert ids.tolist() == rows["input_ids"] and mask.tolist() == rows["attention_mask"], prompt
    ad.release()
    assert [t if t >= 0 else None for t in ad.layout.forced.tolist()] == [None] * 1024  # 32 x 32, nothing forced
    assert ad.layout.grid == (32, 32) and ad.layout.length == 1024


def test_teacher_forced_logits_equal_the_reference(model, recorded):
    record, logits = recorded
    ad = model.adapter
    stream = torch.tensor(record["stream"])
    n = logits["conditional"].shape[0]
    first = ad.prefill([record["greedy_prompt"]], None, guided=True)  # [2, 1, V]
    rest = ad.forward(stream[: n - 1].view(1, -1))  # [2, 1, n - 1, V]
    ours = torch.cat([first.unsqueeze(2), rest], 2)[:, 0]
    ad.release()
    for branch, name in enumerate(("conditional", "unconditional")):
        diff = (ours[branch] - logits[name]).abs().max()
        assert diff < 1e-4, (name, float(diff))


@pytest.mark.parametrize("mode", ["ar", "sjd"])
def test_the_greedy_stream_is_the_references(model, recorded, mode):
    record, _ = recorded
    config = DecodeConfig(mode=mode, top_k=1, cfg_scale=record["cfg"], window=16)
    res = SpeculativeDecoder(model.adapter, config).generate([record["greedy_prompt"]], seeds=0)
    assert res.tokens[0].tolist() == record["stream"]
    assert len(set(record["stream"])) > 10  # not a constant image


def test_the_decoder_gives_the_reference_decoders_pixels(model, recorded):
    record, _ = recorded
    h, w = record["decode_grid"]
    tokens = torch.tensor(record["stream"][: h * w]).view(1, h, w)
    ours = model.decode(tokens)[0].permute(1, 2, 0)  # [H, W, 3] in [0, 1]
    reference = torch.tensor(record["decoded_uint8"], dtype=torch.float32)  # the reference's (x * 255).astype(uint8)
    assert ours.shape == reference.shape
    assert ((ours * 255).floor() - reference).abs().max() <= 1
    assert reference.std() > 1  # a picture, not a flat field


@pytest.mark.parametrize("batch", [1, 2])
def test_every_mode_renders_512_px(model, batch):
    ad, lay = model.adapter, model.adapter.layout
    for mode in MODES:
        config = DecodeConfig(mode=mode, window=16, lantern_k=8, group_size=4)
        res = SpeculativeDecoder(ad, config).generate(["a red fox in snow", "blue sky"][:batch], seeds=5)
        assert lay.image_tokens[res.tokens].all(), mode
        images = model.decode(res.image_tokens(lay))
        assert images.shape == (batch, 3, 512, 512) and 0 <= images.min() and images.max() <= 1, mode


def test_reference_defaults_and_guidance(model):
    ad = model.adapter
    assert ad.sampling_defaults == {"cfg_scale": 7.0, "temperature": 0.99, "top_k": 4096, "top_p": 0.96}
    assert ad.guidance == "linear" and ad.branches(True) == 2
    ids, vectors = ad.token_vectors()
    assert torch.equal(ids, torch.arange(ad.text_ids, ad.vocab_size)) and vectors.shape[0] == 64


def test_bad_input_and_missing_files_get_one_clear_error_each(model, folder, tmp_path):
    ad = model.adapter
    with pytest.raises(ValueError, match="Liquid has no negative prompt"):
        ad.check_conditions(["a cat"], ["blurry"])
    with pytest.raises(ValueError, match="prompt must be non-empty text"):
        ad.check_conditions(["  "], None)
    with pytest.raises(ValueError, match="512x512 images only"):
        load_model(folder, resolution=256)
    bare = tmp_path / "models" / "Liquid_V1_7B"
    bare.parent.mkdir()
    bare.symlink_to(folder, target_is_directory=True)
    load_model(bare)  # the VQGAN found in the folder's chameleon/
    lone = write_liquid(tmp_path / "lone" / "Liquid", vqgan=False)
    with pytest.raises(CheckpointError, match="Liquid needs Meta's Chameleon VQGAN .* chameleon/"):
        load_model(lone)
    load_model(lone, vq=folder / "chameleon" / "vqgan.yaml")  # given: either file or its folder
    other = write_liquid(tmp_path / "other" / "Liquid", codes=32)
    for shard in other.glob("*.safetensors"):  # told before the weights are read
        shard.unlink()
    with pytest.raises(CheckpointError, match="the VQGAN has 64 codes but .* has 32 image tokens .*vocab_size"):
        liquid.load(other, vq=folder / "chameleon")


def test_a_config_naming_its_activation_runs_it(folder, tmp_path):
    """transformers 4.39.2 (Liquid's) honours ``hidden_activation``; today's transformers reads only
    ``hidden_act`` and turns ``gelu`` into the tanh approximation."""
    exact = tmp_path / "exact"
    exact.mkdir()
    for f in folder.iterdir():
        (exact / f.name).symlink_to(f, target_is_directory=f.is_dir())
    (exact / "config.json").unlink()
    cfg = json.loads((folder / "config.json").read_text())
    (exact / "config.json").write_text(json.dumps({**cfg, "hidden_activation": "gelu"}))
    tanh, erf = liquid.load_model(folder)[0], liquid.load_model(exact)[0]
    x = torch.linspace(-3, 3, 7)
    assert torch.allclose(tanh.model.layers[0].mlp.act_fn(x), torch.nn.functional.gelu(x, approximate="tanh"))
    assert torch.equal(erf.model.layers[0].mlp.act_fn(x), torch.nn.functional.gelu(x))
    ids = torch.tensor([[2, 300, 301]])
    assert not torch.allclose(tanh(ids).logits, erf(ids).logits)
