"""Retention's trim marker in tier 2 (`{prefix}{topic}/_trimmed`, format/keys.py): ledgers below it were
deleted on purpose, so recovery from the bucket alone does not bring them back. Written by retention, read
by recovery; S3 errors mapped to `Tier2Error`.

Retention calls `record_trim` only when the topic's trim point moved past the marker metadata last recorded
(topic.trim_marker_written, ops/retention.py): an idle run makes no request here; a move costs a GET and a
PUT (the GET keeps a marker that is further on in the bucket, e.g. after a recovery, from moving back).
A marker that cannot be read as one is a CorruptObjectError for recovery (which then leaves the topic to
the operator); GC's sweep takes it as no marker (keeps), retention writes its own over it."""
from __future__ import annotations

import json
import logging

from tiering.errors import CorruptObjectError
from tiering.format.keys import segment_marker_key, trim_marker_key
from tiering.model import INT64_MAX
from tiering.tier2.objects import Bucket, put_bytes, read_object

log = logging.getLogger(__name__)
MAX_MARKER_BYTES = 4096  # a marker is a few dozen bytes: anything larger is not one


def read_trim_marker(b: Bucket, topic: str) -> int:
    """The first ledger not trimmed on purpose, -1 when the topic has no marker."""
    return _read(b, trim_marker_key(b.prefix, topic))


def read_segment_marker(b: Bucket, segment: str) -> int:
    """The same, for a topic known only by its key segment (format/keys.py: a topic metadata no longer has,
    e.g. one deleted, whose topic deletion wrote a marker past its last ledger)."""
    return _read(b, segment_marker_key(b.prefix, segment))


def _read(b: Bucket, key: str) -> int:
    """The marker's ledger; CorruptObjectError when the object is not a marker this module wrote."""
    body = read_object(b, key, MAX_MARKER_BYTES + 1)
    if body is None:
        return -1
    try:
        value = json.loads(body)["trimmed_before_ledger"] if len(body) <= MAX_MARKER_BYTES else None
    # not JSON (UnicodeDecodeError is a ValueError), not an object, or nested deeper than the parser goes
    # (a RecursionError within 4 KiB)
    except (ValueError, TypeError, KeyError, RecursionError):
        value = None
    # A ledger id is a bigint (topic deletion writes its next one): a larger number was written by nothing
    # here, and GC's sweep would take every ledger of the topic as below it.
    if type(value) is not int or not 0 <= value <= INT64_MAX:
        raise CorruptObjectError("trim marker", key, 'not {"trimmed_before_ledger": <ledger id>}; rewrite or delete it, '
                                                        'then rerun')
    return value


def readable_or_none(read, *args) -> int:
    """A marker read where a corrupt one proves nothing (-1: none), logged: GC's sweep keeps what it would
    have proven trimmed; retention writes its own over it."""
    try:
        return read(*args)
    except CorruptObjectError as exc:
        log.warning("%s; taken as no marker", exc)
        return -1


def record_trim(b: Bucket, topic: str, before_ledger: int) -> None:
    """Write the topic's trim marker, only ever moving it forward."""
    if before_ledger <= readable_or_none(read_trim_marker, b, topic):
        return
    put_bytes(b, trim_marker_key(b.prefix, topic), json.dumps({"trimmed_before_ledger": before_ledger}).encode(),
              {}, content_type="application/json")
