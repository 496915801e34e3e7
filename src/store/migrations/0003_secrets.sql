-- Secrets (contract §11). Every value and every key is stored encrypted: data keys and
-- transit key material are wrapped (AES-256-GCM) by the server's master_key; secret values are
-- encrypted by their secret's data key. Binary values are base64 TEXT, times RFC 3339 TEXT.

-- One row: the encrypted marker that proves, at start, that master_key is the right key.
CREATE TABLE secrets_master_check (
    id         TEXT PRIMARY KEY,
    check_value TEXT NOT NULL,
    created_at TEXT NOT NULL,
    rotated_at TEXT
);

CREATE TABLE secrets (
    path            TEXT PRIMARY KEY,
    wrapped_key     TEXT NOT NULL,
    current_version INTEGER NOT NULL,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL
);

-- A destroyed version keeps its row (numbering stays) with an empty ciphertext.
CREATE TABLE secret_versions (
    path       TEXT NOT NULL REFERENCES secrets (path) ON DELETE CASCADE,
    version    INTEGER NOT NULL,
    ciphertext TEXT NOT NULL,
    created_at TEXT NOT NULL,
    deleted_at TEXT,
    destroyed  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (path, version)
);

CREATE TABLE transit_keys (
    name                   TEXT PRIMARY KEY,
    key_type               TEXT NOT NULL,
    latest_version         INTEGER NOT NULL,
    min_decryption_version INTEGER NOT NULL,
    created_at             TEXT NOT NULL,
    updated_at             TEXT NOT NULL
);

CREATE TABLE transit_key_versions (
    name       TEXT NOT NULL REFERENCES transit_keys (name) ON DELETE CASCADE,
    version    INTEGER NOT NULL,
    material   TEXT NOT NULL,
    public_key TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (name, version)
);

-- Dynamic-secret leases. `backend_data` names what to revoke (e.g. the PostgreSQL role); it
-- holds no password. Revoked leases keep their row (revoked_at set) for the record.
CREATE TABLE leases (
    id             TEXT PRIMARY KEY,
    path           TEXT NOT NULL,
    backend        TEXT NOT NULL,
    backend_data   TEXT NOT NULL,
    created_at     TEXT NOT NULL,
    expires_at     TEXT NOT NULL,
    max_expires_at TEXT NOT NULL,
    renewable      INTEGER NOT NULL,
    revoked_at     TEXT,
    last_error     TEXT
);
CREATE INDEX leases_expires_at ON leases (expires_at);
