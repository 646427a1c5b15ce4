"""What an Iceberg table's own metadata says it holds, against its `topic_table` row: the high-water marks
committed with its data files (`tiering.synced-through`, `tiering.trimmed-through`), the rounds its snapshot
summaries record, and whether it was replaced or rolled back behind the row (TableBehind). Read by the sync,
maintenance, `table status` and `topic set --table`."""
from __future__ import annotations

from tiering.errors import BadInput, TieringError
from tiering.metadata.table_sync import TableState
from tiering.tables.catalog import owner_problem
from tiering.tables.naming import (PROP_SYNCED, PROP_TRIMMED, SUMMARY_DLQ_FILES, SUMMARY_LEDGERS, decode_ledgers,
                                   rebuild_hint)

SUMMARY_THROUGH = "tiering.synced-through"


class TableBehind(TieringError):
    """The table holds less than its row says: it was dropped and made again, or rolled back by hand. The
    sync stops rather than guess (appending from the row's mark would skip ledgers, from the table's would
    need the row reset)."""


def dropped(state: TableState) -> str | None:
    """Why the sync state names rows that no table holds (the table was dropped behind the store's back, or
    its catalog row deleted): sync, maintenance, status and verify refuse it alike. None when the row's marks
    claim nothing; the caller knows the table does not exist."""
    if state.synced_through < 0 and state.trimmed_through < 0:
        return None
    return (f"table {state.identifier!r} does not exist but the sync state says ledgers through "
            f"{state.synced_through} are in it: it was dropped; {rebuild_hint(state.topic)}")


def gone_file(exc: BaseException, topic: str) -> str | None:
    """A table's file missing under a read (a snapshot's manifest list or a manifest, deleted by hand or by
    another database's maintenance sharing the location): the sentence naming the way out, else None."""
    if not isinstance(exc, FileNotFoundError):
        return None
    detail = (str(exc).splitlines() or [""])[0][:300]
    return f"a file of the table is gone ({detail}); {rebuild_hint(topic)}"


def prop(table, key: str) -> int:
    return int(table.properties.get(key, "-1"))


def marks(table) -> tuple[int, int]:
    """The table's own (synced, trimmed) high-water marks, committed with its data files (-1: none)."""
    return prop(table, PROP_SYNCED), prop(table, PROP_TRIMMED)


def has_rows(table, ids: list[int]) -> bool:
    """Whether any data file may hold rows of these ledgers (column statistics prune the rest)."""
    from pyiceberg.expressions import In

    return table.current_snapshot() is not None and \
        any(True for _ in table.scan(row_filter=In("ledger_id", ids)).plan_files())


def check_marks(state: TableState, table) -> tuple[int, int]:
    """The table's (synced, trimmed) marks; TableBehind when it holds less than the row says."""
    synced, trimmed = marks(table)
    if synced < state.synced_through or trimmed < state.trimmed_through:
        raise TableBehind(f"table {state.identifier!r} holds ledgers through {synced} but the sync state says "
                          f"{state.synced_through}: the table was replaced or rolled back; "
                          f"{rebuild_hint(state.topic)}")
    # a snapshot rollback (any Iceberg tool) keeps the table's properties, so its marks still claim the rows
    # of the snapshots it undid: the snapshot the row recorded is then still in the table but no longer an
    # ancestor of the current one. Unknown, not refused: that snapshot expired, or the current one's lineage
    # is cut by an expired snapshot before reaching it
    if state.snapshot_id is not None and table.snapshot_by_id(state.snapshot_id) is not None:
        from pyiceberg.table.snapshots import ancestors_of

        seen, last = set(), None
        for snap in ancestors_of(table.current_snapshot(), table.metadata):
            if snap.snapshot_id == state.snapshot_id or snap.snapshot_id in seen:
                break  # an ancestor; or a cycle (metadata another tool wrote), whose lineage never ends: unknown
            seen.add(snap.snapshot_id)
            last = snap
        else:  # the lineage ended without it: at its first snapshot (rolled back), or cut by an expired one
            if last is None or last.parent_snapshot_id is None:
                raise TableBehind(f"table {state.identifier!r} was rolled back: its current snapshot does not "
                                  f"descend from snapshot {state.snapshot_id}, which the sync state recorded, so "
                                  f"rows its marks claim (ledgers through {synced}) may be missing; "
                                  f"{rebuild_hint(state.topic)}")
    return synced, trimmed


def uncounted(state: TableState, table) -> tuple[int, int]:
    """(ledgers, entries) of the table's commits past the row's mark, which the row has not counted yet."""
    ledgers = entries = 0
    for s in table.snapshots():
        summary = s.summary.additional_properties if s.summary else {}
        if int(summary.get(SUMMARY_THROUGH, "-1")) > state.synced_through and summary.get(SUMMARY_LEDGERS) is not None:
            ledgers += len(decode_ledgers(summary[SUMMARY_LEDGERS]))
            entries += int(summary.get("added-records", "0"))
    return ledgers, entries


def table_problem(table, state: TableState) -> str | None:
    """What stops a sync going on with `table`, the one the topic's row names, in words: another topic's or
    another tool's table under the name, or one holding less than the row's marks say (dropped and made
    again, rolled back). None: nothing. `table status` shows it; `table rebuild` is the remedy it names."""
    problem = owner_problem(table, state.topic, state.topic_id)  # e.g. an earlier topic's of this name
    if problem is None:
        try:
            check_marks(state, table)
        except TableBehind as exc:
            problem = str(exc)
    return problem


def check_renamable(cat, identifier: str, topic: str, topic_id: int) -> None:
    """BadInput when the table `identifier` holds this topic's ledgers by its own marks (a sync killed after
    its commit left the sync state behind them): renamed, the topic would be synced to a second table from
    ledger 0. Another topic's table (an earlier topic of the same name) holds nothing of this one: renaming
    away from it is the way out `owner_problem` names."""
    if not cat.table_exists(identifier):
        return
    table = cat.load_table(identifier)
    if owner_problem(table, topic, topic_id) is not None:
        return
    synced, trimmed = marks(table)
    if synced >= 0 or trimmed >= 0:
        raise BadInput(f"table {identifier!r} already holds ledgers through {synced} (committed by a sync whose "
                       "state was not recorded yet; the next sync records it): the topic's table cannot be renamed")


def dead_letter_rounds(table) -> list[tuple[int, list[str]]]:
    """The table's commits that had dead letters, in order: (the ledger each reached, its dead-letter files)."""
    rounds = []
    for s in table.snapshots():
        summary = s.summary.additional_properties if s.summary else {}
        if summary.get(SUMMARY_DLQ_FILES):
            rounds.append((int(summary[SUMMARY_THROUGH]), summary[SUMMARY_DLQ_FILES].split(",")))
    return sorted(rounds)


def dead_letters_pending(table, dlq) -> int:
    """How many of the table's commits have dead letters `dlq` (its TABLE__dlq, None when not made yet) has
    not taken: a sync killed between the two commits leaves them, and the next sync or maintenance commits
    them (sync.catch_up_dlq)."""
    mark = -1 if dlq is None else prop(dlq, PROP_SYNCED)
    return sum(1 for through, _ in dead_letter_rounds(table) if through > mark)


def foreign_commits(dlq) -> list[str]:
    """The commits of a dead-letter table that no sync made (each of a sync's records the ledger it reaches):
    another tool's delete or overwrite, whose removed rows no sync puts back."""
    return [f"snapshot {s.snapshot_id} ({s.summary.operation.value if s.summary else 'unknown operation'}) of "
            f"{'.'.join(dlq.name())!r} was not committed by a sync: dead letters it removed are not in the table"
            for s in dlq.snapshots()
            if not (s.summary and SUMMARY_THROUGH in s.summary.additional_properties)]
