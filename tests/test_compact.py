"""A compact vocabulary (``sampling/compact.py``): the engine decodes over the ids a stream can
hold, with the whole vocabulary's distribution, narrower rows, and the model's ids at every edge."""
import json

import pytest
import torch

from spec_ar.loaders import chameleon
from spec_ar.loaders.detect import load_model
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder
from spec_ar.sampling.adapter import TokenLayout
from spec_ar.sampling.compact import CompactVocabulary, compact, compact_ids

from .chameleon_files import write_chameleon
from .liquid_files import write_liquid
from .lumina2_files import write_lumina2


@pytest.fixture(scope="module")
def lumina2_folder(tmp_path_factory):
    return write_lumina2(tmp_path_factory.mktemp("lumina2") / "Lumina-mGPT-2.0")


@pytest.fixture(scope="module")
def lumina2(lumina2_folder):  # forced tokens (size, end of row, end of image) beside a range of codes
    return load_model(lumina2_folder, width=64, height=64)


@pytest.fixture(scope="module")
def liquid(tmp_path_factory):  # codes after the text ids, nothing forced
    return load_model(write_liquid(tmp_path_factory.mktemp("liquid") / "Liquid_V1_7B"))


@pytest.fixture(scope="module")
def lumina(tmp_path_factory):  # Chameleon: image ids scattered through the vocabulary, row ends forced
    return chameleon.load(write_chameleon(tmp_path_factory.mktemp("lumina") / "Lumina-mGPT-7B-768", "lumina"),
                          width=96, height=64)


def test_the_compact_vocabulary_holds_the_image_ids_then_the_forced_ones():
    lay = TokenLayout.raster(2, 3, 20, image_ids=torch.tensor([12, 5, 9]), forced={3: 17, 7: 2, 8: 17},
                             row_stride=4, length=9)
    ids, n_image = compact_ids(lay)
    assert ids.tolist() == [5, 9, 12, 2, 17] and n_image == 3


def test_a_model_whose_every_id_is_an_image_token_keeps_its_adapter(lumina):
    class Plain:
        layout = TokenLayout.raster(2, 2, 8)
        vocab_size = 8

    plain = Plain()
    assert compact(plain) is plain
    assert isinstance(compact(lumina.adapter), CompactVocabulary)


def _decoders(model, **settings):
    config = DecodeConfig(**settings)
    return (SpeculativeDecoder(model.adapter, config, vocabulary="compact"),
            SpeculativeDecoder(model.adapter, config, vocabulary="full"))


@pytest.mark.parametrize("family", ["lumina2", "liquid", "lumina"])
def test_the_verified_distribution_is_the_whole_vocabularys(family, request):
    model = request.getfixturevalue(family)
    small, full = _decoders(model, mode="sjd", window=6)
    stream = full.generate(["a red fox"], seeds=3).tokens
    keep = lambda p: p.clone()  # noqa: E731
    p_small = small.target_probabilities(["a red fox"], stream, reduce=keep)
    p_full = full.target_probabilities(["a red fox"], stream, reduce=keep)
    ids = small.adapter.ids
    assert p_small.shape[-1] == ids.numel() < p_full.shape[-1]
    torch.testing.assert_close(p_small, p_full[..., ids.to(p_full.device)], atol=1e-6, rtol=1e-5)
    assert float(p_full.sum(-1).min()) > 0.999
    # every id outside the compact vocabulary has no mass anywhere in the whole one
    outside = torch.ones(p_full.shape[-1], dtype=torch.bool)
    outside[ids.cpu()] = False
    assert float(p_full[..., outside].max()) == 0.0


@pytest.mark.parametrize("family", ["lumina2", "liquid", "lumina"])
@pytest.mark.parametrize("mode", ["ar", "sjd", "lantern"])
def test_greedy_decoding_gives_the_whole_vocabularys_tokens(family, mode, request):
    model = request.getfixturevalue(family)
    small, full = _decoders(model, mode=mode, temperature=0.0, **({} if mode == "ar" else {"window": 8}),
                           **({"lantern_k": 8} if mode == "lantern" else {}))
    a = small.generate(["a red fox", "a blue car"], seeds=5)
    b = full.generate(["a red fox", "a blue car"], seeds=5)
    assert torch.equal(a.tokens, b.tokens)
    assert [r.nfe for r in a.reports] == [r.nfe for r in b.reports]


def test_the_head_scores_the_image_ids_alone_where_they_are_one_range(liquid, lumina2, lumina):
    for model in (liquid, lumina2, lumina):
        wrapped = compact(model.adapter)
        assert wrapped.native and wrapped.output_width() == wrapped.n_image
    ad = liquid.adapter
    start = int(compact(ad).ids[0])
    assert not ad.output_ids(torch.tensor([start, start + 2]))  # not a range: the columns are gathered
    assert ad.head_rows is None


def test_gathered_and_native_columns_give_the_same_tokens(lumina2, monkeypatch):
    config = DecodeConfig(mode="sjd", window=6, temperature=0.0)
    native = SpeculativeDecoder(lumina2.adapter, config).generate(["a red fox"], seeds=1).tokens
    monkeypatch.setattr(type(lumina2.adapter), "output_ids", lambda self, ids: False)
    gathered = SpeculativeDecoder(lumina2.adapter, config)
    assert not gathered.adapter.native
    assert torch.equal(gathered.generate(["a red fox"], seeds=1).tokens, native)


def test_the_head_scores_every_id_again_after_a_decode(liquid):
    ad = liquid.adapter
    SpeculativeDecoder(ad, DecodeConfig(mode="sjd")).generate(["a red fox"], seeds=0)
    assert ad.head_rows is None
    assert ad.prefill(["a red fox"], None, True).shape[-1] == ad.vocab_size
    ad.release()


def test_step_events_and_results_carry_the_models_ids(lumina2):
    seen = []
    dec = SpeculativeDecoder(lumina2.adapter, DecodeConfig(mode="sjd"))
    res = dec.generate(["a red fox"], seeds=2, callback=lambda e: seen.append(e.tokens[:, :e.length].clone()))
    assert torch.equal(seen[-1], res.tokens)
    lay = lumina2.adapter.layout
    image = res.tokens[:, lay.image_positions()]
    assert bool(lay.image_tokens[image].all())
    forced = lay.forced >= 0
    assert torch.equal(res.tokens[0, forced], lay.forced[forced])


def test_scoring_refuses_an_id_no_stream_holds(lumina2):
    dec = SpeculativeDecoder(lumina2.adapter, DecodeConfig(mode="ar"))
    stream = dec.generate(["a red fox"], seeds=0).tokens
    text_id = int(torch.nonzero(~lumina2.adapter.layout.image_tokens)[0])
    stream[0, int(lumina2.adapter.layout.image_positions()[0])] = text_id
    with pytest.raises(ValueError, match=f"token id {text_id} is neither an image token nor a forced one"):
        dec.target_log_likelihood(["a red fox"], stream)


def test_a_compact_vocabulary_needs_less_decoding_state(liquid):
    small, full = _decoders(liquid, mode="sjd", window=16)
    a = small.memory_per_image(["a red fox"])["decoding state"]
    b = full.memory_per_image(["a red fox"])["decoding state"]
    V, n = liquid.adapter.vocab_size, small.adapter.vocab_size
    assert a < b * 1.2 * n / V + 1e5  # the rows shrink with the vocabulary (the model's logits too: native)


def test_the_bench_times_both_vocabularies_on_one_model(lumina2_folder, lumina2, tmp_path, capsys):
    from spec_ar.bench import compact_vocab

    out = tmp_path / "rows.json"
    compact_vocab.main([str(lumina2_folder), "--width", "64", "--height", "64", "--modes", "ar", "sjd",
                        "--repeats", "1", "--out", str(out)])
    rows = json.loads(out.read_text())
    assert [(r["mode"], r["batch"]) for r in rows] == [("ar", 1), ("sjd", 1)]
    for r in rows:
        assert r["ms_full"] > 0 and r["ms_compact"] > 0
        assert r["vocab_compact"] < r["vocab_full"] == lumina2.adapter.vocab_size
        assert r["state_mb_compact"] < r["state_mb_full"]
        assert 0.0 <= r["same_tokens"] <= 1.0
    assert "ms/img full" in capsys.readouterr().out


def same_drafted_decodes(model, source, seen=lambda vocabulary, decoder: None):
    """Greedy decodes over both vocabularies with one draft source, both decoders built before either
    decodes (the source serves both): the same tokens and forward counts."""
    tokens = {}
    decoders = {v: SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd", depth=3, temperature=0.0),
                                      drafter=source, vocabulary=v) for v in ("compact", "full")}
    for vocabulary, dec in decoders.items():
        assert isinstance(dec.adapter, CompactVocabulary) == (vocabulary == "compact")
        result = dec.generate(["a fox", "a red panda eating bamboo"], seeds=[2, 3])
        assert all(r.drafter == source.name for r in result.reports)
        seen(vocabulary, dec)
        tokens[vocabulary] = (result.tokens, [r.nfe for r in result.reports])
    assert torch.equal(tokens["compact"][0], tokens["full"][0]) and tokens["compact"][1] == tokens["full"][1]
    return tokens["full"][1]


def test_a_draft_head_drafts_over_the_compact_vocabulary_with_the_whole_ones_tokens(tmp_path):
    """LANTERN's Anole drafter reads the target's hidden states and feeds the model's ids to its own embedding."""
    from spec_ar.loaders.detect import load_drafter

    from .checkpoints import write_lantern_anole_head

    model = load_model(write_chameleon(tmp_path / "Anole-7b-hf", "anole", seed=1))
    folder = write_lantern_anole_head(tmp_path / "anole_drafter", hidden=32, heads=4, kv_heads=2,
                                      vocab=model.adapter.vocab_size)
    same_drafted_decodes(model, load_drafter(folder, model))


def test_a_draft_model_drafts_over_the_compact_vocabulary_with_the_whole_ones_tokens(lumina2, tmp_path):
    """A sibling runs behind the target's compact vocabulary: narrower rows, the same greedy tokens
    and forward counts as over the whole vocabulary."""
    from spec_ar.loaders.detect import load_drafter

    sibling = load_drafter(write_lumina2(tmp_path / "Lumina-mGPT-2.0-sibling", seed=2), lumina2)

    def seen(vocabulary, decoder):  # the sibling ran behind the decoder's vocabulary
        assert isinstance(sibling.running, CompactVocabulary) == (vocabulary == "compact")
        assert sibling.running.vocab_size == decoder.adapter.vocab_size

    forwards = same_drafted_decodes(lumina2, sibling, seen)
    assert forwards[0] < lumina2.adapter.layout.length  # the drafts stood somewhere
