"""Input an edge-case harness found accepted, and tier 2 down under offload: through real `tiering`
processes (and the offload job's own entry point) against the run's PostgreSQL and S3.

Bad input: exit 2, one line on stderr, nothing written (tables, tier-1 files, bucket compared before and
after). Tier 2 unreachable or its bucket missing: offload fails once with one line (exit 1) before it
touches metadata: no version bump, no gc_task row, however many runs.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tests.integration.test_cli import ROOT, cli, snapshot  # noqa: F401 - cli: the fixture
from tests.support.processes import free_port
from tiering.errors import LedgerStorageError
from tiering.model import TopicPolicy
from tiering.tier1 import Tier1Store
from tiering.writer import ManagedLedgerWriter

POLICY = TopicPolicy(offload_after_seconds=0, offload_threshold_bytes=0, deletion_lag_seconds=0,
                     rollover_entries=10**9, rollover_bytes=2**40)


def test_each_bad_input_exits_2_with_one_line_and_writes_nothing(cli, deps, tmp_path):
    produce(deps, "t", [entries("a", 3, 10), entries("b", 3, 10)], POLICY, open_tail=entries("c", 1, 10))
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    before = snapshot(deps)
    cases = {
        ("truncate", "t", "\u0661:\u0660"): "malformed position",            # Arabic-Indic digits
        ("truncate", "t", "\uff11:\uff10"): "malformed position",            # full-width digits
        ("truncate", "t", "1:0\v"): "malformed position",                    # trailing vertical tab
        ("truncate", "t", "1:0\n"): "malformed position",
        ("offload-prefix", "t", " 1:0"): "malformed position",
        ("read", "t", "--from", "\u0661:0"): "malformed position",
        ("topic", "create", "x", "--rollover-bytes", "\u0665\u0660\u0660"): "ASCII digits only",
        ("topic", "create", "x", "--rollover-entries", "99999999999999999999999"): "too large",
        ("topic", "create", "x", "--retention-size", "9223372036854775808"): "too large",
        ("topic", "create", "x", "--deletion-lag", "9" * 12): "too large",
        ("topic", "create", "x", "--offload-after", "+5"): "ASCII digits only",
        ("gc", "--orphan-grace-seconds", "1e40"): "ASCII digits only",
        ("gc", "--orphan-grace-seconds", "1" + "0" * 40): "too large",
        ("defrag", "--small-bytes", "\uff18"): "ASCII digits only",
        ("defrag", "--small-bytes", "2MiB", "--max-merged-bytes", "1MiB"): "larger than --max-merged-bytes",
        ("produce", "t", "--entries", "2", "--entry-size", "1_0"): "ASCII digits only",
        ("topic", "create", "new\nline"): "control characters",
        ("topic", "create", "esc\x1b[2Jape"): "control characters",
        ("status", "tab\there"): "control characters",
        # (named as the argument, as every other refused argument is)
        ("topic", "create", "or\u200bders"): "argument TOPIC: a topic name may not contain invisible or bidi",
        ("topic", "create", "cafe\u0301"): "argument TOPIC: a topic name must be in Unicode NFC form",
        ("subscription", "create", "t", "bil\u202eling"): "argument NAME: a subscription name may not contain invisible",
        ("subscription", "create", "t", " pad"): "argument NAME: a subscription name may not begin or end with white",
    }
    env_cases = {
        ("produce", "t", "--entries", "1", "--entry-size", "1"): [
            ({"TIERING_BLOCK_SIZE": "9" * 30}, "TIERING_BLOCK_SIZE must be at least 5 MiB"),
            ({"TIERING_BLOCK_SIZE": "\u0665242880"}, "TIERING_BLOCK_SIZE must be an integer in ASCII digits"),
            ({"TIERING_TIER1_ROOT": str(a_file)}, "TIERING_TIER1_ROOT is a file"),
            ({"TIERING_TIER1_ROOT": str(a_file / "below")}, "TIERING_TIER1_ROOT (a part of it) is a file"),
            ({"TIERING_OFFLOAD_TIMEOUT_SECONDS": "1" + "0" * 40}, "TIERING_OFFLOAD_TIMEOUT_SECONDS must be from 1"),
            ({"TIERING_GC_DELAY_SECONDS": "ten"}, "TIERING_GC_DELAY_SECONDS must be an integer"),
        ],
    }
    calls = list(cases) + [(args, {"env": env}) for args, envs in env_cases.items() for env, _ in envs]
    wants = list(cases.values()) + [msg for envs in env_cases.values() for _, msg in envs]
    for call, want, res in zip(calls, wants, cli.many(calls)):
        line = res.one_line_error(2)
        assert want in line and res.stdout == "", (call, line, res.stdout)
    assert snapshot(deps) == before, "a refused command wrote something"
    assert [t.name for t in deps.meta.list_topics()] == ["t"]


def test_a_file_as_tier1_root_leaves_no_open_ledger_row(deps, tmp_path):
    deps.meta.create_topic("t", POLICY)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    writer = ManagedLedgerWriter(deps.meta, Tier1Store(a_file), "t")
    with pytest.raises(LedgerStorageError, match="not a usable directory"):
        writer.append(b"x")
    assert deps.meta.list_ledgers("t") == [], "the ledger row was created before the root was checked"


def _metadata(deps) -> tuple:
    with deps.meta.engine.connect() as conn:
        return (conn.execute(text("SELECT topic_id, ledger_id, state, version FROM tiering.ledger ORDER BY 1, 2")).all(),
                conn.execute(text("SELECT count(*) FROM tiering.gc_task")).scalar(),
                conn.execute(text("SELECT count(*) FROM tiering.chunk")).scalar())


@pytest.mark.parametrize("fault", ["endpoint-down", "bucket-missing"])
def test_tier2_unreachable_offload_fails_before_touching_metadata(fault, cli, deps):
    produce(deps, "t", [entries(f"o{i}", 3, 100) for i in range(4)], POLICY, open_tail=entries("tail", 1, 10))
    env = ({"TIERING_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"} if fault == "endpoint-down"
           else {"TIERING_BUCKET": f"{deps.bucket.name}-missing"})
    before = _metadata(deps)
    assert before[1] == 0
    runs = cli.many([(("offload-by-age",), {"env": env}), (("offload-by-size",), {"env": env}),
                     (("offload-prefix", "t", "3:0"), {"env": env}), (("offload-by-age", "--topic", "t"), {"env": env})])
    for res in runs:
        line = res.one_line_error(1)
        assert ("unreachable" if fault == "endpoint-down" else "does not exist") in line, line
        assert "Traceback" not in res.stderr and "testing" not in line
    # the Spark job's driver: plans, checks tier 2, fails before SparkContext and before any ledger
    job = subprocess.run([sys.executable, str(ROOT / "tiering" / "jobs" / "offload.py"), "--by=age"],
                         env={**cli.env, **env}, capture_output=True, text=True, timeout=120)
    assert job.returncode == 1 and "tier 2 is" in job.stderr, job.stderr[-2000:]
    assert _metadata(deps) == before, "an offload with tier 2 down bumped versions or queued gc rows"
    with deps.meta.engine.connect() as conn:
        errors = conn.execute(text("SELECT status || ' ' || error FROM tiering.job_run WHERE job = 'offload'")).scalars().all()
    assert len(errors) == 1 and "tier 2 is" in str(errors[0])
    # tier 2 back: the same command offloads everything
    cli("offload-by-age").ok()
    assert {led.state.value for led in deps.meta.list_ledgers("t")} == {"OFFLOADED", "OPEN"}


def test_tier2_unreachable_defrag_queues_nothing(cli, deps):
    produce(deps, "t", [entries(f"d{i}", 3, 100) for i in range(3)], POLICY)
    cli("offload-by-age").ok()
    before = _metadata(deps)
    down = {"TIERING_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    for res in cli.many([(("defrag",), {"env": down}), (("defrag", "--topic", "t"), {"env": down})]):
        assert "tier 2 is unreachable" in res.one_line_error(1)
    assert _metadata(deps) == before, "a defrag with tier 2 down queued merged keys for GC"
