"""Sweep specifications read like the papers' figures."""
import pytest

from spec_ar.bench.sweeps import parse_sweep
from spec_ar.sampling import ConfigError


def test_papers_knob_names():
    runs = parse_sweep("gsd:G=1,3,10,25,50,100")
    assert [label for label, _ in runs] == [f"gsd G={g}" for g in (1, 3, 10, 25, 50, 100)]
    assert [c.group_size for _, c in runs] == [1, 3, 10, 25, 50, 100] and runs[0][1].mode == "gsd"
    assert [c.gsd_delta for _, c in parse_sweep("gsd:delta=0.05,0.3")] == [0.05, 0.3]
    assert [c.lantern_delta for _, c in parse_sweep("lantern:delta=0.1,0.4")] == [0.1, 0.4]
    grid = parse_sweep("lantern:k=100,1000;delta=0.1,0.4")
    assert [(c.lantern_k, c.lantern_delta) for _, c in grid] == [(100, 0.1), (100, 0.4), (1000, 0.1), (1000, 0.4)]
    assert [c.skip_interval for _, c in parse_sweep("vvs:interval=2,3,4")] == [2, 3, 4]
    sim = parse_sweep("vvs:schedule=similarity;threshold=0.7,0.8")
    assert [(c.verify_schedule, c.skip_threshold) for _, c in sim] == [("similarity", 0.7), ("similarity", 0.8)]
    assert [c.init for _, c in parse_sweep("sjd:init=random,sample-left")] == ["random", "sample-left"]
    assert parse_sweep("gsd:d=none,0.5")[0][1].gsd_distance is None


def test_bad_sweeps_say_what_is_wrong():
    with pytest.raises(ConfigError, match="sweep knob 'Q' is not a decoding setting"):
        parse_sweep("gsd:Q=1")
    with pytest.raises(ConfigError, match="group_size must be an integer in \\[1, 1000\\] \\(got 0\\)"):
        parse_sweep("gsd:G=0,1")
    with pytest.raises(ConfigError, match=r"group_size must be an integer in \[1, 1000\] \(got .big.\)"):
        parse_sweep("gsd:G=big")
