"""Write sealed ledgers of one topic to tier 2 in the PIP-17 layout: ONE data object and ONE index object for
any number of ledgers (one ledger is a batch of one). Each ledger's blocks and index are laid out as if alone,
one after the other (the layout defrag writes and readers read); its chunk row says where.

The ledgers' packed blocks stream into `MultipartUpload` (tiering/tier2/multipart.py), which owns the
lifecycle: parts of at least `part_size` bytes (a ledger's blocks are exactly the block size, so with the
default part size one block is one part, but a tail of less than 5 MiB goes with the last full one), up to
`concurrency` in flight, one PUT when everything fits one part, abort on any failure. Memory: (concurrency +
1) parts, 5 MiB and one block whatever the ledgers' sizes.
Deleting the keys on failure (the data object may be complete when the index PUT fails) is the caller's,
which also knows whether metadata references them (tiering/ops/offload_batch.py).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Iterable, Iterator

from tiering.errors import TieringError
from tiering.format.block import DEFAULT_PAGE_SIZE, ENTRY_HEADER_LEN
from tiering.format.index import IndexEntry, block_pages, encode_index, page_index
from tiering.format.metadata import LedgerOffloadMetadata, encode_metadata, user_metadata
from tiering.format.packing import FramedRun, pack_runs
from tiering.tier2.multipart import Gate, MultipartUpload, StepHook, part_size_for
from tiering.tier2 import throttle
from tiering.tier2.objects import Bucket, put_bytes

__all__ = ["LedgerToUpload", "BatchedLedger", "UploadedBatch", "Gate", "StepHook", "packed_bytes", "upload_ledgers"]


@dataclass(frozen=True)
class LedgerToUpload:
    ledger_id: int
    entry_count: int  # what metadata says: tier 1 must hold exactly this many
    sealed_time_ms: int


@dataclass(frozen=True)
class BatchedLedger:
    """Where one ledger lies in the shared objects."""

    ledger_id: int
    data_offset: int
    data_length: int
    index_offset: int
    index_length: int
    entry_count: int
    payload_bytes: int


@dataclass(frozen=True)
class UploadedBatch:
    data_key: str
    index_key: str
    ledgers: list[BatchedLedger]
    data_length: int
    parts: int
    data_etag: str | None = None
    index_etag: str | None = None


def upload_ledgers(b: Bucket, *, topic: str, attempt: str, data_key: str, index_key: str,
                   sources: Iterator[tuple[LedgerToUpload, Iterable[FramedRun]]], block_size: int,
                   concurrency: int, page_size: int = DEFAULT_PAGE_SIZE, part_size: int | None = None,
                   hook: StepHook = None, max_bytes_per_second: int = 0, gate: Gate | None = None,
                   expected_bytes: int = 0, last_ledger: int | None = None) -> UploadedBatch:
    """Upload the ledgers `sources` yields, each with its entries as framed runs (tier 1's `iter_framed`, or
    `frame_entries` of (entry_id, payload) pairs), consumed before the next ledger is asked for.
    Steps for the hook: the upload's ("initiated", "part", "completed"), then "index". The data object's
    bytes are paced by the process's limiter for `max_bytes_per_second` (0: none; tier2/throttle.py).
    `gate`: the caller's claim on the keys, still being decided (tier2/multipart.py): neither object
    becomes visible before it opens. `expected_bytes` (the ledgers' bytes as packed, `packed_bytes`, a hint):
    at least a part creates the multipart upload at once, beside the packing of the first part; an object
    that would need more than half of S3's parts gets larger blocks (`part_size_for`). `last_ledger`: the
    largest id of a batch's ledgers, carried by both objects (format/metadata.py LAST_LEDGER_KEY)."""
    step = hook or (lambda _name: None)
    md = user_metadata(topic, last_ledger)
    index_body, placed = bytearray(), []
    block_size = part_size_for(block_size, expected_bytes)
    part_size = part_size or block_size
    with MultipartUpload(b, key=data_key, metadata=md, op="upload", part_size=part_size, concurrency=concurrency,
                         hook=step, limiter=throttle.shared(max_bytes_per_second), gate=gate,
                         expected_size=expected_bytes) as up:
        if expected_bytes >= part_size:
            up.start()
        for spec, entries in sources:
            counted, start, blocks, pages = _Counting(entries), up.size, [], []
            for block in pack_runs(counted, block_size, page_size):
                blocks.append(IndexEntry.of(block))
                pages += block_pages(block)
                up.write(block.data)
                del block  # the block's bytes live in the upload only (memory bound)
            if counted.count != spec.entry_count:
                raise TieringError(f"ledger {topic}/{spec.ledger_id}: tier 1 holds {counted.count} entries, "
                                   f"metadata says {spec.entry_count}")
            if counted.count == 0:
                raise TieringError(f"ledger {topic}/{spec.ledger_id}: no entries to offload")
            length = up.size - start
            meta = LedgerOffloadMetadata(topic=topic, ledger_id=spec.ledger_id, entry_count=counted.count,
                                         length=counted.payload_bytes, sealed_time_ms=spec.sealed_time_ms,
                                         offload_uuid=attempt, data_object_len=length, block_size=block_size,
                                         pages=page_index(pages, page_size))
            index = encode_index(blocks, length, encode_metadata(meta))
            placed.append(BatchedLedger(spec.ledger_id, start, length, len(index_body), len(index), counted.count,
                                        counted.payload_bytes))
            index_body += index
        if not placed:
            raise TieringError("empty batch: nothing to offload")
        body = bytes(index_body)
        if not up.multipart:  # one PUT of the data: nothing in flight to go beside
            data_length = up.finish()
            index_etag = _put_index(b, index_key, body, md, gate)
        else:  # the index is complete once the last block is written: its PUT goes beside the parts in flight,
            # and is over (landed or failed) before this function returns or raises
            with ThreadPoolExecutor(1, thread_name_prefix="upload-index") as pool:
                index_put = pool.submit(_put_index, b, index_key, body, md, gate)
                try:
                    data_length = up.finish()
                finally:
                    wait([index_put])
                index_etag = index_put.result()
    step("index")
    return UploadedBatch(data_key, index_key, placed, data_length, up.parts, up.etag, index_etag)


def packed_bytes(payload_bytes: int, entry_count: int) -> int:
    """About what ledgers of these totals take in a data object: payloads and their 12-byte entry headers (a
    block's header and padding aside)."""
    return payload_bytes + ENTRY_HEADER_LEN * entry_count


def _put_index(b: Bucket, key: str, body: bytes, md: dict[str, str], gate: Gate | None) -> str | None:
    if gate is not None:
        gate.wait()  # a complete object: only once the caller's claim queued the key
    return put_bytes(b, key, body, md)


class _Counting:
    """Counts the entries and payload bytes flowing through to the packer."""

    def __init__(self, runs: Iterable[FramedRun]):
        self._it = iter(runs)
        self.count = 0
        self.payload_bytes = 0

    def __iter__(self):
        for run in self._it:
            n = len(run.ends)
            self.count += n
            self.payload_bytes += (int(run.ends[-1]) if n else 0) - ENTRY_HEADER_LEN * n
            yield run
