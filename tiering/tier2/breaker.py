"""A client whose request timed out after all its retries answers its next requests at once, for as long as
its read timeout, instead of sending each into the same silence. A link that passes nothing back (a
black-holed route, a gateway that accepts and never answers) costs every request its retries times the
timeout: about five minutes. A run's requests come one after another, so without this an offload of a
hundred ledgers, or a delete-lagged of a thousand copies, would wait that long for each; with it the first
request waits, the rest fail within milliseconds with a line that says why, and the run ends (an offload
reports the ledgers it did not attempt). Once the pause is over the next request is sent again: a link that
came back is used at once.

Only timeouts trip it (the connection, the first byte of an answer, or a body past its deadline), and only
when no other request of the client got an answer since the one that timed out was sent: a refused
connection or an error answer fails fast anyway, and a server that answers is not down (one stuck object, on
a placement group that is not active, say, fails alone while the requests around it are answered). An
answer that arrives during the pause (a request sent before it) ends it."""
from __future__ import annotations

import threading
import time

from botocore.exceptions import BotoCoreError, ConnectTimeoutError, ReadTimeoutError

from tiering.tier2.stalls import BodyStalled

TIMEOUTS = (ConnectTimeoutError, ReadTimeoutError, BodyStalled)
_SENT = "tiering_sent"  # in a request's context: when it was sent (its first try)


class RecentlyTimedOut(BotoCoreError):
    """Not sent: the client's last request timed out after all its retries, moments ago."""
    fmt = ("not sent: tier 2 timed out {ago:.0f} s ago ({cause} after all retries); "
           "requests wait {pause:g} s before trying it again")


class _Breaker:
    def __init__(self, pause: float):
        self.pause = pause
        self._lock = threading.Lock()
        self._since: float | None = None
        self._cause = ""
        self._answered: float | None = None  # when a request of the client last got an answer

    def answered(self) -> None:
        with self._lock:
            self._answered, self._since = time.monotonic(), None

    def timed_out(self, exc: BaseException, sent: float) -> None:
        """`exc` ended a request (or a body's read) begun at `sent` (time.monotonic())."""
        if isinstance(exc, TIMEOUTS):
            with self._lock:
                if self._answered is None or self._answered < sent:
                    self._since, self._cause = time.monotonic(), type(exc).__name__

    def check(self) -> None:
        with self._lock:
            since, cause = self._since, self._cause
        if since is None:
            return
        ago = time.monotonic() - since
        if ago < self.pause:
            raise RecentlyTimedOut(ago=ago, cause=cause, pause=self.pause)


def install_breaker(client) -> None:
    """Trip on a request of `client` that ended in a timeout after botocore's retries (`after-call-error`,
    which comes once they are spent) when no answer came for as long (`after-call`: any HTTP answer, an
    error's too); while tripped, refuse its requests before they are signed or sent (`before-call`). Also
    `gave_up(client, exc, sent)` for a body read that gave up on its own retries."""
    breaker = _Breaker(float(client.meta.config.read_timeout or 60))
    client._tiering_breaker = breaker

    def before_call(context, **_):
        breaker.check()
        context[_SENT] = time.monotonic()

    def after_call_error(exception, context, **_):
        breaker.timed_out(exception, context.get(_SENT, time.monotonic()))
    client.meta.events.register("before-call.s3", before_call)
    client.meta.events.register("after-call.s3", lambda **_: breaker.answered())
    client.meta.events.register("after-call-error.s3", after_call_error)


def gave_up(client, exc: BaseException, sent: float) -> None:
    """A read of a body, begun at `sent`, gave up on `exc` after its own retries (they are not botocore's): a
    timeout trips the client's breaker as a request's would. A client without one (built outside `s3_client`)
    is left be."""
    breaker = getattr(client, "_tiering_breaker", None)
    if breaker is not None:
        breaker.timed_out(exc, sent)
