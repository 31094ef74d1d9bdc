-- Version 8: the dev loop. A deployment made by running a local file (`idem run`)
-- records where the file was (`source`), and a new build of that same file joins the
-- namespace as admission 'rebuild' instead of being refused as another component.
-- The table is rebuilt to widen its CHECK; nothing refers to it.
CREATE TABLE deployments_v8 (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL,
    digest      TEXT NOT NULL REFERENCES components (digest),
    authority   BLOB NOT NULL,
    admission   TEXT NOT NULL CHECK (admission IN ('explicit', 'first-use', 'rebuild')),
    deployed_at INTEGER NOT NULL,
    source      TEXT
) STRICT;

INSERT INTO deployments_v8 (id, name, digest, authority, admission, deployed_at)
    SELECT id, name, digest, authority, admission, deployed_at FROM deployments;

DROP TABLE deployments;
ALTER TABLE deployments_v8 RENAME TO deployments;
CREATE INDEX deployments_by_name ON deployments (name, id);
