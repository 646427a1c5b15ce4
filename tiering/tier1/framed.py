"""A ledger file's entries as framed runs for the block packer (tiering/format/packing.py).

A tier-1 frame is [u32 len][i64 entry_id][u32 crc][payload] and a PIP-17 entry is [i32 len][i64 entry_id]
[payload]: the same bytes without the CRC field, and the CRC covers exactly those bytes. So a run of frames is
read with one pread, checked with numpy over the frames' offsets (ids in sequence, each frame ending where the
next one starts), the CRC fields cut out by one join, and each entry's CRC checked over its bytes in the run:
no Python object per entry but the slices the join takes. The offsets come from the sealed file's footer index
(read a slice at a time) or an open file's scan, so the index is checked by every whole read of a sealed file.

Anything the fast path finds wrong is read again, entry by entry, by the reader's checked stream, which yields
the entries before the damage and raises the error that names it (one wording for both paths).
"""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from tiering.format.packing import FramedRun, frame_entries
from tiering.tier1 import frames as F

__all__ = ["runs"]

_HEADER_COLUMNS = np.arange(F.FRAME.size)


def runs(fd: int, path, first: int, last: int, bounds: Callable[[int, int], np.ndarray], start: int, end: int,
         checked: Callable[[int, int], Iterator[tuple[int, bytes]]],
         run_bytes: int | None = None) -> Iterator[FramedRun]:
    """Entries first..last as framed runs of about `run_bytes` (a frame larger than that is a run of its own).
    `bounds(i, n)`: the file offsets of frames i..i+n (n + 1 values; the one past the last frame is the end of
    the frames). `start`, `end`: where the frames lie. `checked(i, j)`: the reader's per-entry stream of
    entries i..j, every frame checked, for the fast path's failures."""
    run_bytes = run_bytes or F.CHUNK
    i = first
    while i <= last:
        offs = bounds(i, min(F.INDEX_SLICE, last + 1 - i))
        top = i + len(offs) - 1  # the slice covers entries i..top-1
        # each offset within the frames before any difference is taken (int64 differences of wild values wrap)
        sizes = None if ((offs < start) | (offs > end)).any() else np.diff(offs)
        if sizes is None or (i == 0 and offs[0] != start) or (sizes < F.FRAME.size).any():
            yield from _slow(checked, i, last, path)
            return
        base = 0  # index in offs of entry i
        while i < top:
            j = int(np.searchsorted(offs, offs[base] + run_bytes, side="right")) - 1  # in offs' indices
            j = min(max(j, base + 1), len(offs) - 1)
            run = _fast(fd, path, i, offs[base:j + 1], sizes[base:j], run_bytes)
            if run is None:
                yield from _slow(checked, i, last, path)
                return
            yield run
            i += j - base
            base = j


def _fast(fd: int, path, first: int, offs: np.ndarray, sizes: np.ndarray, run_bytes: int) -> FramedRun | None:
    """Frames at offs[:-1] (each ending at the next offset) as one run, or None if any check fails."""
    a, b, n = int(offs[0]), int(offs[-1]), len(sizes)
    if b - a > run_bytes:  # one frame larger than a run: its header first, so a wrong index costs no large read
        length, entry_id = F.FRAME.unpack(F.pread_exact(fd, F.FRAME.size, a, path))[:2]
        if length + F.FRAME.size != b - a or entry_id != first:
            return None
    raw = F.pread_exact(fd, b - a, a, path)
    rel = offs - a
    heads = np.frombuffer(raw, np.uint8)[rel[:-1, None] + _HEADER_COLUMNS]  # [len][entry id][crc] per frame
    lens = heads[:, 0:4].copy().view(">u4").ravel().astype(np.int64)
    ids = heads[:, 4:12].copy().view(">i8").ravel()
    if not ((lens + F.FRAME.size == sizes).all() and (ids == np.arange(first, first + n)).all()
            and (lens <= F.MAX_PAYLOAD).all()):
        return None
    crcs = heads[:, 12:16].copy().view(">u4").ravel()
    view = memoryview(raw)
    # the first frame's len and id, then each payload with the next frame's len and id (the last slice stops
    # at the end of raw): the CRC fields left out
    data = b"".join([view[0:12], *(view[x:y] for x, y in zip((rel[:-1] + F.FRAME.size).tolist(),
                                                             (rel[1:] + 12).tolist()))])
    del view, raw
    ends = np.cumsum(lens + 12)
    data_view, crc32 = memoryview(data), F.crc32
    for x, y, crc in zip((ends - lens - 12).tolist(), ends.tolist(), crcs.tolist()):
        if crc32(data_view[x:y]) != crc:
            return None
    return FramedRun(first, data, ends)


def _slow(checked, first: int, last: int, path) -> Iterator[FramedRun]:
    """Entries first..last read again one by one: the good ones as runs, then the checked stream's error. To
    the range's end, not the slice's: the stream checks each index entry as it reaches its frame, the one
    after a slice included (a stream ending at a wrong one would blame an intact entry instead)."""
    error: Exception | None = None

    def good() -> Iterator[tuple[int, bytes]]:
        nonlocal error
        try:
            yield from checked(first, last)
        except Exception as exc:  # raised once the entries before it are out
            error = exc

    yield from frame_entries(good())
    if error is not None:
        raise error
    raise F.corrupt(path, 0, f"entries {first}..{last}: the frames disagree with the offsets recorded for them")
