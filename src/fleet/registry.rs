//! Liveness: which enrolled agents are connected, from their heartbeats.
//!
//! Kept in memory and written to the store in batches (`last_heartbeat_at`), because 10,000
//! agents heartbeating every 10 s would otherwise be 1,000 write transactions a second for a
//! value nobody reads between two list commands. The store stays the truth for who is
//! enrolled and who is quarantined; this cache holds a copy of each agent's row, refreshed
//! whenever this process changes it (enrolment, quarantine), and read from the store on a miss.
//!
//! Facts arrive with heartbeats (only when they changed or the agent reconnected) and reach
//! the store in the same batches. They are kept as the JSON text the store has (a few hundred
//! bytes an agent, one allocation) rather than parsed: they are read far less often than
//! they are held. Facts reported to this process win over the store's copy of the row, which
//! may not have them yet.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock;
use crate::facts::{self, Facts};
use crate::store::AgentRow;

/// Where an agent stands, as operators see it (wire names in snake_case).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    /// Heartbeating within the timeout.
    Connected,
    /// Heartbeated once, silent past the timeout.
    Disconnected,
    /// Enrolled, never heartbeated.
    Pending,
    /// Gets no commands; its heartbeats are rejected.
    Quarantined,
}

impl AgentState {
    pub const ALL: [AgentState; 4] = [
        AgentState::Connected,
        AgentState::Disconnected,
        AgentState::Pending,
        AgentState::Quarantined,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Connected => "connected",
            AgentState::Disconnected => "disconnected",
            AgentState::Pending => "pending",
            AgentState::Quarantined => "quarantined",
        }
    }
}

impl std::fmt::Display for AgentState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One agent as the registry knows it.
#[derive(Clone, Debug)]
pub struct Entry {
    pub row: AgentRow,
    pub labels: BTreeMap<String, String>,
    /// When the last accepted heartbeat arrived (monotonic).
    last_seen: Option<Instant>,
    /// The same instant as wall-clock milliseconds, for people and the store.
    pub last_heartbeat_ms: Option<i64>,
    pub connected: bool,
    pub hostname: String,
    pub version: String,
    /// `last_heartbeat_ms` is newer than what the store has.
    dirty: bool,
    /// `row.facts` is newer than what the store has.
    facts_dirty: bool,
    /// `row.facts` came from the agent, in a heartbeat to this process: a row read from the
    /// store does not replace them.
    facts_reported: bool,
    /// Connected again by an unquarantine: its next heartbeat reports it as newly connected.
    announce: bool,
    /// `row.public_key` decoded, what every result and heartbeat is verified with; kept here
    /// so the hot path neither decodes nor reads the store.
    public_key: Option<Arc<[u8]>>,
    /// The send time (agent's clock, Unix ms) of the last signed heartbeat accepted: a
    /// heartbeat must be newer, so one replayed within the freshness window does not count.
    heartbeat_sent_ms: u64,
}

impl Entry {
    fn new(row: AgentRow, timeout: Duration) -> Entry {
        let labels = serde_json::from_str(&row.labels).unwrap_or_default();
        let last_heartbeat_ms = row
            .last_heartbeat_at
            .as_deref()
            .and_then(clock::parse_rfc3339);
        // An agent that heartbeated within the timeout before this server started is taken as
        // still connected: a server restart must not flap every agent through
        // disconnected/connected. If it stays silent, the sweep reports it as usual.
        let age = last_heartbeat_ms.map(|ms| clock::now_millis().saturating_sub(ms).max(0) as u64);
        let recent = age.filter(|age| *age < timeout.as_millis() as u64);
        let last_seen =
            recent.and_then(|age| Instant::now().checked_sub(Duration::from_millis(age)));
        let row_key = row.public_key.clone();
        Entry {
            connected: last_seen.is_some() && !row.is_quarantined,
            row,
            labels,
            last_seen,
            last_heartbeat_ms,
            hostname: String::new(),
            version: String::new(),
            dirty: false,
            facts_dirty: false,
            facts_reported: false,
            announce: false,
            public_key: decode_public_key(&row_key),
            heartbeat_sent_ms: 0,
        }
    }

    /// The agent's facts (empty until it reports them).
    pub fn facts(&self) -> Facts {
        self.row
            .facts
            .as_deref()
            .map(facts::from_text)
            .unwrap_or_default()
    }

    /// connected | disconnected | pending (never heard from) | quarantined
    pub fn state(&self) -> AgentState {
        if self.row.is_quarantined {
            AgentState::Quarantined
        } else if self.connected {
            AgentState::Connected
        } else if self.last_heartbeat_ms.is_some() {
            AgentState::Disconnected
        } else {
            AgentState::Pending
        }
    }
}

/// What a heartbeat did.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted; `newly_connected` when the agent was not connected before.
    Accepted { newly_connected: bool },
    /// The agent is quarantined: its heartbeat does not count.
    Rejected,
    /// No such agent is enrolled (the caller reloads it from the store first).
    Unknown,
}

pub struct Registry {
    timeout: Duration,
    agents: Mutex<HashMap<String, Entry>>,
    /// Heartbeats from enrolled agents (quarantined ones included), for
    /// `svc_agent_heartbeats_total`.
    heartbeats: AtomicU64,
    /// Agents heard from before that connected again, for `svc_agent_reconnects_total`.
    reconnects: AtomicU64,
}

impl Registry {
    pub fn new(timeout: Duration) -> Registry {
        Registry {
            timeout,
            agents: Mutex::new(HashMap::new()),
            heartbeats: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
        }
    }

    /// Heartbeats accepted or rejected since start, and reconnections among them.
    pub fn totals(&self) -> (u64, u64) {
        (
            self.heartbeats.load(Ordering::Relaxed),
            self.reconnects.load(Ordering::Relaxed),
        )
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.agents.lock().expect("registry lock poisoned")
    }

    /// Replaces the cached rows with `rows` (start-up), keeping what is known of liveness.
    pub fn load(&self, rows: Vec<AgentRow>) {
        let mut agents = self.lock();
        for row in rows {
            Self::put(&mut agents, row, self.timeout);
        }
    }

    /// Caches a changed row (enrolment, quarantine), keeping liveness. A quarantined agent's
    /// heartbeats keep its liveness (they are rejected for everything else), so lifting the
    /// quarantine of an agent that kept heartbeating connects it at once.
    pub fn update(&self, row: AgentRow) {
        Self::put(&mut self.lock(), row, self.timeout);
    }

    fn put(agents: &mut HashMap<String, Entry>, row: AgentRow, timeout: Duration) {
        match agents.get_mut(&row.id) {
            Some(entry) => {
                entry.labels = serde_json::from_str(&row.labels).unwrap_or_default();
                if row.is_quarantined {
                    entry.connected = false;
                } else if entry.row.is_quarantined {
                    let live = entry
                        .last_seen
                        .is_some_and(|seen| seen.elapsed() <= timeout);
                    if live && !entry.connected {
                        entry.connected = true;
                        entry.announce = true;
                    }
                }
                if row.public_key != entry.row.public_key {
                    entry.public_key = decode_public_key(&row.public_key);
                    entry.heartbeat_sent_ms = 0;
                }
                let facts = if entry.facts_reported {
                    entry.row.facts.take()
                } else {
                    row.facts
                };
                entry.row = AgentRow {
                    last_heartbeat_at: entry.row.last_heartbeat_at.take(),
                    facts,
                    ..row
                };
            }
            None => {
                agents.insert(row.id.clone(), Entry::new(row, timeout));
            }
        }
    }

    /// The key an agent's messages are verified with: None when the agent is not cached,
    /// Some(None) when it has no key on record (enrolled before signing).
    pub fn public_key(&self, id: &str) -> Option<Option<Arc<[u8]>>> {
        self.lock().get(id).map(|entry| entry.public_key.clone())
    }

    /// Records `sent_ms` as the send time of `id`'s latest signed heartbeat when it is newer
    /// than the last one accepted; false when it is not (a replay).
    pub fn advance_heartbeat(&self, id: &str, sent_ms: u64) -> bool {
        match self.lock().get_mut(id) {
            Some(entry) if sent_ms > entry.heartbeat_sent_ms => {
                entry.heartbeat_sent_ms = sent_ms;
                true
            }
            Some(_) | None => false,
        }
    }

    /// Drops an agent deleted from the store (by another cluster member).
    pub fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    pub fn contains(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// The ids of the agents connected now.
    pub fn connected(&self) -> Vec<String> {
        let agents = self.lock();
        let connected = agents.values().filter(|entry| entry.connected);
        connected.map(|entry| entry.row.id.clone()).collect()
    }

    pub fn get(&self, id: &str) -> Option<Entry> {
        self.lock().get(id).cloned()
    }

    /// An agent's facts as JSON text, when it is cached and has reported some.
    pub fn facts_text(&self, id: &str) -> Option<String> {
        self.lock()
            .get(id)
            .and_then(|entry| entry.row.facts.clone())
    }

    /// The state of each agent of `rows` (id, labels as stored) that `selector` (not one on
    /// facts) matches, under one lock and without copying entries; the stored labels are
    /// parsed only when they differ from the ones cached. Ids the registry does not know come
    /// back apart: the caller reads those whole.
    pub fn select(
        &self,
        rows: &[(String, String)],
        selector: &super::selector::Selector,
    ) -> (Vec<(String, AgentState)>, Vec<String>) {
        let no_facts = Facts::new();
        let (mut selected, mut unknown) = (Vec::new(), Vec::new());
        let agents = self.lock();
        for (id, labels) in rows {
            let Some(entry) = agents.get(id) else {
                unknown.push(id.clone());
                continue;
            };
            let matched = if entry.row.labels == *labels {
                selector.matches(id, &entry.labels, &no_facts)
            } else {
                let stored = serde_json::from_str(labels).unwrap_or_default();
                selector.matches(id, &stored, &no_facts)
            };
            if matched {
                selected.push((id.clone(), entry.state()));
            }
        }
        (selected, unknown)
    }

    /// Every cached agent, by id.
    pub fn all(&self) -> Vec<Entry> {
        let mut entries: Vec<Entry> = self.lock().values().cloned().collect();
        crate::sort::sort_by(&mut entries, |a, b| a.row.id.cmp(&b.row.id));
        entries
    }

    /// Records a heartbeat from `id` (which the bus has authenticated), with the facts it
    /// carried (checked JSON text), if any. A quarantined agent's heartbeat is rejected, but
    /// its time and facts are still recorded: liveness is tracked throughout, and what a
    /// suspect host says about itself is worth seeing.
    pub fn heartbeat(
        &self,
        id: &str,
        hostname: &str,
        version: &str,
        facts: Option<&str>,
    ) -> Verdict {
        let mut agents = self.lock();
        let Some(entry) = agents.get_mut(id) else {
            return Verdict::Unknown;
        };
        self.heartbeats.fetch_add(1, Ordering::Relaxed);
        let was_heard = entry.last_heartbeat_ms.is_some();
        entry.last_seen = Some(Instant::now());
        entry.last_heartbeat_ms = Some(clock::now_millis());
        entry.dirty = true;
        if let Some(facts) = facts {
            if entry.row.facts.as_deref() != Some(facts) {
                entry.row.facts = Some(facts.to_string());
                entry.facts_dirty = true;
            }
            entry.facts_reported = true;
        }
        if entry.hostname != hostname {
            entry.hostname = hostname.to_string();
        }
        if entry.version != version {
            entry.version = version.to_string();
        }
        if entry.row.is_quarantined {
            return Verdict::Rejected;
        }
        if !entry.connected && was_heard {
            // Heard from before, then silent past the timeout (or restarted past it): a
            // reconnection. Lifting a quarantine (`announce`) is not one.
            self.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        let newly_connected = !entry.connected || std::mem::take(&mut entry.announce);
        entry.connected = true;
        Verdict::Accepted { newly_connected }
    }

    /// Marks agents silent for longer than the timeout as disconnected; returns them with
    /// their last heartbeat time.
    pub fn sweep(&self) -> Vec<(String, Option<i64>)> {
        let now = Instant::now();
        let mut gone = Vec::new();
        for (id, entry) in self.lock().iter_mut() {
            let silent = entry
                .last_seen
                .is_none_or(|seen| now.duration_since(seen) > self.timeout);
            if entry.connected && silent {
                entry.connected = false;
                gone.push((id.clone(), entry.last_heartbeat_ms));
            }
        }
        gone.sort();
        gone
    }

    /// Heartbeat times not yet in the store (and marks them written); the caller writes them.
    pub fn take_unsaved(&self) -> Vec<(String, String)> {
        let mut unsaved = Vec::new();
        for (id, entry) in self.lock().iter_mut() {
            if entry.dirty {
                entry.dirty = false;
                if let Some(ms) = entry.last_heartbeat_ms {
                    let at = clock::format_rfc3339(ms);
                    entry.row.last_heartbeat_at = Some(at.clone());
                    unsaved.push((id.clone(), at));
                }
            }
        }
        unsaved
    }

    /// Facts not yet in the store (and marks them written), as (agent id, JSON text); the
    /// caller writes them.
    pub fn take_unsaved_facts(&self) -> Vec<(String, String)> {
        let mut unsaved = Vec::new();
        for (id, entry) in self.lock().iter_mut() {
            if std::mem::take(&mut entry.facts_dirty) {
                if let Some(facts) = &entry.row.facts {
                    unsaved.push((id.clone(), facts.clone()));
                }
            }
        }
        unsaved
    }

    /// Marks facts whose write failed as unsaved again, unless newer ones arrived meanwhile
    /// (those are unsaved already).
    pub fn unsaved_facts_again(&self, failed: &[(String, String)]) {
        let mut agents = self.lock();
        for (id, facts) in failed {
            if let Some(entry) = agents.get_mut(id) {
                if entry.row.facts.as_deref() == Some(facts.as_str()) {
                    entry.facts_dirty = true;
                }
            }
        }
    }

    /// Agents by state, for `svc_agents{state}`.
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        let mut counts: BTreeMap<&'static str, u64> = AgentState::ALL
            .into_iter()
            .map(|state| (state.as_str(), 0))
            .collect();
        for entry in self.lock().values() {
            *counts.entry(entry.state().as_str()).or_default() += 1;
        }
        counts
    }
}

/// A stored public key (base64url) as bytes; an unreadable one counts as none, and every
/// message is then refused by `agent_signature` for want of a key that verifies.
fn decode_public_key(text: &Option<String>) -> Option<Arc<[u8]>> {
    use base64::Engine;
    let text = text.as_deref()?;
    match base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text) {
        Ok(bytes) => Some(bytes.into()),
        Err(_) => Some(Arc::from(&[][..])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str) -> AgentRow {
        AgentRow {
            id: id.into(),
            labels: r#"{"role":"web"}"#.into(),
            ..AgentRow::default()
        }
    }

    #[test]
    fn keys_are_cached_decoded_and_heartbeat_times_only_move_forward() {
        let registry = Registry::new(Duration::from_secs(30));
        registry.load(vec![row("old")]);
        assert_eq!(registry.public_key("zz"), None);
        assert_eq!(registry.public_key("old"), Some(None));
        let signed = AgentRow {
            public_key: Some("AQID".into()),
            ..row("new")
        };
        registry.update(signed.clone());
        assert_eq!(
            registry.public_key("new").unwrap().as_deref(),
            Some(&[1u8, 2, 3][..])
        );
        let cases = [(10, true), (10, false), (9, false), (11, true), (0, false)];
        for (sent, accepted) in cases {
            assert_eq!(registry.advance_heartbeat("new", sent), accepted, "{sent}");
        }
        // A new enrolment (a new key) starts the sequence again; an unreadable key verifies
        // nothing.
        registry.update(AgentRow {
            public_key: Some("!".into()),
            ..signed
        });
        assert_eq!(
            registry.public_key("new").unwrap().as_deref(),
            Some(&[][..])
        );
        assert!(registry.advance_heartbeat("new", 1));
        assert!(!registry.advance_heartbeat("zz", 1));
    }

    #[test]
    fn heartbeats_connect_and_silence_disconnects() {
        let registry = Registry::new(Duration::from_millis(50));
        registry.load(vec![row("a")]);
        assert_eq!(registry.get("a").unwrap().state(), AgentState::Pending);
        assert_eq!(registry.heartbeat("zz", "h", "v", None), Verdict::Unknown);
        assert_eq!(
            registry.heartbeat("a", "h", "v", None),
            Verdict::Accepted {
                newly_connected: true
            }
        );
        assert_eq!(
            registry.heartbeat("a", "h", "v", None),
            Verdict::Accepted {
                newly_connected: false
            }
        );
        assert!(registry.sweep().is_empty());
        assert_eq!(registry.take_unsaved().len(), 1);
        assert!(registry.take_unsaved().is_empty());
        std::thread::sleep(Duration::from_millis(80));
        let gone = registry.sweep();
        assert_eq!(gone.len(), 1);
        assert_eq!(registry.get("a").unwrap().state(), AgentState::Disconnected);
        assert!(registry.sweep().is_empty(), "reported once");
        assert_eq!(registry.totals(), (2, 0));
        registry.heartbeat("a", "h", "v", None);
        assert_eq!(registry.totals(), (3, 1), "back after a disconnection");
    }

    #[test]
    fn quarantine_rejects_and_restart_keeps_recent_agents_connected() {
        let registry = Registry::new(Duration::from_secs(30));
        let mut recent = row("recent");
        recent.last_heartbeat_at = Some(clock::now_rfc3339());
        let mut old = row("old");
        old.last_heartbeat_at = Some(clock::format_rfc3339(clock::now_millis() - 60_000));
        registry.load(vec![recent, old]);
        assert_eq!(
            registry.get("recent").unwrap().state(),
            AgentState::Connected
        );
        assert_eq!(
            registry.get("old").unwrap().state(),
            AgentState::Disconnected
        );

        let mut quarantined = row("recent");
        quarantined.is_quarantined = true;
        registry.update(quarantined);
        assert_eq!(
            registry.heartbeat("recent", "h", "v", None),
            Verdict::Rejected
        );
        assert_eq!(registry.counts()["quarantined"], 1);
        registry.update(row("recent"));
        // It heartbeated while quarantined: connected as soon as the quarantine is lifted,
        // and its next heartbeat is still reported as a (re)connection.
        assert_eq!(
            registry.get("recent").unwrap().state(),
            AgentState::Connected
        );
        assert_eq!(
            registry.heartbeat("recent", "h", "v", None),
            Verdict::Accepted {
                newly_connected: true
            }
        );
        assert_eq!(
            registry.heartbeat("recent", "h", "v", None),
            Verdict::Accepted {
                newly_connected: false
            }
        );
    }

    #[test]
    fn facts_are_kept_saved_once_and_win_over_older_rows() {
        let registry = Registry::new(Duration::from_secs(30));
        let mut stored = row("a");
        stored.facts = Some(r#"{"os":"alpine"}"#.into());
        registry.load(vec![stored.clone(), row("b")]);
        assert_eq!(registry.get("a").unwrap().facts()["os"], "alpine");
        assert!(registry.get("b").unwrap().facts().is_empty());
        // A heartbeat without facts changes none; one with the same facts saves nothing.
        registry.heartbeat("a", "h", "v", None);
        registry.heartbeat("a", "h", "v", Some(r#"{"os":"alpine"}"#));
        assert!(registry.take_unsaved_facts().is_empty());

        let debian = r#"{"os":"debian"}"#;
        registry.heartbeat("a", "h", "v", Some(debian));
        // The store's row (older, until the batch is written) does not undo them.
        registry.update(stored.clone());
        assert_eq!(registry.facts_text("a").as_deref(), Some(debian));
        assert_eq!(
            registry.take_unsaved_facts(),
            [("a".to_string(), debian.to_string())]
        );
        assert!(registry.take_unsaved_facts().is_empty(), "saved once");
        registry.unsaved_facts_again(&[("a".to_string(), debian.to_string())]);
        assert_eq!(
            registry.take_unsaved_facts().len(),
            1,
            "a failed write is retried"
        );

        // Facts in the store for an agent that reported none here (another server wrote
        // them) are taken.
        let mut elsewhere = row("b");
        elsewhere.facts = Some(debian.into());
        registry.update(elsewhere);
        assert_eq!(registry.get("b").unwrap().facts()["os"], "debian");

        // A quarantined agent's facts are recorded too.
        let mut quarantined = row("b");
        quarantined.is_quarantined = true;
        registry.update(quarantined);
        assert_eq!(
            registry.heartbeat("b", "h", "v", Some(r#"{"os":"arch"}"#)),
            Verdict::Rejected
        );
        assert_eq!(registry.get("b").unwrap().facts()["os"], "arch");
    }

    #[test]
    fn a_quarantined_agent_that_went_silent_is_not_connected_when_lifted() {
        let registry = Registry::new(Duration::from_millis(50));
        registry.load(vec![row("a")]);
        let mut quarantined = row("a");
        quarantined.is_quarantined = true;
        registry.update(quarantined);
        assert_eq!(registry.heartbeat("a", "h", "v", None), Verdict::Rejected);
        assert!(registry.get("a").unwrap().last_heartbeat_ms.is_some());
        std::thread::sleep(Duration::from_millis(80));
        registry.update(row("a"));
        assert_eq!(registry.get("a").unwrap().state(), AgentState::Disconnected);
        assert!(registry.sweep().is_empty(), "never reported connected");
    }
}
