-- Flow control: limits on a deployment's running runs, shared by every worker because
-- the store applies them as it leases, and a queued run's priority.
--
-- A run's concurrency key is read from its input when it is submitted (or when a
-- deployment's key is set) and kept on its row, so leasing never parses input.

CREATE TABLE flow_limits (
    deployment  TEXT PRIMARY KEY NOT NULL,
    max_running INTEGER CHECK (max_running > 0),
    key_pointer TEXT,
    per_key     INTEGER CHECK (per_key > 0),
    updated     INTEGER NOT NULL,
    CHECK ((key_pointer IS NULL) = (per_key IS NULL))
) STRICT;

ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0 CHECK (priority >= 0);
ALTER TABLE runs ADD COLUMN flow_key TEXT;

-- Counting a limited deployment's live leases (and its keys') reads only its
-- unfinished runs. Only a change of status moves a run in or out, as `runs_unfinished`.
CREATE INDEX runs_flow ON runs (agent, flow_key) WHERE status IN ('queued', 'running');

-- Runs with a priority, leased before the others: small, so a lease query that finds
-- it empty costs one index probe.
CREATE INDEX runs_prioritized ON runs (priority DESC, coalesce(wake_at, created))
    WHERE priority > 0 AND status IN ('queued', 'running');
