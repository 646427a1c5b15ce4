"""TLS to S3 and to PostgreSQL: a pipeline (offload, read from tier 2, defrag, GC, metadata export
through pyarrow's filesystem) over the local Ceph RGW's https gateway (`.ci/ceph.sh tls-rgw`, a CA it
generated) with `TIERING_S3_CA_BUNDLE`, and over a private PostgreSQL cluster that accepts TLS connections
only (`hostssl` in pg_hba.conf, started here on its own port, stopped at the end) with
`?sslmode=verify-full&sslrootcert=...` in `TIERING_DATABASE_URL`. A CA that did not sign the server's
certificate fails with one line naming the setting, exit 1; nothing is retried in plain text."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.conftest import RUN_ID
from tests.integration.helpers import entries, produce
from tests.integration.test_encryption import enc_bucket, tls_rgw  # noqa: F401 - module fixtures, shared
from tests.support.postgres import give_to_postgres, private_postgres
from tiering import clients
from tiering.config import Settings
from tiering.metadata import upgrade
from tiering.model import LedgerState as S
from tiering.ops import export_metadata as ex
from tiering.ops.defrag import defrag
from tiering.ops.gc import run_gc
from tiering.ops.offload import offload_many
from tiering.read import Entry, ReadHandle
from tiering.tier2.reader import tier2_opener

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def pg_tls(tls_rgw):  # noqa: F811 - the gateway's CA also signs this server's certificate (127.0.0.1)
    """A private PostgreSQL cluster that refuses connections without TLS; its server certificate is the one
    ceph.sh generated for 127.0.0.1. Yields the base URL (no database) and the CA."""
    def certificates(data: Path) -> None:
        tls = tls_rgw["ca"].parent
        for name in ("server.pem", "server.key"):
            shutil.copy(tls / name, data / name)
            give_to_postgres(data / name)
        (data / "server.key").chmod(0o600)
        (data / "pg_hba.conf").write_text("local all all trust\nhostssl all all 127.0.0.1/32 trust\n"
                                          "hostnossl all all 0.0.0.0/0 reject\n")

    with private_postgres("tls", "-c ssl=on -c ssl_cert_file=server.pem -c ssl_key_file=server.key",
                          certificates) as base:
        yield {"base": base, "ca": tls_rgw["ca"]}


@pytest.fixture(scope="module")
def tls_database_url(pg_tls):
    from sqlalchemy import create_engine

    admin = create_engine(f"{pg_tls['base']}/postgres?sslmode=verify-full&sslrootcert={pg_tls['ca']}",
                          isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("CREATE DATABASE tiering"))
    admin.dispose()
    return f"{pg_tls['base']}/tiering?sslmode=verify-full&sslrootcert={pg_tls['ca']}"


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory):
    """A CA that signed nothing here."""
    d = tmp_path_factory.mktemp("other-ca")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=not the test CA", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem")],
                   check=True, capture_output=True, timeout=60)
    return d / "ca.pem"


def test_pipeline_over_tls_to_s3_and_postgres(tls_database_url, tls_rgw, enc_bucket, s3_settings,  # noqa: F811
                                              tmp_path, other_ca):
    settings = Settings.from_env({
        "TIERING_DATABASE_URL": tls_database_url, "TIERING_BUCKET": enc_bucket, "TIERING_PREFIX": f"tls-{RUN_ID}/",
        "TIERING_TIER1_ROOT": str(tmp_path / "tier1"), "TIERING_S3_ENDPOINT_URL": tls_rgw["url"],
        "TIERING_S3_CA_BUNDLE": str(tls_rgw["ca"]), "AWS_ACCESS_KEY_ID": s3_settings["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": s3_settings["aws_secret_access_key"], "TIERING_OFFLOAD_BATCH_BYTES": "0",
        "TIERING_BLOCK_SIZE": str(5 * MIB), "TIERING_GC_DELAY_SECONDS": "0"})
    assert "sslrootcert" in settings.to_env()["TIERING_DATABASE_URL"]  # nothing strips it on the way to a job
    deps = clients.deps(settings)
    upgrade(deps.meta.engine)
    with deps.meta.engine.connect() as conn:  # the connection really is TLS
        assert conn.execute(text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")).scalar() is True
    expected = produce(deps, "tls", [entries(f"t{i}", 5, 200) for i in range(3)])
    produce(deps, "later", [entries("l", 3, 100), entries("m", 3, 100)])  # left in tier 1 for the CLI below
    assert len(offload_many(deps, deps.meta.list_ledgers("tls", [S.SEALED])).offloaded) == 3
    for led in deps.meta.list_ledgers("tls", [S.OFFLOADED]):  # reads from tier 2 alone
        deps.meta.mark_tier1_deleted(led)
        deps.tier1.delete("tls", led.ledger_id)
    assert defrag(deps, "tls").groups == 1
    assert len(run_gc(deps, orphan_grace=timedelta(0)).deleted) == 6  # the three merged-away object pairs
    got = {(e.ledger_id, e.entry_id): e.data
           for e in ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket)).read("tls") if isinstance(e, Entry)}
    assert got == expected
    # the export through pyarrow's own S3 filesystem, trusting the same CA
    fs, base = ex.filesystem_for(f"s3://{enc_bucket}/tls-export-{RUN_ID}", settings)
    manifest = ex.export_metadata(deps.meta.engine, fs, base)
    assert manifest.tables["ledger"].rows == 5 and ex.read_manifest(fs, base).tables["chunk"].rows == 3
    deps.meta.engine.dispose()

    # a CA that did not sign the certificates: one line naming the setting, exit 1 (S3, then PostgreSQL)
    env = {**os.environ, **settings.to_env()}
    wrong_s3 = _cli(["gc"], {**env, "TIERING_S3_CA_BUNDLE": str(other_ca)}, tmp_path)
    assert "TIERING_S3_CA_BUNDLE" in _one_line_error(wrong_s3)
    wrong_pg = _cli(["offload-prefix", "later", "1:0"],
                    {**env, "TIERING_DATABASE_URL": tls_database_url.replace(str(tls_rgw["ca"]), str(other_ca))},
                    tmp_path)
    assert "certificate verify failed" in _one_line_error(wrong_pg)
    # and without TLS the database refuses (hostnossl reject): no silent plain-text connection
    plain_pg = _cli(["status", "later"], {**env, "TIERING_DATABASE_URL": tls_database_url.split("?")[0] +
                                          "?sslmode=disable"}, tmp_path)
    assert "TIERING_DATABASE_URL" in _one_line_error(plain_pg)
    # with the right CAs the same commands work
    assert _cli(["offload-prefix", "later", "1:0"], env, tmp_path).returncode == 0


def _cli(args, env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tiering", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    return lines[0]
