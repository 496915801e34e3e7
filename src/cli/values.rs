//! Flag values checked when the arguments are parsed (argh `from_str_fn`), so a bad value is a
//! usage error (exit 2, contract §1) that lists what is allowed, before any connection is
//! tried, instead of a refusal from the server (exit 1). The server still checks everything
//! itself; these use the same tables and parsers.
//!
//! argh prints `Error parsing option '--FLAG' with value 'V': MESSAGE`; each message here says
//! what is expected.

use crate::clock;

fn one_of(what: &str, value: &str, allowed: &[&str]) -> Result<String, String> {
    if allowed.contains(&value) {
        Ok(value.to_string())
    } else {
        Err(format!(
            "not a {what}; expected one of {}",
            allowed.join(", ")
        ))
    }
}

/// An event severity: debug, info, warning, error, critical.
pub fn event_severity(value: &str) -> Result<String, String> {
    one_of("severity", value, crate::events::types::SEVERITIES)
}

/// The event categories, in the order of the type table.
pub fn event_categories() -> Vec<&'static str> {
    let mut categories: Vec<&'static str> = Vec::new();
    for event_type in crate::events::types::TYPES {
        if !categories.contains(&event_type.category) {
            categories.push(event_type.category);
        }
    }
    categories
}

/// An event category: agent, job, bus, policy, security, system.
pub fn event_category(value: &str) -> Result<String, String> {
    one_of("category", value, &event_categories())
}

/// One of the canonical event types (`svc-events types`).
pub fn event_type(value: &str) -> Result<String, String> {
    let names: Vec<&str> = crate::events::types::TYPES.iter().map(|t| t.name).collect();
    one_of("canonical event type", value, &names)
}

/// A point in time: RFC 3339, or a duration ago.
pub fn time_or_ago(value: &str) -> Result<String, String> {
    match clock::parse_time_or_ago(value) {
        Some(_) => Ok(value.to_string()),
        None => Err(
            "not a time; expected RFC 3339 (2026-01-31T08:00:00Z) or a duration ago \
             (500ms, 30s, 5m, 24h, 7d)"
                .into(),
        ),
    }
}

/// A time in RFC 3339.
pub fn rfc3339(value: &str) -> Result<String, String> {
    match clock::parse_rfc3339(value) {
        Some(_) => Ok(value.to_string()),
        None => Err("not an RFC 3339 time; expected e.g. 2027-01-01T00:00:00Z".into()),
    }
}

/// A positive duration: 500ms, 30s, 5m, 24h, 7d.
pub fn duration(value: &str) -> Result<String, String> {
    match clock::parse_duration(value) {
        Some(d) if !d.is_zero() => Ok(value.to_string()),
        _ => Err("not a positive duration; expected e.g. 500ms, 30s, 5m, 24h, 7d".into()),
    }
}

/// An API key role: admin, operator, readonly.
pub fn role(value: &str) -> Result<String, String> {
    one_of("role", value, &["admin", "operator", "readonly"])
}

/// An audit severity: low, medium, high, critical.
pub fn audit_severity(value: &str) -> Result<String, String> {
    one_of("severity", value, crate::audit::policy::SEVERITIES)
}

/// An audit export format: json, jsonl, csv.
pub fn export_format(value: &str) -> Result<String, String> {
    one_of("format", value, &["json", "jsonl", "csv"])
}

/// A transit key type: aes256-gcm, ed25519.
pub fn transit_key_type(value: &str) -> Result<String, String> {
    use crate::secrets::transit::{AES256_GCM, ED25519_TYPE};
    one_of("transit key type", value, &[AES256_GCM, ED25519_TYPE])
}

/// A dynamic-credentials backend: postgres.
pub fn creds_backend(value: &str) -> Result<String, String> {
    one_of("backend", value, &[crate::secrets::leases::POSTGRES])
}

/// A `--target` selector: *, id globs, a comma list, or k=v,k2=v2 on labels and facts.
pub fn target(value: &str) -> Result<String, String> {
    crate::fleet::Selector::parse(value)
        .map(|_| value.to_string())
        .map_err(|e| e.to_string())
}

/// A log level or filter (`info`, `debug`, `svc=debug,info`): the daemons' too.
pub use crate::program::log_filter;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_messages() {
        assert_eq!(event_severity("error").unwrap(), "error");
        assert_eq!(
            event_severity("bogus").unwrap_err(),
            "not a severity; expected one of debug, info, warning, error, critical"
        );
        assert_eq!(
            event_categories(),
            ["agent", "job", "bus", "policy", "security", "system"]
        );
        assert!(event_category("nope").unwrap_err().contains("agent, job"));
        assert!(event_type("agent_connected").is_ok());
        assert!(event_type("agent_connect")
            .unwrap_err()
            .contains("server_stopping"));
        assert!(time_or_ago("24h").is_ok());
        assert!(time_or_ago("2026-01-31T08:00:00Z").is_ok());
        assert!(time_or_ago("yesterday").unwrap_err().contains("RFC 3339"));
        assert!(duration("0s").is_err());
        assert!(duration("5m").is_ok());
        assert!(role("root")
            .unwrap_err()
            .contains("admin, operator, readonly"));
        assert!(audit_severity("info").unwrap_err().contains("low, medium"));
        assert!(export_format("xml").is_err());
        assert!(transit_key_type("rsa").unwrap_err().contains("ed25519"));
        assert!(creds_backend("mysql").unwrap_err().contains("postgres"));
        assert!(target("role=web,db-01").is_err());
        assert!(target("web-*").is_ok());
        assert!(log_filter("debug").is_ok());
        assert!(log_filter("svc=bogus[").is_err());
    }
}
