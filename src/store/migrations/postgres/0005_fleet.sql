-- PostgreSQL edition of ../0005_fleet.sql.
ALTER TABLE agents ADD COLUMN quarantine_reason TEXT COLLATE "C";
ALTER TABLE agents ADD COLUMN quarantined_at TEXT COLLATE "C";
ALTER TABLE agents ADD COLUMN last_heartbeat_at TEXT COLLATE "C";

CREATE TABLE agent_states (
    agent_id    TEXT COLLATE "C" PRIMARY KEY,
    plan        TEXT COLLATE "C" NOT NULL,
    job_id      TEXT COLLATE "C" NOT NULL,
    applied_by  TEXT COLLATE "C" NOT NULL,
    applied_at  TEXT COLLATE "C" NOT NULL
);
