"""`TieringHook`: the Airflow connections of the pipeline, `tiering_metadata` (postgres) and `tiering_s3`
(aws), resolved into `tiering.config.Settings`. The operator (airflow_dags.py, preflight) and the dashboard
plugin use it; config.py itself imports no Airflow.

S3 credentials come from the Amazon provider's `AwsBaseHook`, so a connection may use what Airflow users
expect of an aws connection: keys in login/password, a session token, a `role_arn` to assume, a
`profile_name`, or none (boto3's default chain). Secrets are masked in task logs by the provider and never
appear in messages: errors name the connection and the exception type only.
"""
from __future__ import annotations

import os
from typing import Mapping

from airflow.sdk import BaseHook

from tiering.config import Settings
from tiering.database_url import LIBPQ_PARAMS
from tiering.errors import ConfigError



class TieringHook(BaseHook):
    conn_name_attr = "metadata_conn_id"
    default_conn_name = "tiering_metadata"
    hook_name = "Tiering"

    def __init__(self, metadata_conn_id: str = "tiering_metadata", s3_conn_id: str = "tiering_s3", **kwargs):
        super().__init__(**kwargs)
        self.metadata_conn_id = metadata_conn_id
        self.s3_conn_id = s3_conn_id

    @staticmethod
    def database_url(conn) -> str:
        """A SQLAlchemy URL from an Airflow postgres connection (credentials quoted; never log it). libpq's TLS
        settings in the connection's extra (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`: the Postgres
        provider's names) and its `options` go into the URL's query, which psycopg2 passes to libpq as they
        are."""
        from sqlalchemy.engine import URL

        extra = conn.extra_dejson or {}
        query = {k: str(extra[k]) for k in LIBPQ_PARAMS if extra.get(k) not in (None, "")}
        return URL.create(
            "postgresql+psycopg2", username=conn.login or None, password=conn.password or None,
            host=conn.host or None, port=conn.port or None, database=conn.schema or None, query=query,
        ).render_as_string(hide_password=False)

    def get_settings(self, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from the connections, the environment filling what they do not say; validated as
        `Settings.from_env` validates the environment (same messages)."""
        env = dict(os.environ if environ is None else environ)
        env["TIERING_DATABASE_URL"] = self.database_url(self.get_connection(self.metadata_conn_id))
        aws = self.get_connection(self.s3_conn_id)
        extra = aws.extra_dejson or {}
        env.update(self._s3_credentials_env(aws))
        # as text, as the environment gives them: a JSON number or list is then refused by name, not by a TypeError
        if extra.get("endpoint_url"):
            env["TIERING_S3_ENDPOINT_URL"] = str(extra["endpoint_url"])
        if extra.get("region_name"):
            env["AWS_DEFAULT_REGION"] = str(extra["region_name"])
        if isinstance(extra.get("verify"), str) and extra["verify"]:
            # the Amazon provider's botocore `verify`: a CA bundle path (True/False are not ours to honour:
            # verification is never switched off)
            env["TIERING_S3_CA_BUNDLE"] = extra["verify"]
        for key, var in (("bucket", "TIERING_BUCKET"), ("prefix", "TIERING_PREFIX"),
                         ("offload_timeout_seconds", "TIERING_OFFLOAD_TIMEOUT_SECONDS"),
                         ("gc_delay_seconds", "TIERING_GC_DELAY_SECONDS"),
                         ("s3_timeout_seconds", "TIERING_S3_TIMEOUT_SECONDS"),
                         ("sse", "TIERING_S3_SSE"), ("sse_kms_key_id", "TIERING_S3_SSE_KMS_KEY_ID"),
                         ("sse_c_key_file", "TIERING_S3_SSE_C_KEY_FILE"), ("ca_bundle", "TIERING_S3_CA_BUNDLE")):
            if extra.get(key) not in (None, ""):
                env[var] = str(extra[key])
        return Settings.from_env(env)

    def _s3_credentials_env(self, conn) -> dict[str, str]:
        """AWS_* variables of the credentials the aws connection resolves to (frozen now: a job gets a
        snapshot, so an assumed role's session must outlive the task). A connection that resolves to no
        credentials at all leaves the environment's (boto3's default chain where the job runs), as before."""
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        extra = conn.extra_dejson or {}
        if not (conn.login or conn.password or extra.get("role_arn") or extra.get("profile_name")
                or extra.get("aws_session_token")):
            return {}
        try:
            creds = AwsBaseHook(aws_conn_id=self.s3_conn_id, client_type="s3").get_credentials()
        except Exception as exc:  # noqa: BLE001 - a provider/STS message may carry key ids: type only
            raise ConfigError(f"the Airflow connection {self.s3_conn_id!r} gives no usable S3 credentials "
                              f"({type(exc).__name__})") from None
        env = {"AWS_ACCESS_KEY_ID": creds.access_key, "AWS_SECRET_ACCESS_KEY": creds.secret_key}
        if creds.token:
            env["AWS_SESSION_TOKEN"] = creds.token
        return {k: v for k, v in env.items() if v}
