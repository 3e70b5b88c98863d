"""Per family: the prompt ids and stream grammar of our adapters against the ids recorded from the
reference code (``reference_ids.py``), on folders loaded as a user would (``detect.load_model``)."""
from __future__ import annotations

import torch

from spec_ar.loaders import emu3
from spec_ar.loaders.detect import load_model

from . import reference_ids as ref
from .chameleon_files import write_lumina
from .chameleon_meta_files import write_meta_chameleon
from .checkpoints import random_gpt, tiny_gpt_spec, tiny_janus, write_gpt, write_janus, write_t5, write_vq
from .emu3_files import write_baai_converted_tokenizer, write_emu3


def stream_of(layout) -> list:
    """The layout as the reference streams are written: the forced token, or IMAGE at a free position."""
    return [t if t >= 0 else ref.IMAGE for t in layout.forced.tolist()]


def test_lumina_mgpt_prompt_and_grammar(tmp_path):
    folder = write_lumina(tmp_path / "Lumina-mGPT-7B-768")  # Lumina's own layout
    model = load_model(folder, width=96, height=64)
    for (w, h, prompt), ids in ref.LUMINA_PROMPTS.items():
        ad = model.resize((w, h)).adapter
        # the reference's prompt, then <racm3:break>, which we force (the reference samples it)
        assert ad.prompt_ids(prompt) == ids + [ref.LUMINA_STREAM_96x64[0]], (w, h, prompt)
    ad = model.adapter
    assert [ad.prompt_ids("x")[-1]] + stream_of(ad.layout) == ref.LUMINA_STREAM_96x64
    assert ad.unconditional_ids() == ref.LUMINA_UNCONDITIONAL_START


def test_anole_prompt_with_end_of_turn_and_its_guidance_rows(tmp_path):
    model = load_model(write_meta_chameleon(tmp_path / "Anole-7b-v0.1", seed=1))  # GAIR's release layout
    ad = model.adapter
    for prompt, (full, image_only, uncond) in ref.ANOLE_ROWS.items():
        assert ad.prompt_ids(prompt) == full, prompt
        assert ad.unconditional_ids() == uncond == image_only  # computed once, used for both branches
    assert stream_of(ad.layout) == ref.ANOLE_STREAM


def test_janus_pro_prompt_strips_the_text_and_writes_an_empty_turn(tmp_path):
    model, tok = tiny_janus(seed=3)
    ad = load_model(write_janus(tmp_path / "Janus-Pro-tiny", model, tok)).adapter
    for prompt, ids in ref.JANUS_PROMPTS.items():
        assert ad.prompt_ids(prompt) == ids, repr(prompt)
    unstripped = ad.tokenizer("<|User|>: a red cat\n\n\n<|Assistant|>:", add_special_tokens=False).input_ids
    assert [ad.bos] + unstripped + [ad.boi] != ref.JANUS_PROMPTS["a red cat\n"]  # the tokenizer sees whitespace
    for prompt, ids in ref.JANUS_PROMPTS.items():  # BOS, pad for every other prompt position, <begin_of_image>
        assert ad.unconditional_ids(ad.prompt_ids(prompt)) == [ids[0]] + [ref.JANUS_PAD] * (len(ids) - 2) + [ids[-1]]
    assert stream_of(ad.layout) == [ref.IMAGE] * 16  # 4 x 4 image tokens, nothing forced


def test_emu3_prompt_is_tokenized_as_baai_does(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(write_baai_converted_tokenizer(tmp_path / "tokenizer")))
    for (prompt, side), ids in ref.EMU3_PROMPTS.items():
        assert emu3.condition_ids(tok, prompt, side, side) == ids, repr(prompt)
    converted = tok("<|extra_203|>a cat 90<|image start|>90*90<|image token|>", add_special_tokens=False).input_ids
    assert converted != ref.EMU3_PROMPTS[("a cat 90", 90)]  # the converted split alone keeps "90" whole


def test_emu3_model_folder_at_720_px_and_its_grammar(tmp_path):
    model = load_model(write_emu3(tmp_path / "Emu3-Gen-tiny"), resolution=32)
    v = model.adapter.vocab
    text_ids = ref.EMU3_PROMPTS[("a cat 90", 90)][1:6]  # the text part: the same ranks in both tiny tokenizers
    big = model.resize(720).adapter
    bos = model.adapter.tokenizer.bos_token_id
    assert big.prompt_ids("a cat 90") == [bos] + text_ids + [v.boi, 57, 48, 42, 57, 48, v.wrapper]  # 9 0 * 9 0
    kinds = {"eol": v.eol, "eof": v.eof, "eoi": v.eoi}
    expected = [kinds.get(k, k) for k in ref.EMU3_STREAM_4x4]
    assert stream_of(model.adapter.layout) + ["eos"] == expected  # EOS follows the stream, not part of it


def test_llamagen_text_and_class_conditions(tmp_path):
    from spec_ar.loaders.t5 import T5TextEncoder

    enc = T5TextEncoder(write_t5(tmp_path / "flan-t5-tiny"))
    ids, mask = enc.tokenize(list(ref.LLAMAGEN_T5_IDS), ref.LLAMAGEN_T5_LENGTH)
    for row, m, expected in zip(ids.tolist(), mask.tolist(), ref.LLAMAGEN_T5_IDS.values()):
        assert row == expected + [0] * (ref.LLAMAGEN_T5_LENGTH - len(expected))
        assert m == [1] * len(expected) + [0] * (ref.LLAMAGEN_T5_LENGTH - len(expected))
    gpt = write_gpt(tmp_path / "c2i.pt", random_gpt(tiny_gpt_spec("c2i", classes=10)))
    model = load_model(gpt, vq=write_vq(tmp_path / "vq.pt"), resolution=64)
    ad = model.adapter
    h, _ = ad._condition_embeddings([3], guided=True)
    table = ad.gpt.cls_embedding.embedding_table.weight
    assert torch.equal(h[:, 0], table[[3, 10]])  # the unconditional row is the null class, number 10 of 10
    assert stream_of(ad.layout) == [ref.IMAGE] * 16
