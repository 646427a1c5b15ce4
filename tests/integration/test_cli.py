"""The `tiering` command end to end: real subprocesses (`python -m tiering`) against the run's PostgreSQL
database, S3 bucket and a tier-1 root per test. Independent invocations run concurrently to keep the file
fast; setup that is not under test (producing known ledgers) runs in-process."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.helpers import bucket_keys, entries, produce
from tests.support.processes import free_port
from tiering.format.keys import encode_topic, parse_key
from tiering.model import TopicPolicy
from tiering.ops.delete_lagged import delete_lagged
from tiering.ops.offload import offload_many
from tiering.workload import payload

ROOT = Path(__file__).resolve().parents[2]
BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)


@dataclass
class Result:
    args: tuple
    returncode: int
    stdout: str
    stderr: str

    @property
    def json(self):
        return json.loads(self.stdout)

    @property
    def json_lines(self) -> list:
        return [json.loads(line) for line in self.stdout.splitlines()]

    def ok(self) -> "Result":
        assert self.returncode == 0 and self.stderr == "", (self.args, self.returncode, self.stderr)
        return self

    def one_line_error(self, code: int) -> str:
        """Exit `code`, exactly one line on stderr, no traceback; returns that line."""
        assert self.returncode == code, (self.args, self.returncode, self.stdout, self.stderr)
        lines = self.stderr.splitlines()
        assert len(lines) == 1 and self.stderr.endswith("\n"), (self.args, self.stderr)
        assert "Traceback" not in self.stderr and "Traceback" not in self.stdout
        assert lines[0].startswith("tiering"), lines[0]
        return lines[0]


class Cli:
    def __init__(self, env: dict, cwd: Path):
        self.env = env
        self.cwd = cwd

    def __call__(self, *args, stdin: bytes | None = None, env: dict | None = None, unset=()) -> Result:
        full_env = {**self.env, **(env or {})}
        for name in unset:
            full_env.pop(name, None)
        proc = subprocess.run([sys.executable, "-m", "tiering", *args], input=stdin or b"", capture_output=True,
                              env=full_env, cwd=self.cwd, timeout=120)
        return Result(args, proc.returncode, proc.stdout.decode("utf-8", "replace"),
                      proc.stderr.decode("utf-8", "replace"))

    def many(self, calls: list) -> list[Result]:
        """Run independent invocations concurrently; each call is a tuple of args or (args, kwargs)."""
        def one(call):
            args, kwargs = call if isinstance(call, tuple) and len(call) == 2 and isinstance(call[1], dict) \
                else (call, {})
            return self(*args, **kwargs)

        with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
            return list(pool.map(one, calls))


def make_cli(settings, bucket: str, tier1_root, tmp_path) -> Cli:
    """The `tiering` command with the run's settings, run from an empty working directory."""
    env = {**os.environ, **settings.to_env(), "TIERING_TIER1_ROOT": str(tier1_root), "TIERING_BUCKET": bucket,
           "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONWARNINGS", None)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return Cli(env, cwd)


@pytest.fixture
def cli(settings, db, bucket, tier1_root, tmp_path):
    return make_cli(settings, bucket, tier1_root, tmp_path)


def read_data(result: Result | list) -> dict:
    """(ledger, entry) -> payload of a successful `read --json` (or of its lines)."""
    out = {}
    for row in result.ok().json_lines if isinstance(result, Result) else result:
        if "gap" not in row:
            out[(row["ledger"], row["entry"])] = base64.b64decode(row["data"])
    return out


def snapshot(deps) -> tuple:
    """Everything a bad command could have changed: topics, ledgers, chunks, GC queue, files, objects."""
    from sqlalchemy import text

    with deps.meta.engine.connect() as conn:
        tables = [conn.execute(text(f"SELECT * FROM tiering.{t} ORDER BY 1, 2")).all()
                  for t in ("topic", "ledger", "chunk", "gc_task", "job_run", "subscription", "subscription_loss",
                            "topic_tombstone")]
    files = sorted((str(p), p.stat().st_size) for p in Path(deps.tier1.root).rglob("*"))
    return tables, files, sorted(bucket_keys(deps))


# ------------------------------------------------------------------------------------------------------
def test_db_upgrade_is_idempotent(cli):
    first, second = cli("db", "upgrade").ok(), cli("db", "upgrade").ok()
    assert first.stdout == second.stdout
    assert "applied 0 migration(s)" in second.stdout and "already applied" in second.stdout


def test_topics_produce_seal_status_read(cli):
    cli("topic", "create", "orders", "--rollover-entries", "4", "--deletion-lag", "0", "--offload-after", "60").ok()
    shown, listed = cli.many([("topic", "show", "orders", "--json"), ("topic", "list", "--json")])
    topic = shown.ok().json
    assert topic["command"] == "topic show"
    assert topic["topic"] == "orders" and topic["rollover_entries"] == 4 and topic["deletion_lag_seconds"] == 0
    assert topic["offload_after_seconds"] == 60 and topic["retention_bytes"] == -1
    listed = listed.ok().json
    assert listed["command"] == "topic list" and listed["topics"] == [{k: v for k, v in topic.items() if k != "command"}]

    assert cli("produce", "orders", "--entries", "10", "--entry-size", "100", "--seed", "s").ok().stdout == "2:1\n"
    lines = b"alpha\n\ngamma \xce\xb2\ntab\there\n"  # an empty line is an empty entry
    assert cli("produce", "orders", "--stdin-lines", stdin=lines).ok().stdout == "3:1\n"

    status = cli("status", "orders", "--json").ok().json["ledgers"]
    assert [(r["ledger"], r["state"], r["entry_count"], r["bytes"], r["tiers"]) for r in status] == [
        (0, "SEALED", 4, 400, [1]), (1, "SEALED", 4, 400, [1]), (2, "SEALED", 4, 205, [1]),
        (3, "OPEN", 2, 16, [1])]  # the open ledger's counts come from its tier-1 file

    expected = {(i // 4, i % 4): payload("s", i, 100) for i in range(10)}
    expected.update({(2, 2): b"alpha", (2, 3): b"", (3, 0): "gamma β".encode(), (3, 1): b"tab\there"})
    json_read, human, sealed = cli.many([("read", "orders", "--json"), ("read", "orders", "--from", "2:2"),
                                         ("seal", "orders")])
    assert read_data(json_read) == expected
    assert human.ok().stdout == "2:2\talpha\n2:3\t\n3:0\tgamma β\n3:1\ttab\\there\n"
    assert sealed.ok().stdout == "sealed ledger 3 (2 entries)\n"


def _on_a_terminal(cli, *args: str) -> tuple[int, bytes, bytes]:
    """Run `tiering ARGS` with stderr on a pseudo-terminal: (exit code, stdout, what the terminal showed)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "tiering", *args], stdout=subprocess.PIPE, stderr=slave,
                            env=cli.env, cwd=cli.cwd)
    os.close(slave)
    shown = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        shown += data
    os.close(master)
    return proc.wait(timeout=60), proc.stdout.read(), shown


def test_progress_is_shown_only_on_a_terminal(cli, deps):
    deps.meta.create_topic("p", TopicPolicy(**BIG))
    code, stdout, shown = _on_a_terminal(cli, "produce", "p", "--entries", "2000", "--entry-size", "10")
    assert code == 0 and stdout == b"0:1999\n"
    assert b"produce" in shown and b"entry" in shown  # a tqdm bar on the terminal; none in pipes (see .ok())
    cli("seal", "p").ok()
    cli("produce", "p", "--entries", "1", "--entry-size", "10").ok()
    # an offload counts bytes: the bar shows a rate and an ETA
    code, stdout, shown = _on_a_terminal(cli, "offload-prefix", "p", "1:0")
    assert code == 0 and b"offloaded 1 ledger(s)" in stdout, shown[-300:]
    assert b"offload-prefix" in shown and b"B/s" in shown


def test_offload_prefix_delete_lagged_truncate_and_read_back(cli, deps):
    expected = produce(deps, "t", [entries("a", 3, 1000), entries("b", 3, 1000), entries("c", 3, 1000)],
                       TopicPolicy(deletion_lag_seconds=0, **BIG), open_tail=entries("d", 1, 1000))

    out = cli("offload-prefix", "t", "2:0", "--json").ok().json
    assert out["offloaded"] == [{"topic": "t", "ledger": 0}, {"topic": "t", "ledger": 1}]
    assert out["failed"] == [] and out["first_not_offloaded"] == "2:0"
    assert out["bytes"] == 6000
    deleted = cli("delete-lagged", "--json").ok().json
    assert deleted["deleted"] == [{"topic": "t", "ledger": 0}, {"topic": "t", "ledger": 1}]
    assert not deps.tier1.exists("t", 0) and not deps.tier1.exists("t", 1) and deps.tier1.exists("t", 2)
    status, read = cli.many([("offload-status", "t", "--json"), ("read", "t", "--json")])
    rows = status.ok().json["ledgers"]
    assert [(r["state"], r["tier1_present"]) for r in rows] == [
        ("OFFLOADED", False), ("OFFLOADED", False), ("SEALED", True), ("OPEN", True)]
    keys = {r["data_key"] for r in rows[:2]} | {r["index_key"] for r in rows[:2]}
    assert keys == bucket_keys(deps) and all(k.startswith("t/t/") for k in keys)
    assert read_data(read) == expected  # ledgers 0 and 1 from tier 2

    trunc = cli("truncate", "t", "1:0", "--json").ok().json
    assert trunc["deleted"] == [{"topic": "t", "ledger": 0}] and trunc["position"] == "1:0"
    read, verify = cli.many([("read", "t", "--json"), ("verify", "t", "--json")])
    rows = read.ok().json_lines
    assert rows[0] == {"gap": "TRIMMED", "from": "0:0", "to": "0:2"}
    assert read_data(read) == {k: v for k, v in expected.items() if k[0] >= 1}
    report = verify.ok().json
    assert report["ok"] and report["entry_count"] == 7 and report["bytes"] == 7000
    assert report["gaps"] == [{"gap": "TRIMMED", "from": "0:0", "to": "0:2"}]


def test_offload_by_age_and_size_retention_with_topic_filter(cli, deps):
    produce(deps, "aged", [entries("a", 3, 100), entries("a2", 3, 100)], TopicPolicy(offload_after_seconds=0, **BIG))
    produce(deps, "big", [entries("b", 4, 1000), entries("b2", 4, 1000)], open_tail=entries("b3", 2, 1000),
            policy=TopicPolicy(offload_threshold_bytes=0, **BIG))
    produce(deps, "kept", [entries("k", 3, 100)], TopicPolicy(retention_bytes=0, **BIG))

    age_other, size_other = cli.many([("offload-by-age", "--topic", "kept", "--json"),
                                      ("offload-by-size", "--topic", "aged", "--json")])
    assert age_other.ok().json["planned_count"] == 0 and size_other.ok().json["planned_count"] == 0
    age = cli("offload-by-age", "--json").ok().json
    assert age["offloaded"] == [{"topic": "aged", "ledger": 0}, {"topic": "aged", "ledger": 1}]
    assert age["bytes"] == 600 and age["failed"] == []
    size = cli("offload-by-size").ok().stdout
    assert size == "offload by size: 2 planned; offloaded 2 ledger(s) (8000 bytes), skipped 0, failed 0\n"
    assert {(led.topic, led.state.value) for t in ("aged", "big", "kept") for led in deps.meta.list_ledgers(t)
            if led.state.value != "OPEN"} == {("aged", "OFFLOADED"), ("big", "OFFLOADED"), ("kept", "SEALED")}

    ret = cli("retention", "--topic", "kept", "--json").ok().json
    assert ret["deleted"] == [{"topic": "kept", "ledger": 0}] and ret["files_removed_count"] == 1 and ret["bytes"] == 300


def test_defrag_gc_verify_and_loss_behind_metadatas_back(cli, deps, s3_client, bucket):
    expected = produce(deps, "small", [entries(f"s{i}", 4, 500) for i in range(4)],
                       TopicPolicy(offload_after_seconds=0, deletion_lag_seconds=0, **BIG))
    assert len(offload_many(deps, deps.meta.list_ledgers("small")).offloaded) == 4
    before = bucket_keys(deps)
    assert len(before) == 8

    out = cli("defrag", "--topic", "small", "--small-bytes", "1000000", "--json").ok().json
    assert out["group_count"] == 1 and out["ledger_count"] == 4 and out["objects_after_count"] == 2
    assert out["failed"] == []
    s3_client.put_object(Bucket=bucket, Key="t/stray/notes.txt", Body=b"left behind by a tool")
    gc = cli("gc", "--sweep", "--orphan-grace-seconds", "0", "--json").ok().json
    assert gc["orphans_deleted_count"] == 1 and gc["failed"] == []  # the merged-away objects wait for their delay
    chunks = deps.meta.chunks("small")
    assert {c.data_key for c in chunks.values()} | {c.index_key for c in chunks.values()} <= bucket_keys(deps)
    assert "t/stray/notes.txt" not in bucket_keys(deps)

    read, verify = cli.many([("read", "small", "--json"), ("verify", "small")])
    assert read_data(read) == expected
    assert verify.ok().stdout.endswith("4 tier-2 cop(ies) compared, 0 gap(s); OK\n")

    # An object deleted behind metadata's back: the tier-1 copies still read, but verify compares tier 2.
    merged = chunks[0].data_key
    s3_client.delete_object(Bucket=bucket, Key=merged)
    bad = cli("verify", "small", "--json")
    line = bad.one_line_error(1)
    assert "ledger 0" in line and merged in line
    assert bad.json["ok"] is False and len(bad.json["problems"]) == 4
    # delete-lagged HEADs the tier-2 objects first: every copy whose merged object is gone is kept
    report = delete_lagged(deps, "small")
    assert report.deleted == [] and len(report.failed) == 4 and merged in report.failed[0][2]
    assert read_data(cli("read", "small", "--json")) == expected


def test_an_item_that_fails_exits_1_with_the_first_error(cli, deps):
    produce(deps, "f", [entries("x", 2, 10), entries("y", 2, 10)], TopicPolicy(offload_after_seconds=0, **BIG))
    deps.tier1.delete("f", 0)  # behind metadata's back: ledger 0 cannot be offloaded
    res = cli("offload-by-age", "--json")
    line = res.one_line_error(1)
    assert "1 ledger(s) failed" in line and "ledger 0" in line and "'f'" in line
    assert res.json["offloaded"] == [{"topic": "f", "ledger": 1}]
    assert [led.state.value for led in deps.meta.list_ledgers("f")] == ["SEALED", "OFFLOADED"]


LONG = "x" * 1025
# Every kind of user mistake, on every command it applies to (run in-process: the same main(), faster).
BAD_INPUT = [
    ("topic", "create", "t"),                                                      # duplicate
    ("topic", "show", "nope"), ("status", "nope"), ("read", "nope"), ("seal", "nope"),  # unknown topic
    ("produce", "nope", "--entries", "1", "--entry-size", "1"), ("offload-prefix", "nope", "1:0"),
    ("offload-status", "nope"), ("truncate", "nope", "0:0"), ("verify", "nope"),
    ("offload-by-age", "--topic", "nope"), ("offload-by-size", "--topic", "nope"),
    ("delete-lagged", "--topic", "nope"), ("retention", "--topic", "nope"), ("defrag", "--topic", "nope"),
    ("truncate", "t", "1"), ("truncate", "t", "a:b"), ("offload-prefix", "t", "1:"),  # malformed L:E
    ("read", "t", "--from", "1:x"), ("read", "t", "--to", "-1:0"), ("truncate", "t", "1:2:3"),
    ("read", "t", "--from", "1:0", "--to", "0:0"), ("truncate", "t", "99:0"),      # impossible ranges
    ("produce", "t", "--entries", "3"), ("produce", "t", "--stdin-lines", "--entry-size", "3"),
    ("produce", "t", "--entries", "-1", "--entry-size", "3"), ("produce", "t", "--entries", "3", "--entry-size", "-3"),
    ("defrag", "--small-bytes", "-1"), ("defrag", "--max-merged-bytes", "-1"), ("defrag", "--small-bytes", "0"),
    ("gc", "--orphan-grace-seconds", "-5"), ("topic", "create", "n", "--retention-size", "-5"),
    ("topic", "create", "n", "--offload-threshold", "-2"), ("topic", "create", "n", "--rollover-entries", "0"),
    ("topic", "create", "n", "--deletion-lag", "x"),
    ("topic", "create", LONG), ("status", LONG), ("produce", LONG, "--entries", "1", "--entry-size", "1"),
    ("offload-by-age", "--topic", LONG), ("topic", "create", ""), ("topic", "create", "a\x00b"),
    ("status", "a\x00b"), ("defrag", "--topic", "\x00"),                             # NUL: not possible in argv
    ("bogus-command",), (), ("topic",), ("gc", "--topic", "t"),
    # units, repeated flags, sizes below their minimum, reads outside the topic, offload-prefix's two forms
    ("topic", "create", "n", "--retention-time", "4x"), ("topic", "create", "n", "--retention-size", "10QB"),
    ("topic", "create", "n", "--retention-time", "-1h"), ("topic", "create", "n", "--retention-time", "1.5"),
    ("topic", "create", "n", "--offload-after", "3600", "--offload-after", "60"),
    ("topic", "create", "n", "--rollover-bytes", "1"), ("defrag", "--small-bytes", "1MiB", "--small-bytes", "2MiB"),
    ("read", "t", "--from", "9:0"), ("read", "t", "--from", "0:5000"), ("read", "t", "--json", "--format", "hex"),
    ("read", "t", "--format", "latin1"), ("offload-prefix", "t"), ("offload-prefix", "t", "0:0", "--all-sealed"),
    ("offload-prefix", "t", "5:0"), ("gc", "--orphan-grace-seconds", "2x"),
]


def run_main(argv, capsys) -> Result:
    from tiering.cli.main import main

    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return Result(tuple(argv), code, out, err)


def test_bad_input_is_one_line_exit_2_and_changes_nothing(cli, deps, monkeypatch, capsys):
    produce(deps, "t", [entries("a", 3, 10)], open_tail=entries("b", 2, 10))
    before = snapshot(deps)
    # Through real processes: one of each kind the README promises, and the environment's mistakes.
    cases = [
        ("topic", "create", "t"), ("status", "nope"), ("offload-by-age", "--topic", "nope"), ("truncate", "t", "a:b"),
        ("produce", "t", "--entries", "3", "--entry-size", "-3"), ("defrag", "--small-bytes", "-1"),
        ("produce", "t", "--entries", "3"), ("topic", "create", LONG),
        ("topic", "create", b"bad\xffname"),                           # not UTF-8: a lone surrogate in Python
        (("topic", "list"), {"unset": ["TIERING_DATABASE_URL"]}),
        (("status", "t"), {"unset": ["TIERING_TIER1_ROOT"]}),
        (("topic", "list"), {"env": {"TIERING_DATABASE_URL": "postgresql://u:Sup3rS3cret@h:notaport/db"}}),
        (("topic", "list"), {"env": {"TIERING_DATABASE_URL": "mysql://u:Sup3rS3cret@h/db"}}),
        (("status", "t"), {"env": {"TIERING_BLOCK_SIZE": "1024"}}),
    ]
    results = cli.many(cases)
    for case, res in zip(cases, results):
        line = res.one_line_error(2)
        assert res.stdout == "", (case, res.stdout)
        assert "Sup3rS3cret" not in line and len(line) < 400, (case, line)
    messages = [r.stderr for r in results]
    for i, text in enumerate(["'t' already exists", "topic 'nope' does not exist", "topic 'nope' does not exist",
                              "malformed position 'a:b'", "-3 is negative", "-1 is not positive",
                              "--entries needs --entry-size", "1 to 1024 characters", "valid UTF-8",
                              "TIERING_DATABASE_URL is not set", "TIERING_TIER1_ROOT is not set",
                              "TIERING_DATABASE_URL's port must be a whole number", "TIERING_DATABASE_URL must be a postgresql://",
                              "TIERING_BLOCK_SIZE must be at least 5 MiB"]):
        assert text in messages[i], (cases[i], messages[i])

    for key, value in cli.env.items():
        monkeypatch.setenv(key, value)
    for argv in BAD_INPUT:
        res = run_main(argv, capsys)
        res.one_line_error(2)
        assert res.stdout == "", (argv, res.stdout)
    assert "without NUL" in run_main(("topic", "create", "a\x00b"), capsys).stderr
    assert snapshot(deps) == before


def test_services_down_exit_1_without_traceback_or_secrets(cli, deps):
    produce(deps, "t", [entries("a", 3, 10)], TopicPolicy(offload_after_seconds=0, **BIG))
    offload_many(deps, deps.meta.list_ledgers("t"))
    db_down = f"postgresql://tiering:Sup3rS3cret-pw@127.0.0.1:{free_port()}/tiering"
    s3_down = {"TIERING_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    results = cli.many([(("topic", "list"), {"env": {"TIERING_DATABASE_URL": db_down}}),
                        (("produce", "t", "--entries", "1", "--entry-size", "1"),
                         {"env": {"TIERING_DATABASE_URL": db_down}}),
                        (("verify", "t"), {"env": s3_down}),
                        (("gc",), {"env": s3_down})])
    for res in results:
        res.one_line_error(1)  # asserts exit 1 and a single line
        assert "Sup3rS3cret" not in res.stderr + res.stdout
        assert "Traceback" not in res.stderr
    assert "metadata database unavailable" in results[0].stderr and "Connection refused" in results[0].stderr
    assert "S3" in results[2].stderr and "S3" in results[3].stderr
    assert [led.state.value for led in deps.meta.list_ledgers("t")] == ["OFFLOADED"]


def test_a_database_that_never_answers_is_given_up_on_not_waited_for(cli, database_url):
    import socket
    import time

    from tiering.metadata.db import LINK_LIMITS, SERVER_LINK_LIMITS, make_engine

    # libpq's defaults wait for ever; every engine now carries limits, unless its URL sets its own
    engine = make_engine(database_url)
    with engine.connect() as conn:
        params = conn.connection.dbapi_connection.get_dsn_parameters()
        # the server's side too: a session whose client vanished ends (and frees its locks) as soon
        server = {k: conn.exec_driver_sql(f"SHOW {k}").scalar() for k in SERVER_LINK_LIMITS}
    assert {k: params.get(k) for k in LINK_LIMITS} == {k: str(v) for k, v in LINK_LIMITS.items()}
    assert server == {k: str(v) for k, v in SERVER_LINK_LIMITS.items()}
    engine.dispose()
    # a listener that accepts and never answers (a hung server, a black hole): exit 1, one line, in time
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        url = f"postgresql://tiering:Sup3rS3cret-pw@127.0.0.1:{hole.getsockname()[1]}/tiering?connect_timeout=2"
        started = time.monotonic()
        res = cli("topic", "list", env={"TIERING_DATABASE_URL": url})
        took = time.monotonic() - started
    assert "timeout expired" in res.one_line_error(1) and "Sup3rS3cret" not in res.stderr
    assert took < 30, took  # the URL's own limit (2 s per attempt) was used, not LINK_LIMITS' 30 s


def test_the_urls_own_server_options_are_kept_beside_the_products(database_url):
    """`?options=-c ...` in the URL (a search_path, a statement timeout) reaches the server as it does for
    every other client of the URL (pyiceberg's catalog, pgjdbc), beside the settings the product adds."""
    from urllib.parse import quote

    from tiering.metadata.db import SERVER_LINK_LIMITS, make_engine

    sep = "&" if "?" in database_url else "?"
    engine = make_engine(f"{database_url}{sep}options={quote('-c search_path=extra,public -c statement_timeout=4321')}")
    with engine.connect() as conn:
        got = {k: conn.exec_driver_sql(f"SHOW {k}").scalar() for k in ("search_path", "statement_timeout", "jit",
                                                                         *SERVER_LINK_LIMITS)}
    engine.dispose()
    assert got == {"search_path": "extra,public", "statement_timeout": "4321ms", "jit": "off",
                   **{k: str(v) for k, v in SERVER_LINK_LIMITS.items()}}


def test_the_urls_own_setting_of_a_default_wins_and_only_that_setting(database_url):
    from urllib.parse import quote

    from tiering.metadata.db import SERVER_LINK_LIMITS, make_engine

    sep = "&" if "?" in database_url else "?"
    # names as the server takes them (any case); a setting whose name only contains a default's is another
    engine = make_engine(f"{database_url}{sep}options={quote('-c JIT=on -c x.tcp_keepalives_idle=7')}")
    with engine.connect() as conn:
        got = {k: conn.exec_driver_sql(f"SHOW {k}").scalar() for k in ("jit", "x.tcp_keepalives_idle",
                                                                         "tcp_keepalives_idle")}
    engine.dispose()
    assert got == {"jit": "on", "x.tcp_keepalives_idle": "7",
                   "tcp_keepalives_idle": str(SERVER_LINK_LIMITS["tcp_keepalives_idle"])}


def test_ctrl_c_ends_a_command_waiting_on_postgresql(cli, deps):
    """libpq waits in C and a Python signal handler runs only once the server answers: a command waiting on a
    lock (or on a server that stopped answering) ignored Ctrl-C. Now it ends at once, one line, exit 130, and
    its transaction is gone from the server."""
    import signal
    import time

    from sqlalchemy import text

    deps.meta.create_topic("locked")
    with deps.meta.engine.connect() as holder:
        holder.execute(text("LOCK TABLE tiering.topic IN ACCESS EXCLUSIVE MODE"))  # held until the block ends
        # SIGINT as a terminal gives it: a job started in the background by a non-interactive shell (as CI may
        # run the suite) inherits SIGINT ignored, and Python then never installs its KeyboardInterrupt
        proc = subprocess.Popen([sys.executable, "-m", "tiering", "topic", "create", "waits"], env=cli.env,
                                cwd=cli.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 60
        while not holder.execute(text("SELECT count(*) FROM pg_locks WHERE relation = 'tiering.topic'::regclass "
                                      "AND NOT granted AND database = (SELECT oid FROM pg_database "
                                      "WHERE datname = current_database())")).scalar_one():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=20)  # before: waited as long as the lock was held
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail("the command went on waiting for PostgreSQL after Ctrl-C")
        holder.rollback()
    assert (proc.returncode, err.decode()) == (130, "tiering: interrupted\n")
    assert [t.name for t in deps.meta.list_topics()] == ["locked"]  # nothing of the interrupted command


HOSTILE = ["../x", "a/b", "-q'uo\"te`$(x) back\\slash%25", "日本語 тема 🎉", "y" * 1000]  # no control chars: refused


def test_hostile_topic_names_round_trip_and_stay_inside_root_and_prefix(cli, deps, tier1_root, tmp_path):
    for name in HOSTILE:
        deps.meta.create_topic(name, TopicPolicy(offload_after_seconds=0, deletion_lag_seconds=0, rollover_entries=2))
    produced = cli.many([("produce", "--entries", "5", "--entry-size", "50", f"--seed={name}", "--", name)
                         for name in HOSTILE])
    assert [r.ok().stdout for r in produced] == ["2:0\n"] * len(HOSTILE)
    assert len(cli("offload-by-age", "--json").ok().json["offloaded"]) == 2 * len(HOSTILE)
    assert len(cli("delete-lagged", "--json").ok().json["deleted"]) == 2 * len(HOSTILE)
    reads = cli.many([("read", "--json", "--", name) for name in HOSTILE])
    for name, res in zip(HOSTILE, reads):  # ledgers 0-1 from tier 2, 2 from tier 1
        assert read_data(res) == {(i // 2, i % 2): payload(name, i, 50) for i in range(5)}, name

    root = os.path.realpath(tier1_root)
    for path in tmp_path.rglob("*"):
        assert os.path.realpath(path).startswith(root + os.sep) or path in (tier1_root, cli.cwd), path
    assert not any(cli.cwd.iterdir())
    keys = bucket_keys(deps)
    assert len(keys) == 4 * len(HOSTILE)
    # every key under the prefix, one segment per topic (long names hashed to fit S3's key limit)
    assert {parse_key("t/", k).segment for k in keys} == {encode_topic(t) for t in HOSTILE}


def test_a_wrong_tier1_root_is_said_not_read_as_an_empty_open_ledger(cli, tmp_path):
    cli("topic", "create", "w").ok()
    cli("produce", "w", "--entries", "3", "--entry-size", "10").ok()
    wrong = {"env": {"TIERING_TIER1_ROOT": str(tmp_path / "wrong")}}
    read, status, produce = cli.many([(("read", "w"), wrong), (("status", "w", "--json"), wrong),
                                      (("produce", "w", "--entries", "1", "--entry-size", "1"), wrong)])
    assert "open ledger 0 of topic 'w' has no file" in read.one_line_error(1) and read.stdout == ""
    [row] = status.ok().json["ledgers"]
    assert row["tier1_file_missing"] and row["entry_count"] is None and row["tiers"] == []
    produce.one_line_error(1)
    assert len(read_data(cli("read", "w", "--json"))) == 3  # the right root: all three, nothing written elsewhere


def test_gc_retry_failed_takes_up_the_deletes_that_failed_for_good(cli, deps, db, s3_client, bucket):
    """A queued key whose deletes all failed is FAILED: no run takes it again by itself (the alert says so).
    Once the cause is mended, `gc --retry-failed` makes it due again and deletes it; its dry run says what it
    would take and writes nothing; a plain `gc` leaves it."""
    from sqlalchemy import text

    s3_client.put_object(Bucket=bucket, Key="t/gone/ledger-object", Body=b"x")
    deps.meta.enqueue_gc(["t/gone/ledger-object"], "retention")
    with db.begin() as conn:
        conn.execute(text("UPDATE tiering.gc_task SET state = 'FAILED', attempts = 5, last_error = 'AccessDenied', "
                          "not_before = now() - interval '1 hour'"))
    plain = cli("gc", "--json").ok().json
    assert plain["deleted_count"] == 0 and plain["requeued_count"] == 0
    preview = cli("gc", "--retry-failed", "--dry-run", "--json").ok().json
    assert preview["requeued_count"] == 1 and preview["deleted_count"] == 1
    with db.connect() as conn:
        assert conn.execute(text("SELECT state FROM tiering.gc_task")).scalar_one() == "FAILED"
    done = cli("gc", "--retry-failed", "--json").ok().json
    assert done["requeued_count"] == 1 and done["deleted_count"] == 1 and done["failed"] == []
    assert "t/gone/ledger-object" not in bucket_keys(deps)
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tiering.gc_task")).scalar_one() == 0
    assert "--retry-failed is for the queue's run" in cli("gc", "--sweep", "--retry-failed").one_line_error(2)
