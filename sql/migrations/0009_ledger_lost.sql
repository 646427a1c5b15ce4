-- A ledger no tier holds a good copy of any more (its tier-2 copy missing, short or corrupt, and no tier-1
-- copy that verifies): `tiering repair` marks it by compare-and-set so that reads return a DATALOSS gap for
-- its range at once instead of failing a GET, and status, the dashboard and /tiering/metrics count it.
-- NULL: not lost. The mark is final: the bytes are gone; retention may still delete the ledger.
ALTER TABLE tiering.ledger ADD COLUMN lost_at timestamptz;
ALTER TABLE tiering.ledger ADD COLUMN lost_reason text;

-- Counting lost ledgers (metrics, status, dashboard) reads the marked rows only.
CREATE INDEX ledger_lost ON tiering.ledger (topic_id, ledger_id) WHERE lost_at IS NOT NULL;
