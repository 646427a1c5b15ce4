"""What a failed S3 request means, in one place: botocore's exceptions and S3's error codes translated to
`Tier2Error`s whose message names the operation and key, never credentials (as s3fs's
`translate_boto_error` turns them into OSErrors). Callers tell outcomes apart by class (`NotFound`,
`ShortObject`, ...), not by comparing error codes themselves."""
from __future__ import annotations

from botocore.exceptions import (BotoCoreError, ClientError, CredentialRetrievalError, NoCredentialsError,
                                 PartialCredentialsError, SSLError)

from tiering.errors import Tier2Error
from tiering.tier2.breaker import RecentlyTimedOut


class NotFound(Tier2Error):
    """The object does not exist (or, answering a HEAD of the bucket, the bucket)."""


class NoSuchBucket(Tier2Error):
    """The bucket does not exist: an outage, never a missing object."""


class ShortObject(Tier2Error):
    """The range asked for starts past the object's end."""


class PreconditionFailed(Tier2Error):
    """A conditional request's condition did not hold: `If-Match` met another ETag (the object was replaced),
    `If-None-Match: *` met an object already there."""


class Denied(Tier2Error):
    """The credentials may not do this."""


class NoCredentials(Tier2Error):
    """botocore found no usable credentials: the endpoint was never asked."""


class TlsRefused(Tier2Error):
    """The TLS handshake failed: nothing was sent, and nothing is retried in plain text."""


class Unreachable(Tier2Error):
    """The endpoint did not answer (connection refused, timeout, ...)."""


# S3 error codes by meaning. Servers differ in which they send: a GET of a missing key answers NoSuchKey, a
# HEAD has no body so botocore names its status (404), some servers say NotFound.
_BY_CODE: dict[str, type[Tier2Error]] = {
    "NoSuchKey": NotFound, "404": NotFound, "NotFound": NotFound,
    "NoSuchBucket": NoSuchBucket,
    "InvalidRange": ShortObject,
    "AccessDenied": Denied, "403": Denied, "Forbidden": Denied,
    # 409 ConditionalRequestConflict: AWS's answer to a conditional PUT racing another one on the same key
    "PreconditionFailed": PreconditionFailed, "412": PreconditionFailed,
    "ConditionalRequestConflict": PreconditionFailed,
}

# botocore's "no usable credentials" errors: the endpoint was never asked, so the message must not send the
# operator to TIERING_S3_ENDPOINT_URL
_CREDENTIALS = (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)
CREDENTIALS_HINT = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile or role boto3 finds)"
TLS_HINT = ("the S3 endpoint's TLS certificate could not be verified (SSLError): check TIERING_S3_CA_BUNDLE "
            "and TIERING_S3_ENDPOINT_URL")


def error_class(code: str | None) -> type[Tier2Error]:
    """The Tier2Error class of an S3 error code (a ClientError's, or a DeleteObjects answer's per key)."""
    return _BY_CODE.get(str(code), Tier2Error)


def tier2_error(op: str, key: str, exc: BaseException) -> Tier2Error:
    """The Tier2Error of `exc`, raised by S3 operation `op` on `key`; its `detail` is the message without
    the operation and key."""
    cls: type[Tier2Error] = Tier2Error
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        # a server may answer a code with no message: botocore then gives None, not an empty string
        cls, detail = error_class(err.get("Code")), f"{err.get('Code')} {err.get('Message') or ''}".rstrip()
    elif isinstance(exc, _CREDENTIALS):
        cls, detail = NoCredentials, f"no usable S3 credentials ({type(exc).__name__}): {CREDENTIALS_HINT}"
    elif isinstance(exc, SSLError):
        cls, detail = TlsRefused, TLS_HINT
    elif isinstance(exc, RecentlyTimedOut):
        cls, detail = Unreachable, str(exc)  # its own sentence: why nothing was sent
    elif isinstance(exc, BotoCoreError):
        cls, detail = Unreachable, type(exc).__name__
    else:
        detail = f"{type(exc).__name__}: {exc}"
    error = cls(f"S3 {op} of {key!r} failed: {detail}")
    error.detail = detail
    return error


def bucket_unavailable(bucket: str, exc: BaseException) -> Tier2Error:
    """Why tier 2 cannot be used at all, from the failure of a HEAD of its bucket."""
    error = tier2_error("HEAD bucket", bucket, exc)
    if isinstance(error, (NotFound, NoSuchBucket)):
        return Tier2Error(f"tier 2 is unavailable: bucket {bucket!r} does not exist")
    if isinstance(error, Denied):
        return Tier2Error(f"tier 2 is unavailable: access to bucket {bucket!r} is denied")
    if isinstance(error, NoCredentials):
        return Tier2Error(f"tier 2 is unavailable: {error.detail}")
    if isinstance(error, TlsRefused):
        return Tier2Error(f"tier 2 is unreachable: {error.detail}")
    if isinstance(error, Unreachable):
        return Tier2Error(f"tier 2 is unreachable: the S3 endpoint did not answer ({error.detail}); "
                          f"check TIERING_S3_ENDPOINT_URL")
    return error
