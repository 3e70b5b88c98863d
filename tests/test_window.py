"""The window on auto: the width that commits the most tokens per second on the device at hand,
found on the decode's own steps (the preset, a narrow width, and what their cost line predicts);
kept for the session once chosen; the report says why."""
from __future__ import annotations

import pytest

from spec_ar.loaders.synthetic import SyntheticAdapter
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder, window
from spec_ar.sampling.window import Acceptance, CostLine, Trial

FLAT = {w: 0.010 for w in window.CANDIDATES}  # a memory-bound GPU: every width costs one read of the weights
LINEAR = {w: 0.004 + 0.004 * (w + 1) for w in window.CANDIDATES}  # a compute-bound CPU batch: each row costs
FULL = {w: 0.001 * (w + 1) for w in window.CANDIDATES}  # every row costs its full share: no window pays


def run_trial(costs, preset=24, batch=1, tokens=None, stall=None, forwards=window.TRIAL):
    """A trial on a device of ``costs`` (seconds by width), the windows committing what ``tokens``
    predicts (default: the embedded model's 6 tokens per forward at 24, ``Acceptance.at``);
    ``stall``: (width, step, seconds) lost once."""
    tokens = tokens or Acceptance(6.0, 24).at
    trial, ran = Trial(preset, Acceptance(6.0, 24), batch, forwards=forwards), []
    while trial.open:
        w = trial.width
        n = len(trial.steps[w])
        ran.append(w)
        seconds = costs[w] + (stall[2] if stall and (w, n) == stall[:2] else 0.0)
        trial.record(seconds, True, tokens(w))
    return trial, ran


def test_a_memory_bound_device_keeps_a_wide_window():
    trial, ran = run_trial(FLAT)
    assert trial.kept >= 24 and ran[:2 * window.TRIAL] == [24, 2] * window.TRIAL  # by turns, step by step
    assert trial.reason.startswith(f"window {trial.kept} on auto: tried in this decode by turns with window 24, "
                                   "6 forwards each (window 24: 10.00 ms and 6.00 tokens per forward; window 2: "
                                   "10.00 ms and")


def test_a_compute_bound_device_narrows_the_window():
    trial, _ = run_trial(LINEAR)
    assert trial.kept <= 4 and "x the tokens per second of window 24" in trial.reason


def test_where_no_window_pays_plain_ar_steps_are_tried_and_kept():
    for batch in (1, 8):
        trial, ran = run_trial(FULL, batch=batch)
        assert set(ran) == {24, 2, 0} and trial.kept == 0
        assert trial.reason.startswith("window 0 on auto: plain AR steps, tried in this decode")
        assert "predicted window 0 fastest" in trial.reason


def test_the_cost_line_runs_through_the_widths_measured_and_never_falls():
    line = CostLine.through({24: 0.104, 2: 0.016})
    assert line.at(24) == pytest.approx(0.104) and line.at(2) == pytest.approx(0.016)
    assert line.at(0) == pytest.approx(0.008)
    flat = CostLine.through({24: 0.010, 2: 0.012})  # the narrow width met a stall: no width is cheaper for more rows
    assert flat.per_row == 0.0 and flat.at(32) == pytest.approx(0.012)


def test_the_preset_stays_unless_another_width_is_clearly_faster():
    nearly = {**FLAT, 2: 0.0025}  # window 2 a quarter of 24's cost: 2.31 / 6 tokens a forward, 1.54x per second
    assert run_trial(nearly)[0].kept == 2
    close = {**FLAT, 2: 0.0037}  # 1.04x: less than the gain a width needs
    assert run_trial(close)[0].kept == 24


@pytest.mark.parametrize("stall_at", [(24, 0), (24, 4), (2, 1), (2, 5), (0, 2)])
def test_a_stall_during_a_trial_changes_no_choice(stall_at):
    """A second lost in one step, in either half of any width's steps: each half's cost is a
    median, and a width is kept only when both halves agree."""
    for costs in (FLAT, LINEAR, FULL):
        assert run_trial(costs, stall=(*stall_at, 1.0))[0].kept == run_trial(costs)[0].kept


def test_one_slow_stretch_does_not_move_the_decode_to_plain_ar_steps():
    """The issue's busy machine, where a window costs about what one token does: the window's
    first half of steps met a busy neighbour, the narrow width's and plain AR steps' did not.
    Both halves must agree before the preset is left, so window 24 stays."""
    trial = Trial(24, Acceptance(6.0, 24), batch=1)
    while trial.open:
        w = trial.width
        slow = w == 24 and len(trial.steps[24]) < window.TRIAL // 2
        trial.record(0.090 if slow else 0.010, True, Acceptance(6.0, 24).at(w))
    assert trial.kept == 24 and "as no width ran 1.05x faster than it in both halves" in trial.reason


@pytest.mark.parametrize("costs", [FLAT, LINEAR, FULL])
def test_a_busy_stretch_slows_every_width_alike(costs):
    """A decode started while the machine was still busy: its first steps, whatever their width,
    took three times as long.  The widths take turns step by step, so each met the stretch in its
    first half and the quiet machine's choice stands (run in blocks, the preset's block alone met
    it, and on a flat device window 2 was kept)."""
    trial, step = Trial(24, Acceptance(6.0, 24), batch=1), 0
    while trial.open:
        w = trial.width
        trial.record(costs[w] * (3.0 if step < window.TRIAL else 1.0), True, Acceptance(6.0, 24).at(w))
        step += 1
    assert trial.kept == run_trial(costs)[0].kept


def test_a_batch_waits_for_its_slowest_image():
    spread = [window.straggle(b) for b in (1, 2, 8, 32)]
    assert spread[0] == 0.0 and spread == sorted(spread)
    assert spread[2] == pytest.approx(1.42 * window.SPREAD, rel=0.02)  # the largest of 8 normal draws: 1.42 sd


def test_the_slowest_image_narrows_a_window_whose_forwards_cost():
    between = {w: 0.010 + 0.0006 * (w + 1) for w in window.CANDIDATES}  # fixed cost, and 0.6 ms a row
    assert run_trial(between, batch=1)[0].kept == 24
    narrow = run_trial(between, batch=32)[0]
    assert narrow.kept < 24
    assert run_trial(FLAT, batch=64)[0].kept >= 24  # a forward costs the same: stays wide


def test_acceptance_is_what_was_observed_at_its_width_and_grows_with_it():
    a = Acceptance(4.0, 16)
    assert a.at(16) == pytest.approx(4.0)
    values = [a.at(w) for w in window.CANDIDATES if w]
    assert values == sorted(values) and values[0] > 1.0
    assert a.at(0) == 1.0  # plain AR steps: one token per forward
    assert Acceptance(1.0, 16).at(32) == 1.0  # nothing accepted: nothing predicted


def test_steps_without_a_forward_count_in_their_width_s_cost():
    trial = Trial(24, Acceptance(6.0, 24), batch=1, forwards=4)
    for _ in range(4):  # (the width changes only after a forward: a skip commits what the forward before planned)
        assert trial.record(0.002, False, 5.0) is None  # a VVS skip: tokens without a forward
        trial.record(0.010 if trial.width == 24 else 0.004, True, 6.0)
    assert trial.cost(24) == pytest.approx(0.012) and trial.tokens[24] == pytest.approx(22.0)
    assert trial.cost(2) == pytest.approx(0.006) and trial.tokens[2] == pytest.approx(22.0)


# -- in the engine --------------------------------------------------------------------------------------------------

class SimulatedDevice:
    """A device behind the window's clock: each forward of the model costs ``costs[w]``, ``w``
    the least width there that holds its drafts (its tokens less one)."""

    def __init__(self, model, costs):
        self.now, self.costs = 0.0, costs
        forward = model.forward

        def timed_forward(tokens, *args, **kwargs):
            drafts = next((w for w in sorted(self.costs) if w >= tokens.shape[-1] - 1), max(self.costs))
            self.now += self.costs[drafts]
            return forward(tokens, *args, **kwargs)

        self.forward = timed_forward


@pytest.fixture()
def device(monkeypatch):
    def install(model, costs):
        simulated = SimulatedDevice(model, costs)
        monkeypatch.setattr(model, "forward", simulated.forward)
        monkeypatch.setattr(window, "now", lambda: simulated.now)
        return simulated
    return install


@pytest.fixture()
def model():
    return SyntheticAdapter(codebook=64, rows=6, cols=6, end_of_line=True, sharpness=1.5, seed=1)


@pytest.fixture()
def long_model():  # long enough for a trial of three widths (window.TRIAL forwards each) and more
    return SyntheticAdapter(codebook=64, rows=16, cols=16, end_of_line=False, sharpness=3.0, seed=2)


def test_a_decode_on_auto_tries_widths_once_per_batch_and_reports_why(long_model, device):
    device(long_model, LINEAR)
    decoder = SpeculativeDecoder(long_model, DecodeConfig(mode="sjd"))
    first = decoder.generate([0, 1], seeds=3).reports[0]
    assert first.window_choice.startswith(f"window {first.settings['window']} on auto: tried in this decode")
    assert first.settings["window"] <= 4 and "(auto)" in first.summary()
    one = decoder.generate([0], seeds=4).reports[0]
    assert "tried in this decode" in one.window_choice  # another batch size: tried anew
    again = decoder.generate([0, 1], seeds=4).reports[0]
    assert again.window_choice.endswith("(kept from this session's first decode at this batch)")


def test_a_short_decode_ends_during_its_trial_and_says_so(model, device):
    device(model, LINEAR)
    report = SpeculativeDecoder(model, DecodeConfig(mode="sjd")).generate([0, 1], seeds=3).reports[0]
    assert "the decode ended during its trial" in report.window_choice


def test_the_same_settings_and_seed_give_the_same_image_again(long_model, device):
    """Once the first decode at a batch size has tried its widths, the width kept holds for the
    session: every later decode with the same settings and seed gives the same image."""
    simulated = device(long_model, LINEAR)
    decoder = SpeculativeDecoder(long_model, DecodeConfig(mode="sjd"))
    trial, again = (decoder.generate([0, 1], seeds=9) for _ in range(2))
    simulated.costs = FLAT  # the machine changed: the session keeps what it kept
    third = decoder.generate([0, 1], seeds=9)
    assert "tried in this decode" in trial.reports[0].window_choice
    assert (again.tokens == third.tokens).all()
    assert again.reports[0].window_choice == third.reports[0].window_choice


def test_which_steps_run_which_width_depends_on_counts_only(long_model, device):
    """Two sessions whose devices keep the same width give the same first image: the trial's
    steps switch width after forward counts, not times."""
    images = []
    for costs in (LINEAR, {w: 2 * c for w, c in LINEAR.items()}):
        decoder = SpeculativeDecoder(SyntheticAdapter(codebook=64, rows=16, cols=16, end_of_line=False,
                                                      sharpness=3.0, seed=2), DecodeConfig(mode="sjd"))
        device(decoder.base_adapter, costs)
        images.append(decoder.generate([0, 1], seeds=9))
    assert images[0].reports[0].settings["window"] == images[1].reports[0].settings["window"]
    assert (images[0].tokens == images[1].tokens).all()


def test_a_set_window_is_kept_and_nothing_is_tried(model, monkeypatch):
    monkeypatch.setattr(window, "Trial", lambda *a, **k: pytest.fail("tried a set window"))
    report = SpeculativeDecoder(model, DecodeConfig(mode="sjd", window=5)).generate([0], seeds=1).reports[0]
    assert report.settings["window"] == 5 and report.window_choice == ""


def test_the_width_kept_gives_the_tokens_of_that_width_set_by_hand(long_model, device):
    device(long_model, LINEAR)
    decoder = SpeculativeDecoder(long_model, DecodeConfig(mode="sjd"))
    decoder.generate([0, 1], seeds=6)  # tries widths, and keeps one
    auto = decoder.generate([0, 1], seeds=7)
    width = auto.reports[0].settings["window"]
    assert width <= 4
    by_hand = SpeculativeDecoder(long_model, DecodeConfig(mode="sjd", window=width)).generate([0, 1], seeds=7)
    assert (auto.tokens == by_hand.tokens).all()


@pytest.mark.parametrize("mode", ["sjd", "gsd", "lantern"])
def test_plain_ar_steps_on_auto_give_the_image_ar_gives(long_model, device, mode):
    device(long_model, FULL)  # every row costs its full share: no window pays
    relaxed = {"lantern_k": 10} if mode == "lantern" else {}
    decoder = SpeculativeDecoder(long_model, DecodeConfig(mode=mode, **relaxed))
    tried = decoder.generate([0, 1], seeds=[5, 6]).reports[0]
    assert tried.settings["window"] == 0 and "kept 0" in tried.window_choice
    auto = decoder.generate([0, 1], seeds=[7, 8])
    ar = SpeculativeDecoder(long_model, DecodeConfig(mode="ar")).generate([0, 1], seeds=[7, 8])
    assert (auto.tokens == ar.tokens).all()
    report = auto.reports[0]
    assert report.nfe == report.tokens and report.settings["window"] == 0
    assert "plain AR steps" in report.summary() and report.window_choice.startswith("window 0 on auto")


@pytest.mark.parametrize("schedule", ["uniform", "similarity"])
def test_a_skipping_schedule_keeps_the_preset_whatever_the_device(long_model, device, schedule):
    """VVS commits the window's tail unverified: a narrow window would commit drafts made from a
    rejected context (FD to ar 185.6 at window 2 against 52.3 at 24), so nothing is tried."""
    device(long_model, FULL)
    report = SpeculativeDecoder(long_model, DecodeConfig(mode="vvs", lantern_k=10, schedule=schedule)).generate(
        [0, 1], seeds=3).reports[0]
    assert report.settings["window"] == 24 and report.window_choice.startswith("window 24 on auto: the preset, kept")
    assert report.skipped_verifications > 0


@pytest.mark.parametrize("trees", [{"proactive": 2}, {"rows": 2}])
def test_trees_beside_the_window_keep_the_preset(device, trees):
    from spec_ar.loaders import embedded

    model = embedded.load(embedded.FOLDER)
    device(model.adapter, FULL)
    report = SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd", **trees)).generate(
        ["a red circle"], seeds=3).reports[0]
    what = "proactive" if "proactive" in trees else "row-parallel"
    assert report.settings["window"] == 24 and f"kept for the {what} drafts" in report.window_choice
