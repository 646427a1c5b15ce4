"""check_marks' lineage rule over a table's snapshots (no catalog: the rule reads only snapshot ids and
parents): a table whose current snapshot does not descend from the one the sync state recorded was rolled
back, unless the lineage is cut (an expired snapshot) or loops, when it is unknown and not refused."""
from types import SimpleNamespace

import pytest

from tiering.metadata.table_sync import TableState
from tiering.tables.marks import TableBehind, check_marks
from tiering.tables.naming import PROP_SYNCED, PROP_TRIMMED


class _Table:
    """The part of a pyiceberg Table check_marks reads: `parents` maps snapshot id -> parent id (None: first)."""

    def __init__(self, parents: dict[int, int | None], current: int | None):
        self.snaps = {i: SimpleNamespace(snapshot_id=i, parent_snapshot_id=p) for i, p in parents.items()}
        self.current = current
        self.properties = {PROP_SYNCED: "7", PROP_TRIMMED: "-1"}
        self.metadata = self  # pyiceberg's ancestors_of asks the table metadata for snapshots by id

    def snapshot_by_id(self, snapshot_id):
        return self.snaps.get(snapshot_id)

    def current_snapshot(self):
        return self.snaps.get(self.current)


def _state(snapshot_id: int) -> TableState:
    return TableState(1, "t", "ns.t", "keep", None, 7, -1, 8, 80, snapshot_id, None, None, 1)


@pytest.mark.parametrize("parents,current,recorded", [
    ({1: None, 2: 1, 3: 2}, 3, 2),        # the current snapshot descends from the recorded one
    ({1: None, 2: 1}, 2, 2),              # it is the recorded one
    ({2: 1, 3: 2, 5: None}, 3, 5),        # the lineage is cut by an expired snapshot (1): unknown
    ({1: 3, 2: 1, 3: 2, 9: None}, 2, 9),  # a cycle that never reaches a first snapshot: unknown
    ({1: None, 2: 1}, 2, 4),              # the recorded snapshot expired: unknown
])
def test_marks_taken(parents, current, recorded):
    assert check_marks(_state(recorded), _Table(parents, current)) == (7, -1)


@pytest.mark.parametrize("parents,current,recorded", [
    ({1: None, 2: 1, 3: 1}, 3, 2),  # rolled back to 1, then a commit on it: 2 is no ancestor of 3
    ({1: None, 2: 1}, 1, 2),        # rolled back to 1
    ({1: None, 2: None}, 1, 2),     # replaced by a lineage of its own
])
def test_rolled_back(parents, current, recorded):
    with pytest.raises(TableBehind, match=f"rolled back: .* snapshot {recorded}"):
        check_marks(_state(recorded), _Table(parents, current))


def test_no_current_snapshot_is_rolled_back():
    with pytest.raises(TableBehind, match="rolled back"):
        check_marks(_state(2), _Table({2: None}, None))


def test_marks_behind_the_row():
    with pytest.raises(TableBehind, match="holds ledgers through 7 but the sync state says 9"):
        check_marks(TableState(1, "t", "ns.t", "keep", None, 9, -1, 8, 80, None, None, None, 1), _Table({}, None))
