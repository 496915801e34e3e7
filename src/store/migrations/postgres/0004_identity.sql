-- PostgreSQL edition of ../0004_identity.sql.
CREATE TABLE ca (
    id            TEXT COLLATE "C" PRIMARY KEY,
    kind          TEXT COLLATE "C" NOT NULL,
    cert_pem      TEXT COLLATE "C" NOT NULL,
    key_encrypted TEXT COLLATE "C" NOT NULL,
    fingerprint   TEXT COLLATE "C" NOT NULL,
    not_before    TEXT COLLATE "C" NOT NULL,
    not_after     TEXT COLLATE "C" NOT NULL,
    created_at    TEXT COLLATE "C" NOT NULL,
    retired_at    TEXT COLLATE "C"
);
CREATE INDEX ca_kind_active ON ca (kind, retired_at);

CREATE TABLE join_tokens (
    id          TEXT COLLATE "C" PRIMARY KEY,
    token_hash  TEXT COLLATE "C" NOT NULL UNIQUE,
    agent_id    TEXT COLLATE "C",
    created_by  TEXT COLLATE "C" NOT NULL,
    created_at  TEXT COLLATE "C" NOT NULL,
    expires_at  TEXT COLLATE "C" NOT NULL,
    used_at     TEXT COLLATE "C",
    used_by     TEXT COLLATE "C",
    revoked_at  TEXT COLLATE "C"
);

CREATE TABLE agents (
    id           TEXT COLLATE "C" PRIMARY KEY,
    labels       TEXT COLLATE "C" NOT NULL,
    fingerprint  TEXT COLLATE "C" NOT NULL,
    enrolled_at  TEXT COLLATE "C" NOT NULL,
    quarantined  BIGINT NOT NULL DEFAULT 0
);
