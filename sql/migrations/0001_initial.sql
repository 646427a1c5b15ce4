-- The tiering metadata schema (DESIGN §4). Constraints make impossible states impossible; every state
-- change in the code is a conditional update on `version`.

CREATE TYPE tiering.ledger_state AS ENUM ('OPEN', 'SEALED', 'OFFLOADING', 'OFFLOADED', 'DELETED');

CREATE TABLE tiering.topic (
    topic_id                bigserial PRIMARY KEY,
    name                    text        NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 1024),
    offload_after_seconds   bigint      NOT NULL DEFAULT -1       CHECK (offload_after_seconds >= -1),
    offload_threshold_bytes bigint      NOT NULL DEFAULT -1       CHECK (offload_threshold_bytes >= -1),
    deletion_lag_seconds    bigint      NOT NULL DEFAULT 14400    CHECK (deletion_lag_seconds >= 0),
    retention_seconds       bigint      NOT NULL DEFAULT -1       CHECK (retention_seconds >= -1),
    retention_bytes         bigint      NOT NULL DEFAULT -1       CHECK (retention_bytes >= -1),
    rollover_entries        bigint      NOT NULL DEFAULT 50000    CHECK (rollover_entries > 0),
    rollover_bytes          bigint      NOT NULL DEFAULT 67108864 CHECK (rollover_bytes > 0),
    next_ledger_id          bigint      NOT NULL DEFAULT 0        CHECK (next_ledger_id >= 0),
    created_at              timestamptz NOT NULL DEFAULT now(),
    version                 bigint      NOT NULL DEFAULT 0
);

CREATE TABLE tiering.ledger (
    topic_id           bigint      NOT NULL REFERENCES tiering.topic (topic_id) ON DELETE CASCADE,
    ledger_id          bigint      NOT NULL CHECK (ledger_id >= 0),
    state              tiering.ledger_state NOT NULL DEFAULT 'OPEN',
    entry_count        bigint      NOT NULL DEFAULT 0 CHECK (entry_count >= 0),
    size_bytes         bigint      NOT NULL DEFAULT 0 CHECK (size_bytes >= 0),
    created_at         timestamptz NOT NULL DEFAULT now(),
    sealed_at          timestamptz,
    tier1_present      boolean     NOT NULL DEFAULT true,
    tier1_deleted_at   timestamptz,
    offload_uuid       uuid,
    offload_started_at timestamptz,
    offloaded_at       timestamptz,
    deleted_at         timestamptz,
    version            bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, ledger_id),
    CONSTRAINT sealed_has_seal_time CHECK (state = 'OPEN' OR sealed_at IS NOT NULL),
    CONSTRAINT offloading_has_attempt CHECK (
        state <> 'OFFLOADING' OR (offload_uuid IS NOT NULL AND offload_started_at IS NOT NULL)),
    CONSTRAINT offloaded_has_attempt CHECK (
        state <> 'OFFLOADED' OR (offload_uuid IS NOT NULL AND offloaded_at IS NOT NULL)),
    -- only an offloaded (or deleted) ledger may lose its tier-1 copy: nothing else holds its bytes
    CONSTRAINT tier1_kept_until_offloaded CHECK (tier1_present OR state IN ('OFFLOADED', 'DELETED')),
    CONSTRAINT tier1_deleted_time CHECK (tier1_present OR tier1_deleted_at IS NOT NULL),
    CONSTRAINT deleted_has_time CHECK (state <> 'DELETED' OR deleted_at IS NOT NULL)
);
-- A topic writes one ledger at a time (Pulsar's managed ledger).
CREATE UNIQUE INDEX ledger_one_open_per_topic ON tiering.ledger (topic_id) WHERE state = 'OPEN';
-- Selection queries of the pipeline.
CREATE INDEX ledger_offload_candidates ON tiering.ledger (sealed_at) WHERE state = 'SEALED' AND entry_count > 0;
CREATE INDEX ledger_stale_offloading ON tiering.ledger (offload_started_at) WHERE state = 'OFFLOADING';
CREATE INDEX ledger_lagged_copies ON tiering.ledger (offloaded_at) WHERE state = 'OFFLOADED' AND tier1_present;
CREATE INDEX ledger_deleted_with_copy ON tiering.ledger (topic_id) WHERE state = 'DELETED' AND tier1_present;

CREATE TABLE tiering.chunk (
    topic_id       bigint      NOT NULL,
    ledger_id      bigint      NOT NULL,
    data_key       text        NOT NULL,
    data_offset    bigint      NOT NULL CHECK (data_offset >= 0),
    data_length    bigint      NOT NULL CHECK (data_length > 0),
    index_key      text        NOT NULL,
    index_offset   bigint      NOT NULL CHECK (index_offset >= 0),
    index_length   bigint      NOT NULL CHECK (index_length > 0),
    first_entry_id bigint      NOT NULL CHECK (first_entry_id >= 0),
    last_entry_id  bigint      NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    version        bigint      NOT NULL DEFAULT 0,
    -- one chunk per offloaded ledger; defrag rewrites the row, never adds a second
    PRIMARY KEY (topic_id, ledger_id),
    FOREIGN KEY (topic_id, ledger_id) REFERENCES tiering.ledger (topic_id, ledger_id) ON DELETE CASCADE,
    CHECK (last_entry_id >= first_entry_id)
);
CREATE INDEX chunk_data_key ON tiering.chunk (data_key);
CREATE INDEX chunk_index_key ON tiering.chunk (index_key);

-- A chunk exists exactly while its ledger is OFFLOADED: checked at commit, so a transaction can move
-- both in any order but can never leave one without the other.
CREATE FUNCTION tiering.check_ledger_chunk() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    t bigint := COALESCE(NEW.topic_id, OLD.topic_id);
    l bigint := COALESCE(NEW.ledger_id, OLD.ledger_id);
    st tiering.ledger_state;
    has_chunk boolean;
BEGIN
    SELECT state INTO st FROM tiering.ledger WHERE topic_id = t AND ledger_id = l;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT EXISTS (SELECT 1 FROM tiering.chunk WHERE topic_id = t AND ledger_id = l) INTO has_chunk;
    IF (st = 'OFFLOADED') <> has_chunk THEN
        RAISE EXCEPTION 'ledger %/% is % but % chunk', t, l, st,
            CASE WHEN has_chunk THEN 'has a' ELSE 'has no' END
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER ledger_chunk_consistent AFTER INSERT OR UPDATE ON tiering.ledger
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tiering.check_ledger_chunk();
CREATE CONSTRAINT TRIGGER chunk_ledger_consistent AFTER INSERT OR UPDATE OR DELETE ON tiering.chunk
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tiering.check_ledger_chunk();

-- Tier-2 keys to delete. Queued before an upload starts, dequeued by the commit that references them.
CREATE TABLE tiering.gc_task (
    task_id    bigserial   PRIMARY KEY,
    key        text        NOT NULL CHECK (length(key) > 0),
    reason     text        NOT NULL,
    owner_uuid uuid,
    not_before timestamptz NOT NULL DEFAULT now(),
    attempts   integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    state      text        NOT NULL DEFAULT 'PENDING' CHECK (state IN ('PENDING', 'FAILED')),
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX gc_task_due ON tiering.gc_task (not_before) WHERE state = 'PENDING';
CREATE INDEX gc_task_owner ON tiering.gc_task (owner_uuid) WHERE owner_uuid IS NOT NULL;
CREATE INDEX gc_task_key ON tiering.gc_task (key);

-- 64-bit attributes of a topic (ledger_id = -1) or a ledger, as Pravega's segment attributes.
CREATE TABLE tiering.attribute (
    topic_id   bigint      NOT NULL REFERENCES tiering.topic (topic_id) ON DELETE CASCADE,
    ledger_id  bigint      NOT NULL DEFAULT -1 CHECK (ledger_id >= -1),
    key        text        NOT NULL CHECK (length(key) BETWEEN 1 AND 256),
    value      bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    version    bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, ledger_id, key)
);

CREATE TABLE tiering.job_run (
    run_id       bigserial   PRIMARY KEY,
    job          text        NOT NULL,
    topic        text,
    status       text        NOT NULL DEFAULT 'RUNNING' CHECK (status IN ('RUNNING', 'SUCCEEDED', 'FAILED')),
    started_at   timestamptz NOT NULL DEFAULT now(),
    ended_at     timestamptz,
    items_done   bigint      NOT NULL DEFAULT 0 CHECK (items_done >= 0),
    items_failed bigint      NOT NULL DEFAULT 0 CHECK (items_failed >= 0),
    bytes        bigint      NOT NULL DEFAULT 0 CHECK (bytes >= 0),
    error        text,
    details      jsonb,
    CHECK (status = 'RUNNING' OR ended_at IS NOT NULL)
);
CREATE INDEX job_run_job_started ON tiering.job_run (job, started_at DESC);
