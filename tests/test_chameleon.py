"""Lumina-mGPT and Anole (the Chameleon architecture) on tiny random checkpoints in
transformers' converted format and in Lumina-mGPT's own layout, with a tiny Meta-format VQGAN."""
import json

import pytest
import torch

from spec_ar.loaders import chameleon
from spec_ar.formats.checkpoints import CheckpointError
from spec_ar.loaders.detect import detect, load_model
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

from .chameleon_files import tiny_lumina_reference, write_chameleon, write_lumina, write_tiny_vqgan

MODES = ["ar", "sjd", "gsd", "lantern", "vvs"]


@pytest.fixture(scope="module")
def lumina_folder(tmp_path_factory):
    return write_chameleon(tmp_path_factory.mktemp("lumina") / "Lumina-mGPT-7B-768", "lumina")


@pytest.fixture(scope="module")
def anole_folder(tmp_path_factory):
    return write_chameleon(tmp_path_factory.mktemp("anole") / "Anole-7b-hf", "anole", seed=1)


@pytest.fixture(scope="module")
def lumina(lumina_folder):
    return chameleon.load(lumina_folder, width=96, height=64)


def test_detection_tells_lumina_from_anole_by_contents(lumina_folder, anole_folder, tmp_path):
    assert detect(lumina_folder).family == "lumina"
    assert detect(anole_folder).family == "anole"
    renamed = tmp_path / "lumina-looking-name"  # the name means nothing
    renamed.symlink_to(anole_folder, target_is_directory=True)
    assert detect(renamed).family == "anole"


def test_lumina_layout_forces_size_end_of_line_and_end_of_image(lumina):
    ad, vocab = lumina.adapter, lumina.adapter.model.config.vocabulary_map
    lay = ad.layout
    assert lay.grid == (4, 6) and lay.row_stride == 7 and lay.length == 2 + 4 * 7 + 1
    forced = {p: t for p, t in enumerate(lay.forced.tolist()) if t >= 0}
    assert forced[0] == vocab["<reserved08802>"] and forced[1] == vocab["<reserved08803>"]  # 64 px high, 96 wide
    assert [p for p, t in forced.items() if t == vocab["<reserved08799>"]] == [8, 15, 22, 29]
    assert forced[lay.length - 1] == vocab["<eoss>"] and len(forced) == 7
    ids = ad.prompt_ids("a red fox")
    assert ids[0] == vocab["<s>"] and ids[-2:] == [vocab["<reserved08706>"], vocab["<racm3:break>"]]
    assert ad.unconditional_ids() == [vocab["<racm3:break>"]]  # the reference's uncond context


def test_window_logits_equal_token_by_token_also_after_ragged_rollback(lumina):
    ad = lumina.adapter
    g = torch.Generator().manual_seed(0)
    prompts = ["a red fox in snow", "cat"]
    window = ad.image_ids[torch.randint(len(ad.image_ids), (2, 5), generator=g)]
    more = ad.image_ids[torch.randint(len(ad.image_ids), (2, 3), generator=g)]
    ad.prefill(prompts, None, guided=True)
    ad.forward(window)
    ad.rollback([3, 1])  # row 0 keeps 2 tokens, row 1 keeps 4
    batched = ad.forward(more)
    for b, keep in ((0, 2), (1, 4)):
        ad.prefill([prompts[b]], None, guided=True)
        steps = [ad.forward(t.view(1, 1)) for t in torch.cat([window[b, :keep], more[b]])]
        single = torch.cat(steps, 2)[:, 0, keep:]
        assert torch.allclose(batched[:, b], single, atol=1e-4), (b, (batched[:, b] - single).abs().max())


def _reference_greedy(model, ad, prompt, cfg):
    """Lumina's reference loop, written out: full recomputation every step (no
    cache), the unconditional context from <racm3:break> on, forced structure."""
    cond, uncond = ad.prompt_ids(prompt), ad.unconditional_ids()
    out = []
    for pos, forced in enumerate(ad.layout.forced.tolist()):
        if forced >= 0:
            t = forced
        else:
            with torch.no_grad():
                lc = model.lm_head(model.model(input_ids=torch.tensor([cond])).last_hidden_state[0, -1])
                lu = model.lm_head(model.model(input_ids=torch.tensor([uncond])).last_hidden_state[0, -1])
            mixed = lu + cfg * (lc - lu)
            t = int(ad.image_ids[mixed[ad.image_ids].argmax()])
        out.append(t)
        cond, uncond = cond + [t], uncond + [t]
    return out


def test_greedy_ar_equals_the_reference_loop(lumina):
    ad = lumina.adapter
    res = SpeculativeDecoder(ad, DecodeConfig(mode="ar", top_k=1, cfg_scale=3.0)).generate(["a red fox"], seeds=0)
    assert res.tokens[0].tolist() == _reference_greedy(ad.model, ad, "a red fox", 3.0)
    assert len(set(res.image_tokens(ad.layout).flatten().tolist())) > 3  # not a degenerate constant image


@pytest.mark.parametrize("flavour,batch", [("lumina", 1), ("lumina", 2), ("anole", 1)])  # Anole: 1025 tokens
def test_every_mode_runs_and_keeps_forced_tokens(lumina, anole_folder, flavour, batch):
    model = lumina if flavour == "lumina" else chameleon.load(anole_folder)
    ad, lay = model.adapter, model.adapter.layout
    forced = lay.forced >= 0
    for mode in MODES:
        config = DecodeConfig(mode=mode, window=8, lantern_k=8, group_size=4)
        res = SpeculativeDecoder(ad, config).generate(["a red fox in snow", "cat"][:batch], seeds=5)
        assert (res.tokens[:, forced] == lay.forced[forced]).all(), mode
        assert ad.layout.image_tokens[res.tokens[:, ~forced]].all(), mode
        images = model.decode(res.image_tokens(lay))
        h, w = (64, 96) if flavour == "lumina" else (512, 512)
        assert images.shape == (batch, 3, h, w) and 0 <= images.min() and images.max() <= 1, mode


def test_anole_uses_three_way_guidance_with_a_shared_unconditional(anole_folder):
    model = chameleon.load(anole_folder)
    ad = model.adapter
    assert ad.guidance == "image_text" and ad.branches(True) == 3
    assert ad.layout.grid == (32, 32) and ad.layout.length == 1025
    logits = ad.prefill(["a red fox"], None, guided=True)
    assert logits.shape == (3, 1, ad.vocab_size) and torch.equal(logits[1], logits[2])
    assert not torch.equal(logits[0], logits[2])
    assert ad.sampling_defaults == {"cfg_scale": 3.0, "temperature": 0.7, "top_p": 0.9}


def test_image_token_map_comes_from_the_vocabulary(lumina):
    ad = lumina.adapter
    vocab = ad.model.config.vocabulary_map
    assert ad.codes[vocab["IMGIMGBCZ"]] == 12 and ad.codes[vocab["IMGIMGAZ"]] == 0
    ids, vectors = ad.token_vectors()
    assert torch.equal(vectors[ids.tolist().index(vocab["IMGIMGBCZ"])], ad.codebook[12])


def test_lumina_masks_the_release_pad_id_out_of_its_prompt_as_the_reference_generate_does(lumina_folder, tmp_path):
    """Lumina-mGPT's solver (``inference_solver.py`` @104abe4) passes ``generate`` its own ``GenerationConfig``
    (end id ``<reserved08706>``, no pad id); transformers of its time (4.43 to 4.47) takes the pad id from the
    release's generation_config.json and masks every prompt position holding it unless it is the end id: a pad
    id equal to the BOS takes the BOS out of what the model sees (as for Lumina-mGPT 2.0); the end id masks
    nothing."""
    import json

    copy = tmp_path / "Lumina-mGPT-7B-768"
    copy.mkdir()
    for f in lumina_folder.iterdir():
        if f.name != "generation_config.json":
            (copy / f.name).symlink_to(f)
    plain = chameleon.load(lumina_folder, width=96, height=64).adapter
    row = plain.prompt_ids("a cat")
    assert row[0] == plain.bos and plain.bos not in row[1:]
    end = plain.end_of_turn
    (copy / "generation_config.json").write_text(json.dumps({"bos_token_id": plain.bos, "eos_token_id": end,
                                                             "pad_token_id": plain.bos}))
    assert chameleon.load(copy, width=96, height=64).adapter.prompt_ids("a cat") == row[1:]
    (copy / "generation_config.json").write_text(json.dumps({"eos_token_id": end, "pad_token_id": end}))
    assert chameleon.load(copy, width=96, height=64).adapter.prompt_ids("a cat") == row


def test_bad_input_gets_one_clear_error_each(lumina_folder, tmp_path):
    no_vq = write_chameleon(tmp_path / "novq", "lumina", vqgan=False)
    with pytest.raises(CheckpointError, match=r"novq: Lumina-mGPT needs Meta's VQGAN .* give --vq"):
        chameleon.load(no_vq)
    with pytest.raises(ValueError, match=r"width must be a positive multiple of 32 pixels for Lumina-mGPT \(got 80\)"):
        chameleon.load(lumina_folder, width=80, height=64)
    no_images = write_chameleon(tmp_path / "text-only", "lumina", with_images=False, vqgan=False)
    with pytest.raises(CheckpointError, match="text-only: the vocabulary has no image tokens"):
        chameleon.load(no_images)
    other = write_tiny_vqgan(tmp_path / "vq128", codes=128)
    with pytest.raises(CheckpointError, match=r"vqgan.ckpt: the VQGAN has 128 codes but the vocabulary of .* has 64"):
        chameleon.load(lumina_folder, vq=other[0].parent)


def test_render_command_takes_width_and_height(lumina_folder, tmp_path):
    from spec_ar.cli import main

    out = tmp_path / "out"
    assert main(["render", "--model", str(lumina_folder), "--prompt", "a red fox", "--mode", "sjd", "--width", "64",
                 "--height", "96", "--out", str(out)]) == 0
    report = json.loads((out / "sjd_0.json").read_text())
    assert report["family"] == "lumina" and report["reports"][0]["tokens"] == 2 + 6 * 5 + 1
    assert load_model(lumina_folder, width=64, height=64).adapter.layout.grid == (4, 4)


@pytest.mark.parametrize("shards", [1, 2])  # 7B releases: [1, 128]; 34B: [4, 128] (here 4 heads, 2 kv heads)
def test_lumina_folders_in_lumina_layout_load_as_the_reference_model(tmp_path, shards):
    from safetensors import safe_open
    from transformers import ChameleonForConditionalGeneration

    folder = write_lumina(tmp_path / "Lumina-mGPT-7B-768", model_parallel_size=shards)
    with safe_open(str(folder / "model-00001-of-00002.safetensors"), "pt") as f:  # the layout transformers rejects
        assert f.get_slice("model.layers.0.self_attn.k_norm.weight").get_shape() == [shards, 8]
    with pytest.raises(RuntimeError, match="size mismatch|mismatch"):
        ChameleonForConditionalGeneration.from_pretrained(str(folder))
    assert detect(folder).family == "lumina"
    model = load_model(folder, width=64, height=64)
    ref, vocab = tiny_lumina_reference(model_parallel_size=shards)  # the rows repeated per head, as Lumina runs them
    ids = torch.tensor([model.adapter.prompt_ids("a red fox") + model.adapter.image_ids[:5].tolist()])
    ours = model.adapter.head(model.adapter.inner(input_ids=ids).last_hidden_state)
    torch.testing.assert_close(ours, ref.lm_head(ref.model(input_ids=ids).last_hidden_state), rtol=0, atol=0)


def test_lumina_layout_renders_and_a_norm_fitting_no_layout_is_one_error(tmp_path):
    from spec_ar.cli import main

    folder = write_lumina(tmp_path / "Lumina-mGPT-7B-768")
    out = tmp_path / "out"
    assert main(["render", "--model", str(folder), "--prompt", "a red fox", "--mode", "gsd", "--width", "64",
                 "--height", "64", "--out", str(out)]) == 0
    assert json.loads((out / "gsd_0.json").read_text())["family"] == "lumina"
    bad = write_lumina(tmp_path / "odd", norm_rows=3)  # 3 rows: not 4 heads, not 1 shard
    with pytest.raises(CheckpointError, match=r"odd/model-0000\d-of-00002.safetensors: model.layers.\d.self_attn."
                                              r"q_norm.\w+ has shape \[3, 8\]; the layouts that load are \[4, 8\] "
                                              r"\(transformers'.*\) and \[1, 8\] \(Lumina-mGPT's"):
        load_model(bad)
