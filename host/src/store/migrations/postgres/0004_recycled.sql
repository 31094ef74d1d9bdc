-- idem store schema on PostgreSQL, version 4 (SQLite's version 7): a run counts the
-- instances the host dropped on purpose (recycling, a crash point, chaos) and
-- replaced, written with its other counts, so that every server reading the store
-- reports the same number (`/metrics`).
ALTER TABLE runs ADD COLUMN recycled int8 NOT NULL DEFAULT 0 CHECK (recycled >= 0);
