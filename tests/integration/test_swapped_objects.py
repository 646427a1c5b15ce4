"""An intact object pair of another topic's ledger of the same id and shape put over a ledger's keys: every
CRC of the pair checks (its own), so only the index's topic tells it apart. Reads, verify, repair,
delete-lagged and defrag must refuse it, never serve or merge the other topic's bytes."""
from __future__ import annotations

import pytest

from tests.integration.helpers import MIB, entries, produce
from tiering.errors import CorruptObjectError
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.defrag import defrag
from tiering.ops.delete_lagged import delete_lagged
from tiering.ops.offload import offload_many
from tiering.ops.repair import plan_repair
from tiering.ops.verify import verify_topic
from tiering.read import ReadHandle
from tiering.tier2.reader import tier2_opener


def two_topics(deps, n: int) -> None:
    for topic in ("a", "b"):  # same ids, counts and sizes; other payloads
        produce(deps, topic, [entries(f"{topic}{i}", 20, 700) for i in range(n)],
                TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40, deletion_lag_seconds=0))
        report = offload_many(deps, deps.meta.list_ledgers(topic, [S.SEALED]))
        assert len(report.offloaded) == n, report.failed


def swap_in(deps, ledger_id: int) -> None:
    """Copy topic b's objects of the ledger over topic a's keys of it (both objects: a consistent pair)."""
    s3, name = deps.bucket.s3, deps.bucket.name
    mine = deps.meta.get_chunk(deps.meta.get_ledger("a", ledger_id))
    theirs = deps.meta.get_chunk(deps.meta.get_ledger("b", ledger_id))
    for src, dst in ((theirs.data_key, mine.data_key), (theirs.index_key, mine.index_key)):
        s3.copy_object(Bucket=name, Key=dst, CopySource={"Bucket": name, "Key": src})


def test_another_topics_pair_is_not_read_as_this_ledger(deps):
    two_topics(deps, 1)
    swap_in(deps, 0)
    led = deps.meta.get_ledger("a", 0)
    # delete-lagged finds the ETag changed and checks the copy: it must fail and keep the tier-1 copy
    report = delete_lagged(deps, "a")
    assert [f[:2] for f in report.failed] == [("a", 0)] and not report.deleted
    assert deps.meta.get_ledger("a", 0).tier1_present and deps.tier1.exists("a", 0)
    [finding] = plan_repair(deps, "a")
    assert finding.led.ledger_id == 0 and finding.repairable and "topic 'b'" in finding.problem
    # tier 2 alone: an error naming the index, not topic b's entries
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket))
    deps.tier1.delete("a", 0)
    deps.meta.mark_tier1_deleted(led)
    with pytest.raises(CorruptObjectError, match="topic 'b'"):
        list(handle.read("a"))
    assert not verify_topic(deps.meta, deps.tier1, tier2_opener(deps.bucket), "a").ok


def test_defrag_does_not_merge_another_topics_pair(deps):
    two_topics(deps, 2)
    swap_in(deps, 1)
    before = [deps.meta.get_chunk(led) for led in deps.meta.list_ledgers("a")]
    with pytest.raises(CorruptObjectError, match="topic 'b'"):
        defrag(deps, "a", small_bytes=MIB, max_merged_bytes=64 * MIB)
    assert [deps.meta.get_chunk(led) for led in deps.meta.list_ledgers("a")] == before
