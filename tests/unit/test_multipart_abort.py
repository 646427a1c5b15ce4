"""The multipart lifecycle's failure paths without a server: botocore's Stubber answers each call of
a real boto3 client (built as the product builds it) in order, as s3transfer's
tests/functional/test_upload.py::test_upload_failure_invokes_abort does. Each case checks that the upload is
aborted exactly when its id exists (create failed: nothing to abort), that every S3 error reaches the caller
as a one-line Tier2Error naming the operation and key, and that the stubbed calls were all made (a part
uploaded after the abort, or an abort missing, leaves the Stubber's queue unconsumed or unexpected)."""
from __future__ import annotations

from pathlib import Path

import pytest
from botocore.stub import Stubber

from tiering.clients import s3_client
from tiering.config import Settings
from tiering.errors import BadInput, Tier2Error, TieringError
from tiering.tier2.multipart import MIN_PART_SIZE, MultipartUpload
from tiering.tier2.objects import Bucket
from tiering.format.packing import frame_entries
from tiering.tier2.offloader import LedgerToUpload, upload_ledgers

KEY = "t/topic/attempt-ledger-0"
UPLOAD_ID = "upload-1"
PART = MIN_PART_SIZE


@pytest.fixture
def stubbed():
    settings = Settings(database_url="postgresql://u@h/d", bucket="bkt", tier1_root=Path("/nonexistent"),
                        s3_endpoint_url="http://127.0.0.1:9", aws_access_key_id="AKIDSECRET",
                        aws_secret_access_key="hush")
    client = s3_client(settings)
    with Stubber(client) as stub:
        yield Bucket(client, "bkt", "t/"), stub
        stub.assert_no_pending_responses()


def create_ok(stub):
    stub.add_response("create_multipart_upload", {"UploadId": UPLOAD_ID, "Bucket": "bkt", "Key": KEY},
                      {"Bucket": "bkt", "Key": KEY, "Metadata": {"m": "1"}, "ChecksumAlgorithm": "CRC32C"})


def part_ok(stub, n):
    stub.add_response("upload_part", {"ETag": f'"etag{n}"'})


def abort_expected(stub):
    stub.add_response("abort_multipart_upload", {}, {"Bucket": "bkt", "Key": KEY, "UploadId": UPLOAD_ID})


def three_parts(b, steps=None):
    """Two full parts and a 1-byte last part, one at a time (concurrency 1: the Stubber's order)."""
    with MultipartUpload(b, key=KEY, metadata={"m": "1"}, op="upload", part_size=PART, concurrency=1,
                         hook=steps.append if steps is not None else None) as up:
        up.write(b"a" * PART)
        up.write(b"b" * PART)
        up.write(b"c")
        return up.finish()


def test_a_complete_upload_is_three_parts_and_a_complete(stubbed):
    b, stub = stubbed
    create_ok(stub)
    for n in (1, 2, 3):
        part_ok(stub, n)
    stub.add_response("complete_multipart_upload", {}, {
        "Bucket": "bkt", "Key": KEY, "UploadId": UPLOAD_ID,
        "MultipartUpload": {"Parts": [{"PartNumber": n, "ETag": f'"etag{n}"'} for n in (1, 2, 3)]}})
    steps = []
    assert three_parts(b, steps) == 2 * PART + 1
    assert steps == ["initiated", "part", "part", "part", "completed"]


def test_failure_at_create_aborts_nothing_and_is_a_tier2_error(stubbed):
    """A failed CreateMultipartUpload is a Tier2Error like every other S3 failure, never a raw ClientError."""
    b, stub = stubbed
    stub.add_client_error("create_multipart_upload", "SlowDown", "Please reduce your request rate.", 503)
    with pytest.raises(Tier2Error) as err:
        three_parts(b)
    msg = str(err.value)
    assert msg == f"S3 upload of {KEY!r} failed: SlowDown Please reduce your request rate.", msg
    assert "AKIDSECRET" not in msg and "hush" not in msg


@pytest.mark.parametrize("failing", [1, 2, 3])
def test_failure_at_each_part_aborts_the_upload(stubbed, failing):
    b, stub = stubbed
    create_ok(stub)
    for n in range(1, failing):
        part_ok(stub, n)
    stub.add_client_error("upload_part", "InternalError", "We encountered an internal error.", 500)
    abort_expected(stub)  # and nothing else: no later part is sent, no complete
    with pytest.raises(Tier2Error, match=f"S3 upload of {KEY!r} failed: InternalError"):
        three_parts(b)


def test_failure_at_complete_aborts_the_upload(stubbed):
    b, stub = stubbed
    create_ok(stub)
    for n in (1, 2, 3):
        part_ok(stub, n)
    stub.add_client_error("complete_multipart_upload", "InvalidPart", "One or more of the parts was not found.", 400)
    abort_expected(stub)
    with pytest.raises(Tier2Error, match="InvalidPart"):
        three_parts(b)


def test_a_failing_abort_does_not_hide_the_failure(stubbed):
    b, stub = stubbed
    create_ok(stub)
    stub.add_client_error("upload_part", "InternalError", "boom", 500)
    stub.add_client_error("abort_multipart_upload", "InternalError", "abort failed too", 500)
    with pytest.raises(Tier2Error, match="InternalError boom"):
        three_parts(b)


def test_the_callers_own_failure_after_create_aborts_and_passes_through_unchanged(stubbed):
    b, stub = stubbed
    create_ok(stub)
    part_ok(stub, 1)
    abort_expected(stub)
    with pytest.raises(RuntimeError, match="the caller's"):
        with MultipartUpload(b, key=KEY, metadata={"m": "1"}, op="upload", part_size=PART) as up:
            up.write(b"a" * PART)
            up.write(b"b")  # part 1 shipped: the upload exists now
            raise RuntimeError("the caller's")


def test_failure_of_a_copied_part_aborts(stubbed):
    b, stub = stubbed
    create_ok(stub)
    stub.add_client_error("upload_part_copy", "AccessDenied", "Access Denied", 403)
    abort_expected(stub)
    with pytest.raises(Tier2Error, match="AccessDenied"):
        with MultipartUpload(b, key=KEY, metadata={"m": "1"}, op="upload") as up:
            up.copy("t/topic/src-ledger-1", 0, PART)
            up.finish()


def test_what_fits_one_part_is_one_put_and_its_failure_aborts_nothing(stubbed):
    b, stub = stubbed
    stub.add_client_error("put_object", "InternalError", "boom", 500)
    with pytest.raises(Tier2Error, match="InternalError"):
        with MultipartUpload(b, key=KEY, metadata={"m": "1"}, op="upload") as up:
            up.write(b"small")
            up.finish()


def test_leaving_without_finish_aborts_and_says_so(stubbed):
    b, stub = stubbed
    create_ok(stub)
    part_ok(stub, 1)
    abort_expected(stub)
    with pytest.raises(BadInput, match="without finish"):
        with MultipartUpload(b, key=KEY, metadata={"m": "1"}, op="upload", part_size=PART) as up:
            up.write(b"a" * PART)
            up.write(b"b")


def test_keyword_only_arguments():
    with pytest.raises(TypeError):
        MultipartUpload(Bucket(None, "bkt", "t/"), KEY, {}, "upload")  # type: ignore[misc]
    with pytest.raises(TypeError):
        upload_ledgers(Bucket(None, "bkt", "t/"), "topic")  # type: ignore[misc]


def test_offloader_failure_at_the_index_put_leaves_the_data_object_to_the_caller(stubbed):
    """The data object is complete when the index PUT fails: nothing to abort (deleting it is ops')."""
    b, stub = stubbed
    stub.add_response("put_object", {"ETag": '"d"'})  # the ledger's data: one block, one PUT
    stub.add_client_error("put_object", "InternalError", "boom", 500)
    with pytest.raises(Tier2Error, match="S3 PUT of 't/topic/attempt-ledger-0-index' failed: InternalError"):
        upload_ledgers(b, topic="topic", attempt="attempt", data_key=KEY, index_key=KEY + "-index",
                       sources=iter([(LedgerToUpload(0, 2, 0), frame_entries([(0, b"x"), (1, b"y")]))]),
                       block_size=PART, concurrency=1)


@pytest.mark.parametrize("recorded", [2, 4])
def test_offloader_counts_the_entries_of_its_runs(stubbed, recorded):
    """Entries counted from the runs (three, cut into runs of two and one) against the row's count: a
    mismatch fails before any object is written (the stub expects no call)."""
    b, _stub = stubbed
    runs = frame_entries([(0, b"x"), (1, b"yy"), (2, b"zzz")], run_bytes=20)
    with pytest.raises(TieringError, match=f"tier 1 holds 3 entries, metadata says {recorded}"):
        upload_ledgers(b, topic="topic", attempt="attempt", data_key=KEY, index_key=KEY + "-index",
                       sources=iter([(LedgerToUpload(0, recorded, 0), runs)]), block_size=PART, concurrency=1)


def test_offloader_records_payload_bytes_from_its_runs(stubbed):
    b, stub = stubbed
    stub.add_response("put_object", {"ETag": '"d"'})
    stub.add_response("put_object", {"ETag": '"i"'})
    runs = frame_entries([(0, b"x"), (1, b"yy"), (2, b"zzz")], run_bytes=20)
    uploaded = upload_ledgers(b, topic="topic", attempt="attempt", data_key=KEY, index_key=KEY + "-index",
                              sources=iter([(LedgerToUpload(0, 3, 0), runs)]), block_size=PART, concurrency=1)
    [placed] = uploaded.ledgers
    assert (placed.entry_count, placed.payload_bytes, placed.data_length) == (3, 6, 128 + 3 * 12 + 6)


class Gate:
    """A caller's claim: `fails` from the start, or opening when asked to wait."""

    def __init__(self, fails: bool = False, unowned: bool = False):
        self.fails, self.waits, self.unowned = fails, 0, unowned

    def owned(self):  # the caller's lock is held (its claim may still fail), unless `unowned`
        if self.unowned:
            raise RuntimeError("lock not taken")

    def check(self):
        if self.fails:
            raise RuntimeError("claim lost")

    def wait(self):
        self.waits += 1
        self.check()


def test_a_started_upload_whose_creation_fails_reports_it_at_the_first_part(stubbed):
    b, stub = stubbed
    stub.add_client_error("create_multipart_upload", "AccessDenied", "no", 403)
    with pytest.raises(Tier2Error, match="S3 upload of 't/topic/attempt-ledger-0' failed: AccessDenied"):
        with MultipartUpload(b, key=KEY, metadata={"m": "1"}, op="upload", part_size=PART) as up:
            up.start()
            up.write(b"a" * PART)  # nothing to abort: the upload never existed
            up.finish()


def test_a_gate_failing_before_the_first_part_aborts_the_started_upload(stubbed):
    b, stub = stubbed
    create_ok(stub)
    abort_expected(stub)  # no part was sent: the claim was known lost before it
    with pytest.raises(RuntimeError, match="claim lost"):
        with MultipartUpload(b, key=KEY, metadata={"m": "1"}, op="upload", part_size=PART,
                             gate=Gate(fails=True)) as up:
            up.start()
            up.write(b"a" * PART)


def test_the_gate_is_waited_for_before_later_parts_and_the_completion(stubbed):
    b, stub = stubbed
    create_ok(stub)
    for n in (1, 2, 3):
        part_ok(stub, n)
    stub.add_response("complete_multipart_upload", {"ETag": '"done"'})
    gate = Gate()
    with MultipartUpload(b, key=KEY, metadata={"m": "1"}, op="upload", part_size=PART, concurrency=1,
                         gate=gate) as up:
        up.write(b"a" * PART)
        assert gate.waits == 0  # the first part only checks
        up.write(b"b" * PART)
        up.write(b"c")
        assert up.finish() == 2 * PART + 1
    assert gate.waits == 3  # parts 2 and 3, then the completion


def test_a_single_put_waits_for_the_gate(stubbed):
    b, stub = stubbed
    gate = Gate(fails=True)
    with pytest.raises(RuntimeError, match="claim lost"):
        with MultipartUpload(b, key=KEY, metadata={"m": "1"}, op="upload", part_size=PART, gate=gate) as up:
            up.write(b"small")
            up.finish()  # nothing was sent: the Stubber has no call queued


def test_an_object_too_large_for_s3s_parts_at_the_configured_size_gets_larger_blocks():
    from tiering.tier2.multipart import MAX_PARTS, part_size_for

    mib = 1024 * 1024
    assert part_size_for(8 * mib, 0) == part_size_for(8 * mib, 8 * mib * 4999) == 8 * mib
    for expected in (8 * mib * 4999 + 1, 100 * 1024 * mib, 3 * 1024**4):
        size = part_size_for(8 * mib, expected)
        # whole MiB, and even at half full (the worst that cutting at entries leaves) within S3's parts
        assert size % mib == 0 and 2 * -(-expected // size) <= MAX_PARTS and size - mib < -(-expected // 4999)
    assert part_size_for(8 * mib, 2**60) == 2**31 - 1  # the index's int32 caps it


def test_no_upload_is_created_before_the_caller_owns_it(stubbed):
    """GC leaves the upload of a live attempt alone by its lock: an upload created before the lock is held
    could be aborted under a live offload, so a gate that cannot be owned creates nothing (no call queued)."""
    b, stub = stubbed
    with pytest.raises(RuntimeError, match="lock not taken"):
        with MultipartUpload(b, key=KEY, metadata={"m": "1"}, op="upload", part_size=PART,
                             gate=Gate(unowned=True)) as up:
            up.start()
            up.write(b"a" * PART)
