"""The driver's bounded wait for a cluster's first executor (tiering/jobs/executors.py): on an
injected clock, nothing sleeps."""
from __future__ import annotations

import pytest

from tiering.errors import TieringError
from tiering.jobs.executors import EXPECTED_CONF, WAIT_CONF, wait_for_executor, wait_on


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_returns_as_soon_as_one_executor_registers():
    clock = Clock()
    seen = iter([0, 0, 0, 1])
    wait_for_executor(lambda: next(seen), 120, "10.0.0.1:40000", "spark://m:7077", clock=clock, sleep=clock.sleep)
    assert clock.t == pytest.approx(1.5)  # three polls of 0.5 s


def test_executors_that_never_register_fail_with_the_cause_and_the_address():
    clock = Clock()
    with pytest.raises(TieringError) as err:
        wait_for_executor(lambda: 0, 30, "127.0.0.1:40000", "spark://m:7077", clock=clock, sleep=clock.sleep)
    msg = str(err.value)
    assert "within 30 s" in msg and "127.0.0.1:40000" in msg and "spark.driver.host" in msg
    assert 30 <= clock.t <= 31


def test_some_executors_missing_is_reported_not_fatal():
    clock = Clock()
    missing = wait_for_executor(lambda: 1, 20, "10.0.0.1:40000", "spark://m:7077", expected=2, clock=clock,
                                sleep=clock.sleep)
    assert missing.startswith("only 1 of 2 expected executors registered within 20 s on spark://m:7077")
    assert "10.0.0.1:40000" in missing and 20 <= clock.t <= 21


def test_all_expected_executors_return_at_once():
    clock = Clock()
    seen = iter([1, 2])
    assert wait_for_executor(lambda: next(seen), 20, "a:1", "spark://m:7077", expected=2, clock=clock,
                             sleep=clock.sleep) is None
    assert clock.t == pytest.approx(0.5)


class _Context:
    """A SparkContext as wait_on reads it: its conf alone (no executor is ever asked for)."""

    def __init__(self, conf: dict):
        self.conf = conf

    def getConf(self):
        return self.conf


@pytest.mark.parametrize("conf", [{WAIT_CONF: "nan"}, {WAIT_CONF: "inf"}, {WAIT_CONF: "1e400"},
                                  {WAIT_CONF: "soon"}, {EXPECTED_CONF: "two"}])
def test_a_wait_that_is_not_a_finite_number_is_refused_with_its_settings(conf):
    # float() takes nan and inf: the deadline would never come, and the job would wait until the task's timeout
    with pytest.raises(TieringError, match=WAIT_CONF):
        wait_on(_Context({"spark.master": "spark://m:7077", **conf}))


class _Stopped:
    """The JVM side of a SparkContext the master gave up on: asking it anything fails, and says it stopped."""

    def getExecutorMemoryStatus(self):
        raise RuntimeError("An error occurred while calling o72.getExecutorMemoryStatus.\n: java.lang."
                           "IllegalStateException: Cannot call methods on a stopped SparkContext.")

    def isStopped(self):
        return True


def test_a_context_spark_stopped_while_waiting_says_why_not_what_the_jvm_threw():
    from types import SimpleNamespace

    sc = _Context({"spark.master": "spark://127.0.0.1:7999", WAIT_CONF: "5"})
    sc._jsc = SimpleNamespace(sc=lambda: _Stopped())
    with pytest.raises(TieringError, match=r"Spark stopped the application before an executor registered: the "
                                           r"master spark://127.0.0.1:7999 could not be reached"):
        wait_on(sc)
