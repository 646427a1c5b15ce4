-- The orphan sweep's listing cursor (issue 19): the sweep lists the tier-2 prefix a page budget per run,
-- resuming after `cursor`, and wraps round at the end of the prefix. One row per bucket and prefix swept.
-- The cursor is only where the next listing starts: no decision about any key is stored here (ops/gc.py).
CREATE TABLE tiering.gc_sweep (
    bucket              text        NOT NULL CHECK (length(bucket) > 0),
    prefix              text        NOT NULL,
    cursor              text        NOT NULL DEFAULT '',   -- last key listed and decided; '' = a pass starts
    pass_started_at     timestamptz,                       -- when the current pass listed its first page
    last_pass_completed_at timestamptz,                    -- when a pass last reached the end of the prefix
    passes_completed    bigint      NOT NULL DEFAULT 0 CHECK (passes_completed >= 0),
    pages_listed        bigint      NOT NULL DEFAULT 0 CHECK (pages_listed >= 0),
    orphans_deleted     bigint      NOT NULL DEFAULT 0 CHECK (orphans_deleted >= 0),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    version             bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (bucket, prefix)
);
