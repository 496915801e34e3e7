-- PostgreSQL edition of ../0006_jwt_svids.sql.
CREATE TABLE jwt_svids (
    id          TEXT COLLATE "C" PRIMARY KEY,
    subject     TEXT COLLATE "C" NOT NULL,
    audience    TEXT COLLATE "C" NOT NULL,
    kid         TEXT COLLATE "C" NOT NULL,
    issued_by   TEXT COLLATE "C" NOT NULL,
    issued_at   TEXT COLLATE "C" NOT NULL,
    expires_at  TEXT COLLATE "C" NOT NULL,
    revoked_at  TEXT COLLATE "C",
    revoked_by  TEXT COLLATE "C"
);
CREATE INDEX jwt_svids_expires ON jwt_svids (expires_at);
