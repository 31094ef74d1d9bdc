-- Large values kept once by digest (store/values/): a row stores a 36-byte reference
-- (`00 49 42 01` then the SHA-256 of the bytes it stands for) where the value would
-- be. `blobs` is small and touched at every write that refers to a blob (`used_at`);
-- the bytes live in `blob_bytes`, written once: SQLite rewrites a whole row, overflow
-- pages and all, whenever any column of it changes.

CREATE TABLE blobs (
    id      BLOB PRIMARY KEY NOT NULL,
    size    INTEGER NOT NULL CHECK (size >= 0),
    used_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

CREATE TABLE blob_bytes (
    id    BLOB PRIMARY KEY NOT NULL,
    bytes BLOB NOT NULL
) STRICT;

-- gc asks whether any row still refers to a blob: these hold only the rows that hold a
-- reference, so they stay as small as the large values are few.
CREATE INDEX run_inputs_blob ON run_inputs (input) WHERE substr(input, 1, 4) = X'00494201';
CREATE INDEX run_outcomes_blob ON run_outcomes (outcome) WHERE substr(outcome, 1, 4) = X'00494201';
CREATE INDEX progress_blob ON progress (state) WHERE substr(state, 1, 4) = X'00494201';
CREATE INDEX steps_blob ON steps (result) WHERE substr(result, 1, 4) = X'00494201';
CREATE INDEX waits_blob ON waits (payload) WHERE substr(payload, 1, 4) = X'00494201';
CREATE INDEX signals_blob ON signals (payload) WHERE substr(payload, 1, 4) = X'00494201';
CREATE INDEX join_members_blob ON join_members (outcome) WHERE substr(outcome, 1, 4) = X'00494201';
CREATE INDEX schedules_blob ON schedules (input) WHERE substr(input, 1, 4) = X'00494201';
