-- PostgreSQL edition of ../0011_jobs.sql.
CREATE TABLE jobs (
    id          TEXT COLLATE "C" PRIMARY KEY,
    kind        TEXT COLLATE "C" NOT NULL,
    target      TEXT COLLATE "C" NOT NULL,
    description TEXT COLLATE "C" NOT NULL,
    created_by  TEXT COLLATE "C" NOT NULL,
    created_at  TEXT COLLATE "C" NOT NULL,
    expires_at  TEXT COLLATE "C" NOT NULL,
    finished_at TEXT COLLATE "C",
    agents      BIGINT NOT NULL,
    counts      TEXT COLLATE "C" NOT NULL
);
CREATE INDEX jobs_created_at ON jobs (created_at);

CREATE TABLE job_results (
    job_id   TEXT COLLATE "C" NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    agent_id TEXT COLLATE "C" NOT NULL,
    status   TEXT COLLATE "C" NOT NULL,
    result   TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (job_id, agent_id)
);
