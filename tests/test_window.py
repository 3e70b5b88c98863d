"""The window on auto: the width that commits the most tokens per second on the device
at hand, from measured forward costs and observed acceptance; the report says why."""
from __future__ import annotations

import pytest

from spec_ar.loaders.synthetic import SyntheticAdapter
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder, window
from spec_ar.sampling.window import Acceptance, choose

FLAT = {w: 0.010 for w in window.CANDIDATES}  # a memory-bound GPU: every width costs one read of the weights
LINEAR = {w: 0.004 + 0.004 * (w + 1) for w in window.CANDIDATES}  # a compute-bound CPU batch: each row costs


def test_a_memory_bound_device_keeps_a_wide_window():
    choice = choose(FLAT, Acceptance(5.6, 24), preset=24)
    assert choice.width >= 24
    assert choice.reason.startswith(f"window {choice.width} on auto")


def test_a_compute_bound_device_narrows_the_window():
    assert choose(LINEAR, Acceptance(5.6, 24), preset=24).width <= 4


FULL = {w: 0.001 * (w + 1) for w in window.CANDIDATES}  # every row costs its full share: no window pays


def test_where_no_window_pays_plain_ar_steps_are_chosen():
    for batch in (1, 8):
        choice = choose(FULL, Acceptance(6.0, 24), preset=24, batch=batch)
        assert choice.width == 0 and "plain AR steps" in choice.reason


def test_the_preset_stays_unless_another_width_is_clearly_faster():
    nearly = {**FLAT, 32: 0.0105}  # 32 commits 16 % more per forward and costs 5 % more: 11 % faster
    assert choose(nearly, Acceptance(5.6, 24), preset=24).width == 24


def test_a_batch_waits_for_its_slowest_image():
    spread = [window.straggle(b) for b in (1, 2, 8, 32)]
    assert spread[0] == 0.0 and spread == sorted(spread)
    assert spread[2] == pytest.approx(1.42 * window.SPREAD, rel=0.02)  # the largest of 8 normal draws: 1.42 sd


def test_the_slowest_image_narrows_a_window_whose_forwards_cost():
    between = {w: 0.010 + 0.001 * (w + 1) for w in window.CANDIDATES}  # fixed cost, and 1 ms a row
    assert choose(between, Acceptance(6.0, 24), preset=24, batch=1).width == 24
    narrow = choose(between, Acceptance(6.0, 24), preset=24, batch=8)
    assert narrow.width < 24 and "for a batch of 8, whose slowest image sets the forwards" in narrow.reason
    assert choose(FLAT, Acceptance(6.0, 24), preset=24, batch=64).width >= 24  # a forward costs the same: stays wide


def test_acceptance_is_what_was_observed_at_its_width_and_grows_with_it():
    a = Acceptance(4.0, 16)
    assert a.at(16) == pytest.approx(4.0)
    values = [a.at(w) for w in window.CANDIDATES if w]
    assert values == sorted(values) and values[0] > 1.0
    assert a.at(0) == 1.0  # plain AR steps: one token per forward
    assert Acceptance(1.0, 16).at(32) == 1.0  # nothing accepted: nothing predicted


class StallingModel:
    """Forwards that cost ``LINEAR`` on a clock of their own, the first at ``stall_at`` drafts
    taking a second more (the machine busy elsewhere for a moment)."""

    device = "cpu"

    def __init__(self, stall_at: int):
        self.now, self.stall_at = 0.0, stall_at

    def clock(self) -> float:
        return self.now

    def forward(self, tokens):
        drafts = tokens.shape[1] - 1
        self.now += LINEAR[drafts] + (1.0 if drafts == self.stall_at else 0.0)
        self.stall_at = None if drafts == self.stall_at else self.stall_at

    def rollback(self, lengths):
        pass


@pytest.mark.parametrize("stall_at", [None, 1, 8, 24])
def test_a_stall_during_the_probe_changes_no_width_s_cost(stall_at):
    model = StallingModel(stall_at)
    costs = window.probe(model, lambda logits, target: None, batch=2, image_id=0, clock=model.clock)
    assert costs == pytest.approx(LINEAR)


class CacheLength(StallingModel):
    """Records the cache length each forward starts from."""

    def __init__(self):
        super().__init__(stall_at=None)
        self.length, self.starts = 0, []

    def forward(self, tokens):
        self.starts.append((self.length, tokens.shape[1]))
        self.length += tokens.shape[1]
        self.now += 0.001

    def rollback(self, lengths):
        self.length -= lengths[0]


def test_the_probe_times_every_width_on_the_prefilled_cache_and_leaves_it_as_it_was():
    model = CacheLength()
    window.probe(model, lambda logits, target: None, batch=2, image_id=0, clock=model.clock)
    assert len(model.starts) == 3 * len(window.CANDIDATES)  # three rounds of cheap forwards
    assert {start for start, _ in model.starts} == {0}
    assert sorted({width - 1 for _, width in model.starts}) == list(window.CANDIDATES)
    assert model.length == 0


def test_forwards_that_take_seconds_are_measured_once():
    model = CacheLength()
    model.forward = lambda tokens: setattr(model, "now", model.now + 1.5)  # an offloaded model's forwards
    costs = window.probe(model, lambda logits, target: None, batch=1, image_id=0, clock=model.clock)
    assert model.now == pytest.approx(1.5 * len(window.CANDIDATES))
    assert all(c == pytest.approx(1.5) for c in costs.values())


def test_a_narrow_width_is_never_taken_to_cost_more_than_a_wider_one():
    assert window.monotone({1: 0.010, 2: 0.030, 4: 0.020, 8: 0.040}) == {1: 0.010, 2: 0.020, 4: 0.020, 8: 0.040}


@pytest.fixture()
def model():
    return SyntheticAdapter(codebook=64, rows=6, cols=6, end_of_line=True, sharpness=1.5, seed=1)


def test_a_decode_on_auto_chooses_once_per_batch_and_reports_why(model, monkeypatch):
    probes = []
    real = window.probe
    monkeypatch.setattr(window, "probe", lambda *a, **k: probes.append(a[2]) or real(*a, **k))
    decoder = SpeculativeDecoder(model, DecodeConfig(mode="sjd"))
    first = decoder.generate([0, 1], seeds=3).reports[0]
    assert first.settings["window"] in window.CANDIDATES
    assert first.window_choice.startswith(f"window {first.settings['window']} on auto")
    assert "(auto)" in first.summary()
    decoder.generate([0, 1], seeds=4)
    decoder.generate([0], seeds=4)
    assert probes == [2, 1]  # measured once per batch size, then kept with the model


def test_the_same_settings_and_seed_give_the_same_image_again(model):
    decoder = SpeculativeDecoder(model, DecodeConfig(mode="sjd"))
    first, again = (decoder.generate([0, 1], seeds=9) for _ in range(2))
    assert (first.tokens == again.tokens).all()
    assert first.reports[0].window_choice == again.reports[0].window_choice


def test_a_set_window_is_kept_and_nothing_is_measured(model, monkeypatch):
    monkeypatch.setattr(window, "probe", lambda *a, **k: pytest.fail("probed a set window"))
    report = SpeculativeDecoder(model, DecodeConfig(mode="sjd", window=5)).generate([0], seeds=1).reports[0]
    assert report.settings["window"] == 5 and report.window_choice == ""


def test_the_chosen_width_gives_the_tokens_of_that_width_set_by_hand(model, monkeypatch):
    monkeypatch.setattr(window, "probe", lambda adapter, pipeline, batch, image_id: LINEAR)
    auto = SpeculativeDecoder(model, DecodeConfig(mode="sjd")).generate([0, 1], seeds=7)
    width = auto.reports[0].settings["window"]
    assert width <= 4
    by_hand = SpeculativeDecoder(model, DecodeConfig(mode="sjd", window=width)).generate([0, 1], seeds=7)
    assert (auto.tokens == by_hand.tokens).all()


@pytest.mark.parametrize("mode", ["sjd", "gsd", "lantern", "vvs"])
def test_plain_ar_steps_on_auto_give_the_image_ar_gives(model, monkeypatch, mode):
    monkeypatch.setattr(window, "probe", lambda *a, **k: FULL)
    relaxed = {"lantern_k": 10} if mode in ("lantern", "vvs") else {}
    auto = SpeculativeDecoder(model, DecodeConfig(mode=mode, **relaxed)).generate([0, 1], seeds=[7, 8])
    ar = SpeculativeDecoder(model, DecodeConfig(mode="ar")).generate([0, 1], seeds=[7, 8])
    assert (auto.tokens == ar.tokens).all()
    report = auto.reports[0]
    assert report.nfe == report.tokens and report.settings["window"] == 0
    assert "plain AR steps" in report.summary() and report.window_choice.startswith("window 0 on auto")
