"""Upload rate limit of one process (TIERING_OFFLOAD_MAX_BYTES_PER_SECOND): offload must not flood the link
(Pulsar PIP-211, Kafka KIP-956).

A virtual-clock limiter (GCRA, the token bucket without a timer) that paces START times: each `acquire(n)`
reserves the next n/rate seconds of the link and sleeps until its reservation BEGINS, then the caller sends
at link speed. So a request's own sending time counts towards its share: the rate is min(limit, link), not
the harmonic mix of the two that waiting for a reservation's END gave (32 MiB under 8 MiB/s on a ~9 MiB/s
link took 7.6 s, 0.53 of the limit). The bytes started by time t are at most rate * (t - t0) + burst + the
request being started: the limit holds on average over any window longer than one request's share, and a
burst is at most one part or single PUT (TIERING_BLOCK_SIZE; smaller blocks make it smoother). A request
larger than the burst is not refused.

Pacing inside a request (a body whose reads wait for their bytes) would bound the burst to one socket write,
but over http botocore's SigV4 signer reads the whole body first to hash it, so the body would be paid for
twice (measured: 128 MiB under 8 MiB/s took 33 s instead of 16).

Thread-safe: an upload's part threads share one limiter, and every upload of the process shares the one
`shared(rate)` returns, so concurrent offloads in one process stay under the limit together. Clock and
sleep are injectable: tests drive it with a fake clock, never with timed sleeps.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from tiering.errors import BadInput


class RateLimiter:
    def __init__(self, bytes_per_second: int, *, burst_bytes: int = 0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        if bytes_per_second <= 0:
            raise BadInput("a rate limit must be a positive number of bytes per second")
        self.rate = bytes_per_second
        self._burst = burst_bytes / bytes_per_second  # seconds of credit an idle link accumulates
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._tat: float | None = None  # theoretical arrival time: when the reservations made so far end

    def acquire(self, nbytes: int) -> float:
        """Reserve `nbytes` of the link and wait until the reservation begins; returns the seconds waited."""
        if nbytes <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            start = now - self._burst if self._tat is None else max(self._tat, now - self._burst)
            self._tat = start + nbytes / self.rate
            wait = start - now
        if wait > 0:
            self._sleep(wait)
            return wait
        return 0.0


_shared: dict[int, RateLimiter] = {}
_shared_lock = threading.Lock()


def shared(bytes_per_second: int) -> RateLimiter | None:
    """The process's limiter for this rate (None: unlimited). One per rate, so every upload of a process
    with the same setting draws from one budget."""
    if bytes_per_second <= 0:
        return None
    with _shared_lock:
        limiter = _shared.get(bytes_per_second)
        if limiter is None:
            limiter = _shared[bytes_per_second] = RateLimiter(bytes_per_second)
        return limiter


def split(bytes_per_second: int, tasks: int) -> int:
    """One task's share of a job-wide limit run by `tasks` tasks at once (at least 1 byte/s; 0: unlimited)."""
    if bytes_per_second <= 0:
        return 0
    return max(1, bytes_per_second // max(1, tasks))
