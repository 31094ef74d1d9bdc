-- idem store schema, version 3: workers lease runs, runs are submitted and cancelled,
-- components and deployments live in the store, runs keep a log.
--
-- The hot path stays where version 2 put it: a claim inserts or updates one `steps`
-- row and its commit fills the result in, one page each. The run's lease is checked by
-- reading the run's row (its fencing token), never by writing it. A run's input,
-- authority and outcome leave the `runs` row: SQLite rewrites a whole row, overflow
-- pages and all, on every UPDATE, and `runs` is updated at every counts flush.
--
-- Applied with foreign keys off (a rebuilt `runs` must not cascade its old rows away);
-- the store checks `PRAGMA foreign_key_check` before it commits.

-- Components by digest (hex SHA-256), written once.
CREATE TABLE components (
    digest  TEXT PRIMARY KEY NOT NULL,
    bytes   BLOB NOT NULL,
    size    INTEGER NOT NULL CHECK (size >= 0),
    created INTEGER NOT NULL
) STRICT;

-- Every deployment ever made; a name's latest row (the greatest id) is current.
CREATE TABLE deployments (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL,
    digest      TEXT NOT NULL REFERENCES components (digest),
    authority   BLOB NOT NULL,
    admission   TEXT NOT NULL CHECK (admission IN ('explicit', 'first-use')),
    deployed_at INTEGER NOT NULL
) STRICT;

CREATE INDEX deployments_by_name ON deployments (name, id);

-- The components whose runs may use a namespace's keys: admitted by a deployment, or
-- members because a run of theirs was submitted (or upgraded to) there.
CREATE TABLE namespace_members (
    namespace TEXT NOT NULL,
    digest    TEXT NOT NULL,
    how       TEXT NOT NULL CHECK (how IN ('explicit', 'first-use', 'run', 'upgrade')),
    at        INTEGER NOT NULL,
    PRIMARY KEY (namespace, digest)
) STRICT, WITHOUT ROWID;

-- Runs, rebuilt: two more statuses, the worker lease, and no blobs.
CREATE TABLE runs_v3 (
    run_id           TEXT PRIMARY KEY NOT NULL,
    agent            TEXT NOT NULL,
    digest           TEXT NOT NULL,
    namespace        TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN
                         ('queued', 'running', 'completed', 'failed', 'in-doubt', 'cancelled')),
    executed         INTEGER NOT NULL DEFAULT 0 CHECK (executed >= 0),
    skipped          INTEGER NOT NULL DEFAULT 0 CHECK (skipped >= 0),
    awaited          INTEGER NOT NULL DEFAULT 0 CHECK (awaited >= 0),
    reclaimed        INTEGER NOT NULL DEFAULT 0 CHECK (reclaimed >= 0),
    instances        INTEGER NOT NULL DEFAULT 0 CHECK (instances >= 0),
    -- The worker holding the run and until when; both NULL when nobody does.
    lease_holder     TEXT,
    lease_expires    INTEGER,
    -- The last lease's fencing token: kept when the lease ends, so that a writer
    -- presenting an older one stays refused; every grant takes the next.
    lease_token      INTEGER NOT NULL DEFAULT 0 CHECK (lease_token >= 0),
    cancel_requested INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
    -- Why the last worker gave the run back unfinished, if it said.
    note             TEXT,
    created          INTEGER NOT NULL,
    updated          INTEGER NOT NULL,
    CHECK ((lease_holder IS NULL) = (lease_expires IS NULL))
) STRICT;

-- Rowids kept: runs created in the same millisecond stay in submission order.
INSERT INTO runs_v3
    (rowid, run_id, agent, digest, namespace, status,
     executed, skipped, awaited, reclaimed, instances, created, updated)
SELECT rowid, run_id, agent, digest, namespace, status,
       executed, skipped, awaited, reclaimed, instances, created, updated
FROM runs;

-- What a run was submitted with. Runs of version 2 had no authority: an empty one.
CREATE TABLE run_inputs (
    run_id    TEXT PRIMARY KEY NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    input     BLOB NOT NULL,
    authority BLOB NOT NULL
) STRICT;

INSERT INTO run_inputs (run_id, input, authority) SELECT run_id, input, x'' FROM runs;

-- A run's output, error or in-doubt reason, while it has one.
CREATE TABLE run_outcomes (
    run_id  TEXT PRIMARY KEY NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    outcome BLOB NOT NULL
) STRICT;

INSERT INTO run_outcomes (run_id, outcome)
SELECT run_id, outcome FROM runs WHERE outcome IS NOT NULL;

-- Runs of version 2 are members of their namespaces, with every component they ran.
INSERT OR IGNORE INTO namespace_members (namespace, digest, how, at)
SELECT namespace, digest, 'run', min(created) FROM runs GROUP BY namespace, digest;

INSERT OR IGNORE INTO namespace_members (namespace, digest, how, at)
SELECT r.namespace, u.from_digest, 'run', min(u.at)
FROM run_upgrades u JOIN runs r ON r.run_id = u.run_id
GROUP BY r.namespace, u.from_digest;

DROP TABLE runs;
ALTER TABLE runs_v3 RENAME TO runs;

-- What workers poll for. Only a change of status moves a run in or out of it: counts,
-- leases and renewals leave it alone.
CREATE INDEX runs_unfinished ON runs (created) WHERE status IN ('queued', 'running');

-- The last bytes of a run's log, in chunks appended in order; the oldest go first.
CREATE TABLE run_logs (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    seq    INTEGER NOT NULL CHECK (seq >= 0),
    bytes  BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
) STRICT;

-- Steps, rebuilt with the time of their latest grant. For rows claimed before version
-- 3 it is estimated: the commit time, or the end of an open claim's lease.
CREATE TABLE steps_v3 (
    key           TEXT PRIMARY KEY NOT NULL,
    run_id        TEXT NOT NULL,
    holder        TEXT,
    token         INTEGER NOT NULL CHECK (token > 0),
    attempt       INTEGER NOT NULL CHECK (attempt > 0),
    claimed_at    INTEGER NOT NULL,
    lease_expires INTEGER NOT NULL,
    parked        TEXT,
    fingerprint   TEXT,
    result        BLOB,
    committed_at  INTEGER,
    CHECK ((result IS NULL) = (committed_at IS NULL)),
    CHECK (result IS NULL OR (holder IS NULL AND parked IS NULL))
) STRICT, WITHOUT ROWID;

INSERT INTO steps_v3
    (key, run_id, holder, token, attempt, claimed_at, lease_expires, parked, fingerprint,
     result, committed_at)
SELECT key, run_id, holder, token, attempt, coalesce(committed_at, lease_expires),
       lease_expires, parked, fingerprint, result, committed_at
FROM steps;

DROP TABLE steps;
ALTER TABLE steps_v3 RENAME TO steps;

CREATE INDEX steps_parked ON steps (run_id) WHERE parked IS NOT NULL;
