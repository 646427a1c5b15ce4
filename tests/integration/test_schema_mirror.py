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
  AND left(table_name, 8) <> 'iceberg_'  -- the catalog's (below): in this schema when the role's name is tiering
  AND table_name IN (SELECT table_name FROM information_schema.tables
                     WHERE table_schema = 'tiering' AND table_type = 'BASE TABLE')
"""

_PRIMARY_KEYS = """
SELECT k.table_name, k.column_name FROM information_schema.table_constraints c
JOIN information_schema.key_column_usage k USING (constraint_schema, constraint_name)
WHERE c.constraint_schema = 'tiering' AND c.constraint_type = 'PRIMARY KEY' AND k.table_name <> 'schema_migrations'
  AND left(k.table_name, 8) <> 'iceberg_'
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


_CATALOG_COLUMNS = """
SELECT c.table_name, c.column_name, c.is_nullable = 'YES',
       c.data_type || COALESCE('(' || c.character_maximum_length || ')', '')
FROM information_schema.columns c
WHERE c.table_name IN ('iceberg_tables', 'iceberg_namespace_properties')
  AND c.table_schema = (SELECT n.nspname FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace
                        WHERE r.oid = to_regclass('iceberg_tables'))
"""


def test_the_catalog_tables_are_pyiceberg_s_and_the_migrated_ones(engine):
    """The Iceberg catalog's tables, made by migration 0014 where pyiceberg looks for them, have pyiceberg's
    layout (a pyiceberg upgrade that changes it fails here, before an export leaves a column out)."""
    from pyiceberg.catalog.sql import IcebergNamespaceProperties, IcebergTables

    from tiering.metadata.tables import iceberg_namespace_properties, iceberg_tables

    dialect = postgresql.dialect()

    def shape(table):
        return {c.name: (c.nullable, c.type.compile(dialect=dialect).lower(), c.primary_key) for c in table.columns}

    assert shape(iceberg_tables) == shape(IcebergTables.__table__)
    assert shape(iceberg_namespace_properties) == shape(IcebergNamespaceProperties.__table__)
    with engine.connect() as conn:
        migrated = {(t, c): (nullable, type_.replace("character varying", "varchar"))
                    for t, c, nullable, type_ in conn.execute(text(_CATALOG_COLUMNS))}
    declared = {(t.name, c.name): (c.nullable, c.type.compile(dialect=dialect).lower())
                for t in (iceberg_tables, iceberg_namespace_properties) for c in t.columns}
    assert migrated == declared
