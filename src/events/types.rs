//! The canonical event types (contract §8, plus the identity tokens' two and the fan-out's two): name, category and
//! default severity, in one table. `svc-events types` prints it; emit refuses any other type.
//! Types and severities are enums, so a misspelt one is a compile error, with the wire names
//! (snake_case types, lowercase severities) from serde.

use serde::{Deserialize, Serialize};

/// Severities in increasing order (the wire names, for help texts and CLI checks).
pub const SEVERITIES: &[&str] = &["debug", "info", "warning", "error", "critical"];

/// An event's severity, ordered from least to most severe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Debug,
    Info,
    Warning,
    Error,
    Critical,
}

impl Severity {
    pub const ALL: [Severity; 5] = [
        Severity::Debug,
        Severity::Info,
        Severity::Warning,
        Severity::Error,
        Severity::Critical,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Severity::Debug => "debug",
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
            Severity::Critical => "critical",
        }
    }

    pub fn parse(text: &str) -> Option<Severity> {
        Severity::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    AgentConnected,
    AgentDisconnected,
    AgentEnrolled,
    AgentQuarantined,
    AgentUnquarantined,
    AgentHeartbeatRejected,
    CommandDispatched,
    CommandCompleted,
    CommandFailed,
    StateApplyStarted,
    StateApplySucceeded,
    StateApplyFailed,
    StateDriftDetected,
    JobStarted,
    JobFinished,
    BusHealthy,
    BusDegraded,
    PolicyAllow,
    PolicyDeny,
    ApikeyCreated,
    ApikeyRevoked,
    CaSigningRotated,
    JwtIssued,
    JwtRevoked,
    ServerStarted,
    ServerStopping,
}

impl EventKind {
    pub const fn as_str(self) -> &'static str {
        use EventKind::*;
        match self {
            AgentConnected => "agent_connected",
            AgentDisconnected => "agent_disconnected",
            AgentEnrolled => "agent_enrolled",
            AgentQuarantined => "agent_quarantined",
            AgentUnquarantined => "agent_unquarantined",
            AgentHeartbeatRejected => "agent_heartbeat_rejected",
            CommandDispatched => "command_dispatched",
            CommandCompleted => "command_completed",
            CommandFailed => "command_failed",
            StateApplyStarted => "state_apply_started",
            StateApplySucceeded => "state_apply_succeeded",
            StateApplyFailed => "state_apply_failed",
            StateDriftDetected => "state_drift_detected",
            JobStarted => "job_started",
            JobFinished => "job_finished",
            BusHealthy => "bus_healthy",
            BusDegraded => "bus_degraded",
            PolicyAllow => "policy_allow",
            PolicyDeny => "policy_deny",
            ApikeyCreated => "apikey_created",
            ApikeyRevoked => "apikey_revoked",
            CaSigningRotated => "ca_signing_rotated",
            JwtIssued => "jwt_issued",
            JwtRevoked => "jwt_revoked",
            ServerStarted => "server_started",
            ServerStopping => "server_stopping",
        }
    }

    /// This type's row in [`TYPES`].
    pub fn info(self) -> &'static EventType {
        TYPES
            .iter()
            .find(|t| t.kind == self)
            .expect("every kind has a row in TYPES")
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

pub struct EventType {
    pub kind: EventKind,
    /// The wire name (`kind.as_str()`).
    pub name: &'static str,
    pub category: &'static str,
    pub severity: Severity,
}

const fn t(kind: EventKind, category: &'static str, severity: Severity) -> EventType {
    EventType {
        kind,
        name: kind.as_str(),
        category,
        severity,
    }
}

use EventKind::*;
use Severity as S;

pub const TYPES: &[EventType] = &[
    t(AgentConnected, "agent", S::Info),
    t(AgentDisconnected, "agent", S::Warning),
    t(AgentEnrolled, "agent", S::Info),
    t(AgentQuarantined, "agent", S::Warning),
    t(AgentUnquarantined, "agent", S::Info),
    t(AgentHeartbeatRejected, "agent", S::Warning),
    t(CommandDispatched, "job", S::Info),
    t(CommandCompleted, "job", S::Info),
    t(CommandFailed, "job", S::Error),
    t(StateApplyStarted, "job", S::Info),
    t(StateApplySucceeded, "job", S::Info),
    t(StateApplyFailed, "job", S::Error),
    t(StateDriftDetected, "job", S::Warning),
    t(JobStarted, "job", S::Info),
    t(JobFinished, "job", S::Info),
    t(BusHealthy, "bus", S::Info),
    t(BusDegraded, "bus", S::Error),
    t(PolicyAllow, "policy", S::Debug),
    t(PolicyDeny, "policy", S::Warning),
    t(ApikeyCreated, "security", S::Info),
    t(ApikeyRevoked, "security", S::Info),
    t(CaSigningRotated, "security", S::Warning),
    t(JwtIssued, "security", S::Info),
    t(JwtRevoked, "security", S::Info),
    t(ServerStarted, "system", S::Info),
    t(ServerStopping, "system", S::Info),
];

pub fn find(name: &str) -> Option<&'static EventType> {
    TYPES.iter().find(|t| t.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_the_contract() {
        // Contract §8's 22, plus jwt_issued and jwt_revoked (issue 11: identity tokens) and
        // job_started and job_finished (issue 36: one event per fan-out, docs/fleet.md).
        assert_eq!(TYPES.len(), 26);
        let categories = ["agent", "job", "bus", "policy", "security", "system"];
        for event_type in TYPES {
            assert!(
                categories.contains(&event_type.category),
                "{}",
                event_type.name
            );
            // The wire name serde gives the kind is the table's.
            assert_eq!(
                serde_json::to_value(event_type.kind).unwrap(),
                event_type.name
            );
            assert_eq!(event_type.kind.info().name, event_type.name);
        }
        let mut names: Vec<&str> = TYPES.iter().map(|t| t.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), TYPES.len(), "no duplicates");
    }

    #[test]
    fn severities_order_and_wire_names() {
        let names: Vec<&str> = Severity::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names, SEVERITIES);
        assert!(Severity::Critical > Severity::Warning);
        assert_eq!(Severity::parse("error"), Some(Severity::Error));
        assert_eq!(Severity::parse("fatal"), None);
        assert_eq!(serde_json::to_value(Severity::Warning).unwrap(), "warning");
    }
}
