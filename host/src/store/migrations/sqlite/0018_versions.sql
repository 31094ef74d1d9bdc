-- Version 18: versioned deployments. Each deployment of a name is its next version
-- (1, 2, 3 …, kept, so that a version means the same deployment for as long as the
-- store lives); a deployment says what its in-flight runs do when a newer version is
-- deployed (`in_flight`: 'pin' stays, 'upgrade' moves to the newer one); a run keeps
-- the version it is on; every move of a run says why, and between which versions.
--
-- `exports` is what the component exports, as the runtime renders it: a run moves only
-- between versions whose exports are the same. NULL for a deployment made before
-- version 18 (not known: not checked).
--
-- The deployments table is rebuilt to add NOT NULL columns; nothing refers to it.
CREATE TABLE deployments_v18 (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL,
    version     INTEGER NOT NULL CHECK (version > 0),
    digest      TEXT NOT NULL REFERENCES components (digest),
    authority   BLOB NOT NULL,
    admission   TEXT NOT NULL CHECK (admission IN ('explicit', 'first-use', 'rebuild')),
    deployed_at INTEGER NOT NULL,
    source      TEXT,
    in_flight   TEXT NOT NULL DEFAULT 'pin' CHECK (in_flight IN ('pin', 'upgrade')),
    exports     TEXT,
    UNIQUE (name, version)
) STRICT;

INSERT INTO deployments_v18
    (id, name, version, digest, authority, admission, deployed_at, source)
SELECT id, name, row_number() OVER (PARTITION BY name ORDER BY id),
       digest, authority, admission, deployed_at, source
FROM deployments;

DROP TABLE deployments;
ALTER TABLE deployments_v18 RENAME TO deployments;
CREATE INDEX deployments_by_name ON deployments (name, id);

-- The version of its deployment a run is on: the latest version of its name with its
-- component. NULL for a run of a component never deployed under its name.
ALTER TABLE runs ADD COLUMN version INTEGER CHECK (version > 0);

UPDATE runs SET version =
    (SELECT max(d.version) FROM deployments d WHERE d.name = runs.agent AND d.digest = runs.digest);

-- Every move before version 18 was `idem run --upgrade` (or a rebuild): 'dev'.
ALTER TABLE run_upgrades ADD COLUMN from_version INTEGER;
ALTER TABLE run_upgrades ADD COLUMN to_version INTEGER;
ALTER TABLE run_upgrades ADD COLUMN reason TEXT NOT NULL DEFAULT 'dev'
    CHECK (reason IN ('dev', 'policy', 'operator', 'rollback'));

-- A run's moves in order (rowid order): rollback reads the last one.
CREATE INDEX run_upgrades_by_run ON run_upgrades (run_id);

-- Counting a deployment's runs per version (`idem deployments`, the API).
CREATE INDEX runs_by_version ON runs (agent, version);
