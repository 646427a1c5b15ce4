"""Stream one sealed ledger into tier 2 in the PIP-17 layout: a multipart data object whose parts are the
packed blocks, uploaded in parallel with bounded concurrency, then the index object. A ledger that fits in
one block is one PUT (the same bytes; half the requests for small ledgers).

Memory stays within (concurrency + 1) x block size whatever the ledger's size. Every part carries a CRC32C
checksum, which AWS S3 verifies; other servers may ignore it (Ceph RGW 16 accepts a wrong one), so the
server is not what guarantees integrity. A failure aborts the multipart upload; deleting the keys (the data
object may be complete when the index PUT fails) is the caller's, which also knows whether metadata
references them (tiering/ops/offload.py).
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from botocore.exceptions import BotoCoreError, ClientError

from tiering.errors import BadInput, TieringError
from tiering.format.block import DEFAULT_PAGE_SIZE, MIN_BLOCK_SIZE, pack_blocks
from tiering.format.index import IndexEntry, block_pages, encode_index, page_index
from tiering.format.metadata import LedgerOffloadMetadata, encode_metadata, user_metadata
from tiering.tier2.objects import Bucket, completed_part, tier2_error

MAX_PARTS = 10_000  # S3's limit on parts of one multipart upload


@dataclass(frozen=True)
class LedgerToUpload:
    topic: str
    ledger_id: int
    entry_count: int
    sealed_time_ms: int
    attempt: str
    data_key: str
    index_key: str


@dataclass(frozen=True)
class UploadedLedger:
    data_key: str
    index_key: str
    data_length: int
    index_length: int
    entry_count: int
    payload_bytes: int
    parts: int


# A hook called at named steps ("initiated", "part", "completed", "index") so fault tests can fail or
# kill the process exactly there; None in production.
StepHook = Callable[[str], None] | None


def upload_ledger(b: Bucket, ledger: LedgerToUpload, entries: Iterable[tuple[int, bytes]], block_size: int,
                  concurrency: int, hook: StepHook = None, page_size: int = DEFAULT_PAGE_SIZE) -> UploadedLedger:
    if block_size < MIN_BLOCK_SIZE:
        raise BadInput(f"block size {block_size} is below S3's 5 MiB minimum part size")
    if concurrency < 1:
        raise BadInput("upload concurrency must be at least 1")
    step = hook or (lambda _name: None)
    md = user_metadata(ledger.topic)
    counted = _Counting(entries)
    upload_id = None
    try:
        blocks = pack_blocks(counted, block_size, page_size)
        first = next(blocks, None)
        second = next(blocks, None) if first is not None else None
        if second is None:
            # The whole ledger is one block: one PUT instead of initiate + part + complete (s3transfer's
            # multipart threshold habit); the object's bytes are the same.
            _check_count(ledger, counted)
            if first is None:
                raise TieringError(f"ledger {ledger.topic}/{ledger.ledger_id}: no entries to offload")
            b.s3.put_object(Bucket=b.name, Key=ledger.data_key, Body=first.data, Metadata=md,
                            ChecksumAlgorithm="CRC32C")
            index_entries, data_length, nparts = [IndexEntry.of(first)], first.length, 1
            pages = block_pages(first)
        else:
            upload_id = b.s3.create_multipart_upload(Bucket=b.name, Key=ledger.data_key, Metadata=md,
                                                     ChecksumAlgorithm="CRC32C")["UploadId"]
            step("initiated")
            head = [first, second]
            del first, second  # the parts' bytes must live in the upload futures only (memory bound)
            parts, index_entries, pages, data_length = _upload_parts(b, ledger, upload_id, _drain(head, blocks),
                                                              concurrency, step)
            _check_count(ledger, counted)
            b.s3.complete_multipart_upload(Bucket=b.name, Key=ledger.data_key, UploadId=upload_id,
                                           MultipartUpload={"Parts": parts})
            upload_id, nparts = None, len(parts)
        step("completed")
        meta = LedgerOffloadMetadata(topic=ledger.topic, ledger_id=ledger.ledger_id, entry_count=counted.count,
                                     length=counted.payload_bytes, sealed_time_ms=ledger.sealed_time_ms,
                                     offload_uuid=ledger.attempt, data_object_len=data_length,
                                     block_size=block_size, pages=page_index(pages, page_size))
        index = encode_index(index_entries, data_length, encode_metadata(meta))
        b.s3.put_object(Bucket=b.name, Key=ledger.index_key, Body=index, Metadata=md, ChecksumAlgorithm="CRC32C")
        step("index")
        return UploadedLedger(ledger.data_key, ledger.index_key, data_length, len(index), counted.count,
                              counted.payload_bytes, nparts)
    except BaseException as exc:
        _abort(b, ledger.data_key, upload_id)
        if isinstance(exc, (ClientError, BotoCoreError)):
            raise tier2_error("upload", ledger.data_key, exc) from None
        raise


def _upload_parts(b: Bucket, ledger: LedgerToUpload, upload_id: str, blocks, concurrency: int, step):
    """Upload blocks as parts, at most `concurrency` in flight (memory: that many blocks plus one)."""
    parts, index_entries, pages, data_length = [], [], [], 0
    with ThreadPoolExecutor(concurrency, thread_name_prefix="upload-part") as pool:
        inflight: deque = deque()
        for block in blocks:
            if block.part_id > MAX_PARTS:
                raise BadInput(f"ledger needs more than {MAX_PARTS} parts: raise TIERING_BLOCK_SIZE")
            index_entries.append(IndexEntry.of(block))
            pages += block_pages(block)
            data_length += block.length
            inflight.append(pool.submit(_upload_part, b, ledger.data_key, upload_id, block.part_id,
                                        block.data, step))
            del block  # the part's bytes live in the future only
            while len(inflight) >= concurrency:  # bound memory: wait for the oldest part
                parts.append(inflight.popleft().result())
        while inflight:
            parts.append(inflight.popleft().result())
    return parts, index_entries, pages, data_length


def _drain(head: list, rest: Iterator):
    """`head` then `rest`, letting go of each head item as it is handed out."""
    while head:
        yield head.pop(0)
    yield from rest


def _check_count(ledger: LedgerToUpload, counted: "_Counting") -> None:
    if counted.count != ledger.entry_count:
        raise TieringError(f"ledger {ledger.topic}/{ledger.ledger_id}: tier 1 holds {counted.count} entries, "
                           f"metadata says {ledger.entry_count}")


def _upload_part(b: Bucket, key: str, upload_id: str, part_id: int, data: bytes, step) -> dict:
    resp = b.s3.upload_part(Bucket=b.name, Key=key, UploadId=upload_id, PartNumber=part_id, Body=data,
                            ChecksumAlgorithm="CRC32C")
    step("part")
    return completed_part(part_id, resp)


def _abort(b: Bucket, key: str, upload_id: str | None) -> None:
    """Best effort; an upload that cannot be aborted now is found by GC (its key is queued)."""
    if upload_id is not None:
        try:
            b.s3.abort_multipart_upload(Bucket=b.name, Key=key, UploadId=upload_id)
        except (ClientError, BotoCoreError):
            pass


class _Counting:
    """Counts the entries and payload bytes flowing through to the packer."""

    def __init__(self, entries: Iterable[tuple[int, bytes]]):
        self._it = iter(entries)
        self.count = 0
        self.payload_bytes = 0

    def __iter__(self):
        for entry_id, payload in self._it:
            self.count += 1
            self.payload_bytes += len(payload)
            yield entry_id, payload
