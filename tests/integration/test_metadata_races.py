"""Races run from several real processes against the real PostgreSQL."""
from __future__ import annotations

import multiprocessing as mp

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.integration import race_workers
from tiering.metadata.attributes import Attributes
from tiering.metadata.repository import MetadataStore
from tiering.model import LedgerState

CTX = mp.get_context("spawn")


def _run(n, fn, args_for):
    barrier = CTX.Manager().Barrier(n)
    with CTX.Pool(n) as pool:
        results = [pool.apply_async(fn, args_for(i) + (barrier,)) for i in range(n)]
        return [r.get(timeout=120) for r in results]


def test_concurrent_accumulate_gives_exact_sum(db, database_url):
    # Given a topic, When 4 processes each accumulate +1 200 times on one key
    MetadataStore(db).create_topic("acc")
    _run(4, race_workers.accumulate, lambda i: (database_url, "acc", "count", 200))
    # Then the value is exactly 800
    assert Attributes(db).get("acc", "count") == 800


def test_two_replace_if_equals_exactly_one_wins(db, database_url):
    MetadataStore(db).create_topic("cas")
    for expected in (None, 5):
        if expected is not None:
            from tiering.metadata.attributes import AttributeUpdate, Verb
            Attributes(db).update("cas", [AttributeUpdate("k", Verb.REPLACE, 5)])
        wins = _run(2, race_workers.replace_if_equals, lambda i: (database_url, "cas", "k", expected, 100 + i))
        assert sorted(wins) == [False, True]
        winner = 100 + wins.index(True)
        assert Attributes(db).get("cas", "k") == winner


def test_two_conditional_transitions_exactly_one_wins(db, database_url):
    meta = MetadataStore(db)
    meta.create_topic("race")
    led = meta.open_ledger("race")
    wins = _run(2, race_workers.seal_ledger, lambda i: (database_url, "race", led.ledger_id, 10 + i))
    assert sorted(wins) == [False, True]
    sealed = meta.get_ledger("race", led.ledger_id)
    assert sealed.state == LedgerState.SEALED
    assert sealed.entry_count == 10 + wins.index(True)
    assert sealed.version == led.version + 1


@pytest.fixture
def empty_database(database_url):
    server = make_url(database_url)
    name = server.database + "_mig"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield server.set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


def test_concurrent_upgrades_apply_each_migration_once(empty_database):
    # Given an empty database, When three processes run `db upgrade` at once
    applied = _run(3, race_workers.upgrade, lambda i: (empty_database,))
    # Then each migration was applied by exactly one of them
    flat = [m for result in applied for m in result]
    assert flat and len(flat) == len(set(flat))
    engine = create_engine(empty_database)
    with engine.connect() as conn:
        names = conn.execute(text("SELECT name FROM tiering.schema_migrations")).scalars().all()
    engine.dispose()
    assert sorted(names) == sorted(flat)
