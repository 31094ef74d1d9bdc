-- idem store schema on PostgreSQL, version 6: the dev loop (SQLite's version 8). A
-- deployment made by running a local file (`idem run`) records where the file was
-- (`source`), and a new build of that same file joins the namespace as admission
-- 'rebuild' instead of being refused as another component.
ALTER TABLE deployments ADD COLUMN source text;
ALTER TABLE deployments DROP CONSTRAINT deployments_admission_check;
ALTER TABLE deployments ADD CONSTRAINT deployments_admission_check
    CHECK (admission IN ('explicit', 'first-use', 'rebuild'));
