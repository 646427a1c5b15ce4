"""Sync a topic into its Iceberg table: every SEALED or OFFLOADED ledger exactly once, in id order.

The table's own metadata is the record of what it holds. Its property `tiering.synced-through` (a ledger id)
says: every ledger up to it is in the table, or was deleted or empty when the sync passed it. A round plans
the ledgers after that mark, stopping at the first still-open one (so none is ever passed over), has their
data files written (by Spark executors, or in this process by hand: `files.write_file`), then commits in
ONE Iceberg commit: the files (add_files; the snapshot summary names the round's ledgers and run), the new
mark, and a requirement that the mark is still the one the round planned from. The SQL catalog checks
requirements against the table's current metadata and swaps `metadata_location` by compare-and-set, so of
two rounds planned from the same mark exactly one commits; the other's commit is refused, its files are
deleted, and nothing is written twice. After the commit the `topic_table` row is advanced by compare-and-set;
a sync killed between the two finds the table ahead of the row next time and catches the row up (reconcile)
instead of appending again. A per-topic advisory lock keeps a second sync from doing the same work at all.

Retention 'follow': ledgers retention or truncate deleted (DELETED rows at or below the mark, above
`tiering.trimmed-through`) are deleted from the table by ledger_id, in a commit guarded the same way.
"""
from __future__ import annotations

import logging
import uuid
from datetime import timezone
from dataclasses import dataclass, field, replace
from typing import Callable, Literal

from pyiceberg.table.update import ValidatableTableRequirement

from tiering.config import Settings
from tiering.errors import TieringError
from tiering.metadata.table_sync import WAIT_SECONDS, TableRows, TableState, turn
from tiering.model import MIB
from tiering.tables.catalog import PARTITION_FIELD, ensure_table, table_dataset
from tiering.tables.marks import (SUMMARY_THROUGH, TableBehind, check_marks, dead_letter_rounds, dropped, gone_file,
                                  has_rows, prop, uncounted)
from tiering.tables.naming import (DLQ_SUFFIX, PROP_SYNCED, PROP_TRIMMED, SUMMARY_DLQ_FILES, SUMMARY_LEDGERS, SUMMARY_RUN,
                                   SUMMARY_TOPIC, batches, encode_ledgers)

log = logging.getLogger(__name__)
SUMMARY_PASSED = "tiering.ledgers-passed"  # deleted or empty ledgers the round passed over
SUMMARY_DELETED = "tiering.ledgers-deleted"
COMMIT_ATTEMPTS = 3


class AssertProperty(ValidatableTableRequirement):
    """A commit requirement: the table property `key` is still `value` (None: absent). Checked by the SQL
    catalog against the table's current metadata inside its compare-and-set commit."""
    type: Literal["assert-tiering-property"] = "assert-tiering-property"
    key: str
    value: str | None = None

    def validate(self, base_metadata) -> None:
        from pyiceberg.exceptions import CommitFailedException

        found = None if base_metadata is None else base_metadata.properties.get(self.key)
        if found != self.value:
            raise CommitFailedException(f"table property {self.key} is {found!r}, expected {self.value!r}")


@dataclass(frozen=True)
class Limits:
    """A round's bounds (a backfill is many rounds, each committed: resumable) and a data file's size."""
    round_ledgers: int = 1000
    round_bytes: int = 1024 * MIB
    file_bytes: int = 128 * MIB
    file_ledgers: int = 1000
    spread: int = 4  # a round of a few small ledgers is still at least this many files: Spark writes them in parallel
    max_rounds: int = 1000
    wait_seconds: float = WAIT_SECONDS  # for the table's running maintenance (metadata/table_sync.turn)


@dataclass
class Round:
    base: int  # the table's mark the round planned from
    through: int  # the mark after it
    items: list[dict]  # data files to write: {"topic", "path", "ledgers": [{"ledger_id", "sealed_at", ...}]}
    passed: list[int]  # deleted or empty ledgers passed over
    run: str

    @property
    def ledger_ids(self) -> list[int]:
        return [s["ledger_id"] for i in self.items for s in i["ledgers"]]


@dataclass
class TopicResult:
    topic: str
    table: str
    status: str = "up_to_date"  # synced | up_to_date | planned | skipped | failed
    ledgers: list[int] = field(default_factory=list)  # committed into the table by this sync
    passed: list[int] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)  # deleted from the table (retention follow)
    planned: list[int] = field(default_factory=list)  # --dry-run
    entries: int = 0
    bytes: int = 0
    rounds: int = 0
    reconciled: bool = False
    dead_letters: int = 0
    error: str | None = None


def _iso(t) -> str | None:
    return None if t is None else t.isoformat()


# write(items) -> one result per item ({"path", "ledger_ids", "entries", "bytes"}) or raises
Writer = Callable[[list[dict]], list[dict]]


class TableSync:
    def __init__(self, engine, settings, catalog, limits: Limits = Limits(), fault: Callable[[str], None] | None = None,
                 progress: Callable[[str], None] | None = None):
        """`fault(step)` is called at "planned" (a round planned, nothing written), "written" (its files
        written, nothing committed), "committed" (the table committed, the row not yet advanced) and, with a
        decoder, "before-dlq" (the dead letters not yet committed): the fault tests stop a run there."""
        self.rows = TableRows(engine)
        self.engine = engine
        self.settings = settings
        self.catalog = catalog
        self.limits = limits
        self.fault = fault or (lambda step: None)
        self.progress = progress or (lambda line: None)  # one line per committed round (a backfill's progress)

    # ------------------------------------------------------------------------------------------ a topic
    def sync_topic(self, state: TableState, write: Writer, dry_run: bool = False) -> TopicResult:
        result = TopicResult(state.topic, state.identifier)
        if dry_run:  # a preview writes nothing: it takes no turn, so no real sync meeting it reports "skipped"
            self._sync_held(state.topic, write, dry_run, result, state.topic_id)
            return result
        with turn(self.engine, state.topic_id, self.limits.wait_seconds) as got:
            if got == "held":
                self._sync_held(state.topic, write, dry_run, result, state.topic_id)
            elif got == "taken":
                result.status, result.error = "skipped", "another sync of this topic is running"
            else:  # not another sync's work: this sync's work is not done, so it is not a success
                result.status, result.error = "failed", (
                    f"the table's maintenance (tiering table maintain) ran on past the {self.limits.wait_seconds:g} s "
                    "a sync waits for it: nothing synced; rerun when it has ended")
        return result

    def _sync_held(self, topic: str, write: Writer, dry_run: bool, result: TopicResult, topic_id: int) -> None:
        try:
            self._sync_locked(topic, write, dry_run, result, topic_id)
        except TieringError as exc:
            result.status, result.error = "failed", str(exc)
        except Exception as exc:  # noqa: BLE001 - S3 or the catalog: this topic failed, the others go on
            result.status, result.error = "failed", gone_file(exc, topic) or \
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    def _sync_locked(self, topic: str, write: Writer, dry_run: bool, result: TopicResult, topic_id: int) -> None:
        state = self.rows.held(topic, topic_id, "nothing synced")  # re-read under the lock
        exists = self.catalog.table_exists(state.identifier)
        if not exists and (why := dropped(state)):
            # dropped behind the store's back (or its catalog row deleted): making an empty one would only
            # hide it, and a dry run would preview a sync that fails
            raise TableBehind(why)
        if dry_run:  # plan from the table's own mark; create nothing, change nothing
            table = self.catalog.load_table(state.identifier) if exists else _Absent()
            if exists:  # what the real sync would refuse, the preview refuses; a row behind the table (a run
                # killed after its commit) is caught up in memory, as the real sync catches it up first
                synced, trimmed = check_marks(state, table)
                state = replace(state, synced_through=synced, trimmed_through=trimmed)
            rnd = self.plan_round(state, table)
            result.planned = rnd.ledger_ids if rnd else []
            result.status = "planned" if rnd else "up_to_date"
            return
        table = ensure_table(self.catalog, self.settings, state.identifier, topic, state.decoder,
                             topic_id=state.topic_id)
        state, result.reconciled = self.reconcile(state, table)
        dlq = None
        if state.decoder is not None:
            dlq = ensure_table(self.catalog, self.settings, state.identifier, topic, dlq=True,
                               topic_id=state.topic_id)
            dlq = self.catch_up_dlq(table, dlq)
        if state.retention == "follow":
            state, table, result.deleted = self.follow_retention(state, table)
            if dlq is not None:
                dlq = self.follow_retention_dlq(state, table, dlq)
        for _ in range(self.limits.max_rounds):
            rnd = self.plan_round(state, table)
            if rnd is None:
                break
            self.fault("planned")
            state, table = self.run_round(state, table, rnd, write, result)
            if dlq is not None:
                self.fault("before-dlq")
                dlq = self.catch_up_dlq(table, dlq)
            result.rounds += 1
            result.status = "synced"
        if result.deleted and result.status == "up_to_date":
            result.status = "synced"

    # ------------------------------------------------------------------------------------------ reconcile
    def reconcile(self, state: TableState, table) -> tuple[TableState, bool]:
        """Catch the row up with the table (a run killed after its commit, before its row update); True when
        the table held commits the row did not (a new metadata location alone is just recorded)."""
        synced, trimmed = check_marks(state, table)
        snap = table.current_snapshot()
        if synced == state.synced_through and trimmed == state.trimmed_through \
                and table.metadata_location == state.metadata_location:
            return state, False
        moved = synced != state.synced_through or trimmed != state.trimmed_through
        ledgers, entries = uncounted(state, table)
        log.info("table %s: sync state caught up with the table (through %d)", state.identifier, synced)
        state = self.rows.advance(state, synced_through=synced, trimmed_through=trimmed, ledgers_added=ledgers,
                                  entries_added=entries, snapshot_id=snap.snapshot_id if snap else None,
                                  metadata_location=table.metadata_location)
        return state, moved

    # ------------------------------------------------------------------------------------------ plan
    def plan_round(self, state: TableState, table) -> Round | None:
        """The next ledgers after the mark, in id order, up to the first open one and the round's bounds."""
        base = prop(table, PROP_SYNCED)
        took, passed, through, size = [], [], base, 0
        for led in self.rows.pending(state, self.limits.round_ledgers + 1):
            if led.state == "OPEN":
                break
            # an empty ledger adds nothing; a lost one whose count is unknown is read (its DATALOSS fails the
            # round, as a lost ledger's does) rather than passed over as if empty
            if led.state == "DELETED" or (led.entry_count == 0 and not led.lost):
                passed.append(led.ledger_id)
            else:
                if took and (len(took) >= self.limits.round_ledgers or size + led.size_bytes > self.limits.round_bytes):
                    break
                took.append(led)
                size += led.size_bytes
            through = led.ledger_id
        if through == base:
            return None
        run = uuid.uuid4().hex
        dlq_location = f"{table.location()}{DLQ_SUFFIX}"
        per_file = min(self.limits.file_bytes, max(1, -(-size // self.limits.spread)))
        groups = batches([{"ledger_id": led.ledger_id, "size_bytes": led.size_bytes, "day": led.sealed_at.astimezone(timezone.utc).date(),
                           "led": led} for led in took], per_file, self.limits.file_ledgers)
        items = [{"topic": state.topic,
                  "path": f"{table.location()}/data/{PARTITION_FIELD}={g[0]['day'].isoformat()}/"
                          f"{run}-{g[0]['ledger_id']:020d}.parquet",
                  "ledgers": [{"ledger_id": x["ledger_id"], "sealed_at": _iso(x["led"].sealed_at),
                               "offloaded_at": _iso(x["led"].offloaded_at)} for x in g],
                  **({"decoder": state.decoder,
                      "dlq_path": f"{dlq_location}/data/{PARTITION_FIELD}={g[0]['day'].isoformat()}/"
                                  f"{run}-{g[0]['ledger_id']:020d}.parquet"} if state.decoder else {})}
                 for g in groups]
        return Round(base, through, items, passed, run)

    # ------------------------------------------------------------------------------------------ a round
    def run_round(self, state: TableState, table, rnd: Round, write: Writer, result: TopicResult):
        paths = [i["path"] for i in rnd.items]
        try:
            written = write(rnd.items) if rnd.items else []
        except BaseException:
            # nothing of the round is committed: its files are not needed, its dead-letter files neither
            self._discard(table, paths + [i["dlq_path"] for i in rnd.items if i.get("dlq_path")])
            raise
        self.fault("written")
        summary = {SUMMARY_TOPIC: state.topic, SUMMARY_RUN: rnd.run, SUMMARY_THROUGH: str(rnd.through),
                   SUMMARY_LEDGERS: encode_ledgers(rnd.ledger_ids), SUMMARY_PASSED: encode_ledgers(rnd.passed)}
        dead = [w["dlq_path"] for w in written if w.get("dlq_path")]
        if state.decoder is not None:
            summary[SUMMARY_DLQ_FILES] = ",".join(dead)
        entries = sum(w["entries"] for w in written)

        def append(tx) -> None:
            if paths:
                tx.add_files(paths, snapshot_properties=summary)
                _check_added(tx, entries, len(paths))

        try:
            # the commit names the dead-letter files, which TABLE__dlq takes after it: one gone or cut short
            # then would fail every later sync taking it, or lose dead letters
            _check_dead_letters(table.io, written)
            table = self._commit(table, PROP_SYNCED, rnd.base, rnd.through, append)
        except _ShortFiles:
            self._discard(table, paths + dead)
            raise
        except _Lost as lost:
            self._discard(table, paths + dead)
            raise TieringError(f"table {state.identifier!r}: another sync committed ledgers through "
                               f"{lost.found} meanwhile; this round's files were discarded") from None
        self.fault("committed")
        # committed: the round counts in the result even when recording it fails below (a topic deleted
        # meanwhile), so a failed run still says what its table took
        result.ledgers += rnd.ledger_ids
        result.passed += rnd.passed
        result.entries += entries
        result.dead_letters += sum(w.get("dead_letters", 0) for w in written)
        result.bytes += sum(w["bytes"] for w in written)
        snap = table.current_snapshot()
        recorded = self.rows.advance(state, synced_through=rnd.through, trimmed_through=state.trimmed_through,
                                     ledgers_added=len(rnd.ledger_ids), entries_added=entries,
                                     snapshot_id=snap.snapshot_id if snap else None,
                                     metadata_location=table.metadata_location)
        # the run keeps the decoder it started with (its table's columns and dead-letter table were made for
        # it); a `topic set --table-json-fields` meanwhile applies from the next run
        state = replace(recorded, decoder=state.decoder)
        lag, lag_bytes = self.rows.lag(state)
        self.progress(f"{state.topic} -> {state.identifier}: committed {len(rnd.ledger_ids)} ledger(s) through "
                      f"{rnd.through}; {lag} ledger(s), {lag_bytes} bytes to go")
        return state, table

    def catch_up_dlq(self, table, dlq):
        """Commit to TABLE__dlq the dead-letter files of the table's rounds it has not taken yet, in order,
        each guarded by the dead-letter table's own mark: the table's commit (its snapshot summary) is the
        record, so a run killed between the two commits loses no dead letter and adds none twice."""
        for through, files in dead_letter_rounds(table):
            mark = prop(dlq, PROP_SYNCED)
            if through <= mark:
                continue
            try:
                dlq = self._commit(dlq, PROP_SYNCED, mark, through,
                                   lambda tx: tx.add_files(files, snapshot_properties={SUMMARY_THROUGH: str(through)}))
            except _Lost:
                raise TieringError(f"table {'.'.join(dlq.name())!r}: another sync committed meanwhile") from None
        return dlq

    def follow_retention(self, state: TableState, table):
        """Delete from the table the rows of ledgers deleted since the last follow (retention 'follow')."""
        base = prop(table, PROP_TRIMMED)
        ids = self.rows.deleted_since(state, base, prop(table, PROP_SYNCED))
        if not ids:
            return state, table, []
        from pyiceberg.expressions import In

        summary = {SUMMARY_TOPIC: state.topic, SUMMARY_DELETED: encode_ledgers(ids)}
        # ledgers deleted before the sync reached them were passed over and have no rows: then only the mark
        # moves (no empty delete snapshot, and the plan stops finding the topic due)
        held = has_rows(table, ids)
        try:
            table = self._commit(table, PROP_TRIMMED, base, ids[-1],
                                 (lambda tx: tx.delete(In("ledger_id", ids), snapshot_properties=summary))
                                 if held else (lambda tx: None))
        except _Lost:
            raise TieringError(f"table {state.identifier!r}: another sync deleted rows meanwhile") from None
        snap = table.current_snapshot()
        state = self.rows.advance(state, synced_through=state.synced_through, trimmed_through=ids[-1],
                                  ledgers_added=0, entries_added=0, snapshot_id=snap.snapshot_id if snap else None,
                                  metadata_location=table.metadata_location)
        return state, table, ids if held else []

    def follow_retention_dlq(self, state: TableState, table, dlq):
        """The same deletes in TABLE__dlq, from its own trimmed mark (a run killed between the two commits
        leaves it behind; the next run catches it up)."""
        base = prop(dlq, PROP_TRIMMED)
        ids = self.rows.deleted_since(state, base, prop(table, PROP_TRIMMED))
        if not ids:
            return dlq
        from pyiceberg.expressions import In

        try:
            return self._commit(dlq, PROP_TRIMMED, base, ids[-1], (lambda tx: tx.delete(
                In("ledger_id", ids), snapshot_properties={SUMMARY_DELETED: encode_ledgers(ids)}))
                if has_rows(dlq, ids) else (lambda tx: None))
        except _Lost:
            raise TieringError(f"table {'.'.join(dlq.name())!r}: another sync deleted rows meanwhile") from None

    def _commit(self, table, key: str, base: int, to: int, change):
        """One Iceberg commit of `change(tx)` and the property `key` from `base` to `to`, refused unless the
        property is still `base` when the catalog commits. A refusal for another reason (a maintenance commit
        meanwhile) is retried on the fresh table; _Lost when the property moved (another sync committed)."""
        from pyiceberg.exceptions import CommitFailedException

        for attempt in range(COMMIT_ATTEMPTS):
            found = prop(table, key)
            if found != base:
                raise _Lost(found)
            tx = table.transaction()
            tx._stage((), (AssertProperty(key=key, value=None if base < 0 and key not in table.properties
                                          else str(base)),))
            change(tx)
            tx.set_properties(**{key: str(to)})
            try:
                tx.commit_transaction()
                return self.catalog.load_table(table.name())
            except CommitFailedException:
                if attempt == COMMIT_ATTEMPTS - 1:
                    raise TieringError(f"table {'.'.join(table.name())!r}: commit refused {COMMIT_ATTEMPTS} times") from None
                table = self.catalog.load_table(table.name())
        raise AssertionError("unreachable")

    def _discard(self, table, paths: list[str]) -> None:
        """Delete the files of a round that did not commit (never referenced by the table)."""
        for p in paths:
            try:
                table.io.delete(p)
            except Exception as exc:  # noqa: BLE001 - an orphan left is collected later, not a failure
                log.warning("could not delete the uncommitted file %s: %s", p, type(exc).__name__)


class _Absent:
    """A table not created yet, as a dry run plans from it: no properties (mark -1), a placeholder location."""
    properties: dict = {}

    def location(self) -> str:
        return "s3://(not created yet)"


class _ShortFiles(TieringError):
    pass


def _check_added(tx, records: int, files: int) -> None:
    """_ShortFiles unless the append staged in `tx` adds exactly the files and rows the writers wrote.
    add_files takes each file's row count from its footer as the bucket holds it at commit time: a file
    replaced or cut short after its writer ended would be committed short, and the mark would pass its
    ledgers for good."""
    from pyiceberg.table.update import AddSnapshotUpdate

    [summary] = [u.snapshot.summary for u in tx._updates if isinstance(u, AddSnapshotUpdate)]
    added = (int(summary.get("added-data-files", "0")), int(summary.get("added-records", "0")))
    if added != (files, records):
        raise _ShortFiles(f"the round's data files hold {added[1]} row(s) in {added[0]} file(s) but "
                          f"{records} in {files} were written: changed in the bucket before the commit; "
                          "nothing committed")


def _check_dead_letters(io, written: list[dict]) -> None:
    """_ShortFiles unless every dead-letter file written holds the dead letters its writer wrote."""
    import pyarrow.parquet as pq

    for w in written:
        if not w.get("dlq_path"):
            continue
        try:
            with io.new_input(w["dlq_path"]).open() as f:
                rows = pq.ParquetFile(f).metadata.num_rows
        except FileNotFoundError:
            rows = None
        if rows != w["dead_letters"]:
            raise _ShortFiles(f"dead-letter file {w['dlq_path']} holds {'no file' if rows is None else rows} "
                              f"row(s) but {w['dead_letters']} were written: changed in the bucket before the "
                              "commit; nothing committed")


class _Lost(Exception):
    def __init__(self, found: int):
        self.found = found


def sync_tables(sync: TableSync, write: Writer, topic: str | None = None, dry_run: bool = False) -> list[TopicResult]:
    """Sync every topic with a table (or the one named, which must have one), each under its own lock."""
    return [sync.sync_topic(state, write, dry_run) for state in sync.rows.list(topic)]


def due_topics(engine, topic: str | None = None) -> list[TableState]:
    """The topics a sync has work for (the DAG's plan: one metadata query, no catalog)."""
    return TableRows(engine).due(topic)


def outcome_of(results: list[TopicResult], outcome, settings: Settings) -> None:
    """A job_run row's counts from a sync's results: ledgers done, topics failed, payload bytes; what moved
    and into which tables."""
    outcome.items_done += sum(len(r.ledgers) for r in results)
    outcome.items_failed += sum(r.status == "failed" for r in results)
    outcome.bytes += sum(r.bytes for r in results)
    outcome.details.update(
        topics=len(results), ledgers=sum(len(r.ledgers) for r in results),
        entries=sum(r.entries for r in results), rounds=sum(r.rounds for r in results),
        deleted_ledgers=sum(len(r.deleted) for r in results),
        skipped=sum(r.status == "skipped" for r in results),
        failed_topics=sorted(r.topic for r in results if r.status == "failed"))
    outcome.errors.extend(f"{r.topic}: {r.error}" for r in results if r.status == "failed")
    # what the DAG's OpenLineage events report (tiering/jobs/lineage.py): per topic what reached its table,
    # and the tables as the run's outputs (Iceberg's dataset naming: the warehouse's bucket, the table's path)
    moved = {r.topic: {"ledgers": len(r.ledgers), "entries": r.entries, "first_ledger": min(r.ledgers),
                       "last_ledger": max(r.ledgers)} for r in results if r.ledgers}
    if moved:
        outcome.details["moved"] = moved
    if results:
        outcome.details["lineage"] = {"outputs": [table_dataset(settings, r.table) for r in results
                                                  if r.status != "failed"]}
