-- Outbound webhooks and runbook executions (issue 18; docs/webhooks.md, docs/runbooks.md).

-- One row per outbound webhook subscription. `secret_sealed` is the signing secret sealed
-- under master_key (AES-256-GCM, bound to the id): it must be usable for signing, so it is
-- encrypted, not hashed. `cursor_seq` is the durable cursor in the events stream: the
-- sequence of the last event turned into a delivery row (moved in the same transaction that
-- inserts the row, so a restart neither skips nor repeats an event).
CREATE TABLE webhooks (
    id            TEXT PRIMARY KEY,
    url           TEXT NOT NULL,
    event_types   TEXT NOT NULL,            -- JSON array of type names; [] = any type
    category      TEXT NOT NULL,            -- '' = any category
    min_severity  TEXT NOT NULL,            -- '' = any severity
    description   TEXT NOT NULL,
    secret_sealed TEXT NOT NULL,
    created_by    TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    cursor_seq    INTEGER NOT NULL
);

-- One row per message to one subscription; `id` is the `webhook-id` header, the same on
-- every retry. Status: pending (to send, at next_attempt_at), delivered, dead (gave up).
CREATE TABLE webhook_deliveries (
    id              TEXT PRIMARY KEY,
    webhook_id      TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    event_id        TEXT NOT NULL,
    event_seq       INTEGER NOT NULL,       -- 0 for a ping
    event_type      TEXT NOT NULL,
    body            TEXT NOT NULL,
    status          TEXT NOT NULL,
    attempts        INTEGER NOT NULL,
    created_at      TEXT NOT NULL,
    next_attempt_at TEXT NOT NULL,
    deadline_at     TEXT NOT NULL,          -- after this a failed delivery is dead-lettered
    last_attempt_at TEXT,
    response_status INTEGER,
    last_error      TEXT
);
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (webhook_id, status, event_seq);

-- One row per runbook execution. `definition` is the runbook (JSON) as it was when the
-- execution started, so a resumed execution runs what it started with.
CREATE TABLE runbook_executions (
    id               TEXT PRIMARY KEY,
    runbook          TEXT NOT NULL,
    status           TEXT NOT NULL,         -- running, succeeded, failed, cancelled
    parameters       TEXT NOT NULL,         -- JSON object
    definition       TEXT NOT NULL,         -- JSON
    started_by       TEXT NOT NULL,
    started_at       TEXT NOT NULL,
    finished_at      TEXT,
    trigger_event_id TEXT                   -- the event that started it (triggers)
);
-- A trigger starts a runbook at most once per event.
CREATE UNIQUE INDEX runbook_executions_trigger ON runbook_executions (runbook, trigger_event_id);

-- One row per step of an execution (rollback steps too, as `rollback:<id>`).
CREATE TABLE runbook_steps (
    execution_id TEXT NOT NULL REFERENCES runbook_executions (id) ON DELETE CASCADE,
    step_id      TEXT NOT NULL,
    status       TEXT NOT NULL,             -- pending, running, waiting, succeeded, failed, skipped, cancelled
    attempts     INTEGER NOT NULL,
    started_at   TEXT,
    finished_at  TEXT,
    output       TEXT NOT NULL,             -- JSON
    error        TEXT,
    approved_by  TEXT,
    PRIMARY KEY (execution_id, step_id)
);
