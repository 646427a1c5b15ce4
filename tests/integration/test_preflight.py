"""The `plan` task of every DAG, without Airflow: bad input is refused once with a sentence and a FAILED
job_run row; an idle run is recorded and skips Spark; work found lets Spark run. On PostgreSQL and S3."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tiering.errors import BadInput
from tiering.jobs.preflight import preflight
from tiering.ops.gc import plan_gc
from tiering.metadata.job_runs import RunRef
from tiering.model import TopicPolicy

BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)


def rows(deps):
    with deps.meta.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(
            "SELECT job, topic, status, error, details, kind, dag_id, dag_run_id, try_number "
            "FROM tiering.job_run ORDER BY run_id"))]


def go(deps, dag_id, conf, allowed, run="manual__1", settings=None):
    ref = RunRef(kind=dag_id.removeprefix("tiering_"), dag_id=dag_id, dag_run_id=run, try_number=1)
    return preflight(dag_id, conf, dict(conf), allowed, lambda: deps, ref, settings)


@pytest.mark.parametrize("dag_id, conf, allowed, says", [
    ("tiering_offload_by_age", {"typo_param": "x"}, {"topic"}, "does not take 'typo_param'; it takes: topic"),
    ("tiering_offload_by_age", {"position": "1:0"}, {"topic"}, "does not take 'position'"),
    ("tiering_gc", {"topic": "orders"}, set(), "does not take 'topic'; it takes: no parameters"),
    ("tiering_offload_prefix", {"topic": "nope", "position": "1:0"}, {"topic", "position"},
     "topic 'nope' does not exist"),
    ("tiering_offload_prefix", {"topic": "t", "position": "12"}, {"topic", "position"}, "malformed position '12'"),
    # refused names that PostgreSQL text cannot hold: the refusal is still recorded (without the name), not a
    # traceback while recording it, which Airflow would retry
    ("tiering_offload_by_age", {"topic": "a\ud800"}, {"topic"}, "must be valid UTF-8"),
    ("tiering_retention", {"topic": "a\x00b"}, {"topic"}, "with NUL"),
    ("tiering_defrag", {"topic": ["orders"]}, {"topic"}, "a topic name is a string, got list"),
    # a misspelt topic would plan nothing: the run would skip Spark and report success
    ("tiering_offload_by_age", {"topic": "nope"}, {"topic", "max_bytes_per_second"}, "topic 'nope' does not exist"),
    # the scrub has no plan here (it always runs Spark): a misspelt topic is still refused before Spark starts
    ("tiering_scrub", {"topic": "nope"}, {"topic", "repair"}, "topic 'nope' does not exist"),
])
def test_bad_input_is_refused_once_with_a_sentence_and_a_failed_row(deps, dag_id, conf, allowed, says):
    produce(deps, "t", [[b"a"]], TopicPolicy(**BIG))
    with pytest.raises(BadInput, match=says.replace("(", r"\(")):
        go(deps, dag_id, conf, allowed)
    [row] = rows(deps)
    assert row["status"] == "FAILED" and says in row["error"] and row["error"].startswith("bad input: ")
    assert (row["dag_id"], row["dag_run_id"], row["try_number"]) == (dag_id, "manual__1", 1)


def test_a_scrub_of_a_topic_that_exists_runs_spark(deps):
    produce(deps, "t", [[b"a"]], TopicPolicy(**BIG))
    result = go(deps, "tiering_scrub", {"topic": "t"}, {"topic", "repair"})
    assert result.run_spark and result.planned is None and result.args == ["--topic=t"] and rows(deps) == []


def test_an_export_under_the_tier2_prefix_is_refused_before_spark(deps, settings):
    # GC's orphan sweep deletes every object under the prefix that is not a ledger's: the export with it
    dest = f"s3://{deps.bucket.name}/{deps.bucket.prefix}backup"
    with pytest.raises(BadInput, match="under the tier-2 prefix"):
        go(deps, "tiering_metadata_export", {"dest": dest}, {"dest"}, settings=settings)
    [row] = rows(deps)
    assert row["status"] == "FAILED" and "which GC's orphan sweep owns" in row["error"]
    result = go(deps, "tiering_metadata_export", {"dest": f"s3://{deps.bucket.name}/elsewhere"}, {"dest"},
                settings=settings)
    assert result.run_spark and result.args == [f"--dest=s3://{deps.bucket.name}/elsewhere"]


def test_what_the_export_would_refuse_after_spark_started_is_refused_before(deps, settings, tmp_path):
    # each of these was refused by the job inside Spark, and the task retried it twice
    from tiering.ops.export_metadata import export_metadata, filesystem_for

    def refused(dest, says):
        with pytest.raises(BadInput, match=says):
            go(deps, "tiering_metadata_export", {"dest": dest}, {"dest"}, settings=settings)

    export_metadata(deps.meta.engine, *filesystem_for(str(tmp_path / "done")))
    refused(str(tmp_path / "done"), "already holds a complete export")
    (tmp_path / "mixed" / "topic").mkdir(parents=True)
    (tmp_path / "mixed" / "topic" / "notes.txt").write_text("mine")
    refused(str(tmp_path / "mixed"), "notes.txt is not a part of a metadata export")
    refused(str(tmp_path / "deep") + "/d" * 1990, "longer than the system allows")  # fits; its parts would not
    refused(str(tmp_path / "deep") + "/d" * 2100, "File name too long")
    refused("/proc/tiering-export", "no directory can be made in '/proc'")
    refused("s3://no-such-bucket-of-tiering/x", "bucket 'no-such-bucket-of-tiering' does not exist")
    assert [r["status"] for r in rows(deps)] == ["FAILED"] * 6
    assert not (tmp_path / "deep").exists() and (tmp_path / "mixed" / "topic" / "notes.txt").read_text() == "mine"
    assert go(deps, "tiering_metadata_export", {"dest": str(tmp_path / "new" / "dir")}, {"dest"},
              settings=settings).run_spark


def test_an_export_to_a_local_path_that_is_not_a_directory_is_refused_before_spark(deps, tmp_path):
    # the job refused it after Spark had started, and the task was retried
    (tmp_path / "afile").write_text("x")
    for dest in (str(tmp_path / "afile"), (tmp_path / "afile" / "sub").as_uri()):
        with pytest.raises(BadInput, match="is not a directory"):
            go(deps, "tiering_metadata_export", {"dest": dest}, {"dest"})
    assert [r["status"] for r in rows(deps)] == ["FAILED", "FAILED"]


def test_an_idle_offload_is_recorded_and_skips_spark(deps):
    produce(deps, "idle", [entries("i", 3, 10)], TopicPolicy(**BIG))  # offload_after -1: never by age
    result = go(deps, "tiering_offload_by_age", {}, {"topic"}, run="scheduled__2026")
    assert result.planned == 0 and not result.run_spark and result.args == ["--by=age"]
    [row] = rows(deps)
    assert row["status"] == "SUCCEEDED" and row["kind"] == "offload_by_age"
    assert row["details"] == {"planned": 0, "spark": "skipped"} and row["dag_run_id"] == "scheduled__2026"


def test_work_found_runs_spark_and_leaves_the_row_to_the_job(deps):
    produce(deps, "due", [entries("d", 3, 10)], TopicPolicy(offload_after_seconds=0, **BIG))
    result = go(deps, "tiering_offload_by_age", {"topic": "due"}, {"topic"})
    assert result.planned == 1 and result.run_spark and result.args == ["--by=age", "--topic=due"]
    assert rows(deps) == []


def test_jobs_without_a_cheap_plan_always_run(deps):
    result = go(deps, "tiering_gc_sweep", {}, set())
    assert result.planned is None and result.run_spark and rows(deps) == []


def test_gc_skips_spark_when_nothing_is_due_and_runs_when_a_key_is(deps):
    """The hourly GC plans from the queue's due rows and the stale uploads, not the bucket: listing
    the bucket every hour would cost what the bucket holds, not what is due."""
    deps.meta.enqueue_gc(["t/later"], "not due yet", delay=timedelta(hours=1))
    idle = go(deps, "tiering_gc", {}, set(), run="scheduled__1")
    assert idle.planned == 0 and not idle.run_spark
    assert [(r["kind"], r["status"], r["details"]) for r in rows(deps)] == [
        ("gc", "SUCCEEDED", {"planned": 0, "spark": "skipped"})]
    deps.meta.enqueue_gc(["t/now"], "due")
    assert go(deps, "tiering_gc", {}, set(), run="scheduled__2").planned == 1
    deps.bucket.s3.create_multipart_upload(Bucket=deps.bucket.name, Key="t/upload")
    assert plan_gc(deps) == (1, 0) and plan_gc(deps, orphan_grace=timedelta(0)) == (1, 1)  # stale once old


def test_retention_skips_spark_when_no_topic_is_due_and_runs_when_one_is(deps):
    """Retention's plan names only topics with work (ledgers due, a trim marker behind, a trimmed
    ledger's tier-1 copy left), so an idle hourly run starts no Spark."""
    produce(deps, "keep", [entries(f"k{i}", 3, 10) for i in range(3)], TopicPolicy(retention_bytes=10**9, **BIG))
    idle = go(deps, "tiering_retention", {}, {"topic"}, run="scheduled__1")
    assert idle.planned == 0 and not idle.run_spark
    assert [(r["kind"], r["details"]) for r in rows(deps)] == [("retention", {"planned": 0, "spark": "skipped"})]
    produce(deps, "trim", [entries(f"t{i}", 3, 10) for i in range(3)], TopicPolicy(retention_bytes=1, **BIG))
    assert go(deps, "tiering_retention", {}, {"topic"}, run="scheduled__2").planned == 1


def test_a_recoverys_idle_preview_is_recorded_as_a_preview(deps):
    """Nothing to recover: the plan task records the run as a preview's job, never the last recovery."""
    result = go(deps, "tiering_recover", {"dry_run": True}, {"topic", "check_pages", "dry_run"})
    assert result.planned == 0 and not result.run_spark and result.args == ["--dry-run"]
    assert [(r["job"], r["kind"], r["status"], r["details"]) for r in rows(deps)] == [
        ("recover_dry_run", "recover", "SUCCEEDED", {"planned": 0, "spark": "skipped", "dry_run": True})]
    go(deps, "tiering_recover", {}, {"topic", "check_pages", "dry_run"})
    assert [r["job"] for r in rows(deps)] == ["recover_dry_run", "recover"]
