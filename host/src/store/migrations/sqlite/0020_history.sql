-- Version 20: a run's step history, for `idem show --steps` and `idem fork`.
--
-- A committed step records where it stands in its run: the run lease it was committed
-- under (`commit_lease`, the fence token: leases of a run only grow) and a tick of the
-- committing process's clock (`commit_tick`, microseconds, strictly increasing in the
-- process), so that the steps of a run are ordered exactly, even those committed in
-- one millisecond. Both are written by the commit's own statement: no page more.
-- Steps committed before version 20 are ordered by their commit time.
ALTER TABLE steps ADD COLUMN commit_lease INTEGER;
ALTER TABLE steps ADD COLUMN commit_tick INTEGER;

-- `progress` keeps each checkpoint a run saved, at the position it was saved at (the
-- same order as its steps'), not just the last one: a save inserts where it used to
-- replace, which writes the same page. The last `HISTORY_KEEP` of a run are kept;
-- `runs.history_cut` says that older ones (or, after `idem gc --history-before`, all
-- but the last) were collected, so a fork before them is refused rather than started
-- from the wrong checkpoint. A large state (kept as a blob) is kept for the run's last
-- `HISTORY_KEEP_LARGE` large checkpoints only: older ones keep their row, their place
-- in the history, with a NULL state.
CREATE TABLE progress_v20 (
    run_id  TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    lease   INTEGER NOT NULL CHECK (lease >= 0),
    tick    INTEGER NOT NULL CHECK (tick >= 0),
    step    INTEGER NOT NULL CHECK (step >= 0),
    state   BLOB,
    updated INTEGER NOT NULL,
    PRIMARY KEY (run_id, lease, tick)
) STRICT, WITHOUT ROWID;

-- A checkpoint saved before version 20 stands where the steps before it do: at lease
-- 0, at its time.
INSERT INTO progress_v20 (run_id, lease, tick, step, state, updated)
SELECT run_id, 0, max(updated, 0) * 1000, step, state, updated FROM progress;

DROP TABLE progress;
ALTER TABLE progress_v20 RENAME TO progress;
CREATE INDEX progress_blob ON progress (state) WHERE substr(state, 1, 4) = X'00494201';

ALTER TABLE runs ADD COLUMN history_cut INTEGER NOT NULL DEFAULT 0
    CHECK (history_cut IN (0, 1));

-- A fork records the run and the step it was forked from.
ALTER TABLE runs ADD COLUMN forked_from TEXT;
ALTER TABLE runs ADD COLUMN fork_at INTEGER CHECK (fork_at > 0);
