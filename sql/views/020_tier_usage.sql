-- Bytes and ledgers per tier per topic (a ledger offloaded but still on tier 1 counts on both).
CREATE VIEW tiering.tier_usage AS
SELECT t.name AS topic,
       count(*) FILTER (WHERE l.tier1_present AND l.state <> 'DELETED')                  AS tier1_ledgers,
       coalesce(sum(l.size_bytes) FILTER (WHERE l.tier1_present AND l.state <> 'DELETED'), 0) AS tier1_bytes,
       count(*) FILTER (WHERE l.state = 'OFFLOADED')                                      AS tier2_ledgers,
       coalesce(sum(l.size_bytes) FILTER (WHERE l.state = 'OFFLOADED'), 0)                AS tier2_bytes,
       coalesce(sum(c.data_length) FILTER (WHERE l.state = 'OFFLOADED'), 0)               AS tier2_stored_bytes,
       count(*) FILTER (WHERE l.state = 'DELETED')                                        AS deleted_ledgers
FROM tiering.topic t
LEFT JOIN tiering.ledger l USING (topic_id)
LEFT JOIN tiering.chunk c USING (topic_id, ledger_id)
GROUP BY t.name;
