"""A batch that fails after it started fails loudly: its ledgers are retried one by one
from their CURRENT rows (the batch's begin and undo moved each version on twice, so the rows read before it
lost every compare-and-set and all were reported "skipped", exit 0); "skipped" means another worker holds or
finished the ledger, everything else is failed with its reason. The failure's reproduction, through the CLI, on
the run's S3 (Ceph RGW) and PostgreSQL, with the product's default batching."""
from __future__ import annotations

from tests.integration.helpers import MIB, entries, produce
from tests.integration.test_cli import cli  # noqa: F401  (the fixture)
from tiering.model import LedgerState as S


def test_a_missing_tier1_file_fails_its_ledger_and_the_others_of_its_batch_offload(cli, deps):  # noqa: F811
    cli.env["TIERING_OFFLOAD_BATCH_BYTES"] = str(8 * MIB)  # the product's default (the tests' settings say 0)
    cli("topic", "create", "t", "--offload-after", "0", "--deletion-lag", "86400", "--rollover-entries", "10").ok()
    cli("produce", "t", "--entries", "35", "--entry-size", "100").ok()
    assert [led.state for led in deps.meta.list_ledgers("t")] == [S.SEALED] * 3 + [S.OPEN]
    path = deps.tier1.path("t", 1)
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)  # `rm` it (kept aside to restore it below)

    run = cli("offload-by-age", "--json")
    assert run.returncode == 1, (run.stdout, run.stderr)
    report = run.json
    assert report["planned_count"] == 3
    assert sorted((p["topic"], p["ledger"]) for p in report["offloaded"]) == [("t", 0), ("t", 2)], report
    assert report["skipped"] == []
    assert [(f["topic"], f["ledger"]) for f in report["failed"]] == [("t", 1)], report["failed"]
    line = run.stderr.strip()
    assert len(run.stderr.splitlines()) == 1 and "ledger 1" in line and "1 ledger(s) failed" in line, line
    assert [led.state for led in deps.meta.list_ledgers("t")] == [S.OFFLOADED, S.SEALED, S.OFFLOADED, S.OPEN]

    again = cli("offload-by-age")  # every time the same, never "skipped"
    assert again.returncode == 1 and "offloaded 0 ledger(s)" in again.stdout and "skipped 0, failed 1" in again.stdout

    aside.rename(path)  # the file is back: the rerun offloads it
    done = cli("offload-by-age", "--json").ok().json
    assert done["offloaded"] == [{"topic": "t", "ledger": 1}] and done["failed"] == [] and done["skipped"] == []
    assert [led.state for led in deps.meta.list_ledgers("t")] == [S.OFFLOADED] * 3 + [S.OPEN]
    assert cli("verify", "t").ok().stdout.endswith("OK\n")


def test_the_offload_jobs_batch_item_fails_only_the_ledger_whose_file_is_gone(deps):
    """tiering/jobs/offload.py's work() on a batch item (Spark's per-item call, minus Spark): the batch fails,
    each ledger goes alone from its current row, the item fails naming ledger 1 and the others are offloaded
    (before, the ledgers after the culprit were never attempted: one missing file stalled the topic)."""
    import argparse
    import dataclasses

    import pytest

    from tiering.errors import TieringError
    from tiering.jobs import offload as job
    from tiering.model import TopicPolicy

    deps = dataclasses.replace(deps, knobs=dataclasses.replace(deps.knobs, batch_small_bytes=8 * MIB))
    produce(deps, "j", [entries(f"j{i}", 4, 1000) for i in range(3)],
            TopicPolicy(offload_after_seconds=0, rollover_entries=10**9, rollover_bytes=2**40), open_tail=[b"o"])
    items = job.plan(deps, argparse.Namespace(prefix=None, by="age", topic="j", position=None))
    assert items == [{"topic": "j", "ledger_ids": [0, 1, 2]}]
    deps.tier1.path("j", 1).unlink()
    with pytest.raises(TieringError, match="ledger 1"):
        job.work(deps, items[0])
    assert [led.state for led in deps.meta.list_ledgers("j")] == [S.OFFLOADED, S.SEALED, S.OFFLOADED, S.OPEN]


def test_the_offload_jobs_end_names_planned_ledgers_left_undone(deps, db):
    """jobs/offload.py's `lost` (the runner's check at the run's end): of the planned ledgers, one
    still SEALED and one OFFLOADING whose worker is gone are named; one OFFLOADING under a live worker's lock
    (another worker's) and one OFFLOADED are not."""
    import uuid
    from datetime import timedelta

    from tiering.jobs import offload as job
    from tiering.model import TopicPolicy
    from tiering.ops.offload import offload_ledger

    produce(deps, "e", [entries(f"e{i}", 2, 100) for i in range(4)],
            TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40), open_tail=[b"o"])
    leds = deps.meta.list_ledgers("e")
    offload_ledger(deps, leds[3])
    dead = str(uuid.uuid4())
    deps.meta.begin_offload(leds[1], dead, ["d1", "i1"], timedelta(hours=1))  # nobody holds its lock
    with deps.meta.new_attempt() as alive:
        deps.meta.begin_offload(leds[2], alive, ["d2", "i2"], timedelta(hours=1))
        items = [{"topic": "e", "ledger_id": 0}, {"topic": "e", "ledger_ids": [1, 2, 3]},
                 {"topic": "nope", "ledger_id": 0}]
        lost = job.lost(deps, items)
    assert len(lost) == 2, lost
    assert lost[0].startswith("ledger e/0 is still SEALED")
    assert lost[1].startswith(f"ledger e/1: its offload attempt {dead} lost its worker")
