-- idem store schema, version 4: runs that wait hold no lease and no instance.
--
-- A run suspended in a wait keeps status 'running' with no lease and a wake time;
-- workers take a run when it is due: a queued or running run is due at its creation,
-- a suspended one at its wake time (or at once when the signal it waits for is sent).
-- Waits are recorded per run under the agent's key, as steps are; signals wait in
-- their own table until a wait receives them, in the transaction that records it.

ALTER TABLE runs ADD COLUMN wake_at INTEGER;
ALTER TABLE runs ADD COLUMN waiting_for TEXT;

-- What workers poll for, in due order. A poll stops at the first run not due, so ten
-- thousand sleepers cost nothing until they wake.
CREATE INDEX runs_due ON runs (coalesce(wake_at, created))
    WHERE status IN ('queued', 'running');

CREATE TABLE waits (
    run_id  TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    key     TEXT NOT NULL,
    -- The signal waited for; NULL for a sleep.
    signal  TEXT,
    -- When the sleep ends or the signal wait times out; NULL: never.
    due     INTEGER,
    created INTEGER NOT NULL,
    -- How a signal wait ended, once it did, and what it received.
    outcome TEXT CHECK (outcome IN ('received', 'timed-out')),
    payload BLOB,
    settled INTEGER,
    PRIMARY KEY (run_id, key)
) STRICT, WITHOUT ROWID;

CREATE TABLE signals (
    id       INTEGER PRIMARY KEY,
    run_id   TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    name     TEXT NOT NULL,
    payload  BLOB NOT NULL,
    sent     INTEGER NOT NULL,
    -- The key of the wait that received it; NULL until one did.
    taken_by TEXT
) STRICT;

CREATE INDEX signals_pending ON signals (run_id, name, id) WHERE taken_by IS NULL;
