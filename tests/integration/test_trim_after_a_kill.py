"""A trim killed after its metadata commit leaves tier-1 copies of DELETED ledgers (and a renamed file whose
deletion was recorded). The dry runs of retention, truncate and topic delete count those copies as their
runs remove them, the rerun removes the renamed file too, and a truncate at the topic's end takes every
sealed ledger. Real PostgreSQL, S3 and tier-1 files."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tests.integration.test_cli import cli  # noqa: F401 - the fixture
from tiering.model import LedgerState as S, TopicPolicy
from tiering.writer import ManagedLedgerWriter

SMALL = dict(rollover_entries=3, rollover_bytes=2**40, retention_seconds=0)


def _killed_after_commit(deps, topic: str, ledgers: int = 4) -> list[int]:
    """A retention of `topic` stopped right after its commit: every ledger DELETED, no copy removed yet, and
    the first copy's deletion recorded with its renamed file left (stopped between those two steps)."""
    produce(deps, topic, [entries(f"{topic}{i}", 3, 50) for i in range(ledgers)], TopicPolicy(**SMALL))
    trim = deps.meta.trims.retention(topic, timedelta(0))
    gone = sorted(led.ledger_id for led in trim.deleted)
    assert gone == list(range(ledgers)) and all(deps.tier1.exists(topic, i) for i in gone)
    deps.tier1.retire(topic, 0)
    deps.meta.mark_tier1_deleted(deps.meta.get_ledger(topic, 0))
    return gone


def test_retentions_dry_run_counts_the_copies_its_run_removes_after_a_kill(cli, deps):  # noqa: F811
    _killed_after_commit(deps, "r")
    dry = cli("retention", "--topic", "r", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert dry.json["deleted_count"] == 0 and dry.json["files_removed_count"] == 3
    [item] = dry.json["plan"]
    assert (item["topic"], item["ledger_count"], item["leftover_tier1_copy_count"]) == ("r", 0, 3)
    assert "remove 3 tier-1 file(s) of ledgers an interrupted run deleted" in cli(
        "retention", "--topic", "r", "--dry-run").ok().stdout
    run = cli("retention", "--topic", "r", "--json")
    assert run.returncode == 0 and run.json["files_removed_count"] == 3
    # the renamed file of the copy whose deletion was recorded is gone too
    assert deps.tier1.ledger_ids("r") == [] and deps.tier1.retired_ids("r") == []
    assert cli("retention", "--topic", "r", "--dry-run", "--json").json["files_removed_count"] == 0


def test_truncates_and_topic_deletes_dry_runs_count_them_too(cli, deps):  # noqa: F811
    _killed_after_commit(deps, "t")
    writer = ManagedLedgerWriter(deps.meta, deps.tier1, "t")  # ledger 4, sealed
    for data in entries("t-more", 3, 50):
        writer.append(data)
    writer.seal()
    dry = cli("truncate", "t", "5:0", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert (dry.json["deleted_count"], dry.json["files_removed_count"]) == (1, 4)
    assert cli("topic", "delete", "t", "--dry-run", "--json").json["files_removed_count"] == 4
    run = cli("truncate", "t", "5:0", "--json")
    assert run.returncode == 0 and (run.json["deleted_count"], run.json["files_removed_count"]) == (1, 4)
    assert deps.tier1.ledger_ids("t") == [] and deps.tier1.retired_ids("t") == []


def test_a_truncate_at_the_topics_end_takes_every_sealed_ledger(cli, deps):  # noqa: F811
    produce(deps, "e", [entries(f"e{i}", 3, 50) for i in range(3)], TopicPolicy(rollover_entries=3))
    assert cli("truncate", "e", "4:0").one_line_error(2).endswith("is beyond the end of the topic")
    run = cli("truncate", "e", "3:0", "--json")
    assert run.returncode == 0 and run.json["deleted_count"] == 3
    assert [led.state for led in deps.meta.list_ledgers("e")] == [S.DELETED] * 3
    # made again under a deleted topic's name (no ledger yet, ids go on from 3): a position in its past has
    # nothing before it (it was called beyond the end), as a rerun at a trimmed position; past the end is not
    cli("topic", "delete", "e", "--force").ok()
    assert cli("topic", "create", "e").returncode == 0
    again = cli("truncate", "e", "1:0", "--json")
    assert again.returncode == 0 and again.json["deleted_count"] == 0, again.stderr
    assert cli("truncate", "e", "3:0").returncode == 0
    assert cli("truncate", "e", "4:0").one_line_error(2).endswith("is beyond the end of the topic")
    # with an open ledger its start is as far as a truncate goes (never the open one)
    produce(deps, "o", [entries("o0", 3, 50)], TopicPolicy(rollover_entries=3), open_tail=[b"open"])
    assert cli("truncate", "o", "2:0").one_line_error(2).endswith("is beyond the end of the topic")


def test_a_subscription_at_the_largest_entry_id_does_not_break_the_backlogs(cli, deps):  # noqa: F811
    produce(deps, "s", [entries("s0", 3, 50)])
    assert cli("subscription", "create", "s", "far").returncode == 0
    with deps.meta.engine.begin() as conn:  # a position the schema allows though no command writes it
        conn.execute(text("UPDATE tiering.subscription SET ack_ledger_id = 0, ack_entry_id = 9223372036854775807"))
    listed = cli("subscription", "list", "--json")
    assert listed.returncode == 0, listed.stderr


def test_an_offload_whose_worker_died_does_not_hold_retention_back(cli, deps):  # noqa: F811
    """Retention stopped at the first OFFLOADING ledger, ceilings included: one whose worker was killed held
    the topic's head (exit 0, "nothing due") until another offload took the attempt over. It goes now, as
    truncate takes it; a live attempt's commit then loses its compare-and-set."""
    from tiering.errors import ConditionalUpdateFailed
    from tiering.model import Chunk

    produce(deps, "d", [entries(f"d{i}", 3, 50) for i in range(4)], TopicPolicy(rollover_entries=3))
    stuck = deps.meta.get_ledger("d", 1)
    with deps.meta.new_attempt() as attempt:  # the worker dies with its lock at the end of the block
        stuck = deps.meta.begin_offload(stuck, attempt, ["k/d1", "k/d1-index"], timedelta(hours=1))
    live = deps.meta.get_ledger("d", 2)
    with deps.meta.new_attempt() as running:
        live = deps.meta.begin_offload(live, running, ["k/d2", "k/d2-index"], timedelta(hours=1))
        assert cli("topic", "set", "d", "--max-retention-size", "1").returncode == 0
        dry = cli("retention", "--topic", "d", "--dry-run", "--json").json
        run = cli("retention", "--topic", "d", "--json")
        # the last ledger stays: without it the topic would hold less than the 1-byte ceiling
        assert run.returncode == 0 and sorted(i["ledger"] for i in run.json["deleted"]) == [0, 1, 2]
        assert dry["deleted_count"] == 3
        chunk = Chunk("k/d2", 0, 1, "k/d2-index", 0, 1, 0, 2)
        with pytest.raises(ConditionalUpdateFailed):  # the running offload's commit: its ledger is gone
            deps.meta.complete_offload(live, running, chunk)
    assert [led.state for led in deps.meta.list_ledgers("d")] == [S.DELETED] * 3 + [S.SEALED]
    # the attempts' objects stay queued for GC, due once the GC delay (600 s) has passed: neither attempt can
    # commit any more, so the rest of their hour would only leave the objects in the bucket
    with deps.meta.engine.connect() as conn:
        queued = conn.execute(text("SELECT key, not_before - now() <= interval '600 seconds' FROM tiering.gc_task "
                                   "WHERE key LIKE 'k/%' ORDER BY key")).all()
    assert queued == [("k/d1", True), ("k/d1-index", True), ("k/d2", True), ("k/d2-index", True)]
