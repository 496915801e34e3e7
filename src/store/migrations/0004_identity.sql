-- Identity (contract §10): the embedded CA, one-shot join tokens, and enrolled agents.

-- CA certificates and their keys. Keys are AES-256-GCM ciphertext under master_key, never
-- cleartext. One active root and one active signing CA; a rotated-out signing CA keeps its
-- row with retired_at set, so its history stays inspectable.
CREATE TABLE ca (
    id            TEXT PRIMARY KEY,
    kind          TEXT NOT NULL,            -- root | signing
    cert_pem      TEXT NOT NULL,
    key_encrypted TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,
    not_before    TEXT NOT NULL,
    not_after     TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    retired_at    TEXT
);
CREATE INDEX ca_kind_active ON ca (kind, retired_at);

-- Join tokens: only the SHA-256 of a token is stored; the cleartext is shown once.
CREATE TABLE join_tokens (
    id          TEXT PRIMARY KEY,
    token_hash  TEXT NOT NULL UNIQUE,
    agent_id    TEXT,                       -- bound to this agent id when set
    created_by  TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    expires_at  TEXT NOT NULL,
    used_at     TEXT,
    used_by     TEXT,
    revoked_at  TEXT
);

CREATE TABLE agents (
    id           TEXT PRIMARY KEY,
    labels       TEXT NOT NULL,             -- JSON object
    fingerprint  TEXT NOT NULL,             -- SHA-256 of the agent certificate's DER
    enrolled_at  TEXT NOT NULL,
    quarantined  INTEGER NOT NULL DEFAULT 0
);
