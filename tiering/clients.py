"""The one client factory: the SQLAlchemy engine, the boto3 S3 client, the tier-2 bucket and the operations'
`Deps`, built from `Settings`.

`config.py` is the ground floor: it reads and validates settings and builds nothing. Building a client needs
the layers above it (metadata, tier2, ops), so the factory lives here, above `ops/`, and the CLI, the Spark
jobs, the DAGs and the tests all call it. Heavy libraries are imported inside the functions on purpose:
`tiering --help` and a refused argument must not pay for SQLAlchemy or boto3."""
from __future__ import annotations

from tiering.config import Settings, reuse_freed_buffers


def engine(settings: Settings, **kwargs):
    from tiering.metadata.db import make_engine

    return make_engine(settings.database_url, **kwargs)


def s3_client(settings: Settings, max_pool_connections: int = 32):
    """The boto3 client of tier 2, with the settings' CA bundle and server-side encryption (SSE-S3, SSE-KMS or
    SSE-C) on every request that needs it: built by tiering.tier2.client (tier 2 owns every S3 call)."""
    from tiering.tier2.client import make_client

    return make_client(settings, max_pool_connections)


def bucket(settings: Settings, client=None):
    """Tier 2. A process that builds one moves buffers of megabytes: its allocator keeps them (config.py)."""
    from tiering.tier2.objects import Bucket

    reuse_freed_buffers()
    return Bucket(client or s3_client(settings), settings.bucket, settings.prefix)


def deps(settings: Settings, *, pool_size: int = 5, knobs=None, **knob_overrides):
    """Everything an operation takes: metadata store, tier-1 store, tier-2 bucket and the knobs (from the
    settings unless given)."""
    from tiering.metadata.repository import MetadataStore
    from tiering.ops.context import Deps, Knobs
    from tiering.tier1 import Tier1Store

    return Deps(MetadataStore(engine(settings, pool_size=pool_size)), Tier1Store(settings.tier1_root),
                bucket(settings), knobs or Knobs.from_settings(settings, **knob_overrides))
