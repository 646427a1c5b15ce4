"""A deadline on every read of a GET's body. botocore's read timeout bounds each socket read, not a body: a
link that passes a byte every few seconds keeps one GET alive for days and a reader waiting for ever. Each
`RangeStream` read of n bytes must end within the client's read timeout plus n at MIN_BODY_RATE; one watchdog
thread per process shuts the socket of a read past its deadline, and the read takes that as a body broken
off (it goes on from the byte reached with a new ranged GET, up to its retries, then fails with
`BodyStalled`). A read that ends in time costs two dictionary operations. The responses botocore reads whole
and parses (listings) get the same deadline through `install_deadlines`; a late one fails the request, which
botocore retries as it retries a broken connection."""
from __future__ import annotations

import logging
import socket
import threading
import time
from itertools import count

from botocore.exceptions import ConnectionClosedError, HTTPClientError, ReadTimeoutError
from urllib3.exceptions import ProtocolError, ReadTimeoutError as URLLib3ReadTimeoutError

log = logging.getLogger(__name__)

MIN_BODY_RATE = 64 * 1024  # bytes per second a body must average, beyond the read timeout, for a read to go on
_TICK = 0.25  # how often the watchdog looks


class BodyStalled(HTTPClientError):  # an HTTPClientError: botocore's standard retries try a request again
    fmt = "the response body arrived slower than the read's deadline allows ({seconds:g} s for {size} bytes)"


# the operations whose response botocore reads whole before parsing it, and which can be long: a listing page
LISTINGS = ("ListObjectsV2", "ListObjects", "ListMultipartUploads", "ListParts")
_LISTING_BYTES = 1 << 20  # a page's size when the response does not say (chunked): a thousand keys and more


def deadline_seconds(s3, size: int) -> float:
    """How long a read of `size` bytes of a body may take on client `s3`."""
    timeout = getattr(getattr(getattr(s3, "meta", None), "config", None), "read_timeout", None) or 60
    return float(timeout) + size / MIN_BODY_RATE


def read_within(s3, body, size: int, read):
    """`read()` of `size` bytes of `body` (a response of client `s3`) under its deadline: what it returns, or
    BodyStalled when the watchdog shut its socket meanwhile, whatever `read()` returned or raised then (a body
    cut short by the shutdown is not the object's end)."""
    seconds = deadline_seconds(s3, size)
    token = WATCHDOG.watch(body, seconds)
    try:
        result = read()
    except BaseException:
        if WATCHDOG.done(token):
            raise BodyStalled(seconds=seconds, size=size) from None
        raise
    if WATCHDOG.done(token):
        raise BodyStalled(seconds=seconds, size=size)
    return result


class _Watchdog:
    def __init__(self):
        self._lock = threading.Lock()
        self._due: dict[int, tuple[float, object]] = {}
        self._fired: set[int] = set()
        self._ids = count()
        self._thread: threading.Thread | None = None

    def watch(self, body, seconds: float) -> int:
        token = next(self._ids)
        with self._lock:
            self._due[token] = (time.monotonic() + seconds, body)
            if self._thread is None or not self._thread.is_alive():  # (a forked child has no thread)
                self._thread = threading.Thread(target=self._run, name="tiering-body-deadlines", daemon=True)
                self._thread.start()
        return token

    def done(self, token: int) -> bool:
        """Stop watching; whether the read's socket was shut for missing its deadline."""
        with self._lock:
            self._due.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
        return False

    def _run(self) -> None:
        while True:
            time.sleep(_TICK)
            now = time.monotonic()
            with self._lock:
                late = [(t, body) for t, (deadline, body) in self._due.items() if deadline <= now]
                for t, _ in late:
                    del self._due[t]
                    self._fired.add(t)
            for _, body in late:
                _shut(body)


def install_deadlines(client) -> None:
    """Give the responses of LISTINGS a deadline as RangeStream gives body reads: a `before-send` handler
    sends the request through the client's own HTTP session (botocore's `_send`, which it then skips), asks
    for the body unread, and reads it under the watchdog. The errors are the ones botocore's session raises
    for the same failures, so its retries and error handling are unchanged."""
    session = client._endpoint.http_session  # the session botocore sends every request of this client with

    def send(request, **_):
        wanted = request.stream_output
        request.stream_output = True  # headers only: the body is read below, under a deadline
        try:
            response = session.send(request)
        finally:
            request.stream_output = wanted
        size = int(response.headers.get("content-length") or _LISTING_BYTES)
        try:
            read_within(client, response, size, lambda: response.content)  # kept: botocore parses it from there
        except URLLib3ReadTimeoutError as exc:
            raise ReadTimeoutError(endpoint_url=request.url, error=exc) from None
        except (ProtocolError, OSError) as exc:
            raise ConnectionClosedError(error=exc, request=request, endpoint_url=request.url) from None
        return response

    for op in LISTINGS:
        client.meta.events.register(f"before-send.s3.{op}", send)


def _shut(body) -> None:
    """Shut the socket under a botocore StreamingBody or AWSResponse (urllib3's response, its connection's
    socket): the blocked read returns at once, where closing the descriptor from another thread would not
    wake it."""
    raw = getattr(body, "_raw_stream", None) or getattr(body, "raw", None)
    sock = getattr(getattr(raw, "connection", None), "sock", None)
    if sock is None:
        log.warning("a read past its deadline could not be stopped: no socket under its response")
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed meanwhile: the read has ended anyway


WATCHDOG = _Watchdog()
