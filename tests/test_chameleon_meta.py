"""Chameleon / Anole in Meta's original release layout (``models/7b/consolidated.pth``,
``params.json``, ``tokenizer/text_tokenizer.json``), converted in memory to transformers'
model: the same logits as the transformers model it was written from."""
import json
import logging
import shutil

import pytest
import torch

from spec_ar.loaders import chameleon, chameleon_meta
from spec_ar.formats.checkpoints import CheckpointError

from .chameleon_files import write_chameleon
from .chameleon_meta_files import meta_params, perturb, tiny_model, write_meta_chameleon

PROMPTS = [["<s>", "a", "red", "fox", "in", "snow", "<racm3:break>"], ["<s>", "cat", "on", "mat"],
           ["<s>", "blue", "sky", "<image>", "Generate", "an", "image", "of", "<racm3:break>"]]


def _logits(model, vocab, image_tail=4):
    """Full logits (the inner model + lm_head: the generation forward masks image tokens) on
    a few prompts, each followed by a few image tokens."""
    images = sorted(i for n, i in vocab.items() if n.startswith("IMGIMG"))
    out = []
    with torch.no_grad():
        for k, words in enumerate(PROMPTS):
            ids = [vocab[w] for w in words] + images[k:k + image_tail]
            hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state
            out.append(model.lm_head(hidden)[0].float())
    return out


def _assert_same_logits(loaded, reference, vocab):
    for a, b in zip(_logits(loaded, vocab), _logits(reference, vocab), strict=True):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


CASES = {  # name: (model arguments, shards, flat layout, nested params)
    "gqa-nested": ({}, 1, False, True),  # chameleon_files.tiny_chameleon: 4 heads, 2 kv heads, head size 8
    "mqa-swin-flat": ({"heads": 4, "kv_heads": 1, "swin_norm": True, "rope_theta": 500000.0}, 1, True, False),
    "mha-2-shards": ({"heads": 4, "kv_heads": 4, "hidden": 48, "inter": 96, "layers": 3}, 2, False, True),
    "gqa-2-shards": ({"heads": 4, "kv_heads": 2, "seed": 3}, 2, True, True),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def written(request, tmp_path_factory):
    args, shards, flat, nested = CASES[request.param]
    model, vocab = tiny_model(**args)
    perturb(model, shards)
    folder = write_meta_chameleon(tmp_path_factory.mktemp("meta") / "Anole-7b-v0.1", model, vocab, shards=shards,
                                  flat=flat, nested_params=nested)
    return folder, model, vocab


@pytest.fixture(scope="module")
def anole_meta(tmp_path_factory):
    model, vocab = tiny_model()
    perturb(model)
    folder = write_meta_chameleon(tmp_path_factory.mktemp("meta1") / "Anole-7b-v0.1", model, vocab)
    return folder, model, vocab


def test_logits_equal_the_transformers_model(written):
    folder, reference, vocab = written
    model, tokenizer = chameleon_meta.load_model(folder)
    cfg, ref = model.config, reference.config
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "swin_norm"):
        assert getattr(cfg, key) == getattr(ref, key), key
    assert cfg.vocabulary_map == vocab  # <reserved08707> back to <image>
    _assert_same_logits(model, reference, vocab)
    rot = dict(model.named_buffers())
    for name, buf in reference.named_buffers():
        if name.endswith("inv_freq"):
            assert torch.equal(rot[name], buf), name


def test_a_wrong_rotary_order_is_caught(tmp_path):
    """The same weights with q/k rows (and their norms) left in transformers' order load
    without error but compute something else: the logits check can tell."""
    model, vocab = tiny_model()
    perturb(model)
    folder = write_meta_chameleon(tmp_path / "wrong", model, vocab, interleave=False)
    loaded, _ = chameleon_meta.load_model(folder)
    diffs = [(a - b).abs().max().item() for a, b in zip(_logits(loaded, vocab), _logits(model, vocab), strict=True)]
    assert max(diffs) > 1e-2, diffs


def test_tokenizer_and_config_ids(anole_meta):
    folder, _, vocab = anole_meta
    model, tok = chameleon_meta.load_model(folder)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (vocab["<s>"], vocab["</s>"], vocab["<pad>"])
    assert (model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id) == (
        vocab["<s>"], vocab["</s>"], vocab["<pad>"])
    assert tok("a red fox", add_special_tokens=False).input_ids == [vocab["a"], vocab["red"], vocab["fox"]]
    assert tok.convert_tokens_to_ids(["<image>", "<racm3:break>", "<eoss>"]) == [
        vocab["<image>"], vocab["<racm3:break>"], vocab["<eoss>"]]


def test_dtype_and_the_vq_encoder_from_vqgan_ckpt(anole_meta):
    folder, _, _ = anole_meta
    model, _ = chameleon_meta.load_model(folder, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    ckpt = torch.load(folder / "tokenizer" / "vqgan.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    vq = model.model.vqmodel.state_dict()
    assert set(vq) == {k for k in ckpt if k.startswith(("encoder.", "quant_conv.", "quantize.", "post_quant_conv."))}
    for k, v in vq.items():
        assert torch.equal(v, ckpt[k].to(torch.bfloat16)), k


def test_without_a_vqgan_the_vq_encoder_is_random_and_said_so(tmp_path, caplog):
    model, vocab = tiny_model()
    perturb(model)
    folder = write_meta_chameleon(tmp_path / "novq", model, vocab, vqgan=False)
    with caplog.at_level(logging.WARNING, logger=chameleon_meta.__name__):
        loaded, _ = chameleon_meta.load_model(folder)
    assert "randomly initialised" in caplog.text
    assert loaded.model.vqmodel.quantize.embedding.weight.shape[0] == 64  # one code per image token
    assert not any(t.is_meta for t in loaded.parameters())
    _assert_same_logits(loaded, model, vocab)


def test_read_config_is_an_anole_with_the_image_tokens(anole_meta):
    folder, reference, vocab = anole_meta
    config = chameleon_meta.read_config(folder)
    assert chameleon.flavour_of(config) == "anole"
    assert chameleon.image_code_map(config["vocabulary_map"]) == chameleon.image_code_map(vocab)
    assert config["vq_config"]["num_embeddings"] == 64 and config["vq_config"]["channel_multiplier"] == [1] * 5


def test_the_engine_adapter_runs_on_the_converted_model(anole_meta):
    folder, reference, vocab = anole_meta
    model, tok = chameleon_meta.load_model(folder)
    spec = chameleon.ChameleonSpec("anole", 512, 512)
    ours = chameleon.ChameleonAdapter(model, tok, spec)
    theirs = chameleon.ChameleonAdapter(reference, tok, spec)
    a, b = ours.prefill(["a red fox"], None, guided=True), theirs.prefill(["a red fox"], None, guided=True)
    assert a.shape == (3, 1, len(vocab)) and torch.allclose(a, b, atol=1e-5)
    window = ours.image_ids[:3].view(1, 3)
    assert torch.allclose(ours.forward(window), theirs.forward(window), atol=1e-5)


def test_translate_config_of_the_released_7b_and_30b():
    vocab = {f"<reserved{i:05d}>": i for i in range(65536)}
    seven = {"model_parallel_size": 1, "model": {
        "dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": None, "vocab_size": 65536,
        "ffn_dim_multiplier": 1.0, "multiple_of": 256, "norm_eps": 1e-05, "rope_theta": 10000.0,
        "qk_normalization": True, "swin_norm": False}}
    cfg = chameleon_meta.translate_config(seven, vocab)
    expected = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "vocab_size": 65536}
    assert {k: cfg[k] for k in expected} == expected
    assert cfg["vocabulary_map"]["<image>"] == 8707 and "<reserved08707>" not in cfg["vocabulary_map"]
    thirty = {"model_parallel_size": 4, "dim": 8192, "n_layers": 48, "n_heads": 64, "vocab_size": 65536,
              "multiple_of": 256, "norm_eps": 1e-5, "rope_theta": 10000.0, "qk_normalization": True,
              "swin_norm": True}
    cfg = chameleon_meta.translate_config(thirty, vocab)
    assert cfg["intermediate_size"] == 22016 and cfg["num_key_value_heads"] == 64 and cfg["swin_norm"]
    assert cfg["model_parallel_size"] == 4
    assert chameleon_meta.translate_config({**thirty, "rope_theta": 500000.0}, vocab)["max_position_embeddings"] == 16384
    with pytest.raises(CheckpointError, match="qk_normalization"):
        chameleon_meta.translate_config({**thirty, "qk_normalization": False}, vocab)


@pytest.mark.parametrize("remove, named", [
    ("models/7b/params.json", "params.json"),
    ("models/7b/consolidated.pth", "consolidated.pth"),
    ("tokenizer/text_tokenizer.json", "text_tokenizer.json"),
])
def test_a_missing_file_is_named(anole_meta, tmp_path, remove, named):
    folder = shutil.copytree(anole_meta[0], tmp_path / "copy")
    (folder / remove).unlink()
    with pytest.raises(CheckpointError, match=named) as err:
        chameleon_meta.load_model(folder)
    assert "missing" in str(err.value)


def test_a_missing_shard_is_named(tmp_path):
    model, vocab = tiny_model()
    perturb(model, 2)
    folder = write_meta_chameleon(tmp_path / "sharded", model, vocab, shards=2)
    (folder / "models/7b/consolidated.01.pth").unlink()
    (folder / "models/7b/consolidated.02.pth").write_bytes((folder / "models/7b/consolidated.00.pth").read_bytes())
    with pytest.raises(CheckpointError, match=r"consolidated\.01\.pth"):
        chameleon_meta.find_meta_files(folder)


@pytest.mark.parametrize("change, says", [
    ({"dim": 64}, r"wrong shapes: tok_embeddings\.weight \[\d+, 32\] \(expected \[\d+, 64\]\)"),
    ({"n_layers": 3}, r"missing layers\.2\.attention\.wq\.weight"),
    ({"multiple_of": 256}, r"FFN width 256.*feed_forward\.w1\.weight \[64, 32\] \(expected \[256, 32\]\)"),
    ({"n_kv_heads": 4}, r"attention\.wk\.weight \[16, 32\] \(expected \[32, 32\]\)"),
])
def test_params_that_do_not_fit_the_weights_name_both_files(anole_meta, tmp_path, change, says):
    folder = shutil.copytree(anole_meta[0], tmp_path / "copy")
    params_path = folder / "models/7b/params.json"
    params = json.loads(params_path.read_text())
    params["model"].update(change)
    params_path.write_text(json.dumps(params))
    with pytest.raises(CheckpointError, match=says) as err:
        chameleon_meta.load_model(folder)
    message = str(err.value)
    assert str(folder / "models/7b/consolidated.pth") in message and str(params_path) in message
    assert message.count("CheckpointError") == 0 and "\n" not in message


def test_is_meta_layout(anole_meta, written, tmp_path):
    assert chameleon_meta.is_meta_layout(anole_meta[0])  # models/7b/
    flat = tmp_path / "flat"
    write_meta_chameleon(flat, flat=True, vqgan=False)
    assert chameleon_meta.is_meta_layout(flat)
    files = chameleon_meta.find_meta_files(flat)
    assert files["model_dir"] == flat and files["shards"] == [flat / "consolidated.pth"] and files["vqgan"] is None
    files = chameleon_meta.find_meta_files(anole_meta[0])
    assert files["model_dir"] == anole_meta[0] / "models" / "7b"
    assert files["vqgan"] == (anole_meta[0] / "tokenizer" / "vqgan.yaml", anole_meta[0] / "tokenizer" / "vqgan.ckpt")
    # pointed at models/7b of a full download: the tokenizer is two levels up
    inner = chameleon_meta.find_meta_files(anole_meta[0] / "models" / "7b")
    assert inner["tokenizer"] == anole_meta[0] / "tokenizer" / "text_tokenizer.json"
    converted = write_chameleon(tmp_path / "Anole-7b-hf", "anole", vqgan=False)
    assert not chameleon_meta.is_meta_layout(converted)
    (flat / "config.json").write_text('{"note": "not a transformers config"}')  # does not hide the layout
    assert chameleon_meta.is_meta_layout(flat)
    (flat / "config.json").write_text('{"model_type": "chameleon"}')  # the converted format wins
    assert not chameleon_meta.is_meta_layout(flat)
    (tmp_path / "empty").mkdir()
    assert not chameleon_meta.is_meta_layout(tmp_path / "empty")
    assert not chameleon_meta.is_meta_layout(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="not Meta's Chameleon layout"):
        chameleon_meta.find_meta_files(tmp_path / "empty")


def test_meta_params_round_trip_the_ffn_width():
    for hidden, inter in ((32, 64), (48, 96), (4096, 11008), (64, 200)):
        model_cfg = type("C", (), {"hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": 1,
                                   "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 10,
                                   "rms_norm_eps": 1e-5, "rope_theta": 1e4, "swin_norm": False})
        params = meta_params(model_cfg)
        assert chameleon_meta.translate_config(params, {"<s>": 0})["intermediate_size"] == inter


def test_meta_layout_is_detected_and_renders_through_the_engine(tmp_path):
    from spec_ar.loaders.detect import detect, load_model
    from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

    from .chameleon_meta_files import write_meta_chameleon

    folder = write_meta_chameleon(tmp_path / "Anole-7b-v0.1", seed=3)
    assert detect(folder).family == "anole" and detect(folder / "models" / "7b").family == "anole"
    loaded = load_model(folder)
    res = SpeculativeDecoder(loaded.adapter, DecodeConfig(mode="sjd", window=32)).generate(["a red fox"], seeds=0)
    assert loaded.decode(res.image_tokens(loaded.adapter.layout)).shape == (1, 3, 512, 512)
