-- idem store schema, version 1.
--
-- Every table is STRICT so a value of the wrong type is refused rather than stored.
-- Hot paths (claim, commit, release, renew, committed) are primary-key lookups; the
-- by-run indexes serve `idem status`, which lists a run's claims and results.

CREATE TABLE runs (
    run_id    TEXT PRIMARY KEY NOT NULL,
    agent     TEXT NOT NULL,
    digest    TEXT NOT NULL,
    -- The namespace the run's keys live in (keys are stored as "namespace:key").
    namespace TEXT NOT NULL,
    input     BLOB NOT NULL,
    status    TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'in-doubt')),
    -- The output when completed, the error text (UTF-8) when failed or in doubt.
    outcome   BLOB,
    executed  INTEGER NOT NULL DEFAULT 0 CHECK (executed >= 0),
    skipped   INTEGER NOT NULL DEFAULT 0 CHECK (skipped >= 0),
    awaited   INTEGER NOT NULL DEFAULT 0 CHECK (awaited >= 0),
    reclaimed INTEGER NOT NULL DEFAULT 0 CHECK (reclaimed >= 0),
    instances INTEGER NOT NULL DEFAULT 0 CHECK (instances >= 0),
    created   INTEGER NOT NULL,
    updated   INTEGER NOT NULL
) STRICT;

-- Each time a run was resumed with another component (`idem run --upgrade`).
CREATE TABLE run_upgrades (
    run_id      TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    from_digest TEXT NOT NULL,
    to_digest   TEXT NOT NULL,
    at          INTEGER NOT NULL
) STRICT;

-- One checkpoint per run, replaced as the run advances.
CREATE TABLE progress (
    run_id  TEXT PRIMARY KEY NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    step    INTEGER NOT NULL CHECK (step >= 0),
    state   BLOB NOT NULL,
    updated INTEGER NOT NULL
) STRICT;

-- A key being executed. The row goes away when its result is committed; `holder` is
-- NULL once the claim was released without a result. `parked` holds the reason when
-- the claim is parked in doubt: nobody takes it until an operator resolves it. Claims carry no foreign key to
-- `runs`: keys are store-wide, and the protocol does not need the run to exist.
-- Rows are small, so WITHOUT ROWID keeps each lookup to one b-tree.
CREATE TABLE claims (
    key           TEXT PRIMARY KEY NOT NULL,
    run_id        TEXT NOT NULL,
    holder        TEXT,
    token         INTEGER NOT NULL CHECK (token > 0),
    attempt       INTEGER NOT NULL CHECK (attempt > 0),
    lease_expires INTEGER NOT NULL,
    parked        TEXT,
    -- What the step was asked to do (a hash of its input), when the agent said.
    fingerprint   TEXT
) STRICT, WITHOUT ROWID;

CREATE INDEX claims_by_run ON claims (run_id);

-- Committed results: written once, never changed. A rowid table, because results can
-- be large blobs.
CREATE TABLE results (
    key          TEXT PRIMARY KEY NOT NULL,
    run_id       TEXT NOT NULL,
    result       BLOB NOT NULL,
    token        INTEGER NOT NULL CHECK (token > 0),
    attempt      INTEGER NOT NULL CHECK (attempt > 0),
    committed_at INTEGER NOT NULL,
    fingerprint  TEXT
) STRICT;

CREATE INDEX results_by_run ON results (run_id);

-- The last fencing token handed out. A single row, bumped inside each claim's
-- transaction, so tokens are unique and increasing for the whole store.
CREATE TABLE fencing (
    id         INTEGER PRIMARY KEY CHECK (id = 0),
    last_token INTEGER NOT NULL CHECK (last_token >= 0)
) STRICT;

INSERT INTO fencing (id, last_token) VALUES (0, 0);
