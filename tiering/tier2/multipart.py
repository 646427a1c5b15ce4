"""One object written to S3 in parts: the only owner of CreateMultipartUpload, UploadPart, UploadPartCopy,
CompleteMultipartUpload and AbortMultipartUpload in the product (offload, batch offload and defrag all
write through it).

    with MultipartUpload(bucket, key=key, metadata=md, op="offload upload", part_size=bs, concurrency=4,
                         hook=step) as up:
        offset = up.size
        up.write(block)                        # buffered into parts of at least part_size
        up.copy(source_key, start, length)     # a server-side copied part
        up.finish()                            # complete (or one PUT), returns the object's length

Parts: bytes written are cut into parts of at least `part_size` (S3's 5 MiB minimum but for the last), each
shipped as soon as it is full, but for one: with `expected_size` (the caller's estimate of the object's
length), a full part after which less than 5 MiB is expected waits for that tail and goes with it, one part
fewer (a small last part sent after the large ones waits behind them at the server: a 16 MiB offload's
60 KiB tail took as long as an 8 MiB part, docs/performance.md). An object whose bytes never fill one part
is ONE PutObject at `finish` instead of create + part + complete (s3transfer's threshold habit; the bytes
are the same). Up to `concurrency` parts upload at once, in any order; memory stays within (concurrency + 1)
parts and 5 MiB. The upload is created at the first shipped part, and its abort is armed the moment its id
exists (as s3transfer's CreateMultipartUploadTask registers its cleanup): any failure after that, in any
part, at complete, in the caller's code inside the `with`, or an interrupt, cancels the parts not started,
waits for the running ones (no part may land after the abort), aborts the upload (best effort: GC's sweep
of stale uploads is the safety net), and maps S3 errors to `Tier2Error` (operation and key, never
credentials).

Every part carries a CRC32C checksum, which AWS S3 verifies; other servers may ignore it (Ceph RGW 16
accepts a wrong one), so readers check page CRCs themselves. A part's CRC is computed here, in one pass that
releases the GIL, and sent as the header: botocore's own pass reads the body through 1 MiB copies (8 MiB: 4
against 0.6 ms). botocore still reads each part twice (the SigV4 payload SHA-256 over plain HTTP, then the
send): `_PartBody` hands it views of the written buffers, neither joined nor copied.

Hook: `hook(name)` at "initiated" (upload created), "part" (a part stored; from the part's thread) and
"completed" (object complete), so fault tests can fail or kill the process exactly there.

Limiter (tiering/tier2/throttle.py): each uploaded part, and the single PUT, first waits for its turn (start
times are paced; the request then goes at link speed).

Gate: a caller whose right to write the key is still being decided (offload's begin transaction, run beside
the packing of the first part) passes a `Gate`. The upload is created only once `owned()` returned (GC
aborts no upload of a live attempt: the lock must be held before the upload exists). Nothing becomes
visible before the gate opens: `wait()` comes
before the completion, the single PUT and every part but the first; the first part only asks `check()`
(fails at once if the claim already failed, never blocks). An upload in progress is not an object: a
listing does not show it, and if the process dies before the completion GC's sweep of stale uploads aborts
it. So at most one part is spent on a claim that is lost.

`start()` creates the upload at once, in the background, for a caller that knows the object needs more than
one part: the creation's round trip overlaps the packing of the first part.
"""
from __future__ import annotations

import base64
from bisect import bisect_right
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from itertools import accumulate
from typing import Callable, Protocol

from botocore.exceptions import BotoCoreError, ClientError
from crc32c import crc32c

from tiering.errors import BadInput, CorruptObjectError
from tiering.format.block import MIN_BLOCK_SIZE
from tiering.model import INT32_MAX, MIB
from tiering.tier2.errors import NotFound, PreconditionFailed, tier2_error
from tiering.tier2.objects import Bucket, completed_part, composite_etag
from tiering.tier2.throttle import RateLimiter

MAX_PARTS = 10_000  # S3's limit on parts of one multipart upload


def part_size_for(configured: int, expected_bytes: int) -> int:
    """The part (block) size for an object of about `expected_bytes`: the configured one, or, when that would
    take more than half of S3's 10,000 parts, the smallest whole MiB that takes at most half (blocks are cut
    at entry boundaries, so two blocks in a row always hold more than one block's bytes: at most twice as
    many parts as full ones), at most 2 GiB - 1 (the index's int32). As s3transfer raises its chunk size
    for a large file, instead of failing at part 10,001 after uploading 10,000."""
    need = -(-expected_bytes // (MAX_PARTS // 2 - 1))
    if need <= configured:
        return configured
    return min(INT32_MAX, -(-need // MIB) * MIB)
MIN_PART_SIZE = MIN_BLOCK_SIZE  # S3's minimum size of a part but the last

# Called at named steps ("initiated", "part", "completed", and the callers' own) so fault tests can fail or
# kill the process exactly there; None in production.
StepHook = Callable[[str], None] | None


class Gate(Protocol):
    """The caller's claim on the key (see the module's docstring)."""

    def check(self) -> None:
        """Raise if the claim already failed; never blocks."""

    def wait(self) -> None:
        """Block until the claim landed; raise if it failed."""

    def owned(self) -> None:
        """Block until the upload may exist: the caller holds what shows GC the upload is a live worker's (an
        offload's attempt lock), or its claim failed (raises). Comes before the upload's creation."""


class MultipartUpload:
    def __init__(self, b: Bucket, *, key: str, metadata: dict[str, str], op: str, part_size: int = MIN_PART_SIZE,
                 concurrency: int = 1, hook: StepHook = None, limiter: RateLimiter | None = None,
                 gate: Gate | None = None, expected_size: int = 0):
        if part_size < MIN_PART_SIZE:
            raise BadInput(f"part size {part_size} is below S3's 5 MiB minimum part size")
        if concurrency < 1:
            raise BadInput("upload concurrency must be at least 1")
        self.b, self.key, self.metadata, self.op = b, key, metadata, op
        self.part_size, self.concurrency = part_size, concurrency
        self._step = hook or (lambda _name: None)
        self._limiter = limiter  # uploaded bytes (parts, the single PUT) wait for it; server-side copies do not
        self._gate = gate
        self._expected = expected_size  # a hint (0: none): only where the last full part is cut depends on it
        self.upload_id: str | None = None
        self._creating: Future | None = None  # start()'s creation, until a part needs its id
        self.size = 0  # bytes written or copied so far: the offset in the object of the next write
        self.parts = 0  # parts shipped (1 for a single PUT)
        self._pending: list = []  # buffers written, not yet shipped
        self._pending_len = 0
        self._done: dict[int, dict] = {}  # part number -> CompleteMultipartUpload entry
        self._inflight: set[Future] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._finished = False
        self.etag: str | None = None  # the object's, once finish() completed it

    def __enter__(self) -> MultipartUpload:
        return self

    @property
    def multipart(self) -> bool:
        """Whether the object goes as a multipart upload: created or being created (a part shipped or copied
        created it first)."""
        return self.upload_id is not None or self._creating is not None

    def start(self) -> None:
        """Create the upload now, in the background (for an object known to need more than one part)."""
        if self.upload_id is None and self._creating is None:
            self._creating = self._executor().submit(self._create)

    # ------------------------------------------------------------------------------------------ writing
    def write(self, data: bytes) -> None:
        """Append bytes to the object; ships a part once `part_size` bytes are pending. Kept by reference
        until sent: a buffer other than `bytes` (which may change after the call) is copied."""
        if data:
            data = data if type(data) is bytes else bytes(data)  # its length in bytes, too
            if self._pending_len >= self.part_size and self._pending_len + len(data) >= self.part_size + MIN_PART_SIZE:
                self._ship()  # the part held for a tail: what comes is no small tail
            self._pending.append(data)
            self._pending_len += len(data)
            self.size += len(data)
        if self._pending_len >= self.part_size and not self._tail_follows():
            self._ship()

    def copy(self, source_key: str, offset: int, length: int, if_match: str | None = None) -> bool:
        """A part that is bytes [offset, offset+length) of `source_key`, copied server-side (UploadPartCopy).
        False, writing nothing, when the server cannot find a source whose key holds '%'. `if_match`: the
        source's ETag as written, sent as the copy's precondition (a server that honours it fails the copy of
        a source replaced since; Ceph RGW ignores it, so callers also HEAD the source first).

        Keys percent-encode topics (`acc/big` -> `acc%2Fbig`), and Ceph RGW 16 decodes UploadPartCopy's copy
        source twice, so it looks for `acc/big/...` and answers NoSuchKey (its CopyObject decodes once). The
        caller then downloads those bytes and writes them instead; a source really missing fails there."""
        if self._pending_len:
            if self._pending_len < MIN_PART_SIZE:
                raise BadInput(f"{self._pending_len} bytes written before a copied part: a part but the last must "
                               f"be at least 5 MiB")
            self._ship()
        n = self._next_part()
        self._wait_gate()
        self._created()
        try:
            resp = self.b.s3.upload_part_copy(Bucket=self.b.name, Key=self.key, UploadId=self.upload_id,
                                              PartNumber=n, CopySource={"Bucket": self.b.name, "Key": source_key},
                                              CopySourceRange=f"bytes={offset}-{offset + length - 1}",
                                              **({"CopySourceIfMatch": if_match} if if_match else {}))
        except ClientError as exc:
            error = tier2_error("UploadPartCopy", source_key, exc)
            if "%" in source_key and isinstance(error, NotFound):
                return False
            if if_match and isinstance(error, PreconditionFailed):
                raise CorruptObjectError(f"object {source_key}", f"bytes {offset}-{offset + length - 1}",
                                         f"it is not the object written (ETag {if_match}); not copied") from None
            raise
        self._done[n] = completed_part(n, resp["CopyPartResult"])
        self.parts = n
        self.size += length
        self._step("part")
        return True

    def finish(self) -> int:
        """Complete the object: ONE PutObject if nothing was shipped yet, else the last part and
        CompleteMultipartUpload once every part is stored. Returns the object's length."""
        if not self.multipart:
            body = self._take_pending()
            self._wait_gate()
            self._throttle(body.size)
            resp = self.b.s3.put_object(Bucket=self.b.name, Key=self.key, Body=body, Metadata=self.metadata,
                                        ChecksumAlgorithm="CRC32C", ChecksumCRC32C=body.crc32c_header())
            self.etag = resp.get("ETag") or None
            self.parts = 1
        else:
            if self._pending_len:
                self._ship()
            while self._inflight:
                self._collect()
            self._wait_gate()
            parts = [self._done[n] for n in sorted(self._done)]
            resp = self.b.s3.complete_multipart_upload(Bucket=self.b.name, Key=self.key, UploadId=self.upload_id,
                                                       MultipartUpload={"Parts": parts})
            # RGW answers the completion with an empty ETag: computed then, as the server does for HEAD's
            self.etag = resp.get("ETag") or composite_etag(parts)
        self._finished = True
        self._step("completed")
        return self.size

    # ------------------------------------------------------------------------------------------ lifecycle
    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None and not isinstance(exc, Exception):
            # interrupted (Ctrl-C): no waiting for parts in flight or for an abort, which on a link that stopped
            # answering would hold the interrupt for their retries; the upload is left as a killed process
            # leaves it (its key is queued: GC's sweep of stale uploads aborts it)
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            return
        try:
            if exc is not None or not self._finished:
                self._abort()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
        if exc is None and not self._finished:
            raise BadInput(f"{self.op} of {self.key!r}: left without finish(); the upload was aborted")
        if isinstance(exc, (ClientError, BotoCoreError)):
            raise tier2_error(self.op, self.key, exc) from None

    def _created(self) -> None:
        """The upload exists (created here, or start()'s creation has ended: its failure raises here)."""
        if self._creating is not None:
            creating, self._creating = self._creating, None
            creating.result()
        self._create()

    def _create(self) -> None:
        if self.upload_id is None:
            if self._gate is not None:
                self._gate.owned()  # (the lock's round trip overlaps the packing of the first part)
            resp = self.b.s3.create_multipart_upload(Bucket=self.b.name, Key=self.key, Metadata=self.metadata,
                                                     ChecksumAlgorithm="CRC32C")
            self.upload_id = resp["UploadId"]  # from here on, any failure aborts it
            self._step("initiated")

    def _abort(self) -> None:
        if self._creating is not None:
            wait([self._creating])  # a creation under way ends first, so the upload it makes is aborted too
            self._creating = None
        for f in self._inflight:
            f.cancel()  # parts not started never start
        if self._inflight:
            wait(self._inflight)  # the running ones end before the abort: none lands after it
        self._inflight.clear()
        if self.upload_id is not None and not self._finished:
            try:
                self.b.s3.abort_multipart_upload(Bucket=self.b.name, Key=self.key, UploadId=self.upload_id)
            except (ClientError, BotoCoreError):
                pass  # GC's sweep of stale multipart uploads aborts it later (the key is queued)

    # ------------------------------------------------------------------------------------------ parts
    def _next_part(self) -> int:
        n = self.parts + 1
        if n > MAX_PARTS:
            raise BadInput(f"{self.key!r} needs more than {MAX_PARTS} parts (more bytes than announced): raise "
                           "TIERING_BLOCK_SIZE")
        return n

    def _ship(self) -> None:
        n = self._next_part()
        if self._gate is not None:
            self._gate.check() if n == 1 else self._gate.wait()
        self._created()
        body = self._take_pending()
        self._inflight.add(self._executor().submit(self._upload_part, n, body))
        del body  # the part's bytes live in the future only (memory bound)
        self.parts = n
        while len(self._inflight) >= self.concurrency:  # bound memory: wait for any part to finish
            self._collect()

    def _collect(self) -> None:
        """Wait for any part in flight to end (parts finish in any order)."""
        done, pending = wait(self._inflight, return_when=FIRST_COMPLETED)
        self._inflight = set(pending)
        for f in done:
            n, part = f.result()  # a failed part raises here; __exit__ aborts
            self._done[n] = part

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="upload-part")
        return self._pool

    def _wait_gate(self) -> None:
        if self._gate is not None:
            self._gate.wait()

    def _throttle(self, nbytes: int) -> None:
        if self._limiter is not None:
            self._limiter.acquire(nbytes)

    def _tail_follows(self) -> bool:
        """Whether the full part pending waits for the object's tail: less than 5 MiB is expected after it. A
        wrong hint costs nothing but a part sent one write later: a write that would take the held part to
        part_size + 5 MiB ships it first (`write`), so no part grows past that but by a single write."""
        return self._expected > 0 and self._expected - self.size < MIN_PART_SIZE

    def _upload_part(self, n: int, body: _PartBody) -> tuple[int, dict]:
        self._throttle(body.size)  # in the part's thread: the writer keeps packing while a part waits
        # the checksum here too, beside the packing (crc32c releases the GIL)
        resp = self.b.s3.upload_part(Bucket=self.b.name, Key=self.key, UploadId=self.upload_id, PartNumber=n,
                                     Body=body, ChecksumAlgorithm="CRC32C", ChecksumCRC32C=body.crc32c_header())
        self._step("part")
        return n, completed_part(n, resp)

    def _take_pending(self) -> _PartBody:
        body = _PartBody(self._pending)
        self._pending, self._pending_len = [], 0
        return body


class _PartBody:
    """Buffers sent one after the other as one seekable stream whose reads are views, not copies. A stream at
    all because botocore joins a `bytes` body to the request's headers before sending (a copy of every part
    in flight); views because `io.BytesIO.read` copies each chunk, and botocore reads the body once to hash
    it and once to send it (retries seek back to 0). A read ends at a buffer's end (a short read, which
    botocore's hashing and urllib3's sending take as streams allow); read() of everything joins."""

    def __init__(self, buffers: list):
        self._views = [memoryview(b).cast("B") for b in buffers if len(b)]
        self._starts = list(accumulate((len(v) for v in self._views), initial=0))
        self._pos = 0

    @property
    def size(self) -> int:
        return self._starts[-1]

    def crc32c_header(self) -> str:
        """The x-amz-checksum-crc32c value of the bytes."""
        crc = 0
        for view in self._views:
            crc = crc32c(view, crc)
        return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")

    def read(self, size: int | None = -1):
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(self.size), b""))
        i = bisect_right(self._starts, self._pos) - 1
        if size == 0 or i >= len(self._views):
            return b""
        view, at = self._views[i], self._pos - self._starts[i]
        chunk = view[at:at + size]
        self._pos += len(chunk)
        return chunk

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, self.size)[whence]
        self._pos = max(0, min(self.size, base + offset))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True
