"""delete-lagged checks the tier-2 copy before deleting the tier-1 one: tier 1 may
be the last copy, so a missing, short or replaced tier-2 object must stop the deletion.

Behind metadata's back an offloaded ledger's data object is deleted, its index object is deleted, its
data object is replaced by a shorter one, or one of its objects by a copy of the same length with one byte
flipped. delete-lagged must HEAD the chunk row's objects (length and ETag), fail exactly
those ledgers with a clear error and keep their tier-1 copies (readable, still recorded), and delete the
healthy ledgers' copies in the same run. The old code deleted every copy and the ledgers were lost.
"""
from __future__ import annotations

import pytest

from tests.integration.helpers import entries, make_deps, produce
from tiering.cli import main as cli
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.delete_lagged import delete_lagged
from tiering.ops.offload import offload_many
from tiering.ops.repair import repair
from tiering.read import Entry, ReadHandle
from tiering.tier2.reader import tier2_opener

POLICY = TopicPolicy(deletion_lag_seconds=0, rollover_entries=10**9, rollover_bytes=2**40)


@pytest.fixture
def deps(db, s3_client, bucket, tier1_root):
    return make_deps(db, s3_client, bucket, tier1_root)


def _damage(deps, chunk, how: str) -> None:
    b = deps.bucket
    if how == "data-missing":
        b.s3.delete_object(Bucket=b.name, Key=chunk.data_key)
    elif how == "index-missing":
        b.s3.delete_object(Bucket=b.name, Key=chunk.index_key)
    elif how == "data-short":  # one byte less than the chunk row says
        body = b.s3.get_object(Bucket=b.name, Key=chunk.data_key)["Body"].read()
        b.s3.put_object(Bucket=b.name, Key=chunk.data_key, Body=body[:chunk.data_offset + chunk.data_length - 1])
    else:  # data-flipped, index-flipped: the same length, one byte of a payload, or the index's magic
        key = chunk.index_key if how == "index-flipped" else chunk.data_key
        body = bytearray(b.s3.get_object(Bucket=b.name, Key=key)["Body"].read())
        body[chunk.index_offset if how == "index-flipped" else chunk.data_offset + chunk.data_length // 2] ^= 1
        b.s3.put_object(Bucket=b.name, Key=key, Body=bytes(body))


def _read(deps, topic: str) -> dict:
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket), raise_on_dataloss=True)
    return {(e.ledger_id, e.entry_id): e.data for e in handle.read(topic) if isinstance(e, Entry)}


@pytest.mark.parametrize("how", ["data-missing", "index-missing", "data-short", "data-flipped", "index-flipped"])
def test_a_missing_short_or_replaced_tier2_object_keeps_the_tier1_copy(how, deps):
    expected = produce(deps, "t", [entries(f"dl{i}", 5, 300) for i in range(3)], POLICY)
    assert offload_many(deps, deps.meta.list_ledgers("t")).failed == {}
    damaged = deps.meta.list_ledgers("t")[1]
    chunk = deps.meta.get_chunk(damaged)
    _damage(deps, chunk, how)

    report = delete_lagged(deps)

    assert sorted(report.deleted) == [("t", 0), ("t", 2)], "the healthy ledgers' copies still go"
    assert [(t, i) for t, i, _ in report.failed] == [("t", 1)]
    message = report.failed[0][2]
    key = chunk.index_key if how.startswith("index") else chunk.data_key
    assert key in message and "tier-1 copy kept" in message, message
    assert {"missing": "missing", "short": "bytes, the chunk row needs",
            "flipped": "is not the one written"}[how.split("-")[1]] in message, message
    led = deps.meta.get_ledger("t", 1)
    assert led.state == S.OFFLOADED and led.tier1_present and deps.tier1.exists("t", 1)
    assert _read(deps, "t") == expected, "the damaged ledger reads from its tier-1 copy"
    # a rerun keeps failing the same way (nothing half-done), and deletes nothing more
    again = delete_lagged(deps)
    assert again.deleted == [] and [(t, i) for t, i, _ in again.failed] == [("t", 1)]
    assert deps.tier1.exists("t", 1)


def test_a_replaced_object_is_repaired_from_the_kept_copy_and_then_the_copy_goes(deps):
    """The copy delete-lagged kept is what `tiering repair` re-offloads from; the next run deletes it."""
    expected = produce(deps, "t", [entries("rp", 6, 500)], POLICY)
    offload_many(deps, deps.meta.list_ledgers("t"))
    _damage(deps, deps.meta.get_chunk(deps.meta.get_ledger("t", 0)), "data-flipped")
    assert [(t, i) for t, i, _ in delete_lagged(deps).failed] == [("t", 0)]
    assert repair(deps, "t").repaired == [("t", 0)]
    again = delete_lagged(deps)
    assert again.deleted == [("t", 0)] and not deps.tier1.exists("t", 0), (again, deps.meta.get_ledger("t", 0), deps.meta.get_chunk(deps.meta.get_ledger("t", 0)))
    assert _read(deps, "t") == expected


def test_an_object_replaced_by_the_same_bytes_is_checked_and_its_etag_recorded(deps):
    """Restored from a backup, say: another ETag, this ledger's bytes intact. Only reading tells that from a
    flipped byte, so delete-lagged checks the copy, records the new ETags and deletes the tier-1 copy."""
    expected = produce(deps, "t", [entries("rs", 6, 500)], POLICY)
    offload_many(deps, deps.meta.list_ledgers("t"))
    led = deps.meta.get_ledger("t", 0)
    chunk = deps.meta.get_chunk(led)
    b = deps.bucket
    index = b.s3.get_object(Bucket=b.name, Key=chunk.index_key)["Body"].read()
    # another ETag; a byte past the chunk's range is not the ledger's, so with its range intact it is sound
    b.s3.put_object(Bucket=b.name, Key=chunk.index_key, Body=index + b"-")
    report = delete_lagged(deps)
    assert report.deleted == [("t", 0)] and report.failed == [], report
    now = deps.meta.get_chunk(led)
    assert now.index_etag == b.s3.head_object(Bucket=b.name, Key=chunk.index_key)["ETag"] != chunk.index_etag
    assert (now.data_etag, now.version) == (chunk.data_etag, chunk.version)
    assert _read(deps, "t") == expected


def test_cli_delete_lagged_exits_1_with_one_line_and_keeps_the_copy(deps, settings, monkeypatch, capsys):
    produce(deps, "t", [entries("c", 4, 100)], POLICY)
    offload_many(deps, deps.meta.list_ledgers("t"))
    chunk = deps.meta.get_chunk(deps.meta.get_ledger("t", 0))
    _damage(deps, chunk, "data-missing")
    for key, value in {**settings.to_env(), "TIERING_TIER1_ROOT": str(deps.tier1.root)}.items():
        monkeypatch.setenv(key, value)
    code = cli.main(["delete-lagged"])
    out, err = capsys.readouterr()
    assert code == 1
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert chunk.data_key in err and "tier-1 copy kept" in err, err
    assert "kept 1 that failed" in out
    assert deps.tier1.exists("t", 0) and deps.meta.get_ledger("t", 0).tier1_present
