//! `svcctl state check|apply|drift` across the fleet: send a compiled plan (see
//! `crate::state`) to the targeted agents and stream back each agent's per-resource outcomes.
//!
//! - check: a dry run; nothing is recorded.
//! - apply: audited (`state.apply`, one row); state_apply_started per agent when dispatched,
//!   then state_apply_succeeded or state_apply_failed; the plan an agent answered for is
//!   stored as its last applied state.
//! - drift: each agent's last applied plan is checked again on the host; what would change is
//!   drift (state_drift_detected). Commands without `unless`/`creates` would always "change",
//!   so they are never counted as drift.
//!
//! Every result is also stored (`history`), whether or not a client still reads them.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::content::{self, Applied};
use super::history::{self, Recorder};
use super::jobs::{self, Delivery, JobEvents};
use super::protocol::{Command, PlanRef, Reply, ReplyOutcome, Work};
use super::{JobStatus, Skip, Targets};
use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::events::EventKind;
use crate::secrets::at_rest;
use crate::state::{Mode, Outcome, Plan, Resource};
use crate::store::{AgentStateRow, PlanTable};
use crate::{clock, ids, Error, Result};

/// Package installs can be slow: a state run gets longer than an exec by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Check,
    Apply,
    Drift,
}

#[derive(Clone, Debug, Default)]
pub struct StateRequest {
    pub target: String,
    /// The compiled plan as JSON (`svcctl state compile -o json`); empty for drift.
    pub plan: String,
    pub timeout: Option<Duration>,
    pub concurrency: u32,
    /// Check: each file that would change comes with a unified diff.
    pub diff: bool,
}

/// One agent's answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentStateResult {
    pub agent_id: String,
    /// ok (nothing to change) | changed (apply: changed; check: would change) | drift |
    /// failed | timed_out | unreachable | skipped (quarantined) | no_state (drift: never applied)
    pub status: JobStatus,
    pub outcomes: Vec<Outcome>,
    /// Drift: the resources that differ from the last applied state.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<String>,
    pub duration_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A module run: the lines the module logged.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<String>,
}

/// A state run ready to go (a compiled plan, or a module that makes one on each host).
pub struct Job {
    pub job_id: String,
    operation: Operation,
    timeout: Duration,
    /// Per reachable agent: what it gets (`Work::State` or `Work::Module`).
    work: Vec<(String, Work)>,
    /// The plans that went out by reference (`Work::State::plan_ref`), by SHA-256.
    stored: HashMap<String, Plan>,
    /// Targets that get nothing, with the result to report for them.
    skipped: Vec<AgentStateResult>,
    concurrency: usize,
    by: String,
    /// As the history names it (state.apply, module.check, ...): set by `record`.
    kind: String,
}

/// Parses a compiled plan received over the wire and checks it as the agent would.
pub fn parse_plan(text: &str) -> Result<Plan> {
    let plan: Plan = serde_json::from_str(text).map_err(|e| {
        Error::Invalid(format!(
            "not a compiled state plan ({e}); compile the file with `svcctl state compile`"
        ))
    })?;
    crate::state::validate(&plan).map_err(Error::Invalid)?;
    Ok(plan)
}

pub async fn prepare(
    domain: &Domain,
    principal: &Principal,
    operation: Operation,
    request: StateRequest,
) -> Result<Job> {
    let job_id = ids::ulid();
    // Only an apply changes hosts (and is audited); check and drift only read them.
    let prepared = prepare_checked(domain, principal, operation, &request, &job_id);
    let result = match operation {
        Operation::Apply => {
            domain
                .auditor
                .gate(
                    principal,
                    Action::new("state.apply", "job", &job_id),
                    prepared,
                )
                .await
        }
        Operation::Check | Operation::Drift => prepared.await,
    };
    if operation == Operation::Apply {
        let mut detail = serde_json::json!({"target": request.target});
        if let Ok(job) = &result {
            detail["agents"] = serde_json::json!(job.work.len());
            detail["skipped"] = serde_json::json!(job.skipped.len());
            let resources = match job.work.first() {
                Some((_, work)) => job.plan_of(work).map_or(0, |plan| plan.resources.len()),
                None => 0,
            };
            detail["resources"] = serde_json::json!(resources);
        }
        domain
            .auditor
            .record(
                principal,
                Action::new("state.apply", "job", &job_id).detail(detail),
                &result,
            )
            .await;
    }
    result
}

async fn prepare_checked(
    domain: &Domain,
    principal: &Principal,
    operation: Operation,
    request: &StateRequest,
    job_id: &str,
) -> Result<Job> {
    principal.require(Role::Operator)?;
    let plan = match operation {
        Operation::Drift => None,
        _ => Some(parse_plan(&request.plan)?),
    };
    // A plan too large for its command goes to the file service first, once for all agents.
    let sent = match &plan {
        Some(plan) => Some(outgoing(domain, plan).await?),
        None => None,
    };
    let timeout = match request.timeout {
        None => DEFAULT_TIMEOUT,
        some => super::exec::check_timeout(some)?,
    };
    let targets = super::targets(domain, &request.target).await?;
    let (mut job, reachable) = Job::new(
        job_id,
        operation,
        timeout,
        targets,
        request.concurrency,
        principal,
    );
    let mode = operation.mode();
    for agent_id in reachable {
        let (plan, plan_ref) = match &sent {
            Some(sent) => sent.clone(),
            None => match last_applied(domain, &agent_id).await? {
                Some(Applied::Inline(plan)) => (plan, None),
                Some(Applied::Stored { plan_ref }) => {
                    if !job.stored.contains_key(&plan_ref.sha256) {
                        let plan = content::load_plan(&domain.files, &plan_ref).await?;
                        job.stored.insert(plan_ref.sha256.clone(), plan);
                    }
                    (Plan::default(), Some(plan_ref))
                }
                None => {
                    job.skipped.push(AgentStateResult {
                        agent_id,
                        status: JobStatus::NoState,
                        error: Some("no state has been applied to this agent yet".into()),
                        ..AgentStateResult::default()
                    });
                    continue;
                }
            },
        };
        let diff = request.diff && mode == Mode::Check;
        job.work.push((
            agent_id,
            Work::State {
                mode,
                plan,
                diff,
                plan_ref,
            },
        ));
    }
    let description = match &plan {
        Some(plan) => format!("{} resources", plan.resources.len()),
        None => "last applied state".into(),
    };
    if let (Some((_, Some(plan_ref))), Some(plan)) = (sent, plan) {
        job.stored.insert(plan_ref.sha256, plan);
    }
    let kind = match operation {
        Operation::Apply => "state.apply",
        Operation::Check => "state.check",
        Operation::Drift => "state.drift",
    };
    job.record(domain, kind, &request.target, description)
        .await?;
    Ok(job)
}

/// What a command carries for `plan`: the plan itself, or, past
/// [`content::inline_limit`], an empty plan and the reference to where it was stored.
async fn outgoing(domain: &Domain, plan: &Plan) -> Result<(Plan, Option<PlanRef>)> {
    let json = serde_json::to_vec(plan).map_err(Error::internal)?;
    let max_payload = domain.fleet.max_payload();
    if json.len() <= content::inline_limit(max_payload) {
        return Ok((plan.clone(), None));
    }
    let plan_ref = content::store_plan(&domain.files, &json, max_payload).await?;
    content::check_reference(&plan_ref, max_payload)?;
    Ok((Plan::default(), Some(plan_ref)))
}

impl Operation {
    /// What the agent does: only an apply changes the host.
    pub(super) fn mode(self) -> Mode {
        match self {
            Operation::Apply => Mode::Apply,
            Operation::Check | Operation::Drift => Mode::Check,
        }
    }
}

async fn last_applied(domain: &Domain, agent_id: &str) -> Result<Option<Applied>> {
    let Some(row) = domain.store.fleet().get_agent_state(agent_id).await? else {
        return Ok(None);
    };
    let context = at_rest::plan_context(PlanTable::AgentStates, agent_id);
    let plan = at_rest::open(at_rest::key(domain).await?, &context, &row.plan)?;
    serde_json::from_str(&plan)
        .map(Some)
        .map_err(|e| Error::Internal(format!("stored plan of agent {agent_id}: {e}")))
}

impl Job {
    /// A job with no work yet, the targets that get none already answered for; returns the
    /// reachable agents for the caller to give work to (`work`).
    pub(super) fn new(
        job_id: &str,
        operation: Operation,
        timeout: Duration,
        targets: Targets,
        concurrency: u32,
        principal: &Principal,
    ) -> (Job, Vec<String>) {
        let Targets { reachable, skipped } = targets;
        let job = Job {
            job_id: job_id.to_string(),
            operation,
            timeout,
            work: Vec::with_capacity(reachable.len()),
            stored: HashMap::new(),
            skipped: skipped
                .into_iter()
                .map(|(agent_id, skip)| AgentStateResult {
                    agent_id,
                    status: match skip {
                        Skip::Quarantined => JobStatus::Skipped,
                        Skip::NotConnected { .. } => JobStatus::Unreachable,
                    },
                    error: Some(skip.message()),
                    ..AgentStateResult::default()
                })
                .collect(),
            concurrency: concurrency as usize,
            by: principal.name.clone(),
            kind: String::new(),
        };
        (job, reachable)
    }

    /// Gives `agent_id` its work.
    pub(super) fn add(&mut self, agent_id: String, work: Work) {
        self.work.push((agent_id, work));
    }

    /// How many agents get work.
    pub(super) fn agents(&self) -> usize {
        self.work.len()
    }

    /// Targeted agents, skipped ones included: each gets one result.
    pub fn targeted(&self) -> usize {
        self.work.len() + self.skipped.len()
    }

    /// Stores the job's row in the history (`kind` and `description` as `job list` shows
    /// them), once its agents and their work are known.
    pub(super) async fn record(
        &mut self,
        domain: &Domain,
        kind: &str,
        target: &str,
        description: String,
    ) -> Result<()> {
        self.kind = kind.to_string();
        history::create(
            domain,
            history::NewJob {
                id: &self.job_id,
                kind,
                target,
                description,
                by: &self.by,
                agents: self.targeted(),
                working: self.work.len(),
                timeout: self.timeout,
                concurrency: self.concurrency,
            },
        )
        .await
    }

    /// Skipped agents first, then results as they arrive, to `out` while it is open and to
    /// the store in any case. Ends when all are in.
    pub async fn run(self, domain: &Domain, out: mpsc::Sender<AgentStateResult>) {
        let events = JobEvents::start(domain, &self.job_id, &self.kind, self.targeted(), &self.by);
        let recorder = Recorder::start(domain, &self.job_id);
        for result in &self.skipped {
            if self.operation == Operation::Apply && result.status == JobStatus::Unreachable {
                events.notable(
                    EventKind::StateApplyFailed,
                    &result.agent_id,
                    serde_json::json!({"job_id": self.job_id, "error": result.error}),
                );
            }
            recorder.add(&result.agent_id, result.status, result).await;
            let _ = out.send(result.clone()).await;
        }
        let agents: Vec<(String, Command)> = self
            .work
            .iter()
            .map(|(agent_id, work)| {
                let command = Command {
                    job_id: self.job_id.clone(),
                    timeout_ms: self.timeout.as_millis() as u64,
                    agent_id: String::new(),
                    issued_at_ms: 0,
                    work: work.clone(),
                };
                (agent_id.clone(), command)
            })
            .collect();
        let work: HashMap<&str, &Work> = self.work.iter().map(|(id, w)| (id.as_str(), w)).collect();
        let (sender, mut deliveries) = mpsc::channel(256);
        let dispatch = jobs::run(
            &domain.fleet,
            &self.job_id,
            self.timeout,
            jobs::Outgoing {
                commands: agents,
                signer: crate::identity::command_signer(domain)
                    .await
                    .map_err(|e| e.to_string()),
            },
            self.concurrency,
            |agent| {
                if self.operation == Operation::Apply {
                    events.routine(
                        EventKind::StateApplyStarted,
                        agent,
                        || serde_json::json!({"job_id": self.job_id, "by": self.by}),
                    );
                }
            },
            sender,
        );
        let collect = async {
            while let Some((agent_id, delivery)) = deliveries.recv().await {
                let sent = work.get(agent_id.as_str()).copied();
                let applied = match (&delivery, self.operation) {
                    (Delivery::Answered(reply), Operation::Apply) => applied_plan(sent, reply),
                    _ => None,
                };
                let plan = sent.and_then(|work| self.plan_of(work));
                let result = self.result(agent_id, delivery, plan);
                if let Some(applied) = applied {
                    self.remember(domain, &result.agent_id, applied).await;
                }
                self.emit_events(&events, &result);
                recorder.add(&result.agent_id, result.status, &result).await;
                // A client that went away stops reading, not the job.
                let _ = out.send(result).await;
            }
        };
        let (dispatched, ()) = tokio::join!(dispatch, collect);
        if let Err(e) = dispatched {
            tracing::warn!(job_id = %self.job_id, error = %e, "state dispatch failed");
        }
        events.finish(recorder.finish().await).await;
    }

    fn result(
        &self,
        agent_id: String,
        delivery: Delivery,
        plan: Option<&Plan>,
    ) -> AgentStateResult {
        let mut result = AgentStateResult {
            agent_id,
            ..AgentStateResult::default()
        };
        let outcome = match delivery {
            Delivery::Answered(reply) => {
                result.duration_ms = reply.duration_ms;
                match reply.outcome {
                    ReplyOutcome::State(outcome) => outcome,
                    ReplyOutcome::Exec(_) => {
                        result.status = JobStatus::Failed;
                        result.error = Some("the agent answered with an exec result".into());
                        return result;
                    }
                }
            }
            Delivery::NoAnswer => {
                result.status = JobStatus::TimedOut;
                result.error = Some("no answer from the agent before the timeout".into());
                return result;
            }
            Delivery::NotSent(error) => {
                result.status = JobStatus::Unreachable;
                result.error = Some(format!("command not sent: {error}"));
                return result;
            }
        };
        result.error = outcome.error;
        result.logs = outcome.logs;
        if self.operation == Operation::Drift {
            if let Some(plan) = plan {
                result.drift = drifted(plan, &outcome.outcomes);
            }
        }
        let any_error = outcome.outcomes.iter().any(|o| o.error.is_some());
        let any_change = outcome.outcomes.iter().any(|o| o.changed);
        result.outcomes = outcome.outcomes;
        result.status = if outcome.timed_out {
            JobStatus::TimedOut
        } else if any_error || result.error.is_some() {
            JobStatus::Failed
        } else if self.operation == Operation::Drift {
            if result.drift.is_empty() {
                JobStatus::Ok
            } else {
                JobStatus::Drift
            }
        } else if any_change {
            JobStatus::Changed
        } else {
            JobStatus::Ok
        };
        result
    }

    /// The plan a state command stands for (the stored one for a command that names it).
    fn plan_of<'a>(&'a self, work: &'a Work) -> Option<&'a Plan> {
        match work {
            Work::State {
                plan_ref: Some(plan_ref),
                ..
            } => self.stored.get(&plan_ref.sha256),
            Work::State { plan, .. } => Some(plan),
            Work::Module { .. } | Work::Exec { .. } | Work::CommandKeys { .. } => None,
        }
    }

    /// Stores the plan as the agent's last applied state (what drift compares against),
    /// sealed: it holds what secret values rendered into (`secrets::at_rest`).
    async fn remember(&self, domain: &Domain, agent_id: &str, plan: String) {
        let context = at_rest::plan_context(PlanTable::AgentStates, agent_id);
        let plan = match at_rest::key(domain).await {
            Ok(key) => at_rest::seal(key, &context, &plan),
            Err(e) => {
                tracing::error!(agent_id, error = %e, "applied state not recorded");
                return;
            }
        };
        let row = AgentStateRow {
            agent_id: agent_id.to_string(),
            plan,
            job_id: self.job_id.clone(),
            applied_by: self.by.clone(),
            applied_at: clock::now_rfc3339(),
        };
        if let Err(e) = domain.store.fleet().put_agent_state(&row).await {
            tracing::error!(agent_id, error = %e, "applied state not recorded");
        }
    }

    fn emit_events(&self, events: &JobEvents, result: &AgentStateResult) {
        let changed: Vec<&str> = result
            .outcomes
            .iter()
            .filter(|o| o.changed)
            .map(|o| o.resource.as_str())
            .collect();
        let failed: Vec<&str> = result
            .outcomes
            .iter()
            .filter(|o| o.error.is_some())
            .map(|o| o.resource.as_str())
            .collect();
        match self.operation {
            Operation::Apply => {
                let payload = || {
                    serde_json::json!({
                        "job_id": self.job_id, "changed": changed, "failed": failed,
                        "duration_ms": result.duration_ms, "error": result.error,
                    })
                };
                match result.status {
                    JobStatus::Ok | JobStatus::Changed => {
                        events.routine(EventKind::StateApplySucceeded, &result.agent_id, payload)
                    }
                    _ => events.notable(EventKind::StateApplyFailed, &result.agent_id, payload()),
                }
            }
            Operation::Drift if !result.drift.is_empty() => {
                let payload = serde_json::json!({"job_id": self.job_id, "resources": result.drift});
                events.notable(EventKind::StateDriftDetected, &result.agent_id, payload);
            }
            _ => {}
        }
    }
}

/// The plan an agent answered an apply for, as JSON: the one sent, or the resources a module
/// returned (None when the answer had to leave them out to fit in a bus message).
fn applied_plan(sent: Option<&Work>, reply: &Reply) -> Option<String> {
    let applied = match (sent?, &reply.outcome) {
        (
            Work::State {
                plan_ref: Some(plan_ref),
                ..
            },
            _,
        ) => Applied::Stored {
            plan_ref: plan_ref.clone(),
        },
        (Work::State { plan, .. }, _) => Applied::Inline(plan.clone()),
        (Work::Module { .. }, ReplyOutcome::State(outcome)) if !outcome.resources.is_empty() => {
            Applied::Inline(Plan::of(outcome.resources.clone()))
        }
        _ => return None,
    };
    serde_json::to_string(&applied).ok()
}

/// The resources of `plan` whose check says they would change, leaving out commands that
/// have no guard (they always would).
fn drifted(plan: &Plan, outcomes: &[Outcome]) -> Vec<String> {
    plan.resources
        .iter()
        .zip(outcomes)
        .filter(|(resource, outcome)| {
            // Restarted and reloaded services act on every run that reaches them.
            let unguarded = match resource {
                Resource::Command(c) => c.unless.is_none() && c.creates.is_none(),
                Resource::Service(s) => s.state.is_some_and(|state| state.is_action()),
                _ => false,
            };
            outcome.changed && !unguarded
        })
        .map(|(_, outcome)| outcome.resource.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{CommandResource, FileResource};

    #[test]
    fn unguarded_commands_are_not_drift() {
        let plan = Plan {
            resources: vec![
                Resource::File(FileResource {
                    path: "/a".into(),
                    ..Default::default()
                }),
                Resource::Command(CommandResource {
                    run: "true".into(),
                    ..Default::default()
                }),
                Resource::Command(CommandResource {
                    run: "make".into(),
                    creates: Some("/b".into()),
                    ..Default::default()
                }),
            ],
            ..Plan::default()
        };
        let changed = |resource: &str| Outcome {
            resource: resource.into(),
            changed: true,
            ..Outcome::default()
        };
        let outcomes = vec![
            changed("file:/a"),
            changed("command:true"),
            changed("command:make"),
        ];
        assert_eq!(drifted(&plan, &outcomes), ["file:/a", "command:make"]);
    }

    #[test]
    fn plans_must_be_compiled_json() {
        assert!(matches!(parse_plan("- file: {}"), Err(Error::Invalid(_))));
    }
}
