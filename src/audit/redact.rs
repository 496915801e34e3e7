//! Redaction of audit details and exports (contract §9): values of keys named like
//! `*secret*`, `*password*`, `*token*`, `*key*` (but not `key_id`) become "[REDACTED]".

use serde_json::Value;

pub const REDACTED: &str = "[REDACTED]";

/// Whether a JSON key names a sensitive value.
pub fn is_sensitive_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    if key == "key_id" || key.ends_with("_key_id") {
        return false;
    }
    [
        "secret",
        "password",
        "passwd",
        "token",
        "key",
        "credential",
        "private",
    ]
    .iter()
    .any(|word| key.contains(word))
}

/// Redacts in place, at any depth.
pub fn redact(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if is_sensitive_key(key) && !child.is_null() {
                    *child = Value::String(REDACTED.into());
                } else {
                    redact(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn redaction_by_key_name() {
        let mut value = json!({
            "name": "ci", "key": "svc_abc", "key_id": "01J", "api_key": "x",
            "nested": [{"db_password": "p", "user": "u"}], "Token": 5, "secret_value": null,
        });
        redact(&mut value);
        assert_eq!(
            value,
            json!({
                "name": "ci", "key": REDACTED, "key_id": "01J", "api_key": REDACTED,
                "nested": [{"db_password": REDACTED, "user": "u"}], "Token": REDACTED, "secret_value": null,
            })
        );
    }
}
