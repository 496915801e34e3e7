//! FleetService: agents, exec and state (contract §10). Thin: unpack, call the fleet domain
//! with the caller's principal, pack. Exec and state jobs run in a task of their own that
//! feeds the response stream and stores every result; a client that goes away ends the
//! stream, not the job (ExecAsync and StateApplyAsync watch no stream at all).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::principal;
use crate::fleet::exec::{AgentResult, ExecRequest};
use crate::fleet::history::{self, JobView};
use crate::fleet::module::ModuleRequest;
use crate::fleet::state::{AgentStateResult, Operation, StateRequest};
use crate::fleet::{self, AgentView};
use crate::proto;
use crate::server::Context;

pub struct Fleet {
    pub context: Arc<Context>,
}

impl From<AgentView> for proto::Agent {
    fn from(agent: AgentView) -> Self {
        proto::Agent {
            id: agent.id,
            labels: agent.labels.into_iter().collect(),
            state: agent.state.to_string(),
            quarantined: agent.quarantined,
            quarantine_reason: agent.quarantine_reason.unwrap_or_default(),
            last_heartbeat_at: agent.last_heartbeat_at.unwrap_or_default(),
            enrolled_at: agent.enrolled_at,
            fingerprint: agent.fingerprint,
            quarantined_at: agent.quarantined_at.unwrap_or_default(),
            hostname: agent.hostname,
            version: agent.version,
            facts_json: serde_json::to_string(&agent.facts).unwrap_or_else(|_| "{}".into()),
        }
    }
}

impl From<JobView> for proto::Job {
    fn from(job: JobView) -> Self {
        proto::Job {
            id: job.id,
            kind: job.kind,
            target: job.target,
            description: job.description,
            created_by: job.created_by,
            created_at: job.created_at,
            finished_at: job.finished_at.unwrap_or_default(),
            status: job.status.to_string(),
            agents: job.agents as u32,
            counts: job.counts.into_iter().collect(),
        }
    }
}

/// Results one GetJob reads from the store at a time.
const JOB_PAGE: usize = 500;

fn exec_result(job_id: &str, result: AgentResult) -> proto::ExecResult {
    proto::ExecResult {
        agent_id: result.agent_id,
        exit_code: result.exit_code,
        stdout: result.stdout.into_bytes(),
        stderr: result.stderr.into_bytes(),
        duration_ms: result.duration_ms,
        timed_out: result.timed_out,
        error: result.error.unwrap_or_default(),
        status: result.status.to_string(),
        truncated: result.truncated,
        job_id: job_id.to_string(),
        agents: 0,
    }
}

pub(super) fn state_result(job_id: &str, result: AgentStateResult) -> proto::StateResult {
    proto::StateResult {
        agent_id: result.agent_id,
        status: result.status.to_string(),
        outcomes: result
            .outcomes
            .into_iter()
            .map(|o| proto::ResourceOutcome {
                resource: o.resource,
                changed: o.changed,
                detail: o.detail,
                error: o.error.unwrap_or_default(),
                diff: o.diff.unwrap_or_default(),
            })
            .collect(),
        drift: result.drift,
        duration_ms: result.duration_ms,
        error: result.error.unwrap_or_default(),
        job_id: job_id.to_string(),
        logs: result.logs,
        agents: 0,
    }
}

pub(super) fn timeout(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// A response stream fed by `relayed` (`super::relay`), each item mapped with `map`.
pub(super) fn stream_of<T: Send + 'static, M: Send + 'static>(
    relayed: tokio_stream::wrappers::ReceiverStream<T>,
    map: impl Fn(T) -> M + Send + 'static,
) -> BoxStream<M> {
    use tokio_stream::StreamExt;
    Box::pin(relayed.map(move |item| Ok(map(item))))
}

impl Fleet {
    async fn state(
        &self,
        request: Request<proto::StateRequest>,
        operation: Operation,
    ) -> Result<Response<BoxStream<proto::StateResult>>, Status> {
        let caller = principal(&request)?;
        let connection = super::connection(&request);
        let request = request.into_inner();
        let job = fleet::state::prepare(
            &self.context.domain,
            &caller,
            operation,
            StateRequest {
                target: request.target,
                plan: request.plan,
                timeout: timeout(request.timeout_ms),
                concurrency: request.concurrency,
                diff: request.diff,
            },
        )
        .await?;
        Ok(self.stream_state(job, connection))
    }

    /// Runs a state job in a task of its own, its results streamed as they come.
    fn stream_state(
        &self,
        job: fleet::state::Job,
        connection: Option<crate::server::tls::Connection>,
    ) -> Response<BoxStream<proto::StateResult>> {
        let job_id = job.job_id.clone();
        let agents = job.targeted() as u32;
        let (sender, receiver) = mpsc::channel(64);
        let context = self.context.clone();
        tokio::spawn(async move { job.run(&context.domain, sender).await });
        let relayed = super::relay(&self.context, connection, "State", receiver);
        Response::new(stream_of(relayed, move |result| proto::StateResult {
            agents,
            ..state_result(&job_id, result)
        }))
    }

    fn exec_request(request: proto::ExecRequest) -> ExecRequest {
        ExecRequest {
            target: request.target,
            argv: request.argv,
            timeout: timeout(request.timeout_ms),
            concurrency: request.concurrency,
        }
    }

    /// Runs a job with no one reading its results but the store: the job id goes back at
    /// once.
    fn detach<F>(&self, job_id: String, agents: usize, run: F) -> Response<proto::JobStarted>
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        tokio::spawn(run);
        Response::new(proto::JobStarted {
            job_id,
            agents: agents as u32,
        })
    }
}

#[tonic::async_trait]
impl proto::fleet_service_server::FleetService for Fleet {
    async fn list_agents(
        &self,
        request: Request<proto::ListAgentsRequest>,
    ) -> Result<Response<proto::ListAgentsResponse>, Status> {
        let caller = principal(&request)?;
        let request = request.into_inner();
        let query = fleet::ListQuery {
            target: request.target,
            states: fleet::parse_states(&request.state)?,
            cursor: request.cursor,
            limit: request.limit as usize,
        };
        let page = fleet::list(&self.context.domain, &caller, &query).await?;
        Ok(Response::new(proto::ListAgentsResponse {
            agents: page.agents.into_iter().map(Into::into).collect(),
            next_cursor: page.next_cursor.unwrap_or_default(),
        }))
    }

    async fn get_agent(
        &self,
        request: Request<proto::AgentRequest>,
    ) -> Result<Response<proto::Agent>, Status> {
        let caller = principal(&request)?;
        let agent = fleet::get(&self.context.domain, &caller, &request.get_ref().id).await?;
        Ok(Response::new(agent.into()))
    }

    async fn quarantine(
        &self,
        request: Request<proto::QuarantineRequest>,
    ) -> Result<Response<proto::Agent>, Status> {
        let caller = principal(&request)?;
        let request = request.into_inner();
        let agent =
            fleet::quarantine(&self.context.domain, &caller, &request.id, &request.reason).await?;
        Ok(Response::new(agent.into()))
    }

    async fn unquarantine(
        &self,
        request: Request<proto::AgentRequest>,
    ) -> Result<Response<proto::Agent>, Status> {
        let caller = principal(&request)?;
        let agent =
            fleet::unquarantine(&self.context.domain, &caller, &request.get_ref().id).await?;
        Ok(Response::new(agent.into()))
    }

    async fn set_labels(
        &self,
        request: Request<proto::SetLabelsRequest>,
    ) -> Result<Response<proto::Agent>, Status> {
        let caller = principal(&request)?;
        let request = request.into_inner();
        let set = request.set.into_iter().collect();
        let agent = fleet::set_labels(
            &self.context.domain,
            &caller,
            &request.id,
            &set,
            &request.remove,
        )
        .await?;
        Ok(Response::new(agent.into()))
    }

    async fn exec(
        &self,
        request: Request<proto::ExecRequest>,
    ) -> Result<Response<BoxStream<proto::ExecResult>>, Status> {
        let caller = principal(&request)?;
        let connection = super::connection(&request);
        let job = fleet::exec::prepare(
            &self.context.domain,
            &caller,
            Self::exec_request(request.into_inner()),
        )
        .await?;
        let job_id = job.job_id.clone();
        let agents = job.agents() as u32;
        let (sender, receiver) = mpsc::channel(256);
        let context = self.context.clone();
        tokio::spawn(async move { job.run(&context.domain, sender).await });
        let relayed = super::relay(&self.context, connection, "Exec", receiver);
        Ok(Response::new(stream_of(relayed, move |result| {
            proto::ExecResult {
                agents,
                ..exec_result(&job_id, result)
            }
        })))
    }

    async fn exec_async(
        &self,
        request: Request<proto::ExecRequest>,
    ) -> Result<Response<proto::JobStarted>, Status> {
        let caller = principal(&request)?;
        let domain = &self.context.domain;
        let job =
            fleet::exec::prepare(domain, &caller, Self::exec_request(request.into_inner())).await?;
        let (job_id, agents) = (job.job_id.clone(), job.agents());
        // The results' channel is closed from the start: the job stores them only.
        let (sender, _) = mpsc::channel(1);
        let context = self.context.clone();
        Ok(self.detach(job_id, agents, async move {
            job.run(&context.domain, sender).await
        }))
    }

    async fn state_apply_async(
        &self,
        request: Request<proto::StateRequest>,
    ) -> Result<Response<proto::JobStarted>, Status> {
        let caller = principal(&request)?;
        let request = request.into_inner();
        let job = fleet::state::prepare(
            &self.context.domain,
            &caller,
            Operation::Apply,
            StateRequest {
                target: request.target,
                plan: request.plan,
                timeout: timeout(request.timeout_ms),
                concurrency: request.concurrency,
                diff: false,
            },
        )
        .await?;
        let (job_id, agents) = (job.job_id.clone(), job.targeted());
        let (sender, _) = mpsc::channel(1);
        let context = self.context.clone();
        Ok(self.detach(job_id, agents, async move {
            job.run(&context.domain, sender).await
        }))
    }

    async fn list_jobs(
        &self,
        request: Request<proto::ListJobsRequest>,
    ) -> Result<Response<proto::ListJobsResponse>, Status> {
        let caller = principal(&request)?;
        let request = request.into_inner();
        let limit = match request.limit {
            0 => 50,
            n => n as usize,
        };
        let before = Some(request.before.as_str()).filter(|b| !b.is_empty());
        let jobs = history::list(&self.context.domain, &caller, before, limit).await?;
        Ok(Response::new(proto::ListJobsResponse {
            jobs: jobs.into_iter().map(Into::into).collect(),
        }))
    }

    async fn get_job(
        &self,
        request: Request<proto::JobRequest>,
    ) -> Result<Response<BoxStream<proto::JobPart>>, Status> {
        use proto::job_part::Part;
        let caller = principal(&request)?;
        let connection = super::connection(&request);
        let id = request.into_inner().id;
        let job = history::get(&self.context.domain, &caller, &id).await?;
        let is_exec = job.kind == "exec";
        let (sender, receiver) = mpsc::channel(64);
        let context = self.context.clone();
        tokio::spawn(async move {
            let agents = job.agents as u32;
            if sender.send(Part::Job(job.into())).await.is_err() {
                return;
            }
            let mut after = String::new();
            loop {
                let page = match history::results(&context.domain, &id, &after, JOB_PAGE).await {
                    Ok(page) => page,
                    Err(e) => {
                        tracing::warn!(job_id = %id, error = %e, "job results not read");
                        return;
                    }
                };
                let Some(last) = page.last() else { return };
                after = last.agent_id.clone();
                let full = page.len() == JOB_PAGE;
                for row in &page {
                    let part = if is_exec {
                        Part::Exec(proto::ExecResult {
                            agents,
                            ..exec_result(&id, history::parse(row))
                        })
                    } else {
                        Part::State(proto::StateResult {
                            agents,
                            ..state_result(&id, history::parse(row))
                        })
                    };
                    if sender.send(part).await.is_err() {
                        return;
                    }
                }
                if !full {
                    return;
                }
            }
        });
        let relayed = super::relay(&self.context, connection, "GetJob", receiver);
        Ok(Response::new(stream_of(relayed, |part| proto::JobPart {
            part: Some(part),
        })))
    }

    async fn state_check(
        &self,
        request: Request<proto::StateRequest>,
    ) -> Result<Response<BoxStream<proto::StateResult>>, Status> {
        self.state(request, Operation::Check).await
    }

    async fn state_apply(
        &self,
        request: Request<proto::StateRequest>,
    ) -> Result<Response<BoxStream<proto::StateResult>>, Status> {
        self.state(request, Operation::Apply).await
    }

    async fn state_drift(
        &self,
        request: Request<proto::StateRequest>,
    ) -> Result<Response<BoxStream<proto::StateResult>>, Status> {
        self.state(request, Operation::Drift).await
    }

    async fn module_run(
        &self,
        request: Request<proto::ModuleRunRequest>,
    ) -> Result<Response<BoxStream<proto::StateResult>>, Status> {
        let caller = principal(&request)?;
        let connection = super::connection(&request);
        let request = request.into_inner();
        let zip = |m: proto::ModuleZip| (m.zip, Some(m.signature).filter(|s| !s.is_empty()));
        // No module is an empty ZIP, refused by the domain after the role check.
        let (module, signature) = zip(request.module.unwrap_or_default());
        let job = fleet::module::prepare(
            &self.context.domain,
            &caller,
            ModuleRequest {
                target: request.target,
                zip: module,
                signature,
                dependencies: request.dependencies.into_iter().map(zip).collect(),
                function: request.function,
                args: request.args,
                check: request.check,
                timeout: timeout(request.timeout_ms),
                concurrency: request.concurrency,
                max_steps: request.max_steps,
                max_memory: request.max_memory,
            },
        )
        .await?;
        Ok(self.stream_state(job, connection))
    }
}
