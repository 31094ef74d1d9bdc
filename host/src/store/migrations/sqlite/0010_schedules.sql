-- Version 10: schedules.
--
-- A schedule starts a run of a deployment at each tick of a cron expression (in a
-- time zone) or of a fixed interval. `next_tick` is its next unfired tick on the
-- store's clock (NULL once none comes again); firing moves it past the ticks it
-- handled in the same transaction that submits their runs, so a tick is fired once
-- however many workers look. The tick counts feed `/metrics`.

CREATE TABLE schedules (
    name        TEXT PRIMARY KEY NOT NULL,
    deployment  TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('every', 'cron')),
    every_ms    INTEGER CHECK (every_ms > 0),
    cron        TEXT,
    tz          TEXT,
    input       BLOB NOT NULL,
    catch_up    INTEGER NOT NULL CHECK (catch_up >= 0),
    overlap     TEXT NOT NULL CHECK (overlap IN ('skip', 'allow', 'cancel-previous')),
    paused      INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    next_tick   INTEGER,
    last_tick   INTEGER,
    last_run    TEXT,
    started     INTEGER NOT NULL DEFAULT 0 CHECK (started >= 0),
    skipped     INTEGER NOT NULL DEFAULT 0 CHECK (skipped >= 0),
    missed      INTEGER NOT NULL DEFAULT 0 CHECK (missed >= 0),
    failed      INTEGER NOT NULL DEFAULT 0 CHECK (failed >= 0),
    last_error  TEXT,
    created     INTEGER NOT NULL,
    updated     INTEGER NOT NULL
) STRICT;

-- What workers ask at every poll: is anything due?
CREATE INDEX schedules_due ON schedules (next_tick) WHERE paused = 0 AND next_tick IS NOT NULL;

-- The schedule and tick that started a run; goes with the run when gc collects it,
-- and outlives the schedule (a deleted schedule's runs still name it).
CREATE TABLE scheduled_runs (
    run_id   TEXT PRIMARY KEY NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    schedule TEXT NOT NULL,
    tick     INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

CREATE INDEX scheduled_runs_by_tick ON scheduled_runs (schedule, tick);
