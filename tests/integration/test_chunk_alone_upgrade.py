"""chunk.data_alone's functions come from the migrations alone: a database migrated before 0007, whose
upgrades also replaced two of 0004's bodies from sql/views (the linear bodies, below as they were), ends an
upgrade with exactly the functions a fresh database gets, and the flag still follows inserts, deletes and
key switches and is repaired by tiering.recompute_chunk_alone()."""
from __future__ import annotations

import secrets
import shutil

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tiering.metadata import make_engine, upgrade
from tiering.metadata.migrations import SQL_DIR

FUNCTIONS = ("chunk_alone_recount", "chunk_alone_inserted", "chunk_alone_deleted", "chunk_alone_updated",
             "recompute_chunk_alone")

# The sql/views file that replaced two bodies of migration 0004 on every upgrade before migration 0007.
VIEWS_060 = """
CREATE OR REPLACE FUNCTION tiering.recompute_chunk_alone() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    ANALYZE tiering.chunk;
    UPDATE tiering.chunk c SET data_alone = s.n = 1
    FROM (SELECT data_key, count(*) AS n FROM tiering.chunk GROUP BY data_key) s
    WHERE c.data_key = s.data_key AND c.data_alone <> (s.n = 1);
END $$;

CREATE OR REPLACE FUNCTION tiering.chunk_alone_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS ((SELECT data_key, count(*) FROM new_rows GROUP BY data_key
                    EXCEPT SELECT data_key, count(*) FROM old_rows GROUP BY data_key)
                   UNION ALL
                   (SELECT data_key, count(*) FROM old_rows GROUP BY data_key
                    EXCEPT SELECT data_key, count(*) FROM new_rows GROUP BY data_key)) THEN
        RETURN NULL;
    END IF;
    UPDATE tiering.chunk c SET data_alone = s.n = 1
    FROM (SELECT k.data_key, count(*) AS n FROM tiering.chunk k
          WHERE k.data_key IN (SELECT data_key FROM new_rows UNION SELECT data_key FROM old_rows)
          GROUP BY k.data_key) s
    WHERE c.data_key = s.data_key AND c.data_alone <> (s.n = 1);
    RETURN NULL;
END $$;
"""


@pytest.fixture
def migrated_to_0006(database_url, tmp_path):
    """A database as an upgrade before migration 0007 left it: 0001-0006, then the views and VIEWS_060."""
    sql = tmp_path / "sql"
    (sql / "migrations").mkdir(parents=True)
    for f in sorted((SQL_DIR / "migrations").glob("*.sql")):
        if f.name < "0007":
            shutil.copy(f, sql / "migrations")
    shutil.copytree(SQL_DIR / "views", sql / "views")
    (sql / "views" / "060_planning_functions.sql").write_text(VIEWS_060)
    server = make_url(database_url)
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    name = f"{server.database}_a{secrets.token_hex(3)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    eng = make_engine(server.set(database=name).render_as_string(hide_password=False))
    upgrade(eng, sql)
    yield eng
    eng.dispose()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def definitions(engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(text(
            "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p "
            "WHERE p.pronamespace = 'tiering'::regnamespace")).all())


def alone(engine) -> dict[int, bool]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT ledger_id, data_alone FROM tiering.chunk ORDER BY 1")).all())


def test_an_upgraded_database_gets_the_functions_of_a_fresh_one(engine, migrated_to_0006):
    before = definitions(migrated_to_0006)
    assert "chunk_alone_recount" not in before and "EXCEPT" in before["chunk_alone_updated"]
    assert "ANALYZE" in before["recompute_chunk_alone"]

    result = upgrade(migrated_to_0006)
    # 0007 and every migration after it (later ones add their own changes)
    assert result.applied == sorted(f.name for f in (SQL_DIR / "migrations").glob("*.sql") if f.name >= "0007")
    assert result.applied[0] == "0007_chunk_alone_recount.sql"
    after, fresh = definitions(migrated_to_0006), definitions(engine)
    assert set(FUNCTIONS) <= set(fresh)
    assert after == fresh
    assert upgrade(migrated_to_0006).applied == [] and definitions(migrated_to_0006) == fresh


def test_the_upgraded_functions_keep_the_flag(migrated_to_0006):
    eng = migrated_to_0006
    upgrade(eng)
    with eng.begin() as conn:
        conn.execute(text("INSERT INTO tiering.topic (name) VALUES ('flag')"))
        conn.execute(text(
            "INSERT INTO tiering.ledger (topic_id, ledger_id, state, entry_count, size_bytes, sealed_at, "
            "offload_uuid, offloaded_at) SELECT topic_id, i, 'OFFLOADED', 1, 10, now(), gen_random_uuid(), now() "
            "FROM tiering.topic, generate_series(0, 4) i"))
        conn.execute(text(
            "INSERT INTO tiering.chunk (topic_id, ledger_id, data_key, data_offset, data_length, index_key, "
            "index_offset, index_length, first_entry_id, last_entry_id) SELECT topic_id, i, "
            "CASE WHEN i < 3 THEN 'batch' ELSE 'lone' || i END, 0, 10, 'ix', 0, 5, 0, 0 FROM tiering.topic, "
            "generate_series(0, 4) i"))
    assert alone(eng) == {0: False, 1: False, 2: False, 3: True, 4: True}
    with eng.begin() as conn:  # a ledger and its chunk go together (the deferred consistency check)
        conn.execute(text("DELETE FROM tiering.chunk WHERE ledger_id IN (0, 1)"))
        conn.execute(text("DELETE FROM tiering.ledger WHERE ledger_id IN (0, 1)"))
    assert alone(eng) == {2: True, 3: True, 4: True}
    with eng.begin() as conn:
        conn.execute(text("UPDATE tiering.chunk SET data_key = 'merged' WHERE ledger_id IN (2, 3)"))
        conn.execute(text("UPDATE tiering.chunk SET version = version + 1"))
    assert alone(eng) == {2: False, 3: False, 4: True}
    with eng.begin() as conn:  # a loader writing past the triggers, then the repair
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(text("UPDATE tiering.chunk SET data_alone = NOT data_alone"))
    with eng.begin() as conn:
        conn.execute(text("SELECT tiering.recompute_chunk_alone()"))
    assert alone(eng) == {2: False, 3: False, 4: True}
