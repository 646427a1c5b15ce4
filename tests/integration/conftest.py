"""Fixtures the integration modules share."""
from __future__ import annotations

import pytest

from tests.integration.helpers import make_deps


@pytest.fixture
def deps(db, s3_client, bucket, tier1_root):
    """An operation's clients on the run's database, an emptied bucket and a fresh tier-1 root (one object
    pair per ledger; a module that tests batching overrides this)."""
    return make_deps(db, s3_client, bucket, tier1_root)
