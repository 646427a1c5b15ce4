"""The operator's command line through real processes: every destructive command previews with --dry-run
(the real run's plan and output shape, nothing written anywhere), one JSON language across every command,
`topic stats`, offload-prefix to the end of a topic, units, and reads that say something."""
from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from tests.integration.helpers import bucket_keys, entries, produce
from tests.integration.test_cli import cli, snapshot  # noqa: F401 (the fixture)
from tiering.cli.output import check_document
from tiering.model import TopicPolicy
from tiering.ops.offload import offload_many

BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
STRAY = "t/stray/notes.txt"  # not a ledger object, no chunk references it, no task holds it: the sweep's orphan


def everything(deps) -> tuple:
    """snapshot() plus the tables it leaves out (the sweep's cursor, the maintained totals, attributes)."""
    with deps.meta.engine.connect() as conn:
        more = [conn.execute(text(f"SELECT * FROM tiering.{t} ORDER BY 1, 2")).all()
                for t in ("gc_sweep", "topic_usage", "attribute")]
    return snapshot(deps), more


def a_store_with_work_for_every_command(deps, s3_client, bucket) -> None:
    """d: two small offloaded ledgers (lagged copies, a defrag group), two sealed (offload backlog), an open
    tail; r: retention due; a queued key due for GC; an unreferenced object for the sweep."""
    produce(deps, "d", [entries(f"d{i}", 3, 100) for i in range(4)],
            TopicPolicy(offload_after_seconds=0, deletion_lag_seconds=0, offload_threshold_bytes=0, **BIG),
            open_tail=entries("tail", 1, 10))
    assert len(offload_many(deps, deps.meta.list_ledgers("d")[:2]).offloaded) == 2
    produce(deps, "r", [entries(f"r{i}", 2, 50) for i in range(2)], TopicPolicy(retention_seconds=0, **BIG))
    s3_client.put_object(Bucket=bucket, Key="t/queued/0-ledger-0", Body=b"queued")
    deps.meta.enqueue_gc(["t/queued/0-ledger-0"], "test")
    s3_client.put_object(Bucket=bucket, Key=STRAY, Body=b"left by hand")


DRY_RUNS = [
    ("offload-prefix", "d", "--all-sealed"), ("offload-prefix", "d", "3:0"), ("offload-by-age",), ("offload-by-size",),
    ("delete-lagged",), ("retention",), ("truncate", "d", "1:0"), ("defrag", "--small-bytes", "1MiB"), ("gc",),
    ("gc", "--sweep", "--orphan-grace-seconds", "0"),
]


def test_dry_run_prints_the_real_plan_and_writes_nothing(cli, deps, s3_client, bucket):
    a_store_with_work_for_every_command(deps, s3_client, bucket)
    before = everything(deps)
    previews = cli.many([(*args, "--dry-run", "--json") for args in DRY_RUNS])
    texts = cli.many([(*args, "--dry-run") for args in DRY_RUNS])
    assert everything(deps) == before, "a --dry-run changed a row, an object or a file"
    docs = {}
    for args, res, txt in zip(DRY_RUNS, previews, texts):
        doc = res.ok().json
        assert doc["dry_run"] is True and check_document(doc) == [], (args, doc, check_document(doc))
        assert txt.ok().stdout.strip(), args
        docs[args] = doc
    assert [x["ledger"] for x in docs[DRY_RUNS[0]]["offloaded"]] == [2, 3]
    assert docs[("offload-prefix", "d", "3:0")]["offloaded"] == [{"topic": "d", "ledger": 2}]
    assert docs[("delete-lagged",)]["deleted"] == [{"topic": "d", "ledger": 0}, {"topic": "d", "ledger": 1}]
    assert docs[("retention",)]["deleted"] == [{"topic": "r", "ledger": 0}, {"topic": "r", "ledger": 1}]
    assert docs[("truncate", "d", "1:0")]["deleted"] == [{"topic": "d", "ledger": 0}]
    assert docs[("defrag", "--small-bytes", "1MiB")]["group_count"] == 1
    assert docs[("gc",)]["deleted_count"] == 1
    sweep = docs[("gc", "--sweep", "--orphan-grace-seconds", "0")]
    assert sweep["orphans"] == [STRAY] and sweep["orphans_deleted_count"] == 1

    # the real runs do what the previews said, in the same shape
    for args in [("offload-by-age",), ("retention",), ("gc",)]:
        real = cli(*args, "--json").ok().json
        preview = {k: v for k, v in docs[args].items() if k not in ("dry_run", "plan")}
        assert sorted(real) == sorted(preview), (args, real, preview)
        for key in ("offloaded", "deleted", "deleted_count"):
            if key in real:
                assert real[key] == preview[key], (args, key, real[key], preview[key])
    assert "dry_run" not in real


def test_deleting_a_topic_or_a_subscription_can_be_previewed(cli, deps):
    """topic delete --dry-run refuses what the delete refuses, counts what it would delete (the open ledger
    and its tier-1 file too) and writes nothing; the real delete then reports the same."""
    produce(deps, "gone", [entries("g", 3, 100), entries("h", 2, 100)], TopicPolicy(**BIG),
            open_tail=entries("tail", 1, 10))
    offload_many(deps, deps.meta.list_ledgers("gone")[:1])
    cli("subscription", "create", "gone", "reader").ok()
    before = everything(deps)
    assert "active subscription" in cli("topic", "delete", "gone", "--dry-run").one_line_error(2)
    preview = cli("topic", "delete", "gone", "--force", "--dry-run", "--json").ok().json
    sub = cli("subscription", "delete", "gone", "reader", "--dry-run", "--json").ok().json
    assert "would delete topic 'gone'" in cli("topic", "delete", "gone", "--force", "--dry-run").ok().stdout
    assert everything(deps) == before, "a --dry-run changed a row, an object or a file"
    assert check_document(preview) == [] and check_document(sub) == []
    assert (sub["dry_run"], sub["subscription"]) == (True, "reader")
    assert (preview["dry_run"], preview["deleted_count"], preview["files_removed_count"]) == (True, 3, 3)
    assert preview["subscriptions_deleted"] == ["reader"] and preview["bytes"] == 3 * 100 + 2 * 100 + 10
    real = cli("topic", "delete", "gone", "--force", "--json").ok().json
    assert {k: v for k, v in preview.items() if k != "dry_run"} == real


def test_every_command_speaks_one_json_language(cli, deps, tmp_path):
    empty = cli.many([("topic", "list", "--json"), ("subscription", "list", "--json"), ("topic", "stats", "--json")])
    for res in empty:
        doc = res.ok().json
        assert check_document(doc) == [], (res.args, doc)
    created = cli("topic", "create", "j", "--rollover-entries", "3", "--offload-after", "0", "--deletion-lag", "0",
                  "--json").ok()
    assert len(created.stdout.splitlines()) == 1 and check_document(created.json) == []
    assert (created.json["command"], created.json["topic"]) == ("topic create", "j")
    status = cli("status", "j", "--json").ok().json  # a topic without ledgers: one object all the same
    assert status == {"command": "status", "topic": "j", "ledgers": []}
    produced = cli("produce", "j", "--entries", "7", "--entry-size", "10", "--json").ok()
    assert len(produced.stdout.splitlines()) == 1 and check_document(produced.json) == []
    assert produced.json == {"command": "produce", "topic": "j", "entry_count": 7, "first": "0:0", "last": "2:0",
                             "sealed_ledger": None}
    streamed = cli("read", "j", "--json").ok().json_lines  # the one stream: a line per entry or gap
    assert len(streamed) == 7 and all(check_document(x, stream=True) == [] for x in streamed)
    calls = [
        ("topic", "show", "j"), ("topic", "list"), ("topic", "set", "j", "--retention-size", "1GiB"),
        ("topic", "stats"), ("topic", "stats", "j"), ("status", "j"), ("offload-status", "j"),
        ("subscription", "create", "j", "s"), ("subscription", "list"), ("subscription", "ack", "j", "s", "0:1"),
        ("offload-by-age",), ("offload-by-size",), ("offload-prefix", "j", "--all-sealed"), ("delete-lagged",),
        ("retention",), ("defrag",), ("gc",), ("gc", "--sweep"), ("verify", "j"),
        ("export-metadata", str(tmp_path / "export")), ("topic", "set", "j", "--table", "lang.j"),
        ("table", "sync", "--dry-run"), ("table", "sync"), ("table", "status", "j"), ("table", "verify", "j"),
        ("table", "maintain", "--dry-run"), ("table", "maintain"), ("truncate", "j", "1:0", "--force"),
        ("seal", "j"), ("subscription", "delete", "j", "s"), ("topic", "delete", "j"),
    ]
    for args in calls:
        res = cli(*args, "--json").ok()
        assert len(res.stdout.splitlines()) == 1, (args, res.stdout)
        doc = res.json
        assert check_document(doc) == [], (args, doc, check_document(doc))
        assert doc["command"] == " ".join(a for a in args[:2] if not a.startswith("-") and a not in ("j", "s")
                                          and "/" not in a and ":" not in a), (args, doc["command"])


def test_topic_stats_from_the_maintained_totals(cli, deps):
    produce(deps, "s", [entries(f"s{i}", 3, 100) for i in range(3)], TopicPolicy(deletion_lag_seconds=0, **BIG),
            open_tail=entries("tail", 1, 100))
    offload_many(deps, deps.meta.list_ledgers("s")[:1])
    # a command that reads only the metadata needs neither the bucket nor tier 1
    doc = cli("topic", "stats", "s", "--json", unset=["TIERING_BUCKET", "TIERING_TIER1_ROOT"]).ok().json
    [t] = doc["topics"]
    assert (t["open_count"], t["sealed_count"], t["offloaded_count"], t["live_count"]) == (1, 2, 1, 4)
    assert (t["tier1_count"], t["tier2_count"], t["tier2_bytes"]) == (4, 1, 300)
    assert (t["backlog_count"], t["backlog_bytes"], t["lagged_count"], t["lagged_due_count"]) == (2, 600, 1, 1)
    assert t["oldest_ledger"] == 0 and t["oldest_ledger_age_seconds"] >= 0
    assert doc["gc_queue"]["pending_count"] == 0 and doc["last_success_by_job"] == {}
    assert "topic 'nope' does not exist" in cli("topic", "stats", "nope").one_line_error(2)
    listed = cli("topic", "list", unset=["TIERING_BUCKET", "TIERING_TIER1_ROOT"]).ok()
    assert listed.stdout == "s\n"


def test_offload_prefix_reaches_the_end_and_units_are_accepted(cli, deps):
    cli("topic", "create", "u", "--rollover-entries", "3", "--retention-time", "4h", "--retention-size", "10MiB",
        "--rollover-bytes", "64KiB", "--deletion-lag", "15m", "--subscription-expiry", "7d").ok()
    shown = cli("topic", "show", "u", "--json").ok().json
    assert (shown["retention_seconds"], shown["retention_bytes"], shown["rollover_bytes"]) == (14400, 10 * 2**20, 65536)
    assert (shown["deletion_lag_seconds"], shown["subscription_expiry_seconds"]) == (900, 7 * 86400)
    cli("produce", "u", "--entries", "6", "--entry-size", "10", "--seal").ok()
    assert "beyond the end" in cli("offload-prefix", "u", "3:0").one_line_error(2)  # 0, 1 sealed: the end is 2:0
    env = {"TIERING_BLOCK_SIZE": "5MiB", "TIERING_OFFLOAD_TIMEOUT_SECONDS": "1h"}  # settings take units too
    done = cli("offload-prefix", "u", "1:3", "--json", env=env).ok().json  # one past ledger 1's last entry
    assert [x["ledger"] for x in done["offloaded"]] == [0, 1] and done["first_not_offloaded"] == "2:0"
    cli("produce", "u", "--entries", "2", "--entry-size", "10", "--seal").ok()
    done = cli("offload-prefix", "u", "--all-sealed", "--json").ok().json
    assert done["offloaded"] == [{"topic": "u", "ledger": 2}] and done["position"] == "2:2"
    assert "TIERING_BLOCK_SIZE must be an integer in ASCII digits, or a size" in \
        cli("offload-prefix", "u", "--all-sealed", env={"TIERING_BLOCK_SIZE": "5 parsecs"}).one_line_error(2)


def test_reads_say_what_is_wrong_and_print_one_form(cli, deps):
    produce(deps, "r", [[b"plain", b"\x00\xffbin\n"], [b"x"]], TopicPolicy(**BIG))
    assert "beyond the end of topic 'r'" in cli("read", "r", "--from", "9:0").one_line_error(2)
    assert "beyond the end of ledger 0 (2 entries)" in cli("read", "r", "--from", "0:5000").one_line_error(2)
    assert cli("read", "r", "--from", "2:0").ok().stdout == ""  # the end of a sealed topic: nothing yet
    assert cli("read", "r", "--format", "hex").ok().stdout == "0:0\t706c61696e\n0:1\t00ff62696e0a\n1:0\t78\n"
    assert cli("read", "r", "--format", "base64", "--max-entries", "1").ok().stdout == "0:0\tcGxhaW4=\n"
    assert cli("read", "r", "--to", "0:1").ok().stdout == "0:0\tplain\n0:1\t\\x00\\xffbin\\n\n"
    cli("truncate", "r", "1:0").ok()
    lines = cli("read", "r").ok().stdout.splitlines()
    assert lines == ["# TRIMMED gap from 0:0 to 0:1", "1:0\tx"]


def test_errors_have_one_prefix_and_repeated_flags_are_refused(cli, deps):
    cli("topic", "create", "e").ok()
    before = snapshot(deps)
    for args in [("topic", "set", "e", "--offload-after", "3600", "--offload-after", "60"),
                 ("read", "e", "--max-entries", "1", "--max-entries", "2"), ("read",), ("topic", "stats", "a", "b")]:
        line = cli(*args).one_line_error(2)
        assert line.startswith("tiering: error: "), line
    assert "more than once" in cli("topic", "set", "e", "--deletion-lag", "1h", "--deletion-lag", "2h").one_line_error(2)
    assert snapshot(deps) == before
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "trades that for speed" not in readme
    assert bucket_keys(deps) == set()


def test_offload_status_text_shows_the_attempt_and_the_tier1_copy(cli):
    cli("topic", "create", "os", "--offload-after", "0").ok()
    cli("produce", "os", "--entries", "3", "--entry-size", "10", "--seal").ok()
    cli("offload-by-age").ok()
    header, row, *_ = cli("offload-status", "os").ok().stdout.splitlines()
    assert header.split() == ["ledger", "state", "attempt", "offloaded_at", "tier1", "keys"]
    doc = cli("offload-status", "os", "--json").ok().json["ledgers"][0]
    assert row.split() == ["0", "OFFLOADED", doc["attempt"], doc["offloaded_at"], "yes", doc["data_key"],
                           doc["index_key"]]
