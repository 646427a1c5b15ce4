-- Per-topic totals kept as data (issue 19): the dashboard's `topics`/`tier_usage` and size-based planning
-- read one row per topic instead of aggregating every ledger the store has ever held.
--
-- Maintained exactly by statement-level triggers with transition tables on `ledger` and `chunk`: each
-- statement adds, per topic, (sum of its new rows' contributions) - (sum of its old rows' contributions).
-- Rows are upserted in topic_id order, so two statements touching the same topics lock them in the same
-- order. A topic whose totals do not change (e.g. a version-only update) is not touched, so it is not locked.
-- Loaders that write with triggers off (session_replication_role = replica) call
-- tiering.recompute_topic_usage() afterwards.

CREATE TABLE tiering.topic_usage (
    topic_id           bigint PRIMARY KEY REFERENCES tiering.topic (topic_id) ON DELETE CASCADE,
    open_ledgers       bigint NOT NULL DEFAULT 0,
    sealed_ledgers     bigint NOT NULL DEFAULT 0,
    offloading_ledgers bigint NOT NULL DEFAULT 0,
    offloaded_ledgers  bigint NOT NULL DEFAULT 0,
    deleted_ledgers    bigint NOT NULL DEFAULT 0,
    live_ledgers       bigint NOT NULL DEFAULT 0,  -- state <> 'DELETED'
    live_entries       bigint NOT NULL DEFAULT 0,  -- sum(entry_count) where state <> 'DELETED'
    live_bytes         bigint NOT NULL DEFAULT 0,  -- sum(size_bytes) where state <> 'DELETED'
    tier1_ledgers      bigint NOT NULL DEFAULT 0,  -- tier1_present AND state <> 'DELETED'
    tier1_bytes        bigint NOT NULL DEFAULT 0,
    tier2_ledgers      bigint NOT NULL DEFAULT 0,  -- state = 'OFFLOADED'
    tier2_bytes        bigint NOT NULL DEFAULT 0,
    tier2_stored_bytes bigint NOT NULL DEFAULT 0   -- sum(chunk.data_length) of the topic's chunk rows
);

-- One statement's delta per topic. `src` is a query yielding (s, <ledger row>) with s = +1 for new rows and
-- -1 for old ones; dynamic SQL because a trigger has only the transition tables of its own event.
CREATE FUNCTION tiering.topic_usage_ledger_delta() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    src text := CASE TG_OP
        WHEN 'INSERT' THEN 'SELECT 1 AS s, n.* FROM new_rows n'
        WHEN 'DELETE' THEN 'SELECT -1 AS s, o.* FROM old_rows o'
        ELSE 'SELECT 1 AS s, n.* FROM new_rows n UNION ALL SELECT -1 AS s, o.* FROM old_rows o' END;
BEGIN
    EXECUTE format($q$
        INSERT INTO tiering.topic_usage AS u (
            topic_id, open_ledgers, sealed_ledgers, offloading_ledgers, offloaded_ledgers, deleted_ledgers,
            live_ledgers, live_entries, live_bytes, tier1_ledgers, tier1_bytes, tier2_ledgers, tier2_bytes)
        SELECT d.* FROM (
            SELECT r.topic_id,
                   sum(CASE WHEN r.state = 'OPEN' THEN r.s ELSE 0 END)::bigint,
                   sum(CASE WHEN r.state = 'SEALED' THEN r.s ELSE 0 END)::bigint,
                   sum(CASE WHEN r.state = 'OFFLOADING' THEN r.s ELSE 0 END)::bigint,
                   sum(CASE WHEN r.state = 'OFFLOADED' THEN r.s ELSE 0 END)::bigint,
                   sum(CASE WHEN r.state = 'DELETED' THEN r.s ELSE 0 END)::bigint,
                   sum(CASE WHEN r.state <> 'DELETED' THEN r.s ELSE 0 END)::bigint,
                   sum(CASE WHEN r.state <> 'DELETED' THEN r.s * r.entry_count ELSE 0 END)::bigint,
                   sum(CASE WHEN r.state <> 'DELETED' THEN r.s * r.size_bytes ELSE 0 END)::bigint,
                   sum(CASE WHEN r.tier1_present AND r.state <> 'DELETED' THEN r.s ELSE 0 END)::bigint,
                   sum(CASE WHEN r.tier1_present AND r.state <> 'DELETED' THEN r.s * r.size_bytes ELSE 0 END)::bigint,
                   sum(CASE WHEN r.state = 'OFFLOADED' THEN r.s ELSE 0 END)::bigint,
                   sum(CASE WHEN r.state = 'OFFLOADED' THEN r.s * r.size_bytes ELSE 0 END)::bigint
            FROM (%s) r
            GROUP BY r.topic_id) AS d (topic_id, open_ledgers, sealed_ledgers, offloading_ledgers,
                                       offloaded_ledgers, deleted_ledgers, live_ledgers, live_entries,
                                       live_bytes, tier1_ledgers, tier1_bytes, tier2_ledgers, tier2_bytes)
        -- a topic being deleted (ON DELETE CASCADE) is gone already: its totals go with it
        WHERE EXISTS (SELECT 1 FROM tiering.topic t WHERE t.topic_id = d.topic_id)
          AND (d.open_ledgers, d.sealed_ledgers, d.offloading_ledgers, d.offloaded_ledgers, d.deleted_ledgers,
               d.live_ledgers, d.live_entries, d.live_bytes, d.tier1_ledgers, d.tier1_bytes, d.tier2_ledgers,
               d.tier2_bytes) IS DISTINCT FROM (0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint,
               0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint)
        ORDER BY d.topic_id
        ON CONFLICT (topic_id) DO UPDATE SET
            open_ledgers       = u.open_ledgers       + EXCLUDED.open_ledgers,
            sealed_ledgers     = u.sealed_ledgers     + EXCLUDED.sealed_ledgers,
            offloading_ledgers = u.offloading_ledgers + EXCLUDED.offloading_ledgers,
            offloaded_ledgers  = u.offloaded_ledgers  + EXCLUDED.offloaded_ledgers,
            deleted_ledgers    = u.deleted_ledgers    + EXCLUDED.deleted_ledgers,
            live_ledgers       = u.live_ledgers       + EXCLUDED.live_ledgers,
            live_entries       = u.live_entries       + EXCLUDED.live_entries,
            live_bytes         = u.live_bytes         + EXCLUDED.live_bytes,
            tier1_ledgers      = u.tier1_ledgers      + EXCLUDED.tier1_ledgers,
            tier1_bytes        = u.tier1_bytes        + EXCLUDED.tier1_bytes,
            tier2_ledgers      = u.tier2_ledgers      + EXCLUDED.tier2_ledgers,
            tier2_bytes        = u.tier2_bytes        + EXCLUDED.tier2_bytes
        $q$, src);
    RETURN NULL;
END $$;

CREATE FUNCTION tiering.topic_usage_chunk_delta() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    src text := CASE TG_OP
        WHEN 'INSERT' THEN 'SELECT 1 AS s, n.topic_id, n.data_length FROM new_rows n'
        WHEN 'DELETE' THEN 'SELECT -1 AS s, o.topic_id, o.data_length FROM old_rows o'
        ELSE 'SELECT 1 AS s, n.topic_id, n.data_length FROM new_rows n
              UNION ALL SELECT -1 AS s, o.topic_id, o.data_length FROM old_rows o' END;
BEGIN
    EXECUTE format($q$
        INSERT INTO tiering.topic_usage AS u (topic_id, tier2_stored_bytes)
        SELECT d.topic_id, d.stored FROM (
            SELECT r.topic_id, sum(r.s * r.data_length)::bigint AS stored FROM (%s) r GROUP BY r.topic_id) d
        WHERE EXISTS (SELECT 1 FROM tiering.topic t WHERE t.topic_id = d.topic_id) AND d.stored <> 0
        ORDER BY d.topic_id
        ON CONFLICT (topic_id) DO UPDATE SET tier2_stored_bytes = u.tier2_stored_bytes + EXCLUDED.tier2_stored_bytes
        $q$, src);
    RETURN NULL;
END $$;

CREATE FUNCTION tiering.topic_usage_new_topics() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tiering.topic_usage (topic_id)
    SELECT topic_id FROM new_rows ORDER BY topic_id
    ON CONFLICT (topic_id) DO NOTHING;
    RETURN NULL;
END $$;

-- Rebuild every topic's totals from the base tables. The SHARE locks wait for writers in flight and keep
-- new ones out until the caller commits, so no delta is lost between the read and the write.
CREATE FUNCTION tiering.recompute_topic_usage() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE tiering.topic, tiering.ledger, tiering.chunk IN SHARE MODE;
    DELETE FROM tiering.topic_usage;
    INSERT INTO tiering.topic_usage (
        topic_id, open_ledgers, sealed_ledgers, offloading_ledgers, offloaded_ledgers, deleted_ledgers,
        live_ledgers, live_entries, live_bytes, tier1_ledgers, tier1_bytes, tier2_ledgers, tier2_bytes,
        tier2_stored_bytes)
    SELECT t.topic_id,
           coalesce(l.open_ledgers, 0), coalesce(l.sealed_ledgers, 0), coalesce(l.offloading_ledgers, 0),
           coalesce(l.offloaded_ledgers, 0), coalesce(l.deleted_ledgers, 0), coalesce(l.live_ledgers, 0),
           coalesce(l.live_entries, 0), coalesce(l.live_bytes, 0), coalesce(l.tier1_ledgers, 0),
           coalesce(l.tier1_bytes, 0), coalesce(l.tier2_ledgers, 0), coalesce(l.tier2_bytes, 0),
           coalesce(c.stored, 0)
    FROM tiering.topic t
    LEFT JOIN (
        SELECT topic_id,
               count(*) FILTER (WHERE state = 'OPEN')        AS open_ledgers,
               count(*) FILTER (WHERE state = 'SEALED')      AS sealed_ledgers,
               count(*) FILTER (WHERE state = 'OFFLOADING')  AS offloading_ledgers,
               count(*) FILTER (WHERE state = 'OFFLOADED')   AS offloaded_ledgers,
               count(*) FILTER (WHERE state = 'DELETED')     AS deleted_ledgers,
               count(*) FILTER (WHERE state <> 'DELETED')    AS live_ledgers,
               sum(entry_count) FILTER (WHERE state <> 'DELETED')::bigint AS live_entries,
               sum(size_bytes) FILTER (WHERE state <> 'DELETED')::bigint  AS live_bytes,
               count(*) FILTER (WHERE tier1_present AND state <> 'DELETED') AS tier1_ledgers,
               sum(size_bytes) FILTER (WHERE tier1_present AND state <> 'DELETED')::bigint AS tier1_bytes,
               count(*) FILTER (WHERE state = 'OFFLOADED')   AS tier2_ledgers,
               sum(size_bytes) FILTER (WHERE state = 'OFFLOADED')::bigint AS tier2_bytes
        FROM tiering.ledger GROUP BY topic_id) l ON l.topic_id = t.topic_id
    LEFT JOIN (SELECT topic_id, sum(data_length)::bigint AS stored FROM tiering.chunk GROUP BY topic_id) c
           ON c.topic_id = t.topic_id
    ORDER BY t.topic_id;
END $$;

-- TRUNCATE fires no row or statement DML triggers: rebuild after one (cheap once the tables are empty).
CREATE FUNCTION tiering.topic_usage_after_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tiering.recompute_topic_usage();
    RETURN NULL;
END $$;

-- A trigger with transition tables can have only one event: three per table.
CREATE TRIGGER topic_usage_new_topic AFTER INSERT ON tiering.topic
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_new_topics();
CREATE TRIGGER topic_usage_ledger_ins AFTER INSERT ON tiering.ledger
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_ledger_delta();
CREATE TRIGGER topic_usage_ledger_upd AFTER UPDATE ON tiering.ledger
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_ledger_delta();
CREATE TRIGGER topic_usage_ledger_del AFTER DELETE ON tiering.ledger
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_ledger_delta();
CREATE TRIGGER topic_usage_chunk_ins AFTER INSERT ON tiering.chunk
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_chunk_delta();
CREATE TRIGGER topic_usage_chunk_upd AFTER UPDATE ON tiering.chunk
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_chunk_delta();
CREATE TRIGGER topic_usage_chunk_del AFTER DELETE ON tiering.chunk
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_chunk_delta();
CREATE TRIGGER topic_usage_ledger_truncate AFTER TRUNCATE ON tiering.ledger
    FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_after_truncate();
CREATE TRIGGER topic_usage_chunk_truncate AFTER TRUNCATE ON tiering.chunk
    FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_after_truncate();

SELECT tiering.recompute_topic_usage();

-- The dashboard's time series (tiering/dashboard.py series()) reads only rows inside its window:
-- ledgers offloaded or deleted in it (range scans), ledgers not yet offloaded nor deleted (a partial index
-- as small as the backlog), and job runs started or ended in it.
CREATE INDEX ledger_series_offloaded ON tiering.ledger (offloaded_at) INCLUDE (size_bytes)
    WHERE offloaded_at IS NOT NULL;
CREATE INDEX ledger_series_deleted ON tiering.ledger (deleted_at) WHERE deleted_at IS NOT NULL;
CREATE INDEX ledger_series_unended ON tiering.ledger (sealed_at)
    WHERE offloaded_at IS NULL AND deleted_at IS NULL AND entry_count > 0;
-- View offload_backlog (state IN ('SEALED', 'OFFLOADING')): the backlog only, not the history.
CREATE INDEX ledger_backlog ON tiering.ledger (sealed_at)
    WHERE state IN ('SEALED', 'OFFLOADING') AND entry_count > 0;
CREATE INDEX job_run_started_at ON tiering.job_run (started_at);
CREATE INDEX job_run_ended_at ON tiering.job_run (ended_at) WHERE ended_at IS NOT NULL;
