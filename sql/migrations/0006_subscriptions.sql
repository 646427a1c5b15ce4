-- Subscriptions: named reader positions per topic, and the policy that lets them bound retention
-- (Pulsar keeps unacknowledged messages; Pravega's consumption-based retention truncates only up to the
-- slowest subscriber, within a minimum and a maximum). Existing rows keep their meaning: every new policy
-- column defaults to "off", so retention behaves as before until an operator turns it on.

ALTER TABLE tiering.topic
    -- time/size retention deletes a ledger only once every ACTIVE subscription has read all of it
    ADD COLUMN retain_unread boolean NOT NULL DEFAULT false,
    -- hard ceilings: past them a ledger goes even unread (the loss is recorded per subscription)
    ADD COLUMN max_retention_seconds bigint NOT NULL DEFAULT -1 CHECK (max_retention_seconds >= -1),
    ADD COLUMN max_retention_bytes bigint NOT NULL DEFAULT -1 CHECK (max_retention_bytes >= -1),
    -- a subscription with no ack for this long is EXPIRED: it holds nothing back (-1: never)
    ADD COLUMN subscription_expiry_seconds bigint NOT NULL DEFAULT -1
        CHECK (subscription_expiry_seconds = -1 OR subscription_expiry_seconds > 0),
    ADD CONSTRAINT ceiling_time_not_below_retention CHECK (
        max_retention_seconds = -1 OR retention_seconds = -1 OR max_retention_seconds >= retention_seconds),
    ADD CONSTRAINT ceiling_size_not_below_retention CHECK (
        max_retention_bytes = -1 OR retention_bytes = -1 OR max_retention_bytes >= retention_bytes);

-- A reader's position: the last entry it has read (acknowledged), NULL before the first. It only moves
-- forward, by compare-and-set on `version`, except by an explicit reset, or when entries it had not read were
-- deleted (a ceiling, a forced truncate, retention without retain_unread, an EXPIRED subscription): then it
-- moves to the last deleted entry and the loss is added to the counters and logged in subscription_loss.
CREATE TABLE tiering.subscription (
    subscription_id        bigserial   PRIMARY KEY,
    topic_id               bigint      NOT NULL REFERENCES tiering.topic (topic_id) ON DELETE CASCADE,
    name                   text        NOT NULL CHECK (length(name) BETWEEN 1 AND 256),
    ack_ledger_id          bigint      CHECK (ack_ledger_id >= 0),
    ack_entry_id           bigint      CHECK (ack_entry_id >= 0),
    created_at             timestamptz NOT NULL DEFAULT now(),
    last_ack_at            timestamptz,
    entries_deleted_unread bigint      NOT NULL DEFAULT 0 CHECK (entries_deleted_unread >= 0),
    bytes_deleted_unread   bigint      NOT NULL DEFAULT 0 CHECK (bytes_deleted_unread >= 0),
    last_loss_at           timestamptz,
    last_loss_reason       text,
    version                bigint      NOT NULL DEFAULT 0,
    CONSTRAINT subscription_name_per_topic UNIQUE (topic_id, name),
    CONSTRAINT subscription_position_whole CHECK ((ack_ledger_id IS NULL) = (ack_entry_id IS NULL))
);
-- Retention's hold per topic (the slowest position: one probe, NULLs first) and each topic's subscriptions.
CREATE INDEX subscription_slowest ON tiering.subscription (topic_id, ack_ledger_id NULLS FIRST, ack_entry_id NULLS FIRST);

-- Every deletion of entries a subscription had not read: when, why, which range, how much.
CREATE TABLE tiering.subscription_loss (
    loss_id         bigserial   PRIMARY KEY,
    subscription_id bigint      NOT NULL REFERENCES tiering.subscription (subscription_id) ON DELETE CASCADE,
    at              timestamptz NOT NULL DEFAULT now(),
    reason          text        NOT NULL,
    from_ledger_id  bigint      NOT NULL,
    from_entry_id   bigint      NOT NULL,
    to_ledger_id    bigint      NOT NULL,
    to_entry_id     bigint      NOT NULL,
    entries         bigint      NOT NULL CHECK (entries > 0),
    bytes           bigint      NOT NULL CHECK (bytes >= 0)
);
CREATE INDEX subscription_loss_by_subscription ON tiering.subscription_loss (subscription_id, at);

-- A deleted topic's name, with the ledger id its successor starts at: ledger ids of a name are never
-- reused, so no tier-1 file, tier-2 object or trim marker of the deleted topic can be taken for the new one's.
CREATE TABLE tiering.topic_tombstone (
    name           text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 1024),
    next_ledger_id bigint      NOT NULL CHECK (next_ledger_id >= 0),
    trim_marker_written bigint NOT NULL DEFAULT -1,
    deleted_at     timestamptz NOT NULL DEFAULT now()
);
