"""The shared S3 helpers on the loopback endpoint: bounded, ordered prefetch of ranges; batch deletion
that also aborts the multipart uploads left under the deleted keys."""
from __future__ import annotations

import threading

import boto3
import pytest
from botocore.config import Config

from tiering.errors import DataLossError
from tiering.tier2.objects import Bucket, delete_keys, list_objects, prefetch_ranges


class InFlight:
    """Counts GetObject requests on a client of the test's own: how many at once at most, and by operation."""

    def __init__(self, s3):
        self.lock = threading.Lock()
        self.now = self.peak = 0
        self.ops: dict[str, int] = {}
        s3.meta.events.register("before-send.s3", self._sent)
        s3.meta.events.register("after-call.s3.GetObject", self._done)
        s3.meta.events.register("after-call-error.s3.GetObject", self._done)

    def _sent(self, event_name: str = "", **_kw):
        op = event_name.rsplit(".", 1)[-1]
        with self.lock:
            self.ops[op] = self.ops.get(op, 0) + 1
            if op == "GetObject":
                self.now += 1
                self.peak = max(self.peak, self.now)

    def _done(self, **_kw):
        with self.lock:
            self.now -= 1


@pytest.fixture
def counted(s3_settings, bucket):
    s3 = boto3.client("s3", **s3_settings, config=Config(max_pool_connections=16))
    return Bucket(s3, bucket, "o/"), InFlight(s3)


def test_prefetch_yields_every_range_in_order_with_at_most_window_requests_in_flight(counted):
    b, seen = counted
    # Given 40 objects with distinct contents
    bodies = {f"o/k{i:02d}": bytes([i]) * (1000 + i) for i in range(40)}
    for k, body in bodies.items():
        b.s3.put_object(Bucket=b.name, Key=k, Body=body)
    ranges = [(k, 10, len(body) - 20) for k, body in bodies.items()]
    # When they are prefetched four at a time
    got = list(prefetch_ranges(b, ranges, window=4))
    # Then each range comes back whole and in the order asked, and never more than four GETs overlapped
    assert got == [body[10:-10] for body in bodies.values()]
    assert seen.ops["GetObject"] == 40
    assert 1 <= seen.peak <= 4


def test_prefetch_stopped_early_sends_no_more_than_the_window_beyond_what_was_taken(counted):
    b, seen = counted
    for i in range(30):
        b.s3.put_object(Bucket=b.name, Key=f"o/s{i:02d}", Body=b"x" * 100)
    it = prefetch_ranges(b, [(f"o/s{i:02d}", 0, 100) for i in range(30)], window=3)
    assert [next(it) for _ in range(2)] == [b"x" * 100] * 2
    it.close()  # the caller gave up (an upload failed): pending GETs are cancelled, nothing hangs
    assert seen.ops["GetObject"] <= 2 + 3


def test_prefetch_of_a_missing_object_raises_the_typed_error(counted):
    b, _ = counted
    b.s3.put_object(Bucket=b.name, Key="o/here", Body=b"abc")
    with pytest.raises(DataLossError, match="o/gone"):
        list(prefetch_ranges(b, [("o/here", 0, 3), ("o/gone", 0, 3)], window=2))


def test_delete_keys_aborts_uploads_under_deleted_keys_only_with_one_listing(counted):
    b, seen = counted
    # Given 50 objects, an upload left under one of them (a killed offload) and one under a key we keep
    keys = [f"o/t/{i:03d}" for i in range(50)]
    for k in keys:
        b.s3.put_object(Bucket=b.name, Key=k, Body=b"d")
    b.s3.create_multipart_upload(Bucket=b.name, Key=keys[7])
    b.s3.create_multipart_upload(Bucket=b.name, Key="o/t/keep")
    seen.ops.clear()
    # When the 50 keys are deleted
    failed = delete_keys(b, keys + ["o/t/never-existed"])
    sent = dict(seen.ops)
    # Then all are gone, the upload under a deleted key is aborted, the other upload stays
    assert failed == []
    assert [o["Key"] for o in list_objects(b)] == []
    uploads = b.s3.list_multipart_uploads(Bucket=b.name).get("Uploads", [])
    assert [u["Key"] for u in uploads] == ["o/t/keep"]
    # And the uploads were listed once for the batch, not once per key
    assert sent == {"DeleteObjects": 1, "ListMultipartUploads": 1, "AbortMultipartUpload": 1}
