"""The dependencies every operation takes, bundled: metadata store, tier-1 store, tier-2 bucket, knobs."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from tiering.metadata.repository import MetadataStore
from tiering.tier1 import Tier1Store
from tiering.tier2.objects import Bucket

MIB = 1024 * 1024


@dataclass(frozen=True)
class Knobs:
    block_size: int = 64 * MIB
    upload_concurrency: int = 4
    page_size: int = 64 * 1024  # target bytes of a checksummed page (tiering/format/pages.py)
    # Ledgers smaller than this, of one topic in one run, share one data and one index object
    # (tiering/ops/offload_batch.py), up to batch_max_bytes and batch_max_ledgers per batch; 0 disables.
    batch_small_bytes: int = 8 * MIB
    batch_max_bytes: int = 256 * MIB
    batch_max_ledgers: int = 10_000
    # An OFFLOADING attempt older than this is presumed dead and taken over; its keys are collectable then.
    offload_timeout: timedelta = timedelta(hours=1)
    # Objects merged away or trimmed stay this long so readers holding old metadata can finish.
    gc_delay: timedelta = timedelta(minutes=10)


@dataclass(frozen=True)
class Deps:
    meta: MetadataStore
    tier1: Tier1Store
    bucket: Bucket
    knobs: Knobs = field(default_factory=Knobs)
