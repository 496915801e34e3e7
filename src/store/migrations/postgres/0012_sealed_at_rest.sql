-- PostgreSQL edition of ../0012_sealed_at_rest.sql, plus the cluster's shared replay window.
CREATE TABLE data_keys (
    name        TEXT COLLATE "C" PRIMARY KEY,
    key_sealed  TEXT COLLATE "C" NOT NULL,
    created_at  TEXT COLLATE "C" NOT NULL
);

ALTER TABLE api_keys ADD COLUMN signing_sealed TEXT COLLATE "C";

-- Nonces of signed file requests (docs/files.md, "Who is calling"), shared by the members so
-- a request replayed to another member within the time window is refused too. A row is
-- needed only while a request signed at `signed_at` (Unix seconds, the signer's clock) is
-- still accepted; members delete older rows as they go. Live state, like the other
-- cluster_* tables: never copied by svc-migrate or backups.
CREATE TABLE cluster_file_nonces (
    nonce      TEXT COLLATE "C" PRIMARY KEY,    -- <key id>:<nonce>
    signed_at  BIGINT NOT NULL
);
CREATE INDEX cluster_file_nonces_signed_at ON cluster_file_nonces (signed_at);
