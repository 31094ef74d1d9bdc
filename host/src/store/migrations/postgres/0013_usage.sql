-- idem store schema on PostgreSQL: token usage of model calls (SQLite's
-- `0015_usage.sql`): one row per step key, inserted only if absent; each replay adds
-- one to `replays`. Deleted by gc with its run.

CREATE TABLE step_usage (
    key      text PRIMARY KEY,
    run_id   text NOT NULL,
    model    text NOT NULL,
    input    int8 NOT NULL CHECK (input >= 0),
    output   int8 NOT NULL CHECK (output >= 0),
    cached   int8 NOT NULL CHECK (cached >= 0),
    replays  int8 NOT NULL DEFAULT 0 CHECK (replays >= 0),
    recorded int8 NOT NULL
);

CREATE INDEX step_usage_run ON step_usage (run_id);
