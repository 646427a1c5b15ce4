"""How a multipart upload cuts and sends its parts, without a server: botocore's Stubber checks each call's
parameters (the CRC32C header against botocore's own checksum of the same bytes), and the part body is
read the way botocore reads it (hashing by 1 MiB reads, its content length by seek and tell)."""
from __future__ import annotations

import functools
import hashlib
import io
from pathlib import Path

from botocore.awsrequest import AWSResponse
from botocore.httpchecksum import CrtCrc32cChecksum
from botocore.stub import ANY
from botocore.utils import determine_content_length

from tests.unit.test_multipart_abort import KEY, PART, UPLOAD_ID, stubbed  # noqa: F401  (the fixture)
from tiering.clients import s3_client
from tiering.config import Settings
from tiering.tier2.multipart import MultipartUpload, _PartBody
from tiering.tier2.objects import Bucket


def botocores_crc32c(data: bytes) -> str:
    return CrtCrc32cChecksum().handle(data)


def expect_create(stub):
    stub.add_response("create_multipart_upload", {"UploadId": UPLOAD_ID, "Bucket": "bkt", "Key": KEY},
                      {"Bucket": "bkt", "Key": KEY, "Metadata": {}, "ChecksumAlgorithm": "CRC32C"})


def expect_parts(stub, bodies: list[bytes]):
    """Each part in order, its CRC32C header as botocore computes it over the part's bytes."""
    for n, body in enumerate(bodies, 1):
        stub.add_response("upload_part", {"ETag": f'"e{n}"'},
                          {"Bucket": "bkt", "Key": KEY, "UploadId": UPLOAD_ID, "PartNumber": n, "Body": ANY,
                           "ChecksumAlgorithm": "CRC32C", "ChecksumCRC32C": botocores_crc32c(body)})
    stub.add_response("complete_multipart_upload", {}, {
        "Bucket": "bkt", "Key": KEY, "UploadId": UPLOAD_ID,
        "MultipartUpload": {"Parts": [{"PartNumber": n, "ETag": f'"e{n}"'} for n in range(1, len(bodies) + 1)]}})


def upload(b, writes: list[bytes], expected_size: int = 0) -> MultipartUpload:
    with MultipartUpload(b, key=KEY, metadata={}, op="upload", part_size=PART, concurrency=1,
                         expected_size=expected_size) as up:
        for w in writes:
            up.write(w)
        assert up.finish() == sum(map(len, writes))
    return up


def test_without_a_hint_every_full_part_ships_and_the_tail_is_a_part_of_its_own(stubbed):
    b, stub = stubbed
    writes = [b"a" * PART, b"b" * PART, b"c" * 100]
    expect_create(stub)
    expect_parts(stub, writes)
    assert upload(b, writes).parts == 3


def test_a_tail_expected_under_5_mib_goes_with_the_last_full_part(stubbed):
    """The hint (blocks' bytes without headers and padding: a little under the truth) holds the second part
    back; the tail joins it, written as two buffers, checksummed as one part."""
    b, stub = stubbed
    writes = [b"a" * PART, b"b" * PART, b"c" * 100]
    expect_create(stub)
    expect_parts(stub, [writes[0], writes[1] + writes[2]])
    assert upload(b, writes, expected_size=2 * PART + 50).parts == 2


def test_a_hint_too_small_costs_one_part_sent_a_write_later_never_a_larger_one(stubbed):
    """The hint says the object ends after part 1; it goes on. Each held part ships when the next write would
    take it to part_size + 5 MiB (a whole block: no tail), so parts stay as they were; the tail joins the last."""
    b, stub = stubbed
    writes = [b"a" * PART, b"b" * PART, b"c" * PART, b"d" * 7]
    expect_create(stub)
    expect_parts(stub, [writes[0], writes[1], writes[2] + writes[3]])
    assert upload(b, writes, expected_size=PART).parts == 3


def test_parts_larger_than_5_mib_held_for_a_tail_stay_their_size(stubbed):
    """Part size 6 MiB, blocks of 6 MiB, a hint far too small: no part is two blocks."""
    b, stub = stubbed
    big = PART + 1024 * 1024
    writes = [b"a" * big, b"b" * big, b"c" * big, b"d" * 1000]
    expect_create(stub)
    expect_parts(stub, [writes[0], writes[1], writes[2] + writes[3]])
    with MultipartUpload(b, key=KEY, metadata={}, op="upload", part_size=big, concurrency=1,
                         expected_size=1) as up:
        for w in writes:
            up.write(w)
        up.finish()
    assert up.parts == 3


def test_the_size_counts_bytes_whatever_the_buffer_s_item_size(stubbed):
    """A buffer of 4-byte items is written as its bytes, and counted so."""
    from array import array

    b, stub = stubbed
    items = array("I", range(300))
    stub.add_response("put_object", {"ETag": '"p"'},
                      {"Bucket": "bkt", "Key": KEY, "Body": ANY, "Metadata": {}, "ChecksumAlgorithm": "CRC32C",
                       "ChecksumCRC32C": botocores_crc32c(items.tobytes())})
    with MultipartUpload(b, key=KEY, metadata={}, op="upload") as up:
        up.write(items)
        assert up.finish() == 1200


def test_a_remainder_of_5_mib_or_more_is_a_part_of_its_own(stubbed):
    b, stub = stubbed
    writes = [b"a" * PART, b"b" * PART]
    expect_create(stub)
    expect_parts(stub, writes)
    assert upload(b, writes, expected_size=2 * PART).parts == 2


def test_one_put_carries_the_crc32c_of_its_buffers_together(stubbed):
    b, stub = stubbed
    writes = [b"x" * 1000, b"y" * 10]
    stub.add_response("put_object", {"ETag": '"p"'},
                      {"Bucket": "bkt", "Key": KEY, "Body": ANY, "Metadata": {}, "ChecksumAlgorithm": "CRC32C",
                       "ChecksumCRC32C": botocores_crc32c(b"".join(writes))})
    up = upload(b, writes, expected_size=1010)
    assert (up.parts, up.etag) == (1, '"p"')


def test_a_buffer_changed_after_its_write_is_sent_as_written(stubbed):
    """Writes are kept until their part is sent; a bytearray the caller reuses must not change the object."""
    b, stub = stubbed
    stub.add_response("put_object", {"ETag": '"p"'},
                      {"Bucket": "bkt", "Key": KEY, "Body": ANY, "Metadata": {}, "ChecksumAlgorithm": "CRC32C",
                       "ChecksumCRC32C": botocores_crc32c(b"before")})
    with MultipartUpload(b, key=KEY, metadata={}, op="upload") as up:
        buf = bytearray(b"before")
        up.write(buf)
        buf[:] = b"after!"
        up.finish()


# ------------------------------------------------------------------------------------------ the part body

PIECES = [b"0123456789", memoryview(bytearray(b"abc")), b"", b"XYZ" * 1000]
JOINED = b"".join(bytes(p) for p in PIECES)


def test_the_body_reads_as_the_buffers_one_after_the_other_in_views():
    body = _PartBody(PIECES)
    got = []
    for chunk in iter(functools.partial(body.read, 7), b""):
        assert isinstance(chunk, memoryview)  # a view of the part's bytes, not a copy
        assert 0 < len(chunk) <= 7
        got.append(bytes(chunk))
    assert b"".join(got) == JOINED
    assert body.read(5) == b"" and body.tell() == len(JOINED)


def test_the_body_as_botocore_reads_it_length_hash_and_again_after_a_retry():
    body = _PartBody(PIECES)
    assert determine_content_length(body) == len(JOINED)
    digest = hashlib.sha256()
    for chunk in iter(functools.partial(body.read, 1024 * 1024), b""):  # botocore's payload hash
        digest.update(chunk)
    assert digest.hexdigest() == hashlib.sha256(JOINED).hexdigest()
    body.seek(0)  # what botocore does before sending, and again before each retry
    assert body.read() == JOINED
    body.seek(-4, io.SEEK_END)
    assert bytes(body.read(100)) == JOINED[-4:]
    body.seek(3)
    body.seek(2, io.SEEK_CUR)
    assert bytes(body.read(8)) == JOINED[5:10]  # a read ends at a buffer's end
    assert body.read(0) == b""


def test_an_empty_body():
    body = _PartBody([b"", b""])
    assert determine_content_length(body) == 0
    assert body.read() == b"" and body.read(10) == b""


# ------------------------------------------------------------------------------------------ as signed and sent

def sent_parts(scheme: str) -> list[tuple[bytes, bytes, str]]:
    """(X-Amz-Content-SHA256, x-amz-checksum-crc32c, Content-Length) of each UploadPart as botocore sends it
    over `scheme` (answered at before-send: nothing leaves the process)."""
    settings = Settings(database_url="postgresql://u@h/d", bucket="bkt", tier1_root=Path("/nonexistent"),
                        s3_endpoint_url=f"{scheme}://127.0.0.1:9", aws_access_key_id="AKID",
                        aws_secret_access_key="s")
    client = s3_client(settings)
    seen = []

    def answer(request, event_name="", **_):
        body = b""
        if event_name.endswith("CreateMultipartUpload"):
            body = b"<InitiateMultipartUploadResult><UploadId>u</UploadId></InitiateMultipartUploadResult>"
        if event_name.endswith("UploadPart"):
            h = request.headers
            seen.append((h["X-Amz-Content-SHA256"], h["x-amz-checksum-crc32c"], str(h["Content-Length"])))
        raw = type("Raw", (), {"stream": lambda self, **_k: iter([body]), "read": lambda self, *_a: body})()
        return AWSResponse(request.url, 200, {"ETag": '"e"'}, raw)

    client.meta.events.register("before-send.s3", answer)
    with MultipartUpload(Bucket(client, "bkt", "t/"), key=KEY, metadata={}, op="upload", part_size=PART) as up:
        up.write(b"a" * PART)
        up.write(b"b" * 10)
        up.finish()
    return seen


def test_over_https_a_part_goes_unsigned_with_its_checksum_header():
    """As botocore does when it computes the checksum header itself: TLS and the CRC32C cover the body, so
    no SHA-256 pass over each part (the payload is UNSIGNED-PAYLOAD)."""
    assert sent_parts("https") == [
        (b"UNSIGNED-PAYLOAD", botocores_crc32c(b"a" * PART).encode(), str(PART)),
        (b"UNSIGNED-PAYLOAD", botocores_crc32c(b"b" * 10).encode(), "10")]


def test_over_http_a_part_s_payload_is_signed():
    assert sent_parts("http") == [
        (hashlib.sha256(b"a" * PART).hexdigest().encode(), botocores_crc32c(b"a" * PART).encode(), str(PART)),
        (hashlib.sha256(b"b" * 10).hexdigest().encode(), botocores_crc32c(b"b" * 10).encode(), "10")]
