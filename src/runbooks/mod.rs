//! Runbooks (issue 18, docs/runbooks.md): YAML files in `runbook_dir` whose steps form a
//! DAG, executed by the server (`engine.rs`), persisted step by step, resumed after a
//! restart, started by hand (`svc-runbook execute`) or by a stored event (`on:`).
//!
//! Owns the loaded set (read at start and on SIGHUP, like policies), the roles and audit
//! rows of every operation, and the views transports show. `definition.rs` is the file
//! format and needs no server.

pub mod definition;
pub mod engine;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use serde::Serialize;
use serde_json::{json, Value};

use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::store::{AuditFilter, ExecutionRow, StepRow};
pub use crate::store::{ExecutionStatus, StepStatus};
use crate::{clock, ids, Error, Result};

pub use definition::Runbook;

/// The runbooks part of the domain: the directory and what was loaded from it.
pub struct Runbooks {
    dir: PathBuf,
    loaded: RwLock<BTreeMap<String, Runbook>>,
    /// Whether any loaded runbook has a trigger (`on:`): the trigger tail reads the events
    /// log only while one does.
    triggered: tokio::sync::watch::Sender<bool>,
}

impl Runbooks {
    /// Loads `dir` (a missing directory is an empty set).
    pub fn load(dir: PathBuf) -> Runbooks {
        let runbooks = Runbooks {
            dir,
            loaded: RwLock::default(),
            triggered: tokio::sync::watch::Sender::new(false),
        };
        runbooks.reload();
        runbooks
    }

    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Re-reads every `*.yaml`/`*.yml` file; a file that does not validate is logged and
    /// left out (the others still load). Returns how many loaded.
    pub fn reload(&self) -> usize {
        let loaded = self.read_dir();
        let count = loaded.len();
        let triggered = loaded.values().any(|r| r.trigger.is_some());
        *self.loaded.write().expect("runbooks lock poisoned") = loaded;
        self.triggered.send_replace(triggered);
        count
    }

    /// The runbooks in `dir` that validate (none when it is missing or unreadable).
    fn read_dir(&self) -> BTreeMap<String, Runbook> {
        let mut loaded = BTreeMap::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "runbook_dir unreadable");
                }
                return loaded;
            }
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| {
                matches!(
                    path.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml")
                )
            })
            .collect();
        paths.sort();
        for path in paths {
            match definition::load_file(&path) {
                Ok(runbook) => {
                    if loaded.contains_key(&runbook.name) {
                        tracing::warn!(file = %path.display(), name = %runbook.name, "runbook name used twice; this file is left out");
                        continue;
                    }
                    loaded.insert(runbook.name.clone(), runbook);
                }
                Err(e) => tracing::warn!(error = %e, "runbook left out"),
            }
        }
        loaded
    }

    /// Follows whether any loaded runbook has a trigger.
    pub fn watch_triggered(&self) -> tokio::sync::watch::Receiver<bool> {
        self.triggered.subscribe()
    }

    pub fn get(&self, name: &str) -> Option<Runbook> {
        self.loaded
            .read()
            .expect("runbooks lock poisoned")
            .get(name)
            .cloned()
    }

    pub fn all(&self) -> Vec<Runbook> {
        self.loaded
            .read()
            .expect("runbooks lock poisoned")
            .values()
            .cloned()
            .collect()
    }
}

/// A runbook as `list` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct RunbookSummary {
    pub name: String,
    pub description: String,
    pub steps: usize,
    pub parameters: Vec<String>,
    pub trigger: Option<String>,
}

/// An execution with its steps, as `status` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ExecutionView {
    pub id: String,
    pub runbook: String,
    pub status: ExecutionStatus,
    pub parameters: Value,
    pub started_by: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub trigger_event_id: Option<String>,
    pub steps: Vec<StepView>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StepView {
    pub id: String,
    pub status: StepStatus,
    pub attempts: i64,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub output: Value,
    pub error: Option<String>,
    pub approved_by: Option<String>,
}

fn step_view(row: StepRow) -> StepView {
    StepView {
        id: row.step_id,
        status: row.status,
        attempts: row.attempts,
        started_at: row.started_at,
        finished_at: row.finished_at,
        output: serde_json::from_str(&row.output).unwrap_or(Value::Null),
        error: row.error,
        approved_by: row.approved_by,
    }
}

fn execution_view(row: ExecutionRow, steps: Vec<StepRow>, order: &[String]) -> ExecutionView {
    let mut steps: Vec<StepView> = steps.into_iter().map(step_view).collect();
    // In the runbook's order (rollback steps last), not the table's.
    crate::sort::sort_by_key(&mut steps, |s| {
        order
            .iter()
            .position(|id| *id == s.id)
            .unwrap_or(usize::MAX)
    });
    ExecutionView {
        id: row.id,
        runbook: row.runbook,
        status: row.status,
        parameters: serde_json::from_str(&row.parameters).unwrap_or(Value::Null),
        started_by: row.started_by,
        started_at: row.started_at,
        finished_at: row.finished_at,
        trigger_event_id: row.trigger_event_id,
        steps,
    }
}

/// The step ids of a runbook in display order: the steps, then `rollback:<id>` rows.
fn step_order(runbook: &Runbook) -> Vec<String> {
    runbook
        .steps
        .iter()
        .map(|s| s.id.clone())
        .chain(
            runbook
                .rollback
                .iter()
                .map(|s| format!("rollback:{}", s.id)),
        )
        .collect()
}

/// `svc-runbook list` (any key).
pub fn list(domain: &Domain, principal: &Principal) -> Result<Vec<RunbookSummary>> {
    principal.require(Role::Readonly)?;
    Ok(domain
        .runbooks
        .all()
        .into_iter()
        .map(|r| RunbookSummary {
            steps: r.steps.len(),
            parameters: r.parameters.iter().map(|p| p.name.clone()).collect(),
            trigger: r.trigger.as_ref().map(|t| t.event.clone()),
            name: r.name,
            description: r.description,
        })
        .collect())
}

/// One loaded runbook (any key): what `svc-runbook test NAME` checks.
pub fn get(domain: &Domain, principal: &Principal, name: &str) -> Result<Runbook> {
    principal.require(Role::Readonly)?;
    domain.runbooks.get(name).ok_or_else(|| {
        Error::NotFound(format!(
            "runbook '{name}' not found (is it in runbook_dir? SIGHUP reloads)"
        ))
    })
}

/// What `execute` answers: the execution, or with `--dry-run` the plan.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Started {
    Execution(ExecutionView),
    Plan {
        runbook: String,
        plan: Vec<String>,
        targets: BTreeMap<String, Vec<String>>,
    },
}

/// `svc-runbook execute NAME [--set k=v] [--dry-run]` (operator): records the execution
/// and its steps, then runs it on the server.
pub async fn execute(
    domain: &Arc<Domain>,
    principal: &Principal,
    name: &str,
    set: BTreeMap<String, String>,
    dry_run: bool,
) -> Result<Started> {
    let id = ids::ulid();
    let action = Action::new("runbook.execute", "runbook_execution", id.clone())
        .detail(json!({ "runbook": name, "parameters": set, "dry_run": dry_run }));
    let started = async {
        principal.require(Role::Operator)?;
        let runbook = get(domain, principal, name)?;
        let values = definition::parameters(&runbook, &set)?;
        if dry_run {
            return Ok(Started::Plan {
                runbook: runbook.name.clone(),
                plan: definition::plan_text(&runbook, &values),
                targets: engine::dry_run_targets(domain, &runbook, &values),
            });
        }
        let (row, steps) = engine::new_execution(&id, &runbook, &values, &principal.id, None)?;
        domain
            .store
            .runbooks()
            .insert_execution(&row, &steps)
            .await?;
        Ok(Started::Execution(execution_view(
            row,
            steps,
            &step_order(&runbook),
        )))
    };
    // A dry run only plans: like a read, it is not held back by the audit gate.
    let result = if dry_run {
        started.await
    } else {
        domain
            .auditor
            .gate(principal, action.clone(), started)
            .await
    };
    domain.auditor.record(principal, action, &result).await;
    if let Ok(Started::Execution(_)) = &result {
        engine::spawn(domain.clone(), id);
    }
    result
}

/// `svc-runbook list-executions [--runbook NAME] [--status S]` (any key), newest first. An
/// empty status matches every execution, one that is no status none.
pub async fn list_executions(
    domain: &Domain,
    principal: &Principal,
    runbook: &str,
    status: &str,
    limit: usize,
) -> Result<Vec<ExecutionView>> {
    principal.require(Role::Readonly)?;
    let limit = if limit == 0 { 100 } else { limit.min(1000) };
    let status = match status {
        "" => None,
        name => match name.parse::<ExecutionStatus>() {
            Ok(status) => Some(status),
            Err(_) => return Ok(Vec::new()),
        },
    };
    let rows = domain
        .store
        .runbooks()
        .list_executions(runbook, status, limit)
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| execution_view(row, Vec::new(), &[]))
        .collect())
}

async fn find(domain: &Domain, id: &str) -> Result<ExecutionRow> {
    domain
        .store
        .runbooks()
        .get_execution(id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("execution '{id}' not found")))
}

/// `svc-runbook status EXECUTION` (any key): the execution and every step.
pub async fn status(domain: &Domain, principal: &Principal, id: &str) -> Result<ExecutionView> {
    principal.require(Role::Readonly)?;
    let row = find(domain, id).await?;
    let steps = domain.store.runbooks().list_steps(id).await?;
    let order = serde_json::from_str::<Runbook>(&row.definition)
        .map(|r| step_order(&r))
        .unwrap_or_default();
    Ok(execution_view(row, steps, &order))
}

/// `svc-runbook audit EXECUTION` (any key): the audit rows of everything the execution did
/// (its steps act as `runbook:<id>`) and of what was done to it (execute, approve, cancel).
pub async fn audit(
    domain: &Domain,
    principal: &Principal,
    id: &str,
) -> Result<Vec<crate::audit::Entry>> {
    principal.require(Role::Readonly)?;
    find(domain, id).await?;
    let by_steps = AuditFilter {
        user: Some(engine::step_principal_id(id)),
        ..AuditFilter::default()
    };
    let on_it = AuditFilter {
        resource_type: Some("runbook_execution".into()),
        ..AuditFilter::default()
    };
    let mut rows = domain.store.query_audit(&by_steps, 10_000).await?;
    rows.extend(
        domain
            .store
            .query_audit(&on_it, 10_000)
            .await?
            .into_iter()
            .filter(|row| row.resource_id == id),
    );
    crate::sort::sort_by_key(&mut rows, |row| row.seq);
    rows.dedup_by_key(|row| row.seq);
    Ok(rows.into_iter().map(crate::audit::Entry::from).collect())
}

/// `svc-runbook cancel EXECUTION` (operator): running steps are stopped, the rest skipped.
pub async fn cancel(domain: &Domain, principal: &Principal, id: &str) -> Result<ExecutionView> {
    let action = Action::new("runbook.cancel", "runbook_execution", id);
    let result = domain
        .auditor
        .gate(principal, action.clone(), async {
            principal.require(Role::Operator)?;
            let row = find(domain, id).await?;
            if row.status != ExecutionStatus::Running {
                return Err(Error::Conflict(format!(
                    "execution '{id}' is {}, not running",
                    row.status
                )));
            }
            domain
                .store
                .runbooks()
                .set_execution_status(id, ExecutionStatus::Cancelled, Some(&clock::now_rfc3339()))
                .await?;
            status(domain, principal, id).await
        })
        .await;
    domain.auditor.record(principal, action, &result).await;
    result
}

/// `svc-runbook approve EXECUTION STEP` (operator): only by another principal than the one
/// who started the execution.
pub async fn approve(
    domain: &Domain,
    principal: &Principal,
    id: &str,
    step_id: &str,
) -> Result<ExecutionView> {
    let action =
        Action::new("runbook.approve", "runbook_execution", id).detail(json!({ "step": step_id }));
    let result = domain
        .auditor
        .gate(principal, action.clone(), async {
            principal.require(Role::Operator)?;
            let row = find(domain, id).await?;
            if row.started_by == principal.id {
                return Err(Error::Forbidden(format!(
                    "execution '{id}' was started by this key; another principal must approve"
                )));
            }
            let steps = domain.store.runbooks().list_steps(id).await?;
            let mut step = steps
                .into_iter()
                .find(|s| s.step_id == step_id)
                .ok_or_else(|| {
                    Error::NotFound(format!("execution '{id}' has no step '{step_id}'"))
                })?;
            if step.status != StepStatus::Waiting {
                return Err(Error::Conflict(format!(
                    "step '{step_id}' is {}, not waiting for approval",
                    step.status
                )));
            }
            step.status = StepStatus::Approved;
            step.approved_by = Some(principal.id.clone());
            domain.store.runbooks().upsert_step(&step).await?;
            status(domain, principal, id).await
        })
        .await;
    domain.auditor.record(principal, action, &result).await;
    result
}
