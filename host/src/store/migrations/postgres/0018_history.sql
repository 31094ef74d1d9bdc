-- idem store schema on PostgreSQL: a run's step history (SQLite's `0020_history.sql`).
-- A committed step records the run lease it was committed under and a tick of the
-- process's clock (microseconds); `progress` keeps each checkpoint at its position,
-- a large one's state only while it is among the run's last few (NULL after).

ALTER TABLE steps ADD COLUMN commit_lease int8;
ALTER TABLE steps ADD COLUMN commit_tick int8;

ALTER TABLE progress ADD COLUMN lease int8 NOT NULL DEFAULT 0 CHECK (lease >= 0);
ALTER TABLE progress ADD COLUMN tick int8 NOT NULL DEFAULT 0 CHECK (tick >= 0);
-- A checkpoint saved before stands where the steps before it do: at its time.
UPDATE progress SET tick = greatest(updated, 0) * 1000;
ALTER TABLE progress DROP CONSTRAINT progress_pkey;
ALTER TABLE progress ADD PRIMARY KEY (run_id, lease, tick);
ALTER TABLE progress ALTER COLUMN state DROP NOT NULL;

ALTER TABLE runs ADD COLUMN history_cut bool NOT NULL DEFAULT false;
ALTER TABLE runs ADD COLUMN forked_from text;
ALTER TABLE runs ADD COLUMN fork_at int8 CHECK (fork_at > 0);
