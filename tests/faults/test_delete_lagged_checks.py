"""delete-lagged checks the tier-2 copy before deleting the tier-1 one: tier 1 may
be the last copy, so a missing or short tier-2 object must stop the deletion.

Behind metadata's back an offloaded ledger's data object is deleted, its index object is deleted, or its
data object is replaced by a shorter one. delete-lagged must HEAD the chunk row's objects, fail exactly
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
    else:  # data-short: one byte less than the chunk row says
        body = b.s3.get_object(Bucket=b.name, Key=chunk.data_key)["Body"].read()
        b.s3.put_object(Bucket=b.name, Key=chunk.data_key, Body=body[:chunk.data_offset + chunk.data_length - 1])


def _read(deps, topic: str) -> dict:
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket), raise_on_dataloss=True)
    return {(e.ledger_id, e.entry_id): e.data for e in handle.read(topic) if isinstance(e, Entry)}


@pytest.mark.parametrize("how", ["data-missing", "index-missing", "data-short"])
def test_a_missing_or_short_tier2_object_keeps_the_tier1_copy(how, deps):
    expected = produce(deps, "t", [entries(f"dl{i}", 5, 300) for i in range(3)], POLICY)
    assert offload_many(deps, deps.meta.list_ledgers("t")).failed == {}
    damaged = deps.meta.list_ledgers("t")[1]
    chunk = deps.meta.get_chunk(damaged)
    _damage(deps, chunk, how)

    report = delete_lagged(deps)

    assert sorted(report.deleted) == [("t", 0), ("t", 2)], "the healthy ledgers' copies still go"
    assert [(t, i) for t, i, _ in report.failed] == [("t", 1)]
    message = report.failed[0][2]
    key = chunk.index_key if how == "index-missing" else chunk.data_key
    assert key in message and "tier-1 copy kept" in message, message
    assert ("missing" if how.endswith("missing") else "bytes, the chunk row needs") in message, message
    led = deps.meta.get_ledger("t", 1)
    assert led.state == S.OFFLOADED and led.tier1_present and deps.tier1.exists("t", 1)
    assert _read(deps, "t") == expected, "the damaged ledger reads from its tier-1 copy"
    # a rerun keeps failing the same way (nothing half-done), and deletes nothing more
    again = delete_lagged(deps)
    assert again.deleted == [] and [(t, i) for t, i, _ in again.failed] == [("t", 1)]
    assert deps.tier1.exists("t", 1)


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
