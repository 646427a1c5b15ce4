"""Small S3 operations shared by the offloader, defrag, GC and the readers, on a `Bucket` (client, bucket,
prefix), their failures translated by tier2/errors.py. The client itself is built in tier2/client.py."""
from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Iterable, Iterator

from botocore.exceptions import BotoCoreError, ClientError

from tiering.errors import CorruptObjectError, DataLossError
from tiering.tier2.errors import NotFound, PreconditionFailed, ShortObject, bucket_unavailable, error_class, tier2_error
from tiering.tier2.breaker import gave_up
from tiering.tier2.stalls import read_within

log = logging.getLogger(__name__)
# how many times one read goes on after its body broke off mid-way (RangeStream, and get_range through it)
BODY_RETRIES = 3
# once a body broke off, it is read on in pieces this size, each under its own deadline: what arrived before
# a cut is kept (a read of n bytes in one call loses all of it), so a link slower than a whole read's deadline
# still gets through, one piece after another
RESUMED_PIECE = 64 * 1024


@dataclass(frozen=True)
class Bucket:
    """The S3 client, bucket and key prefix of tier 2, passed to every operation."""

    s3: object
    name: str
    prefix: str


def completed_part(part_number: int, resp: dict) -> dict:
    """A CompleteMultipartUpload entry from an UploadPart answer. The part's CRC32C goes along only when the
    server returned one: AWS requires it back for an upload created with a checksum algorithm, while
    servers without S3's flexible checksums (Ceph RGW 16, older MinIO) answer with the ETag alone."""
    part = {"PartNumber": part_number, "ETag": resp["ETag"]}
    if resp.get("ChecksumCRC32C"):
        part["ChecksumCRC32C"] = resp["ChecksumCRC32C"]
    return part


def get_range(b: Bucket, key: str, start: int, length: int) -> bytes:
    """Bytes [start, start+length) of an object, read whole by a `RangeStream` (its checks and its going on
    after a broken body): a short read is an error, not a silent truncation."""
    if length <= 0:
        return b""
    stream = RangeStream(b, key, start, length)
    try:
        return stream.read(length)
    finally:
        stream.close()


def read_object(b: Bucket, key: str, max_bytes: int | None = None) -> bytes | None:
    """A small object whole in one GET (at most `max_bytes`, when given: the caller tells a longer one by
    its length), or None when it does not exist. For objects whose length is not known beforehand (an index
    the sweep found, a trim marker); reads of known ranges use `get_range`."""
    try:
        body = b.s3.get_object(Bucket=b.name, Key=key)["Body"]
    except (ClientError, BotoCoreError) as exc:
        error = tier2_error("GET", key, exc)
        if isinstance(error, NotFound):
            return None
        raise error from None
    try:
        return body.read(max_bytes) if max_bytes is not None else body.read()
    except (BotoCoreError, OSError) as exc:
        raise tier2_error("GET", key, exc) from None
    finally:
        body.close()


def _read_error(key: str, exc: BaseException) -> Exception:
    """A GET of bytes the metadata says are there: an object missing is data loss; one that ends before the
    range asked for is cut short, corrupt, as a body ending early is (RangeStream), wherever the read began."""
    error = tier2_error("GET", key, exc)
    if isinstance(error, NotFound):
        return DataLossError(f"tier-2 object {key!r} is missing")
    if isinstance(error, ShortObject):
        return CorruptObjectError("object", repr(key), "it ends before the range asked for (object shorter than "
                                  "metadata says)")
    return error


class RangeStream:
    """One GET of [start, start+length) of an object, read in consecutive pieces as the bytes arrive: a scan
    at the speed of one streaming GET, with memory bounded by what the caller holds. Each `read(n)` returns
    exactly n bytes or raises (a short body is CorruptObjectError, a broken connection Tier2Error, a
    missing object DataLossError). `close()` drops the rest (the connection is discarded).

    A body broken off mid-way (a link reset, a read timeout: botocore retries a request, not the body of a
    response it returned) goes on from the byte reached with a new ranged GET, up to BODY_RETRIES times per
    stream, as s3transfer's downloads do; the new GET asks `If-Match` the first one's ETag, so an object
    replaced in between fails the read (CorruptObjectError) instead of mixing two objects' bytes."""

    def __init__(self, b: Bucket, key: str, start: int, length: int):
        self.b, self.key, self.start, self.left = b, key, start, length
        self.etag: str | None = None
        self.resumed = 0
        self._opened = 0.0  # when the last GET's answer came: a body that stalls after it got no answer since
        self._body = self._open() if length > 0 else None

    def _open(self):
        match = {"IfMatch": self.etag} if self.etag else {}
        try:
            resp = self.b.s3.get_object(Bucket=self.b.name, Key=self.key,
                                        Range=f"bytes={self.start}-{self.start + self.left - 1}", **match)
        except (ClientError, BotoCoreError) as exc:
            if match and isinstance(tier2_error("GET", self.key, exc), PreconditionFailed):
                raise CorruptObjectError("object", f"{self.key} from byte {self.start}",
                                         "it was replaced while being read (its ETag changed)") from None
            raise _read_error(self.key, exc) from None
        self.etag = self.etag or resp.get("ETag")
        self._opened = time.monotonic()
        return resp["Body"]

    def read(self, n: int) -> bytes:
        if n <= 0:
            return b""
        if n > self.left:
            raise ValueError(f"read of {n} bytes past the range's end ({self.left} left)")
        pieces, got = [], 0
        while got < n:
            want = min(n - got, RESUMED_PIECE) if self.resumed else n - got
            try:
                data = read_within(self.b.s3, self._body, want, lambda: self._body.read(want))
            except (BotoCoreError, OSError) as exc:  # the connection broke mid-body (urllib3's errors are OSErrors)
                self._resume(exc)  # BodyStalled (a BotoCoreError) too: the body came too slowly
                continue
            if not data:
                break
            pieces.append(data)
            got += len(data)
            self.left -= len(data)
            self.start += len(data)
        if got != n:
            raise CorruptObjectError("object", f"{self.key} from byte {self.start}",
                                     f"the body ended {self.left} bytes early (object shorter than metadata says)")
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _resume(self, exc: BaseException) -> None:
        self._body.close()
        if self.resumed == BODY_RETRIES:
            gave_up(self.b.s3, exc, self._opened)
            raise tier2_error("GET", self.key, exc) from None
        self.resumed += 1
        log.warning("GET of %r broke off at byte %d (%s); going on from there", self.key, self.start,
                    type(exc).__name__)
        self._body = self._open()

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
    except (ClientError, BotoCoreError) as exc:
        raise bucket_unavailable(b.name, exc) from None


def object_length(b: Bucket, key: str) -> int | None:
    """The object's length by HEAD, or None when it does not exist."""
    found = object_head(b, key)
    return None if found is None else found[0]


def object_head(b: Bucket, key: str) -> tuple[int, str | None] | None:
    """The object's (length, ETag) by HEAD, or None when it does not exist."""
    try:
        head = b.s3.head_object(Bucket=b.name, Key=key)
        return int(head["ContentLength"]), head.get("ETag")
    except (ClientError, BotoCoreError) as exc:
        error = tier2_error("HEAD", key, exc)
        if isinstance(error, NotFound):
            return None
        raise error from None


def object_metadata(b: Bucket, key: str) -> dict[str, str] | None:
    """The object's user metadata by HEAD, or None when it does not exist."""
    try:
        return dict(b.s3.head_object(Bucket=b.name, Key=key).get("Metadata") or {})
    except (ClientError, BotoCoreError) as exc:
        error = tier2_error("HEAD", key, exc)
        if isinstance(error, NotFound):
            return None
        raise error from None


def delete_keys(b: Bucket, keys: Iterable[str], unanswered_raises: bool = False) -> list[str]:
    """Delete keys (missing ones count as deleted) and abort their multipart uploads.
    Returns the keys that could not be deleted. `unanswered_raises`: a request S3 never answered (the link
    broke, a timeout: botocore's own errors, not S3's) raises `Unreachable` instead of counting its keys as
    not deleted, for a caller that counts refusals against the keys (GC's attempts)."""
    def unanswered(op: str, key: str, exc: Exception) -> None:
        if unanswered_raises and isinstance(exc, BotoCoreError):
            raise tier2_error(op, key, exc) from None

    keys = sorted(set(keys))
    failed: list[str] = []
    for i in range(0, len(keys), 1000):
        batch = keys[i:i + 1000]
        try:
            resp = b.s3.delete_objects(Bucket=b.name, Delete={"Objects": [{"Key": k} for k in batch],
                                                                "Quiet": True})
            failed += [e["Key"] for e in resp.get("Errors", []) if error_class(e.get("Code")) is not NotFound]
        except (ClientError, BotoCoreError) as exc:
            unanswered("DELETE", batch[0], exc)
            failed += batch
    if keys:
        # One listing under the keys' common prefix, not one per key: uploads in flight are few, keys many.
        wanted = set(keys)
        try:
            for up in list_uploads(b, os.path.commonprefix(keys)):
                if up["Key"] in wanted:
                    try:
                        b.s3.abort_multipart_upload(Bucket=b.name, Key=up["Key"], UploadId=up["UploadId"])
                    except (ClientError, BotoCoreError) as exc:
                        unanswered("abort of the upload", up["Key"], exc)
                        failed.append(up["Key"])
        except (ClientError, BotoCoreError) as exc:
            unanswered("list of uploads", os.path.commonprefix(keys), exc)
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


def composite_etag(parts: list[dict]) -> str | None:
    """The ETag S3, Ceph RGW and MinIO give a completed multipart object (what HEAD answers): the MD5 of its
    parts' binary MD5s, then "-" and their count. RGW answers CompleteMultipartUpload with an empty ETag, so
    the upload computes it. None when a part's ETag is not 16 bytes in hex. A server that derives the
    object's ETag otherwise (with KMS encryption, say) answers HEAD with another one: delete-lagged then
    checks that ledger's copy once and records HEAD's."""
    try:
        digests = [bytes.fromhex(p["ETag"].strip('"')) for p in parts]
    except ValueError:
        return None
    if not digests or any(len(d) != 16 for d in digests):
        return None
    return f'"{hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest()}-{len(digests)}"'


def put_bytes(b: Bucket, key: str, body: bytes, metadata: dict[str, str], content_type: str | None = None) -> str | None:
    """One PUT with a CRC32C the server checks. Returns the object's ETag (None: the server gave none)."""
    typed = {"ContentType": content_type} if content_type else {}
    try:
        return b.s3.put_object(Bucket=b.name, Key=key, Body=body, Metadata=metadata, ChecksumAlgorithm="CRC32C",
                               **typed).get("ETag") or None
    except (ClientError, BotoCoreError) as exc:
        raise tier2_error("PUT", key, exc) from None


def abort_upload(b: Bucket, key: str, upload_id: str) -> bool:
    """Abort a multipart upload (GC's sweep of stale ones); False when it was gone already (completed, or
    aborted by another GC run since it was listed): the work is done either way."""
    try:
        b.s3.abort_multipart_upload(Bucket=b.name, Key=key, UploadId=upload_id)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "NoSuchUpload":
            return False
        raise tier2_error("abort upload", key, exc) from None
    except BotoCoreError as exc:
        raise tier2_error("abort upload", key, exc) from None
    return True
