-- PostgreSQL edition of ../0001_api_keys.sql: the same columns and meanings. Every TEXT column
-- uses the "C" collation so ordering and comparisons are by bytes, as on SQLite, whatever the
-- database's default collation is (ids, RFC 3339 timestamps and paths sort the same on both).
CREATE TABLE api_keys (
    id           TEXT COLLATE "C" PRIMARY KEY,
    name         TEXT COLLATE "C" NOT NULL,
    role         TEXT COLLATE "C" NOT NULL,
    key_hash     TEXT COLLATE "C" NOT NULL UNIQUE,
    created_at   TEXT COLLATE "C" NOT NULL,
    last_used_at TEXT COLLATE "C",
    expires_at   TEXT COLLATE "C"
);
