//! Runs executions on the server: independent steps in parallel, each step's state written
//! to the store as it changes, so a restarted server resumes every running execution from
//! its last finished steps (a step that was running is run again; an approval already given
//! stays given). Also the event triggers.
//!
//! Steps act as the principal `runbook:<execution id>` (role operator), so every audit row
//! they cause (the fleet's exec and state rows, and one `runbook.step` row per finished
//! step) is found by that user. The calls into the events stream (`emit`, `wait_for_event`,
//! the trigger tail) are kept in one section at the end.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::definition::{self, Kind, OnFailure, Runbook, Step};
use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::events::{Event, Filter, NewEvent};
use crate::store::{ExecutionRow, ExecutionStatus, StepRow, StepStatus};
use crate::{clock, Error, Result};

/// How often a running execution looks for a cancel and a waiting approval for its answer.
const POLL: Duration = Duration::from_millis(250);
/// wait_event's limit when the step sets none.
const DEFAULT_WAIT: Duration = Duration::from_secs(300);

pub fn step_principal_id(execution_id: &str) -> String {
    format!("runbook:{execution_id}")
}

fn step_principal(execution_id: &str) -> Principal {
    Principal {
        id: step_principal_id(execution_id),
        name: step_principal_id(execution_id),
        role: Role::Operator,
    }
}

/// The rows of a new execution: the execution and one pending row per step.
pub(crate) fn new_execution(
    id: &str,
    runbook: &Runbook,
    values: &BTreeMap<String, String>,
    started_by: &str,
    trigger_event_id: Option<String>,
) -> Result<(ExecutionRow, Vec<StepRow>)> {
    let row = ExecutionRow {
        id: id.to_string(),
        runbook: runbook.name.clone(),
        status: ExecutionStatus::Running,
        parameters: serde_json::to_string(values).map_err(Error::internal)?,
        definition: serde_json::to_string(runbook).map_err(Error::internal)?,
        started_by: started_by.to_string(),
        started_at: clock::now_rfc3339(),
        finished_at: None,
        trigger_event_id,
    };
    let steps = runbook
        .steps
        .iter()
        .map(|s| StepRow {
            execution_id: id.to_string(),
            step_id: s.id.clone(),
            status: StepStatus::Pending,
            output: "null".into(),
            ..StepRow::default()
        })
        .collect();
    Ok((row, steps))
}

/// The agents each exec/state step would reach now (dry run).
pub(crate) fn dry_run_targets(
    domain: &Domain,
    runbook: &Runbook,
    values: &BTreeMap<String, String>,
) -> BTreeMap<String, Vec<String>> {
    let agents = domain.fleet.registry.all();
    let mut targets = BTreeMap::new();
    for step in &runbook.steps {
        let step = definition::substitute(step, values);
        let Some(target) = &step.target else { continue };
        let reached = match crate::fleet::selector::Selector::parse(target) {
            Ok(selector) => agents
                .iter()
                .filter(|a| {
                    let facts = if selector.uses_facts() {
                        a.facts()
                    } else {
                        crate::facts::Facts::new()
                    };
                    selector.matches(&a.row.id, &a.labels, &facts)
                })
                .map(|a| a.row.id.clone())
                .collect(),
            Err(e) => vec![format!("invalid target: {e}")],
        };
        targets.insert(step.id.clone(), reached);
    }
    targets
}

/// Runs an execution in its own task.
pub fn spawn(domain: Arc<Domain>, id: String) {
    tokio::spawn(async move {
        if let Err(e) = run(&domain, &id).await {
            tracing::error!(execution = %id, error = %e, "runbook execution stopped");
        }
    });
}

/// At start: every execution still running is picked up again.
pub async fn resume(domain: &Arc<Domain>) {
    if !domain.cluster.is_leader() {
        return;
    }
    match domain
        .store
        .runbooks()
        .list_executions("", Some(ExecutionStatus::Running), 10_000)
        .await
    {
        Ok(rows) => {
            for row in rows {
                tracing::info!(execution = %row.id, runbook = %row.runbook, "resuming runbook execution");
                spawn(domain.clone(), row.id);
            }
        }
        Err(e) => tracing::error!(error = %e, "running runbook executions not resumed"),
    }
}

/// What one step ended with.
struct Outcome {
    ok: bool,
    attempts: i64,
    output: Value,
    error: Option<String>,
}

async fn run(domain: &Arc<Domain>, id: &str) -> Result<()> {
    let store = domain.store.clone();
    let execution = store
        .runbooks()
        .get_execution(id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("execution '{id}'")))?;
    let runbook: Runbook = serde_json::from_str(&execution.definition).map_err(Error::internal)?;
    let values: BTreeMap<String, String> =
        serde_json::from_str(&execution.parameters).map_err(Error::internal)?;
    let principal = step_principal(id);
    let mut rows: HashMap<String, StepRow> = store
        .runbooks()
        .list_steps(id)
        .await?
        .into_iter()
        .map(|row| (row.step_id.clone(), row))
        .collect();
    let by_id: HashMap<&str, &Step> = runbook.steps.iter().map(|s| (s.id.as_str(), s)).collect();
    let mut tasks: JoinSet<(String, Outcome)> = JoinSet::new();
    let mut running: HashSet<String> = HashSet::new();
    let mut halted = false;
    let mut rollback = false;
    loop {
        if store
            .runbooks()
            .get_execution(id)
            .await?
            .is_some_and(|e| e.status == ExecutionStatus::Cancelled)
        {
            tasks.abort_all();
            for row in rows.values_mut() {
                if matches!(
                    row.status,
                    StepStatus::Pending | StepStatus::Running | StepStatus::Waiting
                ) {
                    row.status = StepStatus::Cancelled;
                    row.finished_at = Some(clock::now_rfc3339());
                    store.runbooks().upsert_step(row).await?;
                }
            }
            return Ok(());
        }
        if !halted {
            for step in &runbook.steps {
                let Some(row) = rows.get(&step.id) else {
                    continue;
                };
                // `running`/`waiting` rows not in this process's task set are left from
                // before a restart: they run again.
                let is_new = row.status == StepStatus::Pending
                    || (matches!(
                        row.status,
                        StepStatus::Running | StepStatus::Waiting | StepStatus::Approved
                    ) && !running.contains(&step.id));
                if !is_new || running.contains(&step.id) {
                    continue;
                }
                let mut blocked = false;
                let mut ready = true;
                for need in &step.needs {
                    let need_row = &rows[need];
                    let need_on_failure = by_id[need.as_str()].on_failure;
                    match need_row.status {
                        StepStatus::Succeeded => {}
                        StepStatus::Failed if need_on_failure == OnFailure::Continue => {}
                        StepStatus::Failed | StepStatus::Skipped | StepStatus::Cancelled => {
                            blocked = true
                        }
                        StepStatus::Pending
                        | StepStatus::Running
                        | StepStatus::Waiting
                        | StepStatus::Approved => ready = false,
                    }
                }
                if blocked {
                    let row = rows.get_mut(&step.id).expect("row exists");
                    row.status = StepStatus::Skipped;
                    row.finished_at = Some(clock::now_rfc3339());
                    store.runbooks().upsert_step(row).await?;
                    continue;
                }
                if !ready {
                    continue;
                }
                let row = rows.get_mut(&step.id).expect("row exists");
                row.status = StepStatus::Running;
                row.started_at = Some(row.started_at.clone().unwrap_or_else(clock::now_rfc3339));
                store.runbooks().upsert_step(row).await?;
                running.insert(step.id.clone());
                let step = definition::substitute(step, &values);
                let started_ms = row
                    .started_at
                    .as_deref()
                    .and_then(clock::parse_rfc3339)
                    .unwrap_or_else(clock::now_millis);
                let (domain, principal, id) = (domain.clone(), principal.clone(), id.to_string());
                let dir = domain.runbooks.dir().to_path_buf();
                tasks.spawn(async move {
                    let outcome =
                        run_step(&domain, &principal, &id, &step, started_ms, &dir, &step.id).await;
                    (step.id.clone(), outcome)
                });
            }
        }
        if tasks.is_empty() {
            break;
        }
        let joined = tokio::select! {
            joined = tasks.join_next() => joined,
            _ = tokio::time::sleep(POLL) => continue,
        };
        let Some(Ok((step_id, outcome))) = joined else {
            continue;
        };
        running.remove(&step_id);
        let on_failure = by_id[step_id.as_str()].on_failure;
        if !outcome.ok {
            match on_failure {
                OnFailure::Stop => halted = true,
                OnFailure::Rollback => {
                    halted = true;
                    rollback = true;
                }
                OnFailure::Continue => {}
            }
        }
        let kind = by_id[step_id.as_str()].kind;
        record(domain, &principal, id, &step_id, kind, outcome, &mut rows).await?;
    }
    if halted {
        for row in rows.values_mut() {
            if row.status == StepStatus::Pending {
                row.status = StepStatus::Skipped;
                row.finished_at = Some(clock::now_rfc3339());
                store.runbooks().upsert_step(row).await?;
            }
        }
    }
    if rollback {
        let dir = domain.runbooks.dir().to_path_buf();
        for step in &runbook.rollback {
            let row_id = format!("rollback:{}", step.id);
            let mut row = StepRow {
                execution_id: id.to_string(),
                step_id: row_id.clone(),
                status: StepStatus::Running,
                started_at: Some(clock::now_rfc3339()),
                output: "null".into(),
                ..StepRow::default()
            };
            store.runbooks().upsert_step(&row).await?;
            rows.insert(row_id.clone(), row.clone());
            let step = definition::substitute(step, &values);
            let outcome = run_step(
                domain,
                &principal,
                id,
                &step,
                clock::now_millis(),
                &dir,
                &row_id,
            )
            .await;
            record(
                domain, &principal, id, &row_id, step.kind, outcome, &mut rows,
            )
            .await?;
            row = rows[&row_id].clone();
            if row.status != StepStatus::Succeeded {
                break;
            }
        }
    }
    let failed = runbook.steps.iter().any(|s| {
        rows.get(&s.id)
            .is_some_and(|r| r.status == StepStatus::Failed)
            && s.on_failure != OnFailure::Continue
    });
    let status = if failed {
        ExecutionStatus::Failed
    } else {
        ExecutionStatus::Succeeded
    };
    // A cancel that landed meanwhile stays a cancel.
    if store
        .runbooks()
        .get_execution(id)
        .await?
        .is_some_and(|e| e.status == ExecutionStatus::Running)
    {
        store
            .runbooks()
            .set_execution_status(id, status, Some(&clock::now_rfc3339()))
            .await?;
    }
    let result: Result<()> = if failed {
        Err(Error::Invalid(format!("runbook '{}' failed", runbook.name)))
    } else {
        Ok(())
    };
    let action = Action::new("runbook.finish", "runbook_execution", id)
        .detail(json!({ "execution_id": id, "runbook": runbook.name, "status": status }));
    domain.auditor.record(&principal, action, &result).await;
    Ok(())
}

/// Writes a finished step's row (keeping an approver written meanwhile) and its audit row.
async fn record(
    domain: &Domain,
    principal: &Principal,
    id: &str,
    step_id: &str,
    kind: Kind,
    outcome: Outcome,
    rows: &mut HashMap<String, StepRow>,
) -> Result<()> {
    let store = &domain.store;
    let mut row = store
        .runbooks()
        .list_steps(id)
        .await?
        .into_iter()
        .find(|r| r.step_id == step_id)
        .unwrap_or_else(|| rows[step_id].clone());
    row.status = if outcome.ok {
        StepStatus::Succeeded
    } else {
        StepStatus::Failed
    };
    row.attempts = outcome.attempts;
    row.finished_at = Some(clock::now_rfc3339());
    row.output = outcome.output.to_string();
    row.error = outcome.error.clone();
    store.runbooks().upsert_step(&row).await?;
    rows.insert(step_id.to_string(), row);
    let result: Result<()> = match &outcome.error {
        Some(e) if !outcome.ok => Err(Error::Invalid(e.clone())),
        _ => Ok(()),
    };
    let action = Action::new("runbook.step", "runbook_execution", id).detail(json!({
        "execution_id": id, "step": step_id, "kind": kind, "attempts": outcome.attempts,
        "error": outcome.error,
    }));
    domain.auditor.record(principal, action, &result).await;
    Ok(())
}

/// One step, with its retries and timeout.
async fn run_step(
    domain: &Arc<Domain>,
    principal: &Principal,
    execution_id: &str,
    step: &Step,
    started_ms: i64,
    dir: &std::path::Path,
    row_id: &str,
) -> Outcome {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let work = run_kind(
            domain,
            principal,
            execution_id,
            step,
            started_ms,
            dir,
            row_id,
        );
        let result = match step.timeout() {
            Some(limit) if step.kind != Kind::Exec && step.kind != Kind::State => {
                match tokio::time::timeout(limit, work).await {
                    Ok(result) => result,
                    Err(_) => Err(format!("timed out after {}", clock::format_duration(limit))),
                }
            }
            _ => work.await,
        };
        match result {
            Ok(output) => {
                return Outcome {
                    ok: true,
                    attempts,
                    output,
                    error: None,
                }
            }
            Err(error) if attempts > step.retries as i64 => {
                return Outcome {
                    ok: false,
                    attempts,
                    output: Value::Null,
                    error: Some(error),
                }
            }
            Err(error) => {
                tracing::info!(execution = %execution_id, step = %step.id, %error, "runbook step failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

async fn run_kind(
    domain: &Arc<Domain>,
    principal: &Principal,
    execution_id: &str,
    step: &Step,
    started_ms: i64,
    dir: &std::path::Path,
    row_id: &str,
) -> std::result::Result<Value, String> {
    match step.kind {
        Kind::Sleep => {
            let duration = step
                .duration
                .as_deref()
                .and_then(clock::parse_duration)
                .ok_or("duration is not a duration")?;
            // A resumed sleep only sleeps what is left.
            let elapsed = (clock::now_millis() - started_ms).max(0) as u64;
            let left = duration.saturating_sub(Duration::from_millis(elapsed));
            tokio::time::sleep(left).await;
            Ok(json!({ "slept": clock::format_duration(duration) }))
        }
        Kind::Emit => emit(domain, execution_id, step).await,
        Kind::WaitEvent => {
            let limit = step.timeout().unwrap_or(DEFAULT_WAIT);
            match tokio::time::timeout(limit, wait_for_event(domain, step, started_ms)).await {
                Ok(result) => result,
                Err(_) => Err(format!(
                    "no matching {} within {}",
                    step.event.as_deref().unwrap_or(""),
                    clock::format_duration(limit)
                )),
            }
        }
        Kind::Approve => loop {
            let rows = domain
                .store
                .runbooks()
                .list_steps(execution_id)
                .await
                .map_err(|e| e.to_string())?;
            let Some(mut row) = rows.into_iter().find(|r| r.step_id == row_id) else {
                return Err("step row missing".into());
            };
            match row.status {
                StepStatus::Approved => {
                    return Ok(json!({ "approved_by": row.approved_by }));
                }
                StepStatus::Running => {
                    row.status = StepStatus::Waiting;
                    domain
                        .store
                        .runbooks()
                        .upsert_step(&row)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                _ => {}
            }
            tokio::time::sleep(POLL).await;
        },
        Kind::Exec => {
            let request = crate::fleet::exec::ExecRequest {
                target: step.target.clone().unwrap_or_default(),
                argv: step.argv(),
                timeout: step.timeout(),
                concurrency: 0,
            };
            let job = crate::fleet::exec::prepare(domain, principal, request)
                .await
                .map_err(|e| e.to_string())?;
            let (sender, mut receiver) = mpsc::channel(64);
            let collect = async {
                let mut results = Vec::new();
                while let Some(result) = receiver.recv().await {
                    results.push(result);
                }
                results
            };
            let (_, results) = tokio::join!(job.run(domain, sender), collect);
            let failed: Vec<String> = results
                .iter()
                .filter(|r| r.status != crate::fleet::JobStatus::Ok)
                .map(|r| r.agent_id.clone())
                .collect();
            let output = serde_json::to_value(&results).unwrap_or(Value::Null);
            if results.is_empty() {
                Err("no agent answered".into())
            } else if failed.is_empty() {
                Ok(output)
            } else {
                Err(format!("failed on {}", failed.join(", ")))
            }
        }
        Kind::State => {
            let file = dir.join(step.state.as_deref().unwrap_or_default());
            let yaml = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            let base = file.parent().unwrap_or(dir);
            let plan = crate::state::compile(&yaml, base).map_err(|e| e.to_string())?;
            let request = crate::fleet::state::StateRequest {
                target: step.target.clone().unwrap_or_default(),
                plan: serde_json::to_string(&plan).map_err(|e| e.to_string())?,
                timeout: step.timeout(),
                concurrency: 0,
                diff: false,
            };
            let job = crate::fleet::state::prepare(
                domain,
                principal,
                crate::fleet::state::Operation::Apply,
                request,
            )
            .await
            .map_err(|e| e.to_string())?;
            let (sender, mut receiver) = mpsc::channel(64);
            let collect = async {
                let mut results = Vec::new();
                while let Some(result) = receiver.recv().await {
                    results.push(result);
                }
                results
            };
            let (_, results) = tokio::join!(job.run(domain, sender), collect);
            use crate::fleet::JobStatus;
            let failed: Vec<String> = results
                .iter()
                .filter(|r| !matches!(r.status, JobStatus::Ok | JobStatus::Changed))
                .map(|r| r.agent_id.clone())
                .collect();
            let output = serde_json::to_value(&results).unwrap_or(Value::Null);
            if results.is_empty() {
                Err("no agent answered".into())
            } else if failed.is_empty() {
                Ok(output)
            } else {
                Err(format!("failed on {}", failed.join(", ")))
            }
        }
    }
}

// ---- Calls into the events stream (kept together for the stream-trait merge). ----

/// The `emit` step: an event with source `runbook:<execution id>`.
async fn emit(
    domain: &Domain,
    execution_id: &str,
    step: &Step,
) -> std::result::Result<Value, String> {
    let new = NewEvent {
        event_type: step.event.clone().unwrap_or_default(),
        severity: step.severity.clone(),
        source: Some(step_principal_id(execution_id)),
        payload: step.payload.clone(),
    };
    let event = domain
        .events
        .emit(new, &step_principal_id(execution_id))
        .await
        .map_err(|e| e.to_string())?;
    Ok(json!({ "event_id": event.id, "seq": event.seq }))
}

/// The `wait_event` step: the first matching event stored since the step started.
async fn wait_for_event(
    domain: &Arc<Domain>,
    step: &Step,
    since_ms: i64,
) -> std::result::Result<Value, String> {
    let kind = crate::events::types::find(step.event.as_deref().unwrap_or_default())
        .ok_or("unknown event type")?
        .kind;
    let filter = Filter {
        types: vec![kind],
        since_ms: Some(since_ms),
        ..Filter::default()
    };
    let (sender, mut receiver) = mpsc::channel(64);
    let reader = {
        let domain = domain.clone();
        tokio::spawn(async move { domain.events.stream(filter, true, sender).await })
    };
    let found = async {
        while let Some(event) = receiver.recv().await {
            let event = event.map_err(|e| e.to_string())?;
            if definition::filter_matches(&step.filter, &event) {
                return Ok(json!({ "event_id": event.id, "seq": event.seq }));
            }
        }
        Err("the events stream ended".to_string())
    }
    .await;
    reader.abort();
    found
}

/// Starts the trigger tail: every event stored from now on is offered to the loaded
/// runbooks' `on:`; a match starts an execution at most once per event (a unique index on
/// (runbook, event id)), unless the runbook's triggered executions already running reach
/// its `on.concurrency`. The tail reads the events log only while some loaded runbook has a
/// trigger: reading costs a decode of every event (issue 21), and without a trigger there is
/// nothing to offer it to. A trigger that appears later (SIGHUP) sees events from then on.
pub fn spawn_triggers(domain: Arc<Domain>) {
    tokio::spawn(async move {
        let mut triggered = domain.runbooks.watch_triggered();
        loop {
            // (the guard `wait_for` returns is not Send: only whether it failed is kept)
            let closed = triggered.wait_for(|any| *any).await.is_err();
            if closed {
                return;
            }
            let filter = Filter {
                since_ms: Some(clock::now_millis()),
                ..Filter::default()
            };
            let (sender, mut receiver) = mpsc::channel::<Result<Event>>(256);
            let reader = {
                let domain = domain.clone();
                tokio::spawn(async move { domain.events.stream(filter, true, sender).await })
            };
            let ended = loop {
                tokio::select! {
                    event = receiver.recv() => match event {
                        Some(Ok(event)) => offer(&domain, &event).await,
                        Some(Err(_)) => {}
                        None => break true,
                    },
                    closed = async { triggered.wait_for(|any| !*any).await.is_err() } => {
                        if closed {
                            reader.abort();
                            return;
                        }
                        break false;
                    }
                }
            };
            reader.abort();
            if ended {
                // The events stream stopped (the server is stopping, or the log failed): try
                // again later rather than in a tight loop.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });
}

/// Offers one stored event to every loaded runbook's trigger.
async fn offer(domain: &Arc<Domain>, event: &Event) {
    // Events a runbook step emitted never trigger: a runbook that emits what it is
    // triggered by would otherwise start itself forever.
    if !domain.cluster.is_leader() || event.source.starts_with("runbook:") {
        return;
    }
    for runbook in domain.runbooks.all() {
        let Some(trigger) = &runbook.trigger else {
            continue;
        };
        if trigger.event != event.event_type.as_str()
            || !definition::filter_matches(&trigger.filter, event)
        {
            continue;
        }
        if let Err(e) = start_triggered(domain, &runbook, event).await {
            tracing::warn!(runbook = %runbook.name, event = %event.id, error = %e, "trigger did not start the runbook");
        }
    }
}

async fn start_triggered(domain: &Arc<Domain>, runbook: &Runbook, event: &Event) -> Result<()> {
    let trigger = runbook.trigger.as_ref().expect("checked by the caller");
    let running = domain
        .store
        .runbooks()
        .list_executions(&runbook.name, Some(ExecutionStatus::Running), 10_000)
        .await?
        .iter()
        .filter(|e| e.trigger_event_id.is_some())
        .count();
    if running >= trigger.concurrency as usize {
        return Err(Error::Conflict(format!(
            "{running} triggered executions already running (on.concurrency {})",
            trigger.concurrency
        )));
    }
    let values = definition::parameters(runbook, &BTreeMap::new())?;
    let id = crate::ids::ulid();
    let started_by = format!("trigger:{}", event.event_type);
    let (row, steps) = new_execution(&id, runbook, &values, &started_by, Some(event.id.clone()))?;
    if !domain
        .store
        .runbooks()
        .insert_execution(&row, &steps)
        .await?
    {
        return Ok(()); // Already started for this event.
    }
    let action = Action::new("runbook.execute", "runbook_execution", id.clone()).detail(
        json!({ "runbook": runbook.name, "trigger_event_id": event.id, "trigger": event.event_type.as_str() }),
    );
    domain
        .auditor
        .record(&Principal::server(), action, &Ok::<(), Error>(()))
        .await;
    spawn(domain.clone(), id);
    Ok(())
}
