-- idem store schema on PostgreSQL, version 2: runs that wait hold no lease and no
-- instance (SQLite's version 4).
--
-- A run suspended in a wait keeps status 'running' with no lease and a wake time;
-- workers take a run when it is due: a queued or running run at its creation, a
-- suspended one at its wake time (or at once when the signal it waits for is sent).
-- Waits are recorded per run under the agent's key, as steps are; signals wait in
-- their own table until a wait receives them, in the transaction that records it.

ALTER TABLE runs ADD COLUMN wake_at int8;
ALTER TABLE runs ADD COLUMN waiting_for text;

-- What workers poll for, in due order: a poll stops at the first run not due.
CREATE INDEX runs_due ON runs ((coalesce(wake_at, created)), seq)
    WHERE status IN ('queued', 'running');

CREATE TABLE waits (
    run_id  text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    key     text NOT NULL,
    signal  text,
    due     int8,
    created int8 NOT NULL,
    outcome text CHECK (outcome IN ('received', 'timed-out')),
    payload bytea,
    settled int8,
    PRIMARY KEY (run_id, key)
);

CREATE TABLE signals (
    id       int8 GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id   text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    name     text NOT NULL,
    payload  bytea NOT NULL,
    sent     int8 NOT NULL,
    taken_by text
);

CREATE INDEX signals_pending ON signals (run_id, name, id) WHERE taken_by IS NULL;
