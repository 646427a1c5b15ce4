"""Executors refuse a tier-1 root that is not the driver's: the marker file's token, read by
the driver and shipped with the plan, must match the executor's root. `_do_items` is the function Spark
runs on executors; here it runs in-process against the real services."""
from __future__ import annotations

import threading

import pytest

from tiering.errors import LedgerStorageError
from tiering.jobs.runner import _do_items
from tiering.tier1.marker import MARKER, check_root, root_token


def test_the_token_is_created_once_and_only_in_an_existing_root(tmp_path):
    assert root_token(tmp_path / "not-mounted") is None and not (tmp_path / "not-mounted").exists()
    tokens = []
    threads = [threading.Thread(target=lambda: tokens.append(root_token(tmp_path))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(tokens)) == 1 and (tmp_path / MARKER).read_text().strip() == tokens[0]
    assert [p.name for p in tmp_path.iterdir()] == [MARKER]  # no temporary file left
    check_root(tmp_path, tokens[0])


def test_a_root_without_the_marker_or_with_another_is_refused_naming_the_path(tmp_path):
    driver, elsewhere, other = tmp_path / "driver", tmp_path / "elsewhere", tmp_path / "other"
    for d in (driver, elsewhere, other):
        d.mkdir()
    token = root_token(driver)
    with pytest.raises(LedgerStorageError, match=f"{elsewhere / MARKER} is missing"):
        check_root(elsewhere, token)
    root_token(other)
    with pytest.raises(LedgerStorageError, match="belongs to another directory"):
        check_root(other, token)


def test_executor_items_fail_on_a_root_that_is_not_the_drivers(settings, db, tmp_path):
    driver_root = tmp_path / "driver-root"
    driver_root.mkdir()
    token = root_token(driver_root)
    worked = []
    items = [{"topic": "t", "ledger_id": i} for i in range(3)]
    out = list(_do_items(settings, lambda deps, item: worked.append(item) or (0, False), iter(items), token))
    assert worked == [] and out[0]["failed"] == 3 and out[0]["done"] == 0
    assert str(settings.tier1_root / MARKER) in out[0]["errors"][0]
    # the same executor on the driver's root works
    out = list(_do_items(settings.with_(tier1_root=driver_root), lambda deps, item: (1, False), iter(items), token))
    assert out[0]["done"] == 3 and out[0]["failed"] == 0
