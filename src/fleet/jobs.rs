//! One command to many agents: publish on each `svc.agent.<id>.cmd`, collect the answers that
//! arrive on `svc.agent.<id>.result`, and give up on an agent at its deadline.
//!
//! The server has one subscription to every agent's results and hands each answer to the job
//! waiting for it ([`Jobs::deliver`]); an answer for a job or agent that is not waited for here
//! (late, duplicated, or for another cluster member's job: every member receives every result)
//! is dropped. No API key, admin included, may publish on an agent's subjects
//! (`auth::bus_permissions`), and an agent may publish only on its own, so an answer comes
//! from the agent its subject names: on the embedded broker, and on an external cluster with
//! `bus.external_auth: jwt`, where each agent's user JWT carries those rights. With `token`
//! on an external cluster nothing enforces it (docs/fleet.md).
//!
//! `concurrency` bounds how many agents are working at once, as Salt's batch mode does.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::protocol::{Command, Reply};
use super::signature::{self, Signer};
use super::Fleet;
use crate::bus::subjects;
use crate::events::EventKind;
use crate::Result;

/// How long after its own timeout an agent's answer is still waited for: the agent stops the
/// work at the timeout and needs a moment to say so.
pub const ANSWER_GRACE: Duration = Duration::from_secs(5);

/// How many commands a fan-out publishes before it lets the rest of its task (the results'
/// stream) run.
const YIELD_EVERY: usize = 64;

/// Jobs waiting for answers, by job id.
#[derive(Default)]
pub struct Jobs {
    waiting: Mutex<HashMap<String, mpsc::UnboundedSender<(String, Reply)>>>,
}

impl Jobs {
    fn register(&self, job_id: &str) -> mpsc::UnboundedReceiver<(String, Reply)> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.lock().insert(job_id.to_string(), sender);
        receiver
    }

    fn finish(&self, job_id: &str) {
        self.lock().remove(job_id);
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, mpsc::UnboundedSender<(String, Reply)>>> {
        self.waiting.lock().expect("jobs lock poisoned")
    }

    /// Whether a job `job_id` waits for answers here (in cluster mode every member receives
    /// every result, and only the member that started the job waits for its answers).
    pub fn is_waiting(&self, job_id: &str) -> bool {
        self.lock().contains_key(job_id)
    }

    /// Hands an agent's answer to the job waiting for it; false when none is.
    pub fn deliver(&self, agent_id: &str, reply: Reply) -> bool {
        match self.lock().get(&reply.job_id) {
            Some(sender) => sender.send((agent_id.to_string(), reply)).is_ok(),
            None => false,
        }
    }
}

/// The commands of a job, by agent, and what signs them (the server's command key, or why it
/// could not be had: then every agent's outcome is `NotSent` with that reason).
pub struct Outgoing {
    pub commands: Vec<(String, Command)>,
    pub signer: std::result::Result<Signer, String>,
}

/// What became of the command for one agent.
#[derive(Debug)]
pub enum Delivery {
    Answered(Reply),
    /// No answer by the deadline.
    NoAnswer,
    /// The command could not be published.
    NotSent(String),
}

/// Sends each agent its command (`outgoing`: id and the [`Command`] for `job_id`), signed for
/// that agent at the moment it is published, at most `concurrency` (0: all) at a time, and reports each agent's outcome on `out` as it comes. Returns when every agent has answered or timed out, or when `out` is
/// closed (the caller went away; agents still finish their work). `on_dispatch` is called for
/// each agent right after its command is published.
pub async fn run(
    fleet: &Fleet,
    job_id: &str,
    timeout: Duration,
    outgoing: Outgoing,
    concurrency: usize,
    mut on_dispatch: impl FnMut(&str),
    out: mpsc::Sender<(String, Delivery)>,
) -> Result<()> {
    let bus = fleet.bus()?.clone();
    let wait = timeout + ANSWER_GRACE;
    let limit = if concurrency == 0 {
        usize::MAX
    } else {
        concurrency
    };
    let mut answers = fleet.jobs.register(job_id);
    let Outgoing { commands, signer } = outgoing;
    let kind = commands.first().map(|(_, command)| command.work.kind());
    let started = Instant::now();
    let mut dispatched = false;
    let mut queue = commands.into_iter();
    let mut in_flight: HashMap<String, Instant> = HashMap::new();
    let mut published_since_yield = 0;
    'job: loop {
        while in_flight.len() < limit {
            // Signing and publishing 10,000 commands takes a good part of a second; the first
            // agents answer long before the last command is out. Their answers go on at once
            // (and the caller's stream gets a turn) instead of after the whole dispatch.
            while let Ok((agent, reply)) = answers.try_recv() {
                if !hand_on(&mut in_flight, &out, agent, reply).await {
                    break 'job;
                }
            }
            published_since_yield += 1;
            if published_since_yield >= YIELD_EVERY {
                published_since_yield = 0;
                tokio::task::yield_now().await;
            }
            let Some((agent, command)) = queue.next() else {
                break;
            };
            let signed = match &signer {
                Ok(signer) => signer.sign(&command, &agent).map_err(|e| e.to_string()),
                Err(why) => Err(why.clone()),
            };
            let published = match signed {
                Ok((payload, signature)) => {
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert(signature::HEADER, signature.as_str());
                    bus.publish_with_headers(
                        subjects::agent_command(&agent),
                        headers,
                        payload.into(),
                    )
                    .await
                    .map_err(|e| e.to_string())
                }
                Err(why) => Err(why),
            };
            match published {
                Ok(()) => {
                    dispatched = true;
                    on_dispatch(&agent);
                    in_flight.insert(agent, Instant::now() + wait);
                }
                Err(e) => {
                    if out.send((agent, Delivery::NotSent(e))).await.is_err() {
                        break;
                    }
                }
            }
        }
        let Some(deadline) = in_flight.values().min().copied() else {
            break;
        };
        tokio::select! {
            answer = answers.recv() => {
                let Some((agent, reply)) = answer else { break };
                if !hand_on(&mut in_flight, &out, agent, reply).await {
                    break;
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                let now = Instant::now();
                let expired: Vec<String> = in_flight
                    .iter()
                    .filter(|(_, at)| **at <= now)
                    .map(|(agent, _)| agent.clone())
                    .collect();
                for agent in expired {
                    in_flight.remove(&agent);
                    if out.send((agent, Delivery::NoAnswer)).await.is_err() {
                        break;
                    }
                }
            }
            _ = out.closed() => break,
        }
    }
    fleet.jobs.finish(job_id);
    // A fan-out that sent nothing (no agent reachable) took no time worth a sample.
    if let (Some(kind), true) = (kind, dispatched) {
        fleet.fan_outs.record(kind, started.elapsed());
    }
    Ok(())
}

/// Hands an awaited agent's answer to `out` (one not awaited, late or repeated, is dropped);
/// false when `out` is closed.
async fn hand_on(
    in_flight: &mut HashMap<String, Instant>,
    out: &mpsc::Sender<(String, Delivery)>,
    agent: String,
    reply: Reply,
) -> bool {
    in_flight.remove(&agent).is_none() || out.send((agent, Delivery::Answered(reply))).await.is_ok()
}

/// What a fan-out tells the event stream (docs/fleet.md, "Events of a fan-out"):
/// `job_started` and `job_finished` (source: the job id) always, each agent's failures and
/// drift always, and each agent's routine events (dispatched, completed, apply started and
/// succeeded) only when the job targets at most `jobs.per_agent_events` agents. Those were
/// two durable events per agent: 0.55 s of a 2.7 s exec to 18,000 agents
/// (docs/performance.md), and the job's stored results hold the same outcomes.
pub struct JobEvents {
    sink: EventSink,
    per_agent: bool,
    job_id: String,
    kind: String,
    agents: usize,
    started: Instant,
}

impl JobEvents {
    /// Emits `job_started`: `kind` as the history names it (exec, state.apply, ...),
    /// `agents` targeted (skipped ones included).
    pub fn start(
        domain: &crate::domain::Domain,
        job_id: &str,
        kind: &str,
        agents: usize,
        by: &str,
    ) -> JobEvents {
        let per_agent = agents <= domain.fleet.per_agent_events;
        let sink = EventSink::start(domain.events.clone());
        sink.emit(
            EventKind::JobStarted,
            job_id,
            serde_json::json!({
                "job_id": job_id, "kind": kind, "agents": agents, "by": by,
                "per_agent_events": per_agent,
            }),
        );
        JobEvents {
            sink,
            per_agent,
            job_id: job_id.to_string(),
            kind: kind.to_string(),
            agents,
            started: Instant::now(),
        }
    }

    /// An agent's routine event: emitted only for fan-outs within `jobs.per_agent_events`
    /// (its payload is not even built otherwise).
    pub fn routine(
        &self,
        event_type: EventKind,
        agent: &str,
        payload: impl FnOnce() -> serde_json::Value,
    ) {
        if self.per_agent {
            self.sink.emit(event_type, agent, payload());
        }
    }

    /// An agent's failure (or drift): always emitted.
    pub fn notable(&self, event_type: EventKind, agent: &str, payload: serde_json::Value) {
        self.sink.emit(event_type, agent, payload);
    }

    /// Emits `job_finished` with the results counted by status, and waits until every
    /// event of the job is stored.
    pub async fn finish(self, counts: super::history::Counts) {
        self.sink.emit(
            EventKind::JobFinished,
            &self.job_id,
            serde_json::json!({
                "job_id": self.job_id, "kind": self.kind, "agents": self.agents,
                "counts": counts, "duration_ms": self.started.elapsed().as_millis() as u64,
            }),
        );
        self.sink.close().await;
    }
}

/// Emits a job's events in batches from a task of its own, so that collecting 1,000 answers
/// never waits for an fdatasync per event. Events are appended in the order they are sent
/// here: a batch's emits all reach the log's writer on their first poll, in order.
pub struct EventSink {
    sender: mpsc::UnboundedSender<(EventKind, String, serde_json::Value)>,
    task: tokio::task::JoinHandle<()>,
}

impl EventSink {
    pub fn start(events: std::sync::Arc<crate::events::Events>) -> EventSink {
        let (sender, mut receiver) =
            mpsc::unbounded_channel::<(EventKind, String, serde_json::Value)>();
        let task = tokio::spawn(async move {
            while let Some(first) = receiver.recv().await {
                let mut batch = vec![first];
                while batch.len() < 1024 {
                    match receiver.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let emits = batch.into_iter().map(|(event_type, source, payload)| {
                    let events = &events;
                    async move { events.emit_system(event_type, &source, payload).await }
                });
                futures_util::future::join_all(emits).await;
            }
        });
        EventSink { sender, task }
    }

    pub fn emit(&self, event_type: EventKind, source: &str, payload: serde_json::Value) {
        let _ = self.sender.send((event_type, source.to_string(), payload));
    }

    /// Waits until every event sent here is stored.
    pub async fn close(self) {
        drop(self.sender);
        let _ = self.task.await;
    }
}
