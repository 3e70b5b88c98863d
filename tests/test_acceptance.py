"""Each acceptance rule equals its paper's definition, written as a plain loop."""
from __future__ import annotations

import pytest
import torch

from spec_ar.sampling.acceptance import (DraftDistributions, ExactAcceptance, GroupedAcceptance,
                                         LatentRelaxedAcceptance)
from spec_ar.sampling.neighbours import TokenGeometry


def rows(B=3, N=4, V=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(B, N, V, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(B, N, V, generator=g) * 2, -1)
    x = torch.multinomial(q.view(-1, V), 1, generator=g).view(B, N)
    ring = q.clone()  # slots 0..N-1 hold each row's q
    return p, q, x, DraftDistributions(ring, torch.arange(N).repeat(B, 1))


def test_exact_rule():
    p, q, x, qd = rows()
    got = ExactAcceptance().accept_prob(p, qd, x)
    want = (p.gather(-1, x[..., None]) / q.gather(-1, x[..., None])).squeeze(-1).clamp(max=1)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(ExactAcceptance().residual(p[:, 0], q[:, 0], x[:, 0]), (p[:, 0] - q[:, 0]).clamp(min=0))


def test_every_rule_reads_q_from_the_engines_copy_of_its_rows_as_from_the_ring():
    """Coupled drafting copies the window's q rows before the rule (its residual pass needs them): the rules
    read q there, the same numbers as from the ring, until the copy is released to be overwritten."""
    p, q, x, qd = rows(B=1, N=6, seed=7)
    geo = TokenGeometry(torch.arange(40), torch.randn(40, 4, generator=torch.Generator().manual_seed(2)), 40,
                        torch.device("cpu"))
    for rule in (ExactAcceptance(), GroupedAcceptance(10, 0.2), LatentRelaxedAcceptance(12, 0.2, geo)):
        copy = torch.cat([q, torch.rand(1, 2, 40)], 1)  # (a copy may hold more rows than the drafts judged)
        copied = DraftDistributions(qd.ring, qd.slots, copy=copy.clone())
        for got, want in zip(rule.ratios(p, copied, x), rule.ratios(p, qd, x)):
            assert torch.equal(got, want)
        c = torch.randint(0, 40, (1, 6, 3))
        assert torch.equal(copied.at(c), qd.at(c)) and torch.equal(copied.at(x), qd.at(x))
        other = torch.rand(1, 6, 40)  # (the copy is what is read while it stands)
        assert torch.equal(DraftDistributions(qd.ring, qd.slots, copy=other).at(c), other.gather(2, c))
        copied.copy.zero_()  # overwritten after release: the ring's rows are read
        copied.release()
        assert torch.equal(copied.at(x), qd.at(x))


def gsd_reference(p, q, x, G, delta, d=None, vectors=None):
    """Alg. 3 with a stable sort: ties with p(x) rank below x."""
    V = p.numel()
    key = [(-float(p[c]), 0 if c == x else 1, c) for c in range(V)]
    order = [c for _, _, c in sorted(key)]
    r = order.index(x)
    window = order[max(0, r - (G - 1) // 2): r + G // 2 + 1]
    members = [c for c in window if abs(float(p[c] - p[x])) <= delta]
    if d is not None:
        members = [c for c in members if float(((vectors[c] - vectors[x]) ** 2).sum()) <= d]
    return min(1.0, sum(float(p[c]) for c in members) / sum(float(q[c]) for c in members))


@pytest.mark.parametrize("G,delta,d", [(1, 0.15, None), (2, 1.0, None), (5, 0.02, None), (10, 0.05, None),
                                       (25, 1.0, None), (40, 1.0, None), (9, 1.0, 2.0)])
def test_grouped_rule_matches_a_sorted_reference(G, delta, d):
    p, q, x, qd = rows(seed=G)
    vectors = torch.randn(40, 3, generator=torch.Generator().manual_seed(1))
    geo = TokenGeometry(torch.arange(40), vectors, 40, torch.device("cpu"))
    got = GroupedAcceptance(G, delta, d, geo).accept_prob(p, qd, x)
    for b in range(p.shape[0]):
        for n in range(p.shape[1]):
            want = gsd_reference(p[b, n], q[b, n], int(x[b, n]), G, delta, d, vectors)
            assert got[b, n].item() == pytest.approx(want, rel=1e-5)


def test_grouped_rule_never_accepts_less_than_sjd_in_expectation():
    # Theorem 1: E_q[min(1, p'/q')] >= E_q[min(1, p/q)] for any clustering
    p, q, _, _ = rows(B=1, N=1, V=50, seed=9)
    xs = torch.arange(50).view(1, 50)
    qd = DraftDistributions(q.expand(1, 50, 50).contiguous(), torch.arange(50).view(1, 50))
    pe = p.expand(1, 50, 50)
    sjd = (ExactAcceptance().accept_prob(pe, qd, xs) * q[0, 0]).sum()
    gsd = (GroupedAcceptance(7, 1.0).accept_prob(pe, qd, xs) * q[0, 0]).sum()
    assert gsd >= sjd


def lantern_reference(p, q, x, neighbours, delta):
    mass, members = 0.0, []
    for c in neighbours:
        if mass + float(p[c]) > delta:
            break
        mass += float(p[c])
        members.append(c)
    accept = min(1.0, (float(p[x]) + mass) / float(q[x]))
    p_a = p.clone().double()
    p_a[members] = 0
    p_a[x] += mass
    return accept, (p_a - q.double()).clamp(min=0)


@pytest.mark.parametrize("k,delta", [(5, 0.0), (5, 0.05), (12, 0.2), (39, 1.0)])
def test_latent_rule_matches_the_paper(k, delta):
    p, q, x, qd = rows(seed=k)
    vectors = torch.randn(40, 4, generator=torch.Generator().manual_seed(2))
    geo = TokenGeometry(torch.arange(40), vectors, 40, torch.device("cpu"))
    rule = LatentRelaxedAcceptance(k, delta, geo)
    got = rule.accept_prob(p, qd, x)
    res = rule.residual(p[:, 1], q[:, 1], x[:, 1])
    for b in range(p.shape[0]):
        dist = ((vectors - vectors[x[b, 1]]) ** 2).sum(1)
        dist[x[b, 1]] = float("inf")
        nb = torch.argsort(dist)[:k].tolist()
        acc, want_res = lantern_reference(p[b, 1], q[b, 1], int(x[b, 1]), nb, delta)
        assert got[b, 1].item() == pytest.approx(acc, rel=1e-5)
        torch.testing.assert_close(res[b].double(), want_res, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("tested_first", [False, True])
@pytest.mark.parametrize("k,delta", [(5, 0.0), (12, 0.2), (39, 1.0)])
def test_latent_rule_writes_its_residual_into_a_windows_exact_pass(k, delta, tested_first):
    """Coupled drafting draws every window row from ``max(0, p - q)`` at once; LANTERN's first rejection
    takes its own residual in that pass (the row made the rule's), the other rows and the samples
    without a rejection as they were.  After the window's test (``ratios``) the row's
    neighbourhood is the test's; on its own the rule finds it again: the same residual."""
    p, q, x, qd = rows(B=4, N=6, seed=k)
    geo = TokenGeometry(torch.arange(40), torch.randn(40, 4, generator=torch.Generator().manual_seed(2)), 40,
                        torch.device("cpu"))
    rule = LatentRelaxedAcceptance(k, delta, geo)
    exact = (p - q).clamp(min=0)
    row, rejected = torch.tensor([0, 3, 5, 2]), torch.tensor([True, True, True, False])
    res = exact.clone()
    if tested_first:
        rule.ratios(p, qd, x)
    looked_up = []
    geo.neighbour_ids = lambda ids, k, find=geo.neighbour_ids: looked_up.append(ids) or find(ids, k)
    rule.relax_row(res, p, qd, x, row, rejected)
    assert len(looked_up) == (not tested_first)  # (after the test, its neighbourhoods are read, not found again)
    assert rule._window is None  # (read once: nothing of the window kept past its step)
    for b in range(4):
        r = int(row[b])
        want = rule.residual(p[b:b + 1, r], q[b:b + 1, r], x[b:b + 1, r])[0] if rejected[b] else exact[b, r]
        assert torch.equal(res[b, r], want)
        others = [n for n in range(6) if n != r]
        assert torch.equal(res[b, others], exact[b, others])
    assert torch.equal(res, exact) == (delta == 0)  # (delta = 0 is SJD: the exact residual)


@pytest.mark.parametrize("tested_first", [False, True])
@pytest.mark.parametrize("k,delta", [(5, 0.0), (12, 0.2), (39, 1.0)])
def test_latent_rule_takes_a_batch_of_ones_row_as_host_numbers(k, delta, tested_first):
    """A batch of one on the host step gives the rejected row and the outcome as numbers: the same residual
    as the tensor form, for every row, rejected or not."""
    p, q, x, _ = rows(B=1, N=6, seed=k)
    geo = TokenGeometry(torch.arange(40), torch.randn(40, 4, generator=torch.Generator().manual_seed(2)), 40,
                        torch.device("cpu"))
    exact = (p - q).clamp(min=0)
    for r in range(6):
        for rejected in (True, False):
            got, want = exact.clone(), exact.clone()
            for res, row, rej in ((got, r, rejected), (want, torch.tensor([r]), torch.tensor([rejected]))):
                rule = LatentRelaxedAcceptance(k, delta, geo)
                qd = DraftDistributions(q.clone(), torch.arange(6).unsqueeze(0))
                if tested_first:
                    rule.ratios(p, qd, x)
                rule.relax_row(res, p, qd, x, row, rej)
                assert rule._window is None
            assert torch.equal(got, want)
            if not rejected:
                assert torch.equal(got, exact)


def test_neighbour_table_is_nearest_first_without_self():
    g = torch.Generator().manual_seed(3)
    vectors = torch.randn(300, 8, generator=g)
    ids = torch.arange(100, 400)  # image tokens sit after 100 other ids
    geo = TokenGeometry(ids, vectors, 512, torch.device("cpu"))
    table = geo.neighbour_ids(ids, 17)
    d = torch.cdist(vectors, vectors)
    d.fill_diagonal_(float("inf"))
    want = ids[torch.argsort(d, 1)[:, :17]]
    assert torch.equal(table, want)
    assert geo.neighbours(17).dtype == torch.int16
    assert geo.nbytes() == 300 * 17 * 2 + 512 * 17 * 8  # and the lookup by token id (int64)
    # a vocabulary too large for the lookup by id reads the codebook's table: the same ids
    narrow = TokenGeometry(ids, vectors, 512, torch.device("cpu"))
    narrow.BY_ID_BYTES = 512 * 17 * 8 - 1
    assert torch.equal(narrow.neighbour_ids(ids.view(3, 100), 17), want.view(3, 100, 17))
    assert narrow.nbytes() == 300 * 17 * 2


def test_a_grid_codebook_has_its_neighbours_read_off_the_grid():
    """Finite scalar quantization (Cosmos): every point of evenly spaced levels once.  The grid path gives the
    brute-force distances in order, and a scattered codebook still takes the brute-force path."""
    from spec_ar.sampling.neighbours import grid_neighbours

    levels = torch.tensor([4, 3, 5])
    basis = torch.tensor([1, 4, 12])
    index = torch.arange(60)
    codes = ((index[:, None] // basis) % levels - levels // 2) / (levels // 2)
    perm = torch.randperm(60, generator=torch.Generator().manual_seed(0))  # rows in any order
    vectors = codes[perm].float()
    d = torch.cdist(vectors, vectors) ** 2
    d.fill_diagonal_(float("inf"))
    order = torch.from_numpy(grid_neighbours(vectors.numpy(), 9))
    got = d.gather(1, order)
    torch.testing.assert_close(got, d.sort(1).values[:, :9])  # the nearest, nearest first
    assert not (order == torch.arange(60)[:, None]).any()
    geo = TokenGeometry(torch.arange(100, 160), vectors, 160, torch.device("cpu"))
    assert torch.equal(geo.neighbours(9).long(), order + 100)  # as token ids
    assert grid_neighbours(torch.randn(60, 3).numpy(), 9) is None
    assert grid_neighbours(vectors[:-1].numpy(), 9) is None  # a point missing: not a grid


def test_a_new_decoder_of_the_same_codebook_reuses_its_neighbour_table(monkeypatch):
    from spec_ar.sampling import neighbours

    monkeypatch.setattr(neighbours, "_LAST", {})  # this test's tables only
    vectors = torch.randn(50, 4, generator=torch.Generator().manual_seed(3))
    first = TokenGeometry(torch.arange(50), vectors, 50, torch.device("cpu")).neighbours(5)
    builds = []
    monkeypatch.setattr(TokenGeometry, "_build", lambda self, k: builds.append(k))
    again = TokenGeometry(torch.arange(50), vectors.clone(), 50, torch.device("cpu")).neighbours(5)
    assert again is first and builds == []
    TokenGeometry(torch.arange(50), vectors + 1, 50, torch.device("cpu")).neighbours(5)  # another codebook
    assert builds == [5]


def test_a_uniform_below_the_ratio_is_below_the_acceptance_probability():
    """The engine tests its uniforms (below 1) against each rule's ratio, not min(1, ratio): the same
    tests, where q(x) is 0 (an infinite ratio) and where p(x) and q(x) are (NaN: both fail)."""
    p, _, x, qd = rows(seed=5)
    ring = qd.ring  # [B, N, V]: row j's q in slot j
    ring[0, 0, x[0, 0]] = 0.0  # p(x) / 0
    ring[2, 3, x[2, 3]] = 0.0
    p[0, 1, x[0, 1]] = 0.0  # 0 / 0
    ring[0, 1, x[0, 1]] = 0.0
    u = torch.tensor([0.0, 2.0 ** -24, 0.25, 0.5, 0.75, 1.0 - 2.0 ** -24]).view(-1, 1, 1)
    geo = TokenGeometry(torch.arange(40), torch.randn(40, 3, generator=torch.Generator().manual_seed(1)), 40,
                        torch.device("cpu"))
    exact = ExactAcceptance().accept_prob(p, qd, x)
    for rule in (ExactAcceptance(), GroupedAcceptance(10, 0.2), LatentRelaxedAcceptance(12, 0.2, geo)):
        ratio, exact_ratio = rule.ratios(p, qd, x)
        assert torch.isinf(exact_ratio[0, 0]) and torch.isnan(exact_ratio[0, 1])
        assert (ratio > 1).any()  # (where a clamp would have cut it)
        assert torch.equal(u < ratio, u < rule.accept_prob(p, qd, x))
        assert torch.equal(u < exact_ratio, u < exact)
        torch.testing.assert_close(rule.ratio(p, qd, x), ratio, equal_nan=True, rtol=0, atol=0)
