"""The client's pause after a request timed out (tiering/tier2/breaker.py): which failures start it, how long it
lasts, and that it is per client. Through a real link that stops answering: tests/faults/test_slow_link.py."""
from __future__ import annotations

import time

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

from tiering.errors import Tier2Error
from tiering.tier2.breaker import RecentlyTimedOut, _Breaker, gave_up, install_breaker
from tiering.tier2.errors import Unreachable, tier2_error
from tiering.tier2.stalls import BodyStalled


@pytest.mark.parametrize("exc", [ReadTimeoutError(endpoint_url="http://s3"), ConnectTimeoutError(endpoint_url="http://s3"),
                                 BodyStalled(seconds=1, size=1)])
def test_a_timeout_pauses_the_client(exc):
    breaker = _Breaker(pause=60)
    breaker.check()
    breaker.timed_out(exc, time.monotonic())
    with pytest.raises(RecentlyTimedOut, match=f"timed out 0 s ago \\({type(exc).__name__} after all retries\\)"):
        breaker.check()


@pytest.mark.parametrize("exc", [EndpointConnectionError(endpoint_url="http://s3"), OSError("reset"),
                                 Tier2Error("answered 500")])
def test_what_fails_fast_anyway_does_not_pause_it(exc):
    breaker = _Breaker(pause=60)
    breaker.timed_out(exc, time.monotonic())
    breaker.check()


def test_a_timeout_while_other_requests_are_answered_pauses_nothing():
    breaker = _Breaker(pause=60)
    sent = time.monotonic()
    breaker.answered()  # another request got an answer after this one was sent: the server answers
    breaker.timed_out(ReadTimeoutError(endpoint_url="http://s3"), sent)
    breaker.check()


def test_answers_before_a_request_was_sent_do_not_keep_its_timeout_from_pausing():
    breaker = _Breaker(pause=60)
    breaker.answered()  # the HEAD of the bucket, then the PUT that gets no answer
    breaker.timed_out(ReadTimeoutError(endpoint_url="http://s3"), time.monotonic() + 1e-6)
    with pytest.raises(RecentlyTimedOut):
        breaker.check()


def test_an_answer_during_the_pause_ends_it():
    breaker = _Breaker(pause=60)
    breaker.timed_out(ReadTimeoutError(endpoint_url="http://s3"), time.monotonic())
    with pytest.raises(RecentlyTimedOut):
        breaker.check()
    breaker.answered()  # a request sent before the pause got its answer
    breaker.check()


def test_the_pause_ends():
    breaker = _Breaker(pause=0.0)
    breaker.timed_out(ReadTimeoutError(endpoint_url="http://s3"), time.monotonic())
    breaker.check()  # a pause of 0 s is over at once: the next request is sent


def test_a_paused_request_is_unsent_and_says_why_in_one_line():
    client = boto3.client("s3", endpoint_url="http://127.0.0.1:9", aws_access_key_id="AKIDEXAMPLE",
                          aws_secret_access_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", region_name="us-east-1",
                          config=Config(retries={"max_attempts": 1}))
    install_breaker(client)
    gave_up(client, BodyStalled(seconds=1, size=1), time.monotonic())  # a body read that gave up trips it as a request would
    with pytest.raises(RecentlyTimedOut) as raised:
        client.head_bucket(Bucket="b")  # port 9 would refuse: nothing was sent
    error = tier2_error("HEAD", "b", raised.value)
    assert isinstance(error, Unreachable)
    assert str(error).startswith("S3 HEAD of 'b' failed: not sent: tier 2 timed out") and "\n" not in str(error)
    assert "wJalr" not in str(error)


def test_each_client_has_its_own_pause():
    def client():
        made = boto3.client("s3", endpoint_url="http://127.0.0.1:9", aws_access_key_id="a", aws_secret_access_key="b",
                            region_name="us-east-1", config=Config(retries={"max_attempts": 1}, connect_timeout=1))
        install_breaker(made)
        return made
    tripped, other = client(), client()
    gave_up(tripped, ReadTimeoutError(endpoint_url="http://s3"), time.monotonic())
    with pytest.raises(RecentlyTimedOut):
        tripped.head_bucket(Bucket="b")
    with pytest.raises(EndpointConnectionError):  # sent, and refused: not paused by the other client's timeout
        other.head_bucket(Bucket="b")
    gave_up(boto3.client("s3", region_name="us-east-1"), ReadTimeoutError(endpoint_url="http://s3"), 0.0)  # no breaker: nothing
