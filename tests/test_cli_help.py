"""``--help`` works for every ``spec-ar`` command and subcommand, and its text
shows every setting the knob table declares, as the README promises: each knob's
option with its help and range on ``render``, each sweep key on ``bench``.

(argparse formats help strings with ``%``, so a knob help that says "11 % more"
broke ``spec-ar render --help``: these tests run the real parsers' help.)"""
from __future__ import annotations

import contextlib
import io
import re

import pytest

from spec_ar.bench.sweeps import knob_keys, sweep_keys
from spec_ar.cli import PASSTHROUGH, build_parser, main
from spec_ar.sampling.config import KNOBS, MODE_HELP


def help_text(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0, f"spec-ar {' '.join(argv)} --help failed: {err.getvalue()}"
    assert "usage:" in out.getvalue() and not err.getvalue()
    return flat(out.getvalue())


def flat(text: str) -> str:
    """Words as argparse rewraps them, whatever the terminal's width: lines joined,
    and a line broken after a hyphen joined without a space."""
    return re.sub(r"- ", "-", " ".join(text.split()))


def commands() -> list[tuple[str, ...]]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return [(), *((name,) for name in sub.choices), ("bench", "overhead"), ("bench", "storage"), ("bench", "gpu")]


def test_every_command_is_listed():
    assert set(PASSTHROUGH) <= {c[0] for c in commands() if c}
    assert {"demo", "render"} <= {c[0] for c in commands() if c}


@pytest.mark.parametrize("argv", commands(), ids=lambda c: " ".join(c) or "spec-ar")
def test_help_works_for_every_command(argv):
    assert help_text(*argv)


def test_render_help_shows_every_knob_with_its_help_and_range():
    text = help_text("render")
    for k in KNOBS.values():
        assert k.option in text and flat(k.help) in text, k.name
        if not k.choices:
            assert flat(k.range_text()) in text, k.name
    for mode, mode_help in MODE_HELP.items():
        assert flat(f"{mode}: {mode_help}") in text


def test_bench_help_lists_every_sweep_key_with_its_knob():
    text = help_text("bench")
    for k in KNOBS.values():
        assert flat(f"{', '.join(knob_keys(k))}: {k.help} ({k.range_text()})") in text, k.name
    assert {key for k in KNOBS.values() for key in knob_keys(k)} == set(sweep_keys())
