-- idem store schema on PostgreSQL: rate limits on classes of steps (SQLite's
-- `0013_rates.sql`). A step reserving a token locks its class's row, so two workers
-- never hand out one token twice.

CREATE TABLE rate_limits (
    class     text PRIMARY KEY,
    tokens    int8 NOT NULL CHECK (tokens > 0),
    period_ms int8 NOT NULL CHECK (period_ms > 0),
    burst     int8 NOT NULL CHECK (burst > 0),
    tat       int8 NOT NULL,
    updated   int8 NOT NULL
);

ALTER TABLE waits ADD COLUMN rate_class text;
