-- Runs' live streams (store/live.rs): text a step publishes while it runs, in chunks
-- numbered per run. Not durable by design: the newest `LIVE_KEEP` bytes of a run are
-- kept (`len`, the text's length in clear, is what the bound counts; `text` is sealed
-- in a store encrypted at rest). Deleted by gc with its run.

CREATE TABLE run_live (
    run_id TEXT NOT NULL,
    seq    INTEGER NOT NULL CHECK (seq >= 0),
    key    TEXT NOT NULL,
    text   BLOB NOT NULL,
    len    INTEGER NOT NULL CHECK (len >= 0),
    PRIMARY KEY (run_id, seq)
) STRICT, WITHOUT ROWID;
