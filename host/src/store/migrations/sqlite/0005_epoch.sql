-- Version 5: the store's epoch. A claim whose step may run again after power loss
-- (durability `with-commit`) is written without a sync of its own, so a reboot may
-- lose it; the fencing tokens granted after a reboot start above every token of the
-- epoch before (`epoch << 32`), so a token handed out and then lost is never handed
-- out again. The epoch moves on at the first open after the machine booted again.
CREATE TABLE epoch (
    id      INTEGER PRIMARY KEY CHECK (id = 0),
    epoch   INTEGER NOT NULL CHECK (epoch >= 0 AND epoch < 2147483648),
    boot_id TEXT
) STRICT;

-- A store made before version 5 never wrote an unsynced claim: its epoch is 0, and the
-- first open records the boot it runs in.
INSERT INTO epoch (id, epoch, boot_id) VALUES (0, 0, NULL);
