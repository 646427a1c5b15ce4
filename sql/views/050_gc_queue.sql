-- The garbage-collection queue: keys waiting, due, retried or failed.
CREATE VIEW tiering.gc_queue AS
SELECT g.task_id, g.key, g.reason, g.state, g.attempts, g.not_before, (g.not_before <= now()) AS due,
       g.owner_uuid, g.last_error, g.created_at,
       EXISTS (SELECT 1 FROM tiering.chunk c WHERE c.data_key = g.key OR c.index_key = g.key) AS referenced
FROM tiering.gc_task g;
