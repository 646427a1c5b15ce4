"""A trim marker in the bucket that is not one (corrupt, hostile, cut short): GC's sweep takes it as no
marker and deletes nothing on its word, recovery reports it by name with one line and commits nothing of
that topic, retention writes its own over it. PostgreSQL and RGW."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest

from tests.integration.helpers import bucket_keys
from tests.integration.test_cli import cli, read_data  # noqa: F401 - the fixture
from tests.integration.test_export_recover import new_database  # noqa: F401  (extra databases)
from tests.integration.test_sweep_guards import _offloaded_topics
from tiering.format.keys import trim_marker_key
from tiering.model import Position
from tiering.ops.gc import sweep_orphans
from tiering.ops.recover import recover_from_bucket
from tiering.ops.retention import truncate
from tiering.ops.topics import delete_topic
from tiering.tier2.markers import read_trim_marker

NOT_MARKERS = [b"\xff\xfe", b"", b"{}", b"[1]", b'{"trimmed_before_ledger": "9"}', b'{"trimmed_before_ledger": -5}',
               b'{"trimmed_before_ledger": 1.5}', b'{"trimmed_before_ledger": true}',
               # valid JSON, yet no ledger id: past int64 (every ledger of the topic below it), nested too deep
               # for the parser (RecursionError, not a ValueError)
               b'{"trimmed_before_ledger": 1' + b"0" * 40 + b"}", b'{"trimmed_before_ledger": %d}' % 2**63,
               b'{"trimmed_before_ledger": ' + b"[" * 2000 + b"]" * 2000 + b"}", b"1" * 5000]
HOSTILE = NOT_MARKERS[-4:-1]


def _put(deps, key, body):
    deps.bucket.s3.put_object(Bucket=deps.bucket.name, Key=key, Body=body)


def test_the_sweep_deletes_nothing_on_the_word_of_a_corrupt_marker(deps):
    _offloaded_topics(deps, ["live", "gone"], n=2)  # live: the sweep refuses a database that references nothing
    s3, name = deps.bucket.s3, deps.bucket.name
    data_key = deps.meta.get_chunk(deps.meta.list_ledgers("gone")[0]).data_key
    left = f"{data_key.rsplit('/', 1)[0]}/00000000-0000-0000-0000-000000000004-ledger-0"
    for suffix in ("", "-index"):  # an older attempt's pair of ledger 0, which no queue row holds
        s3.copy_object(Bucket=name, Key=left + suffix, CopySource={"Bucket": name, "Key": data_key + suffix})
    delete_topic(deps, "gone")  # its marker: trimmed before ledger 2
    marker = trim_marker_key(deps.bucket.prefix, "gone")
    for body in NOT_MARKERS:
        _put(deps, marker, body)
        assert sweep_orphans(deps, orphan_grace=timedelta(0)).orphans_deleted == [], body
        assert {left, left + "-index"} <= bucket_keys(deps), body
    _put(deps, marker, json.dumps({"trimmed_before_ledger": 2}).encode())
    assert sorted(sweep_orphans(deps, orphan_grace=timedelta(0)).orphans_deleted) == [left, left + "-index"]


@pytest.mark.parametrize("body", NOT_MARKERS[:3] + HOSTILE + NOT_MARKERS[-1:])
def test_recovery_names_a_corrupt_marker_and_commits_nothing_of_its_topic(deps, new_database, body):  # noqa: F811
    _offloaded_topics(deps, ["t", "u"], n=3)
    truncate(deps, "t", Position(1, 0))
    marker = trim_marker_key(deps.bucket.prefix, "t")
    assert read_trim_marker(deps.bucket, "t") == 1
    _put(deps, marker, body)
    target = new_database()
    report = recover_from_bucket(target, deps.bucket)
    [error] = report.errors
    assert error.startswith("topic 't': corrupt trim marker at ") and marker in error and "\n" not in error
    assert "rewrite or delete it" in error
    assert sorted(report.topics_created) == ["u"]


@pytest.mark.parametrize("body", [b"not a marker"] + HOSTILE)
def test_retention_writes_its_marker_over_a_corrupt_one(deps, body):
    _offloaded_topics(deps, ["t"], n=3)
    marker = trim_marker_key(deps.bucket.prefix, "t")
    _put(deps, marker, body)
    truncate(deps, "t", Position(2, 0))
    assert read_trim_marker(deps.bucket, "t") == 2


def test_two_runs_moving_the_marker_at_once_never_move_it_back(deps, monkeypatch):
    """Two trims of a topic finishing at once (retention by Airflow and by hand, truncate, topic delete): the
    run with the lower trim point reads the marker, the other writes its higher one, then the first PUTs its
    lower one over it. Metadata keeps the higher as written (greatest), so no later run rewrites it: the
    bucket says less is trimmed than is, and a recovery from it brings trimmed ledgers back."""
    import threading
    import time

    from sqlalchemy import text

    from tests.integration.helpers import entries, produce
    from tiering.model import TopicPolicy
    from tiering.ops import retention as ret
    from tiering.tier2 import markers

    produce(deps, "m", [entries(f"l{i}", 2, 10) for i in range(5)], TopicPolicy(rollover_entries=2))
    deps.meta.trims.truncate("m", Position(2, 0), False, timedelta(0))  # metadata only: trim point 2
    real, faster = markers.readable_or_none, []

    def other_run_meanwhile(*args):
        seen = real(*args)
        if not faster:  # the slower run has read the marker: another trims further and moves it
            deps.meta.trims.truncate("m", Position(4, 0), False, timedelta(0))
            faster.append(threading.Thread(target=ret._move_trim_marker, args=(deps, "m")))
            faster[0].start()
            deadline = time.monotonic() + 30
            while faster[0].is_alive() and time.monotonic() < deadline:  # done, or waiting for this run
                with deps.meta.engine.connect() as conn:
                    if conn.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                         "AND NOT granted AND database = (SELECT oid FROM pg_database "
                                         "WHERE datname = current_database())")).scalar():
                        break
                time.sleep(0.05)
        return seen
    monkeypatch.setattr(markers, "readable_or_none", other_run_meanwhile)
    ret._move_trim_marker(deps, "m")
    faster[0].join(30)
    assert not faster[0].is_alive()
    assert read_trim_marker(deps.bucket, "m") == 4
    assert deps.meta.planning.trim_point("m") == (4, 4)


def test_a_trim_whose_marker_cannot_be_written_reports_what_it_deleted(cli):  # noqa: F811
    """The trim commits, then its marker's PUT fails (tier 2 down): the run reported nothing deleted (the
    marker's error replaced its report), so no run ever said which ledgers went and which subscription lost
    unread entries. Now the deletion and the loss are reported beside the failed marker (exit 1), the tier-1
    copies wait for the marker, and the next run with tier 2 back writes it and removes them."""
    down = {"TIERING_S3_ENDPOINT_URL": "http://127.0.0.1:9"}  # nothing listens: refused at once
    for name in ("tt", "tr"):
        cli("topic", "create", name, "--rollover-entries", "2").ok()
        cli("produce", name, "--entries", "7", "--entry-size", "10").ok()  # ledgers 0-2 sealed, 3 open
        cli("subscription", "create", name, "s", "--from", "earliest").ok()

    res = cli("truncate", "tt", "2:0", "--force", "--json", env=down)
    assert "trim marker not written" in res.one_line_error(1)
    doc = res.json
    assert doc["deleted_count"] == 2 and doc["files_removed_count"] == 0
    assert [(u["subscription"], u["entry_count"]) for u in doc["unread_deleted"]] == [("s", 4)]
    assert [(f["topic"], f["ledger"]) for f in doc["failed"]] == [("tt", None)]

    cli("topic", "set", "tr", "--max-retention-size", "30").ok()  # a ceiling below what the topic holds
    res = cli("retention", "--topic", "tr", "--json", env=down)
    assert "trim marker not written" in res.one_line_error(1)
    gone = res.json["deleted_count"]
    assert gone >= 1 and [u["entry_count"] for u in res.json["unread_deleted"]] == [2 * gone]

    healed = cli("retention", "--json").ok().json  # tier 2 is back: the markers, then the copies
    assert healed["deleted_count"] == 0 and healed["files_removed_count"] == 2 + gone and healed["failed"] == []
    assert min(read_data(cli("read", "tt", "--json"))) == (2, 0)
    assert min(read_data(cli("read", "tr", "--json"))) == (gone, 0)


def test_a_topic_delete_whose_marker_cannot_be_written_says_what_it_did_and_finishes_on_a_rerun(cli):  # noqa: F811
    cli("topic", "create", "td", "--rollover-entries", "2").ok()
    cli("produce", "td", "--entries", "5", "--entry-size", "10").ok()
    msg = cli("topic", "delete", "td", env={"TIERING_S3_ENDPOINT_URL": "http://127.0.0.1:9"}).one_line_error(1)
    assert "3 ledger(s) deleted by this run, but its trim marker was not written" in msg, msg
    assert "run the delete again" in msg
    cli("topic", "delete", "td").ok()
    assert cli("topic", "list", "--json").ok().json["topics"] == []


def test_retention_text_counts_the_steps_not_done_and_the_topics_they_fall_in(cli):  # noqa: F811
    down = {"TIERING_S3_ENDPOINT_URL": "http://127.0.0.1:9"}
    for name in ("ra", "rb"):
        cli("topic", "create", name, "--rollover-entries", "2", "--max-retention-size", "30").ok()
        cli("produce", name, "--entries", "7", "--entry-size", "10").ok()
    res = cli("retention", env=down)
    assert "2 step(s) failed; first: 'ra': trim marker not written" in res.one_line_error(1)
    assert "; 2 step(s) not done in 2 topic(s)" in res.stdout, res.stdout
