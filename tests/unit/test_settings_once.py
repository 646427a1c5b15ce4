"""Settings' defaults, the knobs they give and the integer parsing of every edge are each defined once
(copies drift apart): config.INTS holds each integer setting's variable, default and bounds; Settings,
from_env and ops.context.Knobs read it; settings, CLI arguments and job arguments all parse with model.parse_int."""
from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

import pytest

from tiering import config
from tiering.cli import args as cli
from tiering.errors import ConfigError
from tiering.jobs import spec
from tiering.model import BadInt, parse_int
from tiering.ops.context import Knobs

BASE = {"TIERING_DATABASE_URL": "postgresql://u@h/d", "TIERING_BUCKET": "bkt", "TIERING_TIER1_ROOT": "/tmp/x"}


def test_the_knobs_of_default_settings_are_the_default_knobs():
    s = config.Settings.from_env(BASE)
    assert Knobs.from_settings(s) == Knobs()
    assert {f.name: getattr(s, f.name) for f in fields(s) if f.name in config.INTS} == \
        {name: i.default for name, i in config.INTS.items()}


@pytest.mark.parametrize("name", sorted(config.INTS))
def test_each_integer_setting_is_parsed_from_its_variable_within_its_bounds(name):
    i = config.INTS[name]
    assert getattr(config.Settings.from_env({**BASE, i.var: str(i.lo)}), name) == i.lo
    assert getattr(config.Settings.from_env({**BASE, i.var: str(i.hi)}), name) == i.hi
    for bad in (str(i.lo - 1), str(i.hi + 1), "1_0", " 1", "\u0661"):
        with pytest.raises(ConfigError) as err:
            config.Settings.from_env({**BASE, i.var: bad})
        assert str(err.value).startswith(f"{i.var} must be")  # the variable named, never its value


@pytest.mark.parametrize("text,reason", [("x", "syntax"), ("1.0", "syntax"), ("-2", "low"), ("9" * 30, "high"),
                                         ("-" + "9" * 30, "low"), ("11", "high")])
def test_one_parser_three_phrasings(text, reason):
    with pytest.raises(BadInt) as err:
        parse_int(text, "n", -1, 10)
    assert err.value.reason == reason
    with pytest.raises(argparse.ArgumentTypeError) as cli_err:
        cli._int(text, -1, 10)
    assert {"syntax": "not an integer", "low": "is negative", "high": "too large"}[reason] in str(cli_err.value)
    with pytest.raises(argparse.ArgumentTypeError):
        spec.int_arg("--n", -1, 10)(text)
    with pytest.raises(ConfigError, match="TIERING_N must be " + ("an integer" if reason == "syntax" else "from")):
        config._int(text, "TIERING_N", 0, -1, 10)
