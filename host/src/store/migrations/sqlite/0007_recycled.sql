-- Version 7: a run counts the instances the host dropped on purpose (recycling, a
-- crash point, chaos) and replaced, written with its other counts, so that every
-- server reading the store reports the same number (`/metrics`).
ALTER TABLE runs ADD COLUMN recycled INTEGER NOT NULL DEFAULT 0 CHECK (recycled >= 0);
