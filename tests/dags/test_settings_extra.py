"""The offload timeout, GC delay and S3 timeout as settings of the `tiering_s3` connection's extra: what every
DAG task resolves with TieringHook().get_settings(), validated like the environment (ASCII digits, bounds).
Run in a subprocess so Airflow's import does not leak into other tests."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import json, os, sys
from tiering.jobs.hook import TieringHook
from tiering.errors import ConfigError
out = []
for extra, env in json.loads(sys.argv[1]):
    os.environ["AIRFLOW_CONN_TIERING_S3"] = json.dumps({"conn_type": "aws", "login": "AK", "password": "SK",
                                                        "extra": {"bucket": "tiering", **extra}})
    try:
        s = TieringHook().get_settings({**os.environ, **env})
        out.append({"offload_timeout": s.offload_timeout_seconds, "gc_delay": s.gc_delay_seconds,
                    "s3_timeout": s.s3_timeout_seconds,
                    "env": {k: v for k, v in s.to_env().items() if k.endswith("_SECONDS")}})
    except ConfigError as exc:
        out.append({"error": str(exc)})
print(json.dumps(out))
"""

CASES = {
    "defaults": ({}, {}, {"offload_timeout": 3600, "gc_delay": 600, "s3_timeout": 60}),
    "extra": ({"offload_timeout_seconds": 60, "gc_delay_seconds": "0", "s3_timeout_seconds": "5"}, {},
              {"offload_timeout": 60, "gc_delay": 0, "s3_timeout": 5}),
    "s3-timeout-zero": ({"s3_timeout_seconds": 0}, {}, "TIERING_S3_TIMEOUT_SECONDS must be from 1 to"),
    "environment": ({}, {"TIERING_OFFLOAD_TIMEOUT_SECONDS": "120"}, {"offload_timeout": 120, "gc_delay": 600}),
    "extra-wins": ({"offload_timeout_seconds": "30"}, {"TIERING_OFFLOAD_TIMEOUT_SECONDS": "120"},
                   {"offload_timeout": 30, "gc_delay": 600}),
    "arabic-digits": ({"offload_timeout_seconds": "\u0666\u0660"}, {},
                      "TIERING_OFFLOAD_TIMEOUT_SECONDS must be an integer in ASCII"),
    "huge": ({"gc_delay_seconds": 10**40}, {}, "TIERING_GC_DELAY_SECONDS must be from 0 to"),
    "zero": ({"offload_timeout_seconds": 0}, {}, "TIERING_OFFLOAD_TIMEOUT_SECONDS must be from 1 to"),
    # the Amazon provider's own keys, not text: refused by name (they failed with a TypeError's traceback)
    "endpoint-not-text": ({"endpoint_url": 9000}, {}, "TIERING_S3_ENDPOINT_URL must be an http"),
    "region-not-text": ({"region_name": ["eu-west-1"]}, {}, "AWS_DEFAULT_REGION must be a region name"),
}


def test_timeouts_from_the_s3_connection_extra(tmp_path):
    home = tmp_path / "airflow-home"
    home.mkdir()
    run_env = {"AIRFLOW_CONN_TIERING_METADATA": json.dumps({"conn_type": "postgres", "host": "db", "login": "u",
                                                            "password": "pw", "schema": "tiering", "port": 5432}),
               "AIRFLOW_HOME": str(home), "PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(REPO),
               "TIERING_TIER1_ROOT": str(tmp_path / "tier1"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
               "AIRFLOW__LOGGING__LOGGING_LEVEL": "ERROR"}
    cases = [[extra, env] for extra, env, _ in CASES.values()]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases)], env=run_env, capture_output=True,
                          text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for (name, (_, _, want)), got in zip(CASES.items(), results):
        if isinstance(want, str):
            assert want in got.get("error", ""), (name, got)
            continue
        assert {k: got[k] for k in want} == want, (name, got)
        # what spark-submit's environment gets
        assert got["env"] == {"TIERING_OFFLOAD_TIMEOUT_SECONDS": str(want["offload_timeout"]),
                              "TIERING_GC_DELAY_SECONDS": str(want["gc_delay"]),
                              "TIERING_S3_TIMEOUT_SECONDS": str(got["s3_timeout"])}, (name, got)


# Encryption and TLS: the `tiering_s3` extra's sse / sse_kms_key_id / sse_c_key_file / ca_bundle
# (or the Amazon provider's `verify`), the `tiering_metadata` extra's sslmode / sslrootcert.
SECURITY_PROBE = """
import json, os, sys
from tiering.jobs.hook import TieringHook
from tiering.errors import ConfigError
out = []
for s3_extra, pg_extra in json.loads(sys.argv[1]):
    os.environ["AIRFLOW_CONN_TIERING_S3"] = json.dumps({"conn_type": "aws", "login": "AK", "password": "SK",
                                                        "extra": {"bucket": "tiering", **s3_extra}})
    os.environ["AIRFLOW_CONN_TIERING_METADATA"] = json.dumps({"conn_type": "postgres", "host": "db", "login": "u",
                                                              "password": "pw", "schema": "tiering",
                                                              "extra": pg_extra})
    try:
        s = TieringHook().get_settings()
        out.append({"repr": repr(s), "enc": repr(s.s3_encryption), "env": s.to_env(), "url": s.database_url,
                    "key": s.s3_sse_c_key.hex() if s.s3_sse_c_key else None})
    except ConfigError as exc:
        out.append({"error": str(exc)})
print(json.dumps(out))
"""


def test_encryption_and_tls_from_the_connections_extra(tmp_path):
    home = tmp_path / "airflow-home"
    home.mkdir()
    key = bytes(range(32))
    (tmp_path / "sse-c.key").write_bytes(key)
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    ca, key_file = str(tmp_path / "ca.pem"), str(tmp_path / "sse-c.key")
    https = {"endpoint_url": "https://s3.example:8443"}
    cases = [
        [{"sse": "aws:kms", "sse_kms_key_id": "testkey-1", **https, "ca_bundle": ca},
         {"sslmode": "verify-full", "sslrootcert": ca}],
        [{"sse_c_key_file": key_file, **https, "verify": ca}, {"options": "-c search_path=extra,public"}],
        [{"sse": "DES"}, {}],
        [{"sse": "AES256", "sse_c_key_file": key_file}, {}],
        [{"ca_bundle": ca, "endpoint_url": "http://s3.example"}, {}],
        [{}, {"sslmode": "verify-everything"}],
    ]
    run_env = {"AIRFLOW_HOME": str(home), "PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(REPO),
               "TIERING_TIER1_ROOT": str(tmp_path / "tier1"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
               "AIRFLOW__LOGGING__LOGGING_LEVEL": "ERROR"}
    proc = subprocess.run([sys.executable, "-c", SECURITY_PROBE, json.dumps(cases)], env=run_env,
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kms, ssec, bad_sse, both, http_ca, bad_sslmode = json.loads(proc.stdout.strip().splitlines()[-1])
    assert kms["enc"] == "S3Encryption(mode='aws:kms', kms_key_id='testkey-1')", kms
    assert {k: kms["env"][k] for k in ("TIERING_S3_SSE", "TIERING_S3_SSE_KMS_KEY_ID", "TIERING_S3_CA_BUNDLE")} == \
        {"TIERING_S3_SSE": "aws:kms", "TIERING_S3_SSE_KMS_KEY_ID": "testkey-1", "TIERING_S3_CA_BUNDLE": ca}
    # libpq's TLS settings reach the URL psycopg2 connects with (and so spark-submit's environment)
    assert "sslmode=verify-full" in kms["url"] and f"sslrootcert={ca}" in kms["url"].replace("%2F", "/"), kms["url"]
    assert kms["env"]["TIERING_DATABASE_URL"] == kms["url"]
    # SSE-C: the key is read from the file; the environment a job gets carries the path, never the key
    assert ssec["key"] == key.hex() and ssec["enc"] == "S3Encryption(mode='SSE-C', kms_key_id=None)"
    # the connection's server options reach the URL too (the search_path the catalog's tables are found in)
    from sqlalchemy.engine import make_url
    assert make_url(ssec["url"]).query == {"options": "-c search_path=extra,public"}, ssec["url"]
    assert ssec["env"]["TIERING_S3_SSE_C_KEY_FILE"] == key_file and ssec["env"]["TIERING_S3_CA_BUNDLE"] == ca
    assert key.hex() not in json.dumps(ssec["env"]) and key.hex() not in ssec["repr"]
    assert "TIERING_S3_SSE must be one of none, AES256, aws:kms" in bad_sse["error"]
    assert "exclude each other" in both["error"]
    assert "TIERING_S3_CA_BUNDLE is set but TIERING_S3_ENDPOINT_URL is not an https:// URL" in http_ca["error"]
    assert "sslmode must be one of" in bad_sslmode["error"]


def test_the_metadata_connection_carries_the_urls_libpq_settings():
    """`.ci/airflow_env.py` makes `tiering_metadata` from TIERING_DATABASE_URL: its TLS settings and server
    options go into the connection's extra, where the hook takes them from; nothing else of the query."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("airflow_env_conns", REPO / ".ci" / "airflow_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = {"TIERING_DATABASE_URL": "postgresql://u:pw@db:6543/meta?sslmode=require&application_name=x&"
                                   "options=-c%20search_path%3Dextra%2Cpublic", "TIERING_BUCKET": "b"}
    pg = module.connections(env)["tiering_metadata"]
    assert pg["extra"] == {"sslmode": "require", "options": "-c search_path=extra,public"}
    assert (pg["host"], pg["port"], pg["schema"], pg["login"], pg["password"]) == ("db", 6543, "meta", "u", "pw")
    assert "extra" not in module.connections({**env, "TIERING_DATABASE_URL": "postgresql://u@db/meta"})["tiering_metadata"]
