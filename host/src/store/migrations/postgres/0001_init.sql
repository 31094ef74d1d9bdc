-- idem store schema on PostgreSQL, version 1: the tables of SQLite's version 3, with
-- the rules a store keeps written into the database itself, so that no client (an
-- older idem, a script, a bug) can break them:
-- - a key has one row for its whole life (the primary key), and once its result is
--   committed the row never changes again and is never deleted (`steps_rules`);
-- - a key's fencing token never goes down, and each new grant of the key (a greater
--   attempt) gets a greater token (`steps_rules`);
-- - a run's lease token never goes down, and a lease granted to a worker gets a
--   greater token than the run's last (`runs_rules`).
-- Times are milliseconds since the Unix epoch, read from the server's `now()` in the
-- transaction that writes them (or from a test's manual clock, passed in).

CREATE TABLE components (
    digest  text PRIMARY KEY,
    bytes   bytea NOT NULL,
    size    int8 NOT NULL CHECK (size >= 0),
    created int8 NOT NULL
);

-- Every deployment ever made; a name's latest row (the greatest id) is current.
CREATE TABLE deployments (
    id          int8 GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL,
    digest      text NOT NULL REFERENCES components (digest),
    authority   bytea NOT NULL,
    admission   text NOT NULL CHECK (admission IN ('explicit', 'first-use')),
    deployed_at int8 NOT NULL
);

CREATE INDEX deployments_by_name ON deployments (name, id);

-- The components whose runs may use a namespace's keys.
CREATE TABLE namespace_members (
    namespace text NOT NULL,
    digest    text NOT NULL,
    how       text NOT NULL CHECK (how IN ('explicit', 'first-use', 'run', 'upgrade')),
    at        int8 NOT NULL,
    PRIMARY KEY (namespace, digest)
);

CREATE TABLE runs (
    run_id           text PRIMARY KEY,
    -- Submission order among runs created in the same millisecond.
    seq              int8 GENERATED ALWAYS AS IDENTITY UNIQUE,
    agent            text NOT NULL,
    digest           text NOT NULL,
    namespace        text NOT NULL,
    status           text NOT NULL CHECK (status IN
                         ('queued', 'running', 'completed', 'failed', 'in-doubt', 'cancelled')),
    executed         int8 NOT NULL DEFAULT 0 CHECK (executed >= 0),
    skipped          int8 NOT NULL DEFAULT 0 CHECK (skipped >= 0),
    awaited          int8 NOT NULL DEFAULT 0 CHECK (awaited >= 0),
    reclaimed        int8 NOT NULL DEFAULT 0 CHECK (reclaimed >= 0),
    instances        int8 NOT NULL DEFAULT 0 CHECK (instances >= 0),
    lease_holder     text,
    lease_expires    int8,
    -- The last lease's token: kept when the lease ends, so an older one stays refused.
    lease_token      int8 NOT NULL DEFAULT 0 CHECK (lease_token >= 0),
    cancel_requested bool NOT NULL DEFAULT false,
    note             text,
    created          int8 NOT NULL,
    updated          int8 NOT NULL,
    CHECK ((lease_holder IS NULL) = (lease_expires IS NULL))
);

-- What workers poll for (`FOR UPDATE SKIP LOCKED`, oldest first).
CREATE INDEX runs_unfinished ON runs (created, seq) WHERE status IN ('queued', 'running');

CREATE TABLE run_upgrades (
    run_id      text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    from_digest text NOT NULL,
    to_digest   text NOT NULL,
    at          int8 NOT NULL
);

CREATE TABLE run_inputs (
    run_id    text PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
    input     bytea NOT NULL,
    authority bytea NOT NULL
);

CREATE TABLE run_outcomes (
    run_id  text PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
    outcome bytea NOT NULL
);

CREATE TABLE progress (
    run_id  text PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
    step    int8 NOT NULL CHECK (step >= 0),
    state   bytea NOT NULL,
    updated int8 NOT NULL
);

CREATE TABLE run_logs (
    run_id text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    seq    int8 NOT NULL CHECK (seq >= 0),
    bytes  bytea NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- A key for its whole life: claimed, then committed in place.
CREATE TABLE steps (
    key           text PRIMARY KEY,
    run_id        text NOT NULL,
    holder        text,
    token         int8 NOT NULL CHECK (token > 0),
    attempt       int4 NOT NULL CHECK (attempt > 0),
    claimed_at    int8 NOT NULL,
    lease_expires int8 NOT NULL,
    parked        text,
    fingerprint   text,
    result        bytea,
    committed_at  int8,
    CHECK ((result IS NULL) = (committed_at IS NULL)),
    CHECK (result IS NULL OR (holder IS NULL AND parked IS NULL))
);

-- A server's store grows large: listing a run's keys (`idem show`, cancel, resolve)
-- must not scan every key ever claimed.
CREATE INDEX steps_by_run ON steps (run_id);

CREATE FUNCTION steps_rules() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.result IS NOT NULL THEN
        RAISE EXCEPTION 'key % is committed: its row never changes', OLD.key
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF NEW.key <> OLD.key THEN
            RAISE EXCEPTION 'key % cannot be renamed', OLD.key
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        IF NEW.token < OLD.token
           OR (NEW.attempt > OLD.attempt AND NEW.token <= OLD.token)
           OR NEW.attempt < OLD.attempt THEN
            RAISE EXCEPTION 'fencing token of key % must increase with each grant (% to %)',
                OLD.key, OLD.token, NEW.token
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN NEW;
    END IF;
    RETURN OLD;
END
$$;

CREATE TRIGGER steps_rules BEFORE UPDATE OR DELETE ON steps
    FOR EACH ROW EXECUTE FUNCTION steps_rules();

CREATE FUNCTION runs_rules() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.lease_token < OLD.lease_token
       OR (NEW.lease_holder IS NOT NULL
           AND NEW.lease_holder IS DISTINCT FROM OLD.lease_holder
           AND NEW.lease_token <= OLD.lease_token) THEN
        RAISE EXCEPTION 'lease token of run % must increase with each grant (% to %)',
            OLD.run_id, OLD.lease_token, NEW.lease_token
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER runs_rules BEFORE UPDATE OF lease_token, lease_holder ON runs
    FOR EACH ROW EXECUTE FUNCTION runs_rules();
