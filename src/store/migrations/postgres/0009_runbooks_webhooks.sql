-- PostgreSQL edition of ../0009_runbooks_webhooks.sql.

-- One row per outbound webhook subscription. `secret_sealed` is the signing secret sealed
-- under master_key (AES-256-GCM, bound to the id): it must be usable for signing, so it is
-- encrypted, not hashed. `cursor_seq` is the durable cursor in the events stream: the
-- sequence of the last event turned into a delivery row (moved in the same transaction that
-- inserts the row, so a restart neither skips nor repeats an event).
CREATE TABLE webhooks (
    id            TEXT COLLATE "C" PRIMARY KEY,
    url           TEXT COLLATE "C" NOT NULL,
    event_types   TEXT COLLATE "C" NOT NULL,            -- JSON array of type names; [] = any type
    category      TEXT COLLATE "C" NOT NULL,            -- '' = any category
    min_severity  TEXT COLLATE "C" NOT NULL,            -- '' = any severity
    description   TEXT COLLATE "C" NOT NULL,
    secret_sealed TEXT COLLATE "C" NOT NULL,
    created_by    TEXT COLLATE "C" NOT NULL,
    created_at    TEXT COLLATE "C" NOT NULL,
    updated_at    TEXT COLLATE "C" NOT NULL,
    cursor_seq    BIGINT NOT NULL
);

-- One row per message to one subscription; `id` is the `webhook-id` header, the same on
-- every retry. Status: pending (to send, at next_attempt_at), delivered, dead (gave up).
CREATE TABLE webhook_deliveries (
    id              TEXT COLLATE "C" PRIMARY KEY,
    webhook_id      TEXT COLLATE "C" NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    event_id        TEXT COLLATE "C" NOT NULL,
    event_seq       BIGINT NOT NULL,       -- 0 for a ping
    event_type      TEXT COLLATE "C" NOT NULL,
    body            TEXT COLLATE "C" NOT NULL,
    status          TEXT COLLATE "C" NOT NULL,
    attempts        BIGINT NOT NULL,
    created_at      TEXT COLLATE "C" NOT NULL,
    next_attempt_at TEXT COLLATE "C" NOT NULL,
    deadline_at     TEXT COLLATE "C" NOT NULL,          -- after this a failed delivery is dead-lettered
    last_attempt_at TEXT COLLATE "C",
    response_status BIGINT,
    last_error      TEXT COLLATE "C"
);
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (webhook_id, status, event_seq);

-- One row per runbook execution. `definition` is the runbook (JSON) as it was when the
-- execution started, so a resumed execution runs what it started with.
CREATE TABLE runbook_executions (
    id               TEXT COLLATE "C" PRIMARY KEY,
    runbook          TEXT COLLATE "C" NOT NULL,
    status           TEXT COLLATE "C" NOT NULL,         -- running, succeeded, failed, cancelled
    parameters       TEXT COLLATE "C" NOT NULL,         -- JSON object
    definition       TEXT COLLATE "C" NOT NULL,         -- JSON
    started_by       TEXT COLLATE "C" NOT NULL,
    started_at       TEXT COLLATE "C" NOT NULL,
    finished_at      TEXT COLLATE "C",
    trigger_event_id TEXT COLLATE "C"                   -- the event that started it (triggers)
);
-- A trigger starts a runbook at most once per event.
CREATE UNIQUE INDEX runbook_executions_trigger ON runbook_executions (runbook, trigger_event_id);

-- One row per step of an execution (rollback steps too, as `rollback:<id>`).
CREATE TABLE runbook_steps (
    execution_id TEXT COLLATE "C" NOT NULL REFERENCES runbook_executions (id) ON DELETE CASCADE,
    step_id      TEXT COLLATE "C" NOT NULL,
    status       TEXT COLLATE "C" NOT NULL,             -- pending, running, waiting, succeeded, failed, skipped, cancelled
    attempts     BIGINT NOT NULL,
    started_at   TEXT COLLATE "C",
    finished_at  TEXT COLLATE "C",
    output       TEXT COLLATE "C" NOT NULL,             -- JSON
    error        TEXT COLLATE "C",
    approved_by  TEXT COLLATE "C",
    PRIMARY KEY (execution_id, step_id)
);
