"""Plain value types shared by every layer (no I/O)."""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from tiering.errors import BadInput


class LedgerState(str, enum.Enum):
    OPEN = "OPEN"
    SEALED = "SEALED"
    OFFLOADING = "OFFLOADING"
    OFFLOADED = "OFFLOADED"
    DELETED = "DELETED"


TOPIC_MAX = 1024


def check_topic_name(name: object) -> str:
    """A topic name is 1 to 1,024 characters of valid Unicode without NUL (PostgreSQL text cannot hold
    NUL); any other character is fine: tier-1 directories and tier-2 keys encode it."""
    if not isinstance(name, str):
        raise BadInput(f"a topic name is a string, got {type(name).__name__}")
    if not name or len(name) > TOPIC_MAX or "\x00" in name:
        raise BadInput(f"a topic name is 1 to {TOPIC_MAX} characters without NUL "
                       f"(got {len(name)} characters{', with NUL' if chr(0) in name else ''})")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes in argv arrive as lone surrogates
        raise BadInput("a topic name must be valid UTF-8") from None
    return name


_POSITION = re.compile(r"^(\d{1,18}):(\d{1,18})$")


@dataclass(frozen=True, order=True)
class Position:
    """A position in a topic: (ledger id, entry id), ordered as Pulsar's PositionImpl."""

    ledger_id: int
    entry_id: int

    @classmethod
    def parse(cls, text: str) -> "Position":
        m = _POSITION.match(text.strip()) if isinstance(text, str) else None
        if not m:
            raise BadInput(f"malformed position {text!r}: expected LEDGER:ENTRY, e.g. 3:0")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


DISABLED = -1
HOUR = 3600


@dataclass(frozen=True)
class TopicPolicy:
    """A topic's tiering policy; -1 disables a threshold (Pulsar's convention)."""

    offload_after_seconds: int = DISABLED
    offload_threshold_bytes: int = DISABLED
    deletion_lag_seconds: int = 4 * HOUR
    retention_seconds: int = DISABLED
    retention_bytes: int = DISABLED
    rollover_entries: int = 50_000
    rollover_bytes: int = 64 * 1024 * 1024

    def __post_init__(self):
        for name in ("offload_after_seconds", "offload_threshold_bytes", "retention_seconds", "retention_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < DISABLED:
                raise BadInput(f"{name.replace('_', '-')} must be -1 (disabled) or a non-negative integer, got {value}")
        if not isinstance(self.deletion_lag_seconds, int) or self.deletion_lag_seconds < 0:
            raise BadInput(f"deletion-lag must be a non-negative integer, got {self.deletion_lag_seconds}")
        for name in ("rollover_entries", "rollover_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise BadInput(f"{name.replace('_', '-')} must be a positive integer, got {value}")


@dataclass(frozen=True)
class Topic:
    topic_id: int
    name: str
    policy: TopicPolicy
    next_ledger_id: int
    version: int


@dataclass(frozen=True)
class Ledger:
    topic_id: int
    topic: str
    ledger_id: int
    state: LedgerState
    entry_count: int
    size_bytes: int
    created_at: object
    sealed_at: object
    tier1_present: bool
    offload_uuid: str | None
    offload_started_at: object
    offloaded_at: object
    deleted_at: object
    version: int

    @property
    def last_entry_id(self) -> int:
        return self.entry_count - 1


@dataclass(frozen=True)
class Chunk:
    """Where in tier 2 a ledger's bytes lie: a data range and an index range (of possibly shared objects)."""

    data_key: str
    data_offset: int
    data_length: int
    index_key: str
    index_offset: int
    index_length: int
    first_entry_id: int
    last_entry_id: int
    version: int = 0
