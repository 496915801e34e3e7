-- PostgreSQL edition of ../0008_blueprints.sql.
CREATE TABLE blueprints (
    name         TEXT COLLATE "C" NOT NULL,
    version      TEXT COLLATE "C" NOT NULL,
    description  TEXT COLLATE "C" NOT NULL,
    sha256       TEXT COLLATE "C" NOT NULL,
    manifest     TEXT COLLATE "C" NOT NULL,
    bundle       TEXT COLLATE "C" NOT NULL,
    installed_by TEXT COLLATE "C" NOT NULL,
    installed_at TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE blueprint_applies (
    id          TEXT COLLATE "C" PRIMARY KEY,
    name        TEXT COLLATE "C" NOT NULL,
    version     TEXT COLLATE "C" NOT NULL,
    kind        TEXT COLLATE "C" NOT NULL,
    target      TEXT COLLATE "C" NOT NULL,
    parameters  TEXT COLLATE "C" NOT NULL,
    plan        TEXT COLLATE "C" NOT NULL,
    results     TEXT COLLATE "C" NOT NULL,
    applied_by  TEXT COLLATE "C" NOT NULL,
    applied_at  TEXT COLLATE "C" NOT NULL
);
CREATE INDEX blueprint_applies_name ON blueprint_applies (name, applied_at);
CREATE TABLE blueprint_agents (
    name        TEXT COLLATE "C" NOT NULL,
    agent_id    TEXT COLLATE "C" NOT NULL,
    version     TEXT COLLATE "C" NOT NULL,
    apply_id    TEXT COLLATE "C" NOT NULL,
    status      TEXT COLLATE "C" NOT NULL,
    applied_at  TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (name, agent_id)
);
