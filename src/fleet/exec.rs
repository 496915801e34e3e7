//! `svcctl exec`: run a program on the targeted agents and stream back each one's exit code,
//! output and duration as it arrives.
//!
//! `prepare` does everything that can refuse the request (role, arguments, targets) and
//! writes the one audit row; the transport then spawns `Job::run`, which streams results.
//! Every result is also stored (`history`), whether or not a client still reads them.
//! Events: job_started and job_finished (source: the job id); per agent, with its id as
//! source, command_dispatched when its command goes out, then command_completed (exit 0) or
//! command_failed (non-zero, timeout, no answer, not connected). Past `jobs.per_agent_events`
//! targets only the failures are emitted per agent ([`JobEvents`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::history::{self, Recorder};
use super::jobs::{self, Delivery, JobEvents};
use super::protocol::{Command, ExecOutcome, ReplyOutcome, Work};
use super::{JobStatus, Skip, Targets};
use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::events::EventKind;
use crate::{ids, Error, Result};

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Longest command line accepted (all arguments together).
const MAX_ARGV_BYTES: usize = 64 * 1024;

#[derive(Clone, Debug, Default)]
pub struct ExecRequest {
    pub target: String,
    pub argv: Vec<String>,
    /// None: DEFAULT_TIMEOUT.
    pub timeout: Option<Duration>,
    /// Agents working at once; 0 = all.
    pub concurrency: u32,
}

/// One agent's result.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentResult {
    pub agent_id: String,
    /// ok | failed | timed_out | unreachable | skipped (quarantined)
    pub status: JobStatus,
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    pub truncated: bool,
    pub duration_ms: u64,
    pub timed_out: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An exec ready to run: targets resolved, audit row written.
pub struct Job {
    pub job_id: String,
    command: Command,
    targets: Targets,
    concurrency: usize,
    by: String,
}

/// Checks and records an exec request.
pub async fn prepare(domain: &Domain, principal: &Principal, request: ExecRequest) -> Result<Job> {
    let job_id = ids::ulid();
    let started = std::time::Instant::now();
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("exec.run", "job", &job_id),
            prepare_checked(domain, principal, &request, &job_id),
        )
        .await;
    let mut detail = serde_json::json!({
        "target": request.target, "argv": request.argv,
    });
    if let Ok(job) = &result {
        detail["agents"] = serde_json::json!(job.targets.reachable.len());
        detail["skipped"] = serde_json::json!(job.targets.skipped.len());
    }
    let gated = started.elapsed();
    domain
        .auditor
        .record(
            principal,
            Action::new("exec.run", "job", &job_id).detail(detail),
            &result,
        )
        .await;
    // Where a large fan-out's start goes, for `log_level: svc::fleet=debug`.
    tracing::debug!(%job_id, gated_ms = gated.as_millis() as u64, recorded_ms = started.elapsed().as_millis() as u64, "exec prepared");
    result
}

async fn prepare_checked(
    domain: &Domain,
    principal: &Principal,
    request: &ExecRequest,
    job_id: &str,
) -> Result<Job> {
    principal.require(Role::Operator)?;
    if request
        .argv
        .first()
        .is_none_or(|program| program.is_empty())
    {
        return Err(Error::Invalid(
            "no command given (svcctl exec -- CMD ARGS...)".into(),
        ));
    }
    if request.argv.iter().map(String::len).sum::<usize>() > MAX_ARGV_BYTES {
        return Err(Error::TooLarge(format!(
            "the command line is longer than {MAX_ARGV_BYTES} bytes"
        )));
    }
    let timeout = check_timeout(request.timeout)?;
    let started = std::time::Instant::now();
    let targets = super::targets(domain, &request.target).await?;
    let resolved = started.elapsed();
    history::create(
        domain,
        history::NewJob {
            id: job_id,
            kind: "exec",
            target: &request.target,
            description: command_line(&request.argv),
            by: &principal.name,
            agents: targets.reachable.len() + targets.skipped.len(),
            working: targets.reachable.len(),
            timeout,
            concurrency: request.concurrency as usize,
        },
    )
    .await?;
    tracing::debug!(
        job_id,
        agents = targets.reachable.len(),
        targets_ms = resolved.as_millis() as u64,
        history_ms = (started.elapsed() - resolved).as_millis() as u64,
        "exec targets resolved"
    );
    Ok(Job {
        job_id: job_id.to_string(),
        command: Command {
            job_id: job_id.to_string(),
            timeout_ms: timeout.as_millis() as u64,
            agent_id: String::new(),
            issued_at_ms: 0,
            work: Work::Exec {
                argv: request.argv.clone(),
            },
        },
        targets,
        concurrency: request.concurrency as usize,
        by: principal.name.clone(),
    })
}

/// A timeout within (0, 24h]; None gives the default.
pub fn check_timeout(timeout: Option<Duration>) -> Result<Duration> {
    match timeout {
        None => Ok(DEFAULT_TIMEOUT),
        Some(t) if t.is_zero() || t > MAX_TIMEOUT => Err(Error::Invalid(
            "timeout must be more than 0 and at most 24h".into(),
        )),
        Some(t) => Ok(t),
    }
}

/// The command line for events: arguments joined, cut at 512 characters.
fn command_line(argv: &[String]) -> String {
    let line = argv.join(" ");
    match line.char_indices().nth(512) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

impl Job {
    /// Targeted agents, skipped ones included: each gets one result.
    pub fn agents(&self) -> usize {
        self.targets.reachable.len() + self.targets.skipped.len()
    }

    /// Skipped agents first, then results as they arrive, to `out` while it is open and to
    /// the store in any case. Ends when all are in.
    pub async fn run(self, domain: &Domain, out: mpsc::Sender<AgentResult>) {
        let Work::Exec { argv } = &self.command.work else {
            return;
        };
        let line = command_line(argv);
        let events = JobEvents::start(domain, &self.job_id, "exec", self.agents(), &self.by);
        let recorder = Recorder::start(domain, &self.job_id);
        for (agent_id, skip) in &self.targets.skipped {
            let result = AgentResult {
                agent_id: agent_id.clone(),
                status: match skip {
                    Skip::Quarantined => JobStatus::Skipped,
                    Skip::NotConnected { .. } => JobStatus::Unreachable,
                },
                exit_code: -1,
                error: Some(skip.message()),
                ..AgentResult::default()
            };
            if result.status == JobStatus::Unreachable {
                events.notable(
                    EventKind::CommandFailed,
                    agent_id,
                    self.event_payload(&line, &result),
                );
            }
            recorder.add(agent_id, result.status, &result).await;
            let _ = out.send(result).await;
        }
        let agents = self
            .targets
            .reachable
            .iter()
            .map(|id| (id.clone(), self.command.clone()))
            .collect();
        let started = std::time::Instant::now();
        let signer = crate::identity::command_signer(domain)
            .await
            .map_err(|e| e.to_string());
        tracing::debug!(job_id = %self.job_id, signer_ms = started.elapsed().as_millis() as u64, "exec dispatching");
        let (sender, mut deliveries) = mpsc::channel(256);
        let dispatch =
            jobs::run(
                &domain.fleet,
                &self.job_id,
                Duration::from_millis(self.command.timeout_ms),
                jobs::Outgoing {
                    commands: agents,
                    signer,
                },
                self.concurrency,
                |agent| {
                    events.routine(EventKind::CommandDispatched, agent, || {
                    serde_json::json!({"job_id": self.job_id, "command": line, "by": self.by})
                });
                },
                sender,
            );
        let collect = async {
            while let Some((agent_id, delivery)) = deliveries.recv().await {
                let result = agent_result(agent_id, delivery);
                let payload = || self.event_payload(&line, &result);
                if result.status == JobStatus::Ok {
                    events.routine(EventKind::CommandCompleted, &result.agent_id, payload);
                } else {
                    events.notable(EventKind::CommandFailed, &result.agent_id, payload());
                }
                recorder.add(&result.agent_id, result.status, &result).await;
                // A client that went away stops reading, not the job.
                let _ = out.send(result).await;
            }
        };
        let (dispatched, ()) = tokio::join!(dispatch, collect);
        if let Err(e) = dispatched {
            tracing::warn!(job_id = %self.job_id, error = %e, "exec dispatch failed");
        }
        events.finish(recorder.finish().await).await;
    }

    fn event_payload(&self, line: &str, result: &AgentResult) -> serde_json::Value {
        serde_json::json!({
            "job_id": self.job_id, "command": line, "exit_code": result.exit_code,
            "duration_ms": result.duration_ms, "timed_out": result.timed_out,
            "error": result.error,
        })
    }
}

fn agent_result(agent_id: String, delivery: Delivery) -> AgentResult {
    match delivery {
        Delivery::Answered(reply) => match reply.outcome {
            ReplyOutcome::Exec(outcome) => from_outcome(agent_id, reply.duration_ms, outcome),
            ReplyOutcome::State(_) => AgentResult {
                agent_id,
                status: JobStatus::Failed,
                exit_code: -1,
                error: Some("the agent answered with a state result".into()),
                ..AgentResult::default()
            },
        },
        Delivery::NoAnswer => AgentResult {
            agent_id,
            status: JobStatus::TimedOut,
            exit_code: -1,
            timed_out: true,
            error: Some("no answer from the agent before the timeout".into()),
            ..AgentResult::default()
        },
        Delivery::NotSent(error) => AgentResult {
            agent_id,
            status: JobStatus::Unreachable,
            exit_code: -1,
            error: Some(format!("command not sent: {error}")),
            ..AgentResult::default()
        },
    }
}

fn from_outcome(agent_id: String, duration_ms: u64, outcome: ExecOutcome) -> AgentResult {
    let status = if outcome.timed_out {
        JobStatus::TimedOut
    } else if outcome.error.is_none() && outcome.exit_code == 0 {
        JobStatus::Ok
    } else {
        JobStatus::Failed
    };
    AgentResult {
        agent_id,
        status,
        exit_code: outcome.exit_code,
        stdout: outcome.stdout,
        stderr: outcome.stderr,
        truncated: outcome.truncated,
        duration_ms,
        timed_out: outcome.timed_out,
        error: outcome.error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_and_command_lines() {
        assert_eq!(check_timeout(None).unwrap(), DEFAULT_TIMEOUT);
        assert!(check_timeout(Some(Duration::ZERO)).is_err());
        assert!(check_timeout(Some(Duration::from_secs(90_000))).is_err());
        assert_eq!(command_line(&["ls".into(), "-l".into()]), "ls -l");
        let long = vec!["é".repeat(600)];
        assert_eq!(command_line(&long).chars().count(), 513);
    }

    #[test]
    fn statuses() {
        let ok = from_outcome("a".into(), 1, ExecOutcome::default());
        assert_eq!(ok.status, JobStatus::Ok);
        let failed = from_outcome(
            "a".into(),
            1,
            ExecOutcome {
                exit_code: 2,
                ..Default::default()
            },
        );
        assert_eq!(failed.status, JobStatus::Failed);
        let timed_out = from_outcome(
            "a".into(),
            1,
            ExecOutcome {
                exit_code: -1,
                timed_out: true,
                ..Default::default()
            },
        );
        assert_eq!(timed_out.status, JobStatus::TimedOut);
        assert_eq!(
            agent_result("a".into(), Delivery::NoAnswer).status,
            JobStatus::TimedOut
        );
    }
}
