"""tier2/reader._page_runs finds each run's last page by bisection: the same runs as walking the pages one by
one (the reference below), on random page layouts, for a scan's fixed groups and a check's growing ranges."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from tiering.tier2.reader import MAX_RANGE, SCAN_GROUP, _page_runs


def walked(index, lo, hi, first, grow):
    target, p = first, lo
    while p <= hi:
        start = index.page_span(p)[0]
        q = p
        while q < hi and index.page_span(q + 1)[1] - start <= target:
            q += 1
        yield p, q
        if grow:
            target = min(max(target, index.page_span(q)[1] - start) * 2, MAX_RANGE)
        p = q + 1


def layout(rng):
    sizes = [rng.choice([1, 100, 65536, 70000, 1 << 20, 3 << 20]) for _ in range(rng.randint(1, 60))]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    total = sum(sizes)

    def span(i):
        return offsets[i], offsets[i + 1] if i + 1 < len(offsets) else total
    return SimpleNamespace(pages=SimpleNamespace(offsets=tuple(offsets)), data_object_len=total, page_span=span)


@pytest.mark.parametrize("seed", range(5))
def test_runs_are_those_of_walking_page_by_page(seed):
    rng = random.Random(seed)
    for _ in range(300):
        index = layout(rng)
        n = len(index.pages.offsets)
        lo = rng.randrange(n)
        hi = rng.randrange(lo, n)
        for first, grow in [(1, True), (SCAN_GROUP, False), (MAX_RANGE, True), (rng.randint(1, 5 << 20), False)]:
            assert list(_page_runs(index, lo, hi, first, grow)) == list(walked(index, lo, hi, first, grow))
