//! The fleet (contract §10): the agent registry with liveness from heartbeats, quarantine,
//! remote exec, and declarative state sent to agents.
//!
//! - `registry.rs`: who is connected, and the facts agents report (heartbeats in memory,
//!   written to the store in batches);
//! - `selector.rs`: `--target` selectors (ids, labels, facts);
//! - `protocol.rs`: the JSON the server and agents exchange on the bus;
//! - `signature.rs`: signing commands (server) and checking them (agent);
//! - `agent_signature.rs`: signing results and heartbeats (agent) and checking them (server);
//! - `command_keys.rs`: telling agents which command-signing keys to trust (after a rotation);
//! - `jobs.rs`: sending one command to many agents and collecting their answers by deadline;
//! - `exec.rs`, `state.rs`: `svcctl exec` and `svcctl state check|apply|drift` on top of jobs;
//! - `history.rs`: every job and its results in the store (`svcctl job list|show`), bounded;
//! - `content.rs`: state plans too large for a command, stored by SHA-256 for agents to fetch;
//! - `module.rs`: `svc-module run --target`, a module run on agents as a state job.
//!
//! Transports (gRPC FleetService, the server's bus subscriptions) call the functions here with
//! a `Principal`; the bus client that carries commands is the fleet's from the start.

pub mod agent_signature;
pub mod command_keys;
pub mod content;
pub mod exec;
pub mod history;
pub mod jobs;
pub mod module;
pub mod protocol;
pub mod registry;
pub mod selector;
pub mod signature;
pub mod state;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::events::EventKind;
use crate::facts::{self, Facts};
use crate::{clock, Error, Result};

pub use registry::{AgentState, Registry, Verdict};
pub use selector::Selector;

/// The fleet's shared state: liveness, jobs waiting for answers, and the bus client.
pub struct Fleet {
    pub registry: Registry,
    pub jobs: jobs::Jobs,
    /// How long the previous command-signing key stays accepted after a rotation
    /// (`agents.command_key_grace`; `identity::rotate_command_key`).
    pub command_key_grace: Duration,
    /// How much of the job history the store keeps (`jobs` in the configuration).
    pub retention: history::Retention,
    /// The most targets a fan-out emits each agent's routine events for
    /// (`jobs.per_agent_events`; [`jobs::JobEvents`]).
    pub per_agent_events: usize,
    /// How long fan-outs take, for `/metrics`.
    pub fan_outs: crate::metrics::FanOuts,
    /// Whether results and heartbeats of agents with no key on record are taken unsigned
    /// (`agents.accept_unsigned`), and the count of those dropped as forged.
    pub accept_unsigned: bool,
    pub forgeries: agent_signature::Forgeries,
    /// The client commands go out on; None in a domain without a bus (unit tests, offline
    /// tools), where sending a command is `Unavailable`.
    bus: Option<async_nats::Client>,
}

impl Fleet {
    pub fn new(
        heartbeat_timeout: Duration,
        command_key_grace: Duration,
        bus: Option<async_nats::Client>,
    ) -> Fleet {
        Fleet {
            registry: Registry::new(heartbeat_timeout),
            jobs: jobs::Jobs::default(),
            command_key_grace,
            retention: history::Retention::default(),
            per_agent_events: crate::config::JobsConfig::default().per_agent_events as usize,
            fan_outs: crate::metrics::FanOuts::default(),
            accept_unsigned: true,
            forgeries: agent_signature::Forgeries::default(),
            bus,
        }
    }

    pub fn with_accept_unsigned(mut self, accept_unsigned: bool) -> Fleet {
        self.accept_unsigned = accept_unsigned;
        self
    }

    pub fn with_retention(mut self, config: &crate::config::JobsConfig) -> Fleet {
        self.retention = history::Retention::from(config);
        self.per_agent_events = config.per_agent_events as usize;
        self
    }

    /// The largest message the bus takes (None without a bus).
    pub fn max_payload(&self) -> Option<usize> {
        self.bus
            .as_ref()
            .map(|b| b.server_info().max_payload)
            .filter(|max| *max > 0)
    }

    fn bus(&self) -> Result<&async_nats::Client> {
        self.bus
            .as_ref()
            .ok_or_else(|| Error::Unavailable("this process has no bus to reach agents".into()))
    }
}

/// How one targeted agent's part of a job (exec or state) ended; the wire names are the
/// snake_case of the variants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Ran and succeeded (state: nothing to change, or no drift).
    Ok,
    /// State: apply changed something, or check found something to change.
    Changed,
    /// State drift: resources differ from the last applied state.
    Drift,
    /// Ran and failed (exit code, resource error, or the command could not start).
    #[default]
    Failed,
    /// No answer before the deadline.
    TimedOut,
    /// Not connected, or the command could not be sent.
    Unreachable,
    /// Quarantined: nothing was sent.
    Skipped,
    /// State drift: never applied, nothing to compare against.
    NoState,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Ok => "ok",
            JobStatus::Changed => "changed",
            JobStatus::Drift => "drift",
            JobStatus::Failed => "failed",
            JobStatus::TimedOut => "timed_out",
            JobStatus::Unreachable => "unreachable",
            JobStatus::Skipped => "skipped",
            JobStatus::NoState => "no_state",
        }
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An agent as operators see it.
#[derive(Clone, Debug, Serialize)]
pub struct AgentView {
    pub id: String,
    pub labels: BTreeMap<String, String>,
    pub state: AgentState,
    pub quarantined: bool,
    pub quarantine_reason: Option<String>,
    pub quarantined_at: Option<String>,
    pub last_heartbeat_at: Option<String>,
    pub enrolled_at: String,
    /// SHA-256 of the agent certificate's DER.
    pub fingerprint: String,
    pub hostname: String,
    pub version: String,
    /// What the agent last reported about its host (empty until it does). Its own claim,
    /// unlike the labels: never a basis for authorization.
    pub facts: Facts,
}

impl From<registry::Entry> for AgentView {
    fn from(entry: registry::Entry) -> Self {
        AgentView {
            facts: entry.facts(),
            state: entry.state(),
            id: entry.row.id,
            labels: entry.labels,
            quarantined: entry.row.is_quarantined,
            quarantine_reason: entry.row.quarantine_reason,
            quarantined_at: entry.row.quarantined_at,
            last_heartbeat_at: entry.last_heartbeat_ms.map(clock::format_rfc3339),
            enrolled_at: entry.row.enrolled_at,
            fingerprint: entry.row.fingerprint,
            hostname: entry.hostname,
            version: entry.version,
        }
    }
}

/// Loads every enrolled agent into the registry (server start).
pub async fn load(domain: &Domain) -> Result<usize> {
    let rows = domain.store.fleet().list_agents().await?;
    let count = rows.len();
    domain.fleet.registry.load(rows);
    Ok(count)
}

/// Reads one agent's row again (after this server enrolled it), so labels and certificate
/// changes are seen at once.
/// An agent deleted from the store (by another cluster member) is dropped.
pub async fn refresh(domain: &Domain, id: &str) -> Result<()> {
    match domain.store.get_agent(id).await? {
        Some(row) => domain.fleet.registry.update(row),
        None => domain.fleet.registry.forget(id),
    }
    Ok(())
}

/// Agents a page holds when the caller names no `limit`.
pub const DEFAULT_PAGE: usize = 500;
/// The most agents one page may hold (`limit` above this is refused).
pub const MAX_PAGE: usize = 5000;
/// The fewest rows read from the store at a time while a page is filled: a selective filter
/// then costs a few scans of a big fleet, not one per matching agent.
const SCAN_BATCH: usize = 256;

/// What `agent list` asks for: a selector, states, and where the page starts.
#[derive(Clone, Debug, Default)]
pub struct ListQuery {
    /// A `--target` selector; empty for every agent.
    pub target: String,
    /// Only agents in one of these states; empty for any.
    pub states: Vec<AgentState>,
    /// `next_cursor` of the page before; empty for the first page.
    pub cursor: String,
    /// At most this many agents (0: [`DEFAULT_PAGE`]; at most [`MAX_PAGE`]).
    pub limit: usize,
}

/// One page of agents by id, and the cursor of the next when more match.
#[derive(Clone, Debug, Serialize)]
pub struct AgentPage {
    pub agents: Vec<AgentView>,
    pub next_cursor: Option<String>,
}

/// Parses a comma list of agent states (`connected,pending`); empty for any state.
pub fn parse_states(text: &str) -> Result<Vec<AgentState>> {
    let mut states = Vec::new();
    for name in text
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
    {
        let state = AgentState::ALL
            .into_iter()
            .find(|state| state.as_str() == name)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown agent state '{name}' (connected, disconnected, pending, quarantined)"
                ))
            })?;
        if !states.contains(&state) {
            states.push(state);
        }
    }
    Ok(states)
}

/// The cursor that resumes after agent `id`: opaque to callers (base64url of the id), so
/// that what a cursor holds may change without breaking them.
fn encode_cursor(id: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id)
}

/// The longest agent id a cursor holds, in bytes.
const CURSOR_MAX_ID: usize = 256;

/// The agent id a cursor resumes after ("" for no cursor).
fn decode_cursor(cursor: &str) -> Result<String> {
    use base64::Engine;
    if cursor.is_empty() {
        return Ok(String::new());
    }
    let invalid = || {
        Error::Invalid(format!(
            "invalid cursor '{cursor}': pass the next_cursor of the page before, unchanged"
        ))
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .map_err(|_| invalid())?;
    let id = String::from_utf8(bytes).map_err(|_| invalid())?;
    if id.is_empty() || id.len() > CURSOR_MAX_ID || id.chars().any(char::is_control) {
        return Err(invalid());
    }
    Ok(id)
}

/// A regular expression for the cursors a page gives (for the OpenAPI document): base64url
/// without padding of 1 to [`CURSOR_MAX_ID`] bytes of printable ASCII, which every agent id is
/// (the CA takes only ASCII, enrolment only letters, digits, `-` and `_`), with the unused low
/// bits of the last character zero as the decoder requires. [`decode_cursor`] takes each.
pub fn cursor_pattern() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let allowed: Vec<u8> = (0x20..0x7f).collect();
    let class = |indices: &mut dyn Iterator<Item = u8>| -> String {
        let mut chars: Vec<u8> = indices.map(|i| ALPHABET[usize::from(i)]).collect();
        chars.sort_unstable();
        chars.dedup();
        let text: String = chars
            .iter()
            .map(|&c| {
                if c == b'-' {
                    "\\-".to_string()
                } else {
                    char::from(c).to_string()
                }
            })
            .collect();
        format!("[{text}]")
    };
    let alternatives = |parts: Vec<String>| format!("({})", parts.join("|"));
    // After the first byte's six high bits: its two low bits r1. After the second byte's four
    // high bits h: its four low bits r2. The third byte's two high bits t, then its six low.
    let first = |r1: u8| class(&mut allowed.iter().filter(|b| *b & 3 == r1).map(|b| b >> 2));
    let lows = |h: u8| allowed.iter().filter(move |b| *b >> 4 == h).map(|b| b & 15);
    let highs: Vec<u8> = (0..16).filter(|h| lows(*h).next().is_some()).collect();
    let last_two = |h: u8| {
        let parts = (0..4)
            .filter(|t| allowed.iter().any(|b| b >> 6 == *t))
            .map(|t| {
                let third = class(&mut lows(h).map(|r2| r2 << 2 | t));
                let fourth = class(&mut allowed.iter().filter(|b| *b >> 6 == t).map(|b| b & 63));
                format!("{third}{fourth}")
            })
            .collect();
        alternatives(parts)
    };
    // Second characters grouped by what may follow them, so the expression stays short.
    let seconds = |r1: u8, rest: &dyn Fn(u8) -> String| -> String {
        let mut groups: Vec<(String, Vec<u8>)> = Vec::new();
        for &h in &highs {
            let follow = rest(h);
            match groups.iter_mut().find(|(text, _)| *text == follow) {
                Some((_, hs)) => hs.push(h),
                None => groups.push((follow, vec![h])),
            }
        }
        let parts = groups
            .into_iter()
            .map(|(follow, hs)| format!("{}{follow}", class(&mut hs.iter().map(|h| r1 << 4 | h))))
            .collect();
        alternatives(parts)
    };
    let unit = |rest: &dyn Fn(u8) -> String| -> String {
        let parts = (0..4)
            .filter(|r1| allowed.iter().any(|b| b & 3 == *r1))
            .map(|r1| format!("{}{}", first(r1), seconds(r1, rest)))
            .collect();
        alternatives(parts)
    };
    let three = unit(&last_two);
    let two = unit(&|h| class(&mut lows(h).map(|r2| r2 << 2)));
    let one = alternatives(
        (0..4)
            .filter(|r1| allowed.iter().any(|b| b & 3 == *r1))
            .map(|r1| format!("{}{}", first(r1), class(&mut std::iter::once(r1 << 4))))
            .collect(),
    );
    let groups = CURSOR_MAX_ID / 3;
    let (full, extra) = (groups, CURSOR_MAX_ID % 3);
    // Whole groups, then one or two bytes more, never past the longest id.
    let with_two = if extra == 2 { full } else { full - 1 };
    let with_one = if extra >= 1 { full } else { full - 1 };
    format!("^({three}{{1,{full}}}|{three}{{0,{with_one}}}{one}|{three}{{0,{with_two}}}{two})$")
}

/// One page of the enrolled agents matching `query`, by id. Reads the store a page at a time
/// (keyset on the id), filtering by selector and state as it goes, and stops at one match past
/// `limit`, which is how it knows that a next page exists: never the whole fleet at once.
/// Enrolment is read from the store, liveness from the registry.
pub async fn list(domain: &Domain, principal: &Principal, query: &ListQuery) -> Result<AgentPage> {
    principal.require(Role::Readonly)?;
    let selector = Selector::parse(&query.target)?;
    let limit = match query.limit {
        0 => DEFAULT_PAGE,
        limit if limit > MAX_PAGE => {
            return Err(Error::Invalid(format!(
                "limit {limit} is above the most agents a page holds ({MAX_PAGE})"
            )))
        }
        limit => limit,
    };
    let mut after = decode_cursor(&query.cursor)?;
    // Quarantine is a column: a state filter that needs it set, or clear, is done in SQL.
    let wants = |state| query.states.is_empty() || query.states.contains(&state);
    let quarantined = match (wants(AgentState::Quarantined), query.states.len()) {
        (_, 0) => None,
        (true, 1) => Some(true),
        (false, _) => Some(false),
        (true, _) => None,
    };
    let batch = (limit + 1).clamp(SCAN_BATCH, MAX_PAGE + 1);
    let uses_facts = selector.uses_facts();
    let mut agents: Vec<AgentView> = Vec::new();
    loop {
        let rows = domain
            .store
            .fleet()
            .list_agents_page(&after, batch, quarantined)
            .await?;
        let exhausted = rows.len() < batch;
        if let Some(last) = rows.last() {
            after = last.id.clone();
        }
        for row in rows {
            let Some(entry) = entry_if_selected(domain, &selector, uses_facts, row) else {
                continue;
            };
            if !wants(entry.state()) {
                continue;
            }
            if agents.len() == limit {
                let last = agents
                    .last()
                    .map(|agent| agent.id.as_str())
                    .unwrap_or_default();
                return Ok(AgentPage {
                    next_cursor: Some(encode_cursor(last)),
                    agents,
                });
            }
            agents.push(entry.into());
        }
        if exhausted {
            return Ok(AgentPage {
                agents,
                next_cursor: None,
            });
        }
    }
}

/// The ids of the enrolled agents `target` selects (any state), for views that filter stored
/// rows by a selector.
pub async fn matching_ids(domain: &Domain, target: &str) -> Result<Vec<String>> {
    let selector = Selector::parse(target)?;
    Ok(matching(domain, &selector)
        .await?
        .into_iter()
        .map(|entry| AgentView::from(entry).id)
        .collect())
}

/// Registry entries of the enrolled agents `selector` matches.
async fn matching(domain: &Domain, selector: &Selector) -> Result<Vec<registry::Entry>> {
    let rows = domain.store.fleet().list_agents().await?;
    let uses_facts = selector.uses_facts();
    Ok(rows
        .into_iter()
        .filter_map(|row| entry_if_selected(domain, selector, uses_facts, row))
        .collect())
}

/// The registry entry of the agent in `row` when `selector` matches it (the registry learns
/// the row if it did not know it).
fn entry_if_selected(
    domain: &Domain,
    selector: &Selector,
    uses_facts: bool,
    row: crate::store::AgentRow,
) -> Option<registry::Entry> {
    let registry = &domain.fleet.registry;
    let labels: BTreeMap<String, String> = serde_json::from_str(&row.labels).unwrap_or_default();
    // Facts as this process has them (reported here, perhaps not stored yet), else the
    // store's; parsed only for a selector that looks at them.
    let facts = if uses_facts {
        registry
            .facts_text(&row.id)
            .or_else(|| row.facts.clone())
            .as_deref()
            .map(facts::from_text)
            .unwrap_or_default()
    } else {
        Facts::new()
    };
    if !selector.matches(&row.id, &labels, &facts) {
        return None;
    }
    if !registry.contains(&row.id) {
        let id = row.id.clone();
        registry.update(row);
        return registry.get(&id);
    }
    registry.get(&row.id)
}

pub async fn get(domain: &Domain, principal: &Principal, id: &str) -> Result<AgentView> {
    principal.require(Role::Readonly)?;
    let row = domain
        .store
        .get_agent(id)
        .await?
        .ok_or_else(|| not_found(id))?;
    domain.fleet.registry.update(row);
    let entry = domain.fleet.registry.get(id).ok_or_else(|| not_found(id))?;
    Ok(entry.into())
}

fn not_found(id: &str) -> Error {
    Error::NotFound(format!("agent '{id}' not found"))
}

/// Quarantines an agent: its heartbeats count only for liveness and it gets no commands.
/// Audited as `agent.quarantine`; emits agent_quarantined.
pub async fn quarantine(
    domain: &Domain,
    principal: &Principal,
    id: &str,
    reason: &str,
) -> Result<AgentView> {
    change_quarantine(domain, principal, id, Some(reason)).await
}

/// Lifts an agent's quarantine. Audited as `agent.unquarantine`; emits agent_unquarantined.
pub async fn unquarantine(domain: &Domain, principal: &Principal, id: &str) -> Result<AgentView> {
    change_quarantine(domain, principal, id, None).await
}

/// `reason` is Some to quarantine, None to lift it.
async fn change_quarantine(
    domain: &Domain,
    principal: &Principal,
    id: &str,
    reason: Option<&str>,
) -> Result<AgentView> {
    let quarantined = reason.is_some();
    let reason = reason.unwrap_or_default();
    let (action, event_type) = if quarantined {
        ("agent.quarantine", EventKind::AgentQuarantined)
    } else {
        ("agent.unquarantine", EventKind::AgentUnquarantined)
    };
    let reason = reason.trim();
    let result = domain
        .auditor
        .gate(principal, Action::new(action, "agent", id), async {
            principal.require(Role::Operator)?;
            let row = domain
                .store
                .fleet()
                .set_quarantine(
                    id,
                    quarantined,
                    (!reason.is_empty()).then_some(reason),
                    &clock::now_rfc3339(),
                )
                .await?
                .ok_or_else(|| not_found(id))?;
            // The event is stored before the registry (what heartbeats are judged by) sees the
            // change, so what the change causes (the agent's reconnection once the quarantine
            // is lifted, its rejected heartbeats once it is set) always follows it in the log.
            let mut payload = serde_json::json!({"agent_id": id, "by": principal.name});
            if quarantined {
                payload["reason"] = serde_json::json!(reason);
            }
            domain.events.emit_system(event_type, id, payload).await;
            domain.fleet.registry.update(row);
            Ok::<_, Error>(())
        })
        .await;
    let detail = if quarantined {
        serde_json::json!({ "reason": reason })
    } else {
        serde_json::json!({})
    };
    domain
        .auditor
        .record(
            principal,
            Action::new(action, "agent", id).detail(detail),
            &result,
        )
        .await;
    result?;
    get(domain, principal, id).await
}

/// Changes an agent's labels: `set` adds or replaces, `remove` drops keys (operator, as for
/// quarantine). Audited as `agent.label`; the registry copy is updated at once, so a
/// `--target` on the new labels matches right after.
pub async fn set_labels(
    domain: &Domain,
    principal: &Principal,
    id: &str,
    set: &BTreeMap<String, String>,
    remove: &[String],
) -> Result<AgentView> {
    let result = domain
        .auditor
        .gate(principal, Action::new("agent.label", "agent", id), async {
            principal.require(Role::Operator)?;
            if set.is_empty() && remove.is_empty() {
                return Err(Error::Invalid(
                    "no label to set or remove (k=v to set, k- to remove)".into(),
                ));
            }
            for (key, value) in set {
                selector::check_label(key, value).map_err(Error::Invalid)?;
            }
            if let Some(key) = remove.iter().find(|key| set.contains_key(*key)) {
                return Err(Error::Invalid(format!(
                    "label '{key}' is both set and removed"
                )));
            }
            let row = domain
                .store
                .get_agent(id)
                .await?
                .ok_or_else(|| not_found(id))?;
            let mut labels: BTreeMap<String, String> =
                serde_json::from_str(&row.labels).unwrap_or_default();
            let before = labels.clone();
            for key in remove {
                labels.remove(key);
            }
            labels.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
            let text = serde_json::to_string(&labels).map_err(Error::internal)?;
            let row = domain
                .store
                .fleet()
                .set_labels(id, &text)
                .await?
                .ok_or_else(|| not_found(id))?;
            domain.fleet.registry.update(row);
            Ok::<_, Error>((before, labels))
        })
        .await;
    let mut detail = serde_json::json!({ "set": set, "remove": remove });
    if let Ok((before, after)) = &result {
        detail["before"] = serde_json::json!(before);
        detail["after"] = serde_json::json!(after);
    }
    domain
        .auditor
        .record(
            principal,
            Action::new("agent.label", "agent", id).detail(detail),
            &result,
        )
        .await;
    result?;
    get(domain, principal, id).await
}

/// Handles one heartbeat from agent `id` (authenticated by the bus: the subject is its own).
/// Events go through `sink`, so a storm of connecting agents is written in batches instead
/// of one fdatasync per agent.
pub async fn heartbeat(
    domain: &std::sync::Arc<Domain>,
    sink: &jobs::EventSink,
    id: &str,
    beat: &protocol::Heartbeat,
) {
    let registry = &domain.fleet.registry;
    // Facts come only when they changed or the agent reconnected; what the agent claims is
    // checked for shape and size before the server keeps it.
    let facts = beat
        .facts
        .as_ref()
        .and_then(|reported| match facts::check(reported) {
            Ok(()) => serde_json::to_string(reported).ok(),
            Err(why) => {
                tracing::warn!(agent_id = id, %why, "reported facts ignored");
                None
            }
        });
    let mut verdict = registry.heartbeat(id, &beat.hostname, &beat.version, facts.as_deref());
    // Every cluster member keeps every agent's liveness; only its owner announces it.
    let owner = domain.cluster.owns(id);
    if verdict == Verdict::Unknown {
        // Enrolled since the registry was loaded (or by another server): read it once.
        match domain.store.get_agent(id).await {
            Ok(Some(row)) => {
                registry.update(row);
                verdict = registry.heartbeat(id, &beat.hostname, &beat.version, facts.as_deref());
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(agent_id = id, error = %e, "cannot read agent"),
        }
    }
    // An agent that names the command keys it trusts (first heartbeat after a reconnection)
    // is told the server's when they differ: it may have missed a rotation or a retirement.
    if let (Some(trusted), true) = (&beat.command_keys, owner && verdict != Verdict::Unknown) {
        command_keys::on_heartbeat(domain, id, trusted);
    }
    match verdict {
        Verdict::Accepted {
            newly_connected: true,
        } if owner => {
            tracing::info!(agent_id = id, "agent connected");
            let payload = serde_json::json!({
                "agent_id": id, "hostname": beat.hostname, "version": beat.version,
            });
            sink.emit(EventKind::AgentConnected, id, payload);
        }
        Verdict::Rejected if owner => {
            let payload = serde_json::json!({"agent_id": id, "reason": "quarantined"});
            sink.emit(EventKind::AgentHeartbeatRejected, id, payload);
        }
        Verdict::Accepted { .. } | Verdict::Rejected => {}
        Verdict::Unknown => {
            tracing::warn!(
                agent_id = id,
                "heartbeat from an agent that is not enrolled"
            );
        }
    }
}

/// Reports agents silent for longer than the timeout: run every second or so by the server.
pub fn sweep(domain: &Domain, sink: &jobs::EventSink) {
    for (id, last) in domain.fleet.registry.sweep() {
        if !domain.cluster.owns(&id) {
            continue;
        }
        let last_heartbeat_at = last.map(clock::format_rfc3339);
        tracing::info!(agent_id = %id, ?last_heartbeat_at, "agent disconnected (heartbeat timeout)");
        let payload = serde_json::json!({
            "agent_id": id, "last_heartbeat_at": last_heartbeat_at,
            "timeout": clock::format_duration(domain.fleet.registry.timeout()),
        });
        sink.emit(EventKind::AgentDisconnected, &id, payload);
    }
}

/// Writes what heartbeats brought that the store does not have yet (times, then facts),
/// each in one transaction.
pub async fn save_heartbeats(domain: &Domain) {
    let mut unsaved = domain.fleet.registry.take_unsaved();
    // Each agent's times and facts are written by its owner only (one writer per row in a
    // cluster); every member received the same heartbeats and keeps them in memory.
    unsaved.retain(|(id, _)| domain.cluster.owns(id));
    if let Err(e) = domain.store.fleet().record_heartbeats(&unsaved).await {
        tracing::warn!(error = %e, agents = unsaved.len(), "heartbeat times not saved");
    }
    let mut facts = domain.fleet.registry.take_unsaved_facts();
    facts.retain(|(id, _)| domain.cluster.owns(id));
    if let Err(e) = domain.store.fleet().record_facts(&facts).await {
        // Unlike times, facts are not sent again with the next heartbeat: try again later.
        tracing::warn!(error = %e, agents = facts.len(), "reported facts not saved");
        domain.fleet.registry.unsaved_facts_again(&facts);
    }
}

/// The agents a job goes to, and why the others do not get it.
pub struct Targets {
    /// Connected and not quarantined: these get the command.
    pub reachable: Vec<String>,
    /// (agent id, why not): quarantined or not connected.
    pub skipped: Vec<(String, Skip)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    Quarantined,
    NotConnected { state: AgentState },
}

impl Skip {
    pub fn message(&self) -> String {
        match self {
            Skip::Quarantined => "agent is quarantined: no commands are sent to it".into(),
            Skip::NotConnected { state } => format!("agent is {state}: not connected"),
        }
    }
}

/// Resolves `target` to agents; NotFound when it matches none.
pub async fn targets(domain: &Domain, target: &str) -> Result<Targets> {
    let selector = Selector::parse(target)?;
    let states = if selector.uses_facts() {
        let entries = matching(domain, &selector).await?;
        entries
            .into_iter()
            .map(|entry| {
                let state = entry.state();
                (entry.row.id, state)
            })
            .collect()
    } else {
        // By id and labels alone: only those two columns are read, matched against the
        // registry without copying its entries. Resolving 18,000 agents through whole rows and
        // entries took ~100 ms before the first command went out.
        let rows = domain.store.fleet().list_agent_labels().await?;
        let (mut states, unknown) = domain.fleet.registry.select(&rows, &selector);
        for id in unknown {
            // Enrolled through another member since this one loaded its registry.
            let Some(row) = domain.store.get_agent(&id).await? else {
                continue;
            };
            if let Some(entry) = entry_if_selected(domain, &selector, false, row) {
                states.push((id, entry.state()));
            }
        }
        crate::sort::sort_by(&mut states, |a, b| a.0.cmp(&b.0));
        states
    };
    if states.is_empty() {
        let shown = if target.trim().is_empty() {
            "*"
        } else {
            target
        };
        return Err(Error::NotFound(format!(
            "no enrolled agent matches '{shown}'"
        )));
    }
    let mut targets = Targets {
        reachable: Vec::new(),
        skipped: Vec::new(),
    };
    for (id, state) in states {
        match state {
            AgentState::Connected => targets.reachable.push(id),
            AgentState::Quarantined => targets.skipped.push((id, Skip::Quarantined)),
            state => targets.skipped.push((id, Skip::NotConnected { state })),
        }
    }
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_foreign_ones_are_refused() {
        for id in ["web-01", "sim-49999", "a.b_c", "ü"] {
            assert_eq!(decode_cursor(&encode_cursor(id)).unwrap(), id);
        }
        assert_eq!(decode_cursor("").unwrap(), "");
        // Not base64url, padded, control characters, not UTF-8, too long.
        let long = encode_cursor(&"x".repeat(257));
        for cursor in ["%%", "d2ViLTAx=", "AAAA", "_w", long.as_str()] {
            let error = decode_cursor(cursor).unwrap_err();
            assert!(
                error.to_string().contains("invalid cursor"),
                "{cursor}: {error}"
            );
        }
    }

    /// The document's pattern takes the cursors of printable ASCII ids, and each cursor it
    /// takes is one `decode_cursor` takes: every string of up to three characters, and longer
    /// ones at random.
    #[test]
    fn the_cursor_pattern_matches_the_decoder() {
        let pattern = regex::Regex::new(&cursor_pattern()).unwrap();
        for id in [
            "web-01",
            "sim-49999",
            "a.b_c",
            " ~",
            &"x".repeat(256),
            &"yz".repeat(128),
        ] {
            assert!(pattern.is_match(&encode_cursor(id)), "{id}");
        }
        for id in ["", &"x".repeat(257), &"x".repeat(258), "\u{7f}", "ü"] {
            assert!(!pattern.is_match(&encode_cursor(id)), "{id:?}");
        }
        let alphabet: Vec<char> =
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=%"
                .chars()
                .collect();
        let check = |cursor: &str| {
            let printable =
                decode_cursor(cursor).is_ok_and(|id| id.bytes().all(|b| (0x20..0x7f).contains(&b)));
            assert_eq!(pattern.is_match(cursor), printable, "{cursor}");
        };
        for a in &alphabet {
            check(&a.to_string());
            for b in &alphabet {
                check(&format!("{a}{b}"));
                for c in &alphabet {
                    check(&format!("{a}{b}{c}"));
                }
            }
        }
        for _ in 0..20_000 {
            let length = rand::random::<usize>() % 12 + 4;
            let cursor: String = (0..length)
                .map(|_| alphabet[rand::random::<usize>() % 64])
                .collect();
            check(&cursor);
            // Printable ids of every length up to the longest, and one past it.
            let id: String = (0..rand::random::<usize>() % 258 + 1)
                .map(|_| char::from(rand::random::<u8>() % 95 + 0x20))
                .collect();
            check(&encode_cursor(&id));
        }
    }

    #[test]
    fn states_parse_as_a_comma_list() {
        use AgentState::*;
        let cases: [(&str, &[AgentState]); 5] = [
            ("", &[]),
            ("connected", &[Connected]),
            ("pending, quarantined", &[Pending, Quarantined]),
            ("connected,,connected", &[Connected]),
            ("disconnected,pending", &[Disconnected, Pending]),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_states(text).unwrap(), expected, "{text}");
        }
        assert!(parse_states("asleep").is_err());
        assert!(parse_states("Connected").is_err());
    }
}
