-- Runs' timelines (store/events.rs): what happened to each run — instances started and
-- ended, leases taken over, waits, signals, pauses, upgrades — written inside the
-- transactions that already happen once per instance or lease, never per step.
-- `runs.events` counts the events a run recorded (and numbers them); a run keeps its
-- first `EVENTS_HEAD` and last `EVENTS_TAIL`, those between dropped as new ones come.
-- `detail` is JSON metadata the host wrote, never a payload. Deleted by gc with its run.

ALTER TABLE runs ADD COLUMN events INTEGER NOT NULL DEFAULT 0 CHECK (events >= 0);

CREATE TABLE run_events (
    run_id TEXT NOT NULL,
    seq    INTEGER NOT NULL CHECK (seq >= 1),
    at     INTEGER NOT NULL,
    kind   TEXT NOT NULL,
    holder TEXT,
    token  INTEGER,
    detail TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) STRICT, WITHOUT ROWID;
