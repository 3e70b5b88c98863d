"""GLM-Image's DiT stage as the loaded model's decoder (``decoders/glm_dit.py``), on a tiny random release folder
with the DiT's parts (``glm_image_files.write_dit``): the images equal diffusers' own ``GlmImagePipeline`` run
directly on the same folder with the same ``prior_token_ids``, prompt, seed and steps (float32); the command line
renders through it; what is missing (diffusers, the DiT's folders, the prompt) gets one clear error each."""
import json
import pathlib
import shutil
import sys

import pytest
import torch

pytest.importorskip("diffusers", reason="GLM-Image's DiT stage needs diffusers (pip install 'diffusers>=0.37')")

from spec_ar.formats.checkpoints import CheckpointError  # noqa: E402
from spec_ar.loaders import glm_image  # noqa: E402
from spec_ar.loaders.detect import load_model  # noqa: E402
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder  # noqa: E402
from spec_ar.sampling.checks import NonFiniteImageError  # noqa: E402

from .glm_image_files import CODES, END, write_glm_image  # noqa: E402

WIDTH, HEIGHT = 96, 64  # a 2 x 3 large grid (64 x 96 px), a 13 x 19 preview
PROMPTS = ["a poster with the word 'hello'", "a red fox in snow"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_glm_image(tmp_path_factory.mktemp("glm-dit") / "GLM-Image", dit_stage=True)


@pytest.fixture(scope="module")
def model(folder):
    return load_model(folder, width=WIDTH, height=HEIGHT)


@pytest.fixture(scope="module")
def pipeline(folder):
    """diffusers' pipeline from the release folder itself, the AR slots left empty (prior tokens given)."""
    from diffusers import GlmImagePipeline

    pipe = GlmImagePipeline.from_pretrained(str(folder), vision_language_encoder=None, processor=None,
                                            torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def streams(adapter, seed: int, batch: int = 2) -> torch.Tensor:
    """Random whole streams ``[B, length]``: preview codes, large-grid codes, the image end."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, CODES, (batch, adapter.layout.length - 1), generator=g)
    return torch.cat([codes, torch.full((batch, 1), END)], 1)


def pipeline_images(pipeline, tokens, adapter, prompts, seed, steps, guidance=1.5):
    return pipeline(prompt=list(prompts), prior_token_ids=glm_image.prior_token_ids(tokens, adapter),
                    height=HEIGHT, width=WIDTH, num_inference_steps=steps, guidance_scale=guidance,
                    generator=torch.Generator().manual_seed(seed), output_type="pt").images


def test_the_release_with_its_dit_loads_a_decoder(model):
    assert model.decode is not None and "no_decoder" not in model.info
    assert model.info["dit_steps"] == 50 and model.info["dit_guidance"] == 1.5  # the pipeline's own defaults
    assert set(model.modules) == {"glm_image_ar"}  # what ComfyUI's manager moves; the DiT comes and goes by turns
    assert model.turns is model.adapter.turns and set(model.turns.stages) == {"sampling", "decoding"}
    assert model.info["stages"] == "none"  # the tiny stages fit together here
    assert model.decode_bytes_per_image > 0 and model.decode.stage == "GLM-Image DiT Decode"  # the sampler leaves it
    assert model.name.startswith("GLM-Image (")


@pytest.mark.parametrize("guidance", [1.5, 1.0])
def test_images_equal_the_pipelines_own(model, pipeline, guidance):
    """The sampler's image tokens of two streams, two prompts, seed 3, 2 steps: equal to the pipeline given the
    same prior_token_ids (the stream's large grid upsampled, ``prior_token_ids``); the large grid alone decodes the
    same; another seed, another prior grid or another quoted text changes the image (the control)."""
    ad = model.adapter
    tokens = streams(ad, 0)
    decode = glm_image.PriorDecode(model.decode.dit, ad, steps=2, guidance=guidance, seed=3)
    image_tokens = tokens[:, ad.layout.image_positions()].view(2, *ad.layout.grid)
    ours = decode(image_tokens, prompts=PROMPTS)
    ref = pipeline_images(pipeline, tokens, ad, PROMPTS, seed=3, steps=2, guidance=guidance)
    assert ours.shape == (2, 3, HEIGHT, WIDTH) and ours.dtype == torch.float32
    assert 0 <= float(ours.min()) and float(ours.max()) <= 1
    assert torch.equal(ours, ref)
    assert torch.equal(decode(ad.prior_tokens(tokens), prompts=PROMPTS), ours)
    decode.seed = 4
    assert not torch.allclose(decode(image_tokens, prompts=PROMPTS), ours, atol=1e-3)
    decode.seed = 3
    other = streams(ad, 1)
    assert not torch.allclose(decode(other[:, ad.layout.image_positions()].view(2, *ad.layout.grid), prompts=PROMPTS),
                              ours, atol=1e-3)
    quoted = decode(image_tokens, prompts=["a poster with the word 'hullo'", PROMPTS[1]])
    assert not torch.allclose(quoted[0], ours[0], atol=1e-3) and torch.equal(quoted[1], ours[1])  # the quotes only


def test_sampled_then_decoded_for_the_prompt_sampled(folder, pipeline):
    """``decode(result.image_tokens(layout))`` after sampling: the adapter's prompt, the decoder's seed and steps
    (chunks of one image each decode as the pipeline does image by image)."""
    model = load_model(folder, width=WIDTH, height=HEIGHT)
    model.decode.steps, model.decode.seed = 2, 5
    ad = model.adapter
    res = SpeculativeDecoder(ad, DecodeConfig(mode="sjd", window=16)).generate([PROMPTS[0]] * 2, seeds=0)
    steps = []
    model.decode.progress = lambda done, total: steps.append((done, total))
    images = model.decode_images(res.image_tokens(ad.layout))
    ref = pipeline_images(pipeline, res.tokens, ad, [PROMPTS[0]] * 2, seed=5, steps=2)
    assert torch.equal(images, ref) and steps == [(1, 2), (2, 2)]
    one = torch.cat([model.decode(res.image_tokens(ad.layout)[i:i + 1]) for i in range(2)])
    for i in range(2):
        assert torch.equal(one[i], pipeline_images(pipeline, res.tokens[i:i + 1], ad, [PROMPTS[0]], 5, 2)[0])


def test_the_prompt_is_known_or_the_decode_says_so(folder):
    model = load_model(folder, width=WIDTH, height=HEIGHT)
    ad = model.adapter
    tokens = streams(ad, 0, batch=3)
    grid = tokens[:, ad.layout.image_positions()].view(3, *ad.layout.grid)
    with pytest.raises(ValueError, match="needs the prompt .*sample with this model first"):
        model.decode(grid)
    ad.condition_rows(["a cat", "a dog", "a cat"], None, False)  # what a prefill of three prompts records
    model.decode.steps = 1
    assert model.decode(grid).shape == (3, 3, HEIGHT, WIDTH)  # the whole batch: one prompt each
    with pytest.raises(ValueError, match="made 3 images of 2 different prompts and this call decodes 1: which prompt is whose"):
        model.decode(grid[:1])
    with pytest.raises(ValueError, match="one prompt per image: 1 prompts for 3 images"):
        model.decode(grid, prompts=["a cat"])
    with pytest.raises(ValueError, match=r"takes the sampler's image tokens \[B, 1, 253\] or the large grid"):
        model.decode(grid[:, :, :10])
    with pytest.raises(ValueError, match="64 prior codes; the prior tokens hold ids from 0 to 64"):
        model.decode(torch.full((1, 2, 3), CODES).index_fill_(2, torch.tensor([0]), 0), prompts=["a cat"])


def test_the_command_line_renders_a_png_of_the_size(folder, tmp_path, capsys):
    from PIL import Image

    from spec_ar.cli import main

    out = tmp_path / "out"
    assert main(["render", "--model", str(folder), "--mode", "sjd", "--prompt", "a poster with the word 'hello'",
                 "--width", str(WIDTH), "--height", str(HEIGHT), "--seed", "7", "--out", str(out)]) == 0
    with Image.open(out / "sjd_7.png") as img:
        assert img.size == (WIDTH, HEIGHT)
    report = json.loads((out / "sjd_7.json").read_text())
    assert report["family"] == "glm_image" and report["images"] == [str(out / "sjd_7.png")]


def test_nan_images_are_an_error(folder):
    model = load_model(folder, width=WIDTH, height=HEIGHT)
    model.decode.steps = 1
    ad = model.adapter
    tokens = streams(ad, 0)
    grid = tokens[:, ad.layout.image_positions()].view(2, *ad.layout.grid)
    ad.condition_rows(["a cat"], None, False)
    assert torch.isfinite(model.decode_images(grid)).all()
    with torch.no_grad():
        model.decode.dit.parts["transformer"].proj_out.bias.fill_(float("nan"))
    with pytest.raises(NonFiniteImageError, match="DiT stage output for image 0 .*NaN or infinity"):
        model.decode_images(grid)


def test_without_diffusers_one_clear_error_before_any_weights(folder, monkeypatch):
    for name in [m for m in sys.modules if m == "diffusers" or m.startswith("diffusers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "diffusers", None)  # import diffusers: ImportError
    monkeypatch.setattr(glm_image, "load_model", lambda *a, **k: pytest.fail("read the AR weights first"))
    with pytest.raises(CheckpointError, match=r"needs diffusers >= 0.37; this environment has no diffusers: "
                                              r"pip install 'diffusers>=0.37'"):
        load_model(folder, width=WIDTH, height=HEIGHT)


def test_a_release_without_the_dits_folders_has_no_decoder_and_says_which(folder, tmp_path, capsys):
    from spec_ar.cli import main

    partial = tmp_path / "partial"
    shutil.copytree(folder, partial, symlinks=True)
    shutil.rmtree(partial / "vae")
    shutil.rmtree(partial / "scheduler")
    model = load_model(partial, width=WIDTH, height=HEIGHT)
    assert model.decode is None and "this folder has no vae/, scheduler/" in model.info["no_decoder"]
    assert main(["render", "--model", str(partial), "--prompt", "a red fox", "--width", str(WIDTH),
                 "--height", str(HEIGHT), "--out", str(tmp_path / "out")]) == 2
    assert "no vae/, scheduler/" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_pickled_weights_are_refused(folder, tmp_path):
    """A DiT part with a pickled file alone: safetensors only, nothing unpickled."""
    bad = tmp_path / "pickled"
    shutil.copytree(folder, bad, symlinks=True)
    vae = bad / "vae"
    (vae / "diffusion_pytorch_model.safetensors").unlink()
    (vae / "diffusion_pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(CheckpointError, match=r"vae: GLM-Image's VAE is read from safetensors files; this folder "
                                              r"has pickled weights only \(diffusion_pytorch_model.bin\)"):
        load_model(bad, width=WIDTH, height=HEIGHT)


def test_the_decoders_parts_from_their_own_folders(folder, tmp_path):
    from spec_ar.decoders import glm_dit

    parts = {p: tmp_path / f"my-{p}" for p in glm_dit.PARTS}
    for p, where in parts.items():
        shutil.copytree(folder / p, where)
    dit = glm_dit.GlmDiT.load(**parts)
    ref = glm_dit.GlmDiT.load(folder)
    prior = torch.randint(0, CODES, (1, 2, 3), generator=torch.Generator().manual_seed(0))
    assert torch.equal(dit.decode(prior, ["a cat"], steps=1), ref.decode(prior, ["a cat"], steps=1))
    with pytest.raises(CheckpointError, match="its vae folder is missing"):
        glm_dit.GlmDiT.load(transformer=parts["transformer"])
    assert pathlib.Path(dit.source).name == "my-transformer"


@pytest.mark.parametrize("mode", ["ar", "sjd", "gsd", "lantern", "vvs"])
def test_the_command_line_renders_in_every_mode_with_the_dits_settings(folder, tmp_path, mode):
    """``spec-ar render`` in each mode on the release with its DiT, one DiT step: a PNG of the asked size; the
    DiT's settings reach the decoder (sjd: another --dit-seed, another picture of the same AR tokens)."""
    import numpy as np
    from PIL import Image

    from spec_ar.cli import main

    def render(out, dit_seed):
        assert main(["render", "--model", str(folder), "--mode", mode, "--prompt", "a poster with the word 'hello'",
                     "--width", str(WIDTH), "--height", str(HEIGHT), "--seed", "1", "--dit-steps", "1",
                     "--dit-guidance", "1.5", "--dit-seed", str(dit_seed), "--out", str(out)]
                    + (["--lantern-k", "8"] if mode in ("lantern", "vvs") else [])) == 0
        with Image.open(out / f"{mode}_1.png") as img:
            assert img.size == (WIDTH, HEIGHT)
            return torch.from_numpy(np.asarray(img).copy())

    first = render(tmp_path / "a", 0)
    if mode == "sjd":
        assert not torch.equal(first, render(tmp_path / "b", 9))


@pytest.mark.parametrize("argv,message", [
    (["--dit-steps", "0"], "--dit-steps must be an integer >= 1 (got 0)"),
    (["--dit-steps", "2.5"], "--dit-steps must be an integer >= 1 (got '2.5')"),
    (["--dit-guidance", "-1"], "--dit-guidance must be a finite number >= 0 (got -1.0)"),
    (["--dit-guidance", "nan"], "--dit-guidance must be a finite number >= 0 (got nan)"),
    (["--dit-guidance", "inf"], "--dit-guidance must be a finite number >= 0 (got inf)"),
    (["--dit-seed", "-3"], "--dit-seed must be an integer >= 0 (got -3)"),
])
def test_the_dits_settings_out_of_range_are_refused_by_name(folder, tmp_path, capsys, argv, message):
    from spec_ar.cli import main

    assert main(["render", "--model", str(folder), "--prompt", "a cat", "--out", str(tmp_path / "out"), *argv]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_the_dits_settings_for_a_model_without_a_dit_are_refused_before_loading(folder, tmp_path, capsys,
                                                                                   monkeypatch):
    from spec_ar.cli import main
    from spec_ar.loaders import detect

    monkeypatch.setattr(detect, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    assert main(["render", "--model", "embedded", "--prompt", "a cat", "--dit-guidance", "2",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--dit-guidance is a setting of GLM-Image's DiT stage; embedded (family embedded) has none: leave " \
           "--dit-guidance out" in err
    partial = tmp_path / "partial"
    shutil.copytree(folder, partial, symlinks=True)
    shutil.rmtree(partial / "transformer")
    assert main(["render", "--model", str(partial), "--prompt", "a cat", "--dit-steps", "3", "--dit-seed", "1",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--dit-steps is a setting of GLM-Image's DiT stage" in err and "no transformer/" in err
    assert not (tmp_path / "out").exists()


def test_the_stages_take_turns_through_their_files_and_the_images_do_not_change(folder, pipeline, monkeypatch):
    """Where no memory holds both stages (``"files"``): the AR model leaves memory while the DiT runs and the DiT
    while the AR model samples, each read again at its turn, and the images are the pipeline's, turn after turn."""
    from spec_ar.loaders import stages

    monkeypatch.setattr(glm_image, "stage_wait", lambda *a, **k: "files")
    model = load_model(folder, width=WIDTH, height=HEIGHT)
    ar, dit, turns = model.adapter.model, model.decode.dit, model.turns
    assert turns.wait == model.info["stages"] == "files" and dit.parts is None  # the DiT read at its first turn
    head = ar.lm_head.weight.detach().clone()
    seen = []

    def watch(done, steps):  # during the DiT's steps: the AR model out of memory
        seen.append((stages.on_meta(ar), dit.parts is not None))

    model.decode.progress, model.decode.steps = watch, 2
    for round in range(2):
        res = SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd")).generate(PROMPTS, seeds=round)
        assert dit.parts is None and not stages.on_meta(ar)  # sampled with the AR model back, the DiT gone
        images = model.decode_images(res.image_tokens(model.adapter.layout))
        expected = pipeline_images(pipeline, res.tokens, model.adapter, PROMPTS, 0, 2)
        torch.testing.assert_close(images, expected.float(), rtol=0, atol=1e-5)
    assert set(seen) == {(True, True)} and len(seen) == 2 * 2
    turns.turn("sampling")
    assert torch.equal(ar.lm_head.weight, head) and dit.parts is None  # read again, the same weights
    assert turns.moves == {"enter": 4, "park": 0, "drop": 4}


def test_the_cards_bench_sizes_both_stages_and_how_they_take_turns(folder, tmp_path):
    """``spec-ar bench cards`` on the release: the AR model's options as for any model (only the tensors the
    family reads counted), the DiT beside one image alone on the card, and where the stage not running waits."""
    from spec_ar.bench import cards
    from spec_ar.loaders.storage import checkpoint_files, file_weight_bytes

    def bench(card, system):
        out = tmp_path / f"{card}-{system}"
        cards.main(["--model", str(folder), "--width", str(WIDTH), "--height", str(HEIGHT), "--cards", str(card),
                    "--system", str(system), "--storages", "bfloat16", "--out", str(out)])
        return json.loads((out / "cards.json").read_text())

    roomy = bench(100, 64)
    (row,) = [r for r in roomy["rows"] if not r["offload"]]
    assert row["stages"] == "none" and row["batch"] > 0 and roomy["dit_gb"] > 0
    encoder = checkpoint_files(folder / glm_image.ENCODER)  # the vision encoder and VQ model are not read
    assert row["weights_gb"] * 1e9 < file_weight_bytes(encoder, "bfloat16", "cuda")
    ar = row["weights_gb"] + roomy["per_image_gb"]
    dit = roomy["dit_gb"] + roomy["dit_per_image_gb"]
    card = max(ar, dit) / 0.9 * 1.01  # each stage alone fits, not both
    assert (row["weights_gb"] + roomy["dit_gb"] + roomy["dit_per_image_gb"]) > 0.9 * card
    turns = {r["stages"] for r in bench(card, 64)["rows"] if not r["offload"]}
    assert turns == {"system"}
    assert {r["stages"] for r in bench(card, 0)["rows"] if not r["offload"]} == {"files"}


def test_the_stages_bench_renders_in_the_sized_storage_and_measures_each_phase(folder, tmp_path, monkeypatch):
    from spec_ar.bench import stages as bench

    monkeypatch.setattr(glm_image, "stage_wait", lambda *a, **k: "files")  # as on a machine that holds one stage
    assert bench.main(["--model", str(folder), "--width", str(WIDTH), "--height", str(HEIGHT), "--dit-steps", "1",
                       "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "stages.json").read_text())
    assert r["storage"] == "bfloat16" and r["card_stages"] == "none" and r["here_stages"] == "files"
    assert r["moves"] == {"enter": 1, "park": 0, "drop": 1} and r["finite"] and r["image"] == [1, 3, HEIGHT, WIDTH]
    assert {"load", "sampling", "turn", "decoding"} <= set(r["peak_gb"]) and r["high_water_gb"] > 0
    assert r["forwards"] <= r["tokens"]
