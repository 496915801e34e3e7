-- Blueprints (docs/blueprints.md): the catalogue of installed bundles (every version kept,
-- for rollback --to), every apply and rollback as it was recorded, and what is applied where.
CREATE TABLE blueprints (
    name         TEXT NOT NULL,
    version      TEXT NOT NULL,              -- MAJOR.MINOR.PATCH
    description  TEXT NOT NULL,
    sha256       TEXT NOT NULL,              -- of the bundle's bytes, hex
    manifest     TEXT NOT NULL,              -- blueprint.yaml as JSON
    bundle       TEXT NOT NULL,              -- the .tar.gz, base64
    installed_by TEXT NOT NULL,
    installed_at TEXT NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE blueprint_applies (
    id          TEXT PRIMARY KEY,            -- the state job's id (ULID)
    name        TEXT NOT NULL,
    version     TEXT NOT NULL,
    kind        TEXT NOT NULL,               -- apply | rollback
    target      TEXT NOT NULL,
    parameters  TEXT NOT NULL,               -- JSON object, secret values redacted
    plan        TEXT NOT NULL,               -- the rendered plan (JSON), as agent_states keeps it
    results     TEXT NOT NULL,               -- JSON array: agent_id, status, changed, error
    applied_by  TEXT NOT NULL,
    applied_at  TEXT NOT NULL
);
CREATE INDEX blueprint_applies_name ON blueprint_applies (name, applied_at);
CREATE TABLE blueprint_agents (
    name        TEXT NOT NULL,
    agent_id    TEXT NOT NULL,
    version     TEXT NOT NULL,
    apply_id    TEXT NOT NULL,
    status      TEXT NOT NULL,               -- the agent's last outcome: ok | changed | failed ...
    applied_at  TEXT NOT NULL,
    PRIMARY KEY (name, agent_id)
);
