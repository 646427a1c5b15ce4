-- chunk.data_alone (migration 0004: whether a chunk's data object holds its ledger only, defrag's candidates)
-- recounted by one function, which the three statement triggers and the loaders' recompute call with the
-- keys they touched. The bodies are the linear ones: a key's chunks counted grouped, never with a per-row
-- subquery, and the transition tables (which have no statistics) never joined to each other.

-- Sets data_alone of every chunk of `keys` whose data object holds a different number of chunks than the
-- flag says: true when it holds one. A key may be given more than once; a key with no chunk left is a no-op.
-- One generic plan (index probes on chunk_data_key, however many keys): a custom plan per call would cost
-- more to plan than a one-row statement's trigger costs to run.
CREATE FUNCTION tiering.chunk_alone_recount(keys text[]) RETURNS void LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    UPDATE tiering.chunk c SET data_alone = s.n = 1
    FROM (SELECT k.data_key, count(*) AS n FROM tiering.chunk k
          WHERE k.data_key = ANY (keys) GROUP BY k.data_key) s
    WHERE c.data_key = s.data_key AND c.data_alone <> (s.n = 1);
END $$;

-- One trigger function per event: a trigger sees only the transition tables of its own event, and a function
-- it calls sees none, so each passes its keys.
CREATE OR REPLACE FUNCTION tiering.chunk_alone_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tiering.chunk_alone_recount(ARRAY(SELECT data_key FROM new_rows));
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION tiering.chunk_alone_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tiering.chunk_alone_recount(ARRAY(SELECT data_key FROM old_rows));
    RETURN NULL;
END $$;

-- An UPDATE changes a key's number of chunks only if the statement's rows hold the keys a different number of
-- times after than before: compared grouped (hashed, linear), so a version-only update, and the recount's own
-- data_alone update (which fires this trigger again), end here.
CREATE OR REPLACE FUNCTION tiering.chunk_alone_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS ((SELECT data_key, count(*) FROM new_rows GROUP BY data_key
                    EXCEPT SELECT data_key, count(*) FROM old_rows GROUP BY data_key)
                   UNION ALL
                   (SELECT data_key, count(*) FROM old_rows GROUP BY data_key
                    EXCEPT SELECT data_key, count(*) FROM new_rows GROUP BY data_key)) THEN
        RETURN NULL;
    END IF;
    PERFORM tiering.chunk_alone_recount(ARRAY(SELECT data_key FROM new_rows UNION SELECT data_key FROM old_rows));
    RETURN NULL;
END $$;

-- For loaders that write chunks with triggers off (session_replication_role = replica), as
-- tiering.recompute_topic_usage(): every key, after ANALYZE, since loaders call it right after bulk inserts,
-- before statistics exist.
CREATE OR REPLACE FUNCTION tiering.recompute_chunk_alone() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    ANALYZE tiering.chunk;
    PERFORM tiering.chunk_alone_recount(ARRAY(SELECT DISTINCT data_key FROM tiering.chunk));
END $$;
