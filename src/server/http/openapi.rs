//! /api/v1/openapi.json: the OpenAPI 3 document of every REST route (contract §5, beyond).
//!
//! Written by hand next to the router; tests/rest.rs checks that every route the router serves
//! appears here, so the two cannot drift apart silently.

use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::{json_response, Body};

fn error_response(description: &str) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
}

pub fn document() -> Response<Body> {
    let errors = json!({
        "400": error_response("malformed request"),
        "401": error_response("missing, unknown, expired or deleted API key"),
        "403": error_response("the key's role may not do this"),
        "429": error_response("rate limit exceeded; see Retry-After"),
    });
    let with_errors = |mut responses: Value, extra: &[(&str, &str)]| {
        for (code, value) in errors.as_object().expect("literal object") {
            responses[code] = value.clone();
        }
        for (code, description) in extra {
            responses[*code] = error_response(description);
        }
        responses
    };
    let key_ref = json!({"application/json": {"schema": {"$ref": "#/components/schemas/ApiKey"}}});
    let id_parameter =
        json!([{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}]);
    let doc = json!({
        "openapi": "3.0.3",
        "info": {"title": "svc REST API", "version": env!("CARGO_PKG_VERSION")},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
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
                    "name": {"type": "string"}, "role": {"type": "string", "enum": ["admin", "operator", "readonly"]},
                    "expires_at": {"type": "string", "format": "date-time"}}},
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
                "ApiKeyUpdate": {"type": "object", "additionalProperties": false, "properties": {
                    "name": {"type": "string"}, "role": {"type": "string", "enum": ["admin", "operator", "readonly"]}}},
            }
        },
        "paths": {
            "/health/live": {"get": {"summary": "Liveness", "responses": {"200": {"description": "alive"}}}},
            "/health/ready": {"get": {"summary": "Readiness per component", "responses": {
                "200": {"description": "ready"}, "503": {"description": "a component is not ok"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text exposition format"}}}},
            "/api/v1/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI 3"}}}},
            "/.well-known/jwks.json": {"get": {"summary": "JWT-SVID public keys (no key needed): the active signing CA's EC P-256 key, kid = its SHA-256 fingerprint, x5c = [signing CA, root]",
                "responses": {"200": {"description": "JWKS", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Jwks"}}}}}}},
            "/.well-known/jwt-revocations.json": {"get": {"summary": "Revoked JWT-SVIDs not yet expired, by jti (no key needed)",
                "responses": {"200": {"description": "revocation list", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/JwtRevocations"}}}}}}},
            "/api/v1/apikeys": {
                "get": {"summary": "List API keys (admin)", "security": [{"bearer": []}],
                    "responses": with_errors(json!({"200": {"description": "keys", "content": {"application/json": {"schema": {
                        "type": "object", "properties": {"apikeys": {"type": "array", "items": {"$ref": "#/components/schemas/ApiKey"}}}}}}}}), &[])},
                "post": {"summary": "Create an API key (admin); the key is in this response only", "security": [{"bearer": []}],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewApiKey"}}}},
                    "responses": with_errors(json!({"201": {"description": "created; includes `key`", "content": key_ref}}),
                        &[("413", "body too large"), ("422", "invalid name, role or expiry")])},
            },
            "/api/v1/apikeys/{id}": {
                "parameters": id_parameter,
                "get": {"summary": "Show an API key (admin)", "security": [{"bearer": []}],
                    "responses": with_errors(json!({"200": {"description": "the key", "content": key_ref}}), &[("404", "no such key")])},
                "patch": {"summary": "Rename or change the role of an API key (admin)", "security": [{"bearer": []}],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ApiKeyUpdate"}}}},
                    "responses": with_errors(json!({"200": {"description": "the key", "content": key_ref}}), &[("404", "no such key"), ("422", "invalid name or role")])},
                "delete": {"summary": "Delete an API key (admin); its next request gets 401", "security": [{"bearer": []}],
                    "responses": with_errors(json!({"204": {"description": "deleted"}}), &[("404", "no such key")])},
            }
        }
    });
    json_response(StatusCode::OK, &doc)
}
