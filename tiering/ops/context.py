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
