"""Draft trees scored in one forward: every root-to-leaf path's logits are the chain's,
for each family, and so they stay after the cache keeps one path and rolls back."""
from __future__ import annotations

import pytest
import torch

from spec_ar.loaders import llamagen
from spec_ar.sampling.tree import ancestors, chain, depths

from .checkpoints import random_gpt, tiny_gpt_spec

# two samples, seven nodes: sample 0 a bushy tree, sample 1 a chain with a side branch
PARENTS = torch.tensor([[-1, -1, 0, 0, 1, 2, 2],
                        [-1, 0, 1, 2, 1, 4, 5]])


def paths(parents: torch.Tensor, b: int) -> list[list[int]]:
    """Every root-to-leaf path of sample ``b``, as node indices."""
    par = parents[b].tolist()
    leaves = [i for i in range(len(par)) if i not in par]
    out = []
    for leaf in leaves:
        path, node = [], leaf
        while node >= 0:
            path.append(node)
            node = par[node]
        out.append(path[::-1])
    return out


def image_tokens(adapter, shape) -> torch.Tensor:
    ids = adapter.layout.image_tokens.nonzero().flatten()
    return ids[torch.randint(0, len(ids), shape)]


def test_ancestors_and_depths_of_a_tree():
    a = ancestors(PARENTS)
    assert a[0, 5].nonzero().flatten().tolist() == [0, 2, 5] and a[1, 6].nonzero().flatten().tolist() == [0, 1, 4, 5, 6]
    assert depths(PARENTS).tolist() == [[0, 0, 1, 1, 1, 2, 2], [0, 1, 2, 3, 2, 3, 4]]
    assert depths(chain(1, 4)).tolist() == [[0, 1, 2, 3]]


#: each family's conditions (two samples)
CONDITIONS = {"llamagen": [2, 7], "janus": ["a cat", "a red house on a hill"],
              "chameleon": ["a fox", "a red panda eating bamboo"], "emu3": ["a dog", "two cats on a sofa"]}


@pytest.fixture(scope="module")
def makers(tmp_path_factory):
    """Each family's adapter, as a function (each test starts from its own prefill); built when the
    module's tests run, not when the suite is collected."""
    from spec_ar.loaders import chameleon, emu3, janus

    from .chameleon_files import write_chameleon
    from .checkpoints import tiny_janus, write_janus
    from .emu3_files import write_emu3

    torch.manual_seed(0)
    gpt = random_gpt(tiny_gpt_spec("c2i"), seed=3)
    d = tmp_path_factory.mktemp("trees")
    model, tok = tiny_janus(seed=1)
    jan = janus.load(write_janus(d / "janus", model, tok))
    cham = chameleon.load(write_chameleon(d / "anole", "anole", seed=1))
    emu = emu3.load(write_emu3(d / "emu3"), resolution=64)
    return {"llamagen": lambda: llamagen.LlamaGenAdapter(gpt, 4), "janus": lambda: jan.adapter,
            "chameleon": lambda: cham.adapter, "emu3": lambda: emu.adapter}


@pytest.mark.parametrize("family", list(CONDITIONS))
def test_tree_logits_equal_chain_logits_on_every_path(makers, family):
    make, conditions = makers[family], CONDITIONS[family]
    B = len(conditions)
    ad = make()
    tokens, prefix = image_tokens(ad, PARENTS.shape), image_tokens(ad, (B, 3))
    ad.prefill(conditions, None, True)
    ad.forward(prefix)
    tree = ad.forward_tree(tokens, PARENTS)  # [K, B, N, V]
    for b in range(B):
        for path in paths(PARENTS, b):
            ref = make()
            ref.prefill(conditions, None, True)
            ref.forward(prefix)
            seq = torch.stack([tokens[:, i] for i in path], 1)  # the other sample rides along
            expect = ref.forward(seq)[:, b]
            torch.testing.assert_close(tree[:, b, path], expect, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", list(CONDITIONS))
def test_after_keeping_a_path_and_rolling_back_the_cache_is_the_chains(makers, family):
    make, conditions = makers[family], CONDITIONS[family]
    B = len(conditions)
    ad = make()
    tokens, prefix, more = image_tokens(ad, PARENTS.shape), image_tokens(ad, (B, 3)), image_tokens(ad, (B, 2))
    keep = [paths(PARENTS, 0)[1], paths(PARENTS, 1)[0][:3]]  # a leaf of sample 0, part of sample 1's chain
    ad.prefill(conditions, None, True)
    ad.forward(prefix)
    ad.forward_tree(tokens, PARENTS)
    width = max(map(len, keep))
    nodes = torch.tensor([k + [0] * (width - len(k)) for k in keep])
    ad.keep_tree(nodes, [len(k) for k in keep])
    ad.rollback([1, 0])  # the last kept node of sample 0 leaves again
    after = ad.forward(more)
    for b in range(B):
        ref = make()
        ref.prefill(conditions, None, True)
        kept = keep[b][:-1] if b == 0 else keep[b]
        ref.forward(prefix[b:b + 1].repeat(B, 1))
        seq = torch.tensor([[int(tokens[b, i]) for i in kept] + more[b].tolist()]).repeat(B, 1)
        expect = ref.forward(seq)[:, b, -2:]
        torch.testing.assert_close(after[:, b], expect, rtol=1e-4, atol=1e-4)
