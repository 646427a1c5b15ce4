-- A deleted topic's last version, kept on its tombstone: a topic created again under the name starts after
-- it, so a `topic set --expect-version` of a version read from the old topic cannot match the new one (which
-- started at version 0 too) and change a topic the operator never looked at. Tombstones written before this
-- migration do not know it (-1): a topic made again from one starts at version 0, as before.
ALTER TABLE tiering.topic_tombstone ADD COLUMN version bigint NOT NULL DEFAULT -1 CHECK (version >= -1);
