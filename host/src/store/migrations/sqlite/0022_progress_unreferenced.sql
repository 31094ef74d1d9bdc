-- Version 22: `progress` (a run's checkpoint history) without its foreign key to `runs`.
--
-- The key made every history row written and every one collected look its run up in
-- `runs` (a child's insert checks its parent; a child's delete looks for it too),
-- which is a third of what writing and collecting a row cost. Nothing needs it: the
-- rows of a run are written only while the run exists (a batch checks it in its own
-- statement), and gc deletes a run's history with the run, as it deletes its other
-- rows. The table is otherwise as version 20 made it.
CREATE TABLE progress_v22 (
    run_id  TEXT NOT NULL,
    lease   INTEGER NOT NULL CHECK (lease >= 0),
    tick    INTEGER NOT NULL CHECK (tick >= 0),
    step    INTEGER NOT NULL CHECK (step >= 0),
    state   BLOB,
    updated INTEGER NOT NULL,
    PRIMARY KEY (run_id, lease, tick)
) STRICT, WITHOUT ROWID;

INSERT INTO progress_v22 (run_id, lease, tick, step, state, updated)
SELECT run_id, lease, tick, step, state, updated FROM progress;

DROP TABLE progress;
ALTER TABLE progress_v22 RENAME TO progress;
CREATE INDEX progress_blob ON progress (state) WHERE substr(state, 1, 4) = X'00494201';
