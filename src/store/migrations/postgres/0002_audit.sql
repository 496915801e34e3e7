-- PostgreSQL edition of ../0002_audit.sql. `seq` is assigned by the appender (last + 1 under
-- a lock), not by a sequence, so the chain has no gaps and copies keep it byte-identical.
CREATE TABLE audit_events (
    seq           BIGINT PRIMARY KEY,
    id            TEXT COLLATE "C" NOT NULL UNIQUE,
    timestamp     TEXT COLLATE "C" NOT NULL,
    user_id       TEXT COLLATE "C" NOT NULL,
    action        TEXT COLLATE "C" NOT NULL,
    resource_type TEXT COLLATE "C" NOT NULL,
    resource_id   TEXT COLLATE "C" NOT NULL,
    outcome       TEXT COLLATE "C" NOT NULL,
    policy_id     TEXT COLLATE "C",
    decision      TEXT COLLATE "C",
    severity      TEXT COLLATE "C" NOT NULL,
    detail        TEXT COLLATE "C" NOT NULL,
    prev_hash     TEXT COLLATE "C" NOT NULL,
    hash          TEXT COLLATE "C" NOT NULL
);
CREATE INDEX audit_events_timestamp ON audit_events (timestamp);
CREATE INDEX audit_events_action ON audit_events (action);
-- No code path updates or deletes audit rows; the database refuses it too (TRUNCATE as well,
-- which row triggers would not see).
CREATE FUNCTION audit_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only' USING ERRCODE = 'restrict_violation';
END;
$$;
CREATE TRIGGER audit_events_no_update BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();
CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only();
