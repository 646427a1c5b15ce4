"""Plain value types shared by every layer (no I/O)."""
from __future__ import annotations

import enum
import re
import unicodedata
from dataclasses import dataclass

from tiering.errors import BadInput, ConditionalUpdateFailed


class LedgerState(str, enum.Enum):
    OPEN = "OPEN"
    SEALED = "SEALED"
    OFFLOADING = "OFFLOADING"
    OFFLOADED = "OFFLOADED"
    DELETED = "DELETED"


TOPIC_MAX = 1024
# bytes of UTF-8: a unique btree index entry holds at most ~2,700 bytes in PostgreSQL, and 1,024 characters
# of four bytes each would not fit (the insert failed as a database error)
TOPIC_MAX_BYTES = 2048
# Control characters (C0, DEL, C1) and the Unicode line/paragraph separators: a name holding one prints as
# several lines (`topic list`) or moves the terminal's cursor. The one definition: the Airflow form's
# pattern (jobs/spec.py) is built from it, so the escapes stay regex escapes (JSON schema has no raw NUL).
CONTROL_CHARS = r"\x00-\x1f\x7f-\x9f\u2028\u2029"
# Invisible and bidirectional format characters: "a\u200bb" prints as "ab", and U+202E shows a name's tail
# reversed, so two names that look the same could name different topics ("Trojan Source"). Every character of
# Unicode's format category (Cf: this Python's Unicode database, so new ones are covered as it grows), except
# the zero-width (non-)joiners and the emoji tag characters, which scripts and emoji sequences need; and
# these invisible ones outside Cf: the combining grapheme joiner and the blank Hangul fillers.
FORMAT_ALLOWED = frozenset("\u200c\u200d") | frozenset(map(chr, range(0xE0020, 0xE0080)))
INVISIBLE_OUTSIDE_CF = frozenset("\u034f\u115f\u1160\u3164\uffa0")
_CONTROL = re.compile(f"[{CONTROL_CHARS}]")


def _invisible(name: str) -> int | None:
    """The index of the first invisible or bidirectional format character in `name`, or None."""
    return next((i for i, c in enumerate(name) if c in INVISIBLE_OUTSIDE_CF or (
        unicodedata.category(c) == "Cf" and c not in FORMAT_ALLOWED)), None)


def check_topic_name(name: object, existing: bool = False, new: bool = False) -> str:
    """A topic name is 1 to 1,024 characters (at most 2,048 bytes of UTF-8) without control characters; any other
    character is fine: tier-1 directories and tier-2 keys encode it. `new=True` (creating it) also refuses
    invisible and bidirectional format characters and names not in NFC form, which print like another
    name. `existing=True` (looking up a topic the database already has) accepts the control characters other
    than NUL, so a topic created before they were refused stays reachable by the pipeline; PostgreSQL text
    cannot hold NUL at all."""
    return _check_name("topic", name, TOPIC_MAX, existing, new, most_bytes=TOPIC_MAX_BYTES)


def _check_name(kind: str, name: object, most: int, existing: bool, new: bool, most_bytes: int | None = None) -> str:
    """The rule of every name a user gives (topics, subscriptions); `kind` names it in the messages."""
    if not isinstance(name, str):
        raise BadInput(f"a {kind} name is a string, got {type(name).__name__}")
    if not name or len(name) > most or "\x00" in name:
        raise BadInput(f"a {kind} name is 1 to {most} characters without NUL or other control characters "
                       f"(got {len(name)} characters{', with NUL' if chr(0) in name else ''})")
    bad = None if existing else _CONTROL.search(name)
    if bad:
        raise BadInput(f"a {kind} name may not contain control characters (U+{ord(bad.group()):04X} at "
                       f"character {bad.start()})")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # undecodable bytes in argv arrive as lone surrogates
        raise BadInput(f"a {kind} name must be valid UTF-8") from None
    if most_bytes is not None and size > most_bytes:
        raise BadInput(f"a {kind} name is at most {most_bytes} bytes of UTF-8 (got {size} bytes in {len(name)} "
                       "characters)")
    if new:
        if name != name.strip():  # "s " and "s" print alike in every listing
            raise BadInput(f"a {kind} name may not begin or end with whitespace")
        bad = _invisible(name)
        if bad is not None:
            raise BadInput(f"a {kind} name may not contain invisible or bidirectional format characters "
                           f"(U+{ord(name[bad]):04X} at character {bad})")
        if not unicodedata.is_normalized("NFC", name):
            # "é" as one code point or as "e" and a combining accent looks the same and would be two names
            raise BadInput(f"a {kind} name must be in Unicode NFC form (composed characters: \"é\" as U+00E9, "
                           "not \"e\" + U+0301)")
    return name


# Numbers at the edge (CLI, Params, job arguments, settings) are ASCII digits only: Python's int() also
# takes Unicode digits ("١", "５"), surrounding whitespace (including "\v") and "_" separators.
INT64_MAX = 2**63 - 1  # PostgreSQL bigint
INT32_MAX = 2**31 - 1  # the largest int32 (fields of the PIP-17 index: block_size, page_size)
# The largest ledger id the store makes: a topic's next_ledger_id (a bigint) must follow it. A key or tier-1
# file naming a larger one is not the store's (recovery moving next_ledger_id past it would overflow).
MAX_LEDGER_ID = INT64_MAX - 1
# The entry count a read or a Spark plan gives a lost ledger whose count nobody knows
# (Ledger.entries_unknown): every entry id a position can name (0..INT64_MAX) is inside it, so the read
# runs to the end of that ledger as one DATALOSS gap.
UNKNOWN_ENTRY_COUNT = INT64_MAX + 1
MAX_SECONDS = 100 * 365 * 86400  # durations: 100 years fits timedelta and PostgreSQL intervals with room
ASCII_INT = re.compile(r"-?[0-9]+")


class BadInt(BadInput):
    """parse_int's refusal. `reason`: "syntax" (not an integer in ASCII digits), "low" or "high" (outside the
    bounds), or "fraction" (a size or duration that does not come to whole bytes or seconds: its message says
    so), so each edge (settings, CLI arguments, job arguments) phrases it its own way."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def parse_int(text: object, what: str, lo: int, hi: int) -> int:
    """`text` as an integer in [lo, hi]: an optional '-' and ASCII digits, nothing else (no '+', no
    spaces, no '_'). The one integer parser of every edge; raises BadInt naming `what`."""
    if not isinstance(text, str) or not ASCII_INT.fullmatch(text):
        shown = text[:40] if isinstance(text, str) else text
        raise BadInt(f"{what} must be an integer in ASCII digits, got {shown!r}", "syntax")
    # length first: int() of 10**6 digits is slow, and more than 19 digits is beyond any bound (bigint)
    value = int(text) if len(text.lstrip("-")) <= 19 else None
    if value is not None and text.startswith("-") and text != str(value):
        # "-0" and "-01" are no way to write 0 or the -1 that disables a threshold: one spelling each
        raise BadInt(f"{what} must be written without '-0' or leading zeros, got {text[:40]!r}", "syntax")
    if value is None or not lo <= value <= hi:
        high = not text.startswith("-") if value is None else value > hi
        raise BadInt(f"{what} must be between {lo} and {hi}, got {text[:40]}{'...' if len(text) > 40 else ''}",
                     "high" if high else "low")
    return value


# a position's text: the one spelling of the rule (the trigger form's JSON-schema patterns are built from it)
POSITION_REGEX = r"([0-9]{1,18}):([0-9]{1,18})"
_POSITION = re.compile(POSITION_REGEX)


@dataclass(frozen=True, order=True)
class Position:
    """A position in a topic: (ledger id, entry id), ordered as Pulsar's PositionImpl."""

    ledger_id: int
    entry_id: int

    @classmethod
    def parse(cls, text: str) -> "Position":
        """`L:E` in ASCII digits, nothing around it (fullmatch: `$` would let a trailing newline in). Each at
        most 18 digits: every such number fits a bigint, so none overflows a query later."""
        m = _POSITION.fullmatch(text) if isinstance(text, str) else None
        if not m:
            shown = text[:60] if isinstance(text, str) else text
            raise BadInput(f"malformed position {shown!r}: expected LEDGER:ENTRY, each 1 to 18 ASCII "
                           "digits, e.g. 3:0")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


DISABLED = -1
HOUR = 3600
MIB = 1024 * 1024


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
    # Subscriptions (tiering/ops/subscriptions.py): with retain_unread, time/size retention deletes a ledger
    # only once every ACTIVE subscription has read all of it; the ceilings delete even unread data (the loss
    # is recorded); a subscription with no ack for subscription_expiry_seconds is EXPIRED and holds nothing.
    retain_unread: bool = False
    max_retention_seconds: int = DISABLED
    max_retention_bytes: int = DISABLED
    subscription_expiry_seconds: int = DISABLED

    def __post_init__(self):
        seconds = ("offload_after_seconds", "deletion_lag_seconds", "retention_seconds", "max_retention_seconds")
        for name in ("offload_after_seconds", "offload_threshold_bytes", "retention_seconds", "retention_bytes",
                     "max_retention_seconds", "max_retention_bytes"):
            value = getattr(self, name)
            hi = MAX_SECONDS if name in seconds else INT64_MAX
            if not _is_int(value) or not DISABLED <= value <= hi:
                raise BadInput(f"{name.replace('_', '-')} must be -1 (disabled) or an integer from 0 to {hi}, "
                               f"got {value}")
        if not _is_int(self.deletion_lag_seconds) or not 0 <= self.deletion_lag_seconds <= MAX_SECONDS:
            raise BadInput(f"deletion-lag must be an integer from 0 to {MAX_SECONDS}, got {self.deletion_lag_seconds}")
        for name in ("rollover_entries", "rollover_bytes"):
            value = getattr(self, name)
            if not _is_int(value) or not 0 < value <= INT64_MAX:
                raise BadInput(f"{name.replace('_', '-')} must be a positive integer up to {INT64_MAX}, got {value}")
        if not isinstance(self.retain_unread, bool):
            raise BadInput(f"retain-unread must be true or false, got {self.retain_unread!r}")
        expiry = self.subscription_expiry_seconds
        if not _is_int(expiry) or not (expiry == DISABLED or 0 < expiry <= MAX_SECONDS):
            raise BadInput(f"subscription-expiry must be -1 (never) or a number of seconds from 1 to {MAX_SECONDS}, "
                           f"got {expiry}")
        for ceiling, limit, unit in (("max_retention_seconds", "retention_seconds", "seconds"),
                                     ("max_retention_bytes", "retention_bytes", "bytes")):
            cap, kept = getattr(self, ceiling), getattr(self, limit)
            if cap != DISABLED and kept != DISABLED and cap < kept:
                what = "time" if unit == "seconds" else "size"
                raise BadInput(f"max-retention-{what} ({cap} {unit}) is below the retention-{what} it caps "
                               f"({kept} {unit})")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Topic:
    topic_id: int
    name: str
    policy: TopicPolicy
    next_ledger_id: int
    version: int


SUBSCRIPTION_MAX = 256


def check_subscription_name(name: object, new: bool = False) -> str:
    """A subscription name: 1 to 256 characters, the rule of topic names (`new` as there); control
    characters were refused from the start."""
    return _check_name("subscription", name, SUBSCRIPTION_MAX, False, new)


ACTIVE = "ACTIVE"
EXPIRED = "EXPIRED"


@dataclass(frozen=True)
class Subscription:
    """A named reader position of a topic. `position`: the last entry read (None before the first).
    `state` is derived from the topic's subscription expiry and the last ack (or creation) when read."""
    subscription_id: int
    topic_id: int
    topic: str
    name: str
    position: Position | None
    created_at: object
    last_ack_at: object
    state: str
    entries_deleted_unread: int
    bytes_deleted_unread: int
    last_loss_at: object
    last_loss_reason: str | None
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
    # Set when no tier holds a good copy any more (tiering/ops/repair.py): reads give a DATALOSS gap at once.
    lost_at: object = None

    @property
    def lost(self) -> bool:
        return self.lost_at is not None

    @property
    def entries_unknown(self) -> bool:
        """A lost ledger whose entry count nobody knows: recovery found its id named or skipped over but no
        index object describing it (tiering/ops/recover.py). An offloaded ledger always held at least one
        entry, so a lost one recorded with 0 says so; reads give one DATALOSS gap to its end (read.py)."""
        return self.lost_at is not None and self.entry_count == 0

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
    # The objects' ETags as the requests that wrote them answered (None: kept only since migration 0012, or
    # found by a recovery that could not tell): a PUT over a key since then answers HEAD with another ETag.
    data_etag: str | None = None
    index_etag: str | None = None

    def moved(self, now: "Chunk | None") -> bool:
        """Whether `now`, the ledger's chunk row read again, is no longer this one: every move of a chunk
        (defrag, repair) is a compare-and-set on its version and data key. No row counts as moved."""
        return now is None or (now.version, now.data_key) != (self.version, self.data_key)

    def check_still(self, now: "Chunk | None", topic: str, ledger_id: int) -> None:
        """ConditionalUpdateFailed, naming both rows, when `now` moved from this one."""
        if self.moved(now):
            raise ConditionalUpdateFailed(f"chunk of {topic}/{ledger_id}", f"version {self.version} at {self.data_key}",
                                          "no chunk" if now is None else f"version {now.version} at {now.data_key}")


# a bucket as an export location or a manifest names it (no user, password or port: those may hold a secret)
BUCKET_NAME = re.compile(r"[A-Za-z0-9._-]{1,255}")
_EXPORT_KEY_MAX = 900


def tables_prefix(prefix: str) -> str:
    """The key prefix of the Iceberg tables' warehouse in the tier-2 bucket: beside tier 2's prefix, not
    inside it (`tiering/` -> `tiering-tables/`)."""
    return f"{prefix.rstrip('/') or 'tiering'}-tables/"


def check_export_location(url: object, bucket: str | None = None, prefix: str | None = None) -> str:
    """A metadata export's location, stripped: a local path (or file:// URL) or s3://bucket/path; with the
    tier-2 `bucket` and `prefix`, never under that prefix nor under the tables' warehouse beside it: GC's
    orphan sweep owns everything in the first, table maintenance's orphan sweep every file in a table's
    directory of the second, and each deletes what is not its own, an export's parts and manifest included."""
    from urllib.parse import urlsplit

    if not isinstance(url, str) or not url.strip():
        raise BadInput("export location must be a local path or s3://bucket/path")
    url = url.strip()
    if "\x00" in url:  # no path, key or argv holds one
        raise BadInput("export location may not contain NUL")
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (a JSON "\udcff" in a DAG run's conf): no path or key holds one
        raise BadInput("export location must be valid UTF-8") from None
    if _CONTROL.search(url):  # urlsplit drops tab, CR and LF: "s3://b/a\nb" would be written to "b/ab"
        raise BadInput("export location may not contain control characters (newline, tab, ...)")
    try:
        parts = urlsplit(url)
    except ValueError:  # a malformed IPv6 host ("s3://[b/x")
        raise BadInput("export location must be a local path or s3://bucket/path") from None
    if parts.scheme in ("s3", "s3a", "file") and ("?" in url or "#" in url):
        # urlsplit ends the path there: "s3://b/run#1" and "s3://b/run#2" would both be "b/run"
        raise BadInput("export location may not contain '?' or '#' (the URL's path ends there)")
    if parts.scheme in ("s3", "s3a"):
        if not parts.netloc:
            raise BadInput(f"export location {url!r} names no bucket (expected s3://bucket/path)")
        if not BUCKET_NAME.fullmatch(parts.netloc):
            # a user, password or port is no bucket (and is not echoed: it may hold a secret key)
            raise BadInput("export location's bucket must be a bucket name (letters, digits, '.', '-', '_'; no "
                           "user, password or port)")
        if any(segment in (".", "..") for segment in parts.path.split("/")):
            # S3 keeps "./x" and "../x" as they are, other clients (and RGW) do not: one key, one spelling
            raise BadInput("export location's path may not contain '.' or '..' segments")
        if len(parts.path.encode("utf-8")) > _EXPORT_KEY_MAX:
            raise BadInput(f"export location's path is at most {_EXPORT_KEY_MAX} bytes (an S3 key is at most 1,024, "
                           "and the parts' names are added to it)")
        if bucket is not None and prefix is not None and parts.netloc == bucket:
            key = parts.path.lstrip("/") + "/"
            if key.startswith(prefix):
                raise BadInput(f"{url} is under the tier-2 prefix {prefix!r}, which GC's orphan sweep owns")
            if key.startswith(tables_prefix(prefix)):
                raise BadInput(f"{url} is under the Iceberg tables' prefix {tables_prefix(prefix)!r}, whose "
                               "files table maintenance's orphan sweep owns")
    elif parts.scheme != "file" and len(parts.scheme) > 1:
        raise BadInput(f"export location {url!r}: unsupported scheme {parts.scheme!r} (use s3:// or a path)")
    return url


def preview_marks(dry_run: bool) -> dict:
    """What a preview's output and its `job_run.details` carry besides its counts ({"dry_run": true}), the
    CLI's and the pipeline's alike; nothing for a run."""
    return {"dry_run": True} if dry_run else {}
