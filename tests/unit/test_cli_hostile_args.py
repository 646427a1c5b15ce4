"""Hostile command lines and environments: refused as bad input (one line, exit 2) before any client is
built, and no fragment of a database password in what is printed."""
import argparse
import os
import subprocess
import sys

import pytest

from tiering.cli import main as cli
from tiering.cli.output import error, redact


def _refused(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tiering: error: "), captured.err
    assert "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize("command", ["create", "set"])
@pytest.mark.parametrize("flags", [("--retain-unread", "--no-retain-unread"), ("--no-retain-unread", "--retain-unread"),
                                   ("--retain-unread", "--retain-unread"),
                                   ("--no-retain-unread", "--no-retain-unread")])
def test_a_boolean_pair_given_twice_is_refused(capsys, command, flags):
    line = _refused(capsys, ["topic", command, "t", *flags])
    assert "--retain-unread" in line and "more than once" in line


@pytest.mark.parametrize("flag, value", [("--retain-unread", True), ("--no-retain-unread", False)])
def test_a_boolean_pair_given_once_is_taken(flag, value):
    args = cli.build_parser().parse_args(["topic", "set", "t", flag])
    assert args.retain_unread is value
    assert cli.build_parser().parse_args(["topic", "set", "t"]).retain_unread is None


def test_every_boolean_pair_of_the_command_is_once_only():
    """A BooleanOptionalAction added anywhere (a subcommand, a group) goes through the once-only rule."""
    found = []

    def walk(parser):
        for action in parser._actions:
            if isinstance(action, argparse.BooleanOptionalAction):
                found.append(action)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
    walk(cli.build_parser())
    assert found
    assert all(type(action).__name__.startswith("Once") for action in found), found


@pytest.mark.parametrize("argv, number", [
    (["produce", "t", "--entries", "1", "--entry-size", "8", "--seed", "\udcff"], 8),
    (["export-metadata", "/tmp/\udcff"], 2),
    (["topic", "create", "a\udc80b"], 3),
    (["read", "t", "--from", "0:0\udcc3"], 4),
])
def test_an_argument_that_is_not_utf8_is_refused_by_its_number(capsys, argv, number):
    line = _refused(capsys, argv)
    assert line == f"tiering: error: argument {number} is not valid UTF-8"


def test_non_utf8_bytes_on_a_real_command_line_are_refused_without_echoing_them(tmp_path):
    env = {k: v for k, v in os.environ.items()}
    env["TIERING_DATABASE_URL"] = "postgresql://postgres:pw@127.0.0.1:1/x"
    run = subprocess.run([sys.executable.encode(), b"-m", b"tiering", b"export-metadata",
                          os.fsencode(tmp_path) + b"/\xff"], capture_output=True, env=env, timeout=60)
    assert run.returncode == 2
    assert run.stderr == b"tiering: error: argument 2 is not valid UTF-8\n"
    assert not any(tmp_path.iterdir())


HOSTILE_URL = "postgresql://postgres:abc@SECRETTAIL@127.0.0.1:1/x"


@pytest.mark.parametrize("message", [
    f"cannot connect to {HOSTILE_URL}",
    f"cannot connect to '{HOSTILE_URL}'",
    'could not translate host name "SECRETTAIL@127.0.0.1" to address',  # the driver took the tail for the host
    "password authentication failed: abc@SECRETTAIL",
])
def test_a_password_with_an_unescaped_at_leaves_no_fragment(monkeypatch, capsys, message):
    monkeypatch.setenv("TIERING_DATABASE_URL", HOSTILE_URL)
    error(message)
    err = capsys.readouterr().err
    assert "SECRETTAIL" not in err and "abc" not in err, err
    assert err.startswith("tiering: error: ")


def test_a_normal_url_has_its_user_info_masked(monkeypatch):
    monkeypatch.setenv("TIERING_DATABASE_URL", "postgresql://tiering:s3cr%40t@db.example:5432/tiering")
    shown = redact("at postgresql://tiering:s3cr%40t@db.example:5432/tiering: refused (s3cr@t, s3cr%40t)")
    assert shown == "at postgresql://***@db.example:5432/tiering: refused (***, ***)"


def test_a_password_in_the_urls_query_is_masked(monkeypatch):
    monkeypatch.setenv("TIERING_DATABASE_URL", "postgresql://db.example/t?user=u&password=qu%2Fery&sslpassword=k3y")
    shown = redact("connect to db.example?password=qu%2Fery failed: qu/ery; key k3y")
    assert "qu/ery" not in shown and "qu%2Fery" not in shown and "k3y" not in shown, shown


def test_user_info_of_any_url_is_masked_up_to_its_last_at(monkeypatch):
    monkeypatch.delenv("TIERING_DATABASE_URL", raising=False)
    assert redact("s3 https://key:se@cret@host:9000/b and mysql://u:p/q@h/d") == \
        "s3 https://***@host:9000/b and mysql://***@h/d"
    assert redact("no url here: user@example.com, s3://bucket/key") == "no url here: user@example.com, s3://bucket/key"


def test_a_failed_connection_with_a_hostile_url_prints_no_fragment(tmp_path):
    env = {k: v for k, v in os.environ.items()}
    env["TIERING_DATABASE_URL"] = HOSTILE_URL
    run = subprocess.run([sys.executable, "-m", "tiering", "topic", "list"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 1
    assert len(run.stderr.splitlines()) == 1 and run.stderr.startswith("tiering: error: ")
    assert "SECRETTAIL" not in run.stderr and "abc" not in run.stderr, run.stderr


@pytest.mark.parametrize("argv", [["subscription", "ack", "t", "s", "0:0", "--res"],
                                  ["offload-prefix", "t", "--all"],
                                  ["topic", "create", "t", "--retention-t", "1h"]])
def test_an_abbreviated_option_is_refused(capsys, argv):
    """argparse takes a unique prefix for an option by default: one that names an option today would name
    another, or none, once an option is added."""
    assert "unrecognized arguments" in _refused(capsys, argv)
