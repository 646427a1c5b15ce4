"""One data file of a topic's table: the entries of a group of ledgers (one UTC day of sealed_at, so the
file is in one partition), read with the one cross-tier ledger read (`read.read_ledger_range`: tier 1 while
its copy exists, else tier 2, every CRC checked) and written as Parquet to the path the driver chose.

The same function runs in a Spark executor (tiering/jobs/table_sync.py) and in `tiering table sync` by hand.
A file is never committed here: the driver adds it to the table (sync.py), so a file left by a killed run is
an orphan the table never references. Entries stream through in bounded batches: a ledger is never held
in memory whole."""
from __future__ import annotations

import logging
from datetime import datetime

from tiering.errors import DataLossError, TieringError
from tiering.model import LedgerState
from tiering.read import DATALOSS, LAST_ENTRY, Run, read_ledger_range
from tiering.tables.catalog import arrow_schema

log = logging.getLogger(__name__)
BATCH_ROWS = 4096
BATCH_BYTES = 8 * 1024 * 1024


def _when(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


class _DeadLetters:
    """The item's dead-letter file, opened at its first dead letter (most files have none)."""

    def __init__(self, filesystem, url: str | None):
        self.filesystem, self.url, self.writer, self.count = filesystem, url, None, 0
        self.schema = arrow_schema(dlq=True)

    def add(self, topic: str, ledger_id: int, entry_id: int, data: bytes, sealed, reason: str) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.writer is None:
            fs, path = self.filesystem(self.url)
            self.writer = pq.ParquetWriter(path, self.schema, filesystem=fs, compression="zstd")
        self.writer.write_batch(pa.record_batch([[topic], [ledger_id], [entry_id], [data], [sealed], [reason]],
                                                schema=self.schema))
        self.count += 1

    def close(self) -> str | None:
        if self.writer is not None:
            self.writer.close()
            return self.url
        return None

    def __enter__(self) -> "_DeadLetters":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """An item that failed closes its file now, before the driver discards the round's files (its path
        is among them): left open, whether and when its upload completes depends on when the writer is
        collected, possibly after that discard."""
        if exc_type is None:
            return
        try:
            self.close()
        except Exception as close_exc:  # noqa: BLE001 - the item's own failure is the one to report
            log.warning("could not close the dead-letter file %s: %s", self.url, type(close_exc).__name__)


def write_file(deps, filesystem, item: dict, open_tier2) -> dict:
    """Write the item's ledgers to `item["path"]` (s3://bucket/key); returns the file's path, ledger ids,
    entries and payload bytes. `filesystem(url)` gives (pyarrow filesystem, its path). A ledger trimmed or
    lost meanwhile fails the item (the whole round is then not committed): the next sync plans again.
    With a decoder (`item["decoder"]`), each entry's decoded fields are columns beside its payload; an
    entry that does not decode keeps null fields and is also written, with the reason, to the dead-letter
    file `item["dlq_path"]` (returned as "dlq_path" when there was one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tiering.tables.decoder import decode

    decoder = item.get("decoder")
    schema = arrow_schema(decoder)
    names = [f["name"] for f in (decoder or {}).get("fields", [])]
    topic = item["topic"]
    fs, path = filesystem(item["path"])
    dead = _DeadLetters(filesystem, item.get("dlq_path"))
    entries = nbytes = 0
    with dead, pq.ParquetWriter(path, schema, filesystem=fs, compression="zstd") as out:
        for spec in item["ledgers"]:
            led = deps.meta.get_ledger(topic, spec["ledger_id"])
            if led.state == LedgerState.DELETED:
                raise TieringError(f"ledger {topic}/{led.ledger_id} was deleted while being synced; the next "
                                   "sync passes over it")
            sealed, offloaded = _when(spec.get("sealed_at")), _when(spec.get("offloaded_at"))
            ids: list[int] = []
            payloads: list[bytes] = []
            decoded: dict[str, list] = {n: [] for n in names}
            size = 0

            def flush() -> None:
                nonlocal ids, payloads, size, decoded
                if ids:
                    n = len(ids)
                    out.write_batch(pa.record_batch([
                        pa.array([topic] * n, pa.string()), pa.array([led.ledger_id] * n, pa.int64()),
                        pa.array(ids, pa.int64()), pa.array(payloads, pa.binary()),
                        pa.array([sealed] * n, schema.field("sealed_at").type),
                        pa.array([offloaded] * n, schema.field("offloaded_at").type),
                        *(pa.array(decoded[c], schema.field(c).type) for c in names)], schema=schema))
                ids, payloads, size, decoded = [], [], 0, {c: [] for c in names}

            last = LAST_ENTRY if led.entries_unknown else led.entry_count - 1
            for got in read_ledger_range(deps.meta, led, 0, last, deps.tier1, open_tier2,
                                         lambda: None):
                if not isinstance(got, Run):
                    if got.kind == DATALOSS:
                        raise DataLossError(f"ledger {topic}/{led.ledger_id} entries {got.entries_text()} are in no tier")
                    raise TieringError(f"ledger {topic}/{led.ledger_id} was trimmed while being synced; the "
                                       "next sync passes over it")
                for entry_id, data in got.entries:
                    ids.append(entry_id)
                    payloads.append(data)
                    if decoder is not None:
                        values, reason = decode(decoder, data)
                        if reason is not None:
                            dead.add(topic, led.ledger_id, entry_id, data, sealed, reason)
                        for c in names:
                            decoded[c].append(None if values is None else values[c])
                    size += len(data)
                    entries += 1
                    nbytes += len(data)
                    if len(ids) >= BATCH_ROWS or size >= BATCH_BYTES:
                        flush()
            flush()
    return {"path": item["path"], "ledger_ids": [s["ledger_id"] for s in item["ledgers"]], "entries": entries,
            "bytes": nbytes, "dlq_path": dead.close(), "dead_letters": dead.count}


def s3_filesystem_for(settings):
    """`filesystem(url)` for write_file: pyarrow's S3 filesystem on the tier-2 store, built once."""
    from tiering.ops.export_metadata import filesystem_for

    built: dict = {}

    def filesystem(url: str):
        if "fs" not in built:
            built["fs"], _ = filesystem_for(url, settings)
        bucket_key = url.split("://", 1)[1]
        return built["fs"], bucket_key

    return filesystem


def local_writer(deps, settings):
    """A sync's `write(items)` in this process (`tiering table sync`): the files one after another."""
    from tiering.tier2.reader import tier2_opener

    filesystem, opener = s3_filesystem_for(settings), tier2_opener(deps.bucket)
    return lambda items: [write_file(deps, filesystem, item, opener) for item in items]
