"""A topic's Iceberg table on the TLS gateway with server-side encryption: every object under
`<prefix>-tables/` (metadata JSON, manifest lists, manifests, data files) is encrypted as tier 2's are
(SSE-KMS, SSE-C), the CA bundle is trusted, and the table reads back equal to `tiering read`."""
from __future__ import annotations

import base64
import hashlib

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, make_deps, produce
from tests.integration.test_encryption import (_empty, bucket_keys_of, enc_bucket, read_all,  # noqa: F401
                                               settings_for, sse_c_key_file, tls_rgw)
from tiering.metadata.table_sync import TableRows
from tiering.ops.offload import offload_many
from tiering.tables.catalog import catalog
from tiering.tables.files import local_writer
from tiering.tables.sync import TableSync, sync_tables
from tiering.tier2.client import make_client
from tiering.tier2.objects import Bucket


@pytest.mark.parametrize("mode", ["aws:kms", "SSE-C"])
def test_table_files_are_encrypted(mode, db, database_url, tls_rgw, enc_bucket, s3_settings, tmp_path,  # noqa: F811
                                   sse_c_key_file):  # noqa: F811
    tier1 = tmp_path / "tier1"
    tier1.mkdir()
    extra = ({"s3_sse": "aws:kms", "s3_sse_kms_key_id": tls_rgw["kms_key_id"]} if mode == "aws:kms"
             else {"s3_sse_c_key_file": sse_c_key_file})
    settings = settings_for(database_url, tls_rgw, s3_settings, enc_bucket, tier1, **extra)
    client = make_client(settings)
    _empty(Bucket(client, enc_bucket, "t/"))
    deps = make_deps(db, client, enc_bucket, tier1)
    expected = produce(deps, "enc", [entries("a", 20, 300), entries("b", 10, 100)])
    assert not offload_many(deps, deps.meta.list_ledgers("enc")[:1]).failed
    cat = catalog(settings)
    with db.begin() as conn:
        conn.execute(text("DELETE FROM iceberg_tables"))
    TableRows(db).set_policy("enc", "ns.enc", "follow")
    [r] = sync_tables(TableSync(db, settings, cat), local_writer(deps, settings))
    assert r.status == "synced", r.error
    t = cat.load_table("ns.enc").scan().to_arrow()
    assert dict(zip(zip(t["ledger_id"].to_pylist(), t["entry_id"].to_pylist()), t["payload"].to_pylist())) \
        == expected == read_all(deps, "enc")
    keys = {k for k in bucket_keys_of(Bucket(client, enc_bucket, "")) if k.startswith("t-tables/")}
    assert any(k.endswith(".parquet") for k in keys) and any(k.endswith(".avro") for k in keys) \
        and any(k.endswith(".metadata.json") for k in keys), keys
    for key in sorted(keys):
        head = client.head_object(Bucket=enc_bucket, Key=key)
        if mode == "aws:kms":
            assert (head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")) == ("aws:kms", "testkey-1"), key
        else:
            md5 = base64.b64encode(hashlib.md5(settings.s3_sse_c_key).digest()).decode()
            assert (head.get("SSECustomerAlgorithm"), head.get("SSECustomerKeyMD5")) == ("AES256", md5), key
