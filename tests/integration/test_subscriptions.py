"""Subscriptions through the `tiering` command (real subprocesses, the run's PostgreSQL, S3 and a tier-1 root):
positions that only move forward, retention held back by ACTIVE readers, ceilings and expiry that delete
unread data and record the loss, truncate refusing to cut past a reader, `topic set` by compare-and-set,
`topic delete` through the GC queue with the name reusable, and bad input refused with nothing written."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tests.integration.test_cli import cli, snapshot  # noqa: F401 (the fixture)
from tiering.model import LedgerState as S, TopicPolicy

TEN = dict(rollover_entries=10, rollover_bytes=2**40)


def subs(cli, topic=None) -> dict:
    listed = cli("subscription", "list", *([topic] if topic else []), "--json").ok().json
    return {s["subscription"]: s for s in listed["subscriptions"]}


def states(deps, topic) -> list:
    return [led.state for led in deps.meta.list_ledgers(topic)]


def test_a_reader_holds_retention_until_it_has_read(cli, deps):
    produce(deps, "t", [entries(f"l{i}", 10, 100) for i in range(3)], TopicPolicy(**TEN), open_tail=[b"x"] * 4)
    cli("topic", "set", "t", "--retention-time", "0", "--retain-unread").ok()
    cli("subscription", "create", "t", "slow").ok()
    late = cli("subscription", "create", "t", "late", "--from", "latest", "--json").ok().json
    assert late["position"] == "3:3"  # the open ledger's last entry, from its tier-1 file
    listed = subs(cli, "t")
    assert listed["slow"]["position"] is None and listed["slow"]["backlog_entry_count"] == 34
    assert listed["slow"]["backlog_bytes"] == 3000 + 4 and listed["late"]["backlog_entry_count"] == 0
    assert set(listed["slow"]) >= {"topic", "subscription", "position", "backlog_entry_count", "backlog_bytes",
                                   "state", "oldest_unread_age_seconds", "last_ack_at", "unread_deleted_entry_count",
                                   "unread_deleted_bytes"}
    plan = cli("retention", "--dry-run", "--json").ok().json
    assert plan["dry_run"] is True and plan["deleted"] == []
    [item] = plan["plan"]
    assert item["ledger_count"] == 0 and item["held_back"]["ledger_count"] == 3
    assert item["held_back"]["by_subscription"] == [{"subscription": "slow", "position": None, "entry_count": 30,
                                                     "bytes": 3000}]
    assert cli("retention", "--json").ok().json["deleted"] == [] and states(deps, "t")[0] == S.SEALED

    read = cli("read", "t", "--subscription", "slow", "--max-entries", "15", "--ack", "--json").ok().json_lines
    assert [(r["ledger"], r["entry"]) for r in read][-1] == (1, 4) and len(read) == 15
    assert subs(cli, "t")["slow"]["position"] == "1:4"
    got = cli("retention", "--json").ok().json
    assert got["deleted"] == [{"topic": "t", "ledger": 0}] and got["unread_deleted"] == []
    # the next read starts after the position; re-acking the same position is a no-op
    assert cli("read", "t", "--subscription", "slow", "--max-entries", "1", "--json").ok().json_lines[0]["entry"] == 5
    # a --to before where the subscription reads next names the subscription, not a --from never given
    assert "before subscription 'slow''s next entry 1:5" in cli("read", "t", "--subscription", "slow", "--to",
                                                                 "1:3").one_line_error(2)
    cli("subscription", "ack", "t", "slow", "1:4").ok()
    assert "never moves backwards" in cli("subscription", "ack", "t", "slow", "1:2").one_line_error(2)
    assert "before the head" in cli("subscription", "ack", "t", "slow", "0:9", "--reset").one_line_error(2)
    assert "beyond the end of ledger 3" in cli("subscription", "ack", "t", "slow", "3:4").one_line_error(2)
    cli("subscription", "ack", "t", "slow", "1:2", "--reset").ok()
    # a replay of everything retained: the entry before the head is in a trimmed ledger, so no L:E names it
    assert "use --reset" in cli("subscription", "ack", "t", "slow", "earliest").one_line_error(2)
    assert cli("subscription", "ack", "t", "slow", "earliest", "--reset", "--json").ok().json["position"] is None
    replay = cli("read", "t", "--subscription", "slow", "--max-entries", "2", "--ack", "--json").ok().json_lines
    assert [r.get("gap") or (r["ledger"], r["entry"]) for r in replay][-2:] == [(1, 0), (1, 1)]
    assert subs(cli, "t")["slow"]["position"] == "1:1"
    # a reader whose output goes away mid-way (more than a pipe holds) acknowledges nothing: it re-reads
    produce(deps, "big", [entries("b", 20, 100_000)], TopicPolicy(**TEN))
    cli("subscription", "create", "big", "w").ok()
    pipe = subprocess.run(["bash", "-o", "pipefail", "-c",
                           f"{sys.executable} -m tiering read big --subscription w --ack | head -c 1000"],
                          env=cli.env, cwd=cli.cwd, capture_output=True, timeout=60)
    assert len(pipe.stdout) == 1000 and pipe.stderr == b""
    assert pipe.returncode == 141  # not a success (128 + SIGPIPE, as a process the signal ended), no traceback
    assert subs(cli, "big")["w"]["position"] is None
    # deleting the reader releases what it held
    cli("subscription", "delete", "t", "slow").ok()
    assert [d["ledger"] for d in cli("retention", "--json").ok().json["deleted"]] == [1, 2]


def test_read_ack_stops_at_a_dataloss_gap_and_retain_unread_keeps_what_follows(cli, deps):
    """A ledger whose tier-1 file is away (a mount hiccup, a wrong root) reads as a DATALOSS gap: `read --ack`
    acknowledges what it printed before it and fails there, so retain-unread still holds the ledger and the
    next read delivers it once the file is back."""
    produce(deps, "d", [entries(f"l{i}", 10, 100) for i in range(3)], TopicPolicy(**TEN), open_tail=[b"x"] * 2)
    cli("topic", "set", "d", "--retention-time", "0", "--retain-unread").ok()
    cli("subscription", "create", "d", "r").ok()
    path = deps.tier1.path("d", 1)
    away = path.with_name(path.name + ".away")
    path.rename(away)
    try:
        done = cli("read", "d", "--subscription", "r", "--ack", "--json")
        line = done.one_line_error(1)
        assert "ledger d/1 entries 0..9 are in no tier" in line, line
        assert "left at 0:9" in line, line
        assert [(r["ledger"], r["entry"]) for r in done.json_lines] == [(0, i) for i in range(10)]
        assert subs(cli, "d")["r"]["position"] == "0:9"
        assert [d["ledger"] for d in cli("retention", "--json").ok().json["deleted"]] == [0]
        # without --ack a read still prints the gap and goes on, as before
        plain = cli("read", "d", "--subscription", "r", "--json").ok().json_lines
        assert plain[0] == {"gap": "DATALOSS", "from": "1:0", "to": "1:9"} and plain[-1]["ledger"] == 3
    finally:
        away.rename(path)
    read = cli("read", "d", "--subscription", "r", "--ack", "--json").ok().json_lines
    assert [(r["ledger"], r["entry"]) for r in read] == [(1, i) for i in range(10)] + \
        [(2, i) for i in range(10)] + [(3, 0), (3, 1)]
    assert subs(cli, "d")["r"]["position"] == "3:1"


def test_ceilings_and_expiry_delete_unread_and_record_the_loss(cli, deps):
    produce(deps, "c", [entries(f"l{i}", 10, 100) for i in range(3)], TopicPolicy(**TEN))
    cli("topic", "set", "c", "--retention-time", "3600", "--retain-unread", "--max-retention-size", "1000").ok()
    cli("subscription", "create", "c", "r").ok()
    cli("subscription", "ack", "c", "r", "0:4").ok()
    preview = cli("retention", "--dry-run", "--json").ok().json
    got = cli("retention", "--json").ok().json
    assert preview["unread_deleted"] == got["unread_deleted"]  # the dry run's losses are the run's, item for item
    assert got["reasons"] == {"ceiling-size": 2}
    [loss] = got["unread_deleted"]
    assert (loss["entry_count"], loss["from"], loss["to"]) == (15, "0:5", "1:9")
    r = subs(cli, "c")["r"]
    assert (r["position"], r["unread_deleted_entry_count"], r["unread_deleted_bytes"]) == ("1:9", 15, 1500)
    assert "ceiling-size" in r["last_loss_reason"] and r["last_loss_at"]
    with deps.meta.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tiering.subscription_loss")).scalar() == 1
    # an abandoned reader expires: it holds nothing back and says so, and is never deleted
    cli("topic", "set", "c", "--subscription-expiry", "1", "--retention-time", "0", "--max-retention-size", "-1").ok()
    time.sleep(1.5)
    assert subs(cli, "c")["r"]["state"] == "EXPIRED"
    preview = cli("retention", "--dry-run", "--json").ok().json
    got = cli("retention", "--json").ok().json
    assert preview["unread_deleted"] == got["unread_deleted"]
    assert [d["ledger"] for d in got["deleted"]] == [2]
    assert "expired" in got["unread_deleted"][0]["reason"] and subs(cli, "c")["r"]["unread_deleted_entry_count"] == 25
    assert cli("subscription", "ack", "c", "r", "2:9", "--json").ok().json["state"] == "ACTIVE"  # an ack revives it


def test_truncate_refuses_to_cut_past_an_active_reader_unless_forced(cli, deps):
    produce(deps, "k", [entries(f"l{i}", 10, 100) for i in range(3)], TopicPolicy(**TEN))
    cli("subscription", "create", "k", "r", "--from", "1:0").ok()
    cli("truncate", "k", "1:0").ok()  # ledger 0 was never this reader's
    before = snapshot(deps)
    assert "subscription 'r'" in cli("truncate", "k", "2:0").one_line_error(2)
    assert snapshot(deps) == before
    got = cli("truncate", "k", "2:0", "--force", "--json").ok().json
    assert got["unread_deleted"][0]["entry_count"] == 10 and "--force" in got["unread_deleted"][0]["reason"]


def test_topic_set_with_an_expected_version_never_writes_back_a_policy_read_before_another_change(
        cli, deps, monkeypatch):
    """`topic set --expect-version 1` reading the policy at version 0, then another operator's change (to
    --retain-unread) moving it to 1: the compare-and-set on 1 passed and wrote the policy read at 0 back,
    undoing the other change with both at exit 0 (retention then deleted unread data). It is refused."""
    from tiering.errors import ConditionalUpdateFailed
    from tiering.ops.topics import set_policy

    cli("topic", "create", "v").ok()
    read = deps.meta.get_topic

    def read_then_another_change(name, *args, **kwargs):
        got = read(name, *args, **kwargs)
        cli("topic", "set", "v", "--retain-unread").ok()
        return got

    monkeypatch.setattr(deps.meta, "get_topic", read_then_another_change)
    with pytest.raises(ConditionalUpdateFailed, match="version 1"):
        set_policy(deps, "v", {"retention_seconds": 3600}, expected_version=1)
    monkeypatch.undo()
    shown = cli("topic", "show", "v", "--json").ok().json
    assert shown["retain_unread"] is True and shown["version"] == 1 and shown["retention_seconds"] != 3600, shown


def test_topic_set_is_a_compare_and_set(cli, deps):
    cli("topic", "create", "p").ok()
    changed = cli("topic", "set", "p", "--retention-size", "1000", "--json").ok().json
    assert changed["version"] == 1 and changed["retention_bytes"] == 1000
    assert "version" in cli("topic", "set", "p", "--retention-time", "5", "--expect-version", "0").one_line_error(1)
    flags = [("--retention-time", "60", "retention_seconds", 60), ("--offload-after", "30", "offload_after_seconds", 30),
             ("--deletion-lag", "7", "deletion_lag_seconds", 7), ("--subscription-expiry", "99",
                                                                  "subscription_expiry_seconds", 99)]
    results = cli.many([("topic", "set", "p", flag, value) for flag, value, _, _ in flags])
    final = cli("topic", "show", "p", "--json").ok().json
    won = [f for f, r in zip(flags, results) if r.returncode == 0]
    for r in results:
        assert r.returncode == 0 or "conditional update" in r.one_line_error(1)
    assert final["version"] == 1 + len(won)  # every success counted once; no change lost silently
    assert all(final[field] == value for _, _, field, value in won)


def test_topic_delete_goes_through_gc_and_frees_the_name(cli, deps, tier1_root):
    from tiering.ops.offload import offload_many

    produce(deps, "d", [entries(f"l{i}", 10, 100) for i in range(3)], TopicPolicy(**TEN), open_tail=[b"tail"])
    offload_many(deps, deps.meta.list_ledgers("d", [S.SEALED])[:2])
    keys = {k for c in deps.meta.chunks("d").values() for k in (c.data_key, c.index_key)}
    cli("subscription", "create", "d", "reader").ok()
    before = snapshot(deps)
    assert "active subscription" in cli("topic", "delete", "d").one_line_error(2)
    assert snapshot(deps) == before
    got = cli("topic", "delete", "d", "--force", "--json").ok().json
    assert got["deleted_count"] == 4 and got["subscriptions_deleted"] == ["reader"]
    assert "does not exist" in cli("topic", "show", "d").one_line_error(2)
    with deps.meta.engine.connect() as conn:
        queued = set(conn.execute(text("SELECT key FROM tiering.gc_task")).scalars())
    assert keys <= queued  # every tier-2 object goes through the GC queue
    assert not any(p.is_file() for p in tier1_root.rglob("*"))
    cli("topic", "create", "d").ok()
    # the old topic's ids are below the new one's head, not past its end
    assert "position 1:0 is before the head of topic 'd' (it holds no ledger 1)" in \
        cli("subscription", "create", "d", "r", "--from", "1:0").one_line_error(2)
    assert cli("produce", "d", "--entries", "1", "--entry-size", "5").ok().stdout.strip() == "4:0"  # ids go on
    cli("subscription", "create", "d", "r", "--from", "4:0").ok()
    assert "position 3:0 is before the head of topic 'd' (its first ledger is 4)" in \
        cli("subscription", "create", "d", "s", "--from", "3:0").one_line_error(2)
    assert "position 2:9 is before the head of topic 'd' (it holds no ledger 2)" in \
        cli("subscription", "ack", "d", "r", "2:9", "--reset").one_line_error(2)
    assert "position 5:0 is beyond the end of topic 'd'" in cli("subscription", "ack", "d", "r", "5:0").one_line_error(2)


def test_a_subscription_created_while_its_topic_is_deleted_is_not_lost_silently(deps, monkeypatch):
    # step 1 refuses active readers; one created after it (before step 2 or 3) is refused the same way
    import pytest

    from tiering.errors import TieringError
    from tiering.ops.topics import delete_topic

    produce(deps, "r", [entries(f"l{i}", 10, 100) for i in range(3)], TopicPolicy(**TEN))
    trims, real = deps.meta.trims, deps.meta.trims.begin_topic_delete

    def then_a_reader(*args, **kwargs):
        out = real(*args, **kwargs)
        deps.meta.subs.create("r", "late", None)
        return out
    monkeypatch.setattr(trims, "begin_topic_delete", then_a_reader)
    with pytest.raises(TieringError, match="'late'.* created while the topic was being deleted"):
        delete_topic(deps, "r")
    assert [led.state for led in deps.meta.list_ledgers("r")] == [S.SEALED] * 3  # nothing deleted under it
    assert deps.meta.subs.get("r", "late").position is None
    monkeypatch.setattr(trims, "begin_topic_delete", real)
    deps.meta.subs.delete("r", "late")
    step3 = trims.finish_topic_delete
    monkeypatch.setattr(trims, "finish_topic_delete", _before(step3, lambda: deps.meta.subs.create("r", "later", None)))
    with pytest.raises(TieringError, match="'later'.* created while the topic was being deleted"):
        delete_topic(deps, "r")  # step 2 had deleted the ledgers: the reader found none, and the topic stays
    assert [led.state for led in deps.meta.list_ledgers("r")] == [S.DELETED] * 3
    assert deps.meta.subs.get("r", "later").position is None
    monkeypatch.setattr(trims, "finish_topic_delete", step3)
    step2 = trims.delete_all_ledgers
    monkeypatch.setattr(trims, "delete_all_ledgers", _before(step2, lambda: deps.meta.subs.create("r", "last", None)))
    report = delete_topic(deps, "r", force=True)  # --force deletes those too, and says so
    assert sorted(report.subscriptions_deleted) == ["last", "later"]
    assert [t.name for t in deps.meta.list_topics()] == []


def _before(fn, first):
    def wrapped(*args, **kwargs):
        first()
        return fn(*args, **kwargs)
    return wrapped


def test_a_subscription_from_the_first_entry_of_the_ledger_written_next(cli, deps):
    """N:0 of the next ledger (offload-prefix's 'everything before ledger N') starts where `latest` does and
    reads the next ledger from its first entry on; N+1:0 is beyond the end."""
    produce(deps, "nx", [entries("l0", 5, 10)], TopicPolicy(**TEN))
    assert cli("subscription", "create", "nx", "next", "--from", "1:0", "--json").ok().json["position"] == "0:4"
    assert "beyond the end" in cli("subscription", "create", "nx", "far", "--from", "2:0").one_line_error(2)
    cli("subscription", "create", "fresh", "s", "--from", "0:0").one_line_error(2)  # no such topic
    cli("topic", "create", "fresh").ok()
    assert cli("subscription", "create", "fresh", "s", "--from", "0:0", "--json").ok().json["position"] is None
    cli("produce", "nx", "--entries", "2", "--entry-size", "10").ok()
    read = cli("read", "nx", "--subscription", "next").ok().stdout.splitlines()
    assert [line.split("\t")[0] for line in read] == ["1:0", "1:1"]


def test_bad_input_is_one_line_and_changes_nothing(cli, deps):
    produce(deps, "b", [entries(f"l{i}", 10, 100) for i in range(2)], TopicPolicy(**TEN))
    cli("subscription", "create", "b", "s").ok()
    cli("truncate", "b", "1:0", "--force").ok()
    before = snapshot(deps)
    calls = []
    for args, code in [
        (("subscription", "create", "nope", "s"), 2), (("subscription", "create", "b", "s"), 2),
        (("subscription", "create", "b", "x", "--from", "0:0"), 2), (("subscription", "create", "b", "x", "--from", "9:0"), 2),
        (("subscription", "create", "b", "x", "--from", "1:11"), 2), (("subscription", "create", "b", "x", "--from", "soon"), 2),
        (("subscription", "create", "b", ""), 2), (("subscription", "create", "b", "a\nb"), 2),
        (("subscription", "ack", "b", "nope", "1:0"), 2), (("subscription", "ack", "b", "s", "7:0"), 2),
        (("subscription", "delete", "b", "nope"), 2), (("subscription", "list", "nope"), 2),
        (("read", "b", "--subscription", "nope"), 2), (("read", "b", "--ack"), 2),
        (("topic", "set", "b", "--max-retention-time", "-5"), 2), (("topic", "set", "b"), 2),
        (("topic", "set", "b", "--retention-time", "100", "--max-retention-time", "50"), 2),
        (("topic", "set", "b", "--subscription-expiry", "0"), 2), (("topic", "set", "nope", "--retention-time", "1"), 2),
        (("topic", "create", "n", "--retention-size", "10", "--max-retention-size", "9"), 2),
        (("topic", "delete", "nope"), 2), (("retention", "--dry-run", "--topic", "nope"), 2),
    ]:
        calls.append((args, code))
    for (args, code), result in zip(calls, cli.many([args for args, _ in calls])):
        result.one_line_error(code)
    assert snapshot(deps) == before
    assert json.loads(cli("topic", "show", "b", "--json").ok().stdout)["version"] == 0


def test_truncate_takes_an_offload_in_flight_with_the_rest_of_the_head(cli, deps, monkeypatch):
    """A ledger being offloaded when `truncate` runs is deleted with the ledgers after it (the trimmed head
    stays a prefix): the offload's commit loses, its objects stay queued for GC, and a subscriber does not
    skip the ledger's entries unrecorded."""
    from tiering.errors import TieringError
    from tiering.ops.offload import offload_ledger

    produce(deps, "f", [entries(f"l{i}", 10, 100) for i in range(3)], TopicPolicy(**TEN), open_tail=[b"o"])
    cli("subscription", "create", "f", "s").ok()
    real = deps.meta.complete_offload_batch
    truncated = []

    def truncate_meanwhile(items, attempt):
        truncated.append(cli("truncate", "f", "2:0", "--force", "--json").ok().json)
        return real(items, attempt)

    monkeypatch.setattr(deps.meta, "complete_offload_batch", truncate_meanwhile)
    with pytest.raises(TieringError):
        offload_ledger(deps, deps.meta.get_ledger("f", 0))
    assert [d["ledger"] for d in truncated[0]["deleted"]] == [0, 1]
    assert states(deps, "f")[:3] == [S.DELETED, S.DELETED, S.SEALED]
    listed = subs(cli, "f")["s"]
    assert listed["position"] == "1:9" and listed["unread_deleted_entry_count"] == 20
    # every object the attempt made is gone already or queued for GC: none is left unreferenced
    b = deps.bucket
    keys = {o["Key"] for o in b.s3.list_objects_v2(Bucket=b.name, Prefix=b.prefix).get("Contents", [])
            if not o["Key"].endswith("/_trimmed")}  # the trim marker
    with deps.meta.engine.connect() as conn:
        known = set(conn.execute(text("SELECT key FROM tiering.gc_task UNION SELECT data_key FROM tiering.chunk "
                                      "UNION SELECT index_key FROM tiering.chunk")).scalars())
    assert keys <= known, keys - known
    gap = cli("read", "f", "--json").ok().json_lines[0]
    assert gap == {"gap": "TRIMMED", "from": "0:0", "to": "1:9"}


def test_truncate_that_cannot_remove_a_tier1_copy_exits_1_as_retention_does(cli, deps, tmp_path):
    # a worker whose tier-1 root is not the one the files were written to (a wrong mount): the ledgers are
    # DELETED (committed) but their copies stay; that is a failed item, as `retention` reports it
    produce(deps, "w", [entries(f"l{i}", 10, 100) for i in range(3)], TopicPolicy(**TEN))
    elsewhere = tmp_path / "other-root"
    elsewhere.mkdir()
    got = cli("truncate", "w", "2:0", "--json", env={"TIERING_TIER1_ROOT": str(elsewhere)})
    assert "2 ledger(s) failed" in got.one_line_error(1)
    doc = got.json
    assert doc["deleted_count"] == 2 and [f["ledger"] for f in doc["failed"]] == [0, 1]
    assert states(deps, "w") == [S.DELETED, S.DELETED, S.SEALED]
    assert cli("retention", "--topic", "w", "--json").ok().json["files_removed_count"] == 2  # the right root


def test_a_topic_delete_that_fails_keeps_the_subscriptions(deps):
    # a producer still writing fails the delete (exit 1: stop it, run it again); until a delete deletes the
    # ledgers, the subscriptions stay, with the topic they read (not gone while all their entries remain)
    import pytest

    from tiering.errors import TieringError
    from tiering.ops.topics import delete_topic
    from tiering.writer import ManagedLedgerWriter

    produce(deps, "p", [entries(f"l{i}", 10, 100) for i in range(2)], TopicPolicy(**TEN), open_tail=[b"x"])
    deps.meta.subs.create("p", "reader", None)
    producer = ManagedLedgerWriter(deps.meta, deps.tier1, "p")  # holds the open ledger's file
    try:
        with pytest.raises(TieringError, match="being written"):
            delete_topic(deps, "p", force=True)
    finally:
        producer.close()
    assert deps.meta.subs.get("p", "reader").position is None
    assert states(deps, "p") == [S.SEALED, S.SEALED, S.OPEN]
    report = delete_topic(deps, "p", force=True)  # the producer stopped: the rerun deletes all, and says so
    assert report.subscriptions_deleted == ["reader"] and report.ledgers_deleted == 3


def test_a_subscription_from_latest_racing_retention_is_created_after_the_trim(deps, monkeypatch):
    """`--from latest` names no ledger: retention trimming the ledger holding the last entry between the
    lookup and the insert is no mistake of the caller; the subscription starts after the trimmed head."""
    from tiering.ops import subscriptions as ops
    from tiering.ops.retention import retention

    produce(deps, "lr", [entries(f"l{i}", 5, 10) for i in range(2)], TopicPolicy(retention_seconds=0, **TEN))
    real, trimmed = deps.meta.subs.create, []

    def retention_first(*args, **kwargs):
        if not trimmed:
            trimmed.append(retention(deps, "lr").deleted)
        return real(*args, **kwargs)
    monkeypatch.setattr(deps.meta.subs, "create", retention_first)
    sub = ops.create(deps, "lr", "late", "latest")
    assert trimmed == [[("lr", 0), ("lr", 1)]]
    # as `latest` after the trim: nothing live left to read, no loss
    assert sub.position is None and sub.last_loss_reason is None
    [listed] = ops.list_subscriptions(deps, "lr")
    assert listed.backlog_entries == 0


def test_an_open_ledger_without_its_file_fails_subscription_commands_instead_of_counting_it_empty(cli, deps):
    """The open ledger's file not where the row says (a wrong TIERING_TIER1_ROOT, a lost file): an ack inside
    it was refused as past its end (exit 2), `--from latest` started before its entries, `subscription list`
    left them out of every backlog and truncate refused a position inside it; each is exit 1 naming the file
    now, as `read` is, and nothing changes. `subscription list` still lists the other topics' subscriptions
    (and this one's, its backlog unknown) before it exits 1."""
    produce(deps, "a", [entries("s", 10, 10)], open_tail=[b"o"] * 7)
    produce(deps, "b", [entries("b", 4, 10)])
    cli("subscription", "create", "a", "s1", "--from", "1:2").ok()
    cli("subscription", "create", "b", "s2").ok()
    path = deps.tier1.path("a", 1)
    moved = path.with_name(path.name + ".away")
    path.rename(moved)
    try:
        before = snapshot(deps)
        for args in (("subscription", "ack", "a", "s1", "1:2"), ("subscription", "create", "a", "q", "--from", "latest"),
                     ("truncate", "a", "1:3")):
            assert "has no file" in cli(*args).one_line_error(1), args
        for args in (("subscription", "list", "a"), ("subscription", "list")):
            listed = cli(*args, "--json")
            assert "has no file" in listed.one_line_error(1), args
            rows = {r["subscription"]: r for r in json.loads(listed.stdout)["subscriptions"]}
            assert rows["s1"]["backlog_entry_count"] is None and "has no file" in rows["s1"]["error"]
            if args[-1] == "list":  # every topic: b's subscription listed as usual
                assert rows["s2"]["backlog_entry_count"] == 4 and "error" not in rows["s2"]
        text_rows = cli("subscription", "list")
        assert text_rows.returncode == 1 and [ln.split()[4] for ln in text_rows.stdout.splitlines()[1:]] == ["?", "4"]
        assert snapshot(deps) == before
        assert cli("truncate", "a", "1:0", "--json").ok().json["deleted"][0]["ledger"] == 0  # no length needed
    finally:
        moved.rename(path)
    assert cli("subscription", "ack", "a", "s1", "1:2", "--json").ok().json["position"] == "1:2"
    assert subs(cli, "a")["s1"]["backlog_entry_count"] == 4  # 1:3 to 1:6, in the open ledger

def test_an_open_ledger_file_that_cannot_be_opened_is_not_counted_empty(deps, monkeypatch):
    """The open ledger's file is there but cannot be opened (permissions, an I/O error, a dead mount): its
    backlog, `read` and `status` counted it empty at exit 0. Now the subscription's backlog is unknown
    (the others listed) and a read of it fails naming the file; the offload planning still counts it 0."""
    import errno
    import os as _os

    from tiering.errors import LedgerStorageError
    from tiering.ops import subscriptions as ops
    from tiering.read import ReadHandle
    from tiering.tier2.reader import tier2_opener
    from tiering.model import Position

    produce(deps, "u", [entries("u", 3, 10)], open_tail=[b"o"] * 4)
    produce(deps, "v", [entries("v", 2, 10)])
    deps.meta.subs.create("u", "su", None)
    deps.meta.subs.create("v", "sv", None)
    path = str(deps.tier1.path("u", 1))
    real_open = _os.open

    def denied(p, *args, **kwargs):
        if str(p) == path:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(p, *args, **kwargs)
    monkeypatch.setattr(_os, "open", denied)
    listed = {x.subscription.name: x for x in ops.list_subscriptions(deps)}
    assert listed["su"].backlog_entries is None and "Permission denied" in listed["su"].error
    assert listed["sv"].backlog_entries == 2 and listed["sv"].error is None
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket))
    with pytest.raises(LedgerStorageError, match="cannot be opened"):
        list(handle.read("u", Position(0, 0), None))
    from tiering.metadata.planning import SizeTopic
    from tiering.ops.offload import _open_sizes
    tid = deps.meta.get_topic("u").topic_id
    assert _open_sizes(deps, [SizeTopic(tid, "u", 1)]) == {(tid, 1): 0}


def test_an_io_error_reading_a_tier1_file_is_said_not_raised_raw_and_an_offloaded_copy_goes_on(deps, monkeypatch):
    """EIO while reading (not opening) a tier-1 file: a raw OSError failed `subscription list` whole and a
    read of an offloaded ledger whose tier-1 copy it was. Now the listing names the file for that topic alone,
    and the read goes on from the tier-2 copy."""
    import errno
    import os as _os

    from tiering.model import Position
    from tiering.ops import subscriptions as ops
    from tiering.ops.offload import offload_many
    from tiering.read import Entry, ReadHandle
    from tiering.tier1 import frames
    from tiering.tier2.reader import tier2_opener

    written = produce(deps, "w", [entries("w", 30, 10)], open_tail=[b"o"] * 4)
    produce(deps, "x", [entries("x", 2, 10)])
    assert offload_many(deps, deps.meta.list_ledgers("w", [S.SEALED])).failed == {}
    deps.meta.subs.create("w", "sw", None)
    deps.meta.subs.create("x", "sx", None)
    # the open ledger's frames; the offloaded ledger's frames (its header, trailer and index still read: the
    # read starts from tier 1, and fails when it reads the entries)
    frames_at = frames.HEADER_LEN[frames.VERSION]
    bad = {str(deps.tier1.path("w", 1)): range(frames_at, 10**6),
           str(deps.tier1.path("w", 0)): range(frames_at, 700)}
    real = frames._pread

    def failing(fd, n, offset):
        if offset in bad.get(_os.readlink(f"/proc/self/fd/{fd}"), ()):
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, n, offset)
    monkeypatch.setattr(frames, "_pread", failing)
    listed = {x.subscription.name: x for x in ops.list_subscriptions(deps)}
    assert listed["sw"].backlog_entries is None and "Input/output error" in listed["sw"].error
    assert listed["sx"].backlog_entries == 2
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket))
    got = [e for e in handle.read("w", Position(0, 0), Position(0, 29)) if isinstance(e, Entry)]
    assert {(e.ledger_id, e.entry_id): e.data for e in got} == {k: v for k, v in written.items() if k[0] == 0}


def test_a_reset_during_a_long_read_is_said_once(cli, deps):
    """A `read --ack` acks every 1,000 entries; each ack after an operator's reset finds it and leaves it, and
    each said so: one line per batch for the one reset."""
    produce(deps, "long", [entries("l", 5000, 100)], TopicPolicy(rollover_entries=10**6))
    cli("subscription", "create", "long", "r", "--from", "0:500").ok()
    reader = subprocess.Popen([sys.executable, "-m", "tiering", "read", "long", "--subscription", "r", "--ack",
                               "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli.env, cwd=cli.cwd)
    first = reader.stdout.readline()  # it started where the subscription was, and now waits on the full pipe
    assert json.loads(first)["entry"] == 500
    cli("subscription", "ack", "long", "r", "0:100", "--reset").ok()
    # read through the same buffered file as the first line (communicate() reads the descriptor, and would
    # miss what that buffer already holds); stderr holds a line or two, so it cannot fill meanwhile
    rest, err = reader.stdout.read(), reader.stderr.read()
    assert reader.wait(120) == 0 and len(rest.splitlines()) == 4499
    assert err.decode().count("was reset to 0:100 meanwhile") == 1, err.decode()
    assert subs(cli, "long")["r"]["position"] == "0:100"  # the replay asked for stays


def test_a_version_read_from_a_deleted_topic_does_not_match_the_topic_made_again_under_its_name(cli):
    """Both incarnations started at version 0, so `topic set --expect-version 0` read from the old topic
    changed the new one (exit 0), a topic the operator never looked at. The version goes on from the old
    topic's, as its ledger ids do."""
    cli("topic", "create", "aba", "--retention-time", "7d").ok()
    cli("topic", "set", "aba", "--retention-size", "1GiB").ok()  # version 1
    cli("topic", "delete", "aba").ok()
    again = cli("topic", "create", "aba", "--retention-time", "1h", "--json").ok().json
    assert again["version"] == 2
    for stale in ("0", "1"):
        assert "conditional update" in cli("topic", "set", "aba", "--max-retention-time", "2h",
                                           "--expect-version", stale).one_line_error(1)
    assert cli("topic", "show", "aba", "--json").ok().json["max_retention_seconds"] == -1
    cli("topic", "set", "aba", "--max-retention-time", "2h", "--expect-version", "2").ok()
