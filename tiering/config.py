"""Settings: the one place that reads the environment (Airflow connections: `tiering.jobs.hook.TieringHook`).

Everything below this module takes its clients and paths as arguments. `Settings` never shows secrets in
its repr, and errors name the variable, never its value.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from tiering.database_url import checked_database_url, with_local_password, without_password
from tiering.errors import ConfigError
from tiering.format.block import DEFAULT_BLOCK_SIZE, DEFAULT_PAGE_SIZE, MIN_BLOCK_SIZE
from tiering.model import CONTROL_CHARS, INT32_MAX, INT64_MAX, MAX_SECONDS, MIB, BadInt, parse_int
from tiering.units import DURATION_HELP, SIZE_HELP, parse_duration, parse_size

@dataclass(frozen=True)
class IntSetting:
    """An integer setting's default and bounds (Settings' defaults, from_env's parsing and ops.context.Knobs'
    defaults all read `INTS`, which `VARIABLES` defines)."""
    var: str
    default: int
    lo: int
    hi: int
    out_of_range: str | None = None  # the message when outside [lo, hi]; default "VAR must be from lo to hi"


@dataclass(frozen=True)
class Variable:
    """One environment variable: the Settings field it sets, how `from_env` reads it and `to_env` writes it
    back, its default as the README's configuration table shows it, and what it means."""
    name: str
    field: str
    default: str  # "required", "unset", or the value when unset
    meaning: str
    read: Callable[[str | None, str], Any]  # (the raw value or None, the variable's name) -> the field's value
    write: Callable[[Any], str | None] = str  # the field's value -> the variable's; None leaves it unset
    ints: IntSetting | None = None


def _if_set(value) -> str | None:
    return str(value) if value else None


def _size(n: int) -> str:
    """A default as the README shows it: 64 MiB, 64 KiB, 3600."""
    for unit, size in (("MiB", MIB), ("KiB", 1024)):
        if n and n % size == 0:
            return f"{n // size} {unit}"
    return str(n)


def _int_variable(field_: str, name: str, default: int, lo: int, hi: int, meaning: str,
                  out_of_range: str | None = None, unit: str | None = None) -> Variable:
    """An integer setting; `unit` "size" or "duration" also takes a number with a unit (tiering/units.py)."""
    setting = IntSetting(name, default, lo, hi, out_of_range)
    def read(raw: str | None, var: str) -> int:  # the readers are defined below
        parse = {None: _int, "size": _size_value, "duration": _duration_value}[unit]
        return parse(raw, var, default, lo, hi, out_of_range)
    return Variable(name, field_, _size(default), meaning, read, ints=setting)


# Every variable from_env reads, in one list, in the order it reads them (the first error wins): Settings'
# parsing, `to_env`, `INTS` and the README's configuration table (tests/unit/test_readme_config.py) all come
# from it.
VARIABLES: tuple[Variable, ...] = (
    Variable("TIERING_DATABASE_URL", "database_url", "required", "PostgreSQL URL of the metadata database",
             lambda raw, var: checked_database_url(_required(raw, var))),
    Variable("TIERING_BUCKET", "bucket", "required", "bucket of tier 2",
             lambda raw, var: _required(raw, var)),
    Variable("TIERING_TIER1_ROOT", "tier1_root", "required", "directory of tier-1 ledgers",
             lambda raw, var: Path(_required(raw, var))),
    Variable("TIERING_PREFIX", "prefix", "tiering/", "key prefix inside the bucket",
             lambda raw, var: _prefix("tiering/" if raw is None else raw)),
    Variable("TIERING_S3_ENDPOINT_URL", "s3_endpoint_url", "unset", "S3 endpoint for non-AWS stores (moto, MinIO, "
             "Ceph); unset for AWS", lambda raw, var: _endpoint(raw or None, var), _if_set),
    Variable("AWS_ACCESS_KEY_ID", "aws_access_key_id", "unset", "S3 access key (else boto3's default chain)",
             lambda raw, var: raw or None, _if_set),
    Variable("AWS_SECRET_ACCESS_KEY", "aws_secret_access_key", "unset", "S3 secret key (else boto3's default chain)",
             lambda raw, var: raw or None, _if_set),
    Variable("AWS_SESSION_TOKEN", "aws_session_token", "unset", "session token of temporary S3 credentials",
             lambda raw, var: raw or None, _if_set),
    Variable("AWS_DEFAULT_REGION", "aws_region", "us-east-1", "S3 region", lambda raw, var: _region(raw or "us-east-1")),
    # S3's smallest part, and the index's int32 block_size (below S3's largest part, 5 GiB); a block is also
    # held in memory per upload slot
    _int_variable("block_size", "TIERING_BLOCK_SIZE", DEFAULT_BLOCK_SIZE, MIN_BLOCK_SIZE, INT32_MAX,
                  "offload block (= multipart part) size in bytes; 5 MiB (S3's smallest part) to 2 GiB - 1 "
                  "(the index's int32)",
                  "TIERING_BLOCK_SIZE must be at least 5 MiB (S3's minimum part size) and below 2 GiB (the "
                  "index object records it as an int32)", unit="size"),
    _int_variable("upload_concurrency", "TIERING_UPLOAD_CONCURRENCY", 4, 1, 64,
                  "parts uploaded in parallel per ledger; 1 to 64"),
    # Small pages cost index bytes (about 12 per page) and CRC calls; 4 KiB keeps a 64 MiB block's page index
    # under 200 KiB. Pages never cross blocks, so a page size above the block size acts as the block's; the
    # index records it as an int32.
    _int_variable("page_size", "TIERING_PAGE_SIZE", DEFAULT_PAGE_SIZE, 4096, INT32_MAX,
                  "target bytes of a checksummed page of entries in tier 2; 4096 to 2 GiB - 1", unit="size"),
    _int_variable("offload_timeout_seconds", "TIERING_OFFLOAD_TIMEOUT_SECONDS", 3600, 1, MAX_SECONDS,
                  "an OFFLOADING attempt older than this is presumed dead and taken over; its objects become "
                  "collectable", unit="duration"),
    _int_variable("gc_delay_seconds", "TIERING_GC_DELAY_SECONDS", 600, 0, MAX_SECONDS,
                  "objects merged away by defrag or trimmed by retention are kept this long for readers holding "
                  "old metadata", unit="duration"),
    _int_variable("offload_batch_bytes", "TIERING_OFFLOAD_BATCH_BYTES", 8 * MIB, 0, 5 * 1024 * MIB,
                  "sealed ledgers smaller than this, of one topic in one run, are offloaded together into one "
                  "object pair; 0: one pair per ledger", unit="size"),
    _int_variable("offload_max_bytes_per_second", "TIERING_OFFLOAD_MAX_BYTES_PER_SECOND", 0, 0, INT64_MAX,
                  "upload rate limit of one offload process; a Spark offload job splits it across its tasks; "
                  "0: unlimited", unit="size"),
    _int_variable("s3_timeout_seconds", "TIERING_S3_TIMEOUT_SECONDS", 60, 1, 3600,
                  "how long an S3 request waits to connect, and for each byte of its answer, before it is tried "
                  "again (5 tries); a request that timed out every time pauses its process's S3 requests this "
                  "long", unit="duration"),
    Variable("TIERING_S3_SSE", "s3_sse", "none", "server-side encryption of every object written: none, AES256 "
             "(SSE-S3) or aws:kms (SSE-KMS)", lambda raw, var: _sse(raw), lambda v: None if v == "none" else v),
    Variable("TIERING_S3_SSE_KMS_KEY_ID", "s3_sse_kms_key_id", "unset", "the KMS key id, ARN or alias for "
             "TIERING_S3_SSE=aws:kms (unset: the store's default key)",
             lambda raw, var: (raw or "").strip() or None, _if_set),
    # the path travels to jobs, never the key: it is read where the job runs
    Variable("TIERING_S3_SSE_C_KEY_FILE", "s3_sse_c_key_file", "unset", "file holding a 32-byte customer key "
             "(raw, or base64) for SSE-C: every write and read sends it; never logged (exclusive with "
             "TIERING_S3_SSE)", lambda raw, var: _path(raw), _if_set),
    Variable("TIERING_S3_CA_BUNDLE", "s3_ca_bundle", "unset", "PEM file of the CA(s) that sign an https S3 "
             "endpoint's certificate (unset: the system's)", lambda raw, var: _path(raw), _if_set),
)

INTS: dict[str, IntSetting] = {v.field: v.ints for v in VARIABLES if v.ints}  # Settings field -> its setting
# Settings that are file names: bytes on Linux, which need not be UTF-8 (os.fsencode gives them back)
_PATH_VARIABLES = frozenset({"TIERING_TIER1_ROOT", "TIERING_S3_SSE_C_KEY_FILE", "TIERING_S3_CA_BUNDLE"})


def _read(v: Variable, raw: str | None) -> Any:
    """One variable's value. Bytes that are not UTF-8 arrive as lone surrogates (surrogateescape) and would
    fail only where the text is first encoded (the database URL, a signed S3 header), as an error of that
    library: a text setting holding them is refused here, named, never shown."""
    if raw is not None and v.name not in _PATH_VARIABLES:
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"{v.name} is not valid UTF-8") from None
    return v.read(raw, v.name)


SSE_MODES = ("none", "AES256", "aws:kms")
_BUCKET_NAME = re.compile(r"[A-Za-z0-9._-]{3,255}")
SSE_C_KEY_BYTES = 32  # SSE-C is AES-256: S3 takes exactly a 256-bit key


@dataclass(frozen=True)
class S3Encryption:
    """What server-side encryption every S3 request asks for (`tiering.tier2.encryption.install_encryption` adds
    it to each request). `customer_key` (SSE-C) never shows in repr or messages; `setting` names the
    variables an error should point at."""
    mode: str = "none"  # none | AES256 | aws:kms | SSE-C
    kms_key_id: str | None = None
    customer_key: bytes | None = field(default=None, repr=False)

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    @property
    def setting(self) -> str:
        if self.mode == "SSE-C":
            return "TIERING_S3_SSE_C_KEY_FILE"
        if self.mode == "aws:kms":
            return "TIERING_S3_SSE=aws:kms" + (" with TIERING_S3_SSE_KMS_KEY_ID" if self.kms_key_id else "")
        return f"TIERING_S3_SSE={self.mode}"


@dataclass(frozen=True)
class Settings:
    database_url: str = field(repr=False)
    bucket: str
    tier1_root: Path
    prefix: str = "tiering/"
    s3_endpoint_url: str | None = None
    aws_access_key_id: str | None = field(default=None, repr=False)
    aws_secret_access_key: str | None = field(default=None, repr=False)
    aws_session_token: str | None = field(default=None, repr=False)
    aws_region: str = "us-east-1"
    block_size: int = INTS["block_size"].default
    upload_concurrency: int = INTS["upload_concurrency"].default
    page_size: int = INTS["page_size"].default
    offload_timeout_seconds: int = INTS["offload_timeout_seconds"].default
    gc_delay_seconds: int = INTS["gc_delay_seconds"].default
    offload_batch_bytes: int = INTS["offload_batch_bytes"].default
    offload_max_bytes_per_second: int = INTS["offload_max_bytes_per_second"].default
    s3_timeout_seconds: int = INTS["s3_timeout_seconds"].default
    s3_sse: str = "none"
    s3_sse_kms_key_id: str | None = None
    s3_sse_c_key_file: Path | None = None
    # the SSE-C key's bytes, read from s3_sse_c_key_file once (from_env); never in repr, env or messages
    s3_sse_c_key: bytes | None = field(default=None, repr=False, compare=False)
    s3_ca_bundle: Path | None = None

    @property
    def database_url_safe(self) -> str:
        """The database URL with any password masked (also libpq's `sslpassword`), for messages."""
        parts = urlsplit(self.database_url)
        if parts.password:
            parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
        if parts.query:
            parts = parts._replace(query="&".join(
                f"{k}=***" if k in ("password", "sslpassword") else (f"{k}={v}" if v or "=" in kv else k)
                for kv in parts.query.split("&") for k, _, v in [kv.partition("=")]))
        return parts.geturl()

    @property
    def s3_encryption(self) -> S3Encryption:
        if self.s3_sse_c_key is not None:
            return S3Encryption("SSE-C", customer_key=self.s3_sse_c_key)
        return S3Encryption(self.s3_sse, self.s3_sse_kms_key_id if self.s3_sse == "aws:kms" else None)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if environ is None else environ
        return cls(**{v.field: _read(v, env.get(v.name)) for v in VARIABLES}).validated()

    def __post_init__(self) -> None:
        # The SSE-C key is read from its file once, where the settings are built: a Spark executor or a DAG
        # task reads it where it runs, from the path `to_env` passes; the key itself never travels.
        if self.s3_sse_c_key_file is None:
            object.__setattr__(self, "s3_sse_c_key", None)
        elif self.s3_sse_c_key is None:
            object.__setattr__(self, "s3_sse_c_key", read_sse_c_key(self.s3_sse_c_key_file))

    def validated(self) -> "Settings":
        if not self.bucket or len(self.bucket) < 3:
            raise ConfigError("TIERING_BUCKET must be a bucket name of at least 3 characters")
        if not _BUCKET_NAME.fullmatch(self.bucket) and not self.bucket.startswith("arn:"):
            # botocore's own rule (it refuses anything else before sending): said here, as a setting's error
            raise ConfigError("TIERING_BUCKET must be a bucket name: letters, digits, '.', '-' and '_' only")
        _check_tier1_root(self.tier1_root)
        if self.s3_sse not in SSE_MODES:
            raise ConfigError(f"TIERING_S3_SSE must be one of {', '.join(SSE_MODES)}")
        if self.s3_sse_kms_key_id and self.s3_sse != "aws:kms":
            raise ConfigError("TIERING_S3_SSE_KMS_KEY_ID is set but TIERING_S3_SSE is not aws:kms")
        if self.s3_sse_c_key_file is not None and self.s3_sse != "none":
            raise ConfigError("TIERING_S3_SSE_C_KEY_FILE (SSE-C) and TIERING_S3_SSE exclude each other: an object "
                              "has one kind of server-side encryption")
        if self.s3_ca_bundle is not None:
            try:
                readable = self.s3_ca_bundle.is_file()
            except OSError:  # a name too long: stat() raises instead of saying "not there"
                readable = False
            if not readable:
                raise ConfigError("TIERING_S3_CA_BUNDLE is not a readable file")
            if not (self.s3_endpoint_url or "https://").startswith("https://"):
                # a CA bundle says the operator expects TLS: never talk plain http instead
                raise ConfigError("TIERING_S3_CA_BUNDLE is set but TIERING_S3_ENDPOINT_URL is not an https:// URL")
        return self

    def __reduce__(self):
        # Pickled into every Spark task closure (and the data source's class), which Spark sends to executors
        # in plaintext unless the cluster encrypts its RPC: so WITHOUT secrets. No database
        # password, no AWS keys or session token, no SSE-C key bytes; where unpickled, each is resolved from
        # that machine's own environment (`_settings`).
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _SECRET_FIELDS}
        values["database_url"] = without_password(self.database_url)
        return (_settings, (values,))

    @property
    def offload_timeout(self) -> timedelta:
        return timedelta(seconds=self.offload_timeout_seconds)

    @property
    def gc_delay(self) -> timedelta:
        return timedelta(seconds=self.gc_delay_seconds)

    def with_(self, **changes) -> "Settings":
        return replace(self, **changes)

    def to_env(self) -> dict[str, str]:
        """The settings as environment variables (for spark-submit's env, never its argv)."""
        written = ((v.name, v.write(getattr(self, v.field))) for v in VARIABLES)
        return {name: value for name, value in written if value is not None}


def settings_present(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every setting that is set or has a default, read and checked as `Settings.from_env` reads it (a
    malformed one is refused whichever command runs); required ones that are not set are left out: a
    command that uses only the metadata database (`topic list`, ...) or tier 1 needs no bucket."""
    env = os.environ if environ is None else environ
    out = {}
    for v in VARIABLES:
        raw = env.get(v.name)
        if v.default == "required" and (raw is None or not raw.strip()):
            continue
        out[v.field] = _read(v, raw)
    if "tier1_root" in out:
        _check_tier1_root(out["tier1_root"])
    return out


def setting_from_env(field_: str, environ: Mapping[str, str] | None = None,
                     present: Mapping[str, Any] | None = None) -> Any:
    """One setting (a Settings field); a required one that is not set is refused here, when it is used."""
    present = settings_present(environ) if present is None else present
    if field_ not in present:
        [var] = [v for v in VARIABLES if v.field == field_]
        return var.read(None, var.name)  # raises: "... is not set"
    return present[field_]


def database_url_from_env(environ: Mapping[str, str] | None = None) -> str:
    return setting_from_env("database_url", environ)


# Settings fields that never travel in a pickle (the database URL travels without its password).
_SECRET_FIELDS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token", "s3_sse_c_key")


def _settings(values: dict) -> Settings:
    """Settings unpickled on an executor: the secrets come from where it runs. The database password from
    the executor's own TIERING_DATABASE_URL when that names the same user, host, port and database (a local
    master's executors share the driver's environment), else libpq's own sources (PGPASSWORD, PGPASSFILE,
    ~/.pgpass); S3 credentials from boto3's chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a shared
    credentials file or profile, an instance or container role); the SSE-C key from its file."""
    url = with_local_password(values["database_url"], os.environ.get("TIERING_DATABASE_URL"))
    return Settings(**{**values, "database_url": url})


def aws_sdk_checksums_when_required() -> None:
    """Make the AWS C++ SDK inside pyarrow send a checksum only when an operation requires one (as
    `tiering.tier2.client.make_client` configures boto3).

    Otherwise it uploads parts as `aws-chunked` with a trailing checksum and no Content-Length, which Ceph
    RGW 16 and other older S3-compatible servers refuse (HTTP 411 MissingContentLength). pyarrow has no option
    for it: the SDK reads this variable each time a filesystem is built, so the one module that owns the
    process environment sets it, wherever a filesystem is built (also in Spark executors, which build their
    own). `tiering.tier2.arrowfs.s3_filesystem` calls it before building pyarrow's S3FileSystem."""
    os.environ["AWS_REQUEST_CHECKSUM_CALCULATION"] = "when_required"


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (glibc's malloc.h)
_MMAP_THRESHOLD_MAX = 32 * MIB  # the largest glibc accepts on 64-bit


@functools.cache
def reuse_freed_buffers() -> bool:
    """Let glibc's malloc keep freed buffers of up to 32 MiB for the next allocation instead of handing them
    back to the kernel; once per process, a no-op (False) off glibc. `clients.bucket` calls it, so every
    process that offloads or reads tier 2 (the CLI, Spark drivers, executors and the source's workers) runs
    with it.

    Why: an offload packs every block into a fresh buffer, with several in flight (and reads tier 1, and a
    scan tier 2, in fresh ~1 MiB chunks). glibc's defaults map a buffer that large afresh, or trim the heap's
    top back to the kernel once more than twice its threshold is free, which a batch of freed blocks is: the
    next blocks fault every page in again, ~2.3 us a page on a virtual machine, half of the time packing an
    8 MiB block took (docs/performance.md). Here the threshold is glibc's maximum (32 MiB) and the heap's top
    is trimmed beyond 64 MiB (glibc's own ratio): that much freed memory may stay with the process.
    tests/unit/test_config.py shows the page faults gone."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and \
            bool(libc.mallopt(_M_TRIM_THRESHOLD, 2 * _MMAP_THRESHOLD_MAX))  # glibc's own ratio
    except (OSError, AttributeError):  # not glibc: its allocator keeps its own ways
        ok = False
    return ok


def read_sse_c_key(path: Path) -> bytes:
    """The 32-byte SSE-C key from its file: the raw bytes, or their base64 (one line). Messages name the
    variable, never the file's content."""
    import base64
    import binascii

    import stat

    try:
        # O_NONBLOCK: opening a fifo waits for a writer; a device (/dev/zero) never ends. The key is read again
        # where each job runs, so only a regular file can hold it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError("TIERING_S3_SSE_C_KEY_FILE is not a regular file")
            raw = f.read(4096)  # a key, raw or base64, is 32 or 44 bytes (and a newline)
    except OSError as exc:
        raise ConfigError(f"TIERING_S3_SSE_C_KEY_FILE cannot be read ({type(exc).__name__})") from None
    if len(raw) == SSE_C_KEY_BYTES:
        return raw
    try:
        key = base64.b64decode(raw.strip(), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != SSE_C_KEY_BYTES:
        raise ConfigError(f"TIERING_S3_SSE_C_KEY_FILE must hold a {SSE_C_KEY_BYTES}-byte key (raw, or base64 on one "
                          f"line)")
    return key


def _required(value: str | None, name: str) -> str:
    if value is None or not value.strip():
        raise ConfigError(f"{name} is not set (see README, Configuration)")
    return value.strip()


def _sse(raw: str | None) -> str:
    value = (raw or "").strip() or "none"
    for mode in SSE_MODES:  # the AWS spellings, in any case
        if value.lower() == mode.lower():
            return mode
    raise ConfigError(f"TIERING_S3_SSE must be one of {', '.join(SSE_MODES)}")


def _path(raw: str | None) -> Path | None:
    return Path(raw.strip()).expanduser() if raw and raw.strip() else None


def _endpoint(url: str | None, name: str) -> str | None:
    if url is None:
        return None
    try:
        parts = urlsplit(url)  # raises on a malformed IPv6 host ("http://[::1")
        parts.port  # noqa: B018 - raises on a port that is not a number from 0 to 65535
    except ValueError:
        raise ConfigError(f"{name} must be an http:// or https:// URL with a port from 0 to 65535") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{name} must be an http:// or https:// URL")
    return url


# botocore's rule for a region name (it refuses any other when the client is built, as an S3 error)
_REGION = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?")


def _region(raw: str) -> str:
    if not _REGION.fullmatch(raw):
        raise ConfigError("AWS_DEFAULT_REGION must be a region name: letters, digits and '-', e.g. us-east-1")
    return raw


def _prefix(prefix: str) -> str:
    if not prefix.strip("/"):
        # GC's sweep deletes what nothing references under the prefix: without one, every object in the
        # bucket (another store's, anyone's) would be the store's to collect
        raise ConfigError("TIERING_PREFIX must not be empty: the store needs a key prefix of its own in the bucket")
    if prefix.startswith("/") or ".." in prefix.split("/"):
        raise ConfigError("TIERING_PREFIX must be relative and must not contain '..'")
    if not prefix.endswith("/"):
        prefix += "/"
    # boto3 writes "a/./b/" and "a//b/" as they are, but pyarrow (exports beside the prefix, Iceberg tables)
    # cannot address them: "./" fails S3's signature, "//" is an empty path component
    if any(segment in ("", ".") for segment in prefix[:-1].split("/")):
        raise ConfigError("TIERING_PREFIX must not contain '.' segments or '//'")
    if re.search(f"[{CONTROL_CHARS}]", prefix):  # a key that prints as two lines, or moves the cursor
        raise ConfigError("TIERING_PREFIX must not contain control characters (newline, tab, ...)")
    return prefix


def _int(raw: str | None, name: str, default: int, lo: int, hi: int, out_of_range: str | None = None) -> int:
    """An integer setting (model.parse_int's rule) within [lo, hi]; the message names the variable, not the
    value."""
    if raw is None or raw == "":
        return default
    try:
        return parse_int(raw, name, lo, hi)
    except BadInt as exc:
        raise ConfigError(f"{name} must be an integer in ASCII digits" if exc.reason == "syntax" else
                          out_of_range or f"{name} must be from {lo} to {hi}") from None


def _size_value(raw: str | None, name: str, default: int, lo: int, hi: int, out_of_range: str | None = None) -> int:
    """A size setting: bytes, or a number with a unit (64MiB); the message names the variable, not the value."""
    return _with_units(parse_size, SIZE_HELP, "a size", raw, name, default, lo, hi, out_of_range)


def _duration_value(raw: str | None, name: str, default: int, lo: int, hi: int,
                    out_of_range: str | None = None) -> int:
    """A duration setting: seconds, or a number with a unit (15m)."""
    return _with_units(parse_duration, DURATION_HELP, "a duration", raw, name, default, lo, hi, out_of_range)


def _with_units(parse, hint: str, kind: str, raw, name, default, lo, hi, out_of_range) -> int:
    if raw is None or raw == "":
        return default
    try:
        return parse(raw, name, lo, hi)
    except BadInt as exc:
        if exc.reason == "fraction":  # named, never its value (as every setting's refusal)
            raise ConfigError(f"{name} must come to a whole number of "
                              f"{'seconds' if parse is parse_duration else 'bytes'}") from None
        if exc.reason == "syntax":
            raise ConfigError(f"{name} must be an integer in ASCII digits, or {kind} with a unit ({hint})") from None
        raise ConfigError(out_of_range or f"{name} must be from {lo} to {hi}") from None


def _check_tier1_root(root: Path) -> None:
    """The root, or the nearest part of it that exists, must be a directory: a file there would fail the
    first write after metadata was changed (a new OPEN ledger row with no file)."""
    path = root
    try:
        while not path.exists() and path != path.parent:
            path = path.parent
        exists = path.exists()
    except OSError as exc:  # a name too long, a symlink loop: stat() raises instead of saying "not there"
        raise ConfigError(f"TIERING_TIER1_ROOT cannot be used: {exc.strerror or type(exc).__name__}") from None
    if exists and not path.is_dir():
        where = "" if path == root else " (a part of it)"
        raise ConfigError(f"TIERING_TIER1_ROOT{where} is a file, not a directory")
