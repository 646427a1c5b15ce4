"""The one cross-tier read of a ledger range (tiering.read.read_ledger_range), which ReadHandle and the Spark
source share: tier 1 first, then tier 2 from the next entry; a chunk row that fails to read is re-read once
and the read goes on with the new row; a corrupt page is never read around; a ledger trimmed meanwhile ends
in a TRIMMED gap, one no tier holds in a DATALOSS gap."""
from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest

from tiering.errors import CorruptObjectError, LedgerStorageError
from tiering.model import LedgerState as S, Position
from tiering.read import DATALOSS, TIER1, TIER2, TRIMMED, Gap, Run, read_ledger_range

LED = SimpleNamespace(topic="t", ledger_id=7, tier1_present=False, state=S.OFFLOADED, lost_at=None)


class Meta:
    """The ledger's current row and chunk, as the metadata store would return them."""

    def __init__(self, state, chunk):
        self.state, self.chunk, self.reads = state, chunk, 0

    def get_ledger(self, topic, ledger_id):
        self.reads += 1
        return SimpleNamespace(topic=topic, ledger_id=ledger_id, state=self.state)

    def get_chunk(self, led):
        return self.chunk


class Tier2:
    """Chunk name -> entries it serves, then an exception (a collected object, a corrupt page) if given."""

    def __init__(self, objects):
        self.objects, self.opened = objects, []

    def __call__(self, led, chunk):
        self.opened.append(chunk)
        served, fails = self.objects[chunk]

        class Ledger:
            def iter_entries(self, first, last):
                for e in range(first, last + 1):
                    if fails is not None and e >= served:
                        raise fails
                    yield e, b"%d@%s" % (e, chunk.encode())

            def iter_batches(self, first, last, arrays=False):  # pages of two entries, as OffloadedLedger's
                batch = []
                for e, data in self.iter_entries(first, last):
                    batch.append(data)
                    if len(batch) == 2:
                        yield e - 1, pa.array(batch, pa.binary()) if arrays else batch
                        batch = []
                if batch:
                    yield last, pa.array(batch, pa.binary()) if arrays else batch
        return Ledger()


def flat(items):
    """Runs as (tier, entry_id, data) rows, gaps as they are, in order (each run read before the next item)."""
    out = []
    for got in items:
        if isinstance(got, Run):
            out += [(got.tier, e, d) for e, d in got.entries]
        else:
            out.append(got)
    return out


def test_a_stale_held_chunk_is_re_read_once_and_the_read_goes_on_from_the_next_entry():
    tier2 = Tier2({"old": (2, FileNotFoundError("collected")), "new": (10, None)})
    got = flat(read_ledger_range(Meta(S.OFFLOADED, "new"), LED, 0, 3, None, tier2, lambda: "old"))
    assert got == [(TIER2, 0, b"0@old"), (TIER2, 1, b"1@old"), (TIER2, 2, b"2@new"), (TIER2, 3, b"3@new")]
    assert tier2.opened == ["old", "new"]


def test_arrays_go_on_from_the_next_entry_after_a_stale_chunk_as_lists_do():
    tier2 = Tier2({"old": (3, FileNotFoundError("collected")), "new": (10, None)})
    runs = list(read_ledger_range(Meta(S.OFFLOADED, "new"), LED, 0, 4, None, tier2, lambda: "old", arrays=True))
    batches = [(first, payloads.to_pylist()) for run in runs for first, payloads in run.batches]
    assert batches == [(0, [b"0@old", b"1@old"]), (2, [b"2@new", b"3@new"]), (4, [b"4@new"])]


def test_a_failure_the_current_row_does_not_explain_is_raised():
    tier2 = Tier2({"same": (1, OSError("network"))})
    with pytest.raises(OSError, match="network"):
        flat(read_ledger_range(Meta(S.OFFLOADED, "same"), LED, 0, 3, None, tier2, lambda: "same"))


def test_a_corrupt_page_is_never_read_around():
    meta = Meta(S.OFFLOADED, "new")
    tier2 = Tier2({"old": (1, CorruptObjectError("page", "object old", "CRC32C mismatch")), "new": (10, None)})
    with pytest.raises(CorruptObjectError):
        flat(read_ledger_range(meta, LED, 0, 3, None, tier2, lambda: "old"))
    assert meta.reads == 0 and tier2.opened == ["old"]


def test_a_ledger_trimmed_during_the_read_ends_in_a_trimmed_gap():
    tier2 = Tier2({"old": (2, FileNotFoundError("collected"))})
    got = flat(read_ledger_range(Meta(S.DELETED, None), LED, 0, 3, None, tier2, lambda: "old"))
    assert got == [(TIER2, 0, b"0@old"), (TIER2, 1, b"1@old"), Gap(TRIMMED, Position(7, 2), Position(7, 3))]


def test_tier1_first_then_tier2_from_the_next_entry():
    class Reader:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def iter_entries(self, first, last):  # the copy was cut short: entries 0..1 only
            yield from ((e, b"t1") for e in range(first, min(last, 1) + 1))

    tier1 = SimpleNamespace(reader_for=lambda led: Reader())
    led = SimpleNamespace(**{**vars(LED), "tier1_present": True})
    got = flat(read_ledger_range(Meta(S.OFFLOADED, "c"), led, 0, 3, tier1, Tier2({"c": (10, None)}), lambda: None))
    assert got == [(TIER1, 0, b"t1"), (TIER1, 1, b"t1"), (TIER2, 2, b"2@c"), (TIER2, 3, b"3@c")]


def test_a_ledger_no_tier_holds_is_a_dataloss_gap():
    def gone(led):
        raise LedgerStorageError("deleted")

    led = SimpleNamespace(**{**vars(LED), "tier1_present": True})
    got = flat(read_ledger_range(Meta(S.SEALED, None), led, 1, 3, SimpleNamespace(reader_for=gone), Tier2({}),
                                 lambda: None))
    assert got == [Gap(DATALOSS, Position(7, 1), Position(7, 3))]


def test_a_ledger_marked_lost_is_a_dataloss_gap_without_a_request():
    """`tiering repair` found no good copy: the gap comes at once, neither tier asked."""
    def never(*_args):
        raise AssertionError("a lost ledger was read")
    led = SimpleNamespace(**{**vars(LED), "lost_at": "2026-11-25", "tier1_present": True})
    got = flat(read_ledger_range(Meta(S.OFFLOADED, "new"), led, 2, 5, SimpleNamespace(reader_for=never), never,
                                 never))
    assert got == [Gap(DATALOSS, Position(7, 2), Position(7, 5))]
