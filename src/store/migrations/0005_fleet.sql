-- The fleet (contract §10): quarantine details, the last heartbeat, and each agent's last
-- applied state (what `svcctl state drift` compares the host with).

ALTER TABLE agents ADD COLUMN quarantine_reason TEXT;
ALTER TABLE agents ADD COLUMN quarantined_at TEXT;
ALTER TABLE agents ADD COLUMN last_heartbeat_at TEXT;

-- One row per agent: the compiled plan (JSON) of its last `state apply`.
CREATE TABLE agent_states (
    agent_id    TEXT PRIMARY KEY,
    plan        TEXT NOT NULL,
    job_id      TEXT NOT NULL,
    applied_by  TEXT NOT NULL,
    applied_at  TEXT NOT NULL
);
