"""Draft trees from a draft head, verified in one forward: exact acceptance stays
lossless on dynamic, static and sampled trees (batch 1 and more), the relaxed rules are
still caught by the same test, and a tree's image does not depend on its batch."""
from __future__ import annotations

import json

import pytest
import torch

from spec_ar.sampling import ConfigError, DecodeConfig, HeadDrafts, SpeculativeDecoder
from spec_ar.sampling.tree import static_shape

from .fakes import FeaturedTabularAdapter
from .test_exactness import CFG, TOP_K, stream_test
from .test_head_drafts import tabular_head

TREES = {"dynamic": dict(tree="dynamic", depth=3, tree_top_k=3, tree_tokens=8),
         "static": dict(tree="static", depth=3, tree_top_k=3, tree_tokens=7),
         "sampled": dict(tree="sampled", depth=3, tree_top_k=3, tree_tokens=7)}


def decoder(target, head, **config):
    return SpeculativeDecoder(target, DecodeConfig(**{"cfg_scale": CFG, "top_k": TOP_K, **config}),
                              drafter=HeadDrafts(head, "test head"))


@pytest.mark.parametrize("tree", list(TREES))
def test_exact_acceptance_on_draft_trees_follows_the_exact_joint(tree):
    target = FeaturedTabularAdapter(seed=3)
    result = decoder(target, tabular_head(1), mode="sjd", **TREES[tree]).generate([1] * 20_000, seeds=11_000_000)
    pvalue, impossible = stream_test(target, result.tokens, cls=1)
    assert impossible == 0 and pvalue > 1e-4
    origins = {k: sum(r.origin_counts()[k] for r in result.reports)
               for k in ("accepted draft", "resampled after a rejection")}
    assert origins["accepted draft"] > 0 and origins["resampled after a rejection"] > 0
    assert any(call[0] == "tree" for call in target.calls)


@pytest.mark.parametrize("tree", list(TREES))
def test_a_batch_of_one_on_a_draft_tree_follows_the_exact_joint(tree):
    target = FeaturedTabularAdapter(image=3, length=3, forced=(1,), seed=5)
    head = tabular_head(2, vocab=4)  # three image ids and the forced one
    dec = SpeculativeDecoder(target, DecodeConfig(mode="sjd", cfg_scale=CFG, top_k=2, **TREES[tree]),
                             drafter=HeadDrafts(head))
    tokens = torch.cat([dec.generate([0], seeds=[s]).tokens for s in range(500)])
    pvalue, impossible = stream_test(target, tokens, cls=0, top_k=2)
    assert impossible == 0 and pvalue > 1e-4


@pytest.mark.parametrize("tree", list(TREES))
def test_a_head_drafting_trees_drafts_no_chains(tree, monkeypatch):
    """Trees are drafted from the committed prefix at every step: a chain drafted ahead
    (after the prefill, as for chains) would be head steps whose drafts nothing reads."""
    chains = []
    real = HeadDrafts.extend
    monkeypatch.setattr(HeadDrafts, "extend", lambda self, *a: chains.append(1) or real(self, *a))
    target = FeaturedTabularAdapter(seed=3)
    result = decoder(target, tabular_head(1), mode="sjd", **TREES[tree]).generate([1] * 4, seeds=0)
    assert result.tokens.shape[0] == 4 and not chains
    decoder(target, tabular_head(1), mode="sjd", depth=3).generate([1] * 4, seeds=0)
    assert chains  # the spy sees a chain's drafting


def test_the_sibling_by_sibling_walk_is_exact_too(monkeypatch):
    # the exact walk draws once per level and follows the matching child; the relaxed
    # rules test siblings one by one on residuals: with the exact rule both must be lossless
    target = FeaturedTabularAdapter(seed=3)
    dec = decoder(target, tabular_head(1), mode="sjd", **TREES["dynamic"])
    dec.exact = False
    pvalue, impossible = stream_test(target, dec.generate([1] * 20_000, seeds=12_000_000).tokens, cls=1)
    assert impossible == 0 and pvalue > 1e-4


@pytest.mark.parametrize("tree", ["dynamic", "sampled"])
@pytest.mark.parametrize("config", [dict(mode="lantern", lantern_k=3, lantern_delta=1.0),
                                    dict(mode="gsd", group_size=4, gsd_delta=1.0)])
def test_the_check_still_rejects_relaxed_rules_on_draft_trees(config, tree):
    target = FeaturedTabularAdapter(seed=3, spread=4.0)
    result = decoder(target, tabular_head(1), **config, **TREES[tree]).generate([1] * 20_000, seeds=13_000_000)
    pvalue, impossible = stream_test(target, result.tokens, cls=1)
    assert impossible > 0 or pvalue < 1e-6


def test_a_sampled_tree_draws_each_nodes_children_from_its_q_without_replacement():
    # siblings are distinct tokens with mass under the row they came from, and the
    # first draw of the root follows the root's q (its ranked pick would not: with the
    # argmax in its place the statistic below is 285 on 4 degrees of freedom, here 2.4; a
    # temperature flattens the random head's q, which is otherwise nearly one-hot)
    target = FeaturedTabularAdapter(seed=3)
    source = HeadDrafts(tabular_head(1), "test head")
    dec = SpeculativeDecoder(target, DecodeConfig(mode="sjd", cfg_scale=CFG, top_k=None, temperature=4.0,
                                                  **TREES["sampled"]), drafter=source)
    trees, draw = [], source.tree
    source.tree = lambda st, config: trees.append(draw(st, config)) or trees[-1]
    dec.generate([1] * 3000, seeds=14_000_000)
    observed, expected = 0, 0
    for tokens, parents, valid, rows in trees:
        assert rows is not None
        q_of = rows.gather(1, (parents + 1).unsqueeze(-1).expand(-1, -1, rows.shape[-1]))  # each node's row
        assert bool((q_of.gather(2, tokens.unsqueeze(-1)).squeeze(-1)[valid] > 0).all())
        same_parent = parents.unsqueeze(2) == parents.unsqueeze(1)
        same_token = tokens.unsqueeze(2) == tokens.unsqueeze(1)
        pairs = same_parent & same_token & valid.unsqueeze(2) & valid.unsqueeze(1)
        assert not bool((pairs & ~torch.eye(tokens.shape[1], dtype=torch.bool)).any()), "a token drawn twice"
        first = valid[:, 0]
        observed = observed + torch.nn.functional.one_hot(tokens[first, 0], rows.shape[-1]).sum(0)
        expected = expected + rows[first, 0].sum(0)
    cells = expected > 5
    chi2 = float(((observed - expected)[cells] ** 2 / expected[cells]).sum())
    df = int(cells.sum()) - 1
    assert df >= 1 and float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(chi2 / 2))) > 1e-4


@pytest.mark.parametrize("tree", list(TREES))
def test_an_image_does_not_depend_on_its_batch_with_a_draft_tree(tree):
    target = FeaturedTabularAdapter(seed=3)
    dec = decoder(target, tabular_head(2), mode="sjd", **TREES[tree])
    seeds = list(range(20))
    batch = dec.generate([1] * len(seeds), seeds=seeds)
    for b, seed in enumerate(seeds):
        assert torch.equal(dec.generate([1], seeds=[seed]).tokens[0], batch.tokens[b]), f"sample {b}"


def test_static_tree_shapes(tmp_path):
    auto = static_shape(None, 6, 3, 2)
    assert auto["depths"] == sorted(auto["depths"]) and len(auto["parents"]) == 6
    assert all(p < i for i, p in enumerate(auto["parents"]))  # parents come first
    f = tmp_path / "tree.json"
    f.write_text(json.dumps([[0], [1], [0, 0], [0, 1], [1, 0]]))
    assert static_shape(str(f), 99, 9, 9) == {"parents": [-1, -1, 0, 0, 1], "ranks": [0, 1, 0, 1, 0],
                                              "depths": [0, 0, 1, 1, 1]}
    f.write_text(json.dumps([[0], [0, 0, 1]]))
    with pytest.raises(ConfigError, match=r"path \[0, 0, 1\] is listed without its parent \[0, 0\]"):
        static_shape(str(f), 99, 9, 9)
    with pytest.raises(ConfigError, match="tree_choices"):
        decoder(FeaturedTabularAdapter(seed=3), tabular_head(), mode="sjd", tree="static", tree_top_k=3,
                tree_choices=str(tmp_path / "missing.json"))


@pytest.mark.parametrize("schedule", ["uniform", "similarity"])
def test_vvs_skipping_on_draft_trees_commits_tree_paths_and_post_verifies_them(schedule, tmp_path):
    # VVS on a drafter's tree: skipped steps commit a path of the tree unverified, the
    # next forward prepends those tokens (and they stand); the image still does not
    # depend on its batch (a batch skips together: the samples here skip alike)
    from spec_ar.loaders import llamagen
    from spec_ar.loaders.detect import load_drafter

    from .checkpoints import random_gpt, tiny_gpt_spec, write_gpt, write_lantern_head, write_t5, write_vq

    gpt = write_gpt(tmp_path / "t2i.pt", random_gpt(tiny_gpt_spec("t2i", cond_tokens=120), seed=1))
    model = llamagen.load(gpt, write_vq(tmp_path / "vq.pt"), write_t5(tmp_path / "t5"), resolution=256)
    source = load_drafter(write_lantern_head(tmp_path / "head", hidden=128, heads=2, vocab=1024), model)
    extra = dict(skip_interval=2) if schedule == "uniform" else dict(skip_threshold=-1.0)  # always similar enough
    config = DecodeConfig(mode="lantern", lantern_k=50, schedule=schedule, tree="dynamic", depth=3, tree_top_k=8,
                          tree_tokens=24, **extra)
    dec = SpeculativeDecoder(model.adapter, config, drafter=source)
    result = dec.generate(["a cat", "a dog on a hill"], seeds=[4, 5])
    for r in result.reports:
        skipped = r.origin_counts()["committed without verification (VVS skip)"]
        assert r.tokens == 256 and skipped > 0 and r.nfe < 256
    # each skip alternates with a verified step, and the skipped tokens were verified after
    assert torch.equal(dec.generate(["a cat", "a dog on a hill"], seeds=[4, 5]).tokens, result.tokens)


def test_a_head_that_proposes_every_token_has_every_tree_level_accepted():
    # a tree holding every token at every level: whatever the target draws, a child
    # matches, so each forward commits the tree's depth and the bonus
    target = FeaturedTabularAdapter(seed=3)
    dec = decoder(target, tabular_head(4), mode="sjd", top_k=None, tree="dynamic", depth=3, tree_top_k=4,
                  tree_tokens=200)
    for r in dec.generate([1] * 16, seeds=3).reports:
        assert r.origin_counts()["resampled after a rejection"] == 0 and r.nfe == 2


@pytest.mark.parametrize("tree", list(TREES))
def test_draft_trees_on_a_llamagen_target_with_lanterns_drafter(tree, tmp_path):
    from spec_ar.loaders import llamagen
    from spec_ar.loaders.detect import load_drafter

    from .checkpoints import random_gpt, tiny_gpt_spec, write_gpt, write_lantern_head, write_t5, write_vq

    gpt = write_gpt(tmp_path / "t2i.pt", random_gpt(tiny_gpt_spec("t2i", cond_tokens=120), seed=1))
    model = llamagen.load(gpt, write_vq(tmp_path / "vq.pt"), write_t5(tmp_path / "t5"), resolution=256)
    source = load_drafter(write_lantern_head(tmp_path / "head", hidden=128, heads=2, vocab=1024), model)
    config = DecodeConfig(mode="sjd", tree=tree, depth=3, tree_top_k=48, tree_tokens=64)  # random head: a wide root
    dec = SpeculativeDecoder(model.adapter, config, drafter=source)
    result = dec.generate(["a cat", "a dog on a hill"], seeds=[4, 5])
    assert result.tokens.shape == (2, 256)
    assert all(r.origin_counts()["accepted draft"] > 0 and r.nfe < 256 for r in result.reports)
    assert torch.equal(dec.generate(["a dog on a hill"], seeds=[5]).tokens[0], result.tokens[1])


@pytest.mark.parametrize("mode", [dict(mode="vvs", lantern_k=3), dict(mode="sjd", schedule="similarity")])
def test_skipping_schedules_refuse_sampled_trees(mode):
    with pytest.raises(ConfigError, match="schedule .* commits tree paths unverified.*'dynamic' or 'static'"):
        decoder(FeaturedTabularAdapter(seed=3), tabular_head(1), **mode, **TREES["sampled"])
