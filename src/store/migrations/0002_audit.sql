-- The audit log: append-only rows linked by a hash chain (prev_hash, hash).
-- `seq` orders the chain; `user_id` avoids the reserved word `user` on PostgreSQL.
CREATE TABLE audit_events (
    seq           INTEGER PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    timestamp     TEXT NOT NULL,
    user_id       TEXT NOT NULL,
    action        TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    resource_id   TEXT NOT NULL,
    outcome       TEXT NOT NULL,
    policy_id     TEXT,
    decision      TEXT,
    severity      TEXT NOT NULL,
    detail        TEXT NOT NULL,
    prev_hash     TEXT NOT NULL,
    hash          TEXT NOT NULL
);
CREATE INDEX audit_events_timestamp ON audit_events (timestamp);
CREATE INDEX audit_events_action ON audit_events (action);
-- No code path updates or deletes audit rows; the database refuses it too.
CREATE TRIGGER audit_events_no_update BEFORE UPDATE ON audit_events
BEGIN SELECT RAISE(ABORT, 'audit_events is append-only'); END;
CREATE TRIGGER audit_events_no_delete BEFORE DELETE ON audit_events
BEGIN SELECT RAISE(ABORT, 'audit_events is append-only'); END;
