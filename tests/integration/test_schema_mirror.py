"""The schema has one source, sql/: tiering/metadata/tables.py declares the same tables, columns, types,
nullability and primary keys as a fresh `db upgrade` creates (read from information_schema), so the two
cannot drift apart unnoticed."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.dialects import postgresql

from tiering.metadata.tables import metadata

_COLUMNS = """
SELECT table_name, column_name, is_nullable = 'YES',
       CASE WHEN data_type = 'USER-DEFINED' THEN udt_schema || '.' || udt_name ELSE data_type END
FROM information_schema.columns WHERE table_schema = 'tiering' AND table_name <> 'schema_migrations'
  AND table_name IN (SELECT table_name FROM information_schema.tables
                     WHERE table_schema = 'tiering' AND table_type = 'BASE TABLE')
"""

_PRIMARY_KEYS = """
SELECT k.table_name, k.column_name FROM information_schema.table_constraints c
JOIN information_schema.key_column_usage k USING (constraint_schema, constraint_name)
WHERE c.constraint_schema = 'tiering' AND c.constraint_type = 'PRIMARY KEY' AND k.table_name <> 'schema_migrations'
"""


def _declared() -> tuple[dict, set]:
    dialect = postgresql.dialect()
    columns, keys = {}, set()
    for table in metadata.tables.values():
        for col in table.columns:
            columns[(table.name, col.name)] = (col.nullable, col.type.compile(dialect=dialect).lower())
            if col.primary_key:
                keys.add((table.name, col.name))
    return columns, keys


def test_tables_py_declares_the_migrated_schema(engine):
    with engine.connect() as conn:
        migrated = {(t, c): (nullable, type_) for t, c, nullable, type_ in conn.execute(text(_COLUMNS))}
        migrated_keys = set(map(tuple, conn.execute(text(_PRIMARY_KEYS))))
    declared, declared_keys = _declared()
    assert {t for t, _ in declared} == {t for t, _ in migrated}, "tables"
    assert sorted(set(declared) ^ set(migrated)) == [], "columns in one and not the other"
    differ = {k: {"tables.py": v, "migrated": migrated[k]} for k, v in declared.items() if migrated[k] != v}
    assert differ == {}, "(nullable, type)"
    assert declared_keys == migrated_keys, "primary keys"
