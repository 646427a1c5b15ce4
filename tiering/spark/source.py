"""The `tiering` Spark data source (Spark 4's Python Data Source API): a topic across both tiers as rows
`topic, ledger_id, entry_id, payload, tier, sealed_at, offloaded_at`.

Settings: `register(spark)` resolves `Settings` on the driver (from the environment unless given) and binds
them to the registered class, which Spark pickles to the planner and the executors, the way
`tiering.jobs.runner` ships Settings in its closure. So no secret is ever an option: options show in plans
and logs, the pickled class does not.

Reading: each task reads one partition (a ledger, or a run of its pages) with the existing readers: tier 1
through `LedgerReader` (every payload's CRC checked) when this worker sees the driver's tier-1 root (its
marker token), tier 2 through `OffloadedLedger` (every page's CRC32C checked before any of its entries is
returned) otherwise or when the copy is gone. Rows leave as Arrow batches of a bounded size: a ledger is
never held in memory. A corrupt page fails the task with CorruptObjectError naming object, page and offset.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from tiering.config import Settings
from tiering.errors import BadInput, CorruptObjectError, DataLossError, LedgerStorageError, TieringError
from tiering.spark.filters import Pushed, push
from tiering.spark.plan import DEFAULT_SPLIT_BYTES, Part

# Imports here stay light: an application's first query unpickles this module's classes in fresh Python
# processes (the filter pushdown, the planner; Spark reuses them afterwards), and the pushdown one needs none
# of SQLAlchemy, boto3 or the readers. Those are imported where used; the S3 client (about 1 s to build on
# a loaded 2-core machine) only when a worker reads tier 2 or the plan splits a ledger along its page index.

log = logging.getLogger("tiering.spark")
SCHEMA = ("topic string, ledger_id long, entry_id long, payload binary, tier string, "
          "sealed_at timestamp, offloaded_at timestamp")
# mode PERMISSIVE: a part that holds a finding (a corrupt page or tier-1 copy, DATALOSS) ends in one row
# naming it instead of failing the task. Only findings: they come back on every attempt, so Spark's retries
# (four per task on a cluster) would read up to them again for nothing; an outage still fails the task.
ERROR_COLUMN = "error"
FINDINGS = (CorruptObjectError, DataLossError)
MODES = ("FAILFAST", "PERMISSIVE")
BATCH_ROWS = 4096
AUTO_PACK_MAX = 1024 * 1024 * 1024  # bytes of one partition when the source packs by parallelism
_TRUE = {"true": True, "false": False}


def _bool_option(options, name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    value = _TRUE.get(str(raw).strip().lower())
    if value is None:
        raise BadInput(f"option {name} is true or false, got {raw!r}")
    return value


def permissive(options) -> bool:
    """Option `mode`: FAILFAST (the default: a finding fails the query) or PERMISSIVE (a row says it)."""
    raw = options.get("mode")
    if raw is None:
        return False
    value = str(raw).strip().upper()
    if value not in MODES:
        raise BadInput(f"option mode is FAILFAST or PERMISSIVE, got {raw!r}")
    return value == "PERMISSIVE"


def _int_option(options, name: str, default: int | None, lo: int) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = str(raw).strip()
    if not text.isascii() or not text.isdigit() or int(text) < lo:
        raise BadInput(f"option {name} is a whole number >= {lo}, got {raw!r}")
    return int(text)


class TieringPartition(InputPartition):
    def __init__(self, parts: list[Part], token: str | None):
        super().__init__(None)
        self.parts = parts  # one part, or several small ledgers packed together (option packBytes)
        self.token = token  # the driver's tier-1 root token (the read function is pickled before planning)


def pack(parts: list[Part], pack_bytes: int, max_parts: int = 1000) -> list[list[Part]]:
    """Consecutive parts grouped while their bytes stay within `pack_bytes` (0: one part per partition):
    thousands of small ledgers would otherwise be thousands of tasks of a few milliseconds each."""
    groups: list[list[Part]] = []
    size = 0
    for p in parts:
        if groups and pack_bytes and size + p.nbytes <= pack_bytes and len(groups[-1]) < max_parts:
            groups[-1].append(p)
            size += p.nbytes
        else:
            groups.append([p])
            size = p.nbytes
    return groups


def auto_pack_bytes(total_bytes: int, parallelism: int | None) -> int:
    """packBytes when the option is not given: the scan in about one wave of `parallelism` tasks, each at most
    AUTO_PACK_MAX bytes. A task costs ~0.1 s of its own on top of its bytes (measured on local[2]: 256 MiB in 8
    partitions 1.18 s, in 4 0.98 s, in 2 0.80 s, in 16 2.11 s), so one partition per ledger wasted most of a
    query on small ledgers; the cap keeps a big topic's tasks small enough to retry and to balance. 0 (one
    partition per part) when the parallelism is not known."""
    if not parallelism or parallelism < 1 or total_bytes <= 0:
        return 0
    return min(AUTO_PACK_MAX, -(-total_bytes // parallelism))


# Clients per Python worker: Spark reuses its Python workers across tasks, so a boto3 client, an engine and
# the index cache are built once per worker and settings, not once per partition.
_CLIENTS: dict = {}
_CLIENTS_LOCK = threading.Lock()


def _clients(settings: Settings):
    key = (settings.database_url, settings.bucket, settings.prefix, settings.s3_endpoint_url, str(settings.tier1_root),
           settings.s3_sse, settings.s3_sse_kms_key_id, str(settings.s3_sse_c_key_file), str(settings.s3_ca_bundle))
    with _CLIENTS_LOCK:
        got = _CLIENTS.get(key)
        if got is None:
            from tiering import clients
            from tiering.metadata.repository import MetadataStore
            from tiering.tier1 import Tier1Store
            from tiering.tier2.reader import READ_AHEAD, ReaderCaches

            got = {"tier1": Tier1Store(settings.tier1_root),
                   "meta": MetadataStore(clients.engine(settings, pool_size=1)),
                   "caches": ReaderCaches.new(),
                   "pool": ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="tiering-spark-read")}
            _CLIENTS[key] = got
        return got


def _bucket(settings: Settings):
    """The tier-2 bucket of this worker, built on first use (see the imports above)."""
    c = _clients(settings)
    with _CLIENTS_LOCK:
        if "bucket" not in c:
            from tiering import clients

            c["bucket"] = clients.bucket(settings)
        return c["bucket"]


class TieringReader(DataSourceReader):
    def __init__(self, settings: Settings, options: dict, parallelism: int | None = None):
        self.settings = settings
        self.options = options
        self.pushed = Pushed()
        self.payload = _bool_option(options, "payload", True)
        self.skip_dataloss = _bool_option(options, "skipDataLoss", False)
        # an offloaded ledger's tier-1 copy that fails its checks fails the query instead of being read
        # around through tier 2 (the scrub, which reports that copy)
        self.strict_tier1 = _bool_option(options, "strictTier1", False)
        self.split_bytes = _int_option(options, "splitBytes", DEFAULT_SPLIT_BYTES, 1)
        # None: packed by the session's parallelism (auto_pack_bytes); 0: one partition per part
        self.pack_bytes = _int_option(options, "packBytes", None, 0)
        self.permissive = permissive(options)
        self.parallelism = parallelism

    def pushFilters(self, filters):
        # Spark 4.1+: the filters not returned are the source's to apply (it applies them exactly).
        return push(self.pushed, filters)

    def partitions(self):
        from tiering.spark.plan import plan, select_topics
        from tiering.tier1.marker import root_token

        c = _clients(self.settings)
        token = root_token(self.settings.tier1_root)
        topics = select_topics(c["meta"], self.options)
        parts, stats = plan(c["meta"], c["tier1"], topics, self.pushed, sees_tier1=token is not None,
                            split_bytes=self.split_bytes, bucket=lambda: _bucket(self.settings),
                            index_cache=c["caches"].index)
        self.stats = stats
        _say(stats.line())
        if not parts:
            return [InputPartition(None)]  # Spark needs one partition; read() yields nothing for it
        pack_bytes = self.pack_bytes if self.pack_bytes is not None else \
            auto_pack_bytes(sum(p.nbytes for p in parts), self.parallelism)
        groups = pack(parts, pack_bytes)
        if len(groups) != len(parts):
            _say(f"tiering source plan: {len(parts)} part(s) packed into {len(groups)} partition(s) of at most "
                 f"{pack_bytes} bytes")
        return [TieringPartition(g, token) for g in groups]

    def read(self, partition):
        values = self.pushed.bound("entry_id").values
        for part in getattr(partition, "parts", None) or ():
            at = [part.first]  # the first entry not yet handed to Spark
            try:
                yield from _batches(part, _tracked(_chunks(self, part, partition.token), at), values,
                                    errors=self.permissive)
            except FINDINGS as exc:
                if not self.permissive:
                    raise
                log.warning("ledger %s/%d from entry %d: %s: %s (mode PERMISSIVE: a row says it)",
                            part.led.topic, part.led.ledger_id, at[0], type(exc).__name__, exc)
                yield _error_batch(part, at[0], f"{type(exc).__name__}: {exc}")


def _tracked(chunks: Iterator[tuple], at: list[int]) -> Iterator[tuple]:
    """The chunks, `at[0]` kept at the first entry id not yet delivered (the caller asks for the next chunk
    only once the batch made of this one went to Spark)."""
    for chunk in chunks:
        at[0] = chunk[0]
        yield chunk
        at[0] = chunk[0] + chunk[1]


def _error_batch(part: Part, entry_id: int, error: str):
    """The one row (mode PERMISSIVE) saying why the part's entries from `entry_id` on were not read."""
    import pyarrow as pa

    led = part.led
    return pa.RecordBatch.from_pylist(
        [{"topic": led.topic, "ledger_id": led.ledger_id, "entry_id": entry_id, "payload": None, "tier": None,
          "sealed_at": led.sealed_at, "offloaded_at": led.offloaded_at, ERROR_COLUMN: error}],
        schema=_arrow_schema(errors=True))


def _arrow_schema(errors: bool):
    """The Arrow schema of the source's batches (SCHEMA, and the error column in mode PERMISSIVE)."""
    import pyarrow as pa

    when = pa.timestamp("us", tz="UTC")
    return pa.schema([("topic", pa.string()), ("ledger_id", pa.int64()), ("entry_id", pa.int64()),
                      ("payload", pa.binary()), ("tier", pa.string()), ("sealed_at", when), ("offloaded_at", when)]
                     + ([(ERROR_COLUMN, pa.string())] if errors else []))


def _say(line: str) -> None:
    """The plan's summary in the driver's log: Spark's planner worker has no logging set up, so the
    `tiering.spark` logger gets a stderr handler at INFO there unless the application configured one."""
    import sys

    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    log.info(line)


def _sees_root(settings: Settings, token: str | None) -> tuple[bool, TieringError | None]:
    """Whether this worker sees the driver's tier-1 root (and, when not, why)."""
    from tiering.tier1.marker import check_root

    if token is None:
        return False, LedgerStorageError(f"the driver saw no tier-1 root at {settings.tier1_root}")
    try:
        check_root(settings.tier1_root, token)
    except TieringError as exc:
        return False, exc
    return True, None


def _chunks(reader: TieringReader, part: Part, token: str | None) -> Iterator[tuple]:
    """(first entry id, entry count, payloads: an Arrow binary array or None, tier) of the part's entries in
    order, a run of pages (tier 2) or up to 4,096 entries (tier 1, ids alone) at a time: no Python object per
    entry on the way to Spark."""
    led, first, last = part.led, part.first, part.last
    if not reader.payload:
        # No payload wanted: the ids are known from the metadata; no byte of the ledger is read (nor checked).
        tier = "tier1" if led.tier1_present else "tier2" if part.chunk is not None else "none"
        for start in range(first, last + 1, BATCH_ROWS):
            yield start, min(BATCH_ROWS, last + 1 - start), None, tier
        return
    from tiering.read import TIER2, TRIMMED, Run, read_ledger_range
    from tiering.tier2.reader_arrays import array_batches

    c = _clients(reader.settings)
    sees, why_not = _sees_root(reader.settings, token)

    def open_tier2(led, chunk):
        from tiering.tier2.reader import OffloadedLedger

        return OffloadedLedger(_bucket(reader.settings), led, chunk, c["caches"], c["pool"])

    for got in read_ledger_range(c["meta"], led, first, last, c["tier1"] if sees else None, open_tier2,
                                 lambda: part.chunk, arrays=True, strict_tier1=reader.strict_tier1):
        if isinstance(got, Run):
            for start, payloads in (got.batches if got.tier == TIER2 else array_batches(got.entries)):
                yield start, len(payloads), payloads, got.tier
        elif got.kind == TRIMMED:
            return  # trimmed since the plan: absent rows, like a trimmed range
        elif led.tier1_present and not sees:
            raise LedgerStorageError(f"ledger {led.topic}/{led.ledger_id} is in tier 1 only and this worker "
                                     f"cannot read it: {why_not}")
        else:
            msg = (f"DATALOSS: ledger {led.topic}/{led.ledger_id} entries {got.entries_text()} are in "
                   f"no tier (state {led.state.value})")
            if reader.skip_dataloss:
                log.warning("%s: skipped (skipDataLoss=true)", msg)
                return
            raise DataLossError(msg + "; option skipDataLoss=true reads around it")


def _batches(part: Part, chunks: Iterator[tuple], values: set | None = None, errors: bool = False) -> Iterator:
    """Arrow record batches of the part's chunks, one per chunk (each at most a run of pages, ~1 MiB, or
    BATCH_ROWS entries: bounded memory), the columns that repeat made in C; `values`: the exact entry ids
    wanted (a pushed-down `entry_id IN (...)`), the others dropped; `errors`: with the (null) error column."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    led = part.led
    schema = _arrow_schema(errors)
    type_of = {f.name: f.type for f in schema}  # the columns' types, from the one schema
    topic, ledger_id = pa.scalar(led.topic, type_of["topic"]), pa.scalar(led.ledger_id, type_of["ledger_id"])
    sealed_at = pa.scalar(led.sealed_at, type_of["sealed_at"])
    offloaded_at = pa.scalar(led.offloaded_at, type_of["offloaded_at"])
    wanted = None if values is None else pa.array(sorted(values), pa.int64())
    for start, n, payloads, tier in chunks:
        ids = pa.array(np.arange(start, start + n, dtype=np.int64))
        if payloads is None:
            payloads = pa.nulls(n, type_of["payload"])
        if wanted is not None:
            keep = pc.is_in(ids, value_set=wanted)
            ids, payloads = ids.filter(keep), payloads.filter(keep)
            n = len(ids)
            if not n:
                continue
        yield pa.RecordBatch.from_arrays(
            [pa.repeat(topic, n), pa.repeat(ledger_id, n), ids, payloads,
             pa.repeat(pa.scalar(tier, type_of["tier"]), n), pa.repeat(sealed_at, n), pa.repeat(offloaded_at, n)]
            + ([pa.nulls(n, type_of[ERROR_COLUMN])] if errors else []),
            schema=schema)


class TieringDataSource(DataSource):
    """`spark.read.format("tiering")`; registered by `tiering.spark.register`, which binds `_settings` and
    `_parallelism`."""
    _settings: Settings | None = None
    _parallelism: int | None = None

    @classmethod
    def name(cls) -> str:
        return "tiering"

    def schema(self):
        return SCHEMA + f", {ERROR_COLUMN} string" if permissive(self.options) else SCHEMA

    def reader(self, schema):
        if self._settings is None:
            raise BadInput("the tiering source has no settings: register it with tiering.spark.register(spark)")
        return TieringReader(self._settings, dict(self.options), self._parallelism)
