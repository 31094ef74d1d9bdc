-- idem store schema, version 2: one row per key for its whole life.
--
-- Version 1 kept a claim in `claims` and moved it to `results` at commit, bumped a
-- store-wide fencing counter at every grant, and indexed both tables by run. A durable
-- step then wrote ten b-tree pages to the WAL; each page costs a write and a checksum,
-- and the pages were most of a step's time (BENCHMARKS.md). Here a claim inserts one
-- row and its commit fills the result in, in place: one page each.
--
-- Fencing tokens are per key: a grant's token is one more than the key's last, which
-- is all fencing needs (a holder is only ever compared with the key's later holders).
-- Claims of a run are found by a scan (status and resolve only; no hot path asks), and
-- parked claims by a partial index that ordinary steps never touch.

CREATE TABLE steps (
    key           TEXT PRIMARY KEY NOT NULL,
    -- The run that holds the claim, or that committed the result.
    run_id        TEXT NOT NULL,
    -- The holder's instance while claimed; NULL once released, parked or committed.
    holder        TEXT,
    token         INTEGER NOT NULL CHECK (token > 0),
    attempt       INTEGER NOT NULL CHECK (attempt > 0),
    lease_expires INTEGER NOT NULL,
    -- The reason, while the claim is parked in doubt for an operator to resolve.
    parked        TEXT,
    -- What the step was asked to do (a hash of its input), when the agent said.
    fingerprint   TEXT,
    -- The committed result; NULL while the key is only claimed. Written once.
    result        BLOB,
    committed_at  INTEGER,
    CHECK ((result IS NULL) = (committed_at IS NULL)),
    CHECK (result IS NULL OR (holder IS NULL AND parked IS NULL))
) STRICT, WITHOUT ROWID;

CREATE INDEX steps_parked ON steps (run_id) WHERE parked IS NOT NULL;

INSERT INTO steps
    (key, run_id, holder, token, attempt, lease_expires, parked, fingerprint)
SELECT key, run_id, holder, token, attempt, lease_expires, parked, fingerprint
FROM claims;

INSERT INTO steps
    (key, run_id, token, attempt, lease_expires, fingerprint, result, committed_at)
SELECT key, run_id, token, attempt, committed_at, fingerprint, result, committed_at
FROM results;

DROP TABLE claims;
DROP TABLE results;
DROP TABLE fencing;
