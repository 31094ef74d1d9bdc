-- idem store schema on PostgreSQL: runs' timelines (SQLite's `0019_events.sql`):
-- events numbered per run by `runs.events`, which every statement that records one
-- increments under the run's row lock (so two writers never take one number); the
-- first `EVENTS_HEAD` and last `EVENTS_TAIL` kept. Deleted by gc with its run.

ALTER TABLE runs ADD COLUMN events int8 NOT NULL DEFAULT 0 CHECK (events >= 0);

CREATE TABLE run_events (
    run_id text NOT NULL,
    seq    int8 NOT NULL CHECK (seq >= 1),
    at     int8 NOT NULL,
    kind   text NOT NULL,
    holder text,
    token  int8,
    detail text NOT NULL,
    PRIMARY KEY (run_id, seq)
);
