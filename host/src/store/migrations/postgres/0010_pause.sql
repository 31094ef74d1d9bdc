-- Version 10: pausing runs and deployments (as SQLite's version 12).
--
-- A paused run keeps its status and says who paused it in `paused`; workers lease only
-- runs whose `paused` is NULL. A deployment's pause is a row of `paused_deployments`;
-- the trigger marks each run that becomes unfinished under a paused name, whichever
-- code path writes it, and unmarks a run that ends. Pausing a deployment and starting
-- one of its runs meet at a transaction-scoped advisory lock on the name (exclusive for
-- the pause, shared for the start, held in memory only): under READ COMMITTED a run
-- started while the pause commits is either seen by the pause or sees it.
ALTER TABLE runs ADD COLUMN paused text CHECK (paused IN ('run', 'deployment'));

CREATE TABLE paused_deployments (
    name  text PRIMARY KEY,
    since int8 NOT NULL
);

CREATE FUNCTION runs_pause_rules() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status NOT IN ('queued', 'running') THEN
        NEW.paused := NULL;
    ELSIF NEW.paused IS NULL
          AND (TG_OP = 'INSERT' OR OLD.status NOT IN ('queued', 'running')) THEN
        PERFORM pg_advisory_xact_lock_shared(
            hashtext('idem pause ' || current_schema() || ' ' || NEW.agent));
        IF EXISTS (SELECT 1 FROM paused_deployments WHERE name = NEW.agent) THEN
            NEW.paused := 'deployment';
        END IF;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER runs_pause_rules BEFORE INSERT OR UPDATE OF status ON runs
    FOR EACH ROW EXECUTE FUNCTION runs_pause_rules();
