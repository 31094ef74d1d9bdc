-- idem store schema on PostgreSQL: flow control (SQLite's `0011_flow.sql`).
--
-- Limits on a deployment's running runs, shared by every worker because the store
-- applies them as it leases: a worker leasing runs of a limited deployment locks the
-- deployment's `flow_limits` row first, so two workers never both take the last slot.
-- A run's concurrency key is read from its input at submission and kept on its row.

CREATE TABLE flow_limits (
    deployment  text PRIMARY KEY,
    max_running int8 CHECK (max_running > 0),
    key_pointer text,
    per_key     int8 CHECK (per_key > 0),
    updated     int8 NOT NULL,
    CHECK ((key_pointer IS NULL) = (per_key IS NULL))
);

ALTER TABLE runs ADD COLUMN priority int4 NOT NULL DEFAULT 0 CHECK (priority >= 0);
ALTER TABLE runs ADD COLUMN flow_key text;

CREATE INDEX runs_flow ON runs (agent, flow_key) WHERE status IN ('queued', 'running');

CREATE INDEX runs_prioritized ON runs (priority DESC, (coalesce(wake_at, created)), seq)
    WHERE priority > 0 AND status IN ('queued', 'running');
