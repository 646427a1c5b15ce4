"""The Spark jobs' item loop counts a lost compare-and-set as "skipped" only when every attempt lost it
(another worker holds the item throughout); a lost attempt of the job's own is retried, and a retry that
finds the item free does it (a failure is never reported as skipped)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tiering.config import Settings
from tiering.errors import ConditionalUpdateFailed, RecoveryRunning, TieringError
from tiering.jobs import runner

SETTINGS = Settings(database_url="postgresql://u@127.0.0.1:9/d", bucket="bkt", tier1_root=Path("/nonexistent"),
                    s3_endpoint_url="http://127.0.0.1:9", aws_access_key_id="k", aws_secret_access_key="s")


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(runner, "BACKOFF_SECONDS", 0)


def run_items(outcomes: list):
    """One item whose attempts raise or return `outcomes` in turn; returns the partition's counts."""
    calls = iter(outcomes)

    def work(_deps, _item):
        out = next(calls)
        if isinstance(out, BaseException):
            raise out
        return out

    [out] = list(runner._do_items(SETTINGS, work, [{"topic": "t", "ledger_id": 0}]))
    return {k: out[k] for k in ("done", "skipped", "failed")}


def lost():
    return ConditionalUpdateFailed("ledger t/0", "SEALED", "OFFLOADING")


def test_a_lost_attempt_that_succeeds_on_retry_is_done_not_skipped():
    assert run_items([lost(), (100, False)]) == {"done": 1, "skipped": 0, "failed": 0}


def test_an_item_found_finished_by_another_worker_on_retry_is_skipped():
    assert run_items([lost(), (0, True)]) == {"done": 0, "skipped": 1, "failed": 0}


def test_an_item_another_worker_holds_throughout_is_skipped():
    assert run_items([lost(), lost(), lost()]) == {"done": 0, "skipped": 1, "failed": 0}


def test_an_item_that_fails_after_losing_is_failed():
    assert run_items([lost(), TieringError("x"), TieringError("x")]) == {"done": 0, "skipped": 0, "failed": 1}


def test_an_item_that_failed_after_its_own_retries_is_failed_at_once():
    # GC's queue retries a failed delete on its own schedule: a retry here would claim other rows and pass
    assert run_items([runner.ItemFailed("1 queued object(s) not deleted"), (1, False)]) == \
        {"done": 0, "skipped": 0, "failed": 1}


def test_a_gc_run_whose_deletes_s3_refused_fails_as_the_cli_does(monkeypatch):
    # `tiering gc` exits 1 when a queued object could not be deleted; the DAG's job counted the run a success
    import argparse

    from tiering.jobs import gc
    from tiering.metadata.job_runs import JobOutcome
    from tiering.ops.gc import GcReport

    refused = GcReport(deleted=["t/a"], retried=1, failed=1,
                       failed_keys=[{"key": "t/b", "error": "S3 delete failed"}, {"key": "t/c", "error": "x"}])
    monkeypatch.setattr(gc, "run_gc", lambda deps, **kw: refused)
    with pytest.raises(runner.ItemFailed, match="2 could not be deleted from S3 .1 marked FAILED.*first: t/b"):
        gc.work(None, {"worker": 0})
    outcome = JobOutcome()
    gc.finish(None, argparse.Namespace(), outcome)
    assert outcome.errors and "could not be deleted from S3" in outcome.errors[0]  # an error fails the run
    monkeypatch.setattr(gc, "run_gc", lambda deps, **kw: GcReport(deleted=["t/a"]))
    assert gc.work(None, {"worker": 0}) == (1, False)
    outcome = JobOutcome()
    gc.finish(None, argparse.Namespace(), outcome)
    assert outcome.errors == []


def test_a_gc_item_refused_during_a_recovery_is_failed_at_once():
    # the recovery outlasts the item's backoff: a retry meets it again, and the run is not done either way
    assert run_items([RecoveryRunning("GC of the queue did not run"), (1, False)]) == \
        {"done": 0, "skipped": 0, "failed": 1}
