"""GLM-Image's AR stage on a tiny random folder in the release's diffusers layout (``glm_image_files.py``), against
transformers' own generation on the same folder (``reference/glm_image.json``, recorded by ``glm_image_reference.py``
on transformers 5.24.0, as diffusers' ``GlmImagePipeline`` calls it): the prompt ids, the M-RoPE positions of the
image tokens, the greedy stream in ``ar`` and ``sjd``, and the sampled distribution (temperature, top-k, top-p) under
the engine's windows and draft trees, enumerated with transformers' own position bookkeeping."""
import json
import pathlib
import shutil
import sys

import pytest
import torch

from spec_ar.formats.checkpoints import CheckpointError
from spec_ar.loaders import glm_image
from spec_ar.loaders.detect import detect, load_model
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder
from spec_ar.sampling.config import ConfigError

from .glm_image_files import END, START, VISION_VOCAB, generation, write_glm_image

REFERENCE = pathlib.Path(__file__).parent / "reference"


@pytest.fixture(scope="module")
def record():
    return json.loads((REFERENCE / "glm_image.json").read_text())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_glm_image(tmp_path_factory.mktemp("glm") / "GLM-Image")


@pytest.fixture(scope="module")
def model(folder, record):
    return load_model(folder, width=record["width"], height=record["height"])


class Positions:
    """The M-RoPE positions the adapter's language model receives, with the stream index of each call's first
    token (the cache's length past the prompt before the call)."""

    def __init__(self, adapter):
        self.adapter, self.calls = adapter, []
        self.handle = adapter.inner.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        ad = self.adapter
        first = None if ad.prompt_lengths is None or not ad.cache.kv.host_length[0] else \
            ad.cache.valid[0] - int(ad.prompt_lengths[0])
        self.calls.append((first, kwargs["position_ids"].clone()))

    def remove(self):
        self.handle.remove()


def test_detected_by_contents_not_names(folder, tmp_path):
    renamed = tmp_path / "my-model"
    renamed.symlink_to(folder, target_is_directory=True)
    encoder = folder / glm_image.ENCODER
    assert detect(folder).family == detect(renamed).family == detect(encoder).family == "glm_image"
    assert detect(folder).path == encoder  # what loading reads (and storage sizes)
    other = tmp_path / "other"  # a diffusers folder of another pipeline: not GLM-Image
    other.mkdir()
    (other / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    assert glm_image._detect(other) is None
    plain = tmp_path / "plain"  # a transformers folder of another model type
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "glm4"}))
    assert glm_image._detect(plain) is None


def test_prompt_ids_and_grids_equal_the_processors(model, record):
    ad = model.adapter
    assert ad.preview == (13, 19) and ad.large == (2, 3) and ad.layout.length == 13 * 19 + 6 + 1
    for r in record["records"]:
        assert ad.prompt_ids(r["prompt"]) == r["ids"]
        assert r["image_grid_thw"] == [[1, 2, 3], [1, 13, 19]]
        assert r["ids"][-1] == START  # the processor's BOS, the image start
    assert (ad.layout.forced[:-1] < 0).all() and int(ad.layout.forced[-1]) == END
    assert ad.layout.image_tokens.nonzero().flatten().tolist() == list(range(START))  # the codes only
    assert ad.sampling_defaults == {"temperature": 0.9, "top_k": 50, "top_p": 0.75, "cfg_scale": 1.0}


def test_the_image_tokens_get_transformers_positions(model, record):
    """Prefill, a window, and a draft tree: every token sits where ``get_rope_index`` puts its stream place."""
    ad = model.adapter
    r = record["records"][0]
    ref = torch.tensor(r["stream_positions"])  # [3, n]: stream index k at column k
    stream = torch.tensor(r["stream"])
    spy = Positions(ad)
    try:
        ad.prefill([r["prompt"]], None, guided=False)
        ad.forward(stream[:200].view(1, -1))  # the preview grid and into the large one
        ad.rollback([150])  # back to stream index 50
        # a tree: node 0 at index 50, its children (two drafts for index 51), a grandchild at index 52
        tokens = stream[50:53][[0, 1, 1, 2]].view(1, -1)
        ad.forward_tree(tokens, torch.tensor([[-1, 0, 0, 1]]))
        ad.keep_tree(torch.tensor([[0, 1, 3]]), [3])
        ad.forward(stream[53:253].view(1, -1))  # on to the last image token
    finally:
        spy.remove()
        ad.release()
    (_, prefill), (_, window), (_, tree), (_, rest) = spy.calls
    assert prefill[:, 0].tolist() == r["prefill_positions"]
    assert torch.equal(window[:, 0], ref[:, :200])
    assert torch.equal(tree[:, 0], ref[:, [50, 51, 51, 52]])
    assert torch.equal(rest[:, 0], ref[:, 53:253])
    assert len(set(ref[0].tolist())) == 2  # two grids: the temporal axis is each grid's base


@pytest.mark.parametrize("mode,path", [("ar", "eager"), ("sjd", "eager"), ("sjd", "static")])
def test_the_greedy_streams_are_transformers(model, folder, record, mode, path):
    """Both prompts in one batch (left-padded, as the pipeline pads a batch): each its own reference stream; in SJD
    every window token is fed at the positions of its place (on the static path too: windows padded to fixed
    widths, the padding's places past the window)."""
    if path != "eager":
        model = load_model(folder, width=record["width"], height=record["height"], decode_path=path)
    prompts = [r["prompt"] for r in record["records"]]
    spy = Positions(model.adapter)
    try:
        res = SpeculativeDecoder(model.adapter, DecodeConfig(mode=mode, top_k=1, window=16)).generate(prompts, seeds=0)
    finally:
        spy.remove()
    for row, r in zip(res.tokens.tolist(), record["records"]):
        assert row == r["stream"]
        assert len(set(r["stream"])) > 20  # not a constant image
    ref = torch.tensor(record["records"][0]["stream_positions"])
    checked = 0
    for first, pos in spy.calls[1:]:
        if pos.shape[1] < spy.calls[0][1].shape[1]:  # an image left the batch: the first one had ended
            break
        k = first + torch.arange(pos.shape[2])
        inside = k < ref.shape[1]
        if path != "eager":  # a padded window's real tokens: its first ones
            inside &= torch.arange(pos.shape[2]) < 16
        assert torch.equal(pos[:, 0, inside], ref[:, k[inside]])
        checked += int(inside.sum())
    assert checked >= ref.shape[1]


@pytest.mark.parametrize("mode", ["ar", "sjd"])
def test_the_greedy_prior_tokens_are_diffusers_own(model, folder, record, mode):
    """diffusers' ``GlmImagePipeline.generate_prior_tokens`` itself, on transformers' model read from the folder:
    sampling off (top-k 1 under its ``do_sample=True``) and the ids from the image start on suppressed (the pack's
    departure at the grids' places; the one token after the grid, where they differ, the pipeline discards).  Its
    ``prior_token_ids`` for both prompts in one left-padded batch are ours."""
    diffusers = pytest.importorskip("diffusers")
    from transformers import GlmImageForConditionalGeneration, GlmImageProcessor

    ar = GlmImageForConditionalGeneration.from_pretrained(
        str(folder / glm_image.ENCODER), dtype=torch.float32, attn_implementation="eager").eval()
    ar.generation_config.top_k = 1
    ar.generation_config.suppress_tokens = list(range(START, VISION_VOCAB))
    processor = GlmImageProcessor.from_pretrained(str(folder / glm_image.PROCESSOR))
    pipe = diffusers.GlmImagePipeline(tokenizer=None, processor=processor, text_encoder=None,
                                      vision_language_encoder=ar, vae=None, transformer=None, scheduler=None)
    prompts = [r["prompt"] for r in record["records"]]
    with torch.no_grad():
        theirs, *_ = pipe.generate_prior_tokens(prompts, height=record["height"], width=record["width"],
                                                device=torch.device("cpu"))
    res = SpeculativeDecoder(model.adapter, DecodeConfig(mode=mode, top_k=1, window=16)).generate(prompts, seeds=0)
    ours = glm_image.prior_token_ids(res.tokens, model.adapter)
    assert ours.shape == theirs.shape == (2, 4 * 2 * 3)
    assert torch.equal(ours, theirs)
    assert len(set(theirs[0].tolist())) > 2  # not a constant grid


def test_prior_token_ids_are_the_pipelines(model, record):
    r = record["records"][0]
    tokens = torch.tensor([r["stream"]])
    large = torch.tensor(r["stream"][13 * 19: 13 * 19 + 6]).view(2, 3)
    expected = large.repeat_interleave(2, 0).repeat_interleave(2, 1).flatten()
    assert glm_image.prior_token_ids(tokens, model.adapter)[0].tolist() == expected.tolist()
    assert model.decode is None and model.info["no_decoder"] == glm_image.NO_DECODER


def test_the_command_line_says_there_is_no_decoder_yet_before_sampling(folder, tmp_path, capsys, monkeypatch):
    from spec_ar.cli import main
    from spec_ar.sampling import SpeculativeDecoder

    monkeypatch.setattr(SpeculativeDecoder, "generate", lambda *a, **k: pytest.fail("sampled before refusing"))
    assert main(["render", "--model", str(folder), "--prompt", "a red fox", "--out", str(tmp_path / "out")]) == 2
    assert "DiT stage" in capsys.readouterr().err and not (tmp_path / "out").exists()


# -- exactness: the sampled distribution, enumerated through transformers' own decode positions ------------------
GRID = ((1, 2), (2, 1))  # a short stream: 2 preview tokens, 2 large-grid tokens, the end


def transformers_joint(hf, ids, grids, temperature, top_k, top_p) -> dict[tuple, float]:
    """Every stream's probability: transformers' model stepped through each prefix as ``generate`` steps it
    (prefill with ``image_grid_thw``, then one fed token at a time on its cache, its positions from the model's own
    decode table), the codes only, then transformers' temperature, top-k and top-p warpers; the end forced."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    n = sum(h * w for h, w in GRID)
    prompt = torch.tensor([ids])
    thw = torch.tensor(grids)
    warpers = [TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k)] + \
        ([TopPLogitsWarper(top_p)] if top_p < 1 else [])
    out = {}

    def grow(prefix, p, logits, cache):
        if len(prefix) == n:
            out[tuple(prefix + [END])] = p
            return
        scores = logits.clone()
        scores[:, START:] = -float("inf")
        for warp in warpers:
            scores = warp(prompt, scores)
        probs = scores.double().softmax(-1)[0]
        for tok in probs.nonzero().flatten().tolist():
            import copy

            step_cache = copy.deepcopy(cache)
            with torch.no_grad():
                o = hf(input_ids=torch.tensor([[tok]]), cache=step_cache, image_grid_thw=thw,
                       images_per_sample=torch.tensor([2]), use_cache=True)
            grow(prefix + [tok], p * float(probs[tok]), o.logits[:, -1].float(), o.cache)

    with torch.no_grad():
        o = hf(input_ids=prompt, image_grid_thw=thw, images_per_sample=torch.tensor([2]), use_cache=True)
    grow([], 1.0, o.logits[:, -1].float(), o.cache)
    return out


@pytest.fixture(scope="module")
def joints(folder, model):
    from transformers import GlmImageForConditionalGeneration

    hf = GlmImageForConditionalGeneration.from_pretrained(str(folder / glm_image.ENCODER), dtype=torch.float32,
                                                          attn_implementation="eager").eval()
    ad = model.adapter
    ids = ad.prompt_ids("a red fox")
    grids = [[1, *GRID[1]], [1, *GRID[0]]]  # the processor's order: the large grid, then the preview
    settings = dict(temperature=TEMPERATURE, top_k=2)
    return (transformers_joint(hf, ids, grids, top_p=TOP_P, **settings),
            transformers_joint(hf, ids, grids, top_p=1.0, **settings))


TEMPERATURE, TOP_P = 8.0, 0.75
EXACT = {"ar": dict(mode="ar"), "sjd": dict(mode="sjd"), "proactive": dict(mode="sjd", proactive=2)}


@pytest.mark.parametrize("name", list(EXACT))
def test_sampling_with_top_p_follows_transformers_joint(model, joints, name, monkeypatch):
    """The adapter on a 1x2 preview and 2x1 large grid (the fed tokens' positions: ``(P, P, P)``, ``(P, P, P+1)``,
    ``(P+2, P+2, P+2)``, ``(P+2, P+3, P+2)``): streams drawn in ``ar``, SJD's windows and proactive drafts' trees
    follow transformers' joint with top-p, and fail against the joint without it (the control, on the same
    streams)."""
    from .test_exactness import chi_square

    base = model.adapter
    ad = glm_image.GlmImageAdapter(base.model, base.processor, base.width, base.height, base.config,
                                   base.sampling_defaults, grid=GRID)
    assert ad.layout.length == 5 and ad.table[:, :5].tolist() == [[0, 0, 2, 2, 4], [0, 0, 2, 3, 4], [0, 1, 2, 2, 4]]
    trees = []
    tree = glm_image.GlmImageAdapter.forward_tree
    monkeypatch.setattr(glm_image.GlmImageAdapter, "forward_tree",
                        lambda self, *a, **k: trees.append(1) or tree(self, *a, **k))
    config = DecodeConfig(window=3, temperature=TEMPERATURE, top_k=2, top_p=TOP_P, **EXACT[name])
    decoder = SpeculativeDecoder(ad, config)
    tokens = torch.cat([decoder.generate(["a red fox"] * 250, seeds=chunk * 1000).tokens for chunk in range(6)])
    with_p, without_p = joints
    assert len(set(map(tuple, tokens.tolist()))) > 4  # several streams: the test can tell
    pvalue, impossible = chi_square(with_p, tokens)
    assert impossible == 0 and pvalue > 1e-4, (pvalue, impossible)
    pvalue, impossible = chi_square(without_p, tokens)
    assert impossible > 0 or pvalue < 1e-6, (pvalue, impossible)
    assert bool(trees) == (name == "proactive")  # the proactive drafts were scored as trees


def test_int8_storage_quantizes_the_glm_blocks_and_still_samples(folder):
    from spec_ar.loaders import storage

    loaded = load_model(folder, dtype="int8", width=64, height=64)
    lm = loaded.modules["glm_image_ar"]
    quantized = [n for n, m in lm.named_modules() if type(m) is storage.Int8Linear]
    assert len(quantized) == 6 * 2 and all(".language_model.layers." in n for n in quantized)  # 6 per layer
    base = loaded.adapter
    ad = glm_image.GlmImageAdapter(base.model, base.processor, 64, 64, base.config, base.sampling_defaults, grid=GRID)
    res = SpeculativeDecoder(ad, DecodeConfig(mode="sjd", window=3)).generate(["a red fox"] * 2, seeds=2)
    assert res.tokens.shape == (2, 5) and (res.tokens[:, :4] < START).all() and (res.tokens[:, 4] == END).all()


# -- bad input and bad folders: one clear error each ---------------------------------------------------------------
def copy_release(folder: pathlib.Path, to: pathlib.Path) -> pathlib.Path:
    shutil.copytree(folder, to, symlinks=True)
    return to


def test_bad_input_gets_one_clear_error_each(model, folder):
    ad = model.adapter
    with pytest.raises(ValueError, match="takes no negative prompt"):
        ad.check_conditions(["a cat"], ["blurry"])
    with pytest.raises(ValueError, match="prompt must be non-empty text"):
        ad.check_conditions(["  "], None)
    with pytest.raises(ConfigError, match="runs without guidance.*cfg_scale to 1"):
        SpeculativeDecoder(ad, DecodeConfig(mode="ar", cfg_scale=3.0)).generate(["a cat"], seeds=0)
    with pytest.raises(ValueError, match="width must be a positive multiple of 32 pixels for GLM-Image .*got 100"):
        load_model(folder, width=100, height=64)


def test_bad_folders_get_one_clear_error_each(folder, tmp_path, monkeypatch):
    no_encoder = copy_release(folder, tmp_path / "no-encoder")
    (no_encoder / glm_image.ENCODER / "config.json").unlink()
    with pytest.raises(CheckpointError, match="a GLM-Image release without its AR model"):
        detect(no_encoder)
    lone = tmp_path / "lone"  # the encoder folder alone, its processor nowhere
    shutil.copytree(folder / glm_image.ENCODER, lone)
    with pytest.raises(CheckpointError, match="GLM-Image's processor is not there"):
        load_model(lone, width=64, height=64)
    (tmp_path / "processor").symlink_to(folder / "processor", target_is_directory=True)  # beside it: found
    assert load_model(lone, width=64, height=64).family == "glm_image"
    no_weights = copy_release(folder, tmp_path / "no-weights")
    for f in (no_weights / glm_image.ENCODER).glob("model*"):
        f.unlink()
    with pytest.raises(CheckpointError, match="no weights"):
        load_model(no_weights, width=64, height=64)
    refused = copy_release(folder, tmp_path / "refused")
    specials = {"<|endoftext|>": 0}
    (refused / glm_image.ENCODER / "generation_config.json").write_text(
        json.dumps({**generation(specials), "no_repeat_ngram_size": 3}))
    with pytest.raises(CheckpointError, match="no_repeat_ngram_size 3: with it the pipeline's generate bans"):
        load_model(refused, width=64, height=64)
    monkeypatch.setitem(sys.modules, "transformers.models.glm_image.modeling_glm_image", None)  # transformers 4.x
    with pytest.raises(CheckpointError, match=r"GLM-Image needs transformers >= 5.0 .*pip install 'transformers>=5.0'"):
        load_model(folder, width=64, height=64)
