//! The 22 canonical event types (contract §8): name, category and default severity, in one
//! table. `svc-events types` prints it; emit refuses any other type.

/// Severities in increasing order.
pub const SEVERITIES: &[&str] = &["debug", "info", "warning", "error", "critical"];

pub struct EventType {
    pub name: &'static str,
    pub category: &'static str,
    pub severity: &'static str,
}

const fn t(name: &'static str, category: &'static str, severity: &'static str) -> EventType {
    EventType {
        name,
        category,
        severity,
    }
}

pub const TYPES: &[EventType] = &[
    t("agent_connected", "agent", "info"),
    t("agent_disconnected", "agent", "warning"),
    t("agent_enrolled", "agent", "info"),
    t("agent_quarantined", "agent", "warning"),
    t("agent_unquarantined", "agent", "info"),
    t("agent_heartbeat_rejected", "agent", "warning"),
    t("command_dispatched", "job", "info"),
    t("command_completed", "job", "info"),
    t("command_failed", "job", "error"),
    t("state_apply_started", "job", "info"),
    t("state_apply_succeeded", "job", "info"),
    t("state_apply_failed", "job", "error"),
    t("state_drift_detected", "job", "warning"),
    t("bus_healthy", "bus", "info"),
    t("bus_degraded", "bus", "error"),
    t("policy_allow", "policy", "debug"),
    t("policy_deny", "policy", "warning"),
    t("apikey_created", "security", "info"),
    t("apikey_revoked", "security", "info"),
    t("ca_signing_rotated", "security", "warning"),
    t("server_started", "system", "info"),
    t("server_stopping", "system", "info"),
];

pub fn find(name: &str) -> Option<&'static EventType> {
    TYPES.iter().find(|t| t.name == name)
}

/// The rank of a severity, or None if it is not one.
pub fn severity_rank(severity: &str) -> Option<usize> {
    SEVERITIES.iter().position(|s| *s == severity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_the_contract() {
        assert_eq!(TYPES.len(), 22);
        let categories = ["agent", "job", "bus", "policy", "security", "system"];
        for event_type in TYPES {
            assert!(
                categories.contains(&event_type.category),
                "{}",
                event_type.name
            );
            assert!(
                severity_rank(event_type.severity).is_some(),
                "{}",
                event_type.name
            );
        }
        let mut names: Vec<&str> = TYPES.iter().map(|t| t.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 22, "no duplicates");
    }
}
