"""Where tier-1 ledgers live under the root: `{root}/{topic dir}/{ledger_id:020d}.ledger`.

The topic directory name is the topic's UTF-8 bytes percent-encoded with the safe set `[A-Za-z0-9_-]`,
cut to at most 100 characters, then `-` and the first 16 hex digits of sha256(topic). So:

- no name can escape the root: the result contains only `[A-Za-z0-9_%-]`, is never `.`/`..`, never empty,
  and has no separator or NUL;
- it fits the 255-byte file-name limit whatever the topic's length (100 + 1 + 16 characters);
- it is injective: names whose encoding fits in 100 characters differ in the encoded part; longer ones differ
  in the hash with overwhelming probability. The hash also keeps names that differ only in case apart on
  case-insensitive file systems (the hex is lowercase and differs).
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from tiering.errors import BadInput, LedgerStorageError
from tiering.model import MAX_LEDGER_ID

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_PREFIX_CHARS = 100
_HASH_HEX = 16
LEDGER_SUFFIX = ".ledger"
LEDGER_FILE = re.compile(r"^(\d{20})\.ledger$")


def ledger_id_of(pattern: re.Pattern, name: str) -> int | None:
    """The ledger id a file name matching `pattern` carries, None for another name or an id the store
    never makes (twenty digits hold more than MAX_LEDGER_ID)."""
    m = pattern.match(name)
    return None if m is None or int(m.group(1)) > MAX_LEDGER_ID else int(m.group(1))


def _topic_bytes(topic: object) -> bytes:
    if not isinstance(topic, str) or topic == "":
        raise BadInput(f"topic name must be a non-empty string, got {topic!r}")
    try:
        return topic.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: not a name any other layer could store either
        raise BadInput(f"topic name {topic!r} is not valid Unicode") from None


# A long topic's whole name, beside its ledgers: its directory's name holds a cut of it, which a recovery
# without metadata cannot read back (recover_tier1.topic_of_dir reads this file then, and checks it)
NAME_FILE = "topic.name"
NAME_FILE_MAX = 8192  # bytes: more than a topic name's UTF-8 can take (check_topic_name)


def name_fits(topic: str) -> bool:
    """Whether `topic_dir_name(topic)` holds the topic's whole name (its encoding fits the readable part)."""
    return sum(1 if byte in _SAFE else 3 for byte in _topic_bytes(topic)) <= _PREFIX_CHARS


def topic_dir_name(topic: str) -> str:
    """The directory name (one path component) of `topic`."""
    raw = _topic_bytes(topic)
    encoded = []
    used = 0
    for byte in raw:
        piece = chr(byte) if byte in _SAFE else f"%{byte:02X}"
        if used + len(piece) > _PREFIX_CHARS:
            break  # cut on a whole %XX so the readable prefix stays well-formed
        encoded.append(piece)
        used += len(piece)
    return "".join(encoded) + "-" + hashlib.sha256(raw).hexdigest()[:_HASH_HEX]


def topic_dir(root: Path | str, topic: str) -> Path:
    """`root / topic_dir_name(topic)`, checked to be a direct child of the root."""
    root = Path(root)
    path = root / topic_dir_name(topic)
    # Belt and braces: the name cannot contain a separator, but a symlink planted in the root could still
    # point elsewhere; refuse rather than write outside the root.
    if Path(os.path.realpath(path)).parent != Path(os.path.realpath(root)):
        raise LedgerStorageError(f"tier-1 directory of topic {topic!r} resolves outside the root {root}")
    return path


def check_ledger_id(ledger_id: object) -> int:
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int) or not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise BadInput(f"ledger id must be an integer in 0..{MAX_LEDGER_ID}, got {ledger_id!r}")
    return ledger_id


def ledger_file_name(ledger_id: int) -> str:
    # Zero-padded so a directory listing sorts in ledger order.
    return f"{check_ledger_id(ledger_id):020d}{LEDGER_SUFFIX}"


def ledger_path(root: Path | str, topic: str, ledger_id: int) -> Path:
    """`{topic_dir}/{ledger_id:020d}.ledger`."""
    name = ledger_file_name(ledger_id)
    return topic_dir(root, topic) / name
