"""One offload attempt of sealed ledgers of one topic: one ledger (offload_ledger in tiering/ops/offload.py) is a
batch of one, a topic's small ledgers a batch of many. One attempt, one data object, one index object, one
conditional transaction to begin and one to commit (tiering/tier2/offloader.py writes the objects).

(1) the attempt's lock (its uuid drawn first, so that the packing starts at once), then one transaction
moves every ledger SEALED (or an OFFLOADING attempt older than the offload timeout) -> OFFLOADING(attempt) and
queues the two keys for GC (not before the offload timeout), or none if any lost a race; (2) the ledgers
stream from tier 1 into the objects: the packing of the first part, the creation of the multipart upload
and its first part go beside (1), and nothing else does (no other part, no completion,
no index PUT: the claim is the upload's gate, tier2/multipart.py), so the keys are queued before either
object exists and a lost claim costs at most one part, aborted; (3) one transaction moves them all to OFFLOADED
with their chunk rows (each pointing inside the shared objects) and dequeues the keys, only while every row
still holds this attempt. A failure deletes the objects (unless the commit landed: a lost reply is not a
failed commit) and returns the ledgers still holding the attempt to SEALED; a process killed anywhere leaves
queued keys for GC (or, killed before (1) committed, only an upload in progress, which GC's sweep of stale
uploads aborts) and OFFLOADING rows a later run takes over at once (the attempt's lock died with its
worker: metadata/attempt_locks.py), or after the offload timeout when the worker may still be alive.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator, Sequence, TypeVar

from tiering.errors import ConditionalUpdateFailed
from tiering.format.keys import data_key, index_key
from tiering.model import Chunk, Ledger, LedgerState
from tiering.ops.context import Deps
from tiering.tier2.objects import delete_keys
from tiering.tier2.offloader import LedgerToUpload, StepHook, packed_bytes, upload_ledgers

# What an operator should see of a swallowed cleanup failure (the exception's type only: messages of
# database drivers may carry connection details).
log = logging.getLogger(__name__)
T = TypeVar("T")


def batches(ledgers: Sequence[Ledger], small_bytes: int, max_bytes: int,
            max_ledgers: int) -> tuple[list[list[Ledger]], list[Ledger]]:
    """Split ledgers into batches (runs of small ones of one topic, within max_bytes and max_ledgers;
    at least two each) and the rest, offloaded one by one."""
    out, alone, run = [], [], []

    def close():
        (out.append(list(run)) if len(run) >= 2 else alone.extend(run))
        run.clear()

    for led in sorted(ledgers, key=lambda x: (x.topic, x.ledger_id)):
        if led.size_bytes >= small_bytes or led.entry_count == 0:
            alone.append(led)
            continue
        if run and (run[0].topic != led.topic or len(run) >= max_ledgers
                    or sum(x.size_bytes for x in run) + led.size_bytes > max_bytes):
            close()
        run.append(led)
    close()
    return out, alone


def offload_batch(deps: Deps, leds: Sequence[Ledger], hook: StepHook = None,
                  before_claim: Callable[[], None] | None = None) -> list[Ledger]:
    """Offload `leds` (one topic) as one attempt; returns them OFFLOADED, in ledger order. Raises
    ConditionalUpdateFailed, changing nothing, if any is not SEALED (or a stale attempt) any more.
    `before_claim` (offload_many's bucket check, under way): must return before the begin transaction runs;
    its exception is the attempt's, with nothing changed."""
    knobs, b = deps.knobs, deps.bucket
    leds = sorted(leds, key=lambda x: x.ledger_id)
    first = leds[0]
    # the attempt's lock, held until it committed or was undone: a worker that dies mid-attempt is known
    # dead at once and its ledgers are taken over without waiting for the offload timeout (attempt_locks.py).
    # Taken by the claim, before its transaction: the packing starts under the fresh uuid at once.
    with deps.meta.attempt_lock() as lock:
        attempt = lock.attempt
        # named after the first ledger, as defrag names merged objects: recovery reads them the same way
        keys = (data_key(b.prefix, first.topic, attempt, first.ledger_id),
                index_key(b.prefix, first.topic, attempt, first.ledger_id))

        def take_lock() -> None:
            if not lock.take():  # a live attempt's uuid hashes alike (one in 2**32): the caller tries again
                raise ConditionalUpdateFailed(f"attempt lock of {attempt}", "free", "held by a live attempt")
        # The begin transaction runs beside the packing of the first part; the upload shows nothing before
        # it committed (the claim is its gate), so (W1) of tiering/ops/gc.py holds: keys queued first.
        claim = _Claim(lambda: deps.meta.begin_offload_batch(leds, attempt, keys, gc_delay=knobs.offload_timeout,
                                                             stale_after=knobs.offload_timeout,
                                                             taken_over_delay=knobs.gc_delay),
                       before_claim, take_lock)
        try:
            uploaded = upload_ledgers(b, topic=first.topic, attempt=attempt, data_key=keys[0], index_key=keys[1],
                                      sources=_sources(deps, leds), block_size=knobs.block_size,
                                      page_size=knobs.page_size, concurrency=knobs.upload_concurrency, hook=hook,
                                      max_bytes_per_second=knobs.max_bytes_per_second, gate=claim,
                                      expected_bytes=sum(packed_bytes(led.size_bytes, led.entry_count)
                                                         for led in leds),
                                      last_ledger=max(led.ledger_id for led in leds) if len(leds) > 1 else None)
            started = claim.result()
            items = [(led, Chunk(keys[0], p.data_offset, p.data_length, keys[1], p.index_offset, p.index_length,
                                 0, led.entry_count - 1, data_etag=uploaded.data_etag, index_etag=uploaded.index_etag))
                     for led, p in zip(started, uploaded.ledgers)]
            return deps.meta.complete_offload_batch(items, attempt)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # interrupted: undone as a killed attempt is (its lock goes with the process: taken over at
                # once), without the requests an undo makes, which a link that stopped answering would hold
                raise
            if claim.may_have_landed():  # else nothing is in metadata and nothing was shown: upload aborted
                _undo(deps, leds, attempt, keys)
            elif isinstance(exc, Exception) and (refused := claim.refusal()) is not exc:
                # the ledgers were never this attempt's: what failed beside the claim (their tier-1 copy gone
                # with a retention or another offload, say) followed from that, and the lost claim is the answer
                raise refused from exc
            raise


def in_background(fn: Callable[[], T], name: str) -> Future[T]:
    """fn() on a thread of its own; its result or exception waits in the Future."""
    pool = ThreadPoolExecutor(1, thread_name_prefix=name)
    try:
        return pool.submit(fn)
    finally:
        pool.shutdown(wait=False)  # the thread ends with fn


class _Claim:
    """The attempt's lock and begin transaction on a thread of its own: the upload's gate (tier2/multipart.py).
    Neither a failed `lock` nor a failed `before` began anything."""

    def __init__(self, begin: Callable[[], list[Ledger]], before: Callable[[], None] | None = None,
                 lock: Callable[[], None] | None = None):
        self._began = False
        self._locked = threading.Event()  # the lock taken, or its taking failed: owned() returns
        self._lock_error: BaseException | None = None

        def run() -> list[Ledger]:
            try:
                if lock is not None:
                    lock()  # beside the bucket's HEAD still in flight
            except BaseException as exc:
                self._lock_error = exc
                raise
            finally:
                self._locked.set()
            if before is not None:
                before()
            self._began = True
            return begin()
        self._future = in_background(run, "offload-begin")

    def check(self) -> None:
        if self._future.done() and self._future.exception() is not None:
            raise self._future.exception()

    def owned(self) -> None:
        self._locked.wait()
        if self._lock_error is not None:  # no lock: no upload
            raise self._lock_error

    def wait(self) -> None:
        self._future.result()

    def result(self) -> list[Ledger]:
        return self._future.result()

    def may_have_landed(self) -> bool:
        """False only when the transaction is known rolled back (a lost compare-and-set) or never ran; waits
        for its end. Any other failure may be a commit whose reply was lost: the undo reads the rows to know."""
        error = self._future.exception()
        return self._began and not isinstance(error, ConditionalUpdateFailed)

    def refusal(self) -> BaseException | None:
        """Why the claim did not land (a lost compare-and-set, or `before`'s failure); waits for its end."""
        return None if self.may_have_landed() else self._future.exception()


def _sources(deps: Deps, leds: Sequence[Ledger]) -> Iterator:
    for led in leds:
        yield from tier1_source(deps, led)


def tier1_source(deps: Deps, led: Ledger) -> Iterator:
    """A sealed ledger's entries from its tier-1 copy, for an upload (an offload, a repair's new copy): only
    from a copy that holds what its row records (Tier1Store.reader_for), each frame checked as it is read."""
    with deps.tier1.reader_for(led) as reader:
        yield (LedgerToUpload(led.ledger_id, led.entry_count, int(led.sealed_at.timestamp() * 1000)),
               reader.iter_framed(0, led.entry_count - 1))


def _undo(deps: Deps, started: Sequence[Ledger], attempt: str, keys: tuple[str, str]) -> None:
    """Nothing if the commit landed (a lost reply) or metadata cannot be read (GC deletes the queued keys
    only if unreferenced); else delete the objects and return the ledgers still holding the attempt to SEALED."""
    try:
        now = [deps.meta.get_ledger(led.topic, led.ledger_id) for led in started]
    except Exception as exc:
        # leave the keys queued; GC deletes them only if unreferenced
        log.warning("offload of %s attempt %s not undone (%s): its objects stay queued for GC", _names(started),
                    attempt, type(exc).__name__)
        return
    if any(n.state == LedgerState.OFFLOADED and n.offload_uuid == attempt for n in now):
        return
    failed = delete_keys(deps.bucket, keys)
    mine = [n for n in now if n.state == LedgerState.OFFLOADING and n.offload_uuid == attempt]
    try:
        deps.meta.abort_offload_batch(mine, attempt, objects_deleted=not failed)
    except Exception as exc:
        # metadata gone: the attempt times out and is taken over
        log.warning("offload of %s attempt %s left OFFLOADING (%s): taken over after the offload timeout",
                    _names(mine), attempt, type(exc).__name__)


def _names(leds: Sequence[Ledger]) -> str:
    """'t/0' or 't/0..t/7' for a log record (the ledgers, not the driver's message)."""
    return f"{leds[0].topic}/{leds[0].ledger_id}" + (f"..{leds[-1].ledger_id}" if len(leds) > 1 else "") \
        if leds else "no ledger"
