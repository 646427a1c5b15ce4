"""Durations and sizes with units (tiering/units.py), at every edge: CLI flags, settings, job arguments."""
from __future__ import annotations

import argparse

import pytest

from tiering import config
from tiering.cli import args as cli
from tiering.errors import ConfigError
from tiering.jobs import spec
from tiering.model import BadInt, INT64_MAX, MAX_SECONDS
from tiering.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("15m", 900), ("4h", 14400), ("7d", 604800), ("2w", 1209600),
                                          ("1.5h", 5400), ("3600", 3600), ("0", 0), ("4 h", 14400), ("4H", 14400)])
def test_durations(text, seconds):
    assert parse_duration(text, "x", 0, MAX_SECONDS) == seconds


@pytest.mark.parametrize("text,size", [("512KiB", 512 * 1024), ("64MiB", 64 * 2**20), ("10GB", 10 * 10**9),
                                       ("1TiB", 2**40), ("10G", 10 * 2**30), ("64mib", 64 * 2**20), ("0.5KiB", 512),
                                       ("123", 123), ("1B", 1), ("10 MB", 10**7)])
def test_sizes(text, size):
    assert parse_size(text, "x", 0, INT64_MAX) == size


@pytest.mark.parametrize("text", ["4x", "1.5", "-1h", "1.0000001h", "\u0661\u0660", "+5", "5_0", "1e3", "4h ", " 4h",
                                  "4hh", "", "h", "1.", ".5h", "4h\n", "9" * 70])
def test_refused_durations_name_the_units(text):
    with pytest.raises(BadInt) as exc:
        parse_duration(text, "--retention-time", -1, MAX_SECONDS)
    assert exc.value.reason in ("syntax", "low", "fraction")
    if exc.value.reason == "syntax":
        assert "--retention-time" in str(exc.value) and "90s" in str(exc.value)
    if exc.value.reason == "fraction":
        assert "--retention-time" in str(exc.value) and "whole number of seconds" in str(exc.value)


@pytest.mark.parametrize("text", ["-0", "-00", "-01", "-1.0", "-2"])
def test_only_a_bare_minus_one_is_negative(text):
    # "-0" was 0: the most aggressive retention size or offload threshold, from what reads as "disabled"
    for parse in (parse_duration, parse_size):
        with pytest.raises(BadInt, match=r"must not be negative \(a bare -1 disables it\)"):
            parse(text, "x", -1, MAX_SECONDS)


def test_a_negative_integer_has_one_spelling():
    from tiering.model import parse_int

    assert parse_int("-1", "x", -1, 10) == -1 and parse_int("-12", "x", -20, 10) == -12
    for text in ("-0", "-00", "-01"):
        with pytest.raises(BadInt, match="without '-0' or leading zeros"):
            parse_int(text, "x", -1, 10)


def test_bounds_and_disabled():
    assert parse_duration("-1", "x", -1, MAX_SECONDS) == -1  # a bare -1 keeps meaning disabled
    with pytest.raises(BadInt, match="must not be negative"):
        parse_size("-1KiB", "x", -1, INT64_MAX)
    with pytest.raises(BadInt) as exc:
        parse_size("8EiB", "x", 0, INT64_MAX)
    assert exc.value.reason == "syntax"
    with pytest.raises(BadInt) as exc:
        parse_size("9000000TiB", "x", 0, INT64_MAX)
    assert exc.value.reason == "high"
    assert (format_duration(14400), format_duration(90), format_duration(-1)) == ("4h", "90s", "-1")
    assert (format_size(64 * 2**20), format_size(1000), format_size(-1)) == ("64MiB", "1000", "-1")


def test_cli_flags_take_units_and_say_which():
    assert cli.policy_seconds("4h") == 14400 and cli.policy_seconds("-1") == -1
    assert cli.policy_size("10GB") == 10**10 and cli.size("64MiB") == 64 * 2**20
    assert cli.size_at_least(4096)("4KiB") == 4096
    for kind, text, message in [(cli.policy_seconds, "4x", "90s, 15m, 4h, 7d"), (cli.policy_size, "10QB", "KiB"),
                                (cli.size_at_least(4096), "1", r"too small \(at least 4KiB\)"),
                                (cli.expiry_seconds, "0", "not allowed"),
                                # a number with a unit that only misses whole bytes or seconds is said to
                                (cli.policy_size, "1.3GiB", "'1.3GiB' does not come to a whole number of bytes"),
                                (cli.size, "1.5B", "'1.5B' does not come to a whole number of bytes"),
                                (cli.policy_seconds, "1.5", "'1.5' does not come to a whole number of seconds")]:
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            kind(text)


def test_settings_and_job_arguments_take_units(tmp_path):
    base = {"TIERING_DATABASE_URL": "postgresql://u@h/db", "TIERING_BUCKET": "bucket",
            "TIERING_TIER1_ROOT": str(tmp_path)}
    s = config.Settings.from_env({**base, "TIERING_BLOCK_SIZE": "8MiB", "TIERING_OFFLOAD_TIMEOUT_SECONDS": "2h",
                                  "TIERING_GC_DELAY_SECONDS": "15m", "TIERING_OFFLOAD_MAX_BYTES_PER_SECOND": "10MB"})
    assert (s.block_size, s.offload_timeout_seconds, s.gc_delay_seconds) == (8 * 2**20, 7200, 900)
    assert s.offload_max_bytes_per_second == 10**7
    assert config.Settings.from_env(s.to_env()) == s  # what spark-submit's environment carries: bytes, seconds
    with pytest.raises(ConfigError, match="TIERING_BLOCK_SIZE must be an integer in ASCII digits, or a size") as exc:
        config.Settings.from_env({**base, "TIERING_BLOCK_SIZE": "8 parsecs"})
    assert "parsecs" not in str(exc.value)  # the variable is named, never its value
    with pytest.raises(ConfigError, match="TIERING_BLOCK_SIZE must come to a whole number of bytes$") as exc:
        config.Settings.from_env({**base, "TIERING_BLOCK_SIZE": "1.3MiB"})
    assert "1.3" not in str(exc.value)
    assert spec.size_arg("--small-bytes", 1, INT64_MAX)("8MiB") == 8 * 2**20
    assert spec.duration_arg("--orphan-grace-seconds", 0, 10**9)("2h") == 7200
    assert spec.spark_submit_args("tiering_offload_by_age", max_bytes_per_second="8MiB") == \
        ["--by=age", "--max-bytes-per-second=8388608"]
