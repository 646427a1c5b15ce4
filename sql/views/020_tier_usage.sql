-- Bytes and ledgers per tier per topic (a ledger offloaded but still on tier 1 counts on both). Read from
-- the maintained totals (tiering.topic_usage, migration 0003): one row per topic, whatever the history.
CREATE VIEW tiering.tier_usage AS
SELECT t.name AS topic,
       coalesce(u.tier1_ledgers, 0)      AS tier1_ledgers,
       coalesce(u.tier1_bytes, 0)        AS tier1_bytes,
       coalesce(u.tier2_ledgers, 0)      AS tier2_ledgers,
       coalesce(u.tier2_bytes, 0)        AS tier2_bytes,
       coalesce(u.tier2_stored_bytes, 0) AS tier2_stored_bytes,
       coalesce(u.deleted_ledgers, 0)    AS deleted_ledgers
FROM tiering.topic t
LEFT JOIN tiering.topic_usage u USING (topic_id);
