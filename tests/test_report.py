"""The report's counts: a batch of one's host-number log counts as its tensors do."""
from types import SimpleNamespace

import torch

from spec_ar.sampling.report import (
    ACCEPTED, COMMITTED, FORCED, RESAMPLED, SAMPLED, _counts_from_host_log, _counts_from_log)


def _state(log, forced):
    T = 12
    forced_at = torch.full((T + 4,), -1)
    forced_at[forced] = 7
    return SimpleNamespace(batch=1, length=T, max_window=2, log=log, fixed=None, seq=torch.zeros(1, T + 4),
                           forced_at=forced_at, any_forced=bool(forced),
                           forced_host=lambda: (forced_at >= 0).tolist())


def test_a_host_number_log_counts_as_its_tensors():
    # first token; a rejection at 3; a skip committing 4..5 (a flag), an empty skip; every draft standing with the
    # bonus past the stream's end; a window longer than the histogram
    log = [("P", 0, 1, False, 0), ("V", 1, 4, True, 3), ("S", 4, 6, True, None), ("S", 6, 6, False, None),
           ("V", 6, 8, False, 7), ("V", 8, 12, False, 12), ("V", 12, 12, False, 12)]
    as_tensors = [(k, *(None if v is None else torch.tensor([v]) for v in e)) for k, *e in log]
    for forced in ([], [2, 9]):
        host = _counts_from_host_log(_state(log, forced))
        assert host == _counts_from_log(_state(as_tensors, forced))
        origins, nfe, hist, skipped, unverified = host
        expect = [SAMPLED, ACCEPTED, ACCEPTED, RESAMPLED, COMMITTED, COMMITTED, ACCEPTED, SAMPLED] + [ACCEPTED] * 4
        for f in forced:
            expect[f] = FORCED
        assert origins == [expect]
        assert (nfe, skipped, unverified) == ([4], [1], [2])  # the step past the end (12 -> 12) is no forward
        assert hist == [[0, 1, 1, 2]]  # lengths 1, 3, 2 and 4 (the last bin holds 3 and more)


def test_an_entry_reaching_past_the_stream_counts_inside_it():
    # (no step commits past the stream's end; were one to, the origins stay one a position)
    log = [("P", 0, 1, False, 0), ("V", 1, 9, True, 8), ("S", 9, 10, True, None), ("V", 10, 15, False, 14)]
    as_tensors = [(k, *(None if v is None else torch.tensor([v]) for v in e)) for k, *e in log]
    host = _counts_from_host_log(_state(log, []))
    assert host == _counts_from_log(_state(as_tensors, []))
    assert len(host[0][0]) == 12 and host[0][0][9:] == [COMMITTED, ACCEPTED, ACCEPTED]
