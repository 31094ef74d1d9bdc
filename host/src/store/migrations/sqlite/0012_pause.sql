-- Version 12: pausing runs and deployments.
--
-- A paused run keeps its status (queued, or running with its checkpoint, waits and
-- signals) and says who paused it in `paused`; workers lease only runs whose `paused`
-- is NULL, so resuming one is clearing the column, and it is due as it was.
-- A deployment's pause is a row of `paused_deployments`: pausing it marks its
-- unfinished runs, and the triggers below mark each run that becomes unfinished under
-- its name while the row is there (submitted, spawned, submitted again after a failure,
-- resolved), whichever code path writes it, so no way of starting a run escapes the
-- pause. A run that ends stops being paused.
ALTER TABLE runs ADD COLUMN paused TEXT CHECK (paused IN ('run', 'deployment'));

CREATE TABLE paused_deployments (
    name  TEXT PRIMARY KEY NOT NULL,
    since INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

CREATE TRIGGER runs_paused_at_insert AFTER INSERT ON runs
WHEN NEW.paused IS NULL AND NEW.status IN ('queued', 'running')
     AND EXISTS (SELECT 1 FROM paused_deployments WHERE name = NEW.agent)
BEGIN
    UPDATE runs SET paused = 'deployment' WHERE run_id = NEW.run_id;
END;

CREATE TRIGGER runs_paused_again AFTER UPDATE OF status ON runs
WHEN NEW.paused IS NULL AND NEW.status IN ('queued', 'running')
     AND OLD.status NOT IN ('queued', 'running')
     AND EXISTS (SELECT 1 FROM paused_deployments WHERE name = NEW.agent)
BEGIN
    UPDATE runs SET paused = 'deployment' WHERE run_id = NEW.run_id;
END;

CREATE TRIGGER runs_unpaused_at_end AFTER UPDATE OF status ON runs
WHEN NEW.paused IS NOT NULL AND NEW.status NOT IN ('queued', 'running')
BEGIN
    UPDATE runs SET paused = NULL WHERE run_id = NEW.run_id;
END;
