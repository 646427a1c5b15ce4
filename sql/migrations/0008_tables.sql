-- Topics as Apache Iceberg tables: one row per topic that has a table. The policy (which table, whether
-- retention deletes follow into it, the payload decoder) and the sync state live in one row so that the
-- sync's progress and the policy it ran under change together, by compare-and-set on `version`.
--
-- The table's own metadata (pyiceberg's SQL catalog, the layout of Iceberg's JDBC catalog) is the source of
-- truth for what a table holds: every commit sets the table properties `tiering.synced-through` and
-- `tiering.trimmed-through` in the same atomic commit as its data files. These columns mirror them, so
-- status and planning need no catalog round trip; a sync that finds the table ahead of this row (killed
-- between the Iceberg commit and this row's update) catches the row up instead of appending again.
CREATE TABLE tiering.topic_table (
    topic_id          bigint      PRIMARY KEY REFERENCES tiering.topic (topic_id) ON DELETE CASCADE,
    -- NAMESPACE.TABLE in the catalog (tiering/tables/naming.py checks the form)
    identifier        text        NOT NULL UNIQUE CHECK (identifier ~ '^[a-z_][a-z0-9_]{0,63}\.[a-z_][a-z0-9_]{0,63}$'),
    -- follow: rows of ledgers retention or truncate deleted are deleted from the table; keep: they stay
    retention         text        NOT NULL DEFAULT 'follow' CHECK (retention IN ('keep', 'follow')),
    -- the payload decoder: NULL (payload stays bytes) or {"kind": "json", "schema": [...]}
    decoder           jsonb,
    -- every ledger with an id at most this is in the table, or was deleted or empty when the sync passed it
    synced_through    bigint      NOT NULL DEFAULT -1 CHECK (synced_through >= -1),
    -- rows of ledgers with an id at most this were deleted from the table (retention 'follow')
    trimmed_through   bigint      NOT NULL DEFAULT -1 CHECK (trimmed_through >= -1),
    ledgers_committed bigint      NOT NULL DEFAULT 0 CHECK (ledgers_committed >= 0),
    entries_committed bigint      NOT NULL DEFAULT 0 CHECK (entries_committed >= 0),
    snapshot_id       bigint,
    metadata_location text,
    synced_at         timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    version           bigint      NOT NULL DEFAULT 0
);
