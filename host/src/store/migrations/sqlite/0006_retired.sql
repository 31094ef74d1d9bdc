-- Version 6: keys may be deleted (`idem gc`). A key's fencing tokens count on from its
-- row; once gc deletes the row, a later grant of the same key would start again from
-- the first token and could repeat one the key's old holders had. So gc records the
-- greatest token of every key it deletes, in the same transaction, and a key granted
-- for the first time starts above it: per-key tokens increase for the store's life.
ALTER TABLE epoch ADD COLUMN retired INTEGER NOT NULL DEFAULT 0 CHECK (retired >= 0);
