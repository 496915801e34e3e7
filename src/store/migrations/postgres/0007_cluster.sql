-- Cluster mode (docs/cluster.md): members, the leader's lease, and change notifications.
-- Times here are PostgreSQL's own clock (timestamptz, now()): every member compares against
-- the same clock, so a member's skewed clock cannot make a lease look alive or expired.

CREATE TABLE cluster_members (
    id           TEXT COLLATE "C" PRIMARY KEY,
    advertise    TEXT COLLATE "C" NOT NULL,
    version      TEXT COLLATE "C" NOT NULL,
    -- A fresh random id per process start: a second process with the same member_id takes
    -- the row over, and the first one finds its heartbeat refused and stops.
    incarnation  TEXT COLLATE "C" NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    heartbeat_at TIMESTAMPTZ NOT NULL
);

-- One row per lease ('leader'). `token` is the fencing token: it grows by one at every
-- acquisition, so work done under an older token can be told apart. `preferred` is set by
-- transfer-leader: until `preferred_until`, only that member may take the lease.
CREATE TABLE cluster_lease (
    name            TEXT COLLATE "C" PRIMARY KEY,
    holder          TEXT COLLATE "C",
    token           BIGINT NOT NULL DEFAULT 0,
    acquired_at     TIMESTAMPTZ,
    expires_at      TIMESTAMPTZ NOT NULL,
    preferred       TEXT COLLATE "C",
    preferred_until TIMESTAMPTZ
);
INSERT INTO cluster_lease (name, expires_at) VALUES ('leader', '-infinity');

-- Members keep agents and transit keys in memory; a change made on one member is announced
-- to the others (LISTEN svc_changes) so they read it again at once. Heartbeat times
-- (agents.last_heartbeat_at) are not announced: every member receives the heartbeats.
CREATE FUNCTION svc_notify_agent() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('svc_changes', 'agent:' || COALESCE(NEW.id, OLD.id));
    RETURN NULL;
END $$;
CREATE TRIGGER agents_changed
    AFTER INSERT OR DELETE OR UPDATE OF labels, fingerprint, quarantined, quarantine_reason
    ON agents FOR EACH ROW EXECUTE FUNCTION svc_notify_agent();

CREATE FUNCTION svc_notify_transit_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('svc_changes', 'transit:' || COALESCE(NEW.name, OLD.name));
    RETURN NULL;
END $$;
CREATE TRIGGER transit_keys_changed
    AFTER INSERT OR DELETE OR UPDATE ON transit_keys
    FOR EACH ROW EXECUTE FUNCTION svc_notify_transit_key();
