"""Janus / Janus-Pro through transformers: same tokens and logits as its own generate."""
from __future__ import annotations

import pytest
import torch

from spec_ar.loaders import janus
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

from .checkpoints import tiny_janus, write_janus, write_original_janus

PROMPTS = ["a red circle", "a blue cat in the top left on striped background"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    model, tok = tiny_janus(seed=3)
    d = tmp_path_factory.mktemp("janus")
    return {"hf": write_janus(d / "Janus-Pro-tiny", model, tok),
            "original": write_original_janus(d / "deepseek-Janus-Pro-tiny", model, tok), "model": model, "tok": tok}


def hf_generate(model, adapter, prompts, cfg=5.0):
    """transformers' own image generation (greedy), with every step's head output."""
    rows = [adapter.prompt_ids(p) for p in prompts]
    width = max(map(len, rows))
    pad = adapter.pad
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    steps = []
    hook = model.model.generation_head.register_forward_hook(lambda m, i, o: steps.append(o.detach().clone()))
    try:
        tokens = model.generate(input_ids=ids, attention_mask=mask, generation_mode="image", do_sample=False,
                                guidance_scale=cfg)
    finally:
        hook.remove()
    return tokens, torch.stack(steps, 1)  # [B, N], [2B, N, V]


def test_greedy_ar_equals_transformers_generate(folders):
    model = janus.load(folders["hf"])
    tokens, _ = hf_generate(folders["model"], model.adapter, PROMPTS)
    ours = SpeculativeDecoder(model.adapter, DecodeConfig(mode="ar", top_k=1, cfg_scale=5.0)).generate(PROMPTS)
    assert torch.equal(ours.tokens, tokens)
    assert len(set(tokens.flatten().tolist())) > 4, "a non-trivial token stream"


def test_window_logits_equal_generate_step_logits(folders):
    model = janus.load(folders["hf"])
    tokens, steps = hf_generate(folders["model"], model.adapter, PROMPTS)
    ad = model.adapter
    first = ad.prefill(PROMPTS, None, guided=True)
    window = ad.forward(tokens[:, :9])  # positions 1..9 in one forward
    ours = torch.cat([first.unsqueeze(2), window], 2)  # [2, B, 10, V]
    ref = steps[:, :10].view(2, 2, 10, -1)
    torch.testing.assert_close(ours, ref.float(), atol=1e-4, rtol=1e-4)
    # ragged rollback: sample 0 keeps 4 of the 9 rows, sample 1 all; then continue
    ad.rollback([5, 0])
    nxt = ad.forward(torch.stack([tokens[0, 4:10], tokens[1, 9:15]]))
    torch.testing.assert_close(nxt[:, 0], steps.view(2, 2, 16, -1)[:, 0, 5:11].float(),
                               atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(nxt[:, 1], steps.view(2, 2, 16, -1)[:, 1, 10:16].float(), atol=1e-4, rtol=1e-4)


def test_holes_compact_without_changing_logits(folders):
    model = janus.load(folders["hf"])
    tokens, steps = hf_generate(folders["model"], model.adapter, PROMPTS)
    ad = model.adapter
    ad.prefill(PROMPTS, None, guided=True)
    ad.cache.slack = 0  # compact at every chance
    ad.forward(tokens[:, :8])
    ad.rollback([6, 1])  # keeps 2 and 7
    assert ad.cache_lengths().tolist() == [2, 7]
    out = ad.forward(torch.stack([tokens[0, 2:8], tokens[1, 7:13]]))
    ref = steps.view(2, 2, 16, -1)
    torch.testing.assert_close(out[:, 0], ref[:, 0, 3:9].float(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out[:, 1], ref[:, 1, 8:14].float(), atol=1e-4, rtol=1e-4)


def test_original_deepseek_folder_loads_through_the_key_remap(folders):
    converted, original = janus.load(folders["hf"]), janus.load(folders["original"])
    a = converted.adapter.prefill(PROMPTS, None, True)
    b = original.adapter.prefill(PROMPTS, None, True)
    torch.testing.assert_close(a, b)
    codes = torch.randint(0, 64, (1, 4, 4))
    torch.testing.assert_close(converted.decode(codes), original.decode(codes))


@pytest.mark.parametrize("batch", [1, 2])
def test_every_mode_decodes_images(folders, batch):
    model = janus.load(folders["hf"])
    for mode in ("ar", "sjd", "gsd", "lantern", "vvs"):
        cfg = DecodeConfig(mode=mode, window=4, lantern_k=20)
        res = SpeculativeDecoder(model.adapter, cfg).generate(PROMPTS[:batch], seeds=2)
        images = model.decode(res.image_tokens(model.adapter.layout))
        assert images.shape == (batch, 3, 8, 8)
        assert 0 <= float(images.min()) and float(images.max()) <= 1


class Payload:
    """Any class outside the weights-only allowlist: what a pickle that runs code unpickles to."""

    def __reduce__(self):
        return (print, ("this pickle runs code",))


@pytest.mark.parametrize("layout", ["hf", "original"])
def test_a_janus_pickle_that_runs_code_is_refused_in_the_packs_words(folders, tmp_path, layout, capsys):
    import shutil

    from spec_ar.cli import main
    from spec_ar.formats.checkpoints import CheckpointError

    folder = tmp_path / f"evil-{layout}"
    shutil.copytree(folders[layout], folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    torch.save({**folders["model"].state_dict(), "payload": Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as refused:
        janus.load_model(folder)
    text = str(refused.value)
    assert text.startswith(f"{folder / 'pytorch_model.bin'}: refused: it pickles a non-tensor object (")
    assert "weights_only" not in text and "will likely succeed" not in text
    assert refused.value.__cause__ is None and refused.value.__suppress_context__  # no torch text in a traceback
    code = main(["render", "--model", str(folder), "--prompt", "a red circle", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "refused: it pickles a non-tensor object" in err and "weights_only" not in err
    assert "this pickle runs code" not in capsys.readouterr().out


@pytest.mark.parametrize("layout", ["hf", "original"])
def test_both_layouts_load_in_the_requested_dtype_with_the_models_own_buffers(folders, layout):
    """Built with its parameters on the meta device and given the file's tensors: every parameter in
    the dtype asked for, and the buffers no file stores (rotary frequencies, position ids) as
    transformers' own model computes them."""
    model, _ = janus.load_model(folders[layout], dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not any(p.is_meta for p in model.parameters())
    reference = dict(folders["model"].named_buffers())
    loaded = dict(model.named_buffers())
    assert set(loaded) == set(reference)
    for name, buf in loaded.items():
        assert torch.equal(buf, reference[name].to(buf.dtype)), name
