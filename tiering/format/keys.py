"""Object keys: `{prefix}{topic}/{uuid}-ledger-{ledger_id}` (+ `-index`), topic percent-encoded.

Percent-encoding with safe='' turns `/`, NUL, quotes and every non-ASCII byte into %XX, so a topic is always
exactly one key segment; a topic made only of dots is encoded as %2E... so no segment is `.` or `..` (which
some tools and S3-compatible stores normalise away).
"""
from __future__ import annotations

import hashlib
import re
from typing import NamedTuple
from urllib.parse import quote, unquote

from tiering.errors import BadInput
from tiering.model import MAX_LEDGER_ID

INDEX_SUFFIX = "-index"
_UUID = re.compile(r"[0-9A-Za-z_-]+")
_TAIL = re.compile(r"(?P<uuid>[0-9A-Za-z_-]+)-ledger-(?P<ledger>0|[1-9][0-9]{0,18})(?P<index>-index)?")


# S3 keys are at most 1,024 bytes: a topic's segment longer than this is cut and made unique by a hash
# (as tier 1 does for file names). Direct segments are <= MAX_SEGMENT, hashed ones longer: no collision.
MAX_SEGMENT = 200
_HASHED = re.compile(r"[A-Za-z0-9%._~-]+-[0-9a-f]{16}")


class ParsedKey(NamedTuple):
    topic: str | None  # None when the segment is hashed: the index metadata names the topic
    uuid: str
    ledger_id: int
    is_index: bool
    segment: str = ""


def encode_topic(topic: str) -> str:
    if not isinstance(topic, str) or not topic:
        raise BadInput(f"topic must be a non-empty string, got {topic!r}")
    try:
        encoded = quote(topic, safe="")
    except UnicodeEncodeError:  # lone surrogates cannot be UTF-8 encoded
        raise BadInput(f"topic {topic!r} is not valid Unicode") from None
    if topic.strip(".") == "":
        encoded = "%2E" * len(topic)
    if len(encoded) <= MAX_SEGMENT:
        return encoded
    cut = encoded[:MAX_SEGMENT]
    pct = cut.rfind("%", len(cut) - 2)
    if pct != -1:  # never split a %XX escape
        cut = cut[:pct]
    return f"{cut}-{hashlib.sha256(topic.encode()).hexdigest()[:16]}"


def data_key(prefix: str, topic: str, uuid: str, ledger_id: int) -> str:
    if not isinstance(uuid, str) or not _UUID.fullmatch(uuid):
        raise BadInput(f"offload uuid must be letters, digits, '-' or '_', got {uuid!r}")
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int) or not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise BadInput(f"ledger id must be an integer in 0..{MAX_LEDGER_ID}, got {ledger_id!r}")
    return f"{prefix}{encode_topic(topic)}/{uuid}-ledger-{ledger_id}"


def index_key(prefix: str, topic: str, uuid: str, ledger_id: int) -> str:
    return data_key(prefix, topic, uuid, ledger_id) + INDEX_SUFFIX


def parse_key(prefix: str, key: str) -> ParsedKey | None:
    """Invert data_key/index_key; None for any key these functions would not have produced."""
    if not key.startswith(prefix):
        return None
    encoded, slash, tail = key[len(prefix):].partition("/")
    m = _TAIL.fullmatch(tail) if slash else None
    if not m or not encoded:
        return None
    ledger_id = int(m["ledger"])
    if ledger_id > MAX_LEDGER_ID:
        return None
    if len(encoded) > MAX_SEGMENT:
        if not _HASHED.fullmatch(encoded):
            return None
        return ParsedKey(None, m["uuid"], ledger_id, m["index"] is not None, encoded)
    try:
        topic = unquote(encoded, errors="strict")
        if encode_topic(topic) != encoded:  # not canonical (e.g. lower-case %2f): not one of ours
            return None
    except (BadInput, UnicodeDecodeError):
        return None
    return ParsedKey(topic, m["uuid"], ledger_id, m["index"] is not None, encoded)


# Retention's marker: `{prefix}{topic}/_trimmed` holds {"trimmed_before_ledger": N}, so recovery from the
# bucket alone does not bring back ledgers whose bytes still sit in a merged object shared with live ones.
TRIM_MARKER = "_trimmed"


def trim_marker_key(prefix: str, topic: str) -> str:
    return segment_marker_key(prefix, encode_topic(topic))


def segment_marker_key(prefix: str, segment: str) -> str:
    """The marker's key under a topic's key segment (the sweep knows only that of a topic metadata lacks)."""
    return f"{prefix}{segment}/{TRIM_MARKER}"


def is_trim_marker(prefix: str, key: str) -> bool:
    return key.startswith(prefix) and key.endswith("/" + TRIM_MARKER) and key.count("/", len(prefix)) == 1
