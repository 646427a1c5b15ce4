"""The recovery job's driver plan and executor partitions (tiering/jobs/recover.py) as Spark runs them, minus
Spark, against the real services: topics by key segment and by tier-1 directory, a long topic's hashed
segment and cut directory name, and a tier-1 root that is not the driver's. One real Spark run of the job
is in tests/dags/test_recover_dag.py."""
from __future__ import annotations

from argparse import Namespace

from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tiering.format.keys import encode_topic
from tiering.jobs import recover as job
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.offload import offload_many
from tiering.tier1 import topic_dir_name
from tiering.tier1.marker import MARKER, root_token
from tiering.tier1.paths import NAME_FILE

LONG = "L" * 250  # its key segment is hashed, its tier-1 directory name cut: only its index names it
LONG_T1 = "M" * 250  # never offloaded: only the name beside its ledgers names it


def lose_metadata(db) -> None:
    with db.begin() as conn:
        conn.execute(text("TRUNCATE tiering.topic, tiering.ledger, tiering.chunk, tiering.gc_task, "
                          "tiering.attribute, tiering.job_run CASCADE"))


def world(deps) -> None:
    for name in ("a", LONG):
        produce(deps, name, [entries(name[:1], 3, 100), entries(name[:1] + "2", 2, 100)], open_tail=[b"tail"])
        offload_many(deps, [deps.meta.get_ledger(name, 0)])  # ledger 1 SEALED, ledger 2 OPEN: tier 1 only
    produce(deps, "b/tier 1 only", [entries("b", 4, 10)])
    produce(deps, LONG_T1, [entries("m", 1, 10)])


def states(deps, name):
    return [(led.ledger_id, led.state, led.entry_count, led.tier1_present) for led in deps.meta.list_ledgers(name)]


def test_plan_and_partitions_recover_every_topic_and_report_the_unnamed_directory(deps, db, settings):
    world(deps)
    for name in (LONG, LONG_T1):  # directories made before tier 1 wrote a long topic's name beside its ledgers
        (deps.tier1.root / topic_dir_name(name) / NAME_FILE).unlink()
    lose_metadata(db)
    items, unnamed = job._plan(deps, Namespace(topic=None))
    assert sorted(i["segment"] for i in items) == sorted([encode_topic("a"), encode_topic(LONG),
                                                          encode_topic("b/tier 1 only")])
    assert [i.get("topic") for i in items if i["segment"] == encode_topic("b/tier 1 only")] == ["b/tier 1 only"]
    # the driver cannot tell which cut directory name belongs to the hashed segment: the executors tell it
    assert sorted(unnamed) == sorted([topic_dir_name(LONG), topic_dir_name(LONG_T1)])

    token = root_token(settings.tier1_root)
    # the preview: the same counts, nothing committed
    [preview] = list(job._partition(settings, iter(items), token, False, 4, True))
    assert deps.meta.list_topics() == []
    [part] = list(job._partition(settings, iter(items), token, False, 4, False))
    assert preview["counts"] == part["counts"] and sorted(preview["topics"]) == sorted(part["topics"])
    assert (part["done"], part["failed"], part["errors"]) == (3, 0, [])
    assert part["counts"]["ledgers_recovered"] == 2 and part["counts"]["tier1_copies_recorded"] == 2
    assert part["counts"]["tier1_adopted"] == 5 and part["counts"]["tier1_sealed"] == 2  # a/1,2 LONG/1,2 b/0
    assert sorted(part["topics"]) == sorted(["a", LONG, "b/tier 1 only"])
    for name in ("a", LONG):
        assert states(deps, name) == [(0, S.OFFLOADED, 3, True), (1, S.SEALED, 2, True), (2, S.SEALED, 1, True)]
        assert deps.meta.get_topic(name).next_ledger_id == 3
    assert states(deps, "b/tier 1 only") == [(0, S.SEALED, 4, True)]
    assert {topic_dir_name(n) for n in part["topics"]} & set(unnamed) == {topic_dir_name(LONG)}

    # a rerun commits nothing new
    [again] = list(job._partition(settings, iter(items), token, False, 4, False))
    assert again["counts"]["ledgers_recovered"] == again["counts"]["tier1_adopted"] == 0
    assert again["counts"]["already_known"] == 2


def test_an_executor_on_another_tier1_root_fails_its_topics_with_the_marker_message(deps, db, settings, tmp_path):
    produce(deps, "t", [entries("t", 2, 10)], policy=TopicPolicy(rollover_entries=10**6))
    offload_many(deps, deps.meta.list_ledgers("t", [S.SEALED]))
    lose_metadata(db)
    items, _ = job._plan(deps, Namespace(topic=None))
    elsewhere = tmp_path / "not-the-shared-root"
    elsewhere.mkdir()
    [part] = list(job._partition(settings.with_(tier1_root=elsewhere), iter(items), root_token(settings.tier1_root),
                                 False, 4, False))
    assert part["done"] == 0 and part["failed"] == len(items) == 1
    assert str(elsewhere / MARKER) in part["errors"][0] and "not the driver's" in part["errors"][0]
    assert deps.meta.list_topics() == []  # nothing recovered without tier 1


def test_the_plan_names_long_topics_by_the_name_beside_their_ledgers_once_each(deps, db):
    world(deps)
    lose_metadata(db)
    items, unnamed = job._plan(deps, Namespace(topic=None))
    assert unnamed == []
    # LONG once (its bucket item covers its tier 1 too), LONG_T1 by its name file
    assert sorted(i["segment"] for i in items) == sorted(encode_topic(n) for n in ("a", LONG, "b/tier 1 only", LONG_T1))
    assert [i.get("topic") for i in items if i["segment"] == encode_topic(LONG_T1)] == [LONG_T1]
