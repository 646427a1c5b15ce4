-- Tier-1 copies of offloaded ledgers, and when the deletion lag lets them go.
CREATE VIEW tiering.lagged_copies AS
SELECT t.name AS topic, l.ledger_id, l.size_bytes, l.offloaded_at,
       t.deletion_lag_seconds,
       l.offloaded_at + make_interval(secs => t.deletion_lag_seconds) AS deletable_at,
       (l.offloaded_at + make_interval(secs => t.deletion_lag_seconds) <= now()) AS due
FROM tiering.ledger l
JOIN tiering.topic t USING (topic_id)
WHERE l.state = 'OFFLOADED' AND l.tier1_present;
