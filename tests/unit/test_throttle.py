"""The offload rate limiter (tiering/tier2/throttle.py) on an injected clock: no test sleeps."""
from __future__ import annotations

import threading

import pytest

from tiering.errors import BadInput
from tiering.tier2 import throttle
from tiering.tier2.throttle import RateLimiter

MIB = 1024 * 1024


class FakeClock:
    """time.monotonic and time.sleep of a world where sleeping advances the clock exactly."""

    def __init__(self, t: float = 1000.0):
        self.t = t
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def limiter(rate: int, clock: FakeClock, burst: int = 0) -> RateLimiter:
    return RateLimiter(rate, burst_bytes=burst, clock=clock, sleep=clock.sleep)


def test_64_mib_at_8_mib_per_second_starts_its_last_part_one_share_before_8_seconds_whatever_the_part_size():
    """Start times are paced: the first part starts at once, each next one share (its size / rate) after the
    previous one started, so with sending time counted the whole takes 8 s on any link at least as fast."""
    for part in (5 * MIB, 8 * MIB, 64 * MIB):
        clock = FakeClock()
        lim, start, sent, last = limiter(8 * MIB, clock), clock.t, 0, 0
        while sent < 64 * MIB:
            last = n = min(part, 64 * MIB - sent)
            lim.acquire(n)
            sent += n
        assert clock.t - start == pytest.approx((64 * MIB - last) / (8 * MIB))


def test_sending_time_counts_towards_the_share():
    """A link slower than the limit: each part takes longer to send than its share, so no part waits at
    all and the rate is the link's (waiting for a reservation's end made it the harmonic mix of both)."""
    clock = FakeClock()
    lim, start = limiter(1000, clock), clock.t
    for _ in range(5):
        assert lim.acquire(1000) == 0.0
        clock.t += 1.25  # the link sends 1000 bytes in 1.25 s: 800 B/s, below the limit
    assert clock.t - start == pytest.approx(5 * 1.25)


def test_a_link_faster_than_the_limit_runs_at_the_limit():
    clock = FakeClock()
    lim, start = limiter(1000, clock), clock.t
    waits = []
    for _ in range(5):
        waits.append(lim.acquire(1000))
        clock.t += 0.25  # sent at 4000 B/s
    assert waits == [0.0] + [pytest.approx(0.75)] * 4
    assert clock.t - start == pytest.approx(4 + 0.25)  # 5000 bytes: 4 shares, then the last part's sending


def test_bytes_started_never_exceed_rate_times_elapsed_plus_burst_plus_the_request():
    clock = FakeClock()
    lim = limiter(1000, clock, burst=500)
    start, started = clock.t, 0
    for n in (100, 700, 1, 3000, 250, 250, 999):
        lim.acquire(n)
        assert started <= 1000 * (clock.t - start) + 500 + 1e-6  # everything before this one
        started += n


def test_an_idle_link_earns_no_more_than_the_burst():
    clock = FakeClock()
    lim = limiter(1000, clock, burst=2000)
    lim.acquire(1000)
    clock.t += 3600  # an hour idle
    assert lim.acquire(5000) == 0.0  # starts at once on its credit...
    assert lim.acquire(1) == pytest.approx(3.0)  # ...and the next pays: 2000 bytes of credit, 3000 at 1000/s


def test_a_waiting_part_does_not_delay_the_next_reservation_further():
    """Reservations chain from the previous one's end, not from when the caller came back: after a link
    slower than the limit, the next part waits nothing."""
    clock = FakeClock()
    lim = limiter(1000, clock)
    assert lim.acquire(1000) == 0.0
    assert lim.acquire(1000) == pytest.approx(1.0)
    clock.t += 2.0  # the link took 2 s for those 1000 bytes
    assert lim.acquire(1000) == 0.0


def test_threads_share_one_budget():
    clock = FakeClock()
    lock = threading.Lock()

    def sleep(seconds):  # the fake clock does not advance: every reservation is made at the same instant
        with lock:
            clock.slept.append(seconds)

    lim = RateLimiter(1000, clock=clock, sleep=sleep)
    threads = [threading.Thread(target=lim.acquire, args=(1000,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # eight reservations of one second each, all made at the same instant: they begin 0..7 s later
    assert sorted(round(s, 6) for s in clock.slept) == [float(i) for i in range(1, 8)]


def test_shared_is_one_limiter_per_rate_and_none_when_unlimited():
    assert throttle.shared(0) is None
    assert throttle.shared(12345) is throttle.shared(12345)
    assert throttle.shared(12345) is not throttle.shared(54321)


def test_split_gives_each_task_its_share():
    assert throttle.split(8 * MIB, 2) == 4 * MIB
    assert throttle.split(8 * MIB, 0) == 8 * MIB
    assert throttle.split(3, 10) == 1
    assert throttle.split(0, 4) == 0


def test_a_rate_must_be_positive():
    with pytest.raises(BadInput):
        RateLimiter(0)
