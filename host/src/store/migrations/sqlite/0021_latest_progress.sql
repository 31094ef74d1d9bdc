-- Version 21: a run's last checkpoint in a row of its own, updated in place.
--
-- Since version 20 every save inserted a row into `progress`, the run's checkpoint
-- history: with many runs stepping at once, each save wrote a page of `progress` of its
-- own run, where one row per run updated in place had packed many runs to a page. The
-- last checkpoint (what a resumed run loads) is back in one row per run; the history
-- rows are gathered by the process that saves them and written to `progress` a few
-- dozen at a time, in the transaction of the save that fills the batch and when the
-- run's lease ends (a write it makes anyway). A process that dies loses at most one
-- batch of history, never the last checkpoint: a fork then starts from an earlier
-- checkpoint, and replays the steps between from their copied results.
CREATE TABLE latest_progress (
    run_id  TEXT PRIMARY KEY NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    lease   INTEGER NOT NULL CHECK (lease >= 0),
    tick    INTEGER NOT NULL CHECK (tick >= 0),
    step    INTEGER NOT NULL CHECK (step >= 0),
    state   BLOB NOT NULL,
    updated INTEGER NOT NULL
) STRICT;

-- gc looks for the blobs a row refers to, as it does in `progress`.
CREATE INDEX latest_progress_blob ON latest_progress (state)
    WHERE substr(state, 1, 4) = X'00494201';

INSERT INTO latest_progress (run_id, lease, tick, step, state, updated)
SELECT p.run_id, p.lease, p.tick, p.step, p.state, p.updated FROM progress p
WHERE p.state IS NOT NULL AND (p.lease, p.tick) = (
    SELECT q.lease, q.tick FROM progress q WHERE q.run_id = p.run_id AND q.state IS NOT NULL
    ORDER BY q.lease DESC, q.tick DESC LIMIT 1);
