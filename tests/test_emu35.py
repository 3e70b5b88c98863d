"""Emu3.5 on a tiny random folder in the release layout (``emu35_files.py``), against what its authors' code gave on
the same folder (``reference/emu35.json`` and ``emu35_logits.safetensors``, recorded by ``emu35_reference.py``:
``inference.py`` on transformers 4.48.2, float32, eager attention): BAAI's tokenizer's ids, the prompt and
unconditional rows, the size header, the grammar, teacher-forced logits of both guidance branches, the greedy stream
under guidance (in ``ar`` and ``sjd``), the IBQ decoder's pixels of it; detection both ways; bad folders; every mode
through ``spec-ar render``."""
import json
import pathlib
import shutil

import pytest
import torch

from spec_ar.cli import main
from spec_ar.formats.checkpoints import CheckpointError
from spec_ar.loaders import emu35
from spec_ar.loaders.detect import detect, load_model
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

from .emu35_files import TOKENIZER_FOLDER, VISION_FOLDER, write_emu35, write_tokenizer

REFERENCE = pathlib.Path(__file__).parent / "reference"
MODES = ["ar", "sjd", "gsd", "lantern", "vvs"]


@pytest.fixture(scope="module")
def recorded():
    from safetensors.torch import load_file

    return (json.loads((REFERENCE / "emu35.json").read_text(encoding="utf-8")),
            load_file(str(REFERENCE / "emu35_logits.safetensors")))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_emu35(tmp_path_factory.mktemp("emu35") / "Emu3.5-Image")


@pytest.fixture(scope="module")
def model(folder, recorded):
    rows, cols = recorded[0]["grid"]
    return load_model(folder, width=16 * cols, height=16 * rows)


def linked(folder: pathlib.Path, to: pathlib.Path, skip=()) -> pathlib.Path:
    """A copy of ``folder`` made of links to its files, less ``skip``."""
    to.mkdir(parents=True)
    for f in folder.iterdir():
        if f.name not in skip:
            (to / f.name).symlink_to(f)
    return to


def test_detected_by_contents_and_emu3_stays_emu3(folder, tmp_path):
    from .emu3_files import write_emu3

    renamed = tmp_path / "Emu3-Gen"  # an Emu3 name: the contents decide
    renamed.symlink_to(folder, target_is_directory=True)
    assert detect(folder).family == detect(renamed).family == "emu35"
    converted = write_emu3(tmp_path / "Emu3.5-Image-hf")  # Emu3 (converted) under an Emu3.5 name
    assert detect(converted).family == "emu3" and emu35._detect(converted) is None
    # Emu3 v1's own release: model_type "Emu3" too, but no head_dim and no per-head query / key norms
    cfg = json.loads((folder / "config.json").read_text())
    v1 = tmp_path / "Emu3-Gen-own"
    v1.mkdir()
    (v1 / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "head_dim"} | {"vocab_size": 184622}))
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    weight_map = {k: v for k, v in index["weight_map"].items() if "_norm." not in k or "layernorm" in k}
    (v1 / "model.safetensors.index.json").write_text(json.dumps({**index, "weight_map": weight_map}))
    assert emu35._detect(v1) is None
    with pytest.raises(CheckpointError, match="not a model this pack recognises .found config.json with model_type "
                                              "'Emu3'.*emu35: an Emu3.5 folder"):
        detect(v1)
    (v1 / "config.json").write_text(json.dumps(cfg))  # head_dim, but the weights have no q_norm / k_norm
    assert emu35._detect(v1) is None


def test_the_tokenizer_gives_the_authors_ids(model, recorded):
    record, _ = recorded
    tok = model.adapter.tokenizer
    for text, ids in record["encodings"].items():  # BAAI's tokenizer on tiktoken gave these
        assert tok.encode(text) == ids, text
    assert len(set(map(tuple, record["encodings"].values()))) == len(record["encodings"])


def test_prompt_rows_and_size_header_equal_the_reference(model, recorded, folder):
    record, _ = recorded
    ad = model.adapter
    assert record["template"] == emu35.TEMPLATE.format(prompt="{question}") + emu35.BOI  # BOI: the forced start
    assert record["unc_prompt"] == emu35.UNCONDITIONAL == ("<|extra_203|>You are a helpful assistant. USER:  "
                                                           "ASSISTANT: <|extra_100|>")  # two spaces
    header = record["headers"]["3*4"]
    for prompt, ids in record["prompts"].items():
        assert ad.prompt_ids(prompt) == ids + header + [ad.vocab.img], prompt
    assert ad.prompt_ids(record["greedy_prompt"]) == record["conditional"]
    assert ad.unconditional_ids() == record["unconditional"] == ad.negative_ids("")
    assert record["unconditional"][: len(record["unconditional_row"])] == record["unconditional_row"]
    for size, ids in record["headers"].items():  # digits one token each, as the processor encodes them
        rows, cols = map(int, size.split("*"))
        assert emu35.Emu35Adapter(ad.model, ad.tokenizer, rows, cols).header()[1:-1] == ids, size
    v = ad.vocab  # looked up by name; the real ids, which the authors' processor hard-codes
    assert (v.bos, v.eol, v.img, v.boi, v.eoi) == (151849, 151846, 151851, 151852, 151853)


def test_the_grammar_is_the_authors(model, recorded):
    record, _ = recorded
    lay, v = model.adapter.layout, model.adapter.vocab
    rows, cols = record["grid"]
    assert lay.grid == (rows, cols) and lay.length == rows * (cols + 1) == len(record["stream"])
    forced = {int(p): int(t) for p, t in enumerate(lay.forced) if t >= 0}
    assert forced == {4: v.eol, 9: v.eol, 14: v.eoi}  # a row token after every row but the last, then image end
    assert all(record["stream"][p] == t for p, t in forced.items())
    free = lay.image_tokens.nonzero().flatten()  # the visual tokens: every id from <|visual token ...|> on
    assert free.tolist() == list(range(151854, model.adapter.vocab_size))
    stream = torch.tensor(record["stream"])
    codes = model.adapter.codes_of(stream[lay.forced < 0])
    names = [f"<|visual token {c:06d}|>" for c in codes.tolist()]  # a code is the number in the token's name
    assert stream[lay.forced < 0].tolist() == [model.adapter.tokenizer.specials[n] for n in names]
    assert model.adapter.sampling_defaults == {"cfg_scale": 5.0, "top_k": 5120, "top_p": 1.0, "temperature": 1.0}
    assert (record["cfg"], record["image_top_k"]) == (5.0, 5120)
    assert model.adapter.guidance == "log_softmax"


def test_teacher_forced_logits_equal_the_reference(model, recorded):
    record, logits = recorded
    ad, ids = model.adapter, logits["ids"]
    stream = torch.tensor(record["stream"])
    n = logits["conditional"].shape[0]
    first = ad.prefill([record["greedy_prompt"]], None, guided=True)  # predicts the first stream token
    rest = ad.forward(stream[: n - 1].view(1, -1))
    ours = torch.cat([first.unsqueeze(2), rest], 2)[:, 0]
    ad.release()
    for branch, name in enumerate(("conditional", "unconditional")):
        diff = (ours[branch][:, ids] - logits[name]).abs().max()
        assert diff < 1e-4, (name, float(diff))
    assert logits["conditional"].std() > 1  # spread logits: a model skipping q_norm / k_norm would not match


@pytest.mark.parametrize("mode,path", [("ar", "eager"), ("sjd", "eager"), ("sjd", "static")])
def test_the_greedy_stream_is_the_references(model, recorded, mode, path):
    """The authors' processor guides in log-softmax space, ``5 (log p_c - log p_u) + log p_u`` over the visual
    ids, then image top-k; greedy: its argmax, here top-k 1."""
    record, _ = recorded
    ad = model.adapter
    ad.decode_path, ad.cache = path, None
    try:
        config = DecodeConfig(mode=mode, top_k=1, cfg_scale=record["cfg"], window=8)
        res = SpeculativeDecoder(ad, config).generate([record["greedy_prompt"]], seeds=0)
    finally:
        ad.decode_path, ad.cache = "eager", None
    assert res.tokens[0].tolist() == record["stream"]
    assert len(set(record["stream"])) > 8  # not a constant image


def test_the_decoder_gives_the_reference_pixels_of_the_stream(model, recorded):
    record, _ = recorded
    lay = model.adapter.layout
    tokens = torch.tensor(record["stream"])[lay.forced < 0].view(1, *lay.grid)
    ours = model.decode(tokens)[0].permute(1, 2, 0)
    reference = torch.tensor(record["decoded_uint8"], dtype=torch.float32)  # ((x + 1) * 127.5), truncated
    assert ours.shape == reference.shape == (48, 64, 3)
    assert (torch.floor(ours * 255) - reference).abs().max() <= 1
    assert reference.std() > 1


def test_the_tokenizer_files_are_found_in_the_folder_or_beside_it(folder, tmp_path):
    inside = write_emu35(tmp_path / "inside" / "Emu3.5", tokenizer="inside", vision=False)
    assert emu35.find_tokenizer(inside) == inside
    beside = linked(folder, tmp_path / "beside" / "Emu3.5")
    (tmp_path / "beside" / "tokenizer").symlink_to(folder.parent / TOKENIZER_FOLDER, target_is_directory=True)
    assert emu35.find_tokenizer(beside) == tmp_path / "beside" / "tokenizer"
    alone = linked(folder, tmp_path / "alone" / "Emu3.5")
    with pytest.raises(CheckpointError, match=r"Emu3.5's text tokenizer is not there: emu3.tiktoken and "
                                              r"emu3_vision_tokens.txt .* baaivision/Emu3.5 src/tokenizer_emu3_ibq/"):
        emu35.load_model(alone)


def test_bad_folders_and_inputs_get_one_clear_error_each(folder, model, tmp_path):
    ad = model.adapter
    with pytest.raises(ValueError, match="negative prompt must be text for Emu3.5"):
        ad.check_conditions(["a cat"], [3])
    with pytest.raises(ValueError, match="prompt must be non-empty text"):
        ad.check_conditions([" "], None)
    with pytest.raises(ValueError, match="width must be a positive multiple of 16 pixels for Emu3.5 .got 50"):
        load_model(folder, width=50, height=48)
    with pytest.raises(ValueError, match="1024x1024 needs 4160 image tokens, more than Emu3.5's 2048 positions"):
        load_model(folder, width=1024, height=1024)
    lone = write_emu35(tmp_path / "lone" / "Emu3.5-Image", vision=False)
    with pytest.raises(CheckpointError, match="needs its IBQ vision tokenizer .* give --vq FOLDER"):
        load_model(lone, width=64, height=48)
    given = load_model(lone, vq=folder.parent / VISION_FOLDER, width=64, height=48)
    assert given.info["vq"] == str(folder.parent / VISION_FOLDER)
    # the vision tokenizer's codebook must be the vocabulary's visual tokens
    other = tmp_path / "other"
    from .emu35_files import write_vision_tokenizer

    write_vision_tokenizer(other, codes=32)
    with pytest.raises(CheckpointError, match="the IBQ tokenizer has 32 codes but .* names 64 visual tokens"):
        load_model(lone, vq=other, width=64, height=48)
    # a tokenizer that is not the authors' format
    broken = linked(folder, tmp_path / "broken" / "Emu3.5")
    (broken / "emu3.tiktoken").write_bytes(b"IQ== 0\nIg== 2\n")
    (broken / "emu3_vision_tokens.txt").symlink_to(folder.parent / TOKENIZER_FOLDER / "emu3_vision_tokens.txt")
    with pytest.raises(CheckpointError, match=r"emu3.tiktoken: 2 tokens with ranks 0..2; the authors' tokenizer needs "
                                              r"ranks 0..151642"):
        emu35.load_model(broken)
    (broken / "emu3.tiktoken").write_bytes(b"not base64! 0\n")
    with pytest.raises(CheckpointError, match="emu3.tiktoken: line 1 is not a base64 token and its rank"):
        emu35.load_model(broken)
    # a vocabulary smaller than the tokenizer's ids
    cfg = json.loads((folder / "config.json").read_text())
    small = linked(folder, tmp_path / "small" / "Emu3.5", skip=("config.json",))
    (tmp_path / "small" / TOKENIZER_FOLDER).symlink_to(folder.parent / TOKENIZER_FOLDER, target_is_directory=True)
    (small / "config.json").write_text(json.dumps({**cfg, "vocab_size": 151900}))
    with pytest.raises(CheckpointError, match="has 151918 ids, more than the model's vocabulary .config.json "
                                              "vocab_size 151900."):
        emu35.load_model(small)
    (small / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"type": "yarn", "factor": 4.0}}))
    with pytest.raises(CheckpointError, match="rope_scaling .*yarn.* the authors' model takes none"):
        emu35.load_model(small)
    (small / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "intermediate_size"}))
    with pytest.raises(CheckpointError, match="config.json lacks intermediate_size"):
        emu35.load_model(small)
    (small / "config.json").write_text(json.dumps({**cfg, "head_dim": 8}))  # the shards' q_norm is 16 wide
    with pytest.raises(CheckpointError, match=r"tensor 'model.layers.0.self_attn.\w+.weight' has shape .* where an "
                                              r"Emu3.5 model needs"):
        emu35.load_model(small)


def test_sizes_and_defaults(model):
    assert emu35.default_size(32768) == (73 * 16, 55 * 16)  # the authors' aspect_ratio "default", 55*73
    assert emu35.default_size(2048) == (38 * 16, 38 * 16)  # the largest square the positions hold
    wide = model.resize((96, 32))
    assert wide.adapter.layout.grid == (2, 6) and wide.adapter.header()[1:-1] == wide.adapter.tokenizer.encode("2*6")
    ids, vectors = model.adapter.token_vectors()
    assert vectors.shape == (64, 256) and sorted(ids.tolist()) == list(range(151854, 151854 + 64))
    assert torch.equal(model.adapter.codes_of(ids), torch.arange(64))


def test_a_negative_prompt_fills_the_empty_user_turn(model):
    ad = model.adapter
    rows = ad.condition_rows(["a cat"], ["blurry"], guided=True)
    assert rows[1] == ad.tokenizer.encode("<|extra_203|>You are a helpful assistant. USER: blurry ASSISTANT: "
                                          "<|extra_100|>") + ad.header()
    assert ad.condition_rows(["a cat"], None, guided=True)[1] == ad.unconditional_ids()
    plain = SpeculativeDecoder(ad, DecodeConfig(mode="ar")).generate(["a cat"], seeds=1)
    negative = SpeculativeDecoder(ad, DecodeConfig(mode="ar")).generate(["a cat"], seeds=1, negatives=["blurry"])
    assert plain.tokens.tolist() != negative.tokens.tolist()


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_renders_through_the_command_line(folder, tmp_path, mode):
    extra = ["--lantern-k", "16"] if mode in ("lantern", "vvs") else []
    assert main(["render", "--model", str(folder), "--prompt", "a red fox", "--mode", mode, *extra, "--batch", "2",
                 "--width", "96", "--height", "48", "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / f"{mode}_0.json").read_text())
    assert report["family"] == "emu35" and report["reports"][0]["tokens"] == 3 * 7
    from PIL import Image

    assert Image.open(tmp_path / "out" / f"{mode}_1.png").size == (96, 48)
    settings = report["reports"][0]["settings"]  # the authors' sampling, unless the user sets otherwise
    assert (settings["cfg_scale"], settings["top_k"], settings["top_p"], settings["temperature"]) == (5.0, 5120, 1.0,
                                                                                                    1.0)


def test_int8_storage_quantizes_the_blocks_that_offload_streams(folder):
    from spec_ar.loaders import storage

    loaded = load_model(folder, dtype="int8", width=64, height=32)
    lm = loaded.modules["emu35"]
    quantized = [n for n, m in lm.named_modules() if type(m) is storage.Int8Linear]
    assert len(quantized) == 7 * 2 and all(storage.BLOCK_LINEAR.search(n) for n in quantized)  # 7 per layer
    assert storage.repeated_blocks(loaded.adapter.network()) is lm.model.layers  # what offload streams
    assert lm.lm_head.weight.dtype == torch.bfloat16  # the head and the embedding are not quantized
    res = SpeculativeDecoder(loaded.adapter, DecodeConfig(mode="sjd", window=8)).generate(["a red fox"], seeds=2)
    images = loaded.decode(res.image_tokens(loaded.adapter.layout))
    assert images.shape == (1, 3, 32, 64) and torch.isfinite(images).all()


def test_a_tied_head_is_the_embedding(folder, tmp_path):
    from safetensors.torch import load_file, save_file

    tied = tmp_path / "tied" / "Emu3.5"
    tied.mkdir(parents=True)
    for f in folder.iterdir():
        if f.suffix == ".safetensors":
            save_file({k: v for k, v in load_file(str(f)).items() if k != "lm_head.weight"}, str(tied / f.name))
        elif f.name != "config.json":
            shutil.copy(f, tied / f.name)
    cfg = json.loads((folder / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    (tmp_path / "tied" / TOKENIZER_FOLDER).symlink_to(folder.parent / TOKENIZER_FOLDER, target_is_directory=True)
    model, _ = emu35.load_model(tied)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_the_tiny_tokenizer_is_the_real_ones_layout(tmp_path):
    """The tiny vocabulary keeps the release's ids where the grammar and the authors' processor need them."""
    n = write_tokenizer(tmp_path)
    tok = emu35.Emu35Tokenizer.load(tmp_path)
    assert len(tok) == n == 151854 + 64
    assert tok.encode("0123456789*") == list(range(15, 25)) + [9]  # the processor's digit and '*' ranges
    assert [tok.token_id(t) for t in ("<|endoftext|>", "<|extra_100|>", "<|extra_204|>")] == [151643, 151746, 151850]


def test_the_static_forward_compiles_as_one_graph(model):
    """What a CUDA graph (the ``graphs`` decode path) captures: ``torch.compile(fullgraph=True)`` fails on any graph
    break; the compiled window gives the static path's logits."""
    ad = model.adapter
    ad.decode_path, ad.cache = "static", None
    try:
        torch.set_grad_enabled(False)
        ad.prefill(["a cat", "a dog on a hill at night"], None, True)
        tokens = torch.nonzero(ad.layout.image_tokens)[:16].view(2, 8)
        keys = ad.cache.kv.keys_for(8)
        expected = ad._static_window(tokens, keys)[0]
        torch._dynamo.reset()
        compiled = torch.compile(lambda t: ad._static_window(t, keys), fullgraph=True, backend="aot_eager")
        assert torch.allclose(compiled(tokens)[0], expected, atol=1e-5)
    finally:
        torch.set_grad_enabled(True)
        ad.decode_path, ad.cache = "eager", None
        torch._dynamo.reset()


@pytest.mark.parametrize("scaling", ["linear", "dynamic"])
def test_the_authors_rope_scalings_give_their_logits(folder, recorded, tmp_path, scaling):
    """The same weights under ``rope_scaling`` ``{"type": "linear" | "dynamic", "factor": 2.0}``: teacher-forced
    conditional logits of the authors' model (``emu35_reference.py``'s ``-rope-*`` folders); linear scaling divides
    the positions, dynamic changes nothing within ``max_position_embeddings``."""
    from .emu35_reference import ROPE

    record, logits = recorded
    variant = linked(folder, tmp_path / "Emu3.5-rope", skip=("config.json",))
    (tmp_path / TOKENIZER_FOLDER).symlink_to(folder.parent / TOKENIZER_FOLDER, target_is_directory=True)
    cfg = json.loads((folder / "config.json").read_text())
    (variant / "config.json").write_text(json.dumps({**cfg, "rope_scaling": ROPE[scaling]}))
    lm, _ = emu35.load_model(variant)
    stream = record["stream"]
    with torch.no_grad():
        ours = lm(input_ids=torch.tensor([record["conditional"] + stream])).logits[0, len(record["conditional"]) - 1:]
    expected = logits[f"rope_{scaling}"]
    diff = (ours[: expected.shape[0], logits["ids"]] - expected).abs().max()
    assert diff < 1e-4, float(diff)
    unscaled = (ours[: expected.shape[0], logits["ids"]] - logits["conditional"]).abs().max()
    assert (unscaled > 1e-2) == (scaling == "linear")  # the test can tell


def test_the_compact_vocabulary_scores_the_heads_image_rows_only(model):
    """131,072 codes of 282,926 ids in the release: the engine's rows hold the codes and the forced tokens, and the
    head multiplies its visual rows only (a view of its weight, no copy)."""
    from spec_ar.sampling.compact import CompactVocabulary, compact

    ad = compact(model.adapter)
    assert isinstance(ad, CompactVocabulary) and ad.native
    image = model.adapter.vocab.image_ids
    assert ad.ids[: ad.n_image].tolist() == image.tolist() and ad.output_width() == ad.n_image < ad.inner.vocab_size
    assert torch.equal(image, torch.arange(int(image[0]), int(image[0]) + image.numel()))  # one contiguous range
    ad.inner.output_ids(ad.ids[: ad.n_image])
    assert ad.inner.head_rows == (int(image[0]), int(image[-1]) + 1)
    ad.inner.output_ids(None)
