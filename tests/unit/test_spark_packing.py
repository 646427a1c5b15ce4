"""The source's partitions when packBytes is not given: about one wave of the session's cores, each at most
AUTO_PACK_MAX bytes; consecutive parts only, none split, none dropped."""
from __future__ import annotations

import pytest

from tiering.spark.source import AUTO_PACK_MAX, auto_pack_bytes, pack

MIB = 1024 * 1024


class P:
    def __init__(self, nbytes):
        self.nbytes = nbytes


@pytest.mark.parametrize("sizes, cores, most", [([32 * MIB] * 8, 2, 2), ([32 * MIB] * 8, 4, 4),
                                                # at most 1000 parts to a partition (its pickled plan)
                                                ([1000] * 5000, 2, 5), ([64 * MIB] * 3 + [MIB] * 7, 2, 3),
                                                ([5 * MIB], 8, 1)])
def test_parts_are_packed_into_about_one_wave(sizes, cores, most):
    parts = [P(n) for n in sizes]
    groups = pack(parts, auto_pack_bytes(sum(sizes), cores))
    assert [p for g in groups for p in g] == parts  # consecutive, in order, every part once
    assert len(groups) <= most


def test_a_big_scan_keeps_partitions_of_at_most_the_cap():
    assert auto_pack_bytes(100 * 1024 * MIB, 2) == AUTO_PACK_MAX
    parts = [P(64 * MIB)] * 1600  # 100 GiB in 64 MiB parts
    assert all(sum(p.nbytes for p in g) <= AUTO_PACK_MAX for g in pack(parts, auto_pack_bytes(100 * 1024 * MIB, 2)))


@pytest.mark.parametrize("cores", [None, 0])
def test_no_known_parallelism_means_one_partition_per_part(cores):
    assert auto_pack_bytes(10 * MIB, cores) == 0
    assert len(pack([P(MIB)] * 10, 0)) == 10
