"""The report's counts, rebuilt from the step log: host numbers (a batch of one on the host step) and
tensors (every other decode) count alike."""
from types import SimpleNamespace

import torch

from spec_ar.sampling.report import (
    ACCEPTED, COMMITTED, FORCED, PENDING, RESAMPLED, ROW_DRAWN, SAMPLED, _counts)

T = 12


def _state(log, forced=(), batch=1, fixed=None):
    forced_at = torch.full((T + 4,), -1)
    forced_at[list(forced)] = 7
    return SimpleNamespace(batch=batch, length=T, max_window=2, log=log, fixed=fixed, seq=torch.zeros(batch, T + 4),
                           forced_at=forced_at, any_forced=bool(forced),
                           forced_host=lambda: (forced_at >= 0).tolist())


def _as_tensors(log):
    return [(k, *(None if v is None else torch.tensor([v]) for v in e)) for k, *e in log]


# first token; a rejection at 3; a skip committing 4..5 (a flag), an empty skip; every draft standing with the
# bonus past the stream's end; a step past the end
LOG = [("P", 0, 1, False, 0), ("V", 1, 4, True, 3), ("S", 4, 6, True, None), ("S", 6, 6, False, None),
       ("V", 6, 8, False, 7), ("V", 8, 12, False, 12), ("V", 12, 12, False, 12)]
ORIGINS = [SAMPLED, ACCEPTED, ACCEPTED, RESAMPLED, COMMITTED, COMMITTED, ACCEPTED, SAMPLED] + [ACCEPTED] * 4


def test_each_step_kind_marks_its_tokens_and_counts():
    for forced in ([], [2, 9]):
        host = _counts(_state(LOG, forced))
        assert host == _counts(_state(_as_tensors(LOG), forced))
        origins, nfe, hist, skipped, unverified = host
        expect = list(ORIGINS)
        for f in forced:
            expect[f] = FORCED
        assert origins == [expect]
        assert (nfe, skipped, unverified) == ([4], [1], [2])  # the step past the end (12 -> 12) is no forward
        assert hist == [[0, 1, 1, 2]]  # lengths 1, 3, 2 and 4 (the last bin holds 3 and more)


def test_a_batch_counts_each_image_from_its_own_entries():
    # image 1 accepts everything at once where image 0 steps as above; rows drawn beside the window mark image 1
    other = [("P", 0, 1, False, 0), ("V", 1, 12, False, 12), ("S", 12, 12, False, None), ("S", 12, 12, False, None),
             ("V", 12, 12, False, 12), ("V", 12, 12, False, 12), ("V", 12, 12, False, 12)]
    log = [(k, *(None if a is None else torch.tensor([a, b]) for a, b in zip(e0, e1)))
           for (k, *e0), (_, *e1) in zip(LOG, other)]
    fixed = torch.full((2, T + 4), -1)
    fixed[1, 5:7] = 3
    origins, nfe, hist, skipped, unverified = _counts(_state(log, [9], batch=2, fixed=fixed))
    expect = list(ORIGINS)
    expect[9] = FORCED
    assert origins[0] == expect
    assert origins[1] == [SAMPLED] + [ACCEPTED] * 4 + [ROW_DRAWN] * 2 + [ACCEPTED] * 2 + [FORCED] + [ACCEPTED] * 2
    assert (nfe, skipped, unverified) == ([4, 2], [1, 0], [2, 0])
    assert hist == [[0, 1, 1, 2], [0, 1, 0, 1]]


def test_an_entry_reaching_past_the_stream_counts_inside_it():
    # (no step commits past the stream's end; were one to, the origins stay one a position)
    log = [("P", 0, 1, False, 0), ("V", 1, 9, True, 8), ("S", 9, 10, True, None), ("V", 10, 15, False, 14)]
    host = _counts(_state(log))
    assert host == _counts(_state(_as_tensors(log)))
    assert len(host[0][0]) == T and host[0][0][9:] == [COMMITTED, ACCEPTED, ACCEPTED]
    assert PENDING not in host[0][0]
