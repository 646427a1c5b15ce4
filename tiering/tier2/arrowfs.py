"""A pyarrow filesystem over tier 2's boto3 client, for the metadata export when server-side encryption is on.

pyarrow 26's own S3FileSystem sends no encryption header (its C++ options hold an SSE-C key that its Python
binding does not expose; SSE-S3 and SSE-KMS it has not at all), so an export through it would leave Parquet
parts and the manifest unencrypted in a bucket whose every other object is encrypted, or be refused by a
bucket policy that requires encryption. Through this filesystem the export's objects are written and read by
the client `make_client` builds: the same encryption (SSE-S3, SSE-KMS, SSE-C on every read too), CA bundle
and error messages as every other object of the product, writes through the one multipart lifecycle
(tier2/multipart.py), reads as ranged GETs. Without encryption the export keeps pyarrow's native filesystem.

Paths are `bucket/key`, as pyarrow's S3FileSystem's. Only what the export and its import use is here:
file info, listing, writing, reading, deleting; a directory is a key prefix (nothing to create)."""
from __future__ import annotations

import io
from datetime import timezone

import pyarrow as pa
import pyarrow.fs as pafs
from botocore.exceptions import BotoCoreError, ClientError

from tiering.config import Settings, aws_sdk_checksums_when_required
from tiering.tier2.multipart import MIN_PART_SIZE, MultipartUpload
from tiering.tier2.client import make_client, s3_client
from tiering.tier2.errors import NotFound, PreconditionFailed, tier2_error
from tiering.tier2.objects import Bucket, abort_upload, delete_keys, get_range, list_uploads


def s3_filesystem(settings: Settings | None, **kwargs) -> pafs.FileSystem:
    """The export's S3 filesystem: pyarrow's own (trusting `TIERING_S3_CA_BUNDLE`) without encryption, which
    it cannot send; with `TIERING_S3_SSE` or an SSE-C key, this module's, over boto3. `kwargs` are pyarrow
    S3FileSystem's (access_key, secret_key, region, endpoint_override, scheme)."""
    if settings is None or not settings.s3_encryption.enabled:
        if settings is not None and settings.s3_ca_bundle is not None:
            kwargs.setdefault("tls_ca_file_path", str(settings.s3_ca_bundle))
        if settings is not None:  # TIERING_S3_TIMEOUT_SECONDS, as the boto3 clients have it (not the SDK's 1 s/3 s)
            kwargs.setdefault("connect_timeout", settings.s3_timeout_seconds)
            kwargs.setdefault("request_timeout", settings.s3_timeout_seconds)
        aws_sdk_checksums_when_required()
        return pafs.S3FileSystem(**kwargs)
    changes = {}
    if kwargs.get("endpoint_override"):
        changes["s3_endpoint_url"] = f"{kwargs.get('scheme') or 'https'}://{kwargs['endpoint_override']}"
    if kwargs.get("access_key") and kwargs.get("secret_key"):
        changes.update(aws_access_key_id=kwargs["access_key"], aws_secret_access_key=kwargs["secret_key"])
    if kwargs.get("region"):
        changes["aws_region"] = kwargs["region"]
    return pafs.PyFileSystem(Boto3Handler(make_client(settings.with_(**changes) if changes else settings)))


def create_object_if_absent(fs: pafs.FileSystem, path: str, data: bytes) -> bool:
    """PUT `bucket/key` with `If-None-Match: *` (Ceph RGW 16 and AWS answer 412 when it exists): False if an
    object is there already. pyarrow's S3FileSystem cannot send the header, so the PUT goes through boto3:
    this module's encrypting client, or one built from the options pyarrow's filesystem was made with."""
    bucket, key = _split(path)
    client = _client_of(fs)
    try:
        client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        return True
    except (ClientError, BotoCoreError) as exc:
        error = tier2_error("PUT", key, exc)
        if isinstance(error, PreconditionFailed):
            return False
        raise error from None


def abort_uploads_under(fs: pafs.FileSystem, path: str, keep=lambda key: True) -> int:
    """Abort the multipart uploads in progress under `path` (`bucket/prefix/`) whose key `keep` takes: what a
    killed writer of files there left, which no listing of objects shows and S3 keeps (and bills) until they
    are aborted. Returns how many were aborted."""
    bucket, prefix = _split(path)
    b = Bucket(_client_of(fs), bucket, "")
    try:
        stale = [up for up in list_uploads(b, prefix + "/") if keep(up["Key"])]
    except (ClientError, BotoCoreError) as exc:
        raise tier2_error("list uploads", prefix, exc) from None
    return sum(abort_upload(b, up["Key"], up["UploadId"]) for up in stale)


def _client_of(fs: pafs.FileSystem):
    """The boto3 client behind `fs`: this module's encrypting one, or one built from the options pyarrow's
    S3 filesystem was made with."""
    handler = getattr(fs, "handler", None)
    return handler.s3 if isinstance(handler, Boto3Handler) else _client_like(fs)


def _client_like(fs: pafs.FileSystem):
    o = fs.__reduce__()[1][0]  # pyarrow S3FileSystem's options
    return s3_client(
        endpoint_url=f"{o['scheme']}://{o['endpoint_override']}" if o.get("endpoint_override") else None,
        access_key=o.get("access_key") or None, secret_key=o.get("secret_key") or None,
        session_token=o.get("session_token") or None, region=o.get("region") or None,
        ca_bundle=o.get("tls_ca_file_path") or None, max_pool_connections=1,
        timeout_seconds=o["request_timeout"] if (o.get("request_timeout") or 0) > 0 else 60)


def _split(path: str) -> tuple[str, str]:
    bucket, _, key = path.lstrip("/").partition("/")
    return bucket, key.rstrip("/")


class Boto3Handler(pafs.FileSystemHandler):
    def __init__(self, client):
        self.s3 = client

    def get_type_name(self) -> str:
        return "tiering-s3"

    def normalize_path(self, path: str) -> str:
        return path

    def equals(self, other) -> bool:
        return isinstance(other, Boto3Handler) and other.s3 is self.s3

    # ---------------------------------------------------------------------------------------- info, listing
    def get_file_info(self, paths):
        return [self._info(p) for p in paths]

    def _info(self, path: str) -> pafs.FileInfo:
        bucket, key = _split(path)
        if not key:
            return pafs.FileInfo(path, pafs.FileType.Directory)
        try:
            head = self.s3.head_object(Bucket=bucket, Key=key)
            return pafs.FileInfo(path, pafs.FileType.File, size=int(head["ContentLength"]),
                                 mtime=head["LastModified"].astimezone(timezone.utc))
        except (ClientError, BotoCoreError) as exc:
            error = tier2_error("HEAD", key, exc)
            if not isinstance(error, NotFound):
                raise error from None
        try:
            listed = self.s3.list_objects_v2(Bucket=bucket, Prefix=key + "/", MaxKeys=1)
        except (ClientError, BotoCoreError) as exc:
            raise tier2_error("LIST", key + "/", exc) from None
        return pafs.FileInfo(path, pafs.FileType.Directory if listed.get("KeyCount") else pafs.FileType.NotFound)

    def get_file_info_selector(self, selector):
        bucket, key = _split(selector.base_dir)
        prefix = f"{key}/" if key else ""
        kwargs = {"Bucket": bucket, "Prefix": prefix}
        if not selector.recursive:
            kwargs["Delimiter"] = "/"
        infos = []
        try:
            for page in self.s3.get_paginator("list_objects_v2").paginate(**kwargs):
                for common in page.get("CommonPrefixes", []):
                    infos.append(pafs.FileInfo(f"{bucket}/{common['Prefix'].rstrip('/')}", pafs.FileType.Directory))
                for obj in page.get("Contents", []):
                    if obj["Key"].endswith("/"):
                        continue  # a directory marker (pyarrow's own filesystem writes them): not a file
                    infos.append(pafs.FileInfo(f"{bucket}/{obj['Key']}", pafs.FileType.File, size=int(obj["Size"]),
                                               mtime=obj["LastModified"].astimezone(timezone.utc)))
        except (ClientError, BotoCoreError) as exc:
            raise tier2_error("LIST", prefix, exc) from None
        if not infos and not selector.allow_not_found and self._info(selector.base_dir).type == pafs.FileType.NotFound:
            raise FileNotFoundError(selector.base_dir)
        return infos

    # ---------------------------------------------------------------------------------------- changes
    def create_dir(self, path, recursive):
        pass  # a directory is a key prefix: nothing to create

    def delete_dir(self, path):
        self.delete_dir_contents(path, True)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        bucket, key = _split(path)
        if not key:
            raise ValueError("refusing to delete a whole bucket's contents")
        keys = [i.path.split("/", 1)[1] for i in self.get_file_info_selector(
            pafs.FileSelector(path, recursive=True, allow_not_found=True)) if i.type == pafs.FileType.File]
        failed = delete_keys(Bucket(self.s3, bucket, ""), keys)
        if failed:
            raise tier2_error("DELETE", failed[0], RuntimeError(f"{len(failed)} objects not deleted"))

    def delete_root_dir_contents(self):
        raise NotImplementedError("refusing to delete every bucket's contents")

    def delete_file(self, path):
        bucket, key = _split(path)
        try:
            self.s3.delete_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:
            raise tier2_error("DELETE", key, exc) from None

    def copy_file(self, src, dest):
        (sb, sk), (db, dk) = _split(src), _split(dest)
        try:  # the encryption handlers add the destination's encryption and an SSE-C source key
            self.s3.copy_object(Bucket=db, Key=dk, CopySource={"Bucket": sb, "Key": sk})
        except (ClientError, BotoCoreError) as exc:
            raise tier2_error("COPY", sk, exc) from None

    def move(self, src, dest):
        self.copy_file(src, dest)
        self.delete_file(src)

    # ---------------------------------------------------------------------------------------- streams
    def open_input_stream(self, path):
        return self.open_input_file(path)

    def open_input_file(self, path):
        info = self._info(path)
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(path)
        bucket, key = _split(path)
        return pa.PythonFile(_Reader(Bucket(self.s3, bucket, ""), key, info.size), mode="r")

    def open_output_stream(self, path, metadata):
        bucket, key = _split(path)
        return pa.PythonFile(_Writer(Bucket(self.s3, bucket, ""), key), mode="w")

    def open_append_stream(self, path, metadata):
        raise NotImplementedError("S3 objects cannot be appended to")


class _Reader(io.RawIOBase):
    """Random access to one object by ranged GETs (a Parquet reader reads the footer, then column chunks)."""

    def __init__(self, b: Bucket, key: str, size: int):
        self.b, self.key, self.size, self.pos = b, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        data = get_range(self.b, self.key, self.pos, end - self.pos) if end > self.pos else b""
        self.pos += len(data)
        return data

    def readinto(self, buf) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)


class _Writer(io.RawIOBase):
    """One object written through `MultipartUpload` (one PUT when small); complete at close. An error before
    close aborts the upload (the lifecycle's), so no partial object is left."""

    def __init__(self, b: Bucket, key: str):
        self.up = MultipartUpload(b, key=key, metadata={}, op="export write", part_size=MIN_PART_SIZE,
                                  concurrency=2)
        self.up.__enter__()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        try:
            self.up.write(bytes(data))
        except BaseException as exc:
            self.up.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return len(data)

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.up.finish()
        except BaseException as exc:
            super().close()
            self.up.__exit__(type(exc), exc, exc.__traceback__)
            raise
        super().close()
        self.up.__exit__(None, None, None)
