-- PostgreSQL edition of ../0003_secrets.sql (see there for what each table holds). Integers
-- are BIGINT and flags 0/1 BIGINT, as SQLite stores them, so rows copy across unchanged.
CREATE TABLE secrets_master_check (
    id          TEXT COLLATE "C" PRIMARY KEY,
    check_value TEXT COLLATE "C" NOT NULL,
    created_at  TEXT COLLATE "C" NOT NULL,
    rotated_at  TEXT COLLATE "C"
);

CREATE TABLE secrets (
    path            TEXT COLLATE "C" PRIMARY KEY,
    wrapped_key     TEXT COLLATE "C" NOT NULL,
    current_version BIGINT NOT NULL,
    created_at      TEXT COLLATE "C" NOT NULL,
    updated_at      TEXT COLLATE "C" NOT NULL
);

CREATE TABLE secret_versions (
    path       TEXT COLLATE "C" NOT NULL REFERENCES secrets (path) ON DELETE CASCADE,
    version    BIGINT NOT NULL,
    ciphertext TEXT COLLATE "C" NOT NULL,
    created_at TEXT COLLATE "C" NOT NULL,
    deleted_at TEXT COLLATE "C",
    destroyed  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (path, version)
);

CREATE TABLE transit_keys (
    name                   TEXT COLLATE "C" PRIMARY KEY,
    key_type               TEXT COLLATE "C" NOT NULL,
    latest_version         BIGINT NOT NULL,
    min_decryption_version BIGINT NOT NULL,
    created_at             TEXT COLLATE "C" NOT NULL,
    updated_at             TEXT COLLATE "C" NOT NULL
);

CREATE TABLE transit_key_versions (
    name       TEXT COLLATE "C" NOT NULL REFERENCES transit_keys (name) ON DELETE CASCADE,
    version    BIGINT NOT NULL,
    material   TEXT COLLATE "C" NOT NULL,
    public_key TEXT COLLATE "C" NOT NULL,
    created_at TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (name, version)
);

CREATE TABLE leases (
    id             TEXT COLLATE "C" PRIMARY KEY,
    path           TEXT COLLATE "C" NOT NULL,
    backend        TEXT COLLATE "C" NOT NULL,
    backend_data   TEXT COLLATE "C" NOT NULL,
    created_at     TEXT COLLATE "C" NOT NULL,
    expires_at     TEXT COLLATE "C" NOT NULL,
    max_expires_at TEXT COLLATE "C" NOT NULL,
    renewable      BIGINT NOT NULL,
    revoked_at     TEXT COLLATE "C",
    last_error     TEXT COLLATE "C"
);
CREATE INDEX leases_expires_at ON leases (expires_at);
