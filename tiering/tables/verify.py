"""`tiering table verify`: the table compared with `tiering read`, ledger by ledger (entry count and a
SHA-256 over entry ids and payloads), streaming both sides. A ledger's rows are in one data file in entry
order (files.py), so a ledger whose rows come back out of order or twice is reported, not hidden."""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

from tiering.model import LedgerState
from tiering.read import Entry
from tiering.tables.naming import PROP_SYNCED, PROP_TRIMMED

_HEAD = struct.Struct(">qq")


@dataclass
class _Ledger:
    count: int = 0
    next: int = 0
    ordered: bool = True
    digest: "hashlib._Hash" = field(default_factory=hashlib.sha256)

    def add(self, entry_id: int, data: bytes) -> None:
        if entry_id != self.next:
            self.ordered = False
        self.next = entry_id + 1
        self.count += 1
        self.digest.update(_HEAD.pack(entry_id, len(data)))
        self.digest.update(data)


@dataclass
class Report:
    topic: str
    table: str
    synced_through: int
    ledgers: int = 0  # compared
    entries: int = 0
    differences: list[dict] = field(default_factory=list)  # {"ledger", "reason"}


def verify_table(read_handle, meta, table, topic: str) -> Report:
    """Compare the table's rows with the topic's entries up to the table's mark. Ledgers deleted from the
    topic and kept in the table (retention 'keep') cannot be read back: they are not differences, unless the
    table's own trimmed mark ('follow') says their rows were deleted."""
    through = int(table.properties.get(PROP_SYNCED, "-1"))
    trimmed = int(table.properties.get(PROP_TRIMMED, "-1"))  # 'follow' deleted the rows of ledgers through it
    report = Report(topic, ".".join(table.name()), through)
    got: dict[int, _Ledger] = {}
    if table.current_snapshot() is not None:
        for batch in table.scan(selected_fields=("ledger_id", "entry_id", "payload")).to_arrow_batch_reader():
            for lid, eid, data in zip(batch.column("ledger_id").to_pylist(), batch.column("entry_id").to_pylist(),
                                      batch.column("payload").to_pylist()):
                got.setdefault(lid, _Ledger()).add(eid, data)
    want: dict[int, _Ledger] = {}
    if through >= 0:
        for item in read_handle.read(topic):
            if isinstance(item, Entry) and item.ledger_id <= through:
                want.setdefault(item.ledger_id, _Ledger()).add(item.entry_id, item.data)
    # a deleted ledger's entry count stays in its row: the rows the table keeps of it are counted against it
    deleted = {led.ledger_id: led.entry_count for led in meta.list_ledgers(topic) if led.state == LedgerState.DELETED}
    for lid in sorted(set(got) | set(want)):
        g, w = got.get(lid), want.get(lid)
        if w is None:
            if lid in deleted and lid <= trimmed:
                report.differences.append({"ledger": lid, "reason": f"deleted from the topic and by the table's "
                                           f"retention (through ledger {trimmed}), yet rows are in the table"})
            if lid in deleted:  # kept after retention deleted it ('keep'), or not yet deleted by 'follow'
                if not g.ordered or g.count != deleted[lid]:
                    report.differences.append({"ledger": lid, "reason": f"{g.count} row(s) in the table, "
                                               f"{deleted[lid]} entries in the ledger (deleted from the topic)"
                                               + ("" if g.ordered else ", rows repeated or missing")})
                continue
            report.differences.append({"ledger": lid, "reason": "in the table, not in the topic"})
        elif g is None:
            report.differences.append({"ledger": lid, "reason": "not in the table"})
        elif not g.ordered or g.count != w.count:
            report.differences.append({"ledger": lid, "reason": f"{g.count} row(s) in the table, {w.count} "
                                       "entries in the topic" + ("" if g.ordered else ", rows repeated or missing")})
        elif g.digest.digest() != w.digest.digest():
            report.differences.append({"ledger": lid, "reason": "payloads differ"})
        report.ledgers += 1
        report.entries += w.count if w else 0
    return report
