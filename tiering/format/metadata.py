"""The ledger metadata stored (as protobuf) inside each index object, and the objects' S3 user metadata.

The protobuf code is generated; after editing ledger_metadata.proto regenerate it from the repo root with
    .venv/bin/python -m grpc_tools.protoc -I tiering/format --python_out=tiering/format \
        tiering/format/ledger_metadata.proto
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping
from urllib.parse import quote, unquote

from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from tiering.errors import BadInput, CorruptObjectError
from tiering.format import ledger_metadata_pb2 as _pb
from tiering.format.pages import PageIndex

FORMAT_VERSION = 1
# S3 lower-cases user metadata keys, so these are stored lower-case (Pulsar's names, lower-cased).
FORMAT_VERSION_KEY = "s3managedledgeroffloaderformatversion"
TOPIC_KEY = "managedledgername"
USER_METADATA = {FORMAT_VERSION_KEY: str(FORMAT_VERSION)}
# on an object several ledgers share (a batch, a defrag's merge; named after its first): the largest id it
# holds, so a recovery whose index object of it cannot be read still knows those ids existed (ours alone)
LAST_LEDGER_KEY = "tiering-last-ledger"

_INT64 = (-(2**63), 2**63 - 1)
_INT32 = (-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class LedgerOffloadMetadata:
    """Enough to rebuild a ledger's metadata row from the bucket alone."""

    topic: str
    ledger_id: int
    entry_count: int
    length: int  # payload bytes of all entries, framing excluded
    sealed_time_ms: int
    offload_uuid: str
    data_object_len: int
    block_size: int
    properties: Mapping[str, str] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    pages: PageIndex | None = None  # None: written before page indexes existed (read without CRC checks)

    @property
    def last_entry_id(self) -> int:
        return self.entry_count - 1


_NON_NEGATIVE = ("ledger_id", "entry_count", "length", "data_object_len", "block_size")


def _problems(meta: LedgerOffloadMetadata) -> list[str]:
    """What makes `meta` unfit to store or trust; empty when it is fine."""
    out = []
    for name in _NON_NEGATIVE + ("sealed_time_ms",):
        value = getattr(meta, name)
        lo, hi = _INT32 if name == "block_size" else _INT64
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            out.append(f"{name} must be an int{32 if name == 'block_size' else 64}, got {value!r}")
        elif name in _NON_NEGATIVE and value < 0:
            out.append(f"{name} must be non-negative, got {value}")
    if not isinstance(meta.topic, str) or not meta.topic:
        out.append(f"topic must be a non-empty string, got {meta.topic!r}")
    if not isinstance(meta.offload_uuid, str) or not meta.offload_uuid:
        out.append(f"offload_uuid must be a non-empty string, got {meta.offload_uuid!r}")
    if meta.format_version != FORMAT_VERSION:
        out.append(f"unsupported format version {meta.format_version!r}, expected {FORMAT_VERSION}")
    return out


def encode_metadata(meta: LedgerOffloadMetadata) -> bytes:
    problems = _problems(meta)
    if not isinstance(meta.properties, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.properties.items()):
        problems.append("properties must map str to str")
    if problems:
        raise BadInput("invalid ledger offload metadata: " + "; ".join(problems))
    try:
        msg = _pb.LedgerOffloadMetadata(
            format_version=meta.format_version, topic=meta.topic, ledger_id=meta.ledger_id,
            entry_count=meta.entry_count, length=meta.length, sealed_time_ms=meta.sealed_time_ms,
            offload_uuid=meta.offload_uuid, data_object_len=meta.data_object_len, block_size=meta.block_size,
            properties=dict(meta.properties))
        if meta.pages is not None:
            msg.pages.page_size = meta.pages.page_size
            msg.pages.page_first_entry.extend(meta.pages.first_entries)
            msg.pages.page_offset.extend(meta.pages.offsets)
            msg.pages.page_crc32c.extend(meta.pages.crcs)
        # deterministic: map order fixed, so equal metadata gives equal bytes (useful for idempotent retries)
        return msg.SerializeToString(deterministic=True)
    except ValueError as exc:  # e.g. a surrogate in a string
        raise BadInput(f"invalid ledger offload metadata: {exc}") from None


def decode_metadata(data: bytes, where: str = "index metadata") -> LedgerOffloadMetadata:
    return decode_metadata_and_crc(data, where)[0]


def decode_metadata_and_crc(data: bytes, where: str = "index metadata") -> tuple[LedgerOffloadMetadata, int]:
    """The metadata and the index_crc32c it holds (0 when absent: format/index.py checks the index with it)."""
    msg = _pb.LedgerOffloadMetadata()
    try:
        msg.ParseFromString(bytes(data))
    except (DecodeError, RecursionError) as exc:  # RecursionError: deeply nested unknown groups
        raise CorruptObjectError("ledger metadata", where, f"not a LedgerOffloadMetadata protobuf: {exc}") from None
    # Only this writer makes these objects: a field it does not know is damage, not a newer writer. One flipped
    # bit in the page index's tag makes it such a field, and without the refusal the ledger would read as
    # written before page checksums, its payloads unchecked.
    unknown = [n for part in (msg, msg.pages) for n in (f.field_number for f in UnknownFieldSet(part))]
    if unknown:
        raise CorruptObjectError("ledger metadata", where, f"unknown field(s) {sorted(set(unknown))}: damaged")
    meta = LedgerOffloadMetadata(
        topic=msg.topic, ledger_id=msg.ledger_id, entry_count=msg.entry_count, length=msg.length,
        sealed_time_ms=msg.sealed_time_ms, offload_uuid=msg.offload_uuid, data_object_len=msg.data_object_len,
        block_size=msg.block_size, properties=dict(msg.properties), format_version=msg.format_version,
        pages=PageIndex(msg.pages.page_size, tuple(msg.pages.page_first_entry), tuple(msg.pages.page_offset),
                        tuple(msg.pages.page_crc32c)) if msg.HasField("pages") else None)
    problems = _problems(meta)
    if problems:
        raise CorruptObjectError("ledger metadata", where, "; ".join(problems))
    return meta, msg.index_crc32c


def user_metadata(topic: str, last_ledger: int | None = None) -> dict[str, str]:
    """S3 user metadata for a data or index object. HTTP headers are ASCII, so the topic is percent-encoded.
    `last_ledger`: the largest ledger id an object several ledgers share holds (LAST_LEDGER_KEY)."""
    return {**USER_METADATA, TOPIC_KEY: quote(topic, safe=""),
            **({LAST_LEDGER_KEY: str(last_ledger)} if last_ledger is not None else {})}


def last_ledger_of(md: Mapping[str, str]) -> int | None:
    """The LAST_LEDGER_KEY an object's user metadata carries, or None (absent, or not a ledger id)."""
    value = {k.lower(): v for k, v in md.items()}.get(LAST_LEDGER_KEY, "")
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 18 else None


def check_user_metadata(md: Mapping[str, str], where: str) -> str:
    """Check an object's user metadata names our format version; return the topic it names ('' if none)."""
    lowered = {k.lower(): v for k, v in md.items()}
    version = lowered.get(FORMAT_VERSION_KEY)
    if version != str(FORMAT_VERSION):
        raise CorruptObjectError("object user metadata", where,
                                 f"{FORMAT_VERSION_KEY} is {version!r}, expected {str(FORMAT_VERSION)!r}")
    return unquote(lowered.get(TOPIC_KEY, ""))
