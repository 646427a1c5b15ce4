"""The one translation of S3 failures (tier2/errors.py): each error code or botocore exception to its
Tier2Error class and message (operation and key, never credentials), and the bucket check's wording."""
from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, SSLError

from tiering.errors import Tier2Error
from tiering.tier2.errors import (Denied, NoCredentials, NoSuchBucket, NotFound, PreconditionFailed, ShortObject,
                                  TlsRefused, Unreachable, bucket_unavailable, error_class, tier2_error)


def client_error(code: str, message: str = "") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, "GetObject")


@pytest.mark.parametrize("code,cls", [("NoSuchKey", NotFound), ("404", NotFound), ("NotFound", NotFound),
                                      ("NoSuchBucket", NoSuchBucket), ("InvalidRange", ShortObject),
                                      ("AccessDenied", Denied), ("403", Denied), ("SlowDown", Tier2Error),
                                      ("PreconditionFailed", PreconditionFailed), ("412", PreconditionFailed),
                                      ("ConditionalRequestConflict", PreconditionFailed)])
def test_codes_map_to_classes(code, cls):
    err = tier2_error("GET", "p/k", client_error(code, "said so"))
    assert type(err) is cls and isinstance(err, Tier2Error)
    assert str(err) == f"S3 GET of 'p/k' failed: {code} said so"
    assert error_class(code) is cls


def test_a_code_without_a_message_says_the_code_only():
    err = tier2_error("list uploads", "x/t", ClientError({"Error": {"Code": "NoSuchBucket", "Message": None}}, "List"))
    assert isinstance(err, NoSuchBucket) and str(err) == "S3 list uploads of 'x/t' failed: NoSuchBucket"


def test_botocore_exceptions_map_to_classes():
    creds = tier2_error("PUT", "k", NoCredentialsError())
    assert isinstance(creds, NoCredentials) and "no usable S3 credentials (NoCredentialsError)" in str(creds)
    assert "AWS_ACCESS_KEY_ID" in str(creds) and "ENDPOINT_URL" not in str(creds)
    tls = tier2_error("PUT", "k", SSLError(endpoint_url="https://s3", error="bad cert"))
    assert isinstance(tls, TlsRefused) and "TIERING_S3_CA_BUNDLE" in str(tls)
    down = tier2_error("PUT", "k", EndpointConnectionError(endpoint_url="https://s3"))
    assert isinstance(down, Unreachable) and str(down) == "S3 PUT of 'k' failed: EndpointConnectionError"
    other = tier2_error("GET", "k", OSError("reset"))
    assert type(other) is Tier2Error and str(other) == "S3 GET of 'k' failed: OSError: reset"


@pytest.mark.parametrize("exc,says", [
    (client_error("404"), "tier 2 is unavailable: bucket 'b' does not exist"),
    (client_error("NoSuchBucket"), "tier 2 is unavailable: bucket 'b' does not exist"),
    (client_error("403"), "tier 2 is unavailable: access to bucket 'b' is denied"),
    (NoCredentialsError(), "tier 2 is unavailable: no usable S3 credentials (NoCredentialsError)"),
    (SSLError(endpoint_url="https://s3", error="x"), "tier 2 is unreachable: the S3 endpoint's TLS certificate"),
    (EndpointConnectionError(endpoint_url="https://s3"),
     "tier 2 is unreachable: the S3 endpoint did not answer (EndpointConnectionError); check TIERING_S3_ENDPOINT"),
    (client_error("SlowDown", "wait"), "S3 HEAD bucket of 'b' failed: SlowDown wait"),
])
def test_bucket_unavailable(exc, says):
    err = bucket_unavailable("b", exc)
    assert isinstance(err, Tier2Error) and str(err).startswith(says)
