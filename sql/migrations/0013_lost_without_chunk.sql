-- Recovery from the bucket records the ledger ids it finds no good copy of (above the topic's retention
-- trim point) as ledgers marked lost, so that reads give their DATALOSS gap and verify, status, stats and
-- the dashboard count them instead of the loss being said only once, in the recovery's report. Such a
-- ledger is OFFLOADED and marked lost (as `tiering repair` marks one) but no object is known to hold it:
-- it has no chunk row. So a chunk exists exactly while its ledger is OFFLOADED, except that an OFFLOADED
-- ledger marked lost may have none. Clearing the mark of such a ledger without giving it a chunk is still
-- refused at commit.
CREATE OR REPLACE FUNCTION tiering.check_ledger_chunk() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    t bigint := COALESCE(NEW.topic_id, OLD.topic_id);
    l bigint := COALESCE(NEW.ledger_id, OLD.ledger_id);
    st tiering.ledger_state;
    lost boolean;
    has_chunk boolean;
BEGIN
    SELECT state, lost_at IS NOT NULL INTO st, lost FROM tiering.ledger WHERE topic_id = t AND ledger_id = l;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT EXISTS (SELECT 1 FROM tiering.chunk WHERE topic_id = t AND ledger_id = l) INTO has_chunk;
    IF (st = 'OFFLOADED') <> has_chunk AND NOT (st = 'OFFLOADED' AND lost) THEN
        RAISE EXCEPTION 'ledger %/% is % but % chunk', t, l, st,
            CASE WHEN has_chunk THEN 'has a' ELSE 'has no' END
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;
