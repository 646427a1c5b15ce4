"""Listings recovery needs, with S3 errors mapped to `Tier2Error`: the prefix's topic segments (one LIST per
1,000 topics, whatever the number of objects: the driver of the recovery job plans with it) and one
topic's objects (what an executor then reads)."""
from __future__ import annotations

from typing import Iterator

from botocore.exceptions import BotoCoreError, ClientError

from tiering.tier2.errors import tier2_error
from tiering.tier2.objects import Bucket


def _pages(b: Bucket, prefix: str, **kwargs) -> Iterator[dict]:
    try:
        yield from b.s3.get_paginator("list_objects_v2").paginate(Bucket=b.name, Prefix=prefix, **kwargs)
    except (ClientError, BotoCoreError) as exc:
        raise tier2_error("LIST", prefix, exc) from None


def topic_segments(b: Bucket) -> Iterator[str]:
    """The key segment of every topic with objects under the prefix (`{prefix}{segment}/...`), in key order."""
    for page in _pages(b, b.prefix, Delimiter="/"):
        for common in page.get("CommonPrefixes", []):
            yield common["Prefix"][len(b.prefix):-1]


def segment_objects(b: Bucket, segment: str) -> Iterator[dict]:
    """Every object (Key, Size, LastModified) under `{prefix}{segment}/`."""
    for page in _pages(b, f"{b.prefix}{segment}/"):
        yield from page.get("Contents", [])


__all__ = ["segment_objects", "topic_segments"]
