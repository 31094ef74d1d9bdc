-- idem store schema on PostgreSQL, version 5: the store's epoch. A transaction
-- committed with `synchronous_commit = off` (every write under `--sync normal`, and a
-- claim whose step may run again under `--sync full`) is acknowledged before it is on
-- disk, and a crash of the server may lose it while the idem process that was told of
-- it lives on, holding its token. So every token (a run lease's, a claim's) granted
-- after such a crash starts above every token granted before it (`epoch << 32`), and
-- the epoch moves on, durably, at the first grant after the crash.
CREATE TABLE epoch (
    id    int4 PRIMARY KEY CHECK (id = 0),
    epoch int8 NOT NULL CHECK (epoch >= 0 AND epoch < 2147483648)
);
INSERT INTO epoch (id, epoch) VALUES (0, 0);

-- The epoch as long as the server has not crashed since it was recorded: an unlogged
-- table is emptied by crash recovery (and is empty on a promoted standby or a restored
-- backup), exactly the events that may lose acknowledged transactions, and by nothing
-- else. A grant that finds it empty moves the epoch on first.
CREATE UNLOGGED TABLE epoch_alive (
    id    int4 PRIMARY KEY CHECK (id = 0),
    epoch int8 NOT NULL
);
-- A store made before version 5 keeps its tokens: the server it migrates on is up.
INSERT INTO epoch_alive (id, epoch) VALUES (0, 0);
