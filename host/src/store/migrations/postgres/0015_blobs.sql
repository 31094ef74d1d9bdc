-- idem store schema on PostgreSQL: large values kept once by digest (SQLite's
-- `0017_blobs.sql`, whose comments say how). The bytes are stored out of line and not
-- compressed: sealed values do not compress, and compressing 64 MiB costs more than
-- writing it.

CREATE TABLE blobs (
    id      bytea PRIMARY KEY,
    size    int8 NOT NULL CHECK (size >= 0),
    used_at int8 NOT NULL
);

CREATE TABLE blob_bytes (
    id    bytea PRIMARY KEY,
    bytes bytea NOT NULL
);
ALTER TABLE blob_bytes ALTER COLUMN bytes SET STORAGE EXTERNAL;

CREATE INDEX run_inputs_blob ON run_inputs (input) WHERE substr(input, 1, 4) = '\x00494201'::bytea;
CREATE INDEX run_outcomes_blob ON run_outcomes (outcome) WHERE substr(outcome, 1, 4) = '\x00494201'::bytea;
CREATE INDEX progress_blob ON progress (state) WHERE substr(state, 1, 4) = '\x00494201'::bytea;
CREATE INDEX steps_blob ON steps (result) WHERE substr(result, 1, 4) = '\x00494201'::bytea;
CREATE INDEX waits_blob ON waits (payload) WHERE substr(payload, 1, 4) = '\x00494201'::bytea;
CREATE INDEX signals_blob ON signals (payload) WHERE substr(payload, 1, 4) = '\x00494201'::bytea;
CREATE INDEX join_members_blob ON join_members (outcome) WHERE substr(outcome, 1, 4) = '\x00494201'::bytea;
CREATE INDEX schedules_blob ON schedules (input) WHERE substr(input, 1, 4) = '\x00494201'::bytea;
