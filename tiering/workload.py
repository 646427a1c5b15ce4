"""Deterministic demo/benchmark payloads: entry `seq` of a workload `seed` is always the same bytes, so a
read can be verified byte for byte without keeping what was written."""
from __future__ import annotations

import hashlib


def payload(seed: str, seq: int, size: int) -> bytes:
    if size <= 0:
        return b""
    block = hashlib.blake2b(f"{seed}:{seq}".encode(), digest_size=64).digest()
    reps, rest = divmod(size, len(block))
    return block * reps + block[:rest]
