-- Encryption at rest (store/sealing/): the data keys that seal the store's payloads,
-- each wrapped by the operator's store key, whose id is kept beside it so that a wrong
-- key is named as such. A store that is not encrypted has no row here.

CREATE TABLE data_keys (
    id      int8 PRIMARY KEY CHECK (id > 0),
    key_id  text NOT NULL,
    wrapped bytea NOT NULL,
    created int8 NOT NULL
);
