"""Upload several small sealed ledgers of one topic as ONE data object and ONE index object: the layout
defrag writes and readers already read (each ledger's blocks and page index as if alone, placed one after
the other; its chunk row says where). Small ledgers one object pair each cost four requests per ledger on
initiate/part/complete/index; a batch costs a few parts for all of them.

The ledgers' blocks are streamed into parts of at least `part_size` bytes (S3's 5 MiB minimum but for the
last), up to `concurrency` in flight; a batch that fits one part is one PUT. Memory: (concurrency + 1)
parts. On failure the multipart upload is aborted; deleting keys is the caller's (tiering/ops/offload_batch).
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Iterator

from botocore.exceptions import BotoCoreError, ClientError

from tiering.errors import BadInput, TieringError
from tiering.format.block import MIN_BLOCK_SIZE, pack_blocks
from tiering.format.index import IndexEntry, block_pages, encode_index, page_index
from tiering.format.metadata import LedgerOffloadMetadata, encode_metadata, user_metadata
from tiering.tier2.objects import Bucket, tier2_error
from tiering.tier2.offloader import MAX_PARTS, LedgerToUpload, StepHook, _abort, _check_count, _Counting, _upload_part


@dataclass(frozen=True)
class BatchedLedger:
    """Where one ledger of a batch lies in the shared objects."""

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


def upload_batch(b: Bucket, topic: str, data_key: str, index_key: str,
                 sources: Iterator[tuple[LedgerToUpload, Iterable[tuple[int, bytes]]]], block_size: int,
                 page_size: int, concurrency: int, part_size: int, hook: StepHook = None) -> UploadedBatch:
    """`sources` yields each ledger with its entries (consumed before the next is asked for)."""
    if block_size < MIN_BLOCK_SIZE or part_size < MIN_BLOCK_SIZE:
        raise BadInput(f"block and part sizes must be at least S3's 5 MiB minimum part size")
    if concurrency < 1:
        raise BadInput("upload concurrency must be at least 1")
    step = hook or (lambda _name: None)
    md = user_metadata(topic)
    state = {"upload_id": None, "parts": [], "next_part": 1}
    pending, index_body, placed, offset = bytearray(), bytearray(), [], 0
    inflight: deque = deque()
    pool = ThreadPoolExecutor(concurrency, thread_name_prefix="upload-batch")

    def ship() -> None:
        nonlocal pending
        if state["upload_id"] is None:
            state["upload_id"] = b.s3.create_multipart_upload(Bucket=b.name, Key=data_key, Metadata=md,
                                                              ChecksumAlgorithm="CRC32C")["UploadId"]
            step("initiated")
        if state["next_part"] > MAX_PARTS:
            raise BadInput(f"batch needs more than {MAX_PARTS} parts: raise TIERING_BLOCK_SIZE")
        inflight.append(pool.submit(_upload_part, b, data_key, state["upload_id"], state["next_part"],
                                    bytes(pending), step))
        state["next_part"] += 1
        pending = bytearray()
        while len(inflight) >= concurrency:  # bound memory: wait for the oldest part
            state["parts"].append(inflight.popleft().result())

    try:
        for spec, entries in sources:
            counted, start, blocks, pages = _Counting(entries), offset, [], []
            for block in pack_blocks(counted, block_size, page_size):
                blocks.append(IndexEntry.of(block))
                pages += block_pages(block)
                pending += block.data
                offset += block.length
                del block
                if len(pending) >= part_size:
                    ship()
            _check_count(spec, counted)
            if counted.count == 0:
                raise TieringError(f"ledger {spec.topic}/{spec.ledger_id}: no entries to offload")
            meta = LedgerOffloadMetadata(topic=spec.topic, ledger_id=spec.ledger_id, entry_count=counted.count,
                                         length=counted.payload_bytes, sealed_time_ms=spec.sealed_time_ms,
                                         offload_uuid=spec.attempt, data_object_len=offset - start,
                                         block_size=block_size, pages=page_index(pages, page_size))
            index = encode_index(blocks, offset - start, encode_metadata(meta))
            placed.append(BatchedLedger(spec.ledger_id, start, offset - start, len(index_body), len(index),
                                        counted.count, counted.payload_bytes))
            index_body += index
        if not placed:
            raise TieringError("empty batch: nothing to offload")
        if state["upload_id"] is None:  # everything fits one part: one PUT, same bytes
            b.s3.put_object(Bucket=b.name, Key=data_key, Body=bytes(pending), Metadata=md,
                            ChecksumAlgorithm="CRC32C")
            nparts = 1
        else:
            if pending:
                ship()
            while inflight:
                state["parts"].append(inflight.popleft().result())
            b.s3.complete_multipart_upload(Bucket=b.name, Key=data_key, UploadId=state["upload_id"],
                                           MultipartUpload={"Parts": state["parts"]})
            nparts, state["upload_id"] = len(state["parts"]), None
        step("completed")
        b.s3.put_object(Bucket=b.name, Key=index_key, Body=bytes(index_body), Metadata=md, ChecksumAlgorithm="CRC32C")
        step("index")
        return UploadedBatch(data_key, index_key, placed, offset, nparts)
    except BaseException as exc:
        pool.shutdown(wait=True, cancel_futures=True)  # no part may land after the abort
        _abort(b, data_key, state["upload_id"])
        if isinstance(exc, (ClientError, BotoCoreError)):
            raise tier2_error("upload", data_key, exc) from None
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
