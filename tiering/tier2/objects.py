"""Small S3 operations shared by the offloader, defrag and GC, with errors mapped to `Tier2Error`
(operation and key, never credentials); the boto3 client of tier 2 (`make_client`) with the server-side
encryption every request carries (`install_encryption`)."""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Iterable, Iterator

from botocore.exceptions import (BotoCoreError, ClientError, CredentialRetrievalError, NoCredentialsError,
                                 PartialCredentialsError, SSLError)

from tiering.config import S3Encryption, Settings
from tiering.errors import DataLossError, Tier2Error


@dataclass(frozen=True)
class Bucket:
    """The S3 client, bucket and key prefix of tier 2, passed to every operation."""

    s3: object
    name: str
    prefix: str


def error_code(exc: BaseException) -> str | None:
    return exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else None


# botocore's "no usable credentials" errors: the endpoint was never asked, so the message must not send the
# operator to TIERING_S3_ENDPOINT_URL (issue 20)
_CREDENTIALS = (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)
CREDENTIALS_HINT = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile or role boto3 finds)"


# a TLS handshake that failed: nothing was sent, and nothing is retried in plain text
TLS_HINT = ("the S3 endpoint's TLS certificate could not be verified (SSLError): check TIERING_S3_CA_BUNDLE "
            "and TIERING_S3_ENDPOINT_URL")


def make_client(settings: Settings, max_pool_connections: int = 32):
    """The boto3 S3 client of tier 2: the endpoint, credentials, CA bundle (`verify`) and encryption of the
    settings. `tiering.clients.s3_client` and the export's filesystem (tier2/arrowfs.py) both build it here."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        aws_access_key_id=settings.aws_access_key_id,
        aws_secret_access_key=settings.aws_secret_access_key,
        aws_session_token=settings.aws_session_token,
        region_name=settings.aws_region,
        # None: boto3's default (certifi's CAs, or AWS_CA_BUNDLE); never False: TLS is verified or refused
        verify=str(settings.s3_ca_bundle) if settings.s3_ca_bundle else None,
        # checksums only when an operation requires them: older S3-compatible servers (Ceph RGW 16) neither
        # return nor verify the newer flexible checksums, and the readers check every page themselves
        config=Config(max_pool_connections=max_pool_connections, retries={"max_attempts": 5, "mode": "standard"},
                      request_checksum_calculation="when_required", response_checksum_validation="when_required"),
    )
    # over https botocore sends a checksummed upload as `aws-chunked` with the checksum in a trailer and no
    # Content-Length, which Ceph RGW 16 refuses (411 MissingContentLength); our bodies are bytes in memory
    # (botocore wraps them in a BytesIO), so the checksum goes in a header as it does over http
    for op in ("PutObject", "UploadPart"):
        client.meta.events.register(f"before-call.s3.{op}", _checksum_in_header)
    install_encryption(client, settings.s3_encryption, settings.s3_endpoint_url)
    return client


def _checksum_in_header(params, **_):
    algorithm = params.get("context", {}).get("checksum", {}).get("request_algorithm")
    body = params.get("body")
    if isinstance(algorithm, dict) and algorithm.get("in") == "trailer" and (
            isinstance(body, (bytes, bytearray)) or hasattr(body, "seekable") and body.seekable()):
        algorithm["in"] = "header"


# Which operations carry what (S3's API): the encryption of a new object is asked for where it is created
# (PutObject, CreateMultipartUpload, CopyObject); an SSE-C key goes on every request that reads or writes the
# object's bytes, and a copy also names the key of its source.
_CREATES = ("PutObject", "CreateMultipartUpload", "CopyObject")
_SSE_C = _CREATES + ("UploadPart", "UploadPartCopy", "CompleteMultipartUpload", "GetObject", "HeadObject")
_SSE_C_SOURCE = ("CopyObject", "UploadPartCopy")
_READS = ("GetObject", "HeadObject")
_ENCRYPTION_CODES = {"InvalidRequest", "InvalidArgument", "InvalidEncryptionAlgorithmError", "AccessDenied", "400",
                     "403", "NotImplemented"}


def install_encryption(client, enc: S3Encryption, endpoint_url: str | None) -> None:
    """Add the encryption parameters to every request of `client` that needs them (botocore's
    before-parameter-build: each call site in tier2/ stays as it is), check that a write was encrypted, and
    name the setting in errors that encryption causes (after-call: the one-line `Tier2Error` then says it).

    A store that ignores the header (Ceph RGW 16 answers SSE-S3 `AES256` with 200 and stores the object
    unencrypted) fails the write instead of leaving a plaintext object the operator believes encrypted."""
    from botocore.exceptions import ClientError as _ClientError

    plain_http = (endpoint_url or "https://").startswith("http://")

    def add_parameters(params, model, context, **_):
        op = model.name
        if enc.mode == "SSE-C":
            if op in _SSE_C:
                params.setdefault("SSECustomerAlgorithm", "AES256")
                params.setdefault("SSECustomerKey", enc.customer_key)
            if op in _SSE_C_SOURCE:
                params.setdefault("CopySourceSSECustomerAlgorithm", "AES256")
                params.setdefault("CopySourceSSECustomerKey", enc.customer_key)
        elif enc.enabled and op in _CREATES:
            params.setdefault("ServerSideEncryption", enc.mode)
            if enc.kms_key_id:
                params.setdefault("SSEKMSKeyId", enc.kms_key_id)

    def check_response(http_response, parsed, model, **_):
        op = model.name
        err = parsed.get("Error") if http_response.status_code >= 300 else None
        if err is not None:
            code = str(err.get("Code"))
            hint = _encryption_hint(enc, op, code, str(err.get("Message") or ""), plain_http)
            if hint:
                err["Message"] = f"{err.get('Message') or ''} ({hint})".lstrip()
            return
        if enc.enabled and op in _CREATES:
            applied = parsed.get("SSECustomerAlgorithm") if enc.mode == "SSE-C" else parsed.get("ServerSideEncryption")
            if not applied:
                if op == "CreateMultipartUpload" and parsed.get("UploadId"):
                    try:  # no caller will ever know this upload: abort it here (GC's sweep is the net)
                        client.abort_multipart_upload(Bucket=parsed["Bucket"], Key=parsed["Key"],
                                                      UploadId=parsed["UploadId"])
                    except Exception:  # noqa: BLE001 - best effort
                        pass
                raise _ClientError({"Error": {"Code": "ServerSideEncryptionNotApplied", "Message":
                                              f"the store accepted the write without applying {enc.setting}; "
                                              f"refusing to leave data unencrypted"}}, op)

    if enc.enabled:
        for op in _SSE_C if enc.mode == "SSE-C" else _CREATES:
            # first: botocore's own handler on the same event base64-encodes the key and adds its MD5
            client.meta.events.register_first(f"before-parameter-build.s3.{op}", add_parameters)
    for op in set(_SSE_C):
        client.meta.events.register(f"after-call.s3.{op}", check_response)


def _encryption_hint(enc: S3Encryption, op: str, code: str, message: str, plain_http: bool) -> str | None:
    """What to tell the operator when an error may come from encryption (None: it does not)."""
    kms_error = code.startswith("KMS") or "kms" in message.lower()
    if not (code in _ENCRYPTION_CODES or kms_error):
        return None
    if enc.enabled:
        if plain_http and code in ("InvalidRequest", "400"):
            return (f"{enc.setting}: the store refuses server-side encryption over plain http; use an https "
                    f"TIERING_S3_ENDPOINT_URL")
        if kms_error:
            return f"{enc.setting}: the store could not use the KMS key"
        if enc.mode == "SSE-C" and op in _READS + ("UploadPartCopy", "CopyObject") and code != "AccessDenied":
            return f"{enc.setting}: the object was written with another key, or without SSE-C"
        return (f"refused with {enc.setting}: the bucket's policy may require another kind of server-side "
                f"encryption, or the credentials lack access")
    if op in _READS and code in ("InvalidArgument", "InvalidRequest", "400"):
        return "the object may be encrypted with a customer key (SSE-C): set TIERING_S3_SSE_C_KEY_FILE"
    if op in _CREATES and code in ("AccessDenied", "403"):
        return ("TIERING_S3_SSE is none: a bucket policy that requires server-side encryption refuses such writes; "
                "set TIERING_S3_SSE or TIERING_S3_SSE_C_KEY_FILE")
    return None


def tier2_error(op: str, key: str, exc: BaseException) -> Tier2Error:
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        return Tier2Error(f"S3 {op} of {key!r} failed: {err.get('Code')} {err.get('Message', '')}".rstrip())
    if isinstance(exc, _CREDENTIALS):
        return Tier2Error(f"S3 {op} of {key!r} failed: no usable S3 credentials ({type(exc).__name__}): "
                          f"{CREDENTIALS_HINT}")
    if isinstance(exc, SSLError):
        return Tier2Error(f"S3 {op} of {key!r} failed: {TLS_HINT}")
    if isinstance(exc, BotoCoreError):
        return Tier2Error(f"S3 {op} of {key!r} failed: {type(exc).__name__}")
    return Tier2Error(f"S3 {op} of {key!r} failed: {type(exc).__name__}: {exc}")


def completed_part(part_number: int, resp: dict) -> dict:
    """A CompleteMultipartUpload entry from an UploadPart answer. The part's CRC32C goes along only when the
    server returned one: AWS requires it back for an upload created with a checksum algorithm, while
    servers without S3's flexible checksums (Ceph RGW 16, older MinIO) answer with the ETag alone."""
    part = {"PartNumber": part_number, "ETag": resp["ETag"]}
    if resp.get("ChecksumCRC32C"):
        part["ChecksumCRC32C"] = resp["ChecksumCRC32C"]
    return part


def get_range(b: Bucket, key: str, start: int, length: int) -> bytes:
    """Bytes [start, start+length) of an object; a short read is an error, not a silent truncation."""
    if length <= 0:
        return b""
    try:
        body = b.s3.get_object(Bucket=b.name, Key=key, Range=f"bytes={start}-{start + length - 1}")["Body"]
        data = body.read()
    except (ClientError, BotoCoreError) as exc:
        if error_code(exc) in ("NoSuchKey", "404", "InvalidRange"):
            raise DataLossError(f"tier-2 object {key!r} is missing or shorter than metadata says") from None
        raise tier2_error("GET", key, exc) from None
    if len(data) != length:
        from tiering.errors import CorruptObjectError

        raise CorruptObjectError("object", f"{key} bytes {start}..{start + length - 1}",
                                 f"got {len(data)} bytes, expected {length} (object shorter than metadata says)")
    return data


class RangeStream:
    """One GET of [start, start+length) of an object, read in consecutive pieces as the bytes arrive: a scan
    at the speed of one streaming GET, with memory bounded by what the caller holds. Each `read(n)` returns
    exactly n bytes or raises (a short body is CorruptObjectError, a broken connection Tier2Error, a
    missing object DataLossError). `close()` drops the rest (the connection is discarded)."""

    def __init__(self, b: Bucket, key: str, start: int, length: int):
        self.key, self.start, self.left = key, start, length
        try:
            self._body = b.s3.get_object(Bucket=b.name, Key=key,
                                         Range=f"bytes={start}-{start + length - 1}")["Body"] if length > 0 else None
        except (ClientError, BotoCoreError) as exc:
            if error_code(exc) in ("NoSuchKey", "404", "InvalidRange"):
                raise DataLossError(f"tier-2 object {key!r} is missing or shorter than metadata says") from None
            raise tier2_error("GET", key, exc) from None

    def read(self, n: int) -> bytes:
        if n <= 0:
            return b""
        if n > self.left:
            raise ValueError(f"read of {n} bytes past the range's end ({self.left} left)")
        try:
            data = self._body.read(n)
        except (BotoCoreError, OSError) as exc:  # the connection broke mid-body (urllib3's errors are OSErrors)
            raise tier2_error("GET", self.key, exc) from None
        if len(data) != n:
            from tiering.errors import CorruptObjectError

            raise CorruptObjectError("object", f"{self.key} from byte {self.start}",
                                     f"the body ended {self.left - len(data)} bytes early (object shorter than "
                                     f"metadata says)")
        self.left -= n
        self.start += n
        return data

    def close(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None


def check_bucket(b: Bucket) -> None:
    """One HEAD of the bucket. Operations that change metadata before writing to tier 2 (offload) call it
    first: with the endpoint down or the bucket missing they fail once, cleanly, instead of bumping every
    ledger's version and queueing its keys for GC on each run of an outage."""
    try:
        b.s3.head_bucket(Bucket=b.name)
    except ClientError as exc:
        code = error_code(exc)
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise Tier2Error(f"tier 2 is unavailable: bucket {b.name!r} does not exist") from None
        if code in ("403", "AccessDenied", "Forbidden"):
            raise Tier2Error(f"tier 2 is unavailable: access to bucket {b.name!r} is denied") from None
        raise tier2_error("HEAD bucket", b.name, exc) from None
    except _CREDENTIALS as exc:
        raise Tier2Error(f"tier 2 is unavailable: no usable S3 credentials ({type(exc).__name__}): "
                         f"{CREDENTIALS_HINT}") from None
    except SSLError:
        raise Tier2Error(f"tier 2 is unreachable: {TLS_HINT}") from None
    except BotoCoreError as exc:
        raise Tier2Error(f"tier 2 is unreachable: the S3 endpoint did not answer ({type(exc).__name__}); "
                         f"check TIERING_S3_ENDPOINT_URL") from None


def object_length(b: Bucket, key: str) -> int | None:
    """The object's length by HEAD, or None when it does not exist."""
    try:
        return int(b.s3.head_object(Bucket=b.name, Key=key)["ContentLength"])
    except (ClientError, BotoCoreError) as exc:
        if error_code(exc) in ("NoSuchKey", "404", "NotFound"):
            return None
        raise tier2_error("HEAD", key, exc) from None


def delete_keys(b: Bucket, keys: Iterable[str]) -> list[str]:
    """Delete keys (missing ones count as deleted) and abort their multipart uploads.
    Returns the keys that could not be deleted."""
    keys = sorted(set(keys))
    failed: list[str] = []
    for i in range(0, len(keys), 1000):
        batch = keys[i:i + 1000]
        try:
            resp = b.s3.delete_objects(Bucket=b.name, Delete={"Objects": [{"Key": k} for k in batch],
                                                                "Quiet": True})
            failed += [e["Key"] for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]
        except (ClientError, BotoCoreError):
            failed += batch
    if keys:
        # One listing under the keys' common prefix, not one per key: uploads in flight are few, keys many.
        wanted = set(keys)
        try:
            for up in list_uploads(b, os.path.commonprefix(keys)):
                if up["Key"] in wanted:
                    try:
                        b.s3.abort_multipart_upload(Bucket=b.name, Key=up["Key"], UploadId=up["UploadId"])
                    except (ClientError, BotoCoreError):
                        failed.append(up["Key"])
        except (ClientError, BotoCoreError):
            failed += keys
    return sorted(set(failed))


def prefetch_ranges(b: Bucket, ranges: Iterable[tuple[str, int, int]], window: int) -> Iterator[bytes]:
    """`get_range` of each (key, start, length) in order, with up to `window` GETs in flight: latency
    overlaps while memory stays bounded by the window, not by the number of ranges."""
    it = iter(ranges)
    with ThreadPoolExecutor(max(1, window), thread_name_prefix="tier2-prefetch") as pool:
        inflight = deque(pool.submit(get_range, b, *r) for r in islice(it, max(1, window)))
        try:
            while inflight:
                data = inflight.popleft().result()
                nxt = next(it, None)
                if nxt is not None:
                    inflight.append(pool.submit(get_range, b, *nxt))
                yield data
        finally:
            for f in inflight:
                f.cancel()


def list_uploads(b: Bucket, prefix: str) -> Iterator[dict]:
    """In-progress multipart uploads under a prefix (paginated)."""
    kwargs = {"Bucket": b.name, "Prefix": prefix}
    while True:
        resp = b.s3.list_multipart_uploads(**kwargs)
        yield from resp.get("Uploads", [])
        if not resp.get("IsTruncated"):
            return
        kwargs.update(KeyMarker=resp["NextKeyMarker"], UploadIdMarker=resp["NextUploadIdMarker"])


def list_objects(b: Bucket, prefix: str | None = None) -> Iterator[dict]:
    paginator = b.s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=b.name, Prefix=b.prefix if prefix is None else prefix):
        yield from page.get("Contents", [])


@dataclass(frozen=True)
class ListedPage:
    """One LIST page: its objects in key order, and whether the prefix goes on after them."""
    objects: list[dict]
    truncated: bool

    @property
    def last_key(self) -> str | None:
        return self.objects[-1]["Key"] if self.objects else None


def list_page(b: Bucket, start_after: str = "", max_keys: int = 1000) -> ListedPage:
    """One ListObjectsV2 request under the prefix: up to `max_keys` (S3 caps it at 1,000) keys after
    `start_after` ('' : from the start). GC's resumable orphan sweep lists one page at a time."""
    kwargs = {"Bucket": b.name, "Prefix": b.prefix, "MaxKeys": max_keys}
    if start_after:
        kwargs["StartAfter"] = start_after
    try:
        resp = b.s3.list_objects_v2(**kwargs)
    except (ClientError, BotoCoreError) as exc:
        raise tier2_error("LIST", f"{b.prefix}* after {start_after!r}", exc) from None
    objects = resp.get("Contents", [])
    return ListedPage(objects, bool(resp.get("IsTruncated")) and bool(objects))


def put_bytes(b: Bucket, key: str, body: bytes, metadata: dict[str, str]) -> None:
    """One PUT with a CRC32C the server checks."""
    try:
        b.s3.put_object(Bucket=b.name, Key=key, Body=body, Metadata=metadata, ChecksumAlgorithm="CRC32C")
    except (ClientError, BotoCoreError) as exc:
        raise tier2_error("PUT", key, exc) from None


def abort_upload(b: Bucket, key: str, upload_id: str) -> None:
    """Abort a multipart upload (GC's sweep of stale ones)."""
    try:
        b.s3.abort_multipart_upload(Bucket=b.name, Key=key, UploadId=upload_id)
    except (ClientError, BotoCoreError) as exc:
        raise tier2_error("abort upload", key, exc) from None
