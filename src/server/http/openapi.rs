//! /api/v1/openapi.json: the OpenAPI 3 document of every REST route (contract §5, beyond).
//!
//! Written by hand next to the router, as data: `openapi.json` beside this file is the document
//! as served, in serde_json's pretty form with its keys in the order they are served (sorted).
//! It is embedded in the binary and filled in once, at the first request; tests/rest.rs checks
//! that every route the router serves appears in it, so the two cannot drift apart silently.
//! (The document was `json!` code before: that one function was 134 KB of machine code in the
//! stripped release binary, the largest function in it.)
//!
//! The values other modules own are not copied into the file: a string `"$svc:NAME"` stands
//! where each goes, and [`placeholders`] names them. An unknown placeholder, or one the file
//! never uses, fails the unit tests. The three patterns below are placeholders too although
//! only this file uses them: built from pieces (`space!`) and commented with the parsers they
//! describe, they read better here than as one line of JSON escapes each.
//!
//! What the file holds by convention (JSON has no comments; the unit tests check the first two):
//! - Every operation answers 405 (`#/components/responses/MethodNotAllowed`). One that needs a
//!   key (`security`) also lists 400, 401, 403 and 429, the same for every route, and one with a
//!   request body 408, 413 and 415.
//! - Query parameters are `allowEmptyValue`: every route reads an empty value (`?since=`) as
//!   the parameter's absence, except that `flag=` is true.
//! - A count (`limit`, `cursor`, `after`, `minutes`) is any unsigned 64-bit integer, as
//!   `query::Query::number` reads it; a point in time is RFC 3339 or a duration ago, as
//!   `clock::parse_time_or_ago` reads it.
//! - An agent's `facts` (docs/fleet.md, "Facts") are a flat object of scalars and lists.
//! - `/api/v1/events/stream`: the schema is one server-sent event as a client parses it (an
//!   event with its sequence as the id, or the error that ends the stream; `data` is one line of
//!   JSON). Last-Event-ID (an integer, read only without `after`) is left to the summary: a
//!   schema cannot say that `after` makes the server ignore it.

use std::sync::OnceLock;

use http::{header, Response, StatusCode};
use serde_json::Value;

use super::{full, Body};
use crate::events;

/// The document as written, with a `"$svc:NAME"` string where each value of [`placeholders`]
/// goes; without its white space (build.rs), which is a third of the file.
const TEXT: &str = include_str!(concat!(env!("OUT_DIR"), "/openapi.min.json"));

/// How a placeholder string starts; the rest is its name.
const PLACEHOLDER: &str = "$svc:";

/// A key's name as `auth::keys` accepts it: 1–128 characters after surrounding whitespace is
/// trimmed, none of them a control character (Unicode Cc).
const NAME_PATTERN: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]*[^\\s\\u0000-\\u001F\\u007F-\\u009F][^\\u0000-\\u001F\\u007F-\\u009F]*$";

/// What Rust's `str::trim` removes (Unicode White_Space), for patterns of trimmed values.
macro_rules! space {
    () => {
        "[\\t\\n\\u000B\\u000C\\r \\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000]"
    };
}

/// A duration before now as `clock::parse_duration` reads it: digits and an optional unit
/// (`500ms`, `30s`, `5m`, `24h`, `7d`, `2w`; none: seconds), surrounding white space trimmed.
/// The digits are as many as fit in 64 bits of milliseconds for every value (longer ones that
/// still fit are read as well).
const DURATION_PATTERN: &str = concat!(
    "^",
    space!(),
    "*0*([0-9]{1,19}ms|[0-9]{1,16}s?|[0-9]{1,14}m|[0-9]{1,12}h|[0-9]{1,11}d|[0-9]{1,10}w)",
    space!(),
    "*$"
);

/// A target selector as `fleet::selector::Selector::parse` accepts it: nothing (every agent),
/// ids and globs (letters, digits, `-`, `_`, `*`, `?`), or `key=value` pairs with a key that
/// is not blank, comma-separated; white space around items is trimmed.
const TARGET_PATTERN: &str = concat!(
    "^",
    space!(),
    "*([A-Za-z0-9_*?-]+(",
    space!(),
    "*,",
    space!(),
    "*[A-Za-z0-9_*?-]+)*)?",
    space!(),
    "*$",
    "|^[^,=]*[^,=\\s][^,=]*=[^,]*(,[^,=]*[^,=\\s][^,=]*=[^,]*)*$"
);

/// The values openapi.json leaves to the code, by placeholder name.
fn placeholders() -> Vec<(&'static str, Value)> {
    vec![
        ("version", env!("CARGO_PKG_VERSION").into()),
        (
            "event_types",
            events::TYPES.iter().map(|t| t.name).collect(),
        ),
        ("event_severities", events::SEVERITIES.into()),
        ("audit_severities", crate::audit::policy::SEVERITIES.into()),
        ("audit_outcomes", crate::audit::OUTCOMES[..].into()),
        ("fleet_max_page", crate::fleet::MAX_PAGE.into()),
        (
            "fleet_cursor_pattern",
            crate::fleet::cursor_pattern().into(),
        ),
        ("name_pattern", NAME_PATTERN.into()),
        ("duration_pattern", DURATION_PATTERN.into()),
        ("target_pattern", TARGET_PATTERN.into()),
    ]
}

/// Replaces every placeholder in `value` and counts the uses of each value; an unknown
/// placeholder is an error.
fn fill(value: &mut Value, values: &[(&str, Value)], uses: &mut [usize]) -> Result<(), String> {
    match value {
        Value::String(text) => {
            if let Some(name) = text.strip_prefix(PLACEHOLDER) {
                let index = values
                    .iter()
                    .position(|(known, _)| *known == name)
                    .ok_or_else(|| format!("openapi.json: unknown placeholder {text:?}"))?;
                uses[index] += 1;
                *value = values[index].1.clone();
            }
        }
        Value::Array(items) => {
            for item in items {
                fill(item, values, uses)?;
            }
        }
        Value::Object(fields) => {
            for item in fields.values_mut() {
                fill(item, values, uses)?;
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
    Ok(())
}

/// The document served: openapi.json with its placeholders filled in.
fn build() -> Result<Value, String> {
    let mut doc: Value =
        serde_json::from_str(TEXT).map_err(|error| format!("openapi.json: {error}"))?;
    let values = placeholders();
    let mut uses = vec![0; values.len()];
    fill(&mut doc, &values, &mut uses)?;
    if let Some(((name, _), _)) = values.iter().zip(&uses).find(|(_, uses)| **uses == 0) {
        return Err(format!("openapi.json never uses {PLACEHOLDER}{name}"));
    }
    Ok(doc)
}

pub fn document() -> Response<Body> {
    // Built once: the text and the values are fixed when the binary is, and the unit tests
    // build it.
    static BODY: OnceLock<Vec<u8>> = OnceLock::new();
    let body = BODY.get_or_init(|| {
        let doc = build().expect("openapi.json is valid (unit tests)");
        serde_json::to_vec(&doc).expect("a Value serializes")
    });
    // As `json_response` sends JSON.
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(body.as_slice()))
        .expect("static response parts are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_known_and_used() {
        let doc = build().unwrap();
        assert!(!doc.to_string().contains(PLACEHOLDER));
        let mut doc = serde_json::json!({"a": [{"b": "$svc:no_such_value"}]});
        let error = fill(&mut doc, &placeholders(), &mut [0; 10]).unwrap_err();
        assert!(error.contains("$svc:no_such_value"), "{error}");
    }

    /// The file reads in the order the document is served, in one layout, so that a diff of it
    /// is a diff of the document.
    #[test]
    fn the_file_is_in_serde_json_pretty_form() {
        const TEXT: &str = include_str!("openapi.json");
        let doc: Value = serde_json::from_str(TEXT).unwrap();
        assert_eq!(
            doc,
            serde_json::from_str::<Value>(super::TEXT).unwrap(),
            "build.rs's compact form"
        );
        let pretty = serde_json::to_string_pretty(&doc).unwrap() + "\n";
        if let Some((line, (written, expected))) = TEXT
            .lines()
            .zip(pretty.lines())
            .enumerate()
            .find(|(_, (written, expected))| written != expected)
        {
            panic!(
                "openapi.json line {}: {written:?}, in serde_json's pretty form (keys sorted, \
                 2-space indent) {expected:?}",
                line + 1
            );
        }
        assert_eq!(TEXT, pretty, "openapi.json ends without one newline");
    }

    /// What the `json!` code guaranteed by construction: the error responses every operation
    /// shares, and how query parameters are read.
    #[test]
    fn every_operation_follows_the_conventions() {
        let doc = build().unwrap();
        let mut shared: [Option<&Value>; 7] = Default::default();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                if method == "parameters" {
                    continue;
                }
                for parameter in operation["parameters"].as_array().into_iter().flatten() {
                    if parameter["in"] == "query" {
                        assert_eq!(parameter["required"], false, "{method} {path}: {parameter}");
                        assert_eq!(
                            parameter["allowEmptyValue"], true,
                            "{method} {path}: {parameter}"
                        );
                    }
                }
                let responses = &operation["responses"];
                assert_eq!(
                    responses["405"],
                    serde_json::json!({"$ref": "#/components/responses/MethodNotAllowed"}),
                    "{method} {path}"
                );
                let with_key = operation.get("security").is_some();
                let with_body = operation.get("requestBody").is_some();
                for (index, (code, listed)) in [
                    ("400", with_key),
                    ("401", with_key),
                    ("403", with_key),
                    ("429", with_key),
                    ("408", with_body),
                    ("413", with_body),
                    ("415", with_body),
                ]
                .into_iter()
                .enumerate()
                {
                    let response = responses.get(code);
                    assert_eq!(response.is_some(), listed, "{code} of {method} {path}");
                    if let Some(response) = response {
                        let first = *shared[index].get_or_insert(response);
                        assert_eq!(response, first, "{code} of {method} {path}");
                    }
                }
            }
        }
    }
}
