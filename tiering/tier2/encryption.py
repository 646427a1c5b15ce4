"""Server-side encryption on every request of a tier-2 client that needs it (botocore event hooks:
`install_encryption`), the check that the store applied it, and the hint that names the setting in an
error encryption may have caused."""
from __future__ import annotations

from botocore.exceptions import ClientError

from tiering.config import S3Encryption


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
                raise ClientError({"Error": {"Code": "ServerSideEncryptionNotApplied", "Message":
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
