-- The ETags of a chunk's data and index objects as the requests that wrote them answered. delete-lagged
-- HEADs both objects before it deletes a ledger's tier-1 copy, the last copy it can be repaired from; an
-- object replaced since it was written (a PUT over its key) keeps its length and answers with another ETag,
-- so the copy stays. Defrag copies a source server-side only if it still has its ETag. NULL: a chunk
-- written before this migration, or one recovered from a listing that could not tell.
ALTER TABLE tiering.chunk ADD COLUMN data_etag text, ADD COLUMN index_etag text;
