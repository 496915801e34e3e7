//! `svc-agent [--config PATH]`: the daemon. Connects to the bus as this agent (certificate +
//! signed nonce, or on a JWT-mode cluster its user JWT, renewed at half-life by renew.rs;
//! inside TLS for `tls://` URLs or with `nats.ca_file`), heartbeats every
//! `heartbeat_interval` (with the host's facts when the server needs them), and hands the
//! commands the server sends on `svc.agent.<id>.cmd` (exec, state and modules; a large
//! state plan fetched first by content.rs) to the executor (executor.rs: in this process
//! with `executor: inline`, else the privileged `svc-agent executor` behind its socket),
//! answering on `svc.agent.<id>.result`. Results and heartbeats are signed with the
//! certificate's key (`fleet::agent_signature`).
//!
//! One thread: a current-thread runtime keeps an idle agent at a few MB; command output is
//! read asynchronously and state runs on the blocking pool.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::bus::subjects;
use crate::config::AgentConfig;
use crate::facts::{self, Facts};
use crate::fleet::agent_signature::{AgentSigner, HEADER_ROOM};
use crate::fleet::protocol::{ExecOutcome, Heartbeat, Reply, ReplyOutcome};
use crate::fleet::signature;
use crate::program::{exit, CliError};

use super::executor::{self, Executor};

/// Where this daemon's commands run.
enum Runner {
    Inline(Executor),
    Socket(PathBuf),
}

/// Jobs run at once; more wait their turn (a fan-out must not fork-bomb a host).
const MAX_JOBS: usize = 16;

/// How often the facts are read again to notice a change (an address added, memory
/// hot-plugged). Reading them is cheap, but not worth doing every heartbeat.
const FACTS_EVERY: Duration = Duration::from_secs(60);

#[derive(argh::FromArgs, argh::ArgsInfo)]
/// Run the agent daemon (the default command): connect to the bus with this agent's
/// certificate, heartbeat, and run the commands and states the server sends.
#[argh(help_triggers("-h", "--help"))]
pub struct RunArgs {
    /// log level or filter (default info; SVC_LOG and RUST_LOG also work)
    #[argh(option, from_str_fn(crate::program::log_filter))]
    log_level: Option<String>,
}

pub fn main(program: &str, config_path: Option<PathBuf>, args: RunArgs) -> i32 {
    let config = match super::load_config(program, config_path.as_deref()) {
        Ok(config) => config,
        Err(code) => return code,
    };
    if config.agent.id.is_empty() {
        eprintln!("{program}: agent.id is not set: enrol first with `{program} bootstrap`");
        return exit::FAILED;
    }
    if config.nats.urls.is_empty() {
        eprintln!("{program}: nats.urls is empty");
        return exit::FAILED;
    }
    init_logging(args.log_level.as_deref().unwrap_or("info"));
    crate::program::run_async(program, run(config))
}

pub(super) fn init_logging(level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("SVC_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| level.to_string());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("info")))
        .with_ansi(crate::program::output::stderr_colour())
        .with_writer(std::io::stderr)
        .try_init();
}

async fn run(config: AgentConfig) -> Result<(), CliError> {
    let id = config.agent.id.clone();
    let state_dir = &config.agent.state_dir;
    let failed = |e: crate::Error| CliError::failed(e.to_string());
    // The bus knows the agent by its certificate; a config naming another id would only
    // earn permission violations, so say so now.
    let (cert_pem, _) = super::bus_credentials(state_dir).map_err(failed)?;
    match crate::identity::ca::agent_id_in(&cert_pem) {
        Some(cert_id) if cert_id == id => {}
        other => {
            return Err(CliError::failed(format!(
            "the certificate in {} is for agent {:?}, but agent.id is '{id}': run bootstrap again",
            state_dir.display(),
            other.unwrap_or_default()
        )))
        }
    }
    // Every result and heartbeat is signed with the certificate's key: the server drops
    // what does not verify (`fleet::agent_signature`).
    let key_path = state_dir.join(super::KEY_FILE);
    let key_pem = std::fs::read_to_string(&key_path).map_err(|e| {
        CliError::failed(format!(
            "cannot read {}: {e} (run svc-agent bootstrap)",
            key_path.display()
        ))
    })?;
    let signer = Arc::new(AgentSigner::from_pkcs8_pem(&key_pem).map_err(failed)?);
    let runner = Arc::new(if config.agent.executor.trim() == "inline" {
        let seen = state_dir.join("seen-jobs");
        let inline = Executor::open(&config.agent, config.modules.clone(), Some(seen), false)
            .map_err(CliError::failed)?;
        if let Some(problem) = inline.problem() {
            tracing::error!(%problem, "every command will be refused");
        }
        Runner::Inline(inline)
    } else {
        Runner::Socket(PathBuf::from(config.agent.executor.trim()))
    });
    let mut stop = StopSignals::install()?;
    // On a JWT-mode cluster: a JWT past half its life (or expired, after a long time off) is
    // renewed before connecting, then at every half-life.
    if super::renew::uses_jwt(state_dir) {
        if let Err(error) = super::renew::renew_if_due(&config).await {
            tracing::warn!(%error, "bus JWT not renewed; connecting with the one there is");
        }
        tokio::spawn(super::renew::keep_renewed(config.clone()));
    }
    // Set at each (re)connection: the next heartbeat carries the facts.
    let connected = Arc::new(AtomicBool::new(true));
    let ca_file = (!config.nats.ca_file.is_empty()).then(|| PathBuf::from(&config.nats.ca_file));
    let options = || {
        let agent_id = id.clone();
        let connected = connected.clone();
        let options = super::connect_options(state_dir)
            .map_err(failed)?
            .name(format!("svc-agent {id}"))
            .reconnect_delay_callback(super::reconnect_delay)
            .event_callback(move |event| {
                let agent_id = agent_id.clone();
                if matches!(event, async_nats::Event::Connected) {
                    connected.store(true, Ordering::Relaxed);
                }
                async move { log_bus_event(&agent_id, event) }
            });
        super::with_bus_tls(
            options,
            &config.nats.urls,
            ca_file.as_deref(),
            Some(state_dir),
        )
        .map_err(|e| CliError::failed(format!("nats.ca_file: {e}")))
    };
    // One attempt first, so a certificate this agent does not trust is a clear error now
    // (async-nats' retries report only "IO error"); any other failure (the server not up
    // yet) falls back to retrying in the background as before.
    let first = tokio::time::timeout(
        Duration::from_secs(10),
        options()?.connect(config.nats.urls.clone()),
    )
    .await;
    let client = match first {
        Ok(Ok(client)) => client,
        Ok(Err(error)) => {
            if let Some(message) = super::untrusted_bus_certificate(&error) {
                return Err(CliError::new(
                    exit::UNREACHABLE,
                    format!("cannot connect to the bus: {message}"),
                ));
            }
            tracing::warn!(%error, "cannot connect to the bus yet; retrying");
            retrying_connect(options()?, &config.nats.urls).await?
        }
        Err(_) => {
            tracing::warn!("no bus connection within 10s; retrying");
            retrying_connect(options()?, &config.nats.urls).await?
        }
    };
    let mut commands = client
        .subscribe(subjects::agent_command(&id))
        .await
        .map_err(|e| CliError::new(exit::UNREACHABLE, format!("cannot subscribe: {e}")))?;
    tracing::info!(agent_id = %id, urls = ?config.nats.urls, "svc-agent started");

    let running = Arc::new(AtomicU32::new(0));
    let heartbeat = tokio::spawn(heartbeats(
        client.clone(),
        id.clone(),
        config.agent.heartbeat_interval.0,
        running.clone(),
        connected,
        config.agent.command_key_path(),
        signer.clone(),
    ));
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_JOBS));
    let content_dir = Arc::new(state_dir.join("content"));
    // Settled at the start, and whenever the last running job ends: see program/trim.rs.
    let settled = Arc::new(tokio::sync::Notify::new());
    let trimmer = tokio::spawn(trim_when_settled(running.clone(), settled.clone()));
    settled.notify_one();
    loop {
        tokio::select! {
            message = commands.next() => {
                let Some(message) = message else { break };
                let Ok(permit) = slots.clone().acquire_owned().await else { break };
                let (client, id, running) = (client.clone(), id.clone(), running.clone());
                let (runner, content_dir) = (runner.clone(), content_dir.clone());
                let (signer, settled) = (signer.clone(), settled.clone());
                tokio::spawn(async move {
                    running.fetch_add(1, Ordering::Relaxed);
                    handle(&client, &id, &runner, &signer, &content_dir, &message).await;
                    if running.fetch_sub(1, Ordering::Relaxed) == 1 {
                        settled.notify_one();
                    }
                    drop(permit);
                });
            }
            _ = stop.wait() => break,
        }
    }
    tracing::info!(agent_id = %id, "stopping");
    heartbeat.abort();
    trimmer.abort();
    // Running jobs get a moment to send their answers; then the connection is drained.
    let _ = tokio::time::timeout(Duration::from_secs(5), slots.acquire_many(MAX_JOBS as u32)).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), client.drain()).await;
    Ok(())
}

/// Each time the agent settles (`settled`), once nothing has run for [`crate::program::trim::SETTLE`],
/// unmaps the code pages it is not using (program/trim.rs).
async fn trim_when_settled(running: Arc<AtomicU32>, settled: Arc<tokio::sync::Notify>) {
    loop {
        settled.notified().await;
        loop {
            tokio::time::sleep(crate::program::trim::SETTLE).await;
            if running.load(Ordering::Relaxed) == 0 {
                break;
            }
        }
        let released = tokio::task::spawn_blocking(crate::program::trim::release_code_pages)
            .await
            .unwrap_or_default();
        tracing::debug!(released, "unused code pages released");
    }
}

/// Connects in the background: returns at once and keeps trying (async-nats' backoff).
async fn retrying_connect(
    options: async_nats::ConnectOptions,
    urls: &[String],
) -> Result<async_nats::Client, CliError> {
    options
        .retry_on_initial_connect()
        .connect(urls.to_vec())
        .await
        .map_err(|e| CliError::new(exit::UNREACHABLE, format!("cannot connect to the bus: {e}")))
}

fn log_bus_event(agent_id: &str, event: async_nats::Event) {
    match event {
        async_nats::Event::Connected => tracing::info!(agent_id, "connected to the bus"),
        async_nats::Event::Disconnected => {
            tracing::warn!(agent_id, "disconnected from the bus; reconnecting")
        }
        async_nats::Event::ServerError(async_nats::ServerError::AuthorizationViolation) => {
            tracing::error!(
                agent_id,
                "the bus refused this agent's certificate (signing CA rotated, or enrolled again elsewhere): run `svc-agent bootstrap` with a new join token"
            )
        }
        other => tracing::debug!(agent_id, event = %other, "bus event"),
    }
}

/// Heartbeats every `interval`. The facts (and the id of the command keys trusted here) ride
/// along only in the first heartbeat after each (re)connection (`connected`: the server may have restarted, or be another one) and in the
/// first after they changed; every other heartbeat stays a few dozen bytes, because tens of
/// thousands of agents send one every few seconds and the server keeps the last facts
/// anyway.
async fn heartbeats(
    client: async_nats::Client,
    id: String,
    interval: Duration,
    running: Arc<AtomicU32>,
    connected: Arc<AtomicBool>,
    command_key: PathBuf,
    signer: Arc<AgentSigner>,
) {
    let subject = subjects::agent_heartbeat(&id);
    let mut facts = collect_facts().await;
    let mut collected = Instant::now();
    let mut sent: Option<Facts> = None;
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if collected.elapsed() >= FACTS_EVERY {
            facts = collect_facts().await;
            collected = Instant::now();
        }
        let reconnected = connected.swap(false, Ordering::Relaxed);
        let with_facts = reconnected || sent.as_ref() != Some(&facts);
        let mut beat = Heartbeat {
            version: env!("CARGO_PKG_VERSION").to_string(),
            hostname: facts
                .get("hostname")
                .and_then(|name| name.as_str())
                .unwrap_or_default()
                .to_string(),
            running_jobs: running.load(Ordering::Relaxed),
            facts: with_facts.then(|| facts.clone()),
            // Beside the facts: the server then sends a command-key notice if this agent
            // missed a rotation or a retirement while it was away.
            command_keys: with_facts
                .then(|| std::fs::read_to_string(&command_key).ok())
                .flatten()
                .and_then(|pem| signature::key_set_id(&pem).ok()),
            sent_at_ms: Some(crate::clock::now_millis() as u64),
        };
        let mut payload = serde_json::to_vec(&beat).expect("heartbeats serialize");
        let max_payload = client.server_info().max_payload;
        if with_facts && max_payload > 0 && payload.len() + HEADER_ROOM > max_payload {
            // A bus with a small max_payload: the heartbeat goes without the facts rather
            // than not at all (which would leave the agent disconnected), and they count as
            // sent, so this is said once per change rather than every beat.
            tracing::warn!(
                size = payload.len(),
                max_payload,
                "facts left out of the heartbeat: larger than the bus's max_payload"
            );
            beat.facts = None;
            payload = serde_json::to_vec(&beat).expect("heartbeats serialize");
        }
        let published = match signer.headers(&subject, &payload) {
            Ok(headers) => {
                client
                    .publish_with_headers(subject.clone(), headers, payload.into())
                    .await
            }
            Err(error) => {
                tracing::error!(%error, "heartbeat not signed, not sent");
                continue;
            }
        };
        match published {
            Ok(()) if with_facts => sent = Some(facts.clone()),
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(error = %e, "heartbeat not sent");
                if with_facts {
                    // Not sent: the next heartbeat tries again.
                    connected.store(true, Ordering::Relaxed);
                }
            }
        }
    }
}

/// This host's facts, read on the blocking pool (a few small files; the runtime has one
/// thread).
async fn collect_facts() -> Facts {
    tokio::task::spawn_blocking(facts::collect)
        .await
        .unwrap_or_default()
}

/// Has one command run and publishes its answer. The daemon reads nothing of the command
/// but what it needs to answer a failure: checking and running it is the executor's.
async fn handle(
    client: &async_nats::Client,
    id: &str,
    runner: &Runner,
    signer: &AgentSigner,
    content_dir: &Path,
    message: &async_nats::Message,
) {
    let started = Instant::now();
    let signature = message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(signature::HEADER))
        .map(|value| value.as_str().to_string())
        .unwrap_or_default();
    let bytes = &message.payload;
    // A plan too large for the command is fetched first; the executor checks it.
    let fetched = match super::content::plan_ref(bytes) {
        None => Ok(None),
        Some(plan_ref) => {
            super::content::fetch(client, id, content_dir, bytes, &signature, &plan_ref)
                .await
                .map(Some)
        }
    };
    let reply = match fetched {
        Err(why) => {
            tracing::error!(error = %why, "stored plan not fetched");
            executor::refusal(bytes, &format!("stored plan not fetched: {why}"), started)
        }
        Ok(fetched) => match runner {
            Runner::Inline(executor) => executor.run(bytes, &signature, fetched.as_deref()).await,
            Runner::Socket(socket) => {
                match executor::forward(socket, bytes, &signature, fetched.as_deref()).await {
                    Ok(reply) => reply,
                    Err(why) => {
                        tracing::error!(error = %why, "command not run");
                        executor::refusal(bytes, &why, started)
                    }
                }
            }
        },
    };
    let Some(mut reply) = reply else {
        tracing::warn!("malformed command ignored");
        return;
    };
    // From the command's arrival: fetching a stored plan is part of the job.
    reply.duration_ms = reply.duration_ms.max(started.elapsed().as_millis() as u64);
    // What the bus announced (before any INFO, 64 KiB): a result larger than max_payload
    // would not be sent at all, so its output is cut to fit whatever that is.
    // The signature header takes some of it.
    let max = match client.server_info().max_payload {
        0 => 64 * 1024,
        max => max,
    };
    let bytes = encode_within(&mut reply, max.saturating_sub(HEADER_ROOM));
    let subject = subjects::agent_result(id);
    let headers = match signer.headers(&subject, &bytes) {
        Ok(headers) => headers,
        Err(error) => {
            tracing::error!(job_id = %reply.job_id, %error, "result not signed, not sent");
            return;
        }
    };
    if let Err(e) = client
        .publish_with_headers(subject, headers, bytes.into())
        .await
    {
        tracing::warn!(job_id = %reply.job_id, error = %e, "result not sent");
    }
}

/// Serializes a reply, cutting its output until it fits in one bus message.
fn encode_within(reply: &mut Reply, max: usize) -> Vec<u8> {
    loop {
        let bytes = serde_json::to_vec(reply).expect("replies serialize");
        if bytes.len() <= max {
            return bytes;
        }
        match &mut reply.outcome {
            ReplyOutcome::Exec(ExecOutcome {
                stdout,
                stderr,
                truncated,
                ..
            }) if !(stdout.is_empty() && stderr.is_empty()) => {
                for text in [stdout, stderr] {
                    let mut cut = text.len() / 2;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    text.truncate(cut);
                }
                *truncated = true;
            }
            ReplyOutcome::State(outcome)
                if outcome.outcomes.iter().any(|o| !o.detail.is_empty()) =>
            {
                for o in &mut outcome.outcomes {
                    o.detail.clear();
                }
            }
            // A module's resources (file contents) go before its log lines; the server then
            // has no plan to remember for drift, and says so.
            ReplyOutcome::State(outcome) if !outcome.resources.is_empty() => {
                outcome.resources.clear();
            }
            ReplyOutcome::State(outcome) if !outcome.logs.is_empty() => {
                outcome.logs.clear();
            }
            _ => return bytes,
        }
    }
}

/// SIGTERM and SIGINT stop the daemon.
pub(super) struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    pub(super) fn install() -> Result<Self, CliError> {
        use tokio::signal::unix::{signal, SignalKind};
        let install =
            |kind| signal(kind).map_err(|e| CliError::failed(format!("signal handler: {e}")));
        Ok(StopSignals {
            term: install(SignalKind::terminate())?,
            int: install(SignalKind::interrupt())?,
        })
    }

    pub(super) async fn wait(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_cut_to_fit() {
        let mut reply = Reply {
            job_id: "J".into(),
            duration_ms: 1,
            outcome: ReplyOutcome::Exec(ExecOutcome {
                stdout: "\u{1}".repeat(100_000),
                stderr: "é".repeat(10_000),
                ..ExecOutcome::default()
            }),
        };
        let bytes = encode_within(&mut reply, 64 * 1024);
        assert!(bytes.len() <= 64 * 1024);
        let decoded: Reply = serde_json::from_slice(&bytes).unwrap();
        let ReplyOutcome::Exec(outcome) = decoded.outcome else {
            panic!("exec")
        };
        assert!(outcome.truncated);
    }
}
