"""What tier 2 relies on from its S3 server, one behaviour per test, checked on the configured endpoint.

Locally that is Ceph RGW (`make services`); point TIERING_S3_ENDPOINT_URL and the AWS_* keys at AWS S3,
MinIO or another Ceph to check a server before trusting it with tier 2. The client is the product's own
(`tiering.clients.s3_client`, checksums only when required), so the requests are the product's requests.

Not relied on, so not tested: conditional PUT (`If-None-Match`; keys carry a fresh UUID instead), the
server verifying `x-amz-checksum-crc32c` (RGW 16 accepts a wrong one: readers check pages themselves),
response checksums (`ChecksumCRC32C` in UploadPart answers: RGW 16 returns the ETag only).
"""
from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from tiering import clients
from tiering.config import Settings
from tiering.format.keys import data_key
from tiering.format.metadata import check_user_metadata, user_metadata
from tiering.ops.export_metadata import filesystem_for
from tiering.tier2.objects import completed_part

MIB = 1024 * 1024
TOPIC = "acc/big ü"  # percent-encoded in keys and in user metadata


@pytest.fixture(scope="module")
def s3(s3_settings):
    settings = Settings(database_url="postgresql://unused/unused", bucket="unused", tier1_root=Path("/nonexistent"),
                        s3_endpoint_url=s3_settings["endpoint_url"], aws_region=s3_settings["region_name"],
                        aws_access_key_id=s3_settings["aws_access_key_id"],
                        aws_secret_access_key=s3_settings["aws_secret_access_key"])
    return clients.s3_client(settings)


def blob(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def code(exc: ClientError) -> str:
    return exc.response["Error"]["Code"]


def test_multipart_upload_concatenates_parts_and_keeps_the_metadata_given_at_creation(s3, bucket):
    """The offloader: CreateMultipartUpload (CRC32C, user metadata), parts in parallel, Complete."""
    key = data_key("t/", TOPIC, str(uuid.uuid4()), 0)
    parts = [blob(5 * MIB, 1), blob(5 * MIB + 17, 2), blob(1000, 3)]  # all but the last >= 5 MiB
    up = s3.create_multipart_upload(Bucket=bucket, Key=key, Metadata=user_metadata(TOPIC),
                                    ChecksumAlgorithm="CRC32C")["UploadId"]
    done = []
    for n, data in reversed(list(enumerate(parts, 1))):  # order of upload does not matter, numbers do
        resp = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=n, Body=data,
                              ChecksumAlgorithm="CRC32C")
        assert resp["ETag"]
        done.insert(0, completed_part(n, resp))
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload={"Parts": done})
    got = s3.get_object(Bucket=bucket, Key=key)
    assert got["Body"].read() == b"".join(parts)
    assert check_user_metadata(got["Metadata"], key) == TOPIC
    assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == sum(map(len, parts))
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_open_uploads_are_listed_by_prefix_with_their_start_time_and_abort_removes_them(s3, bucket):
    """GC: stale uploads under the tier-2 prefix and the export location are found by listing, judged by
    `Initiated`, and aborted."""
    ids = {k: s3.create_multipart_upload(Bucket=bucket, Key=k)["UploadId"]
           for k in ("t/a/x-ledger-0", "t-metadata/20260101T000000Z/ledger/part-00000.parquet")}
    listed = s3.list_multipart_uploads(Bucket=bucket, Prefix="t/")["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in listed] == [("t/a/x-ledger-0", ids["t/a/x-ledger-0"])]
    started = listed[0]["Initiated"]
    assert abs(started - datetime.now(timezone.utc)) < timedelta(minutes=5)
    for key, upload_id in ids.items():
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_upload_part_copy_copies_exactly_a_byte_range(s3, bucket):
    """Defrag: sources of 5 MiB or more become parts server-side (UploadPartCopy with CopySourceRange)."""
    src, dst = "t/plain/src-ledger-0", "t/plain/dst-ledger-0"
    data = blob(7 * MIB, 4)
    s3.put_object(Bucket=bucket, Key=src, Body=data, ChecksumAlgorithm="CRC32C")
    start, end = MIB + 3, 6 * MIB + 99  # inclusive, >= 5 MiB
    up = s3.create_multipart_upload(Bucket=bucket, Key=dst, ChecksumAlgorithm="CRC32C")["UploadId"]
    copied = s3.upload_part_copy(Bucket=bucket, Key=dst, UploadId=up, PartNumber=1,
                                 CopySource={"Bucket": bucket, "Key": src}, CopySourceRange=f"bytes={start}-{end}")
    tail = s3.upload_part(Bucket=bucket, Key=dst, UploadId=up, PartNumber=2, Body=b"tail",
                          ChecksumAlgorithm="CRC32C")
    s3.complete_multipart_upload(Bucket=bucket, Key=dst, UploadId=up, MultipartUpload={"Parts": [
        completed_part(1, copied["CopyPartResult"]), completed_part(2, tail)]})
    assert s3.get_object(Bucket=bucket, Key=dst)["Body"].read() == data[start:end + 1] + b"tail"


def test_upload_part_copy_from_a_percent_encoded_key_copies_or_answers_no_such_key(s3, bucket):
    """Defrag copes with exactly two outcomes for a source key holding '%': the right bytes, or NoSuchKey
    (RGW 16 decodes UploadPartCopy's copy source twice; defrag then downloads those bytes). Anything else
    (wrong bytes, another error) would break defrag of every topic whose name needs escaping."""
    src = data_key("t/", TOPIC, str(uuid.uuid4()), 0)
    assert "%" in src
    data = blob(5 * MIB + 5, 5)
    s3.put_object(Bucket=bucket, Key=src, Body=data)
    up = s3.create_multipart_upload(Bucket=bucket, Key="t/dst")["UploadId"]
    try:
        copied = s3.upload_part_copy(Bucket=bucket, Key="t/dst", UploadId=up, PartNumber=1,
                                     CopySource={"Bucket": bucket, "Key": src},
                                     CopySourceRange=f"bytes=0-{len(data) - 1}")
    except ClientError as exc:
        assert code(exc) == "NoSuchKey", exc
        s3.abort_multipart_upload(Bucket=bucket, Key="t/dst", UploadId=up)
        return
    s3.complete_multipart_upload(Bucket=bucket, Key="t/dst", UploadId=up, MultipartUpload={"Parts": [
        completed_part(1, copied["CopyPartResult"])]})
    assert s3.get_object(Bucket=bucket, Key="t/dst")["Body"].read() == data


def test_ranged_get_returns_exactly_the_range_and_a_range_past_the_end_is_refused(s3, bucket):
    """Readers fetch byte ranges; `get_range` maps InvalidRange to DataLossError and a short body to
    CorruptObjectError, so both must be what the server does past the end."""
    key = "t/r/obj-ledger-0"
    data = blob(3 * MIB, 6)
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    for start, end in ((0, 0), (100, 65635), (MIB - 1, 2 * MIB), (len(data) - 10, len(data) - 1)):
        got = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")
        assert got["Body"].read() == data[start:end + 1]
        assert got["ContentLength"] == end - start + 1
    # overlapping the end: the available bytes only (the reader notices the short read)
    assert s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={len(data) - 4}-{len(data) + 99}")["Body"].read() \
        == data[-4:]
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={len(data)}-{len(data) + 10}")
    assert code(err.value) == "InvalidRange"


def test_user_metadata_round_trips_on_put_head_and_get(s3, bucket):
    """Index and single-PUT data objects carry the format version and the topic; recovery reads them back."""
    key = data_key("t/", TOPIC, str(uuid.uuid4()), 1) + "-index"
    md = user_metadata(TOPIC)
    s3.put_object(Bucket=bucket, Key=key, Body=b"idx", Metadata=md, ChecksumAlgorithm="CRC32C")
    assert s3.head_object(Bucket=bucket, Key=key)["Metadata"] == {k.lower(): v for k, v in md.items()}
    assert check_user_metadata(s3.get_object(Bucket=bucket, Key=key)["Metadata"], key) == TOPIC


def test_delete_objects_deletes_a_batch_and_missing_keys_count_as_deleted(s3, bucket):
    """GC and discards delete in batches (Quiet); a key already gone must not be reported as a failure."""
    keys = [f"t/d/{i}-ledger-0" for i in range(3)]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=b"x")
    resp = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys + ["t/d/never-ledger-0"]],
                                                    "Quiet": True})
    assert [e for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"] == []
    assert not s3.list_objects_v2(Bucket=bucket, Prefix="t/d/").get("Contents")
    with pytest.raises(ClientError) as err:  # delete-lagged HEADs tier-2 copies: gone is 404
        s3.head_object(Bucket=bucket, Key=keys[0])
    assert code(err.value) in ("404", "NoSuchKey")


def test_listing_reflects_writes_and_deletes_at_once_and_returns_keys_verbatim(s3, bucket):
    """GC's orphan sweep and recovery list the prefix: right after a write or a delete, page by page, with
    percent-encoded keys returned exactly as written (not decoded) and a modification time."""
    keys = sorted(data_key("t/", topic, str(uuid.uuid4()), 0)
                  for topic in ("plain", "a/b", "with space", "ü", "100%", "..", "x" * 300))
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=b"x")

    def listed():
        out = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="t/",
                                                                  PaginationConfig={"PageSize": 2}):
            out += page.get("Contents", [])
        return out

    objs = listed()
    assert [o["Key"] for o in objs] == keys
    assert all(abs(o["LastModified"] - datetime.now(timezone.utc)) < timedelta(minutes=5) for o in objs)
    s3.delete_object(Bucket=bucket, Key=keys[1])
    assert [o["Key"] for o in listed()] == keys[:1] + keys[2:]


def test_pyarrow_writes_and_reads_back_through_the_configured_endpoint(s3_settings, bucket):
    """export-metadata and the Spark export job write Parquet parts with pyarrow's S3 client (multipart,
    Content-Length sent); import reads them back."""
    fs, base = filesystem_for(f"s3://{bucket}/t-metadata/compat", endpoint_url=s3_settings["endpoint_url"],
                              access_key=s3_settings["aws_access_key_id"],
                              secret_key=s3_settings["aws_secret_access_key"], region=s3_settings["region_name"])
    data = blob(12 * MIB + 1, 7)  # more than pyarrow's first part: a multipart upload
    with fs.open_output_stream(f"{base}/part.bin") as out:
        out.write(data)
    with fs.open_input_stream(f"{base}/part.bin") as f:
        assert f.read() == data
    assert fs.get_file_info(f"{base}/part.bin").size == len(data)
