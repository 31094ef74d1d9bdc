-- idem store schema on PostgreSQL: runs' live streams (SQLite's `0016_live.sql`):
-- chunks numbered per run, the newest `LIVE_KEEP` bytes of text kept (`len` counts
-- the text in clear; `text` is sealed in a store encrypted at rest). Deleted by gc
-- with its run.

CREATE TABLE run_live (
    run_id text NOT NULL,
    seq    int8 NOT NULL CHECK (seq >= 0),
    key    text NOT NULL,
    text   bytea NOT NULL,
    len    int8 NOT NULL CHECK (len >= 0),
    PRIMARY KEY (run_id, seq)
);
