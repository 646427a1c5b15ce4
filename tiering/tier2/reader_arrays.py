"""Payloads as Arrow `binary` arrays, for batch reads (ReadHandle.read_batches, the Spark source): a run of
checked pages in one C pass, or gathered (entry id, payload) pairs; no batch's array ever holds 2 GiB or more
(32-bit offsets)."""
from __future__ import annotations

from typing import Iterator

from tiering.format.pages import run_payload_buffers

MAX_ARRAY_BYTES = 2**31 - 1  # payload bytes one Arrow `binary` array holds (32-bit offsets)


def run_payload_array(*args, **kwargs):
    """run_payloads as an Arrow `binary` array (format/pages.run_payload_buffers: the same checks, no Python
    object per entry of equal length); a run whose payloads reach 2 GiB (only a page size that large makes
    one) as a ChunkedArray of such arrays, each within the 32-bit offsets, which `one_array_each` splits."""
    import numpy as np
    import pyarrow as pa  # here, not at import: only batch reads need it

    offsets, values = run_payload_buffers(*args, **kwargs)
    pieces, i, n = [], 0, len(offsets) - 1
    while True:
        # the most entries from i on whose payloads one array holds (at least one: an entry is < 2 GiB)
        j = min(n, max(i + 1, int(np.searchsorted(offsets, offsets[i] + MAX_ARRAY_BYTES, "right")) - 1))
        pieces.append(pa.Array.from_buffers(pa.binary(), j - i, [
            None, pa.py_buffer((offsets[i:j + 1] - offsets[i]).astype(np.int32)),
            pa.py_buffer(values[offsets[i]:offsets[j]])]))
        if j >= n:
            return pieces[0] if len(pieces) == 1 else pa.chunked_array(pieces, pa.binary())
        i = j


def one_array_each(batches: Iterator[tuple[int, object]]) -> Iterator[tuple[int, object]]:
    """The batches with each ChunkedArray (payloads of 2 GiB or more) cut into one batch per chunk: a batch's
    payloads are always one `binary` array."""
    import pyarrow as pa

    for first, payloads in batches:
        if isinstance(payloads, pa.ChunkedArray):
            for chunk in payloads.chunks:
                if len(chunk):
                    yield first, chunk
                    first += len(chunk)
        else:
            yield first, payloads


def array_batches(entries: Iterator[tuple[int, bytes]], max_rows: int = 4096,
                  max_bytes: int = 1024 * 1024) -> Iterator[tuple[int, object]]:
    """(first entry id, Arrow binary array) batches of consecutive (entry id, payload) pairs, each of at most
    `max_rows` entries or about `max_bytes` of payload: ledgers offloaded before page indexes, and the tier-1
    side of a batch read (ReadHandle.read_batches, the Spark source)."""
    import pyarrow as pa

    def gathered():
        first, batch, size = None, [], 0
        for entry_id, payload in entries:
            if first is None:
                first = entry_id
            batch.append(payload)
            size += len(payload)
            if len(batch) >= max_rows or size >= max_bytes:
                yield first, pa.array(batch, pa.binary())  # a ChunkedArray past 2 GiB
                first, batch, size = None, [], 0
        if batch:
            yield first, pa.array(batch, pa.binary())
    return one_array_each(gathered())
