-- Functions of migration 0004 (chunk.data_alone, defrag's candidates) recreated on every upgrade, as the views
-- are: these bodies replace 0004's first ones, which were quadratic on large statements (a per-row subquery
-- in the loaders' recompute; a join of the transition tables, which have no statistics, in the UPDATE trigger).

-- For loaders that write chunks with triggers off: one grouped pass (a hash join on data_key), after ANALYZE,
-- since loaders call it right after bulk inserts, before statistics exist.
CREATE OR REPLACE FUNCTION tiering.recompute_chunk_alone() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    ANALYZE tiering.chunk;
    UPDATE tiering.chunk c SET data_alone = s.n = 1
    FROM (SELECT data_key, count(*) AS n FROM tiering.chunk GROUP BY data_key) s
    WHERE c.data_key = s.data_key AND c.data_alone <> (s.n = 1);
END $$;

-- An UPDATE changes a key's number of chunks only if the statement's rows hold the keys a different number of
-- times after than before: compared grouped (hashed, linear), so a version-only update, and this function's
-- own data_alone update (which fires it again), end here.
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
