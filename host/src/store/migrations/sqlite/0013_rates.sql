-- Rate limits on classes of steps: one token bucket per class, shared by every worker
-- and every run (store/rates.rs). A step of a limited class takes its token through a
-- durable wait, recorded in `waits` with its class: the token reserved for it at its
-- first reach is its due time, so a resumed agent finds the same token again.

CREATE TABLE rate_limits (
    class     TEXT PRIMARY KEY NOT NULL,
    -- Tokens per period, the period, and the tokens that may be taken at once.
    tokens    INTEGER NOT NULL CHECK (tokens > 0),
    period_ms INTEGER NOT NULL CHECK (period_ms > 0),
    burst     INTEGER NOT NULL CHECK (burst > 0),
    -- The theoretical arrival time of the next token, in 1/tokens of a millisecond.
    tat       INTEGER NOT NULL,
    updated   INTEGER NOT NULL
) STRICT;

ALTER TABLE waits ADD COLUMN rate_class TEXT;
