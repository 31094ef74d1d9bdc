-- idem store schema on PostgreSQL, version 7: child runs and durable joins (SQLite's
-- version 9).
--
-- A spawned run records its parent, its spawn key, its depth and whether it outlives
-- a cancelled parent. A parent suspended in a join records the join's key and how
-- many of its children have not ended; each child's end counts it down in the child's
-- finishing transaction (with the parent's row locked, so that a suspension and a
-- child's end see each other), and the one that brings it to zero makes the parent due.

ALTER TABLE runs ADD COLUMN parent text;
ALTER TABLE runs ADD COLUMN spawn_key text;
ALTER TABLE runs ADD COLUMN depth int4 NOT NULL DEFAULT 0 CHECK (depth >= 0);
ALTER TABLE runs ADD COLUMN detached boolean NOT NULL DEFAULT false;
ALTER TABLE runs ADD COLUMN joining text;
ALTER TABLE runs ADD COLUMN join_left int8;

CREATE INDEX runs_by_parent ON runs (parent, created) WHERE parent IS NOT NULL;

-- A join is a wait with `join_mode` set; a join that got its children settles as
-- 'received' (for `any`, the payload is the index of the child it got).
ALTER TABLE waits ADD COLUMN join_mode text CHECK (join_mode IN ('all', 'any'));

CREATE TABLE join_members (
    run_id  text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    key     text NOT NULL,
    child   text NOT NULL,
    seq     int4 NOT NULL CHECK (seq >= 0),
    status  text CHECK (status IN ('completed', 'failed', 'cancelled')),
    outcome bytea,
    PRIMARY KEY (run_id, key, child)
);
