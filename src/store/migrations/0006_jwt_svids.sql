-- Identity tokens (JWT-SVIDs): one row per issued token, never the token itself. `id` is the
-- token's `jti`; revocation is by id and is published (with the expiry, after which the
-- entry can be dropped) at /.well-known/jwt-revocations.json.
CREATE TABLE jwt_svids (
    id          TEXT PRIMARY KEY,           -- jti (ULID)
    subject     TEXT NOT NULL,              -- spiffe://svc/...
    audience    TEXT NOT NULL,              -- JSON array of strings
    kid         TEXT NOT NULL,              -- fingerprint of the signing CA that signed it
    issued_by   TEXT NOT NULL,              -- API key id or agent:<id>
    issued_at   TEXT NOT NULL,
    expires_at  TEXT NOT NULL,
    revoked_at  TEXT,
    revoked_by  TEXT
);
CREATE INDEX jwt_svids_expires ON jwt_svids (expires_at);
