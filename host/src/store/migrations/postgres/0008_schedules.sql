-- idem store schema on PostgreSQL, version 8: schedules (SQLite's version 10).
--
-- A schedule starts a run of a deployment at each tick of a cron expression (in a
-- time zone) or of a fixed interval. `next_tick` is its next unfired tick on the
-- store's clock (NULL once none comes again); firing moves it past the ticks it
-- handled in the same transaction that submits their runs, so a tick is fired once
-- however many workers look. The tick counts feed `/metrics`.

CREATE TABLE schedules (
    name        text PRIMARY KEY NOT NULL,
    deployment  text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('every', 'cron')),
    every_ms    int8 CHECK (every_ms > 0),
    cron        text,
    tz          text,
    input       bytea NOT NULL,
    catch_up    int8 NOT NULL CHECK (catch_up >= 0),
    overlap     text NOT NULL CHECK (overlap IN ('skip', 'allow', 'cancel-previous')),
    paused      boolean NOT NULL DEFAULT false,
    next_tick   int8,
    last_tick   int8,
    last_run    text,
    started     int8 NOT NULL DEFAULT 0 CHECK (started >= 0),
    skipped     int8 NOT NULL DEFAULT 0 CHECK (skipped >= 0),
    missed      int8 NOT NULL DEFAULT 0 CHECK (missed >= 0),
    failed      int8 NOT NULL DEFAULT 0 CHECK (failed >= 0),
    last_error  text,
    created     int8 NOT NULL,
    updated     int8 NOT NULL
);

-- What workers ask at every poll: is anything due?
CREATE INDEX schedules_due ON schedules (next_tick) WHERE NOT paused AND next_tick IS NOT NULL;

-- The schedule and tick that started a run; goes with the run when gc collects it,
-- and outlives the schedule (a deleted schedule's runs still name it).
CREATE TABLE scheduled_runs (
    run_id   text PRIMARY KEY NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    schedule text NOT NULL,
    tick     int8 NOT NULL
);

CREATE INDEX scheduled_runs_by_tick ON scheduled_runs (schedule, tick);
