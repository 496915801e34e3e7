//! A fleet simulator process: the bench runs itself again with [`ENV`] set to a [`Plan`], and
//! the child becomes `count` simulated agents, each its own bus connection from its own
//! loopback address, behaving on the wire as svc-agent does:
//!
//! - it enrols over `svc.enroll` with its PSK and a CSR of its own key, as a signing agent,
//!   and saves the enrolment (a later process, or the bus floor's, loads it instead);
//! - it logs in as svc-agent does (certificate in `jwt`, signature of the INFO nonce in
//!   `pass`), subscribes to `svc.agent.<id>.cmd` and sends its first heartbeat (with the
//!   host's facts), then one at the agent's default interval, each signed and stamped;
//! - it checks every command (`HMSG`, the server's `Svc-Signature`) with the library's own
//!   `Verifier` and `SeenJobs`, as the agent's executor does, and answers with a signed
//!   result: an exec with exit 0 and "ok" (nothing is run), a state with no change, a refused
//!   command with the reason;
//! - when its connection is lost it logs in again after the agent's own jittered backoff
//!   (`svc::agent::reconnect_delay`), forever: a simulated agent never gives up. Given
//!   several bus addresses (a NATS cluster's nodes, cluster mode), each agent starts on one
//!   of them (spread evenly by its number) and, whenever its connection is lost or a login
//!   fails, tries the next one of the list, as svc-agent with several `nats.urls` goes on
//!   to another node;
//! - on a cluster whose NATS checks JWTs (`bus.external_auth: jwt`) it enrols with the
//!   cluster's enrolment JWT and a user nkey of its own, and logs in with the user JWT it was
//!   given (renewal is not simulated: the bench's members issue JWTs valid for a day).
//!
//! Processes of their own keep each one under the machine's 20,000 open files and make the
//! simulator's CPU visible apart from the server's. The child reports on stdout, one line
//! every 200 ms (`status CONNECTED LOGINS ANSWERED REFUSED LOST SUBSCRIBED`), after one line
//! when its agents are enrolled or loaded (`enrolled COUNT SECONDS`). Its agents log in when
//! the parent writes `connect` on its stdin, and subscribe to their commands when it writes
//! `subscribe` (at once if it came first; the bench reads the server's memory in between); it exits when its stdin closes, so a bench that dies leaves
//! no simulator behind.

use std::io::{BufRead, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use svc::fleet::protocol::{
    Command as AgentCommand, ExecOutcome, Reply, ReplyOutcome, StateOutcome, Work,
};
use svc::fleet::signature::{SeenJobs, Verifier};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use crate::login::{enrol_with, heartbeat, login, source_address, until_pong, Identity};

/// The environment variable that makes the bench binary a simulator, holding its plan (JSON).
pub const ENV: &str = "SVC_FLEET_SIMULATOR";

/// What one simulator process does.
#[derive(Serialize, Deserialize, Clone)]
pub struct Plan {
    /// The bus, or a NATS cluster's nodes: the process enrols through the first; its agents
    /// spread over all of them.
    pub buses: Vec<SocketAddr>,
    /// The cluster's enrolment JWT (`svc-cluster nats-config`), on a JWT-mode cluster.
    pub enrol_jwt: Option<String>,
    /// Agents `first..first + count` (ids `sim-NNNNN`, source addresses from 127.1.0.1).
    pub first: usize,
    pub count: usize,
    /// The label `sim=GROUP` they enrol with.
    pub group: String,
    /// Their enrolments (JSON lines): read when present, else enrolled and written.
    pub saved: PathBuf,
    /// The certificate of the command key to trust instead of the one enrolment gave (the
    /// bus floor signs with a key of its own).
    pub command_key: Option<String>,
    pub heartbeat_ms: u64,
    /// The source addresses start this many agents later, so that two simulators of the same
    /// agents (one on the server, one on the floor's broker) do not share addresses.
    pub source_offset: usize,
}

/// One saved enrolment: what svc-agent bootstrap leaves in its state dir.
#[derive(Serialize, Deserialize)]
struct Saved {
    id: String,
    certificate: String,
    key: String,
    command_key: String,
    /// bus.jwt and bus.nk, on a JWT-mode cluster.
    #[serde(default)]
    bus_jwt: Option<(String, String)>,
}

#[derive(Default)]
struct Counts {
    connected: AtomicUsize,
    logins: AtomicUsize,
    answered: AtomicUsize,
    refused: AtomicUsize,
    lost: AtomicUsize,
    /// Connected agents whose command subscription the server has confirmed.
    subscribed: AtomicUsize,
}

/// The child's main: never returns.
pub fn main(plan: &str) -> ! {
    let plan: Plan = serde_json::from_str(plan).expect("a simulator plan");
    // The parent says `connect` when the agents may log in, and closes stdin when it is done
    // (or dies): then the simulator exits.
    let go = Arc::new(tokio::sync::Notify::new());
    let told = go.clone();
    let (subscribe, subscribing) = tokio::sync::watch::channel(false);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line.as_deref() {
                Ok("connect") => told.notify_one(),
                Ok("subscribe") => {
                    let _ = subscribe.send(true);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        std::process::exit(0);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(plan, go, subscribing));
    unreachable!("the simulator runs until its stdin closes")
}

async fn run(
    plan: Plan,
    go: Arc<tokio::sync::Notify>,
    subscribing: tokio::sync::watch::Receiver<bool>,
) {
    let started = Instant::now();
    let identities = match std::fs::read_to_string(&plan.saved) {
        Ok(text) => text
            .lines()
            .map(|line| {
                let saved: Saved = serde_json::from_str(line).unwrap();
                let bus_jwt = saved
                    .bus_jwt
                    .map(|(jwt, seed)| crate::login::BusJwt::new(jwt, seed));
                Arc::new(
                    Identity::load(saved.id, saved.certificate, saved.key, saved.command_key)
                        .with_bus_jwt(bus_jwt),
                )
            })
            .collect::<Vec<_>>(),
        Err(_) => {
            let bus = format!("nats://{}", plan.buses[0]);
            let range = plan.first..plan.first + plan.count;
            let enrol_jwt = plan.enrol_jwt.as_deref();
            let identities =
                enrol_with(&bus, enrol_jwt, range, &plan.group, crate::common::psk).await;
            let mut file = std::fs::File::create(&plan.saved).unwrap();
            for identity in &identities {
                let saved = Saved {
                    id: identity.id.clone(),
                    certificate: identity.cert_pem.clone(),
                    key: identity.key_pem.clone(),
                    command_key: identity.command_key.clone(),
                    bus_jwt: identity
                        .bus_jwt
                        .as_ref()
                        .map(|b| (b.jwt.clone(), b.seed.clone())),
                };
                writeln!(file, "{}", serde_json::to_string(&saved).unwrap()).unwrap();
            }
            identities
        }
    };
    say(&format!(
        "enrolled {} {:.3}",
        identities.len(),
        started.elapsed().as_secs_f64()
    ));
    go.notified().await;
    let counts = Arc::new(Counts::default());
    let facts = Arc::new(svc::facts::collect());
    let interval = Duration::from_millis(plan.heartbeat_ms);
    // At most 200 first logins in flight per process, as a real fleet's hosts start at
    // different moments; reconnections after a loss are paced by the agents' backoff alone.
    let first_logins = Arc::new(tokio::sync::Semaphore::new(200));
    let buses = Arc::new(plan.buses.clone());
    for (n, identity) in identities.into_iter().enumerate() {
        // Enrolment answers in any order: the agent's number is in its id.
        let number: usize = identity.id.trim_start_matches("sim-").parse().unwrap_or(n);
        let agent = Agent {
            buses: buses.clone(),
            home: number % buses.len(),
            source: source_address(number + plan.source_offset),
            command_key: plan
                .command_key
                .clone()
                .unwrap_or_else(|| identity.command_key.clone()),
            phase: interval.mul_f64((number % 1000) as f64 / 1000.0),
            interval,
            facts: facts.clone(),
            identity,
            counts: counts.clone(),
            subscribing: subscribing.clone(),
        };
        tokio::spawn(agent.live(first_logins.clone()));
    }
    loop {
        say(&format!(
            "status {} {} {} {} {} {}",
            counts.connected.load(Ordering::Relaxed),
            counts.logins.load(Ordering::Relaxed),
            counts.answered.load(Ordering::Relaxed),
            counts.refused.load(Ordering::Relaxed),
            counts.lost.load(Ordering::Relaxed),
            counts.subscribed.load(Ordering::Relaxed),
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

struct Agent {
    identity: Arc<Identity>,
    /// The bus addresses, and the one the agent starts on.
    buses: Arc<Vec<SocketAddr>>,
    home: usize,
    source: Ipv4Addr,
    command_key: String,
    phase: Duration,
    interval: Duration,
    facts: Arc<svc::facts::Facts>,
    counts: Arc<Counts>,
    /// Whether agents subscribe to their commands: from the start as svc-agent does, or once
    /// the parent says `subscribe` (it reads the server's memory in between).
    subscribing: tokio::sync::watch::Receiver<bool>,
}

impl Agent {
    async fn live(self, first_logins: Arc<tokio::sync::Semaphore>) {
        let id = self.identity.id.clone();
        let verifier = Verifier::from_certificate_pem(&self.command_key, &id).unwrap();
        let mut seen = SeenJobs::open(None, svc::clock::now_millis() as u64).unwrap();
        let mut permit = Some(first_logins.acquire_owned().await.unwrap());
        let mut attempt = 0;
        let mut bus = self.home;
        loop {
            let session = self
                .session(self.buses[bus], &verifier, &mut seen, &mut permit)
                .await;
            permit = None;
            // Lost or refused: the next address (the same one when there is only one).
            bus = (bus + 1) % self.buses.len();
            match session {
                // It was in and lost the connection: the backoff starts over, as async-nats'
                // reconnection count does.
                Ok(()) => attempt = 1,
                Err(_) => attempt += 1,
            }
            tokio::time::sleep(svc::agent::reconnect_delay(attempt)).await;
        }
    }

    /// One connection: log in, subscribe, heartbeat and answer until it is lost (Ok) or
    /// until the login fails (Err).
    async fn session(
        &self,
        bus: SocketAddr,
        verifier: &Verifier,
        seen: &mut SeenJobs,
        permit: &mut Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> std::io::Result<()> {
        let identity = &self.identity;
        let id = identity.id.as_str();
        let (mut reader, mut write) = login(identity, bus, self.source).await?;
        let mut facts = (*self.facts).clone();
        facts.insert("hostname".into(), id.into());
        let mut subscribing = self.subscribing.clone();
        let subscribed = *subscribing.borrow_and_update();
        let mut hello = Vec::new();
        if subscribed {
            hello.extend(format!("SUB svc.agent.{id}.cmd 1\r\n").into_bytes());
        }
        hello.extend(heartbeat(identity, Some(facts)));
        hello.extend_from_slice(b"PING\r\n");
        write.write_all(&hello).await?;
        until_pong(&mut reader, &mut write).await?;
        permit.take();
        self.counts.connected.fetch_add(1, Ordering::Relaxed);
        self.counts.logins.fetch_add(1, Ordering::Relaxed);
        let mut subscribed = subscribed;
        if subscribed {
            self.counts.subscribed.fetch_add(1, Ordering::Relaxed);
        }
        // However it ended (closed, reset, a -ERR), the agent starts over.
        let _ = self
            .serve(
                &mut reader,
                &mut write,
                verifier,
                seen,
                &mut subscribing,
                &mut subscribed,
            )
            .await;
        self.counts.connected.fetch_sub(1, Ordering::Relaxed);
        self.counts.lost.fetch_add(1, Ordering::Relaxed);
        if subscribed {
            self.counts.subscribed.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn serve(
        &self,
        reader: &mut tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
        write: &mut tokio::net::tcp::OwnedWriteHalf,
        verifier: &Verifier,
        seen: &mut SeenJobs,
        subscribing: &mut tokio::sync::watch::Receiver<bool>,
        subscribed: &mut bool,
    ) -> std::io::Result<()> {
        let identity = &self.identity;
        // A SUB sent late is confirmed by the PONG to the PING after it.
        let mut confirming = false;
        let start = tokio::time::Instant::now() + self.phase.max(Duration::from_millis(1));
        let mut tick = tokio::time::interval_at(start, self.interval);
        let mut line = String::new();
        let mut payload = Vec::new();
        loop {
            line.clear();
            tokio::select! {
                read = reader.read_line(&mut line) => {
                    if read? == 0 {
                        return Ok(());
                    }
                    let received = Instant::now();
                    // MSG <subject> <sid> [reply] <size>,
                    // HMSG <subject> <sid> [reply] <header size> <size>
                    let words: Vec<&str> = line.split_whitespace().collect();
                    let number = |i: usize| -> std::io::Result<usize> {
                        words
                            .get(i)
                            .and_then(|w| w.parse().ok())
                            .ok_or_else(|| std::io::Error::other(format!("bad frame: {line}")))
                    };
                    let (header_len, size) = match words.first().copied() {
                        Some("MSG") => (0, number(words.len() - 1)?),
                        Some("HMSG") => (number(words.len() - 2)?, number(words.len() - 1)?),
                        Some("PING") => {
                            write.write_all(b"PONG\r\n").await?;
                            continue;
                        }
                        Some(other) if other.starts_with("-ERR") => {
                            return Err(std::io::Error::other(line.trim_end().to_string()));
                        }
                        Some("PONG") if confirming => {
                            confirming = false;
                            *subscribed = true;
                            self.counts.subscribed.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        _ => continue,
                    };
                    payload.resize(size + 2, 0);
                    reader.read_exact(&mut payload).await?;
                    let signature = signature_header(&payload[..header_len]);
                    let body = &payload[header_len..size];
                    let Some((reply, refused)) = answer(verifier, seen, body, &signature, received) else {
                        continue;
                    };
                    let counter = if refused { &self.counts.refused } else { &self.counts.answered };
                    counter.fetch_add(1, Ordering::Relaxed);
                    let body = serde_json::to_vec(&reply).unwrap();
                    write.write_all(&identity.publish("result", &body)).await?;
                }
                _ = tick.tick() => write.write_all(&heartbeat(identity, None)).await?,
                changed = subscribing.changed(), if !*subscribed && !confirming => {
                    if changed.is_ok() && *subscribing.borrow_and_update() {
                        let sub = format!("SUB svc.agent.{}.cmd 1\r\nPING\r\n", identity.id);
                        write.write_all(sub.as_bytes()).await?;
                        confirming = true;
                    }
                }
            }
        }
    }
}

/// The `Svc-Signature` header's value in a NATS header block (empty when absent).
fn signature_header(headers: &[u8]) -> String {
    String::from_utf8_lossy(headers)
        .lines()
        .skip(1) // NATS/1.0
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| {
            name.trim()
                .eq_ignore_ascii_case(svc::fleet::signature::HEADER)
        })
        .map(|(_, value)| value.trim().to_string())
        .unwrap_or_default()
}

/// The answer to one command, checked as the agent's executor checks it, and whether it was
/// refused. None when the bytes are not a command at all (the agent ignores those).
fn answer(
    verifier: &Verifier,
    seen: &mut SeenJobs,
    body: &[u8],
    signature: &str,
    received: Instant,
) -> Option<(Reply, bool)> {
    let now = svc::clock::now_millis() as u64;
    let checked = verifier
        .check(body, signature, now)
        .and_then(|command| seen.admit(&command, now).map(|()| command));
    let (job_id, outcome, refused) = match checked {
        Ok(command) => {
            let outcome = match command.work {
                Work::Exec { .. } => ReplyOutcome::Exec(ExecOutcome {
                    stdout: "ok\n".into(),
                    ..Default::default()
                }),
                Work::State { .. } => ReplyOutcome::State(StateOutcome::default()),
                Work::Module { .. } => ReplyOutcome::State(StateOutcome {
                    error: Some("the fleet simulator runs no modules".into()),
                    ..Default::default()
                }),
                // Simulated agents report no command keys, so the server sends them no notice.
                Work::CommandKeys { .. } => ReplyOutcome::Exec(ExecOutcome {
                    exit_code: -1,
                    error: Some("the fleet simulator keeps its command keys".into()),
                    ..Default::default()
                }),
            };
            (command.job_id, outcome, false)
        }
        Err(refused) => {
            let command: AgentCommand = serde_json::from_slice(body).ok()?;
            let why = Some(refused.to_string());
            let outcome = match command.work {
                Work::Exec { .. } => ReplyOutcome::Exec(ExecOutcome {
                    exit_code: -1,
                    error: why,
                    ..Default::default()
                }),
                _ => ReplyOutcome::State(StateOutcome {
                    error: why,
                    ..Default::default()
                }),
            };
            (command.job_id, outcome, true)
        }
    };
    let reply = Reply {
        job_id,
        duration_ms: received.elapsed().as_millis() as u64,
        outcome,
    };
    Some((reply, refused))
}
