-- Planning on candidate rows only (issue 19, tiering/metadata/planning.py): partial indexes so each scheduled
-- run reads what is due, not the topics' history, and the two maintained values planning needs. Plain
-- CREATE INDEX and ADD COLUMN with a constant default (no table rewrite); the one backfill UPDATE touches
-- only chunks whose data object is not shared.

-- Retention and truncate walk from a topic's oldest live ledger; defrag probes back to the previous one.
CREATE INDEX ledger_live_by_topic ON tiering.ledger (topic_id, ledger_id) WHERE state <> 'DELETED';
-- Offload by size: topics with an offloadable ledger, and the oldest such ledger of each.
CREATE INDEX ledger_sealed_by_topic ON tiering.ledger (topic_id, ledger_id) WHERE state = 'SEALED' AND entry_count > 0;
-- Retention's trim point (last DELETED ledger + 1) per topic: one backward probe.
CREATE INDEX ledger_deleted_by_topic ON tiering.ledger (topic_id, ledger_id) WHERE state = 'DELETED';

-- The trim marker (tier2/markers.py) last written to tier 2 for the topic: retention PUTs it only when the
-- trim point moved past it (PUT first, then this column: a kill in between re-PUTs the same marker).
ALTER TABLE tiering.topic ADD COLUMN trim_marker_written bigint NOT NULL DEFAULT -1;

-- Whether the chunk's data object holds this ledger only (defrag's candidates are small such chunks). Kept
-- by the statement triggers below for every key a statement adds, removes or switches; defrag's query
-- re-checks each candidate on chunk_data_key, so a stale true costs a probe and a stale false (two
-- concurrent deletions of the same object's other ledgers) only delays a merge.
ALTER TABLE tiering.chunk ADD COLUMN data_alone boolean NOT NULL DEFAULT false;
UPDATE tiering.chunk c SET data_alone = true
WHERE NOT EXISTS (SELECT 1 FROM tiering.chunk o WHERE o.data_key = c.data_key
                  AND (o.topic_id, o.ledger_id) <> (c.topic_id, c.ledger_id));
CREATE INDEX chunk_defrag_candidates ON tiering.chunk (data_length) WHERE data_alone;

-- One function per event: a trigger sees only the transition tables of its own event.
CREATE FUNCTION tiering.chunk_alone_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tiering.chunk c SET data_alone = s.n = 1
    FROM (SELECT k.data_key, count(*) AS n FROM tiering.chunk k
          WHERE k.data_key IN (SELECT data_key FROM new_rows) GROUP BY k.data_key) s
    WHERE c.data_key = s.data_key AND c.data_alone <> (s.n = 1);
    RETURN NULL;
END $$;
CREATE FUNCTION tiering.chunk_alone_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tiering.chunk c SET data_alone = s.n = 1
    FROM (SELECT k.data_key, count(*) AS n FROM tiering.chunk k
          WHERE k.data_key IN (SELECT data_key FROM old_rows) GROUP BY k.data_key) s
    WHERE c.data_key = s.data_key AND c.data_alone <> (s.n = 1);
    RETURN NULL;
END $$;
CREATE FUNCTION tiering.chunk_alone_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- only a statement that switches a data_key matters; this also ends at once for the UPDATE below
    -- (data_alone only), which fires this trigger again
    IF NOT EXISTS (SELECT 1 FROM new_rows n JOIN old_rows o USING (topic_id, ledger_id)
                   WHERE n.data_key IS DISTINCT FROM o.data_key) THEN
        RETURN NULL;
    END IF;
    UPDATE tiering.chunk c SET data_alone = s.n = 1
    FROM (SELECT k.data_key, count(*) AS n FROM tiering.chunk k
          WHERE k.data_key IN (SELECT data_key FROM new_rows UNION SELECT data_key FROM old_rows)
          GROUP BY k.data_key) s
    WHERE c.data_key = s.data_key AND c.data_alone <> (s.n = 1);
    RETURN NULL;
END $$;
CREATE TRIGGER chunk_alone_ins AFTER INSERT ON tiering.chunk
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tiering.chunk_alone_inserted();
CREATE TRIGGER chunk_alone_del AFTER DELETE ON tiering.chunk
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION tiering.chunk_alone_deleted();
CREATE TRIGGER chunk_alone_upd AFTER UPDATE ON tiering.chunk
    REFERENCING NEW TABLE AS new_rows OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tiering.chunk_alone_updated();

-- For loaders that write chunks with triggers off (session_replication_role = replica), as
-- tiering.recompute_topic_usage().
CREATE FUNCTION tiering.recompute_chunk_alone() RETURNS void LANGUAGE sql AS $$
    UPDATE tiering.chunk c SET data_alone = NOT EXISTS (
        SELECT 1 FROM tiering.chunk o WHERE o.data_key = c.data_key
        AND (o.topic_id, o.ledger_id) <> (c.topic_id, c.ledger_id))
    WHERE c.data_alone IS DISTINCT FROM NOT EXISTS (
        SELECT 1 FROM tiering.chunk o WHERE o.data_key = c.data_key
        AND (o.topic_id, o.ledger_id) <> (c.topic_id, c.ledger_id));
$$;
