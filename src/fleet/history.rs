//! The job history: every exec, state and module run is a row in the store with each
//! targeted agent's result, so `svcctl job list|show` (and the console) see it after the CLI
//! that started it has gone, and from every cluster member (the store is shared).
//!
//! The server collects a job's results, not the client: a job runs to its end whether or not
//! anyone watches its stream (`svcctl exec --async` watches nothing). Results are written by
//! a task of the job's own in batches, one transaction each, so a fan-out to 10,000 agents is
//! a few dozen commits, not 10,000. What is kept is bounded: each result is one row per
//! targeted agent with its output cut at `jobs.max_output_bytes`, and whole jobs go past the
//! newest `jobs.keep` or `jobs.max_age` (pruned beside each job start, off the way of its
//! command, and every few minutes).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;

use super::jobs::ANSWER_GRACE;
use super::JobStatus;
use crate::auth::{Principal, Role};
use crate::config::JobsConfig;
use crate::domain::Domain;
use crate::store::{JobResultRow, JobRow, Store};
use crate::{clock, Error, Result};

/// Results written in one transaction at most.
const BATCH: usize = 512;
/// How long a job's results wait for an unavailable store before they are given up.
const STORE_PATIENCE: Duration = Duration::from_secs(60);
/// How often every server prunes the history by age (the count is also kept at each start).
const PRUNE_EVERY: Duration = Duration::from_secs(300);

/// What the store keeps (the `jobs` section of the configuration).
#[derive(Clone, Debug)]
pub struct Retention {
    pub keep: usize,
    pub max_age: Duration,
    pub max_output: usize,
    /// One prune at a time per server, and one more after it when jobs started meanwhile.
    pruning: Arc<PruneGate>,
}

#[derive(Debug, Default)]
struct PruneGate {
    running: AtomicBool,
    again: AtomicBool,
}

impl From<&JobsConfig> for Retention {
    fn from(config: &JobsConfig) -> Self {
        Retention {
            keep: config.keep.max(1) as usize,
            max_age: config.max_age.0,
            max_output: config.max_output_bytes as usize,
            pruning: Arc::default(),
        }
    }
}

impl Default for Retention {
    fn default() -> Self {
        Retention::from(&JobsConfig::default())
    }
}

/// A job about to start, as its row will say.
pub struct NewJob<'a> {
    pub id: &'a str,
    /// exec, state.apply, state.check, state.drift
    pub kind: &'a str,
    pub target: &'a str,
    pub description: String,
    pub by: &'a str,
    /// Targeted agents, skipped ones included: each gets one result.
    pub agents: usize,
    /// Agents given work (they take `timeout` each, `concurrency` at a time).
    pub working: usize,
    pub timeout: Duration,
    pub concurrency: usize,
}

/// Stores a new job's row, then has the history pruned to `jobs.keep` beside it. Called
/// before the job's id is handed out, so `job show` finds it at once.
pub async fn create(domain: &Domain, job: NewJob<'_>) -> Result<()> {
    let now = clock::now_millis();
    // The longest the job can take: its agents in waves of `concurrency`, each given its
    // timeout and the grace for its answer, and a minute for the rest.
    let waves = match job.concurrency {
        0 => 1,
        n => job.working.div_ceil(n).max(1),
    };
    let longest = (job.timeout + ANSWER_GRACE) * waves as u32 + Duration::from_secs(60);
    let row = JobRow {
        id: job.id.to_string(),
        kind: job.kind.to_string(),
        target: job.target.to_string(),
        description: job.description,
        created_by: job.by.to_string(),
        created_at: clock::format_rfc3339(now),
        expires_at: clock::format_rfc3339(now.saturating_add(longest.as_millis() as i64)),
        finished_at: None,
        agents: job.agents as i64,
        counts: "{}".into(),
    };
    domain.store.fleet().insert_job(&row).await?;
    prune_beside(domain.store.clone(), &domain.fleet.retention);
    Ok(())
}

/// Prunes the history to `jobs.keep` (this job included) in a task of its own, so the job's
/// command does not wait for a second commit. Starts that come while a prune runs are
/// served by one more prune after it.
fn prune_beside(store: Arc<dyn Store>, retention: &Retention) {
    let gate = retention.pruning.clone();
    gate.again.store(true, Ordering::SeqCst);
    if gate.running.swap(true, Ordering::SeqCst) {
        return;
    }
    let retention = retention.clone();
    tokio::spawn(async move {
        loop {
            while gate.again.swap(false, Ordering::SeqCst) {
                prune(store.as_ref(), &retention, retention.keep).await;
            }
            gate.running.store(false, Ordering::SeqCst);
            // A start between the last swap and the store above found a prune running and
            // left it to this one: take it unless another task already has.
            if !gate.again.load(Ordering::SeqCst) || gate.running.swap(true, Ordering::SeqCst) {
                break;
            }
        }
    });
}

/// Deletes jobs past the newest `keep` or older than `jobs.max_age`; failures are logged (a
/// job runs whether or not the history could be pruned).
async fn prune(store: &dyn Store, retention: &Retention, keep: usize) {
    let before = clock::now_millis().saturating_sub(retention.max_age.as_millis() as i64);
    match store
        .fleet()
        .prune_jobs(keep, &clock::format_rfc3339(before))
        .await
    {
        Ok(0) => {}
        Ok(pruned) => tracing::debug!(pruned, "old jobs deleted"),
        Err(e) => tracing::warn!(error = %e, "jobs not pruned"),
    }
}

/// Prunes the history by age every few minutes, on every server (the deletes are
/// idempotent, so members need not agree on who does it).
pub fn spawn_pruner(domain: Arc<Domain>) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(PRUNE_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let retention = &domain.fleet.retention;
            prune(domain.store.as_ref(), retention, retention.keep).await;
        }
    });
}

/// Writes one job's results to the store from a task of its own, in batches.
pub struct Recorder {
    sender: mpsc::Sender<JobResultRow>,
    task: tokio::task::JoinHandle<Counts>,
    max_output: usize,
}

/// A job's results counted by status (`ok`, `failed`, ...), as its row stores them.
pub type Counts = BTreeMap<String, u64>;

impl Recorder {
    pub fn start(domain: &Domain, job_id: &str) -> Recorder {
        let (sender, receiver) = mpsc::channel(BATCH * 2);
        let task = tokio::spawn(write(domain.store.clone(), job_id.to_string(), receiver));
        Recorder {
            sender,
            task,
            max_output: domain.fleet.retention.max_output,
        }
    }

    /// Queues one agent's result, its long texts cut at `jobs.max_output_bytes`.
    pub async fn add(&self, agent_id: &str, status: JobStatus, result: &impl Serialize) {
        let mut value = serde_json::to_value(result).unwrap_or_default();
        if cut_strings(&mut value, self.max_output) {
            if let Some(truncated) = value.get_mut("truncated") {
                *truncated = serde_json::Value::Bool(true);
            }
        }
        let row = JobResultRow {
            agent_id: agent_id.to_string(),
            status: status.to_string(),
            result: value.to_string(),
        };
        let _ = self.sender.send(row).await;
    }

    /// Waits until every result is stored and the job is marked finished; the results
    /// counted by status.
    pub async fn finish(self) -> Counts {
        drop(self.sender);
        self.task.await.unwrap_or_default()
    }
}

async fn write(
    store: Arc<dyn Store>,
    job_id: String,
    mut rows: mpsc::Receiver<JobResultRow>,
) -> Counts {
    let mut counts = Counts::new();
    let mut batch = Vec::with_capacity(BATCH);
    let mut done = false;
    while !done {
        match rows.recv().await {
            Some(row) => batch.push(row),
            None => done = true,
        }
        while !done && batch.len() < BATCH {
            match rows.try_recv() {
                Ok(row) => batch.push(row),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => done = true,
            }
        }
        for row in &batch {
            *counts.entry(row.status.clone()).or_default() += 1;
        }
        let counted = serde_json::to_string(&counts).unwrap_or_else(|_| "{}".into());
        let finished = done.then(clock::now_rfc3339);
        // A store that is restarting (PostgreSQL's recovery takes seconds) is waited for:
        // the write is idempotent (results are inserted once per agent, the counts set), so
        // one that committed before its answer was lost does no harm when tried again.
        let mut pause = Duration::from_millis(100);
        let deadline = tokio::time::Instant::now() + STORE_PATIENCE;
        loop {
            match store
                .fleet()
                .record_job_results(&job_id, &counted, finished.as_deref(), &batch)
                .await
            {
                Ok(()) => break,
                Err(e) if tokio::time::Instant::now() + pause < deadline => {
                    tracing::debug!(job_id, error = %e, "job results not stored yet; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    tracing::warn!(job_id, error = %e, results = batch.len(), "job results not stored");
                    break;
                }
            }
        }
        batch.clear();
    }
    counts
}

/// Cuts every string in `value` longer than `max` bytes (at a character boundary); true when
/// one was cut.
fn cut_strings(value: &mut serde_json::Value, max: usize) -> bool {
    match value {
        serde_json::Value::String(text) if text.len() > max => {
            let mut end = max;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            true
        }
        serde_json::Value::Array(items) => items
            .iter_mut()
            .fold(false, |cut, item| cut_strings(item, max) | cut),
        serde_json::Value::Object(fields) => fields
            .values_mut()
            .fold(false, |cut, item| cut_strings(item, max) | cut),
        _ => false,
    }
}

/// A job as operators see it.
#[derive(Clone, Debug, Serialize)]
pub struct JobView {
    pub id: String,
    pub kind: String,
    pub target: String,
    pub description: String,
    pub created_by: String,
    pub created_at: String,
    pub finished_at: Option<String>,
    /// running | finished | interrupted (its server stopped before every result was in)
    pub status: &'static str,
    pub agents: u64,
    /// Results so far by status.
    pub counts: BTreeMap<String, u64>,
}

impl From<JobRow> for JobView {
    fn from(row: JobRow) -> Self {
        let status = match &row.finished_at {
            Some(_) => "finished",
            None if clock::parse_rfc3339(&row.expires_at)
                .is_some_and(|at| at < clock::now_millis()) =>
            {
                "interrupted"
            }
            None => "running",
        };
        JobView {
            counts: serde_json::from_str(&row.counts).unwrap_or_default(),
            id: row.id,
            kind: row.kind,
            target: row.target,
            description: row.description,
            created_by: row.created_by,
            created_at: row.created_at,
            finished_at: row.finished_at,
            status,
            agents: row.agents.max(0) as u64,
        }
    }
}

/// Most jobs one listing returns.
pub const MAX_LIST: usize = 1000;

/// Jobs newest first (readonly: what ran where and how it went, no output), those older than
/// job `before` when given.
pub async fn list(
    domain: &Domain,
    principal: &Principal,
    before: Option<&str>,
    limit: usize,
) -> Result<Vec<JobView>> {
    principal.require(Role::Readonly)?;
    let rows = domain
        .store
        .fleet()
        .list_jobs(before, limit.clamp(1, MAX_LIST))
        .await?;
    Ok(rows.into_iter().map(JobView::from).collect())
}

/// One job (operator: its results carry the programs' output, which the operator who ran
/// it saw).
pub async fn get(domain: &Domain, principal: &Principal, id: &str) -> Result<JobView> {
    principal.require(Role::Operator)?;
    match domain.store.fleet().get_job(id).await? {
        Some(row) => Ok(row.into()),
        None => {
            let retention = &domain.fleet.retention;
            Err(Error::NotFound(format!(
                "job '{id}' not found (the newest {} jobs of the last {} are kept: \
                 svcctl job list shows them)",
                retention.keep,
                clock::format_duration(retention.max_age)
            )))
        }
    }
}

/// Up to `limit` results of job `id` (checked with [`get`] first) by agent id, after agent
/// `after`.
pub async fn results(
    domain: &Domain,
    id: &str,
    after: &str,
    limit: usize,
) -> Result<Vec<JobResultRow>> {
    domain
        .store
        .fleet()
        .job_results(id, after, limit.clamp(1, MAX_LIST))
        .await
}

/// A stored result read back as what its job streamed (`T`: an exec or a state result).
pub fn parse<T: serde::de::DeserializeOwned + Default>(row: &JobResultRow) -> T {
    serde_json::from_str(&row.result).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_strings_are_cut_at_a_character_boundary() {
        let mut value = serde_json::json!({
            "stdout": "é".repeat(10), "stderr": "ok", "truncated": false,
            "outcomes": [{"diff": "abcdef"}],
        });
        assert!(cut_strings(&mut value, 5));
        assert_eq!(value["stdout"], "éé");
        assert_eq!(value["stderr"], "ok");
        assert_eq!(value["outcomes"][0]["diff"], "abcde");
        assert!(!cut_strings(&mut value, 5));
    }

    #[test]
    fn unfinished_jobs_past_their_deadline_are_interrupted() {
        let row = |finished: Option<&str>, expires: i64| JobRow {
            finished_at: finished.map(str::to_string),
            expires_at: clock::format_rfc3339(clock::now_millis() + expires),
            counts: r#"{"ok":2}"#.into(),
            ..JobRow::default()
        };
        assert_eq!(JobView::from(row(None, 60_000)).status, "running");
        assert_eq!(JobView::from(row(None, -1)).status, "interrupted");
        let done = JobView::from(row(Some("2024-01-01T00:00:00.000Z"), -1));
        assert_eq!(done.status, "finished");
        assert_eq!(done.counts["ok"], 2);
    }
}
