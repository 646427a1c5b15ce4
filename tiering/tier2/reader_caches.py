"""The tier-2 reader's caches, shared by every ledger one opener reads: decoded index objects (LRU, keyed by
the index's range so merged objects work too) and a bounded map of entry checkpoints (Pulsar's offset cache
was unbounded)."""
from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from dataclasses import dataclass

from tiering.errors import CorruptObjectError
from tiering.format.index import OffloadIndex, decode_index
from tiering.model import Chunk
from tiering.tier2.objects import Bucket, get_range


def index_range(ch: Chunk) -> tuple[str, int, int]:
    """Where a chunk's index lies: (object key, offset, length), the cache's key (merged objects hold several)."""
    return ch.index_key, ch.index_offset, ch.index_length


class IndexCache:
    """LRU of decoded index objects, keyed by (key, offset, length) so merged objects work too."""

    def __init__(self, capacity: int = 1024):
        self.capacity = capacity
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.fetches = 0

    def __contains__(self, ch: Chunk) -> bool:
        with self._lock:
            return index_range(ch) in self._items

    def get(self, b: Bucket, ch: Chunk) -> OffloadIndex:
        key = index_range(ch)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        data = get_range(b, ch.index_key, ch.index_offset, ch.index_length)
        return self._put(key, decode_index(data, f"index object {ch.index_key} at {ch.index_offset}"))

    def prefetch(self, b: Bucket, chunks: list[Chunk]) -> None:
        """Fetch the indexes of chunks lying back to back in one index object (ledgers offloaded together) in
        one GET. Best effort: an index that fails to arrive or to decode is left out, and `get` then fetches
        it alone and raises its own error."""
        first, last = chunks[0], chunks[-1]
        try:
            data = memoryview(get_range(b, first.index_key, first.index_offset,
                                        last.index_offset + last.index_length - first.index_offset))
        except Exception:  # noqa: BLE001 - each index's own GET reports it
            return
        for ch in chunks:
            at = ch.index_offset - first.index_offset
            try:
                index = decode_index(data[at:at + ch.index_length], f"index object {ch.index_key} at {ch.index_offset}")
            except CorruptObjectError:
                continue
            self._put(index_range(ch), index)

    def _put(self, key: tuple, index: OffloadIndex) -> OffloadIndex:
        with self._lock:
            self.fetches += 1
            self._items[key] = index
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        return index


class OffsetCache:
    """Bounded map of entry checkpoints: (data key, block offset) -> sorted [(entry id, offset)].

    Sequential scans record every CHECKPOINT_STRIDE-th entry; the budget caps the total checkpoints kept
    (evicting least recently used blocks), which is what Pulsar's unbounded cache lacked (#22679)."""

    def __init__(self, max_checkpoints: int = 1_000_000):
        self.max_checkpoints = max_checkpoints
        self._blocks: OrderedDict = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def floor(self, block: tuple, entry_id: int) -> tuple[int, int] | None:
        with self._lock:
            points = self._blocks.get(block)
            if not points:
                return None
            self._blocks.move_to_end(block)
            i = bisect.bisect_right(points, (entry_id, float("inf"))) - 1
            return points[i] if i >= 0 else None

    def add(self, block: tuple, entry_id: int, offset: int) -> None:
        with self._lock:
            points = self._blocks.setdefault(block, [])
            self._blocks.move_to_end(block)
            i = bisect.bisect_left(points, (entry_id, offset))
            if i < len(points) and points[i][0] == entry_id:
                return
            points.insert(i, (entry_id, offset))
            self._size += 1
            while self._size > self.max_checkpoints and len(self._blocks) > 1:
                _, evicted = self._blocks.popitem(last=False)
                self._size -= len(evicted)

    def __len__(self) -> int:
        return self._size


@dataclass
class ReaderCaches:
    index: IndexCache
    offsets: OffsetCache

    @classmethod
    def new(cls) -> "ReaderCaches":
        return cls(IndexCache(), OffsetCache())
