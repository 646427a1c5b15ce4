"""The pure parts of a topic's table: its identifier's form, its retention mode, and the ledger sets an
Iceberg commit records in its snapshot summary (no I/O here)."""
from __future__ import annotations

import re

from tiering.errors import BadInput

# lower-case SQL-ish names every engine accepts unquoted (Spark, Trino, Flink, DuckDB): one namespace level
_PART = r"[a-z_][a-z0-9_]{0,63}"
IDENTIFIER = re.compile(rf"^({_PART})\.({_PART})$")
RETENTION_MODES = ("follow", "keep")
DLQ_SUFFIX = "__dlq"
# The table's partition field, day(sealed_at): Iceberg refuses a partition field named as a schema column
PARTITION_FIELD = "sealed_at_day"
# Snapshot summary and table property keys; the properties are the table's own record of its progress,
# changed in the same atomic commit as its data files (sync.py).
SUMMARY_TOPIC = "tiering.topic"
SUMMARY_LEDGERS = "tiering.ledgers"
SUMMARY_RUN = "tiering.run"
SUMMARY_DLQ_FILES = "tiering.dlq-files"  # a round's dead-letter files, committed to TABLE__dlq after it
PROP_SYNCED = "tiering.synced-through"
PROP_TRIMMED = "tiering.trimmed-through"
PROP_TOPIC = "tiering.topic"
PROP_TOPIC_ID = "tiering.topic-id"  # a topic deleted and made again has the same name, never the same id


def rebuild_hint(topic: str) -> str:
    """The way out of a table a sync cannot go on with (tiering/tables/rebuild.py)."""
    return f"`tiering table rebuild {topic}` makes it again from the retained log"


def parse_identifier(text: object) -> tuple[str, str]:
    """(namespace, table) of `NAMESPACE.TABLE`, else BadInput naming the expected form."""
    if not isinstance(text, str):
        raise BadInput(f"a table name is NAMESPACE.TABLE, got {type(text).__name__}")
    m = IDENTIFIER.match(text)
    if m is None or text.endswith("\n"):
        shown = text[:80] + ("..." if len(text) > 80 else "")
        raise BadInput(f"table name {shown!r} is not NAMESPACE.TABLE (lower-case letters, digits and _, "
                       "each part 1 to 64 characters, not starting with a digit)")
    if m.group(2).endswith(DLQ_SUFFIX):
        raise BadInput(f"table name {text!r}: names ending in {DLQ_SUFFIX} are dead-letter tables")
    return m.group(1), m.group(2)


def check_retention(mode: object) -> str:
    if mode not in RETENTION_MODES:
        raise BadInput(f"table retention is keep or follow, got {mode!r}")
    return mode  # type: ignore[return-value]


def encode_ledgers(ids) -> str:
    """Ledger ids as ranges: [1, 2, 3, 7] -> "1-3,7" (a snapshot summary value is a string)."""
    out, ids = [], sorted(set(ids))
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def decode_ledgers(text: str) -> list[int]:
    """The inverse of encode_ledgers."""
    ids: list[int] = []
    for part in filter(None, (text or "").split(",")):
        lo, _, hi = part.partition("-")
        ids.extend(range(int(lo), int(hi or lo) + 1))
    return ids


def batches(ledgers: list[dict], max_bytes: int, max_ledgers: int) -> list[list[dict]]:
    """Ledgers (in id order, each {"ledger_id", "size_bytes", "day"}) as the groups one data file holds: the
    same UTC day of sealed_at (a file is in one partition), at most max_bytes (a single larger ledger is a
    group alone) and max_ledgers."""
    groups: list[list[dict]] = []
    size = 0
    for led in ledgers:
        cur = groups[-1] if groups else None
        if cur is None or cur[0]["day"] != led["day"] or len(cur) >= max_ledgers \
                or size + led["size_bytes"] > max_bytes:
            groups.append([led])
            size = led["size_bytes"]
        else:
            cur.append(led)
            size += led["size_bytes"]
    return groups
