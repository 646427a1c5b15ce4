"""Server-side encryption of every object the product writes, on the local Ceph RGW's TLS gateway
(`.ci/ceph.sh tls-rgw`: an https endpoint with a generated CA and RGW's KMS `testing` backend; RGW refuses
SSE over plain http).

Each mode builds one small world through every write path (offload of one ledger, batch offload, defrag's
merged objects with a server-side copied part, retention's trim marker, the metadata export's Parquet parts
and manifest), then HEADs every object in the bucket and checks the encryption the server reports. SSE-C:
the objects are unreadable without the key and readable with it by the reader and `tiering verify`.
SSE-S3 (AES256): RGW 16 accepts the header and stores the object in plain text, so the product refuses the
write. Refusals are one line naming the setting."""
from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RUN_ID, TLS_STARTED_BY_TESTS
from tests.integration.helpers import entries, make_deps, produce
from tiering.config import Settings
from tiering.errors import Tier2Error
from tiering.format.keys import trim_marker_key
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops import export_metadata as ex
from tiering.ops.defrag import defrag
from tiering.ops.offload import offload_many
from tiering.ops.retention import retention
from tiering.read import Entry, ReadHandle
from tiering.tier2.arrowfs import s3_filesystem
from tiering.tier2.client import make_client
from tiering.tier2.objects import Bucket, put_bytes
from tiering.tier2.reader import tier2_opener

ROOT = Path(__file__).resolve().parents[2]
CEPH = ROOT / ".local" / "ceph"
BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
MIB = 1024 * 1024


def _read_env(path: Path) -> dict:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


_GATEWAY: dict = {}  # one TLS gateway for the run, shared by this module and test_tls.py


@pytest.fixture(scope="module")
def tls_rgw():
    """The TLS gateway: started once per run unless it runs already (then left running). The run's workers
    share it (this module and test_tls.py may run on two of them), so a worker that starts it only marks it
    ours; the run stops it once every worker is done (tests/conftest.py, pytest_sessionfinish)."""
    import fcntl

    if not _GATEWAY:
        run = {"capture_output": True, "text": True, "env": {**os.environ, "PY": sys.executable}, "timeout": 120}
        with open(CEPH / "rgw-tls.lock", "w") as lock:  # two workers asking at once: one starts it
            fcntl.flock(lock, fcntl.LOCK_EX)
            started = not (CEPH / "rgw-tls.pid").exists()
            proc = subprocess.run(["bash", str(ROOT / ".ci" / "ceph.sh"), "tls-rgw"], **run)
            if proc.returncode != 0:
                pytest.fail(f"ceph.sh tls-rgw failed: {proc.stderr[-500:]}", pytrace=False)
            if started:
                TLS_STARTED_BY_TESTS.touch()
        env = _read_env(CEPH / "tls" / "env")
        _GATEWAY.update(url=env["S3_URL"], ca=Path(env["CA_BUNDLE"]), kms_key_id=env["KMS_KEY_ID"])
    return dict(_GATEWAY)


@pytest.fixture(scope="module")
def enc_bucket(tls_rgw, s3_settings):
    import boto3

    s3 = boto3.client("s3", endpoint_url=tls_rgw["url"], verify=str(tls_rgw["ca"]),
                      aws_access_key_id=s3_settings["aws_access_key_id"],
                      aws_secret_access_key=s3_settings["aws_secret_access_key"], region_name="us-east-1")
    name = f"tiering-enc-{RUN_ID}"
    s3.create_bucket(Bucket=name)
    yield name
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
        if page.get("Contents"):
            s3.delete_objects(Bucket=name, Delete={"Objects": [{"Key": o["Key"]} for o in page["Contents"]]})
    for up in s3.list_multipart_uploads(Bucket=name).get("Uploads", []):
        s3.abort_multipart_upload(Bucket=name, Key=up["Key"], UploadId=up["UploadId"])
    s3.delete_bucket(Bucket=name)


@pytest.fixture
def sse_c_key_file(tmp_path):
    path = tmp_path / "sse-c.key"
    path.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    path.chmod(0o600)
    return path


def settings_for(database_url, tls_rgw, s3_settings, bucket, tier1_root, **extra) -> Settings:
    return Settings(database_url=database_url, bucket=bucket, tier1_root=tier1_root, prefix="t/",
                    s3_endpoint_url=tls_rgw["url"], s3_ca_bundle=tls_rgw["ca"],
                    aws_access_key_id=s3_settings["aws_access_key_id"],
                    aws_secret_access_key=s3_settings["aws_secret_access_key"], **extra)


def _empty(b: Bucket) -> None:
    keys = bucket_keys_of(b)
    if keys:
        b.s3.delete_objects(Bucket=b.name, Delete={"Objects": [{"Key": k} for k in keys]})


def bucket_keys_of(b: Bucket) -> set[str]:
    return {o["Key"] for page in b.s3.get_paginator("list_objects_v2").paginate(Bucket=b.name)
            for o in page.get("Contents", [])}


def read_all(deps, topic):
    return {(e.ledger_id, e.entry_id): e.data
            for e in ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket)).read(topic) if isinstance(e, Entry)}


def write_every_path(deps, engine, settings) -> dict:
    """One world through every write path; returns what each topic holds and the keys each path wrote."""
    world, paths = {}, {}
    world["one"] = produce(deps, "one", [entries("o", 20, 1000)])  # a lone ledger: the single offload
    world["many"] = produce(deps, "many", [entries(f"m{i}", 10, 500) for i in range(3)])  # one batch
    # a >= 5 MiB ledger and two small ones: defrag copies the first server-side (UploadPartCopy)
    world["frag"] = produce(deps, "frag", [entries("f0", 52, 100 * 1024), entries("f1", 5, 100),
                                           entries("f2", 5, 100)])
    world["ret"] = produce(deps, "ret", [entries(f"r{i}", 4, 1000) for i in range(3)],
                           TopicPolicy(retention_bytes=4000, **BIG))
    single = deps.__class__(deps.meta, deps.tier1, deps.bucket, deps.knobs.__class__(
        **{**deps.knobs.__dict__, "batch_small_bytes": 0}))
    for topic in ("one", "frag", "ret"):
        assert not offload_many(single, deps.meta.list_ledgers(topic, [S.SEALED])).failed
    assert not offload_many(deps, deps.meta.list_ledgers("many", [S.SEALED])).failed
    paths["batch"] = {c.data_key for c in deps.meta.chunks("many").values()}
    assert len(paths["batch"]) == 1  # the three ledgers share one object pair
    before = bucket_keys_of(deps.bucket)
    report = defrag(deps, "frag", small_bytes=8 * MIB)
    assert report.groups == 1 and report.bytes_copied_server_side > 5 * MIB, report
    paths["defrag"] = bucket_keys_of(deps.bucket) - before
    assert sorted(retention(deps, "ret").deleted) == [("ret", 0), ("ret", 1)]
    world["ret"] = {k: v for k, v in world["ret"].items() if k[0] == 2}
    paths["trim marker"] = {trim_marker_key("t/", "ret")}
    fs = s3_filesystem(settings)
    ex.export_metadata(engine, fs, f"{settings.bucket}/export")
    paths["export"] = {k for k in bucket_keys_of(deps.bucket) if k.startswith("export/")}
    assert "export/manifest.json" in paths["export"] and any(k.endswith(".parquet") for k in paths["export"])
    return {"world": world, "paths": paths}


@pytest.mark.parametrize("mode", ["aws:kms", "SSE-C"])
def test_every_write_path_is_encrypted(mode, db, database_url, tls_rgw, enc_bucket, s3_settings, tmp_path,
                                       sse_c_key_file):
    tier1 = tmp_path / "tier1"
    extra = ({"s3_sse": "aws:kms", "s3_sse_kms_key_id": tls_rgw["kms_key_id"]} if mode == "aws:kms"
             else {"s3_sse_c_key_file": sse_c_key_file})
    settings = settings_for(database_url, tls_rgw, s3_settings, enc_bucket, tier1, **extra)
    client = make_client(settings)
    b = Bucket(client, enc_bucket, "t/")
    _empty(b)
    deps = make_deps(db, client, enc_bucket, tier1, batch_small_bytes=8 * MIB)
    built = write_every_path(deps, db, settings)
    for name, keys in built["paths"].items():
        assert keys, f"{name} wrote nothing"
    all_keys = bucket_keys_of(b)
    assert len(all_keys) >= 12, all_keys
    for key in sorted(all_keys):  # every object, whichever path wrote it
        head = client.head_object(Bucket=enc_bucket, Key=key)
        if mode == "aws:kms":
            assert (head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")) == ("aws:kms", "testkey-1"), key
        else:
            md5 = base64.b64encode(hashlib.md5(settings.s3_sse_c_key).digest()).decode()
            assert (head.get("SSECustomerAlgorithm"), head.get("SSECustomerKeyMD5")) == ("AES256", md5), key
    # read back by the reader from tier 2 alone (the tier-1 copies go)
    for topic in built["world"]:
        for led in deps.meta.list_ledgers(topic, [S.OFFLOADED]):
            deps.meta.mark_tier1_deleted(led)
            deps.tier1.delete(topic, led.ledger_id)
    for topic, expected in built["world"].items():
        assert read_all(deps, topic) == expected, topic
    if mode == "SSE-C":
        check_sse_c_needs_the_key(deps, settings, tls_rgw, s3_settings, all_keys, tmp_path)


def check_sse_c_needs_the_key(deps, settings, tls_rgw, s3_settings, keys, tmp_path):
    import boto3
    from botocore.exceptions import ClientError

    plain = boto3.client("s3", endpoint_url=tls_rgw["url"], verify=str(tls_rgw["ca"]),
                         aws_access_key_id=s3_settings["aws_access_key_id"],
                         aws_secret_access_key=s3_settings["aws_secret_access_key"], region_name="us-east-1")
    for key in sorted(keys)[:3]:
        with pytest.raises(ClientError):
            plain.get_object(Bucket=settings.bucket, Key=key)["Body"].read()
    # the product without the key: one error naming the setting, never bytes
    no_key = make_client(settings.with_(s3_sse_c_key_file=None))
    blind = deps.__class__(deps.meta, deps.tier1, Bucket(no_key, settings.bucket, "t/"), deps.knobs)
    with pytest.raises(Tier2Error, match="TIERING_S3_SSE_C_KEY_FILE"):
        read_all(blind, "one")
    # `tiering verify` with the key passes; without it, exit 1 naming the setting
    env = {**os.environ, **settings.to_env()}
    ok = subprocess.run([sys.executable, "-m", "tiering", "verify", "many"], env=env, capture_output=True,
                        text=True, timeout=120, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    env.pop("TIERING_S3_SSE_C_KEY_FILE")
    bad = subprocess.run([sys.executable, "-m", "tiering", "verify", "many"], env=env, capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr + bad.stdout, bad.stdout + bad.stderr
    assert "TIERING_S3_SSE_C_KEY_FILE" in bad.stdout + bad.stderr
    assert base64.b64encode(settings.s3_sse_c_key).decode() not in bad.stdout + bad.stderr + ok.stdout + ok.stderr


def test_sse_s3_on_rgw16_is_refused_not_written_in_plain_text(database_url, tls_rgw, enc_bucket, s3_settings,
                                                              tmp_path):
    """RGW 16 answers `x-amz-server-side-encryption: AES256` with 200 and no encryption (checked: HEAD reports
    none); the product fails the write instead, naming the setting."""
    settings = settings_for(database_url, tls_rgw, s3_settings, enc_bucket, tmp_path, s3_sse="AES256")
    with pytest.raises(Tier2Error, match="ServerSideEncryptionNotApplied.*TIERING_S3_SSE=AES256"):
        put_bytes(Bucket(make_client(settings), enc_bucket, "t/"), "t/sse-s3", b"x", {})


def test_encryption_refusals_are_one_line_naming_the_setting(database_url, tls_rgw, enc_bucket, s3_settings,
                                                             tmp_path, sse_c_key_file):
    """A KMS key the store does not have; SSE-KMS and SSE-C over plain http (the project's first gateway,
    which keeps RGW's `rgw crypt require ssl = true`): each a one-line error naming the setting, exit 1."""
    base = settings_for(database_url, tls_rgw, s3_settings, enc_bucket, tmp_path / "tier1").to_env()
    plain = {k: v for k, v in base.items() if k != "TIERING_S3_CA_BUNDLE"}
    plain["TIERING_S3_ENDPOINT_URL"] = s3_settings["endpoint_url"]
    cases = [({**base, "TIERING_S3_SSE": "aws:kms", "TIERING_S3_SSE_KMS_KEY_ID": "no-such-key"},
              "TIERING_S3_SSE=aws:kms"),
             ({**plain, "TIERING_S3_SSE": "aws:kms", "TIERING_S3_SSE_KMS_KEY_ID": "testkey-1"}, "plain http"),
             ({**plain, "TIERING_S3_SSE_C_KEY_FILE": str(sse_c_key_file)}, "TIERING_S3_SSE_C_KEY_FILE")]
    for env, named in cases:
        settings = Settings.from_env(env)
        with pytest.raises(Tier2Error, match=named) as err:
            put_bytes(Bucket(make_client(settings), enc_bucket, "t/"), "t/refused", b"x", {})
        assert "\n" not in str(err.value)
    # a bucket policy that requires SSE (RGW 16 enforces it): refused without, accepted with TIERING_S3_SSE
    import json

    admin = make_client(Settings.from_env(base))
    admin.put_bucket_policy(Bucket=enc_bucket, Policy=json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Deny", "Principal": "*", "Action": "s3:PutObject", "Resource": f"arn:aws:s3:::{enc_bucket}/*",
        "Condition": {"Null": {"s3:x-amz-server-side-encryption": "true"}}}]}))
    try:
        with pytest.raises(Tier2Error, match="AccessDenied.*TIERING_S3_SSE is none: a bucket policy"):
            put_bytes(Bucket(admin, enc_bucket, "t/"), "t/policy", b"x", {})
        kms = Settings.from_env({**base, "TIERING_S3_SSE": "aws:kms", "TIERING_S3_SSE_KMS_KEY_ID": "testkey-1"})
        put_bytes(Bucket(make_client(kms), enc_bucket, "t/"), "t/policy", b"x", {})
    finally:
        admin.delete_bucket_policy(Bucket=enc_bucket)
