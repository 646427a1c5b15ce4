"""Typed errors of the tiering library.

Every error a user can cause derives from `TieringError`; the CLI prints its one-line `str()` and exits
with `exit_code`. Errors never carry secrets (no URLs with passwords, no credentials).
"""
from __future__ import annotations


class TieringError(Exception):
    """Base of every error the library raises on purpose."""

    exit_code = 1


class BadInput(TieringError):
    """The caller asked for something malformed or impossible (CLI exit 2)."""

    exit_code = 2


class ConfigError(BadInput):
    """A setting is missing or malformed; the message names the variable."""


class TopicNotFound(BadInput):
    def __init__(self, topic: str):
        super().__init__(f"topic {topic!r} does not exist")
        self.topic = topic


class TopicBeingDeleted(TieringError):
    """A producer's next ledger refused: a `topic delete` of the topic is running (exit 1; once it has
    finished the topic does not exist, and if it failed the producer can go on)."""

    def __init__(self, topic: str):
        super().__init__(f"topic {topic!r} is being deleted: no new ledger is opened in it (a delete that fails "
                         "leaves it writable again)")
        self.topic = topic


class TopicReplaced(TopicNotFound):
    """The topic a multi-step operation started on was deleted by another run meanwhile and its name taken
    by a new topic: the operation stops rather than go on with the new one."""

    def __init__(self, topic: str):
        BadInput.__init__(self, f"topic {topic!r} does not exist any more: another run deleted it meanwhile "
                                "(the topic created since under that name is left alone)")
        self.topic = topic


class TopicGone(TieringError):
    """The topic was deleted by another run while an operation on it was under way (its start found it): not
    the caller's mistake, so not BadInput; what the operation did before stays done."""

    def __init__(self, topic: str, while_: str):
        super().__init__(f"topic {topic!r} was deleted while {while_}")
        self.topic = topic


class TopicExists(BadInput):
    def __init__(self, topic: str):
        super().__init__(f"topic {topic!r} already exists")
        self.topic = topic


class SubscriptionNotFound(BadInput):
    def __init__(self, topic: str, name: str):
        super().__init__(f"subscription {name!r} of topic {topic!r} does not exist")
        self.topic = topic
        self.name = name


class BeforeHead(BadInput):
    """A position below what the topic still holds (a trimmed ledger, an id it does not hold): one sentence
    for every command that takes a position, `why` saying which."""
    def __init__(self, position, topic: str, why: str):
        super().__init__(f"position {position} is before the head of topic {topic!r} ({why})")


class LedgerTrimmed(BadInput):
    """The ledger a new subscription's position was derived from was trimmed before the subscription was
    inserted: bad input for a position the caller named, a lost race for one derived from the topic's end."""
    def __init__(self, topic: str, ledger_id: int):
        super().__init__(f"ledger {ledger_id} of topic {topic!r} was trimmed meanwhile; choose a position at or "
                         "after the head")
        self.topic = topic
        self.ledger_id = ledger_id


class LedgerNotFound(BadInput):
    def __init__(self, topic: str, ledger_id: int):
        super().__init__(f"ledger {ledger_id} of topic {topic!r} does not exist")
        self.topic = topic
        self.ledger_id = ledger_id


class ConditionalUpdateFailed(TieringError):
    """A compare-and-set lost: the row was not in the expected version/state.

    Says what was expected and what was found, as Pravega's BadKeyVersionException does.
    """

    def __init__(self, what: str, expected: object, found: object):
        super().__init__(f"conditional update of {what} failed: expected {expected}, found {found}")
        self.what = what
        self.expected = expected
        self.found = found


class CorruptObjectError(TieringError):
    """Bytes read from a tier do not follow the format; says what and where."""

    def __init__(self, what: str, where: str, detail: str, *, tier: int | None = None):
        super().__init__(f"corrupt {what} at {where}: {detail}")
        self.what = what
        self.where = where
        self.detail = detail
        self.tier = tier  # 1: a tier-1 file (its offloaded ledger's tier-2 copy may still be sound)


class LedgerStorageError(TieringError):
    """Tier-1 storage could not do what was asked (missing file, sealed ledger, ...)."""


class EntryNotFound(BadInput):
    """An entry id outside the ledger's range was asked for."""


class Tier2Error(TieringError):
    """The object store failed; the message has the operation and key, never credentials."""


class RecoveryRunning(TieringError):
    """A GC run of the queue refused because a recovery from the bucket runs on its bucket and prefix (or
    waits to): nothing was done, and trying again at once meets the same recovery, so it is not retried."""


class Tier2CopyMissing(TieringError):
    """An offloaded ledger's tier-2 object is missing or shorter than its chunk row says: the tier-1 copy
    must be kept (delete-lagged refuses to delete it)."""


class DataLossError(TieringError):
    """Metadata says a ledger exists but no tier holds its bytes."""


class TableUnreadable(TieringError):
    """An Iceberg table's current metadata file is missing or not Iceberg metadata (deleted by hand, by the
    maintenance of another database sharing its location, or corrupted): its rows cannot be read or
    appended to. `tiering table rebuild` makes the table again from the topic's retained log."""
