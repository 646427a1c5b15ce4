"""Fixtures of the fault-injection suite: deps on the run's services with a 1 s offload timeout (so a dead
attempt is taken over after a short sleep), and the environment a worker process needs to reach the same
database, bucket and tier-1 root."""
from __future__ import annotations

import pytest

from tests.faults.harness import OFFLOAD_TIMEOUT
from tests.integration.helpers import MIB, make_deps


@pytest.fixture
def deps(db, s3_client, bucket, tier1_root):
    return make_deps(db, s3_client, bucket, tier1_root, offload_timeout=OFFLOAD_TIMEOUT, upload_concurrency=2)


@pytest.fixture
def worker_env(database_url, s3_settings, bucket, tier1_root):
    """Settings for `python -m tests.faults.worker`, as the production jobs get them (environment)."""
    return {
        "TIERING_DATABASE_URL": database_url,
        "TIERING_BUCKET": bucket,
        "TIERING_PREFIX": "t/",
        "TIERING_TIER1_ROOT": str(tier1_root),
        "TIERING_S3_ENDPOINT_URL": s3_settings["endpoint_url"],
        "AWS_ACCESS_KEY_ID": s3_settings["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": s3_settings["aws_secret_access_key"],
        "AWS_DEFAULT_REGION": s3_settings["region_name"],
        "TIERING_BLOCK_SIZE": str(5 * MIB),
        "TIERING_UPLOAD_CONCURRENCY": "2",
    }
