"""The knob table is the one declaration of every decoding setting: each surface
shows every knob, under the same name and range."""
from __future__ import annotations

import argparse
import math
import re
from dataclasses import fields

import pytest

from spec_ar.bench.sweeps import parse_sweep, sweep_keys
from spec_ar.cli.options import decoding_options, literal
from spec_ar.nodes import common
from spec_ar.sampling.config import KNOBS, SURFACES, ConfigError, DecodeConfig, check


def cli_options() -> dict[str, argparse.Action]:
    ap = argparse.ArgumentParser()
    decoding_options(ap)
    return {a.dest: a for a in ap._actions if a.option_strings}


def test_every_field_but_the_mode_and_the_draft_source_is_a_knob():
    # ``drafter`` names the attached draft model; the engine sets it, no surface does
    assert [f.name for f in fields(DecodeConfig) if f.name != "drafter"] == ["mode", *KNOBS]


@pytest.mark.parametrize("name", list(KNOBS))
def test_each_knob_is_on_the_command_line_with_its_choices(name):
    k, action = KNOBS[name], cli_options()[name]
    assert action.option_strings == [k.option] and literal(k.help) in action.help
    if k.choices:
        assert list(action.choices) == [c for c in k.choices if c is not None]
    else:
        assert k.range_text() in action.help


@pytest.mark.parametrize("name", list(KNOBS))
def test_each_knob_is_a_sweep_key_with_the_same_range(name):
    k = KNOBS[name]
    mode = {"grouped": "gsd", "latent": "lantern", "uniform": "vvs"}.get(k.uses[0], "sjd")
    assert name in sweep_keys()[k.symbol] and name in sweep_keys()[name]
    good = (k.choices[-1] if k.choices else "tree.json" if k.kind == "str" else k.lo)
    extra = ";schedule=similarity" if "similarity" in k.uses else ""
    (_, config), = parse_sweep(f"{mode}:{name}={good}{extra}")
    assert getattr(config, name) == good
    if not k.choices and k.kind != "str":
        with pytest.raises(ConfigError, match=f"^{name} must be an? (integer|number) {re.escape(k.range_text())}"):
            parse_sweep(f"{mode}:{name}={k.lo - 1}")


@pytest.mark.parametrize("name", [n for n, k in KNOBS.items() if k.widget])
def test_each_shown_knob_is_a_sampler_widget_with_the_same_range(name):
    k = KNOBS[name]
    w = {w["field"]: w for w in common.sampler_widgets()}[name]
    assert w["label"] == k.label and w["uses"] == list(k.uses) and k.help in w["tooltip"]
    assert f"Symbol {k.symbol}; {k.range_text()}" in w["tooltip"]  # what the node's tooltip shows of the table
    if k.choices:
        assert [o for o in w["options"] if o != common.AUTO] == [c for c in k.choices if c is not None]
    else:
        assert w["max"] == k.hi and w["min"] in (k.lo, 0) and w["step"] == (k.step or 1)
        assert w["min"] == k.lo or w.get("off") == 0  # an optional integer shows "off" as 0


@pytest.mark.parametrize("name", list(KNOBS))
def test_errors_name_the_knob_as_each_surface_shows_it(name):
    k = KNOBS[name]
    bad = ("no such choice" if k.choices else 7 if k.kind == "str"
           else k.lo - 1 if k.lo is not None and k.lo > -math.inf else "x")
    for surface in SURFACES:
        with pytest.raises(ConfigError, match=f"^{k.shown_as(surface)} must be "):
            check(k, bad, surface)
    assert {k.shown_as(s) for s in SURFACES} == {k.name, k.option, k.label}


def test_labels_use_the_symbols():
    assert DecodeConfig(mode="gsd", group_size=50).label() == "gsd G=50 delta=0.15"
    assert DecodeConfig(mode="lantern").label() == "lantern k=300 delta=0.1"
    assert DecodeConfig(mode="gsd", schedule="similarity").label() == "gsd schedule=similarity G=10 delta=0.15 tau=0.7"
    assert DecodeConfig(mode="sjd").label() == "sjd" and DecodeConfig(mode="sjd", window=32).label() == "sjd L=32"


def settings_table() -> str:
    """The settings table of docs/settings.md, as the knob table declares it."""
    rows = ["| setting | option | node widget | symbol | default | allowed | what it does |",
            "|---|---|---|---|---|---|---|"]
    for f in fields(DecodeConfig):
        if f.name not in KNOBS:
            continue
        k = KNOBS[f.name]
        default = "the mode's" if f.name in ("acceptance", "schedule") else k.unset if k.unset else (
            "the family's" if k.uses == ("always",) else ("off" if f.default is None else f"`{f.default}`"))
        allowed = k.range_text().replace("|", "\\|")
        rows.append(f"| `{k.name}` | `{k.option}` | {k.label if k.widget else '-'} | {k.symbol} | {default} | "
                    f"{allowed} | {k.help.replace('|', '/')} |")
    return "\n".join(rows)


def test_the_docs_list_every_knob_as_the_table_declares_it():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "settings.md").read_text()
    assert settings_table() in page, "docs/settings.md's table is stale; it should read:\n" + settings_table()
