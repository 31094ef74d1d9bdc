-- Version 9: child runs and durable joins.
--
-- A run an agent spawned records its parent, the key it was spawned under, its depth
-- (a top-level run is 0) and whether it outlives a cancelled parent. A parent
-- suspended in a join records the join's key and how many of its children have not
-- ended (`join_left`): each child's end counts it down in the child's own finishing
-- transaction, and the one that brings it to zero makes the parent due. So a parent
-- joining ten thousand children is woken once, not ten thousand times, and holds
-- nothing meanwhile.

ALTER TABLE runs ADD COLUMN parent TEXT;
ALTER TABLE runs ADD COLUMN spawn_key TEXT;
ALTER TABLE runs ADD COLUMN depth INTEGER NOT NULL DEFAULT 0 CHECK (depth >= 0);
ALTER TABLE runs ADD COLUMN detached INTEGER NOT NULL DEFAULT 0 CHECK (detached IN (0, 1));
ALTER TABLE runs ADD COLUMN joining TEXT;
ALTER TABLE runs ADD COLUMN join_left INTEGER;

CREATE INDEX runs_by_parent ON runs (parent, created) WHERE parent IS NOT NULL;

-- A join is a wait (`waits` row, `join_mode` set) over the children listed here in
-- the order the agent gave them; when it settles, each child's end as the join saw
-- it is copied in, so the join answers the same after the children are collected.
-- A join that got its children settles as 'received' (the column's CHECK predates joins;
-- for `any`, the payload is the index of the child it got), or 'timed-out'.
ALTER TABLE waits ADD COLUMN join_mode TEXT CHECK (join_mode IN ('all', 'any'));

CREATE TABLE join_members (
    run_id  TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    key     TEXT NOT NULL,
    child   TEXT NOT NULL,
    seq     INTEGER NOT NULL CHECK (seq >= 0),
    status  TEXT CHECK (status IN ('completed', 'failed', 'cancelled')),
    outcome BLOB,
    PRIMARY KEY (run_id, key, child)
) STRICT, WITHOUT ROWID;
