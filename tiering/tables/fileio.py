"""pyiceberg's PyArrowFileIO on tier 2's S3 filesystem (`tiering.tier2.arrowfs.s3_filesystem`), so a table's
metadata, manifests and data files get what every other object of the product gets: the server-side
encryption of TIERING_S3_SSE or SSE-C (pyarrow's own S3 filesystem cannot send those headers), and the CA
bundle of TIERING_S3_CA_BUNDLE. pyiceberg builds its FileIO from string properties only, so the catalog
passes the settings it needs as properties (tiering/tables/catalog.py): paths and modes, never a key (the
SSE-C key file is read where the FileIO is built, as every job reads it)."""
from __future__ import annotations

from pathlib import Path

from pyiceberg.io.pyarrow import PyArrowFileIO

from tiering.config import Settings

IMPL = f"{__name__}.TieringFileIO"
# catalog property -> Settings field (the S3 keys and endpoint travel in pyiceberg's own s3.* properties)
PROPS = {"tiering.s3-sse": "s3_sse", "tiering.s3-sse-kms-key-id": "s3_sse_kms_key_id",
         "tiering.s3-sse-c-key-file": "s3_sse_c_key_file", "tiering.s3-ca-bundle": "s3_ca_bundle",
         "tiering.bucket": "bucket"}


def properties(settings: Settings) -> dict[str, str]:
    out = {"py-io-impl": IMPL, "tiering.bucket": settings.bucket, "tiering.s3-sse": settings.s3_sse}
    for prop, field in PROPS.items():
        value = getattr(settings, field)
        if value is not None and prop not in out:
            out[prop] = str(value)
    return out


class TieringFileIO(PyArrowFileIO):
    def _initialize_s3_fs(self, netloc):
        from tiering.tier2.arrowfs import s3_filesystem

        p = self.properties
        path = lambda key: Path(p[key]) if p.get(key) else None  # noqa: E731
        settings = Settings(database_url="postgresql://unused/unused", bucket=p.get("tiering.bucket") or netloc or "",
                            tier1_root=Path("/"), s3_endpoint_url=p.get("s3.endpoint"),
                            aws_access_key_id=p.get("s3.access-key-id"),
                            aws_secret_access_key=p.get("s3.secret-access-key"),
                            aws_session_token=p.get("s3.session-token"), aws_region=p.get("s3.region") or "us-east-1",
                            s3_sse=p.get("tiering.s3-sse") or "none", s3_sse_kms_key_id=p.get("tiering.s3-sse-kms-key-id"),
                            s3_sse_c_key_file=path("tiering.s3-sse-c-key-file"), s3_ca_bundle=path("tiering.s3-ca-bundle"))
        kwargs = {"region": settings.aws_region}
        if settings.aws_access_key_id and settings.aws_secret_access_key:
            kwargs.update(access_key=settings.aws_access_key_id, secret_key=settings.aws_secret_access_key)
        if settings.aws_session_token:
            kwargs["session_token"] = settings.aws_session_token
        if settings.s3_endpoint_url:
            scheme, _, host = settings.s3_endpoint_url.partition("://")
            kwargs.update(endpoint_override=host.rstrip("/"), scheme=scheme)
        return s3_filesystem(settings, **kwargs)
