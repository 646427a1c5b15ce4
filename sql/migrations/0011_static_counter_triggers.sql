-- The counters' statement triggers (topic_usage: 0003, ledger_hourly: 0010) built their upsert with EXECUTE
-- format(...) on every firing: one function served INSERT, UPDATE and DELETE, and a static query may name
-- only its own event's transition tables. A dynamic statement is planned afresh each time, so every ledger
-- or chunk statement paid for planning two upserts: ~2 ms of a one-row ledger update's ~2.3 ms.
--
-- Here each event gets a function of its own whose query is static, so PL/pgSQL keeps its plan for the
-- session (as 0004's chunk_alone functions already did). The queries are 0003's and 0010's unchanged, each
-- written once below as a template and instantiated for the three events, so the three cannot drift.
DO $migration$
DECLARE
    ev record;
    usage_ledger text := $q$
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
            FROM (%1$s) r
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
            tier2_bytes        = u.tier2_bytes        + EXCLUDED.tier2_bytes$q$;
    usage_chunk text := $q$
        INSERT INTO tiering.topic_usage AS u (topic_id, tier2_stored_bytes)
        SELECT d.topic_id, d.stored FROM (
            SELECT r.topic_id, sum(r.s * r.data_length)::bigint AS stored FROM (%1$s) r GROUP BY r.topic_id) d
        WHERE EXISTS (SELECT 1 FROM tiering.topic t WHERE t.topic_id = d.topic_id) AND d.stored <> 0
        ORDER BY d.topic_id
        ON CONFLICT (topic_id) DO UPDATE SET tier2_stored_bytes = u.tier2_stored_bytes + EXCLUDED.tier2_stored_bytes$q$;
    hourly text := $q$
        INSERT INTO tiering.ledger_hourly AS h (hour, topic_id, offloaded_ledgers, offloaded_bytes,
                                                backlog_ledgers, backlog_bytes)
        SELECT d.hour, d.topic_id, d.ol, d.ob, d.bn, d.bb FROM (
            SELECT e.hour, r.topic_id, sum(e.ol)::bigint AS ol, sum(e.ob)::bigint AS ob,
                   sum(e.bn)::bigint AS bn, sum(e.bb)::bigint AS bb
            FROM (%1$s) r
            CROSS JOIN LATERAL tiering.ledger_hourly_events(r.s, r.entry_count, r.size_bytes, r.sealed_at,
                                                            r.offloaded_at, r.deleted_at) e
            GROUP BY e.hour, r.topic_id) d
        -- a topic being deleted (ON DELETE CASCADE) is gone already: its counters go with it
        WHERE EXISTS (SELECT 1 FROM tiering.topic t WHERE t.topic_id = d.topic_id)
          AND (d.ol, d.ob, d.bn, d.bb) IS DISTINCT FROM (0::bigint, 0::bigint, 0::bigint, 0::bigint)
        ORDER BY d.topic_id, d.hour
        ON CONFLICT (hour, topic_id) DO UPDATE SET
            offloaded_ledgers = h.offloaded_ledgers + EXCLUDED.offloaded_ledgers,
            offloaded_bytes   = h.offloaded_bytes   + EXCLUDED.offloaded_bytes,
            backlog_ledgers   = h.backlog_ledgers   + EXCLUDED.backlog_ledgers,
            backlog_bytes     = h.backlog_bytes     + EXCLUDED.backlog_bytes$q$;
    hourly_cols text := 'topic_id, entry_count, size_bytes, sealed_at, offloaded_at, deleted_at';
BEGIN
    -- (event, the rows of a ledger statement, the rows of a chunk statement): +1 for new rows, -1 for old
    FOR ev IN SELECT * FROM (VALUES
        ('ins', 'SELECT 1 AS s, n.* FROM new_rows n', 'SELECT 1 AS s, n.topic_id, n.data_length FROM new_rows n',
         format('SELECT 1 AS s, %s FROM new_rows', hourly_cols)),
        ('upd', 'SELECT 1 AS s, n.* FROM new_rows n UNION ALL SELECT -1 AS s, o.* FROM old_rows o',
         'SELECT 1 AS s, n.topic_id, n.data_length FROM new_rows n '
             'UNION ALL SELECT -1 AS s, o.topic_id, o.data_length FROM old_rows o',
         format('SELECT 1 AS s, %s FROM new_rows UNION ALL SELECT -1 AS s, %s FROM old_rows', hourly_cols,
                hourly_cols)),
        ('del', 'SELECT -1 AS s, o.* FROM old_rows o', 'SELECT -1 AS s, o.topic_id, o.data_length FROM old_rows o',
         format('SELECT -1 AS s, %s FROM old_rows', hourly_cols))) AS v (name, ledger_rows, chunk_rows, hourly_rows)
    LOOP
        EXECUTE format('CREATE FUNCTION tiering.topic_usage_ledger_%s() RETURNS trigger LANGUAGE plpgsql AS '
                       '$f$ BEGIN %s; RETURN NULL; END $f$', ev.name, format(usage_ledger, ev.ledger_rows));
        EXECUTE format('CREATE FUNCTION tiering.topic_usage_chunk_%s() RETURNS trigger LANGUAGE plpgsql AS '
                       '$f$ BEGIN %s; RETURN NULL; END $f$', ev.name, format(usage_chunk, ev.chunk_rows));
        EXECUTE format('CREATE FUNCTION tiering.ledger_hourly_%s() RETURNS trigger LANGUAGE plpgsql AS '
                       '$f$ BEGIN %s; RETURN NULL; END $f$', ev.name, format(hourly, ev.hourly_rows));
    END LOOP;
END $migration$;

DROP TRIGGER topic_usage_ledger_ins ON tiering.ledger;
DROP TRIGGER topic_usage_ledger_upd ON tiering.ledger;
DROP TRIGGER topic_usage_ledger_del ON tiering.ledger;
DROP TRIGGER topic_usage_chunk_ins ON tiering.chunk;
DROP TRIGGER topic_usage_chunk_upd ON tiering.chunk;
DROP TRIGGER topic_usage_chunk_del ON tiering.chunk;
DROP TRIGGER ledger_hourly_ins ON tiering.ledger;
DROP TRIGGER ledger_hourly_upd ON tiering.ledger;
DROP TRIGGER ledger_hourly_del ON tiering.ledger;
DROP FUNCTION tiering.topic_usage_ledger_delta();
DROP FUNCTION tiering.topic_usage_chunk_delta();
DROP FUNCTION tiering.ledger_hourly_delta();

-- the same names, events and order as before (AFTER statement triggers fire in name order)
CREATE TRIGGER topic_usage_ledger_ins AFTER INSERT ON tiering.ledger
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_ledger_ins();
CREATE TRIGGER topic_usage_ledger_upd AFTER UPDATE ON tiering.ledger
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_ledger_upd();
CREATE TRIGGER topic_usage_ledger_del AFTER DELETE ON tiering.ledger
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_ledger_del();
CREATE TRIGGER topic_usage_chunk_ins AFTER INSERT ON tiering.chunk
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_chunk_ins();
CREATE TRIGGER topic_usage_chunk_upd AFTER UPDATE ON tiering.chunk
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_chunk_upd();
CREATE TRIGGER topic_usage_chunk_del AFTER DELETE ON tiering.chunk
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION tiering.topic_usage_chunk_del();
CREATE TRIGGER ledger_hourly_ins AFTER INSERT ON tiering.ledger
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tiering.ledger_hourly_ins();
CREATE TRIGGER ledger_hourly_upd AFTER UPDATE ON tiering.ledger
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tiering.ledger_hourly_upd();
CREATE TRIGGER ledger_hourly_del AFTER DELETE ON tiering.ledger
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION tiering.ledger_hourly_del();
