"""The boto3 client of tier 2 (`make_client`, over `s3_client`): endpoint, credentials, CA bundle, retries, the checksum
settings older S3-compatible servers accept, and the server-side encryption every request carries
(tier2/encryption.py)."""
from __future__ import annotations

from tiering.config import Settings
from tiering.tier2.breaker import install_breaker
from tiering.tier2.encryption import install_encryption
from tiering.tier2.stalls import install_deadlines


def make_client(settings: Settings, max_pool_connections: int = 32):
    """The boto3 S3 client of tier 2: the endpoint, credentials, CA bundle (`verify`) and encryption of the
    settings. `tiering.clients.s3_client` and the export's filesystem (tier2/arrowfs.py) both build it here."""
    client = s3_client(
        endpoint_url=settings.s3_endpoint_url, access_key=settings.aws_access_key_id,
        secret_key=settings.aws_secret_access_key, session_token=settings.aws_session_token,
        region=settings.aws_region, ca_bundle=str(settings.s3_ca_bundle) if settings.s3_ca_bundle else None,
        max_pool_connections=max_pool_connections, timeout_seconds=settings.s3_timeout_seconds)
    install_encryption(client, settings.s3_encryption, settings.s3_endpoint_url)
    return client


def s3_client(*, endpoint_url: str | None, access_key: str | None, secret_key: str | None,
              session_token: str | None, region: str | None, ca_bundle: str | None,
              max_pool_connections: int = 32, timeout_seconds: float = 60):
    """A boto3 S3 client with the product's retries, timeouts (`timeout_seconds` to connect and for each byte
    of an answer: TIERING_S3_TIMEOUT_SECONDS) and checksum settings, without encryption: what
    `make_client` builds on, and what the export uses for a conditional PUT beside pyarrow's own filesystem
    (its options give the endpoint and credentials; tier2/arrowfs.py)."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3", endpoint_url=endpoint_url, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        aws_session_token=session_token, region_name=region,
        # None: boto3's default (certifi's CAs, or AWS_CA_BUNDLE); never False: TLS is verified or refused
        verify=ca_bundle,
        # checksums only when an operation requires them: older S3-compatible servers (Ceph RGW 16) neither
        # return nor verify the newer flexible checksums, and the readers check every page themselves
        config=Config(max_pool_connections=max_pool_connections, retries={"max_attempts": 5, "mode": "standard"},
                      connect_timeout=timeout_seconds, read_timeout=timeout_seconds,
                      request_checksum_calculation="when_required", response_checksum_validation="when_required"),
    )
    # over https botocore sends a checksummed upload as `aws-chunked` with the checksum in a trailer and no
    # Content-Length, which Ceph RGW 16 refuses (411 MissingContentLength); our bodies are bytes in memory
    # (botocore wraps them in a BytesIO), so the checksum goes in a header as it does over http
    for op in ("PutObject", "UploadPart"):
        client.meta.events.register(f"before-call.s3.{op}", _checksum_in_header)
    install_deadlines(client)  # a listing page dripping in never trips the read timeout (tier2/stalls.py)
    install_breaker(client)  # a link that stopped answering costs one request's timeouts, not each one's
    return client


SUPPLIED_CHECKSUM = "x-amz-checksum-crc32c"  # the header tier2/multipart.py computes and sends itself


def _checksum_in_header(params, **_):
    context = params.get("context", {})
    algorithm = context.get("checksum", {}).get("request_algorithm")
    body = params.get("body")
    if isinstance(algorithm, dict) and algorithm.get("in") == "trailer" and (
            isinstance(body, (bytes, bytearray)) or hasattr(body, "seekable") and body.seekable()):
        algorithm["in"] = "header"
    elif algorithm is None and SUPPLIED_CHECKSUM in params.get("headers", {}):
        # A checksum the caller computed makes botocore leave the request's checksum context empty, and its
        # signer then hashes the whole body (SigV4's payload SHA-256) even over https, where a checksum header
        # lets it send UNSIGNED-PAYLOAD. Recorded as botocore records its own: it computes nothing again.
        context.setdefault("checksum", {})["request_algorithm"] = {"algorithm": "crc32c", "in": "header",
                                                                   "name": SUPPLIED_CHECKSUM}
