-- Each ledger's layout: where its bytes are (tier 1, tier 2 object and range), its state and age.
CREATE VIEW tiering.ledger_layout AS
SELECT t.name AS topic, l.ledger_id, l.state, l.entry_count, l.size_bytes, l.sealed_at,
       l.tier1_present, (l.state = 'OFFLOADED') AS tier2_present, l.offload_uuid, l.offloaded_at,
       c.data_key, c.data_offset, c.data_length, c.index_key, c.index_offset, c.index_length,
       c.first_entry_id, c.last_entry_id, l.version
FROM tiering.ledger l
JOIN tiering.topic t USING (topic_id)
LEFT JOIN tiering.chunk c USING (topic_id, ledger_id);
