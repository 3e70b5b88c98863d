"""Drafts from a draft head (EAGLE-style, LANTERN's drafters): exact acceptance
stays lossless on them, an image does not depend on its batch, LANTERN's released
format loads and drafts for a LlamaGen text-to-image target, and a head that does
not fit is refused before any decoding."""
from __future__ import annotations

import pytest
import torch

from spec_ar.formats.checkpoints import CheckpointError
from spec_ar.loaders import draft_head, llamagen
from spec_ar.loaders.detect import load_drafter
from spec_ar.sampling import ConfigError, DecodeConfig, HeadDrafts, SpeculativeDecoder

from .checkpoints import random_gpt, tiny_gpt_spec, write_gpt, write_lantern_head, write_t5, write_vq
from .fakes import FeaturedTabularAdapter, TabularAdapter
from .test_exactness import CFG, TOP_K, stream_test


def tabular_head(seed=0, width=8, vocab=5):
    """A real draft head (random weights, 1D positions) for the tabular target's ids."""
    torch.manual_seed(seed)
    head = draft_head.DraftHead(draft_head.HeadSpec(hidden=width, heads=2, kv_heads=2, intermediate=16, layers=1,
                                                    vocab=vocab))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.5)
    return head.eval()


def decoder(target, head, **config):
    return SpeculativeDecoder(target, DecodeConfig(**{"cfg_scale": CFG, "top_k": TOP_K, **config}),
                              drafter=HeadDrafts(head, "test head"))


@pytest.mark.parametrize("depth", [1, 3, 8])
def test_exact_acceptance_on_draft_head_drafts_follows_the_exact_joint(depth):
    target = FeaturedTabularAdapter(seed=3)
    result = decoder(target, tabular_head(1), mode="sjd", depth=depth).generate([1] * 30_000, seeds=9_000_000)
    pvalue, impossible = stream_test(target, result.tokens, cls=1)
    assert impossible == 0 and pvalue > 1e-4
    origins = {k: sum(r.origin_counts()[k] for r in result.reports)
               for k in ("accepted draft", "resampled after a rejection")}
    assert origins["accepted draft"] > 0 and origins["resampled after a rejection"] > 0  # both paths ran


@pytest.mark.parametrize("depth", [1, 3, 8])
def test_a_batch_of_one_on_draft_head_drafts_follows_the_exact_joint(depth):
    # three free positions: depth 3 drafts all of them, depth 8 runs past the end
    target = FeaturedTabularAdapter(image=3, length=4, forced=(1,), seed=5)
    dec = SpeculativeDecoder(target, DecodeConfig(mode="sjd", cfg_scale=CFG, top_k=2, depth=depth),
                             drafter=HeadDrafts(tabular_head(2, vocab=4)))
    tokens = torch.cat([dec.generate([0], seeds=[s]).tokens for s in range(600)])  # 8 streams: 75 each on average
    pvalue, impossible = stream_test(target, tokens, cls=0, top_k=2)
    assert impossible == 0 and pvalue > 1e-4


def test_the_check_rejects_lantern_with_a_large_delta_on_draft_head_drafts():
    target = FeaturedTabularAdapter(seed=3, spread=4.0)
    result = decoder(target, tabular_head(1), mode="lantern", depth=3, lantern_k=3, lantern_delta=1.0).generate(
        [1] * 30_000, seeds=10_000_000)
    pvalue, impossible = stream_test(target, result.tokens, cls=1)
    assert impossible > 0 or pvalue < 1e-6


@pytest.mark.parametrize("depth", [1, 2])
def test_an_image_does_not_depend_on_its_batch_with_a_draft_head(depth):
    # samples advance by different amounts, so the head's catch-up is padded per batch
    # and the padding must leave its cache
    target = FeaturedTabularAdapter(seed=3)
    dec = decoder(target, tabular_head(2), mode="sjd", depth=depth)
    seeds = list(range(24))
    batch = dec.generate([1] * len(seeds), seeds=seeds)
    for b, seed in enumerate(seeds):
        assert torch.equal(dec.generate([1], seeds=[seed]).tokens[0], batch.tokens[b]), f"sample {b}"


def test_a_head_that_reads_the_target_exactly_has_every_draft_accepted():
    # a head whose output is its input feature (zero layers, fc passing the feature
    # through) proposes from the target's own last row: on a target whose rows do not
    # depend on the prefix, that is the target's distribution, so no draft falls
    class Constant(FeaturedTabularAdapter):
        def _logits(self, target):
            return super()._logits(torch.zeros_like(target))

    target = Constant(seed=3)
    head = draft_head.DraftHead(draft_head.HeadSpec(hidden=8, heads=2, kv_heads=2, intermediate=16, layers=0,
                                                    vocab=5))
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.bias.zero_()
        head.fc.weight[:, 8:] = torch.eye(8)
    result = decoder(target, head.eval(), mode="sjd", depth=3).generate([1] * 64, seeds=1)
    for r in result.reports:
        assert r.origin_counts()["resampled after a rejection"] == 0 and r.nfe == 2


def test_a_target_without_hidden_states_is_refused():
    with pytest.raises(ConfigError, match="needs the target's hidden states"):
        decoder(TabularAdapter(seed=3), tabular_head(), mode="sjd")


# -- LANTERN's released format on a LlamaGen text-to-image target ------------------------------
@pytest.fixture(scope="module")
def t2i(tmp_path_factory):
    d = tmp_path_factory.mktemp("lantern")
    spec = tiny_gpt_spec("t2i", cond_tokens=120)  # LlamaGen t2i: 120 caption positions
    return {"gpt": write_gpt(d / "t2i_tiny.pt", random_gpt(spec, seed=1)), "vq": write_vq(d / "vq.pt"),
            "t5": write_t5(d / "t5"), "dir": d}


def test_lanterns_released_drafter_format_loads_and_drafts_for_a_llamagen_t2i_target(t2i):
    model = llamagen.load(t2i["gpt"], t2i["vq"], t2i["t5"], resolution=256)  # 16 x 16 tokens, as input_type t2i
    folder = write_lantern_head(t2i["dir"] / "llamagen_drafter", hidden=128, heads=2, vocab=1024)
    source = load_drafter(folder, model)
    assert isinstance(source, HeadDrafts) and source.head.spec.condition_inputs == 119
    assert source.head.spec.grid == 16 and not hasattr(source.head.layers[0], "input_layernorm")
    dec = SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd", depth=3), drafter=source)
    result = dec.generate(["a cat", "a dog on a hill"], seeds=[4, 5])
    assert result.tokens.shape == (2, 256)
    for r in result.reports:
        assert r.drafter == source.name and r.drafter_time_s > 0 and r.nfe < 256
        assert r.origin_counts()["accepted draft"] > 0
    alone = dec.generate(["a dog on a hill"], seeds=[5])
    assert torch.equal(alone.tokens[0], result.tokens[1])  # the second image does not depend on the first


def test_skipped_verifications_on_draft_head_drafts(t2i):
    # a skip commits drafts the target has not scored: the head chains through them with
    # its own features, then catches up on the target's once they arrive
    model = llamagen.load(t2i["gpt"], t2i["vq"], t2i["t5"], resolution=256)
    source = load_drafter(write_lantern_head(t2i["dir"] / "skipping", hidden=128, heads=2, vocab=1024), model)
    dec = SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd", schedule="uniform", skip_interval=2, depth=3),
                             drafter=source)
    result = dec.generate(["a cat", "a dog on a hill", "a red house"], seeds=[4, 5, 6])
    assert all(r.origin_counts()["committed without verification (VVS skip)"] > 0 for r in result.reports)
    for b, (prompt, seed) in enumerate([("a cat", 4), ("a red house", 6)]):
        alone = dec.generate([prompt], seeds=[seed]).tokens[0]
        assert torch.equal(alone, result.tokens[2 * b]), prompt


@pytest.mark.parametrize("change, message", [
    (dict(hidden=64, heads=1), "width 64, the target's hidden states have 128"),
    (dict(input_type="c2i"), "a 24x24 position grid, the target draws 16x16 tokens"),
    (dict(vocab=512), "512 token embeddings, the target's vocabulary has 1024 ids"),
])
def test_a_drafter_that_does_not_fit_its_target_is_refused_naming_it(t2i, change, message):
    model = llamagen.load(t2i["gpt"], t2i["vq"], t2i["t5"], resolution=256)
    fields = dict(hidden=128, heads=2, vocab=1024, input_type="t2i") | change
    folder = write_lantern_head(t2i["dir"] / f"bad_{len(message)}", **fields)
    with pytest.raises(ConfigError) as err:
        load_drafter(folder, model)
    assert f"--drafter {folder}: the" in str(err.value) and message in str(err.value)


def test_a_drafter_pickle_that_would_run_code_is_refused(t2i):
    folder = write_lantern_head(t2i["dir"] / "evil", hidden=128, heads=2, vocab=1024)
    torch.save({"fc.weight": torch.zeros(2), "extra": Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="refused"):
        draft_head.load_head(folder)


class Payload:
    """Any class outside the weights-only allowlist."""


# -- LANTERN's Anole drafter ----------------------------------------------------------------
def test_lanterns_anole_drafter_format_loads_and_drafts_for_anole(tmp_path):
    from spec_ar.loaders.detect import load_model

    from .chameleon_files import write_chameleon
    from .checkpoints import write_lantern_anole_head

    model = load_model(write_chameleon(tmp_path / "Anole-7b-hf", "anole", seed=1))
    ad = model.adapter
    folder = write_lantern_anole_head(tmp_path / "anole_drafter", hidden=32, heads=4, kv_heads=2, vocab=ad.vocab_size)
    assert draft_head.is_draft_head(folder) and not draft_head.is_draft_head(tmp_path / "Anole-7b-hf")
    source = load_drafter(folder, model)
    spec = source.head.spec
    assert spec.prompt_inputs and spec.qk_norm and spec.first_norm and spec.grid is None
    dec = SpeculativeDecoder(ad, DecodeConfig(mode="sjd", depth=3), drafter=source)
    result = dec.generate(["a fox", "a red panda eating bamboo"], seeds=[2, 3])
    assert all(r.drafter == source.name and r.nfe < r.tokens for r in result.reports)
    # prompts of other lengths are left-padded: the padding is masked and skipped in the head's positions
    alone = dec.generate(["a fox"], seeds=[2])
    assert torch.equal(alone.tokens[0], result.tokens[0])


def test_chameleons_half_split_rotary_reordered_gives_the_same_attention_scores():
    # Chameleon rotates (x_i, x_{i+d/2}); the head rotates neighbours after its q/k rows
    # (and per-head norms) are reordered at load: every q.k score must be the same
    spec = draft_head.HeadSpec(hidden=16, heads=2, kv_heads=2, intermediate=8, layers=1, vocab=4, qk_norm=True)
    d = spec.head_dim
    torch.manual_seed(0)
    wq, wk = torch.randn(16, 16), torch.randn(16, 16)
    x, pos = torch.randn(5, 16), torch.arange(5).double()
    freqs = 1.0 / 10000 ** (torch.arange(d // 2, dtype=torch.float64) * 2 / d)
    ang = torch.outer(pos, freqs)
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1).float(), torch.cat([ang.sin(), ang.sin()], -1).float()

    def half(t):  # transformers' rotate_half form, per head
        t = t.view(5, 2, d)
        rot = torch.cat([-t[..., d // 2:], t[..., : d // 2]], -1)
        return t * cos[:, None] + rot * sin[:, None]

    expected = torch.einsum("ihd,jhd->hij", half(x @ wq.T), half(x @ wk.T))
    sd = draft_head._interleave_rotary({"layers.0.self_attn.q_proj.weight": wq, "layers.0.self_attn.k_proj.weight": wk},
                                       spec)
    rope = torch.stack([ang.cos(), ang.sin()], -1).float().unsqueeze(0)
    q = llamagen.apply_rope((x @ sd["layers.0.self_attn.q_proj.weight"].T).view(1, 5, 2, d), rope)[0]
    k = llamagen.apply_rope((x @ sd["layers.0.self_attn.k_proj.weight"].T).view(1, 5, 2, d), rope)[0]
    torch.testing.assert_close(torch.einsum("ihd,jhd->hij", q, k), expected, rtol=1e-4, atol=1e-4)


def test_unrolled_training_passes_equal_the_chains_drafting_runs():
    # pass k at position s must be what the k-th draft of a chain computes when the true
    # inputs end at s - k + 1: the training sees exactly the drafting's inputs and context
    head = draft_head.DraftHead(draft_head.HeadSpec(hidden=16, heads=2, kv_heads=2, intermediate=32, layers=2,
                                                    vocab=7))
    torch.manual_seed(1)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
    T = 9
    tokens, feats = torch.randint(0, 7, (1, T)), torch.randn(1, T, 16)
    rope = head.rope_table(T)
    passes = head.unrolled(tokens, feats, rope[:T].unsqueeze(0), 3)
    for last_true in (0, 3, 5):  # true inputs 0..last_true, then chained ones
        cache = head.new_cache(1, T)
        g = head.step(tokens[:, : last_true + 1], feats[:, : last_true + 1], cache)[:, -1:]
        torch.testing.assert_close(g[0, 0], passes[0][0, last_true])
        for k in (2, 3):
            s = last_true + k - 1
            g = head.step(tokens[:, s: s + 1], g, cache)
            torch.testing.assert_close(g[0, 0], passes[k - 1][0, s], rtol=1e-4, atol=1e-5)
