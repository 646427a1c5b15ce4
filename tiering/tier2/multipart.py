"""One multipart upload's lifecycle, written once: create, parts (uploaded, or copied server-side from a
byte range of another object), complete; aborted on any failure; S3 errors mapped to `Tier2Error`.

    with MultipartUpload(bucket, key, metadata, "defrag upload") as up:
        up.upload(body)
        up.copy(source_key, offset, length)
        up.complete()
"""
from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError

from tiering.tier2.objects import Bucket, completed_part, error_code, tier2_error


class MultipartUpload:
    def __init__(self, b: Bucket, key: str, metadata: dict[str, str], op: str):
        self.b, self.key, self.metadata, self.op = b, key, metadata, op
        self.parts: list[dict] = []
        self.upload_id: str | None = None
        self.completed = False

    def __enter__(self) -> MultipartUpload:
        b = self.b
        self.upload_id = b.s3.create_multipart_upload(Bucket=b.name, Key=self.key, Metadata=self.metadata,
                                                      ChecksumAlgorithm="CRC32C")["UploadId"]
        return self

    def upload(self, body: bytes) -> None:
        n = len(self.parts) + 1
        resp = self.b.s3.upload_part(Bucket=self.b.name, Key=self.key, UploadId=self.upload_id, PartNumber=n,
                                     Body=body, ChecksumAlgorithm="CRC32C")
        self.parts.append(completed_part(n, resp))

    def copy(self, source_key: str, offset: int, length: int) -> bool:
        """UploadPartCopy of bytes [offset, offset+length) of `source_key`; False when the server cannot find
        a source whose key holds '%'.

        Keys percent-encode topics (`acc/big` -> `acc%2Fbig`), and Ceph RGW 16 decodes UploadPartCopy's copy
        source twice, so it looks for `acc/big/...` and answers NoSuchKey (its CopyObject decodes once). The
        caller then downloads those bytes instead; a source that is really missing fails there."""
        n = len(self.parts) + 1
        try:
            resp = self.b.s3.upload_part_copy(Bucket=self.b.name, Key=self.key, UploadId=self.upload_id, PartNumber=n,
                                              CopySourceRange=f"bytes={offset}-{offset + length - 1}",
                                              CopySource={"Bucket": self.b.name, "Key": source_key})
        except ClientError as exc:
            if "%" in source_key and error_code(exc) in ("NoSuchKey", "404"):
                return False
            raise
        self.parts.append(completed_part(n, resp["CopyPartResult"]))
        return True

    def complete(self) -> None:
        self.b.s3.complete_multipart_upload(Bucket=self.b.name, Key=self.key, UploadId=self.upload_id,
                                            MultipartUpload={"Parts": self.parts})
        self.completed = True

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            return
        if not self.completed:
            try:
                self.b.s3.abort_multipart_upload(Bucket=self.b.name, Key=self.key, UploadId=self.upload_id)
            except (ClientError, BotoCoreError):
                pass  # GC's sweep of stale uploads aborts it later
        if isinstance(exc, (ClientError, BotoCoreError)):
            raise tier2_error(self.op, self.key, exc) from None
