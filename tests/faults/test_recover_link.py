"""Recovery from the bucket over a link that does not answer the GETs of objects (listings and HEADs are
answered): the topics whose objects could not be read are reported unrecovered, and none of their ledgers is
recorded LOST on the word of a failed read; the rerun over a healthy link recovers them whole. Through a TCP
proxy in front of the run's RGW, and PostgreSQL."""
from __future__ import annotations

import time

from sqlalchemy import text

from tests.faults.harness import check_invariants
from tests.faults.test_slow_link import BIG, KIB, link, product_deps_over  # noqa: F401 - the fixture
from tests.integration.helpers import entries, produce
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.offload import offload_many
from tiering.ops.recover import recover_from_bucket


def test_objects_the_link_did_not_deliver_are_not_recorded_lost(link, s3_settings, db, bucket, tier1_root):  # noqa: F811
    over = link(rate=64 * 1024 * KIB, delay=0)
    deps = product_deps_over(over, s3_settings, db, bucket, tier1_root)
    expected = produce(deps, "rl", [entries(f"l{i}", 3, 1 * KIB) for i in range(4)], TopicPolicy(**BIG),
                       open_tail=[b"tail"])
    offload_many(deps, deps.meta.list_ledgers("rl", [S.SEALED]))
    for lid in (0, 1):  # in tier 2 only; ledgers 2 and 3 in both tiers, 4 open in tier 1
        deps.meta.mark_tier1_deleted(deps.meta.get_ledger("rl", lid))
        deps.tier1.delete("rl", lid)
    with db.begin() as conn:  # the database lost: the bucket and tier 1 are all there is
        conn.execute(text("TRUNCATE tiering.topic, tiering.ledger, tiering.chunk, tiering.gc_task CASCADE"))

    over.hold(lambda line: line.startswith(b"GET ") and b"-ledger-" in line)  # objects, not listings
    report = recover_from_bucket(db, deps.bucket, tier1=deps.tier1, concurrency=2)
    assert over.held, "no GET was held: the test tested nothing"
    assert report.errors and report.lost_recorded == [], report.lost_recorded
    assert all(not led.lost for t in deps.meta.list_topics() for led in deps.meta.list_ledgers(t.name))

    over.hold(None)
    time.sleep(1.2)  # the client's pause after the timeouts (TIERING_S3_TIMEOUT_SECONDS) is over
    again = recover_from_bucket(db, deps.bucket, tier1=deps.tier1, concurrency=2)
    assert again.errors == [] and again.lost_recorded == [], again.errors
    assert [(led.ledger_id, led.state) for led in deps.meta.list_ledgers("rl")][:4] == \
        [(i, S.OFFLOADED) for i in range(4)]
    check_invariants(deps, db, {"rl": expected})
