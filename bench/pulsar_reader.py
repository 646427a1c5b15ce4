"""The peer for reads: Apache Pulsar's offloaded-ledger reader (BlobStoreBackedReadHandleImpl and
BackedInputStreamImpl) in miniature, over the same objects and the same client as ours.
"""
from __future__ import annotations

from tiering.format.block import HEADER_LEN, Entry as BlockEntry, NeedMore, read_entry_at
from tiering.format.index import decode_index
from tiering.tier2.objects import Bucket, get_range

MIB = 1024 * 1024
PULSAR_BUFFER = 1 * MIB  # Pulsar's managedLedgerOffloadReadBufferSizeInBytes default


class PulsarStyleReader:
    """Pulsar's BlobStoreBackedReadHandleImpl + BackedInputStreamImpl in miniature: the index is fetched once
    per reader; the data object is read through ONE buffer of 1 MiB, refilled by one ranged GET at a time
    (min(1 MiB, bytes left in the object), not aligned to blocks) only when a read needs bytes it lacks; no
    read-ahead and no offset cache: a read seeks to the first entry of its entry's block (the index's data
    offset + 128) and scans from there; at a block's padding it seeks to the next block's first entry."""

    def __init__(self, b: Bucket, ch, buffer_size: int = PULSAR_BUFFER):
        self.b, self.ch, self.buffer_size = b, ch, buffer_size
        self.requests = 0
        self._index = None
        self.buf = bytearray()
        self.base = 0  # object offset of buf[0]

    def index(self):
        if self._index is None:
            self._index = decode_index(get_range(self.b, self.ch.index_key, self.ch.index_offset,
                                                 self.ch.index_length))
            self.requests += 1
        return self._index

    def _seek(self, pos: int) -> None:
        if not self.base <= pos <= self.base + len(self.buf):
            self.buf, self.base = bytearray(), pos  # outside the buffer: drop it (Pulsar's seek)

    def _fill(self, pos: int) -> None:
        """Keep the bytes from pos on, then one ranged GET of up to 1 MiB after them."""
        del self.buf[:pos - self.base]
        self.base = pos
        start = self.base + len(self.buf)
        end = self.ch.data_offset + self.ch.data_length
        n = min(self.buffer_size, end - start)
        if n <= 0:
            raise EOFError(f"{self.ch.data_key}: read past the end at {start}")
        self.buf += get_range(self.b, self.ch.data_key, start, n)
        self.requests += 1

    def iter_entries(self, first: int, last: int):
        index = self.index()
        i = index.find(first)
        expected = index.entries[i].first_entry_id
        pos = self.ch.data_offset + index.entries[i].block_offset + HEADER_LEN
        block_end = pos - HEADER_LEN + index.block_length(i)
        self._seek(pos)
        while expected <= last:
            got = read_entry_at(self.buf, pos - self.base, block_end=block_end - self.base)
            if isinstance(got, NeedMore):
                self._fill(pos)
                continue
            if not isinstance(got, BlockEntry):  # padding or the block's end: on to the next block
                i += 1
                pos = self.ch.data_offset + index.entries[i].block_offset + HEADER_LEN
                block_end = pos - HEADER_LEN + index.block_length(i)
                self._seek(pos)
                continue
            if got.entry_id != expected:
                raise AssertionError(f"entry {got.entry_id}, expected {expected}")
            if expected >= first:
                yield expected, bytes(got.payload)
            pos = self.base + got.end
            expected += 1
