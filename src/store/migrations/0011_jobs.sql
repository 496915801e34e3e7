-- Fleet jobs (docs/fleet.md, "Jobs"): every exec, state and module run with each targeted
-- agent's result, so `svcctl job list|show` works after the CLI that started it has gone
-- and from every cluster member. Bounded by `jobs.keep` and `jobs.max_age`.

-- One row per job. `counts` is a JSON object of results so far by status; `finished_at` is
-- NULL while the server collects; past `expires_at` a job still unfinished was cut off (its
-- server stopped) and shows as interrupted.
CREATE TABLE jobs (
    id          TEXT PRIMARY KEY,           -- ULID: newest sorts last
    kind        TEXT NOT NULL,              -- exec, state.apply, state.check, state.drift
    target      TEXT NOT NULL,
    description TEXT NOT NULL,              -- the command line, or what the plan holds
    created_by  TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    expires_at  TEXT NOT NULL,
    finished_at TEXT,
    agents      INTEGER NOT NULL,           -- targeted agents: the bound on its results
    counts      TEXT NOT NULL
);
CREATE INDEX jobs_created_at ON jobs (created_at);

-- One row per targeted agent: its status and its whole result (JSON, output cut at
-- jobs.max_output_bytes).
CREATE TABLE job_results (
    job_id   TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    agent_id TEXT NOT NULL,
    status   TEXT NOT NULL,
    result   TEXT NOT NULL,
    PRIMARY KEY (job_id, agent_id)
);
