//! /api/v1/openapi.json: the OpenAPI 3 document of every REST route (contract §5, beyond).
//!
//! Written by hand next to the router; tests/rest.rs checks that every route the router serves
//! appears here, so the two cannot drift apart silently.

use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::{json_response, Body};
use crate::events;

fn error_response(description: &str) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
}

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

pub fn document() -> Response<Body> {
    let errors = json!({
        "400": error_response("malformed request: not one JSON object, unknown or duplicate field, wrong type"),
        "401": error_response("missing, unknown, expired or deleted API key"),
        "403": error_response("the key's role may not do this"),
        "405": {"$ref": "#/components/responses/MethodNotAllowed"},
        "429": error_response("rate limit exceeded (code rate_limited; see Retry-After), or the key already has rate_limit.max_in_flight requests in progress (code too_many_in_flight; Retry-After: 1)"),
    });
    // What every operation with a request body adds.
    let body_errors: &[(&str, &str)] = &[
        ("408", "the body did not arrive within limits.body_timeout, or fell below limits.min_body_rate; the connection is closed"),
        ("413", "body larger than limits.max_request_body"),
        ("415", "the body is not sent as Content-Type: application/json (charset=utf-8 is the only parameter allowed)"),
    ];
    let with_errors = |mut responses: Value, extra: &[(&str, &str)]| {
        for (code, value) in errors.as_object().expect("literal object") {
            responses[code] = value.clone();
        }
        for (code, description) in extra {
            responses[*code] = error_response(description);
        }
        responses
    };
    let with_body_errors = |responses: Value, extra: &[(&str, &str)]| {
        let extra: Vec<(&str, &str)> = body_errors.iter().chain(extra).copied().collect();
        with_errors(responses, &extra)
    };
    let method_not_allowed = json!({"405": {"$ref": "#/components/responses/MethodNotAllowed"}});
    let open = |responses: Value| {
        let mut responses = responses;
        responses["405"] = method_not_allowed["405"].clone();
        responses
    };
    let name = json!({"type": "string", "minLength": 1, "maxLength": 128, "pattern": NAME_PATTERN,
        "description": "1–128 characters, none a control character; surrounding whitespace is trimmed"});
    let role = json!({"type": "string", "enum": ["admin", "operator", "readonly"]});
    let future = json!({"type": "string", "format": "date-time", "nullable": true,
        "description": "RFC 3339; must be in the future (422 otherwise). null or absent: no expiry \
            when creating, unchanged when updating"});
    let key_ref = json!({"application/json": {"schema": {"$ref": "#/components/schemas/ApiKey"}}});
    let id_parameter =
        json!([{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}]);
    // A query parameter: (name, schema, description). Every route reads an empty value
    // (`?since=`) as the parameter's absence, except that `flag=` is true.
    let with_params = |shared: &[(&str, Value, &str)], own: &[(&str, Value, &str)]| -> Value {
        shared
            .iter()
            .chain(own)
            .map(|(name, schema, description)| {
                json!({"name": name, "in": "query", "required": false, "allowEmptyValue": true,
                    "description": description, "schema": schema})
            })
            .collect()
    };
    let text = json!({"type": "string"});
    let flag =
        json!({"type": "boolean", "description": "true or 1, false or 0; an empty value is true"});
    // A number as `query::Query::number` reads it: any unsigned 64-bit integer (absent: 0).
    let count = json!({"type": "integer", "minimum": 0, "maximum": u64::MAX});
    // A point in time as `clock::parse_time_or_ago` reads it.
    let time = json!({"type": "string", "anyOf": [{"format": "date-time"}, {"pattern": DURATION_PATTERN}]});
    let one_of = |values: &[&str]| json!({"type": "string", "enum": values});
    let type_names: Vec<&str> = events::TYPES.iter().map(|t| t.name).collect();
    let event_filters = [
        (
            "type",
            json!({"type": "array", "items": one_of(&type_names)}),
            "event types, comma-separated or repeated",
        ),
        (
            "category",
            text.clone(),
            "agent, job, bus, policy, security or system (another matches no event)",
        ),
        ("severity", one_of(events::SEVERITIES), "minimum severity"),
        (
            "source",
            text.clone(),
            "exact source (the agent id for job events)",
        ),
        ("since", time.clone(), "RFC 3339 or a duration ago (1h)"),
        ("until", time.clone(), "RFC 3339 or a duration ago"),
    ];
    let page = |item: Value| {
        json!({"type": "object", "properties": {"items": {"type": "array", "items": item},
            "next_cursor": {"type": "string", "nullable": true}}})
    };
    let agent_ref = json!({"application/json": {"schema": {"$ref": "#/components/schemas/Agent"}}});
    // An agent's facts (docs/fleet.md, "Facts"): a flat object of scalars and lists.
    let facts = json!({"type": "object",
        "description": "what the agent last reported about its host (os, os_family, os_release, arch, kernel, hostname, fqdn, ip_addresses, cpus, memory_mb, init, virtual); empty until it reports. The agent's own claim: never a basis for authorization",
        "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"},
            {"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "number"}]}}]}});
    let mut doc = json!({
        "openapi": "3.0.3",
        "info": {"title": "svc REST API", "version": env!("CARGO_PKG_VERSION"),
            "description": "Errors are {\"error\":{\"code\",\"message\"}}. Request bodies are one JSON object sent as application/json. A connection without a complete request header for limits.idle_timeout (also between keep-alive requests) is closed; a malformed Content-Length gets hyper's own 400 with an empty body. Limits: docs/reliability.md."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "responses": {
                "MethodNotAllowed": {"description": "the path does not serve this method",
                    "headers": {"Allow": {"description": "the methods the path serves, e.g. `GET, POST`", "required": true, "schema": {"type": "string"}}},
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
            },
            "schemas": {
                "Error": {"type": "object", "properties": {"error": {"type": "object", "properties": {
                    "code": {"type": "string"}, "message": {"type": "string"}}}}},
                "ApiKey": {"type": "object", "required": ["id", "name", "role", "created_at"], "properties": {
                    "id": {"type": "string"}, "name": {"type": "string"},
                    "role": {"type": "string", "enum": ["admin", "operator", "readonly"]},
                    "created_at": {"type": "string", "format": "date-time"},
                    "last_used_at": {"type": "string", "format": "date-time", "nullable": true},
                    "expires_at": {"type": "string", "format": "date-time", "nullable": true}}},
                "NewApiKey": {"type": "object", "required": ["name", "role"], "additionalProperties": false, "properties": {
                    "name": name, "role": role, "expires_at": future}},
                "Jwks": {"type": "object", "required": ["keys"], "properties": {"keys": {"type": "array", "items": {
                    "type": "object", "required": ["kty", "crv", "x", "y", "kid"], "properties": {
                        "kty": {"type": "string", "enum": ["EC"]}, "crv": {"type": "string", "enum": ["P-256"]},
                        "x": {"type": "string"}, "y": {"type": "string"}, "kid": {"type": "string"},
                        "alg": {"type": "string", "enum": ["ES256"]}, "use": {"type": "string", "enum": ["sig"]},
                        "x5c": {"type": "array", "items": {"type": "string", "format": "byte"}}}}}}},
                "JwtRevocations": {"type": "object", "required": ["generated_at", "revoked"], "properties": {
                    "generated_at": {"type": "string", "format": "date-time"},
                    "revoked": {"type": "array", "items": {"type": "object", "required": ["jti", "revoked_at", "expires_at"], "properties": {
                        "jti": {"type": "string"}, "revoked_at": {"type": "string", "format": "date-time"},
                        "expires_at": {"type": "string", "format": "date-time"}}}}}},
                "Event": {"type": "object", "required": ["id", "seq", "type", "category", "severity", "source", "timestamp", "payload"], "properties": {
                    "id": {"type": "string"}, "seq": {"type": "integer", "format": "int64"},
                    "type": {"type": "string"}, "category": {"type": "string"},
                    "severity": {"type": "string", "enum": ["debug", "info", "warning", "error", "critical"]},
                    "source": {"type": "string"}, "timestamp": {"type": "string", "format": "date-time"},
                    "payload": {"type": "object"}}},
                "AuditEntry": {"type": "object", "properties": {
                    "id": {"type": "string"}, "seq": {"type": "integer"}, "timestamp": {"type": "string", "format": "date-time"},
                    "user": {"type": "string"}, "action": {"type": "string"}, "resource_type": {"type": "string"},
                    "resource_id": {"type": "string"}, "outcome": {"type": "string", "enum": ["success", "denied", "error", "attempt"]},
                    "policy_id": {"type": "string", "nullable": true}, "decision": {"type": "string", "nullable": true},
                    "severity": {"type": "string"}, "detail": {"type": "object", "description": "redacted"},
                    "prev_hash": {"type": "string"}, "hash": {"type": "string"}}},
                "Agent": {"type": "object", "properties": {
                    "id": {"type": "string"}, "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "state": {"type": "string", "enum": ["connected", "disconnected", "pending", "quarantined"]},
                    "quarantined": {"type": "boolean"}, "quarantine_reason": {"type": "string", "nullable": true},
                    "quarantined_at": {"type": "string", "nullable": true}, "last_heartbeat_at": {"type": "string", "nullable": true},
                    "enrolled_at": {"type": "string"}, "fingerprint": {"type": "string"},
                    "hostname": {"type": "string"}, "version": {"type": "string"},
                    "facts": facts}},
                "Job": {"type": "object", "description": "an exec, state or module run (docs/fleet.md, Jobs)", "properties": {
                    "id": {"type": "string"}, "kind": {"type": "string", "enum": ["exec", "state.apply", "state.check", "state.drift", "module.apply", "module.check"]},
                    "target": {"type": "string"}, "description": {"type": "string"}, "created_by": {"type": "string"},
                    "created_at": {"type": "string"}, "finished_at": {"type": "string", "nullable": true},
                    "status": {"type": "string", "enum": ["running", "finished", "interrupted"]},
                    "agents": {"type": "integer", "description": "targeted agents"},
                    "counts": {"type": "object", "description": "results so far by status", "additionalProperties": {"type": "integer"}}}},
                "SecretMetadata": {"type": "object", "description": "never a value", "properties": {
                    "path": {"type": "string"}, "version": {"type": "integer"}, "created_at": {"type": "string"},
                    "updated_at": {"type": "string"}, "deleted_at": {"type": "string", "nullable": true}}},
                "ApiKeyUpdate": {"type": "object", "additionalProperties": false,
                    "description": "The last active admin key (role admin, not expired) may not be demoted or given an expiry (409)",
                    "properties": {"name": name, "role": role, "expires_at": future}},
            }
        },
        "paths": {
            "/health/live": {"get": {"summary": "Liveness", "responses": open(json!({"200": {"description": "alive"}}))}},
            "/health/ready": {"get": {"summary": "Readiness per component", "responses": open(json!({
                "200": {"description": "ready"}, "503": {"description": "a component is not ok"}}))}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": open(json!({"200": {"description": "text exposition format"}}))}},
            "/api/v1/openapi.json": {"get": {"summary": "This document", "responses": open(json!({"200": {"description": "OpenAPI 3"}}))}},
            "/.well-known/jwks.json": {"get": {"summary": "JWT-SVID public keys (no key needed): the active signing CA's EC P-256 key, kid = its SHA-256 fingerprint, x5c = [signing CA, root]",
                "responses": open(json!({"200": {"description": "JWKS", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Jwks"}}}}}))}},
            "/.well-known/jwt-revocations.json": {"get": {"summary": "Revoked JWT-SVIDs not yet expired, by jti (no key needed)",
                "responses": open(json!({"200": {"description": "revocation list", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/JwtRevocations"}}}}}))}},
            "/api/v1/apikeys": {
                "get": {"summary": "List API keys (admin)", "security": [{"bearer": []}],
                    "responses": with_errors(json!({"200": {"description": "keys", "content": {"application/json": {"schema": {
                        "type": "object", "properties": {"apikeys": {"type": "array", "items": {"$ref": "#/components/schemas/ApiKey"}}}}}}}}), &[])},
                "post": {"summary": "Create an API key (admin); the key is in this response only", "security": [{"bearer": []}],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewApiKey"}}}},
                    "responses": with_body_errors(json!({"201": {"description": "created; includes `key`", "content": key_ref}}),
                        &[("422", "invalid name, role or expiry")])},
            },
            "/api/v1/apikeys/{id}": {
                "parameters": id_parameter,
                "get": {"summary": "Show an API key (admin)", "security": [{"bearer": []}],
                    "responses": with_errors(json!({"200": {"description": "the key", "content": key_ref}}), &[("404", "no such key")])},
                "patch": {"summary": "Rename an API key, change its role or give it an expiry (admin)", "security": [{"bearer": []}],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ApiKeyUpdate"}}}},
                    "responses": with_body_errors(json!({"200": {"description": "the key", "content": key_ref}}), &[("404", "no such key"),
                        ("409", "the key is the last active admin key: it may not be demoted or given an expiry (code failed_precondition)"),
                        ("422", "invalid name, role or expiry")])},
                "delete": {"summary": "Delete an API key (admin); its next request gets 401", "security": [{"bearer": []}],
                    "responses": with_errors(json!({"204": {"description": "deleted"}}), &[("404", "no such key"),
                        ("409", "the key is the last active admin key (code failed_precondition)")])},
            }
        }
    });
    // The console's routes (docs/console.md), added apart: one json! this size would pass
    // the macro recursion limit.
    doc["paths"]["/ui/"] = json!({"get": {"summary": "The web console (HTML; console.js and console.css beside it). Strict CSP, no cookies; docs/console.md",
                "responses": open(json!({"200": {"description": "the page"}, "404": {"description": "no such console file"}}))}});
    doc["paths"]["/api/v1/whoami"] = json!({"get": {"summary": "The caller's key id, name and role", "security": [{"bearer": []}],
                "responses": with_errors(json!({"200": {"description": "the caller", "content": {"application/json": {"schema": {
                    "type": "object", "properties": {"id": {"type": "string"}, "name": {"type": "string"}, "role": role}}}}}}), &[])}});
    doc["paths"]["/api/v1/events"] = json!({"get": {"summary": "A page of stored events, oldest first (svc-events list)", "security": [{"bearer": []}],
                "parameters": with_params(&event_filters, &[("limit", count.clone(), "page size (0 or absent: 100; above 1000: 1000)"), ("cursor", count.clone(), "the previous page's next_cursor")]),
                "responses": with_errors(json!({"200": {"description": "a page", "content": {"application/json": {"schema": page(json!({"$ref": "#/components/schemas/Event"}))}}}}), &[("422", "bad filter or cursor")])}});
    // Last-Event-ID (an integer, read only without `after`) is left to the summary: a schema
    // cannot say that `after` makes the server ignore it.
    let stream_parameters = with_params(
        &event_filters,
        &[
            (
                "after",
                count.clone(),
                "resume after this sequence (overrides Last-Event-ID); 0: the whole kept history",
            ),
            (
                "follow",
                flag.clone(),
                "false: send the history and end (default true)",
            ),
        ],
    );
    // One server-sent event as a client parses it: an event with its sequence as the id, or
    // the error that ends the stream. `data` is one line of JSON: an Event, or an Error.
    let sse_event = json!({"type": "object", "required": ["event", "data"], "properties": {
            "event": {"type": "string", "enum": ["event", "error"]},
            "id": {"type": "string", "pattern": "^[0-9]+$", "description": "the event's seq (none on `event: error`)"},
            "data": {"type": "string", "pattern": "^\\{.*\\}$", "description": "JSON: an Event (`event: event`) or an Error (`event: error`)"},
            "retry": {"type": "integer"}}});
    doc["paths"]["/api/v1/events/stream"] = json!({"get": {"summary": "Live tail as server-sent events (text/event-stream): `id: SEQ`, `event: event`, `data: Event JSON` per event; history after the resume point, then live. Resumes after `Last-Event-ID` or `after`; without either, starts now. `event: error` ends it on a failure",
                "security": [{"bearer": []}],
                "parameters": stream_parameters,
                "responses": with_errors(json!({"200": {"description": "the event stream; per OpenAPI 3.0 the schema is one event's (comments, such as the keep-alive every 15 s, and the opening `retry: 2000` carry none)",
                    "content": {"text/event-stream": {"schema": sse_event}}}}), &[("422", "bad filter or resume point")])}});
    doc["paths"]["/api/v1/events/timeline"] = json!({"get": {"summary": "Events per minute over the last `minutes` minutes (default 60, at most 1440)", "security": [{"bearer": []}],
                "parameters": with_params(&[], &[("minutes", count.clone(), "window length in minutes (0 or absent: 60; above 1440: 1440)")]),
                "responses": with_errors(json!({"200": {"description": "counts, oldest first", "content": {"application/json": {"schema": {"type": "object", "properties": {
                    "since": {"type": "string", "format": "date-time"}, "bucket_seconds": {"type": "integer"}, "counts": {"type": "array", "items": {"type": "integer"}}}}}}}}), &[("422", "minutes is not a number")])}});
    doc["paths"]["/api/v1/events/{id}"] = json!({"parameters": id_parameter.clone(),
                "get": {"summary": "One event by id (ULID) or sequence number", "security": [{"bearer": []}],
                "responses": with_errors(json!({"200": {"description": "the event", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Event"}}}}}), &[("404", "no such event")])}});
    doc["paths"]["/api/v1/audit"] = json!({"get": {"summary": "The audit log, newest first (svc-audit log)", "security": [{"bearer": []}],
                "parameters": with_params(&[], &[("since", time.clone(), "RFC 3339 or a duration ago (24h)"), ("until", time.clone(), "RFC 3339 or a duration ago"),
                    ("user", text.clone(), "key name"), ("action", text.clone(), "e.g. agent.quarantine"), ("resource_type", text.clone(), ""), ("policy_id", text.clone(), ""),
                    ("min_severity", one_of(crate::audit::policy::SEVERITIES), "minimum severity"), ("outcome", one_of(&crate::audit::OUTCOMES), "attempt: an attempt whose outcome is not written"),
                    ("attempts", flag.clone(), "also the attempt rows of finished changes (written before each change; hidden by default)"),
                    ("limit", count.clone(), "page size (0 or absent: 50; above 1000: 1000)"), ("cursor", json!({"type": "integer", "format": "int64"}), "the previous page's next_cursor")]),
                "responses": with_errors(json!({"200": {"description": "a page", "content": {"application/json": {"schema": page(json!({"$ref": "#/components/schemas/AuditEntry"}))}}}}), &[("422", "bad filter or cursor")])}});
    doc["paths"]["/api/v1/audit/verify"] = json!({"get": {"summary": "Walk the hash chain (svc-audit verify)", "security": [{"bearer": []}],
                "responses": with_errors(json!({"200": {"description": "the result", "content": {"application/json": {"schema": {"type": "object", "properties": {
                    "ok": {"type": "boolean"}, "rows": {"type": "integer"}, "first_bad": {"type": "string", "nullable": true}, "detail": {"type": "string", "nullable": true}}}}}}}), &[])}});
    doc["paths"]["/api/v1/audit/export"] = json!({"get": {"summary": "Export the log, redacted, in chain order (svc-audit export; admin)", "security": [{"bearer": []}],
                "parameters": with_params(&[], &[("format", one_of(&["csv", "json", "jsonl"]), "default jsonl"), ("since", time.clone(), "RFC 3339 or a duration ago"), ("until", time.clone(), "RFC 3339 or a duration ago")]),
                "responses": with_errors(json!({"200": {"description": "the rows as an attachment", "content": {"text/csv": {"schema": {"type": "string"}},
                    "application/json": {"schema": {"type": "array", "items": {"$ref": "#/components/schemas/AuditEntry"}}}, "application/jsonl": {"schema": {"type": "string"}}}}}), &[("422", "bad format or time")])}});
    doc["paths"]["/api/v1/agents"] = json!({"get": {"summary": "Enrolled agents with their state, a page at a time (svcctl agent list)", "security": [{"bearer": []}],
                "parameters": with_params(&[], &[("target", json!({"type": "string", "pattern": TARGET_PATTERN}), "a selector: *, a glob on ids (web-*), a comma list, or key=value pairs on labels and facts (role=web,os_family=debian; docs/fleet.md)"),
                    ("state", json!({"type": "array", "items": one_of(&["connected", "disconnected", "pending", "quarantined"])}), "only these states, comma-separated or repeated"),
                    ("limit", json!({"type": "integer", "minimum": 0, "maximum": crate::fleet::MAX_PAGE}), "page size (0 or absent: 500)"), ("cursor", json!({"type": "string", "pattern": crate::fleet::cursor_pattern()}), "the previous page's next_cursor")]),
                "responses": with_errors(json!({"200": {"description": "a page of agents by id; next_cursor is null on the last page", "content": {"application/json": {"schema": {"type": "object", "required": ["agents", "next_cursor"], "properties": {
                    "agents": {"type": "array", "items": {"$ref": "#/components/schemas/Agent"}},
                    "next_cursor": {"type": "string", "nullable": true}}}}}}}), &[("422", "bad selector, state, limit or cursor")])}});
    doc["paths"]["/api/v1/agents/{id}"] = json!({"parameters": id_parameter.clone(),
                "get": {"summary": "One agent", "security": [{"bearer": []}],
                "responses": with_errors(json!({"200": {"description": "the agent", "content": agent_ref.clone()}}), &[("404", "no such agent")])}});
    doc["paths"]["/api/v1/agents/{id}/quarantine"] = json!({"parameters": id_parameter.clone(),
                "post": {"summary": "Quarantine an agent (operator): it gets no commands; audited as agent.quarantine, emits agent_quarantined",
                "security": [{"bearer": []}],
                "requestBody": {"required": false, "content": {"application/json": {"schema": {"type": "object", "properties": {"reason": {"type": "string"}}}}}},
                "responses": with_body_errors(json!({"200": {"description": "the agent", "content": agent_ref.clone()}}), &[("404", "no such agent")])}});
    doc["paths"]["/api/v1/agents/{id}/unquarantine"] = json!({"parameters": id_parameter.clone(),
                "post": {"summary": "Lift an agent's quarantine (operator); audited as agent.unquarantine, emits agent_unquarantined", "security": [{"bearer": []}],
                "responses": with_errors(json!({"200": {"description": "the agent", "content": agent_ref}}), &[("404", "no such agent")])}});
    doc["paths"]["/api/v1/jobs"] = json!({"get": {"summary": "Jobs newest first (svcctl job list)", "security": [{"bearer": []}],
                "parameters": with_params(&[], &[("limit", count.clone(), "at most this many (0 or absent: 50; above 1000: 1000)"), ("before", text.clone(), "only jobs older than this job id (the next page)")]),
                "responses": with_errors(json!({"200": {"description": "jobs", "content": {"application/json": {"schema": {"type": "object", "properties": {
                    "jobs": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}}}}}}}}), &[("422", "bad limit")])}});
    doc["paths"]["/api/v1/jobs/{id}"] = json!({"parameters": id_parameter.clone(),
                "get": {"summary": "One job with its agents' results by agent id (svcctl job show; operator: results carry output)", "security": [{"bearer": []}],
                "parameters": with_params(&[], &[("limit", count.clone(), "results per page (0 or absent: 100; above 1000: 1000)"), ("after", text.clone(), "the previous page's next_after")]),
                "responses": with_errors(json!({"200": {"description": "the job and a page of results", "content": {"application/json": {"schema": {"type": "object", "properties": {
                    "job": {"$ref": "#/components/schemas/Job"}, "results": {"type": "array", "items": {"type": "object", "description": "as svcctl exec|state -o json prints one agent's result"}},
                    "next_after": {"type": "string", "nullable": true}}}}}}}), &[("404", "no such job (or pruned)"), ("422", "bad limit or job id")])}});
    doc["paths"]["/api/v1/secrets"] = json!({"get": {"summary": "Secret paths and metadata under a prefix, never values (svc-secrets list); audited as secret.list", "security": [{"bearer": []}],
                "parameters": with_params(&[], &[("prefix", text.clone(), "path prefix"), ("include_deleted", flag.clone(), "also paths whose current version is deleted")]),
                "responses": with_errors(json!({"200": {"description": "metadata", "content": {"application/json": {"schema": {"type": "object", "properties": {
                    "secrets": {"type": "array", "items": {"$ref": "#/components/schemas/SecretMetadata"}}}}}}}}), &[("422", "bad prefix")])}});
    json_response(StatusCode::OK, &doc)
}
