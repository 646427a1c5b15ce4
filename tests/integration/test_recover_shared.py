"""Recovery of ledgers that share one data object (an offload batch, a defrag merge) when a block header in
it is corrupt: the ledgers before it are placed by walking the headers, the ones after it from the object's
end, each confirmed by its own block headers (and pages, when checked); only the ledger the header belongs
to is lost. Real RGW and PostgreSQL; the recovered store is read back."""
from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import text

from tests.integration.test_export_recover import new_database  # noqa: F401  (extra databases)
from tests.integration.helpers import MIB, bucket_keys, entries, produce
from tiering.metadata.repository import MetadataStore
from tiering.model import LedgerState as S
from tiering.ops.defrag import merge_groups, plan_defrag
from tiering.ops.offload import offload_ledger, offload_many
from tiering.ops.recover import recover_from_bucket
from tiering.read import DATALOSS, Entry, Gap, ReadHandle
from tiering.tier2.reader import tier2_opener

COUNT = 4


def shared(deps, topic: str, how: str) -> dict:
    """COUNT ledgers of the topic in one data object (`how`: batch or defrag), no tier-1 copies."""
    expected = produce(deps, topic, [entries(f"{topic}{i}", 3 + i % 2, 100) for i in range(COUNT)])
    sealed = deps.meta.list_ledgers(topic, [S.SEALED])
    if how == "batch":
        batched = dataclasses.replace(deps, knobs=dataclasses.replace(deps.knobs, batch_small_bytes=8 * MIB))
        assert len(offload_many(batched, sealed).offloaded) == COUNT
    else:
        for led in sealed:
            offload_ledger(deps, led)
        assert not merge_groups(deps, plan_defrag(deps, topic=topic, small_bytes=MIB), small_bytes=MIB).errors
    chunks = deps.meta.chunks(topic).values()
    assert len({c.data_key for c in chunks}) == 1
    for key in bucket_keys(deps) - {k for c in chunks for k in (c.data_key, c.index_key)}:
        deps.bucket.s3.delete_object(Bucket=deps.bucket.name, Key=key)  # as GC does: no other copy is left
    for led in deps.meta.list_ledgers(topic):
        deps.tier1.delete(topic, led.ledger_id)
    return expected


def flip(deps, topic: str, ledger_id: int, at: int) -> None:
    ch = deps.meta.chunks(topic)[ledger_id]
    s3, name = deps.bucket.s3, deps.bucket.name
    body = bytearray(s3.get_object(Bucket=name, Key=ch.data_key)["Body"].read())
    body[ch.data_offset + at] ^= 0x01
    s3.put_object(Bucket=name, Key=ch.data_key, Body=bytes(body))


def read_back(deps, target) -> tuple[dict, list]:
    meta = MetadataStore(target)
    got, gaps = {}, []
    for item in ReadHandle(meta, deps.tier1, tier2_opener(deps.bucket)).read("t"):
        if isinstance(item, Entry):
            got[(item.ledger_id, item.entry_id)] = item.data
        else:
            assert isinstance(item, Gap)
            gaps.append((item.kind, item.start.ledger_id))
    return got, gaps


# the header's length field (parse fails), its first-entry field (parses, names the wrong entry)
@pytest.mark.parametrize("at", [6, 27], ids=["header-length", "first-entry"])
@pytest.mark.parametrize("bad", [0, 1, COUNT - 1], ids=["first", "middle", "last"])
@pytest.mark.parametrize("check_pages", [True, False], ids=["pages", "headers"])
def test_a_corrupt_block_header_loses_only_its_own_ledger(deps, new_database, bad, at, check_pages):  # noqa: F811
    expected = shared(deps, "t", "batch")
    flip(deps, "t", bad, at)
    target = new_database()
    report = recover_from_bucket(target, deps.bucket, tier1=deps.tier1, check_pages=check_pages)
    good = [i for i in range(COUNT) if i != bad]
    assert report.ok and sorted(report.ledgers_recovered) == [("t", i) for i in good]
    assert report.unknown == {"t": [(bad, bad)]}
    with target.connect() as conn:
        assert conn.execute(text("SELECT next_ledger_id FROM tiering.topic WHERE name = 't'")).scalar_one() == COUNT
    got, gaps = read_back(deps, target)
    assert got == {k: v for k, v in expected.items() if k[0] != bad}
    assert gaps == [(DATALOSS, bad)]


def test_a_defrag_merge_with_a_corrupt_header_in_the_middle(deps, new_database):  # noqa: F811
    expected = shared(deps, "t", "defrag")
    flip(deps, "t", 2, 6)
    target = new_database()
    report = recover_from_bucket(target, deps.bucket, tier1=deps.tier1, check_pages=True)
    assert report.ok and sorted(report.ledgers_recovered) == [("t", 0), ("t", 1), ("t", 3)]
    got, gaps = read_back(deps, target)
    assert got == {k: v for k, v in expected.items() if k[0] != 2} and gaps == [(DATALOSS, 2)]


def test_two_corrupt_headers_lose_the_ledger_between_them_too(deps, new_database):  # noqa: F811
    """Nothing places a ledger boxed in by two broken ones: it is reported, not guessed."""
    expected = shared(deps, "t", "batch")
    flip(deps, "t", 0, 6)
    flip(deps, "t", 2, 6)
    target = new_database()
    report = recover_from_bucket(target, deps.bucket, tier1=deps.tier1, check_pages=False)
    assert report.ok and sorted(report.ledgers_recovered) == [("t", 3)]
    assert report.unknown == {"t": [(0, 2)]}
    got, _ = read_back(deps, target)
    assert got == {k: v for k, v in expected.items() if k[0] == 3}
