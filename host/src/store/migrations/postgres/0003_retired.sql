-- idem store schema on PostgreSQL, version 3: keys may be deleted (`idem gc`).
--
-- A key's fencing tokens count on from its row; once its row is deleted, a later grant
-- of the same key would start from the first token again and could repeat one its old
-- holders had. So `retired` holds the greatest token of every key ever deleted, a key
-- granted for the first time starts above it, and the database refuses to delete a key
-- whose token is not yet below the mark: per-key tokens increase for the store's life.
-- A deleting transaction raises the mark and deletes under a lock on `steps` that waits
-- for every writer of `steps` in flight, so no claim can have read the old mark and
-- then insert the key again.

CREATE TABLE retired (
    id    int4 PRIMARY KEY CHECK (id = 0),
    token int8 NOT NULL CHECK (token >= 0)
);

INSERT INTO retired (id, token) VALUES (0, 0);

CREATE OR REPLACE FUNCTION steps_rules() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.token > (SELECT token FROM retired WHERE id = 0) THEN
            RAISE EXCEPTION 'key % may be deleted only once its token % is retired',
                OLD.key, OLD.token
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN OLD;
    END IF;
    IF OLD.result IS NOT NULL THEN
        RAISE EXCEPTION 'key % is committed: its row never changes', OLD.key
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
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
END
$$;

-- A mark that went down would let a deleted key's tokens repeat.
CREATE FUNCTION retired_rules() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.token < OLD.token THEN
        RAISE EXCEPTION 'the retired token never goes down (% to %)', OLD.token, NEW.token
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER retired_rules BEFORE UPDATE ON retired
    FOR EACH ROW EXECUTE FUNCTION retired_rules();
