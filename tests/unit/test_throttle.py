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


def test_64_mib_at_8_mib_per_second_takes_8_seconds_whatever_the_part_size():
    for part in (5 * MIB, 8 * MIB, 64 * MIB):
        clock = FakeClock()
        lim, start, sent = limiter(8 * MIB, clock), clock.t, 0
        while sent < 64 * MIB:
            n = min(part, 64 * MIB - sent)
            lim.acquire(n)
            sent += n
        assert clock.t - start == pytest.approx(8.0)


def test_bytes_released_never_exceed_rate_times_elapsed_plus_burst():
    clock = FakeClock()
    lim = limiter(1000, clock, burst=500)
    start, released = clock.t, 0
    for n in (100, 700, 1, 3000, 250, 250, 999):
        lim.acquire(n)
        released += n
        assert released <= 1000 * (clock.t - start) + 500 + 1e-6


def test_an_idle_link_earns_no_more_than_the_burst():
    clock = FakeClock()
    lim = limiter(1000, clock, burst=2000)
    lim.acquire(1000)
    clock.t += 3600  # an hour idle
    waited = lim.acquire(5000)
    assert waited == pytest.approx(3.0)  # 2000 bytes of credit, 3000 paid at 1000/s


def test_a_waiting_part_does_not_delay_the_next_reservation_further():
    """Reservations chain from the previous one's end, not from when the caller came back: after a link
    slower than the limit, the next part waits only its own share."""
    clock = FakeClock()
    lim = limiter(1000, clock)
    assert lim.acquire(1000) == pytest.approx(1.0)
    clock.t += 2.0  # the link took 2 s for those 1000 bytes
    assert lim.acquire(1000) == pytest.approx(1.0)


def test_threads_share_one_budget():
    clock = FakeClock()
    lock = threading.Lock()

    def sleep(seconds):  # the fake clock advances to the latest reservation's end
        with lock:
            clock.slept.append(seconds)

    lim = RateLimiter(1000, clock=clock, sleep=sleep)
    threads = [threading.Thread(target=lim.acquire, args=(1000,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # eight reservations of one second each, all made at the same instant: they end 1..8 s later
    assert sorted(round(s, 6) for s in clock.slept) == [float(i) for i in range(1, 9)]


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
