"""The dependencies every operation takes, bundled: metadata store, tier-1 store, tier-2 bucket, knobs."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from tiering.config import INTS, Settings
from tiering.metadata.repository import MetadataStore
from tiering.model import MIB
from tiering.tier1 import Tier1Store
from tiering.tier2.objects import Bucket


@dataclass(frozen=True)
class Knobs:
    """What operations are tuned by. Those the settings give default to the settings' defaults (config.INTS,
    the one place they are defined); `from_settings` maps them."""
    block_size: int = INTS["block_size"].default
    upload_concurrency: int = INTS["upload_concurrency"].default
    page_size: int = INTS["page_size"].default  # target bytes of a checksummed page (tiering/format/pages.py)
    # Ledgers smaller than this, of one topic in one run, share one data and one index object
    # (tiering/ops/offload_batch.py), up to batch_max_bytes and batch_max_ledgers per batch; 0 disables.
    batch_small_bytes: int = INTS["offload_batch_bytes"].default
    batch_max_bytes: int = 256 * MIB
    batch_max_ledgers: int = 10_000
    # An OFFLOADING attempt older than this is presumed dead and taken over; its keys are collectable then.
    offload_timeout: timedelta = timedelta(seconds=INTS["offload_timeout_seconds"].default)
    # Objects merged away or trimmed stay this long so readers holding old metadata can finish.
    gc_delay: timedelta = timedelta(seconds=INTS["gc_delay_seconds"].default)
    # Upload rate limit of this process in bytes per second (0: none); a Spark job gives each task its share.
    max_bytes_per_second: int = INTS["offload_max_bytes_per_second"].default

    @classmethod
    def from_settings(cls, settings: Settings, **overrides) -> Knobs:
        """The knobs the settings give (the CLI, the Spark jobs and the tests' workers build them here)."""
        return cls(**{"block_size": settings.block_size, "upload_concurrency": settings.upload_concurrency,
                      "page_size": settings.page_size, "batch_small_bytes": settings.offload_batch_bytes,
                      "offload_timeout": settings.offload_timeout, "gc_delay": settings.gc_delay,
                      "max_bytes_per_second": settings.offload_max_bytes_per_second, **overrides})


@dataclass(frozen=True)
class Deps:
    meta: MetadataStore
    tier1: Tier1Store
    bucket: Bucket
    knobs: Knobs = field(default_factory=Knobs)


def select_topics(meta: MetadataStore, topic: str | None):
    """The one named topic (an unknown name fails), or every topic when none is named."""
    return [meta.get_topic(topic)] if topic else meta.list_topics()
