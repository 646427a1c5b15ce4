-- Sealed ledgers not yet in tier 2, and offloads in flight (with their attempt's age).
CREATE VIEW tiering.offload_backlog AS
SELECT t.name AS topic, l.ledger_id, l.state, l.entry_count, l.size_bytes, l.sealed_at,
       now() - l.sealed_at AS sealed_for, l.offload_uuid, l.offload_started_at,
       CASE WHEN l.state = 'OFFLOADING' THEN now() - l.offload_started_at END AS attempt_age
FROM tiering.ledger l
JOIN tiering.topic t USING (topic_id)
WHERE l.state IN ('SEALED', 'OFFLOADING') AND l.entry_count > 0;
