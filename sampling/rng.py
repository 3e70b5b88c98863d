"""Counter-based random numbers: one uniform per (seed, step, stream, position).

Every random draw of the engine is a pure function of the sample's own seed, the
decoding step, what the number is for (the stream) and the token position.  Two
consequences users can rely on:

* image ``b`` of a batch draws the numbers a batch of one draws with seed ``seeds[b]``
  (no shared generator couples the samples; the one exception is VVS skipping,
  where a batch skips its verifications together), so it is that image wherever the
  forward gives a row the same logits in any batch (float kernels may round a row
  differently at another batch size, and a near tie then parts the two), and
* seeds are integers of any size, taken modulo 2**64;
* two modes that make the same decisions draw the same numbers, so on chains of
  drafts (Jacobi windows, a draft model's or a head's chain) ``gsd`` with ``G = 1``
  and ``lantern`` with ``delta = 0`` reproduce ``sjd`` token for token
  (``tests/test_equivalence.py``).  On draft trees they do not: the exact rule
  draws once per level over the siblings (recursive rejection), the relaxed rules
  test the siblings one by one, so the three spend their numbers differently; each
  is still lossless there (``tests/test_tree_drafts.py``), but their images differ.

The hash is SplitMix64's finaliser evaluated with int64 tensor arithmetic (which
wraps on overflow on CPU and CUDA alike); logical shifts are emulated with masks.
"""
from __future__ import annotations

import torch

# SplitMix64 constants as signed int64 values.
_GAMMA = -7046029254386353131  # 0x9E3779B97F4A7C15
_MUL1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MUL2 = -7723592293110705685  # 0x94D049BB133111EB

# What a number is used for; distinct streams never share a draw.
VERIFY = 1  # per window row: lane 0 the acceptance coin, lane 1 the row's sample
INIT = 2  # draft initialisation
PATHS = 3  # VVS candidate paths: stream PATHS + path index (up to 64 paths)
DRAFT = 2000  # draws of a draft model's proposals (model_drafts.py)
TREE = 3000  # a sampled draft tree's gumbel noise: position (node + 1) * V + token id
ROWS = 5000  # row-parallel drafting: a lower row's draw, by position
PROACTIVE = 4000  # proactive drafting: + 0 its alternatives' gumbel noise, + 1 the walk over its tree
COUPLE = 1000  # coupled Jacobi drafts: COUPLE + 1 the gumbel noise by position * V + token id (maximal reuses VERIFY's)


_WORD = (1 << 64) - 1


def _wrap(v: int) -> int:
    """A Python int as the signed 64-bit word it wraps to."""
    return (v + (1 << 63)) % (1 << 64) - (1 << 63)


_BLOCK_TABLES: dict = {}  # UniformBlock's key words and lane shifts by (streams, steps, device)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser (a bijection of 64-bit words)."""
    x = (x ^ _shr(x, 30)) * _MUL1
    x = (x ^ _shr(x, 27)) * _MUL2
    return x ^ _shr(x, 31)


def _mix_host(x: int) -> int:
    """:func:`_mix` of one word held as a Python int in ``[0, 2**64)``."""
    x = ((x ^ (x >> 30)) * _MUL1) & _WORD
    x = ((x ^ (x >> 27)) * _MUL2) & _WORD
    return x ^ (x >> 31)


def seed_keys(seeds, device=None) -> torch.Tensor:
    """Per-sample keys, computed once per batch.  ``seeds``: Python integers of any
    size (taken modulo 2**64, so 2**64 - 1 and -1 are the same seed) or an int64 tensor.
    (Integers are mixed on the host: the same words as the tensor arithmetic, one tensor made.)"""
    if isinstance(seeds, torch.Tensor):
        return _mix(seeds * _GAMMA + _GAMMA)
    return torch.tensor([_wrap(_mix_host((int(s) * _GAMMA + _GAMMA) & _WORD)) for s in seeds], dtype=torch.long,
                        device=device)


def uniform(keys: torch.Tensor, step: int | torch.Tensor, stream: int, positions: torch.Tensor,
            lanes: int = 1) -> torch.Tensor:
    """Uniform float32 numbers in ``[0, 1)`` shaped ``positions.shape + (lanes,)``
    (the trailing dimension dropped when ``lanes == 1``).

    ``keys`` ``[B]`` come from :func:`seed_keys`; ``positions`` is ``[B, ...]``;
    ``step`` is an int or a tensor broadcasting against ``positions``.
    Each lane takes 24 bits of one 64-bit hash, so values are exact in float32
    and strictly below 1; two lanes cost one hash.
    """
    key = keys.view((-1,) + (1,) * (positions.dim() - 1))
    if isinstance(step, torch.Tensor):  # one step per position (int64 arithmetic wraps)
        key = key + (step * 4096 + stream) * _GAMMA
    else:
        key = key + _wrap((step * 4096 + stream) * _GAMMA)
    h = _mix(key ^ (positions * _GAMMA))
    if lanes == 1:
        return _shr(h, 40).to(torch.float32) * (1.0 / (1 << 24))
    return torch.stack([_shr(h, 40), _shr(h, 16) & 0xFFFFFF], -1).to(torch.float32) * (1.0 / (1 << 24))


class UniformBlock:
    """:func:`uniform`'s numbers for ``steps`` steps from ``step0`` and ``width`` positions of each
    sample from ``lo[b]``, hashed at once for each stream (``lanes``: stream -> lanes).  A step then
    reads its numbers with one gather: the same numbers (``tests/test_rng.py``), where hashing a
    window's few dozen of them anew costs some twenty small tensor operations, which on the CPU is
    their overhead only (several per cent of a batch-1 image on the embedded model)."""

    def __init__(self, keys: torch.Tensor, step0: int, steps: int, lo: list[int], width: int,
                 lanes: dict[int, int]):
        if not set(lanes.values()) <= {1, 2}:
            raise ValueError(f"a block holds one or two lanes a stream (got {lanes})")
        self.step0, self.steps, self.lo, self.width, self.lanes = step0, steps, lo, width, lanes
        dev = self.device = keys.device
        self._start = None
        # every stream in one pass of the hash (uniform's arithmetic, a stream axis in front).  The key's words
        # (step * 4096 + stream) * gamma and a position's position * gamma are sums of a table's (steps and
        # positions from 0, kept by shape) and one host number's: int64 arithmetic wraps, so the same words
        tables = _BLOCK_TABLES.get((tuple(lanes), steps, dev))
        if tables is None or tables[1].numel() < width:
            by_step = [[_wrap((k * 4096 + stream) * _GAMMA) for k in range(steps)] for stream in lanes]
            at = torch.arange(max(width, 512), device=dev) * _GAMMA
            tables = _BLOCK_TABLES[(tuple(lanes), steps, dev)] = (
                torch.tensor(by_step, device=dev).view(len(lanes), 1, steps, 1), at,
                torch.tensor([40, 16], device=dev))  # (the two lanes' shifts)
        key = (tables[0] + keys.view(1, -1, 1, 1)).add_(_wrap(step0 * 4096 * _GAMMA))  # [S, B, K, 1]
        at = tables[1][:width]
        grid = (at + _wrap(lo[0] * _GAMMA) if len(lo) == 1  # [B or 1, 1, P]: position * gamma
                else at + torch.tensor([_wrap(p * _GAMMA) for p in lo], device=dev).unsqueeze(1)).unsqueeze(-2)
        h, shifts = _mix(key ^ grid), tables[2]
        # a lane: 24 bits of the hash (uniform's), exact in float32 and scaled there
        self.numbers = {s: ((h[i].unsqueeze(-1) >> shifts if n == 2 else h[i] >> 40) & 0xFFFFFF) * (1.0 / (1 << 24))
                        for i, (s, n) in enumerate(lanes.items())}  # [B, K, P(, n)]

    @property
    def start(self) -> torch.Tensor:
        """Each sample's first position ``[B, 1]``."""
        if self._start is None:
            self._start = torch.tensor(self.lo, device=self.device).unsqueeze(1)
        return self._start

    def covers(self, step: int, stream: int, lanes: int, upto: list[int]) -> bool:
        """Whether it holds ``stream``'s numbers at ``step`` for every position below ``upto[b]``."""
        return (0 <= step - self.step0 < self.steps and self.lanes.get(stream) == lanes
                and all(u <= lo + self.width for u, lo in zip(upto, self.lo)))

    def run(self, step: int, stream: int, offset: int, n: int) -> torch.Tensor:
        """The numbers at positions ``lo[b] + offset + arange(n)`` of every sample (a view)."""
        return self.numbers[stream][:, step - self.step0, offset:offset + n]

    def take(self, step: int, stream: int, positions: torch.Tensor) -> torch.Tensor:
        """The numbers at ``positions`` ``[B, N]``; a position outside the block (one the caller
        does not read) gets some other position's."""
        u = self.numbers[stream][:, step - self.step0]  # [B, P(, n)]
        at = (positions - self.start).clamp_(0, self.width - 1)
        if u.dim() == 2:
            return u.gather(1, at)
        return u.gather(1, at.unsqueeze(-1).expand(-1, -1, u.shape[-1]))


#: The least mass a row needs to be drawn from (twice float32's smallest normal number): below it,
#: ``u * total`` rounds on the subnormal numbers' fixed grid and can round up to ``total`` (at exactly
#: the smallest normal number too, a tie rounded to even), so :func:`categorical` may count such a row
#: as without mass, and callers that fall back from an empty row treat it as one.
MIN_MASS = 2.0 ** -125


def categorical(probs: torch.Tensor, u: torch.Tensor, workspace: torch.Tensor | None = None,
                empty: str = "clamp") -> torch.Tensor:
    """Inverse-CDF draws from the rows of ``probs`` (``[..., V]``, any scale, float32), one per
    uniform in ``u`` (``[..., n]``, at most ``1 - 2**-24`` as :func:`uniform` and ``torch.rand``
    give them): returns ``[..., n]`` token ids.

    Never returns a zero-probability token of a row with mass (a total of at least
    :data:`MIN_MASS`): ``u * total`` rounds strictly below such a total (``1 - u`` is at least
    ``2**-24``, half a unit in the last place of 1 or more), so the first cumulative sum above it
    ends on a token with mass.  A row without mass gives ``V - 1`` (``empty="clamp"``) or ``V``
    (``empty="past-end"``, for a caller that falls back to another draw); so may a row whose total
    is below :data:`MIN_MASS`, which callers with a fallback treat as empty.  ``workspace`` (shaped
    like ``probs``) saves an allocation.
    """
    c = probs.cumsum(-1) if workspace is None else torch.cumsum(probs, -1, out=workspace)
    ids = torch.searchsorted(c, u * c[..., -1:], right=True)
    return ids.clamp_(max=probs.shape[-1] - 1) if empty == "clamp" else ids


def categorical_by_sums(cdf: torch.Tensor, total: float, u: torch.Tensor) -> torch.Tensor:
    """:func:`categorical`'s draws (``empty="clamp"``) from one row per sample whose cumulative sums ``cdf``
    ``[B, V]`` a draw already made, with their last, ``total``, read on the host (a batch of one): the same ids."""
    ids = torch.searchsorted(cdf, u * total, right=True)
    return ids if total >= MIN_MASS else ids.clamp_(max=cdf.shape[-1] - 1)


def exponential(keys: torch.Tensor, stream: int, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Standard exponential noise per (sample, position, token), shaped ``positions.shape + (vocab,)``:
    ``-log u`` of :func:`uniform` at ``position * vocab + token`` (step 0: fixed across steps).
    ``argmax p / e`` is then a draw from ``p`` that stays put while ``p``'s argmax under the noise does."""
    at = positions.unsqueeze(-1) * vocab + torch.arange(vocab, device=positions.device)
    return uniform(keys, 0, stream, at).clamp_(min=2.0 ** -25).log_().neg_()
