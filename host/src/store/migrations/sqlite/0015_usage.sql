-- Token usage of model calls (store/usage.rs): one row per step key that recorded it,
-- inserted only if absent, so a key is spent once however many instances replay it;
-- each replay adds one to `replays` (its tokens saved). Deleted by gc with its run.

CREATE TABLE step_usage (
    key      TEXT PRIMARY KEY NOT NULL,
    run_id   TEXT NOT NULL,
    model    TEXT NOT NULL,
    input    INTEGER NOT NULL CHECK (input >= 0),
    output   INTEGER NOT NULL CHECK (output >= 0),
    cached   INTEGER NOT NULL CHECK (cached >= 0),
    replays  INTEGER NOT NULL DEFAULT 0 CHECK (replays >= 0),
    recorded INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- `idem show` and gc find a run's rows by it.
CREATE INDEX step_usage_run ON step_usage (run_id);
