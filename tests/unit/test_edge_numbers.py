"""Positions and sizes at every edge (CLI, Airflow Params, job arguments, settings) take ASCII digits only,
within bounds. Python's int() also takes Unicode digits ("١٠", "５"), surrounding whitespace
(including "\\v") and "_"; re's `$` matches before a trailing newline. A property test feeds every parser
strings of ASCII and non-ASCII digits, signs, whitespace and separators, and huge numbers, and checks each
against an oracle that spells out the rule without regular expressions."""
from __future__ import annotations

import argparse

import jsonschema
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tiering import config
from tiering.cli import args as cli
from tiering.errors import BadInput, ConfigError
from tiering.jobs import spec
from tiering.model import INT64_MAX, MAX_SECONDS, Position, check_subscription_name, check_topic_name, parse_int

ASCII = "0123456789"
# digits of other scripts, signs, whitespace Python's strip()/int() accept, separators
ODD = ["\u0661", "\u0660", "\u0665", "\uff11", "\uff10", "\u09e7", "\U0001d7ce", "+", "-", "_", " ", "\t", "\n",
       "\v", "\f", "\r", "\x85", "\u00a0", "\u2028", "\u3000", ":", ".", "e", "x"]
chars = st.sampled_from(list(ASCII) + ODD)
numberish = st.one_of(
    st.text(chars, max_size=25),
    st.integers(-10**40, 10**40).map(str),  # huge and negative values in plain ASCII
    st.tuples(st.integers(-10**40, 10**40).map(str), st.sampled_from(["", "\n", "\v", " ", "\u0660"]),
              st.sampled_from(["", " ", "+", "\u0661"])).map(lambda t: t[2] + t[0] + t[1]),
)
positionish = st.one_of(
    st.text(chars, max_size=40),
    st.tuples(numberish, numberish).map(lambda t: f"{t[0]}:{t[1]}"),
    st.tuples(st.integers(0, 10**20), st.integers(0, 10**20), st.sampled_from(["", "\n", " ", "\v"]))
    .map(lambda t: f"{t[0]}:{t[1]}{t[2]}"),
)


def ascii_int(text: str, lo: int, hi: int) -> int | None:
    """The oracle: an optional '-' then ASCII digits only, within [lo, hi]; None when refused. A negative
    spelling must be the number's own ('-0', '-01' are refused: one spelling each for 0 and -1)."""
    body = text[1:] if text.startswith("-") else text
    if not body or any(c not in ASCII for c in body):
        return None
    value = int(text)
    if text.startswith("-") and text != str(value):
        return None
    return value if lo <= value <= hi else None


def ascii_position(text: str) -> Position | None:
    parts = text.split(":")
    if len(parts) != 2 or not all(1 <= len(p) <= 18 and all(c in ASCII for c in p) for p in parts):
        return None
    return Position(int(parts[0]), int(parts[1]))


def outcome(fn, text):
    try:
        return fn(text)
    except (BadInput, ConfigError, argparse.ArgumentTypeError):
        return None


@pytest.mark.parametrize("text", ["all", "all\n", "ALL", " all", "all:0", "al"])
def test_offload_prefix_takes_all_and_nothing_like_it(text):
    ok = text == "all"
    assert (spec.prefix_position_arg(text) == "all") if ok else outcome(spec.prefix_position_arg, text) is None
    assert outcome(spec.position_arg, text) is None  # any other job's position stays L:E
    args = outcome(lambda t: spec.spark_submit_args("tiering_offload_prefix", topic="t", position=t), text)
    assert args == (["--prefix=t", "--position=all"] if ok else None)


@settings(max_examples=600, deadline=None)
@given(positionish)
def test_positions_accept_ascii_digits_only(text):
    want = ascii_position(text)
    assert outcome(Position.parse, text) == want
    assert outcome(spec.position_arg, text) == want
    assert outcome(cli._position, text) == want
    # the Airflow form: Params are validated with jsonschema, i.e. Python's re.search; offloadPrefix's form
    # also takes "all" (every sealed ledger)
    for pattern, also in ((spec.POSITION_PATTERN, False), (spec.PREFIX_POSITION_PATTERN, text == spec.ALL_SEALED)):
        try:
            jsonschema.validate(text, {"type": "string", "pattern": pattern})
            form_ok = True
        except jsonschema.ValidationError:
            form_ok = False
        assert form_ok == (want is not None or also)
    args = outcome(lambda t: spec.spark_submit_args("tiering_offload_prefix", topic="t", position=t), text)
    assert args == (None if want is None and text != spec.ALL_SEALED else ["--prefix=t", f"--position={text}"])


@settings(max_examples=600, deadline=None)
@given(numberish)
@example("-0")
@example("-01")
@example("-1")
def test_sizes_and_seconds_accept_bounded_ascii_digits_only(text):
    assert outcome(lambda t: parse_int(t, "n", 0, INT64_MAX), text) == ascii_int(text, 0, INT64_MAX)
    assert outcome(cli._nonneg, text) == ascii_int(text, 0, INT64_MAX)
    assert outcome(cli._positive, text) == ascii_int(text, 1, INT64_MAX)
    assert outcome(cli._policy_int, text) == ascii_int(text, -1, INT64_MAX)
    assert outcome(cli._seconds, text) == ascii_int(text, 0, MAX_SECONDS)
    assert outcome(cli._policy_seconds, text) == ascii_int(text, -1, MAX_SECONDS)
    assert outcome(spec.int_arg("--small-bytes", 1, INT64_MAX), text) == ascii_int(text, 1, INT64_MAX)
    got = outcome(lambda t: config._int(t, "TIERING_X", 7, 0, MAX_SECONDS), text)
    assert got == (7 if text == "" else ascii_int(text, 0, MAX_SECONDS))


@pytest.mark.parametrize("text", ["١:٠", "１:０", "1:0\v", "1:0\n", " 1:0", "1:0 ", "+1:0", "1_0:0", "1:0\x00"])
def test_the_reported_edge_numbers_are_refused(text):
    with pytest.raises(BadInput):
        Position.parse(text)


@pytest.mark.parametrize("name", ["a\nb", "tab\there", "cr\r", "bell\x07", "del\x7f", "c1\x85", "ls\u2028", "esc\x1b[2J"])
def test_control_characters_in_new_topic_names_are_refused(name):
    with pytest.raises(BadInput, match="control characters"):
        check_topic_name(name)
    check_topic_name(name, existing=True)  # a topic created before stays reachable
    try:
        jsonschema.validate(name, {"type": "string", "pattern": spec.TOPIC_PATTERN})
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError(f"the Airflow form accepts {name!r}")
    with pytest.raises(BadInput):
        spec.spark_submit_args("tiering_retention", topic=name)


@pytest.mark.parametrize("name", ["orders", "日本語 тема 🎉", "a b", "-dash", "q'uo\"te"])
def test_printable_names_still_pass(name):
    assert check_topic_name(name) == name
    jsonschema.validate(name, {"type": "string", "pattern": spec.TOPIC_PATTERN})


@pytest.mark.parametrize("env,message", [
    ({"TIERING_BLOCK_SIZE": "9" * 30}, "below 2 GiB"),
    ({"TIERING_BLOCK_SIZE": "\u0665" * 8}, "ASCII digits"),
    ({"TIERING_BLOCK_SIZE": str(6 * 1024**3)}, "below 2 GiB"),
    ({"TIERING_BLOCK_SIZE": "2GiB"}, "below 2 GiB"),  # the index's block_size is an int32
    ({"TIERING_PAGE_SIZE": "2GiB"}, "TIERING_PAGE_SIZE must be from 4096 to 2147483647"),
    ({"TIERING_UPLOAD_CONCURRENCY": "1000"}, "from 1 to 64"),
    ({"TIERING_OFFLOAD_TIMEOUT_SECONDS": "0"}, "TIERING_OFFLOAD_TIMEOUT_SECONDS must be from 1"),
    ({"TIERING_OFFLOAD_TIMEOUT_SECONDS": "1e40"}, "ASCII digits"),
    ({"TIERING_GC_DELAY_SECONDS": "-1"}, "TIERING_GC_DELAY_SECONDS must be from 0"),
    ({"TIERING_GC_DELAY_SECONDS": "1" + "0" * 40}, "TIERING_GC_DELAY_SECONDS must be from 0"),
])
def test_settings_are_bounded(env, message, tmp_path):
    base = {"TIERING_DATABASE_URL": "postgresql://u@h/db", "TIERING_BUCKET": "bucket",
            "TIERING_TIER1_ROOT": str(tmp_path)}
    with pytest.raises(ConfigError, match=message):
        config.Settings.from_env({**base, **env})


def test_timeouts_are_settings(tmp_path):
    base = {"TIERING_DATABASE_URL": "postgresql://u@h/db", "TIERING_BUCKET": "bucket",
            "TIERING_TIER1_ROOT": str(tmp_path)}
    s = config.Settings.from_env(base)
    assert (s.offload_timeout_seconds, s.gc_delay_seconds) == (3600, 600)
    s = config.Settings.from_env({**base, "TIERING_OFFLOAD_TIMEOUT_SECONDS": "60", "TIERING_GC_DELAY_SECONDS": "0"})
    assert (s.offload_timeout.total_seconds(), s.gc_delay.total_seconds()) == (60, 0)
    assert config.Settings.from_env(s.to_env()) == s  # what spark-submit's environment carries


def test_a_tier1_root_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    base = {"TIERING_DATABASE_URL": "postgresql://u@h/db", "TIERING_BUCKET": "bucket"}
    for root in (f, f / "below"):
        with pytest.raises(ConfigError, match="TIERING_TIER1_ROOT.* is a file"):
            config.Settings.from_env({**base, "TIERING_TIER1_ROOT": str(root)})
    config.Settings.from_env({**base, "TIERING_TIER1_ROOT": str(tmp_path / "not" / "yet")})  # made on first write


@pytest.mark.parametrize("name", ["a\u200bb", "ord\u202eers", "soft\u00adhyphen", "\ufeffbom", "rtl\u200fmark",
                                  "iso\u2066late\u2069", "hangul\u3164filler", " ", "s ", " s", "s\u3000",
                                  # format characters beyond the common ones: a language tag, a musical beam,
                                  # a hieroglyph joiner, a shorthand format control, an Arabic number sign
                                  "tag\U000e0001ged", "beam\U0001d173", "a\U00013430b", "x\U0001bca0y", "n\u0600"])
def test_invisible_and_bidi_characters_in_new_names_are_refused(name):
    # such a name prints like another one ("a\u200bb" as "ab"), so two topics could look the same
    with pytest.raises(BadInput, match="invisible or bidirectional|begin or end with whitespace"):
        check_topic_name(name, new=True)
    with pytest.raises(BadInput, match="invisible or bidirectional|begin or end with whitespace"):
        check_subscription_name(name, new=True)
    assert check_topic_name(name) == name  # one created before stays reachable
    assert check_subscription_name(name) == name


def test_new_names_must_be_nfc():
    decomposed, composed = "cafe\u0301", "caf\u00e9"
    with pytest.raises(BadInput, match="NFC"):
        check_topic_name(decomposed, new=True)
    with pytest.raises(BadInput, match="NFC"):
        check_subscription_name(decomposed, new=True)
    assert check_topic_name(composed, new=True) == composed
    assert check_topic_name(decomposed) == decomposed


@pytest.mark.parametrize("name", ["\U0001f468\u200d\U0001f469\u200d\U0001f467", "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
                                  "\u65e5\u672c\u8a9e \u0442\u0435\u043c\u0430 \U0001f389",
                                  # the flag of Scotland: a black flag and tag characters ending in CANCEL TAG
                                  "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"])
def test_joiners_scripts_and_emoji_pass_as_new_names(name):
    assert check_topic_name(name, new=True) == name


def test_a_topic_name_is_at_most_2048_bytes_of_utf8():
    four = "\U0001F600"  # four bytes in UTF-8
    assert check_topic_name(four * 512, new=True) == four * 512  # 2,048 bytes: the most the index takes
    for name in (four * 513, four * 1024):  # within 1,024 characters, past 2,048 bytes
        with pytest.raises(BadInput, match="at most 2048 bytes of UTF-8"):
            check_topic_name(name, new=True)
        with pytest.raises(BadInput, match="at most 2048 bytes"):
            check_topic_name(name, existing=True)  # none can exist: a lookup says so, not the database
