"""The counter-based numbers: a block hashed for several steps at once holds the numbers each
step would hash for itself."""
import pytest
import torch

from spec_ar.sampling import rng


def test_seed_keys_of_host_numbers_are_the_tensor_arithmetics():
    seeds = [0, 1, -1, 2**63, 2**64 - 1, 2**70 + 5, -(2**63), 123456789123456789]
    as_words = torch.tensor([(s + 2**63) % 2**64 - 2**63 for s in seeds])
    assert torch.equal(rng.seed_keys(seeds), rng.seed_keys(as_words))
    assert torch.equal(rng.seed_keys([-1]), rng.seed_keys([2**64 - 1]))


@pytest.mark.parametrize("lo", [[0, 17, 5, 300], [9], [2**40]])
def test_a_block_holds_each_steps_own_numbers_at_every_position_it_covers(lo):
    keys = rng.seed_keys([0, -1, 2**63, 123456789123456789][:len(lo)])
    block = rng.UniformBlock(keys, 11, 8, lo, 40, {rng.VERIFY: 2, rng.INIT: 1})
    start = torch.tensor(lo).unsqueeze(1)
    for step in range(11, 19):
        for stream, lanes in ((rng.VERIFY, 2), (rng.INIT, 1)):
            positions = start + torch.tensor([[0, 1, 2, 39], [3, 9, 10, 20], [39, 0, 7, 7], [12, 13, 14, 15]])[:len(lo)]
            assert block.covers(step, stream, lanes, [p + 40 for p in lo])
            assert torch.equal(block.take(step, stream, positions), rng.uniform(keys, step, stream, positions, lanes))
    for step in (11, 18):  # a run of positions from the same offset into every sample's part
        for offset, n in ((0, 40), (3, 25), (39, 1)):
            run = start + offset + torch.arange(n)
            assert torch.equal(block.run(step, rng.VERIFY, offset, n), rng.uniform(keys, step, rng.VERIFY, run, 2))
            assert torch.equal(block.run(step, rng.INIT, offset, n), rng.uniform(keys, step, rng.INIT, run))
    assert not block.covers(19, rng.VERIFY, 2, lo) and not block.covers(10, rng.VERIFY, 2, lo)
    assert not block.covers(12, rng.VERIFY, 1, lo)  # lanes it does not hold
    assert not block.covers(12, rng.PATHS, 1, lo)  # nor another stream
    assert not block.covers(12, rng.INIT, 1, [lo[0] + 41] + lo[1:])  # past its width
    # a wider block of the same streams (the key tables kept by shape grow) from another step
    wide = rng.UniformBlock(keys, 3, 8, lo, 1000, {rng.VERIFY: 2, rng.INIT: 1})
    far = start + torch.tensor([0, 511, 512, 999])
    assert torch.equal(wide.take(5, rng.VERIFY, far), rng.uniform(keys, 5, rng.VERIFY, far, 2))


def test_the_numbers_are_uniform_on_24_bits_and_below_one():
    keys = rng.seed_keys(range(64))
    u = rng.uniform(keys, 3, rng.VERIFY, torch.arange(4096).expand(64, -1), lanes=2)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert torch.equal(u * 2**24, (u * 2**24).floor())  # exact 24-bit values
    counts = torch.histc(u.flatten(), bins=16, min=0.0, max=1.0)
    expected = u.numel() / 16
    assert float(((counts - expected) ** 2 / expected).sum()) < 60  # chi-square, 15 dof: p ~ 1e-7


def test_exponential_noise_is_fixed_per_sample_position_and_token_whatever_the_batch():
    """Gumbel-coupled drafts read it: the host step fills a ring position by position, the step on
    the device computes a window's at once; an image's noise never depends on its batch."""
    keys = rng.seed_keys([3, 8, 21])
    pos = torch.tensor([[1, 2, 3], [40, 41, 42], [7, 8, 9]])
    e = rng.exponential(keys, rng.COUPLE + 1, pos, 50)
    assert e.shape == (3, 3, 50) and torch.isfinite(e).all() and (e > 0).all()
    for b in range(3):
        for j in range(3):  # one sample, one position: the same numbers
            alone = rng.exponential(keys[b:b + 1], rng.COUPLE + 1, pos[b:b + 1, j:j + 1], 50)
            assert torch.equal(alone[0, 0], e[b, j])
    assert not torch.equal(e[0, 1], e[0, 2])  # positions differ
    big = rng.exponential(rng.seed_keys(range(8)), rng.COUPLE + 1, torch.arange(64).expand(8, -1), 512)
    assert abs(big.mean().item() - 1.0) < 0.01 and abs(big.var().item() - 1.0) < 0.03  # Exp(1): mean 1, variance 1


def test_a_draw_at_the_largest_number_lands_on_a_token_with_mass():
    """``u * total`` rounds below every row total of at least ``MIN_MASS``, so the largest number the hash
    gives (``1 - 2**-24``) draws the last token with mass, never one past it; a row without mass is empty."""
    u_max = torch.tensor([[1.0 - 2.0 ** -24]])
    assert float(u_max) < 1.0
    g = torch.Generator().manual_seed(0)
    totals = [rng.MIN_MASS, 2.0 ** -100, 1e-9, 0.37, 1.0, 1.5, 2.0 - 2.0 ** -23, 2.0, 3.0, 1e30]
    totals += (torch.rand(2000, generator=g, dtype=torch.float64) * 40 - 20).exp2().tolist()
    V = 8
    for total in totals:
        probs = torch.zeros(1, V)
        probs[0, :5] = torch.rand(5, generator=g) + 0.1
        probs[0, 2] = 0.0  # a zero inside, the tail past 4 without mass
        probs = probs / probs.sum() * total
        if float(probs.sum()) < rng.MIN_MASS:
            continue
        for empty in ("clamp", "past-end"):
            ids = rng.categorical(probs, u_max, empty=empty)
            assert int(ids) == 4, (total, empty)
        assert int(rng.categorical(probs, torch.zeros(1, 1))) == 0
    nothing = torch.zeros(1, V)
    assert int(rng.categorical(nothing, u_max, empty="past-end")) == V
    assert int(rng.categorical(nothing, u_max)) == V - 1


def test_a_draw_from_sums_at_hand_is_the_draw_from_the_row():
    """The extension draws from the last window row's sums, which the engine's draw made (a batch of one):
    the same ids as ``categorical`` of the row, rows without mass and NaN rows included."""
    g = torch.Generator().manual_seed(3)
    u = rng.uniform(rng.seed_keys([4]), 0, rng.INIT, torch.arange(64).view(1, 64))
    u[0, -1] = 1.0 - 2.0 ** -24
    rows = [torch.rand(1, 50, generator=g) ** 8, torch.zeros(1, 50), torch.full((1, 50), 2.0 ** -140)]
    nan = torch.rand(1, 50, generator=g)
    nan[0, 7] = float("nan")
    for row in rows + [nan]:
        cdf = row.cumsum(-1)
        assert torch.equal(rng.categorical_by_sums(cdf, float(cdf[0, -1]), u), rng.categorical(row, u))
