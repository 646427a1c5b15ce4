"""Rebuild a topic's Iceberg table from the retained log: the way out when the table cannot be synced any
more (its metadata file gone or corrupt, the table dropped or replaced behind the store's back, rolled back,
or left by an earlier topic of the same name).

The table is derived data: the log is the record. A rebuild forgets the table (its catalog rows and those of
its dead-letter table, and the topic's sync state) in one transaction (metadata/table_sync.TableRows.reset),
refused while a sync or maintenance of it runs and when the table or the sync state moved since they were
checked. The next sync makes the table again at the same location, from the first retained ledger on,
every entry once; the old table's files, which no snapshot of the new one names, are orphans that `tiering
table maintain` deletes after its grace. A sync still running unlocked from before (its session lost) cannot
commit into the forgotten table: the catalog's compare-and-set finds no row.

A table of the same name that another tool (or another topic) made is never dropped: only a table this topic
made, one an earlier topic of its name made, or one under the store's warehouse whose metadata cannot be
read (the catalog refuses to read a row whose metadata lies elsewhere: tiering/tables/catalog.py)."""
from __future__ import annotations

from dataclasses import dataclass

from tiering.errors import BadInput, TableUnreadable
from tiering.metadata.table_sync import TableRows
from tiering.tables.catalog import check_current_files, owner_problem
from tiering.tables.maintenance import check_data_files, listed_files
from tiering.tables.marks import dropped, table_problem
from tiering.tables.naming import DLQ_SUFFIX, PROP_TOPIC


@dataclass
class RebuildReport:
    topic: str
    table: str
    found: str  # why it is rebuilt: the table's state as found
    metadata_location: str | None  # the forgotten table's, when the catalog had one
    synced_through: int  # the sync state's mark before
    retained_from: int | None  # the first ledger the log still holds: where the new table starts
    dry_run: bool


def rebuild_table(rows: TableRows, cat, settings, topic: str, dry_run: bool = False,
                  force: bool = False) -> RebuildReport:
    """Forget the topic's table so the next sync makes it again; a table in step with its sync state (its
    metadata and every data file its current snapshot reads there) only with `force` (its rows of ledgers
    the log no longer retains would not come back)."""
    [state] = rows.list(topic)  # BadInput when the topic has no table
    namespace, name = state.identifier.split(".")
    names = [name, name + DLQ_SUFFIX]
    locations = rows.catalog_locations(state.identifier, names)
    found = _found(cat, settings, state, namespace, names, locations)
    retained_from = rows.first_retained(state)
    if found == "readable" and not force:
        lost = "" if retained_from is None or retained_from <= 0 else \
            f"; its rows of ledgers before {retained_from}, which the log no longer retains, would not come back"
        raise BadInput(f"table {state.identifier!r} of topic {state.topic!r} is readable and in step with its "
                       f"sync state: nothing to rebuild (--force rebuilds it all the same{lost})")
    report = RebuildReport(state.topic, state.identifier, found, locations[name], state.synced_through,
                           retained_from, dry_run)
    if not dry_run:
        rows.reset(state, locations)
    return report


def _found(cat, settings, state, namespace: str, names: list[str], locations: dict[str, str | None]) -> str:
    """The state of the table and of its dead-letter table, in words ("absent", "readable", or what is
    wrong with either); BadInput when a table of their names is not the topic's to drop (another tool's or
    another topic's, or with its metadata outside the store's warehouse: the catalog refuses to read it)."""
    problems = []
    if locations[names[0]] is None and dropped(state):
        problems.append(f"dropped (the sync state says ledgers through {state.synced_through} are in it)")
    for name in names:
        if locations[name] is None:
            continue
        try:
            table = cat.load_table(f"{namespace}.{name}")
            if table.properties.get(PROP_TOPIC) != state.topic:  # made by another tool, or another topic's
                problem = owner_problem(table, state.topic, None)
                raise BadInput(f"table {namespace + '.' + name!r} {problem}: a rebuild drops only a table topic "
                               f"{state.topic!r} made; drop it with an Iceberg tool, or give the topic another "
                               "table")
            check_current_files(table)
            check_data_files(table, listed_files(table, settings))
        except TableUnreadable as exc:
            problems.append(f"unreadable: {exc}")
            continue
        if name == names[0]:
            problems.append(table_problem(table, state) or "")
    if any(problems):
        return "; ".join(p for p in problems if p)
    return "readable" if any(locations.values()) else "absent"


