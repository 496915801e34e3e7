//! What the server and agents say to each other on the bus (contract §7), as JSON:
//!
//! - agent → server `svc.agent.<id>.heartbeat`: [`Heartbeat`], every `heartbeat_interval`;
//! - server → agent `svc.agent.<id>.cmd`: [`Command`] (exec, state or module), signed by the server
//!   (`Svc-Signature` header, `signature.rs`); the agent runs nothing unsigned. A
//!   [`Work::CommandKeys`] notice travels there too, so it reaches an agent on its own
//!   subject whatever the bus's permissions (`bus.external_auth: jwt` included);
//! - agent → server `svc.agent.<id>.result`: [`Reply`], carrying the command's `job_id`;
//! - agent → server `svc.agent.<id>.content` (reply under `svc.agent.<id>.content.reply.`):
//!   [`ContentRequest`], one chunk of a state plan too large to travel in its command
//!   ([`PlanRef`]; `fleet::content`).
//!
//! Results travel on the agent's own subject rather than to a reply inbox: the broker lets an
//! agent publish only under `svc.agent.<its id>.`, so the subject a result arrives on proves
//! which agent sent it, and no agent can answer for another. That holds on the embedded
//! broker and, on an external cluster, with `bus.external_auth: jwt` (the agent's user JWT
//! carries those rights); with `token` nothing there enforces it (docs/fleet.md).

use serde::{Deserialize, Serialize};

use crate::facts::Facts;
use crate::state::{Mode, Plan};

// A module on its way to an agent, and what a state or module run reports: part of this
// protocol, defined where they are made (`modules::bundle`, `state`), below the fleet.
pub use crate::modules::bundle::ModuleBundle;
pub use crate::state::StateOutcome;

/// Most output an agent returns per stream (stdout, stderr); the rest is cut and flagged, so
/// that a result always fits in one bus message.
pub const MAX_OUTPUT_BYTES: usize = 256 * 1024;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Heartbeat {
    pub version: String,
    pub hostname: String,
    /// Jobs running on the agent when it sent this.
    pub running_jobs: u32,
    /// The host's facts (`crate::facts`), only in the first heartbeat after each
    /// (re)connection and in the first after they changed; absent otherwise. Heartbeats
    /// from tens of thousands of agents every few seconds must stay a few dozen bytes, and
    /// facts seldom change; the server keeps the last set it was sent. Absent in heartbeats
    /// of agents older than facts, which servers read as "no news".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub facts: Option<Facts>,
    /// The `signature::key_set_id` of the command-signing certificates the agent trusts,
    /// in the same heartbeats as facts: the server sends a [`Work::CommandKeys`] notice when
    /// it is not its own (a rotation or retirement the agent missed while offline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command_keys: Option<String>,
    /// When the agent sent it (its clock, Unix ms), under the heartbeat's signature
    /// (`agent_signature`): the server refuses one outside the freshness window or not newer
    /// than the last it accepted, so an old heartbeat replayed cannot keep a dead host alive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_at_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Command {
    pub job_id: String,
    /// How long the agent may take; it stops the work itself when this runs out.
    pub timeout_ms: u64,
    /// The agent this copy is for, and when the server issued it (Unix ms): both are under
    /// the signature, so a command cannot be sent to another agent or replayed later.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub agent_id: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub issued_at_ms: u64,
    #[serde(flatten)]
    pub work: Work,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Work {
    /// Run a program (no shell): argv[0] looked up on PATH.
    Exec { argv: Vec<String> },
    /// Check or apply a compiled state; `diff` (check only) asks for each changed file's
    /// unified diff. A plan too large for one bus message is left empty here and named by
    /// `plan_ref` instead: the agent fetches it by its chunks' SHA-256 (`fleet::content`).
    State {
        mode: Mode,
        #[serde(default)]
        plan: Plan,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        diff: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        plan_ref: Option<PlanRef>,
    },
    /// Run a module's exported function on the host (its facts are the host's), then check
    /// or apply the resources it returned like a state. Answered with a state outcome that
    /// also carries those resources and the module's log lines.
    Module {
        mode: Mode,
        module: ModuleBundle,
        function: String,
        /// `KEY=VALUE`, typed by the module's manifest on the agent.
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        max_steps: u64,
        #[serde(default)]
        max_memory: u64,
    },
    /// Trust these command-signing certificates (PEM, current first) from now on: sent after
    /// `svc-identity command-key rotate` (signed with the previous key, the set holding both)
    /// and after the previous key is retired (signed with the current one, the set holding it
    /// alone). A certificate the agent does not trust yet must chain to its root CA.
    /// Answered with an exec outcome.
    CommandKeys { certificates: String },
}

impl Work {
    /// The wire name of the kind (`"kind"` in the command), e.g. for metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Work::Exec { .. } => "exec",
            Work::State { .. } => "state",
            Work::Module { .. } => "module",
            Work::CommandKeys { .. } => "command_keys",
        }
    }
}

/// A compiled plan (its JSON) that the server stored in the file service rather than send in
/// the command: its size and SHA-256 and those of its chunks, in order. Under the command's
/// signature, so the agent's executor checks what the daemon fetched against it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanRef {
    pub size: u64,
    pub sha256: String,
    pub chunk_size: u64,
    pub chunks: Vec<String>,
    /// 0: `chunks` are the plan's. n: they hold the plan's chunk list (its raw 32-byte
    /// SHA-256s), n levels up, because on a bus with a small `max_payload` the list would
    /// not fit in the command (`fleet::content::store_plan`).
    #[serde(default, skip_serializing_if = "is_zero_depth")]
    pub list_depth: u32,
}

fn is_zero_depth(value: &u32) -> bool {
    *value == 0
}

/// An agent asks for one chunk of a stored plan, showing the signed command that named it:
/// the command's exact bytes and signature, as the agent received them, are its capability.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContentRequest {
    pub command: String,
    pub signature: String,
    pub chunk: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub job_id: String,
    pub duration_ms: u64,
    #[serde(flatten)]
    pub outcome: ReplyOutcome,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReplyOutcome {
    Exec(ExecOutcome),
    State(StateOutcome),
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ExecOutcome {
    /// The exit code; -1 when the process was killed (timeout) or never started.
    pub exit_code: i32,
    /// Output as (lossy) UTF-8, each cut at MAX_OUTPUT_BYTES.
    pub stdout: String,
    pub stderr: String,
    pub truncated: bool,
    pub timed_out: bool,
    /// The command could not run at all (not found, not executable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The agent id in `svc.agent.<id>.<kind>`, when the subject has that shape.
pub fn agent_of(subject: &str) -> Option<&str> {
    let rest = subject.strip_prefix("svc.agent.")?;
    let (id, _kind) = rest.split_once('.')?;
    (!id.is_empty()).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_shapes_round_trip() {
        let command = Command {
            job_id: "J".into(),
            timeout_ms: 5000,
            agent_id: String::new(),
            issued_at_ms: 0,
            work: Work::Exec {
                argv: vec!["uptime".into()],
            },
        };
        let text = serde_json::to_string(&command).unwrap();
        assert_eq!(
            text,
            r#"{"job_id":"J","timeout_ms":5000,"kind":"exec","argv":["uptime"]}"#
        );
        assert_eq!(serde_json::from_str::<Command>(&text).unwrap(), command);

        let reply = Reply {
            job_id: "J".into(),
            duration_ms: 3,
            outcome: ReplyOutcome::Exec(ExecOutcome {
                exit_code: 0,
                stdout: "up\n".into(),
                ..Default::default()
            }),
        };
        let text = serde_json::to_string(&reply).unwrap();
        assert_eq!(serde_json::from_str::<Reply>(&text).unwrap(), reply);
        assert!(serde_json::from_str::<Reply>(r#"{"job_id":"J"}"#).is_err());
    }

    #[test]
    fn heartbeats_carry_facts_only_when_given() {
        let plain = Heartbeat {
            version: "1".into(),
            hostname: "h".into(),
            running_jobs: 2,
            facts: None,
            command_keys: None,
            sent_at_ms: None,
        };
        let text = serde_json::to_string(&plain).unwrap();
        assert_eq!(text, r#"{"version":"1","hostname":"h","running_jobs":2}"#);
        // What agents older than facts send, and what they receive, still reads.
        assert_eq!(serde_json::from_str::<Heartbeat>(&text).unwrap(), plain);
        assert_eq!(
            serde_json::from_str::<Heartbeat>(r#"{"version":"1"}"#).unwrap(),
            Heartbeat {
                version: "1".into(),
                ..Heartbeat::default()
            }
        );
        let with_facts = Heartbeat {
            facts: Some(Facts::from([("os".to_string(), "debian".into())])),
            ..plain
        };
        let text = serde_json::to_string(&with_facts).unwrap();
        assert!(text.ends_with(r#","facts":{"os":"debian"}}"#), "{text}");
        assert_eq!(
            serde_json::from_str::<Heartbeat>(&text).unwrap(),
            with_facts
        );
    }

    #[test]
    fn agent_ids_from_subjects() {
        assert_eq!(agent_of("svc.agent.web-01.result"), Some("web-01"));
        assert_eq!(agent_of("svc.agent.web-01"), None);
        assert_eq!(agent_of("svc.agent..result"), None);
        assert_eq!(agent_of("svc.events.x"), None);
    }
}
