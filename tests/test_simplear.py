"""SimpleAR on a tiny random folder in the release layout (``simplear_files.py``), against what its authors' code
gave on the same folder (``reference/simplear.json`` and ``simplear_logits.safetensors``, recorded by
``simplear_reference.py`` on transformers 4.47.1): prompt ids of both guidance rows, teacher-forced logits,
the greedy stream under guidance, and the Cosmos decoder's pixels of that stream."""
import json
import pathlib

import pytest
import torch

from spec_ar.formats.checkpoints import CheckpointError
from spec_ar.loaders import simplear
from spec_ar.loaders.detect import detect, load_model
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

from .simplear_files import DECODER_FOLDER, instruct_generation, write_simplear

REFERENCE = pathlib.Path(__file__).parent / "reference"
MODES = ["ar", "sjd", "gsd", "lantern", "vvs"]


@pytest.fixture(scope="module")
def recorded():
    from safetensors.torch import load_file

    return (json.loads((REFERENCE / "simplear.json").read_text()),
            load_file(str(REFERENCE / "simplear_logits.safetensors")))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_simplear(tmp_path_factory.mktemp("simplear") / "SimpleAR-tiny")


@pytest.fixture(scope="module")
def penalised(tmp_path_factory):
    """The same weights with the generation_config.json Qwen2.5-0.5B-Instruct ships (repetition penalty 1.1)."""
    return write_simplear(tmp_path_factory.mktemp("simplear-penalty") / "SimpleAR-tiny",
                          generation=instruct_generation())


@pytest.fixture(scope="module")
def model(folder, recorded):
    side = recorded[0]["image_size"]
    return load_model(folder, width=side, height=side)


def test_detected_by_its_tokenizer_not_its_name(folder, tmp_path):
    renamed = tmp_path / "Qwen2.5-0.5B"  # a Qwen name: the contents decide
    renamed.symlink_to(folder, target_is_directory=True)
    assert detect(folder).family == detect(renamed).family == "simplear"
    plain = tmp_path / "qwen"  # Qwen2.5's tokenizer without SimpleAR's specials: not SimpleAR
    plain.mkdir()
    for f in folder.iterdir():
        if f.name not in ("tokenizer.json", "tokenizer_config.json", "added_tokens.json", "special_tokens_map.json"):
            (plain / f.name).symlink_to(f)
    (plain / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer"}))
    assert simplear._detect(plain) is None


def test_prompt_rows_equal_the_reference(model, recorded):
    record, _ = recorded
    ad = model.adapter
    for prompt, ids in record["rows"].items():
        assert ad.prompt_ids(prompt) == ids, prompt
    assert ad.unconditional_ids() == record["unconditional"]  # the reference's fixed negative prompt
    assert ad.text_ids == record["text_ids"] and ad.layout.length == len(record["stream"]) == 64
    assert (ad.layout.forced < 0).all()  # nothing forced, no end token


def test_teacher_forced_logits_equal_the_reference(model, recorded):
    record, logits = recorded
    ad, ids = model.adapter, logits["ids"]
    stream = torch.tensor(record["stream"])
    n = logits["conditional"].shape[0]
    first = ad.prefill([record["greedy_prompt"]], None, guided=True)  # predicts the first image token
    rest = ad.forward(stream[: n - 1].view(1, -1))  # ... and on: position k + 1 from token k
    ours = torch.cat([first.unsqueeze(2), rest], 2)[:, 0]
    ad.release()
    for branch, name in enumerate(("conditional", "unconditional")):
        diff = (ours[branch][:, ids] - logits[name]).abs().max()
        assert diff < 1e-4, (name, float(diff))


@pytest.mark.parametrize("mode", ["ar", "sjd"])
def test_the_greedy_stream_is_the_references(model, recorded, mode):
    """The reference mixes log-softmaxed logits, ``s (log p_c - log p_u) + log p_u``: the same picks as the
    linear rule on raw logits."""
    record, _ = recorded
    config = DecodeConfig(mode=mode, top_k=1, cfg_scale=record["cfg"], window=16)
    res = SpeculativeDecoder(model.adapter, config).generate([record["greedy_prompt"]], seeds=0)
    assert res.tokens[0].tolist() == record["stream"]
    assert len(set(record["stream"])) > 20  # not a constant image


@pytest.mark.parametrize("mode,path", [("ar", "eager"), ("sjd", "eager"), ("sjd", "static")])
def test_the_release_repetition_penalty_gives_the_authors_greedy_stream(penalised, mode, path):
    """A release whose generation_config.json is Qwen2.5-Instruct's (repetition penalty 1.1, temperature 0.7,
    top-k 20, top-p 0.8, two end ids).  SimpleAR's ``generate_visual`` is transformers' ``generate`` with its
    guidance as a custom logits processor, so ``generate`` puts the model's ``RepetitionPenaltyLogitsProcessor``
    before it (over the prompt and the image tokens so far, on the conditional logits) while ``generate.py``'s own
    sampling arguments override the rest.  ``reference/simplear_penalty.json`` is the authors' code run on this
    folder (``simplear_reference.py record-penalty``: ``generate.py`` on transformers 4.47.1, greedy, text ids
    masked after the guidance as in ``simplear.json``) at 256 px; it parts from the unpenalised greedy stream at
    token 74 (checked below), so a pack that ignores the file's penalty fails here.  Decoded here: its first 96
    tokens, as a 256 x 96 image (6 rows of 16: SimpleAR's positions are 1D, so each token depends only on the
    ones before it, whatever the image's height).  Plain AR, SJD's windows and the static decode path all give
    them."""
    record = json.loads((REFERENCE / "simplear_penalty.json").read_text())
    assert json.loads((penalised / "generation_config.json").read_text()) == record["generation_config"]
    width, height = record["image_size"], 96
    loaded = load_model(penalised, width=width, height=height, decode_path=path)
    ad = loaded.adapter
    assert ad.prompt_ids(record["greedy_prompt"]) == record["prompt"]
    assert ad.unconditional_ids() == record["unconditional"]
    config = DecodeConfig(mode=mode, top_k=1, cfg_scale=record["cfg"], window=16)
    res = SpeculativeDecoder(ad, config).generate([record["greedy_prompt"]], seeds=0)
    assert res.tokens[0].tolist() == record["stream"][:height]
    assert loaded.info["repetition_penalty"] == 1.1
    if mode == "ar" and path == "eager":  # the record is not the stream without the penalty
        ad.repeats = None
        unpenalised = SpeculativeDecoder(ad, config).generate([record["greedy_prompt"]], seeds=0).tokens[0].tolist()
        first = next(i for i, (a, b) in enumerate(zip(unpenalised, record["stream"])) if a != b)
        assert first == 74


def test_a_pad_id_that_is_no_end_id_is_masked_out_of_the_conditional_prompt(folder, tmp_path):
    """transformers' ``generate`` infers an attention mask from the release's pad id where it is no end id: the
    conditional row's positions holding it are masked (the guidance processor runs the unconditional row itself,
    unmasked).  A pad id that is the prompt's last token is refused."""
    t2i_folder = tmp_path / "pad"
    t2i_folder.mkdir()
    for f in folder.iterdir():
        if f.name != "generation_config.json":
            (t2i_folder / f.name).symlink_to(f)
    (tmp_path / DECODER_FOLDER).symlink_to(folder.parent / DECODER_FOLDER, target_is_directory=True)
    tokenizer = load_model(folder, width=64, height=64).adapter.tokenizer
    t2i, soi = (tokenizer.convert_tokens_to_ids(t) for t in ("<|t2i|>", "<|soi|>"))
    (t2i_folder / "generation_config.json").write_text(json.dumps(instruct_generation(pad_token_id=t2i)))
    ad = load_model(t2i_folder, width=64, height=64).adapter
    row = tokenizer(simplear.TEMPLATE.format(prompt="a cat")).input_ids
    assert row[0] == t2i and ad.prompt_ids("a cat") == row[1:]
    assert ad.unconditional_ids()[0] == t2i
    (t2i_folder / "generation_config.json").write_text(json.dumps(instruct_generation(pad_token_id=soi)))
    with pytest.raises(CheckpointError, match=r"generation_config.json: pad_token_id \d+ is <\|soi\|>"):
        load_model(t2i_folder, width=64, height=64)


def test_a_generation_field_the_pack_cannot_apply_is_refused_before_the_weights_are_read(folder, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in folder.iterdir():  # no weights: the refusal comes first
        if f.name != "generation_config.json" and "safetensors" not in f.name:
            (bare / f.name).symlink_to(f)
    (tmp_path / DECODER_FOLDER).symlink_to(folder.parent / DECODER_FOLDER, target_is_directory=True)
    (bare / "generation_config.json").write_text(json.dumps(instruct_generation(no_repeat_ngram_size=4)))
    with pytest.raises(CheckpointError, match=r"bare/generation_config.json: no_repeat_ngram_size 4: with it "
                                              r"SimpleAR's generate.py, through transformers' generate, bans"):
        simplear.load(bare, width=64, height=64)


def test_the_decoder_gives_the_reference_pixels_of_the_stream(model, recorded):
    record, _ = recorded
    side = record["image_size"]
    grid = torch.tensor(record["stream"]).view(1, side // 16, side // 16)
    ours = model.decode(grid)[0].permute(1, 2, 0)
    reference = torch.tensor(record["decoded_uint8"], dtype=torch.float32)  # save_image: x * 255 + 0.5, truncated
    assert ours.shape == reference.shape == (side, side, 3)
    assert (torch.floor(ours * 255 + 0.5) - reference).abs().max() <= 1
    assert reference.std() > 1  # a picture, not a flat field


def test_every_mode_renders_a_batch(model):
    small = model.resize(64)
    ad, lay = small.adapter, small.adapter.layout
    for mode in MODES:
        config = DecodeConfig(mode=mode, window=8, lantern_k=8, group_size=4)
        res = SpeculativeDecoder(ad, config).generate(["a red fox in snow", "blue sky"], seeds=5)
        images = small.decode(res.image_tokens(lay))
        assert images.shape == (2, 3, 64, 64) and 0 <= images.min() and images.max() <= 1, mode


def test_a_negative_prompt_takes_the_place_of_the_fixed_one(model, recorded):
    record, _ = recorded
    ad = model.adapter
    rows = ad.condition_rows(["a cat"], ["blurry, low quality"], guided=True)
    assert rows[1] == ad.tokenizer("<|t2i|>blurry, low quality<|soi|>").input_ids
    assert ad.condition_rows(["a cat"], None, guided=True)[1] == record["unconditional"]
    t2i, soi = (ad.tokenizer.convert_tokens_to_ids(t) for t in ("<|t2i|>", "<|soi|>"))
    assert ad.condition_rows(["a cat"], [""], guided=True)[1] == [t2i, soi]  # the training's dropped condition
    plain = SpeculativeDecoder(model.resize(64).adapter, DecodeConfig(mode="ar")).generate(["a cat"], seeds=1)
    negative = SpeculativeDecoder(model.resize(64).adapter, DecodeConfig(mode="ar")).generate(
        ["a cat"], seeds=1, negatives=["blurry"])
    assert plain.tokens.tolist() != negative.tokens.tolist()


def test_sizes_and_reference_defaults(model):
    wide = model.resize((96, 64))
    assert wide.adapter.layout.grid == (4, 6) and wide.info["width"] == 96 and wide.info["height"] == 64
    ad = model.adapter
    assert ad.sampling_defaults == {"cfg_scale": 6.0, "temperature": 1.0, "top_k": 64000, "top_p": 1.0}
    ids, vectors = ad.token_vectors()
    assert torch.equal(ids, torch.arange(ad.text_ids, ad.text_ids + 64000)) and vectors.shape == (64000, 6)


def test_bad_input_and_missing_files_get_one_clear_error_each(model, folder, tmp_path):
    ad = model.adapter
    with pytest.raises(ValueError, match="negative prompt must be text for SimpleAR"):
        ad.check_conditions(["a cat"], [3])
    with pytest.raises(ValueError, match="prompt must be non-empty text"):
        ad.check_conditions(["  "], None)
    with pytest.raises(ValueError, match="width must be a positive multiple of 16 pixels for SimpleAR .*got 100"):
        load_model(folder, width=100, height=64)
    lone = write_simplear(tmp_path / "lone" / "SimpleAR", decoder=False)
    with pytest.raises(CheckpointError, match="needs NVIDIA's Cosmos-1.0-Tokenizer-DV8x16x16 .* give --vq"):
        load_model(lone, width=64, height=64)
    given = load_model(lone, vq=folder.parent / DECODER_FOLDER, width=64, height=64)
    assert given.info["vq"].endswith("decoder.jit")
    (lone / "decoder.jit").symlink_to(folder.parent / DECODER_FOLDER / "decoder.jit")  # as `download` puts it
    assert load_model(lone, width=64, height=64).info["vq"] == str(lone / "decoder.jit")
    small = tmp_path / "small"
    small.mkdir()
    for f in folder.iterdir():
        if f.name != "config.json" and f.suffix != ".safetensors":
            (small / f.name).symlink_to(f)
    (small / DECODER_FOLDER).symlink_to(folder.parent / DECODER_FOLDER, target_is_directory=True)
    cfg = json.loads((folder / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**cfg, "vocab_size": 1000}))  # told before the weights are read
    with pytest.raises(CheckpointError, match="the Cosmos tokenizer has 64000 codes but .* has 559 image tokens"):
        simplear.load(small, width=64, height=64)


def test_int8_storage_quantizes_the_qwen_blocks_and_still_renders(folder):
    from spec_ar.loaders import storage

    loaded = load_model(folder, dtype="int8", width=64, height=64)
    lm = loaded.modules["simplear"]
    quantized = [n for n, m in lm.named_modules() if type(m) is storage.Int8Linear]
    assert len(quantized) == 7 * 2 and all(storage.BLOCK_LINEAR.search(n) for n in quantized)  # 7 per layer
    res = SpeculativeDecoder(loaded.adapter, DecodeConfig(mode="sjd", window=8)).generate(["a red fox"], seeds=2)
    images = loaded.decode(res.image_tokens(loaded.adapter.layout))
    assert images.shape == (1, 3, 64, 64) and torch.isfinite(images).all()
