//! REST end to end: health, metrics, API keys, roles, rate limits, bad input, shutdown.

mod common;

use common::{http_request, run, Options, TestServer};

#[test]
fn health_live_and_ready() {
    let server = TestServer::start();
    let live = server.request("GET", "/health/live", None, None);
    assert_eq!(
        (live.status, live.json()),
        (200, serde_json::json!({"status": "ok"}))
    );
    let ready = server.request("GET", "/health/ready", None, None);
    assert_eq!(ready.status, 200);
    let body = ready.json();
    assert_eq!(body["ready"], true);
    for component in ["store", "grpc"] {
        assert_eq!(body["components"][component]["status"], "ok", "{body}");
    }
}

#[test]
fn readiness_reports_a_failing_component_with_503() {
    // SQLite whatever SVC_TEST_STORE says: the failure is made by taking svc.db away.
    let server = TestServer::start_sqlite();
    // Take the store away underneath the running server: the database file becomes a directory.
    let db = server.data_dir.join("svc.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    std::fs::create_dir(&db).unwrap();
    let ready = server.request("GET", "/health/ready", None, None);
    let body = ready.json();
    assert_eq!(ready.status, 503, "{body}");
    assert_eq!(body["ready"], false);
    assert_eq!(
        body["components"]["store"]["status"], "unavailable",
        "{body}"
    );
    assert!(body["components"]["store"]["detail"].is_string(), "{body}");
    assert_eq!(body["components"]["grpc"]["status"], "ok", "{body}");
    let metrics = server.request("GET", "/metrics", None, None).body;
    assert!(
        metrics.contains("svc_health_ready{component=\"store\"} 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("svc_health_ready{component=\"grpc\"} 1\n"),
        "{metrics}"
    );
}

/// Every non-comment line must be `name{labels} value` in the exposition format.
fn assert_valid_exposition(text: &str) {
    for line in text.lines() {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        assert!(
            value.parse::<f64>().is_ok() || value == "+Inf" || value == "NaN",
            "value: {line}"
        );
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "name: {line}"
        );
        assert!(
            !name.starts_with(|c: char| c.is_ascii_digit()),
            "name: {line}"
        );
        if name_end < series.len() {
            let labels = &series[name_end..];
            assert!(
                labels.starts_with('{') && labels.ends_with('}'),
                "labels: {line}"
            );
            for pair in labels[1..labels.len() - 1].split("\",") {
                let (key, value) = pair
                    .split_once("=\"")
                    .unwrap_or_else(|| panic!("label: {line}"));
                assert!(
                    key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "label name: {line}"
                );
                assert!(
                    !value.trim_end_matches('"').contains('\n'),
                    "label value: {line}"
                );
            }
        }
    }
}

#[test]
fn metrics_are_valid_exposition_format() {
    let server = TestServer::start();
    server.request("GET", "/api/v1/apikeys", None, None);
    server.request("GET", "/api/v1/apikeys", Some(&server.admin_key), None);
    server.request("GET", "/nope", None, None);
    let response = server.request("GET", "/metrics", None, None);
    assert_eq!(response.status, 200);
    assert!(response
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
    let text = &response.body;
    assert_valid_exposition(text);
    for expected in [
        "svc_health_ready{component=\"store\"} 1",
        "svc_health_ready{component=\"grpc\"} 1",
        "svc_http_requests_total{route=\"/api/v1/apikeys\",code=\"401\"} 1",
        "svc_http_requests_total{route=\"/api/v1/apikeys\",code=\"200\"} 1",
        "svc_http_request_duration_seconds_bucket{route=\"/api/v1/apikeys\",le=\"+Inf\"} 2",
        "# TYPE svc_api_errors_total counter",
    ] {
        assert!(text.contains(expected), "missing {expected}:\n{text}");
    }
    let errors: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("svc_api_errors_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(errors >= 2.0, "401 and 404 count as API errors: {errors}");
}

#[test]
fn api_key_lifecycle_and_delete_takes_effect_on_the_next_request() {
    let server = TestServer::start();
    let (id, key) = server.create_key("ci", "operator");
    assert!(key.starts_with("svc_") && key.len() == 44, "{key}");

    let list = server
        .request("GET", "/api/v1/apikeys", Some(&server.admin_key), None)
        .json();
    let names: Vec<&str> = list["apikeys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bootstrap-admin", "ci"]);
    assert!(
        list["apikeys"][1].get("key").is_none(),
        "the key is never shown again"
    );
    assert!(!list.to_string().contains(&key));

    let shown = server
        .request(
            "GET",
            &format!("/api/v1/apikeys/{id}"),
            Some(&server.admin_key),
            None,
        )
        .json();
    assert_eq!(
        (shown["name"].as_str(), shown["role"].as_str()),
        (Some("ci"), Some("operator"))
    );

    // The new key works (an operator may read health-level things but not keys: 403, not 401).
    let with_new = server.request("GET", "/api/v1/apikeys", Some(&key), None);
    assert_eq!(with_new.status, 403, "{}", with_new.body);

    let patched = server.request(
        "PATCH",
        &format!("/api/v1/apikeys/{id}"),
        Some(&server.admin_key),
        Some(r#"{"role":"admin"}"#),
    );
    assert_eq!(patched.status, 200, "{}", patched.body);
    assert_eq!(patched.json()["role"], "admin");
    assert_eq!(
        server
            .request("GET", "/api/v1/apikeys", Some(&key), None)
            .status,
        200
    );

    let deleted = server.request(
        "DELETE",
        &format!("/api/v1/apikeys/{id}"),
        Some(&server.admin_key),
        None,
    );
    assert_eq!(deleted.status, 204);
    let after = server.request("GET", "/api/v1/apikeys", Some(&key), None);
    assert_eq!(
        after.status, 401,
        "the very next request fails: {}",
        after.body
    );
    assert_eq!(after.json()["error"]["code"], "unauthenticated");

    let again = server.request(
        "DELETE",
        &format!("/api/v1/apikeys/{id}"),
        Some(&server.admin_key),
        None,
    );
    assert_eq!(again.status, 404);

    // Only hashes at rest: the cleartext key is nowhere in the database files (SQLite's, in
    // data_dir; on PostgreSQL there are none there and this checks nothing).
    for suffix in ["svc.db", "svc.db-wal"] {
        if let Ok(bytes) = std::fs::read(server.data_dir.join(suffix)) {
            assert!(
                !String::from_utf8_lossy(&bytes).contains(&key),
                "{suffix} holds a cleartext key"
            );
            assert!(!String::from_utf8_lossy(&bytes).contains(&server.admin_key));
        }
    }
    assert!(
        !server.log().contains(&key) && !server.log().contains(&server.admin_key),
        "keys never logged"
    );
}

#[test]
fn roles_are_enforced() {
    let server = TestServer::start();
    let (_, readonly) = server.create_key("viewer", "readonly");
    let create = server.request(
        "POST",
        "/api/v1/apikeys",
        Some(&readonly),
        Some(r#"{"name":"x","role":"admin"}"#),
    );
    assert_eq!(create.status, 403, "{}", create.body);
    assert_eq!(create.json()["error"]["code"], "permission_denied");
    for (method, path) in [
        ("GET", "/api/v1/apikeys"),
        ("GET", "/api/v1/apikeys/x"),
        ("DELETE", "/api/v1/apikeys/x"),
    ] {
        assert_eq!(
            server.request(method, path, Some(&readonly), None).status,
            403,
            "{method} {path}"
        );
    }
    // No key, a malformed key, a well-formed unknown key: 401.
    let unknown = format!("svc_{}", "A".repeat(40));
    for key in [None, Some("garbage"), Some(unknown.as_str())] {
        let response = server.request("GET", "/api/v1/apikeys", key, None);
        assert_eq!(response.status, 401, "{key:?}");
    }
    let basic = http_request(
        server.http,
        "GET",
        "/api/v1/apikeys",
        &[("Authorization", "Basic YTpi")],
        None,
    )
    .unwrap();
    assert_eq!(basic.status, 401);
}

#[test]
fn expired_keys_are_refused() {
    let server = TestServer::start();
    let past = server.request(
        "POST",
        "/api/v1/apikeys",
        Some(&server.admin_key),
        Some(r#"{"name":"old","role":"admin","expires_at":"2001-01-01T00:00:00Z"}"#),
    );
    assert_eq!(past.status, 422, "{}", past.body);
    let soon = svc::clock::format_rfc3339(svc::clock::now_millis() + 1500);
    let body = format!(r#"{{"name":"soon","role":"admin","expires_at":"{soon}"}}"#);
    let created = server.request(
        "POST",
        "/api/v1/apikeys",
        Some(&server.admin_key),
        Some(&body),
    );
    assert_eq!(created.status, 201, "{}", created.body);
    let key = created.json()["key"].as_str().unwrap().to_string();
    assert_eq!(created.json()["expires_at"], soon.as_str());
    std::thread::sleep(std::time::Duration::from_millis(1600));
    let response = server.request("GET", "/api/v1/apikeys", Some(&key), None);
    assert_eq!(response.status, 401);
    assert!(response.body.contains("expired"), "{}", response.body);
}

#[test]
fn rate_limit_answers_429_with_retry_after() {
    let server = TestServer::start_with(Options {
        config_yaml: "rate_limit: { requests_per_second: 1, burst: 3 }\n".into(),
        ..Options::default()
    });
    let statuses: Vec<u16> = (0..6)
        .map(|_| {
            server
                .request("GET", "/api/v1/apikeys", Some(&server.admin_key), None)
                .status
        })
        .collect();
    assert_eq!(&statuses[..3], &[200, 200, 200], "{statuses:?}");
    assert!(statuses[3..].contains(&429), "{statuses:?}");
    let limited = server.request("GET", "/api/v1/apikeys", Some(&server.admin_key), None);
    assert_eq!(limited.status, 429);
    let retry: u64 = limited
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(retry >= 1);
    assert_eq!(limited.json()["error"]["code"], "rate_limited");
    // Another key has its own bucket; health needs no key and is not limited.
    assert_eq!(
        server.request("GET", "/health/live", None, None).status,
        200
    );
}

#[test]
fn bad_requests_get_json_errors() {
    let server = TestServer::start();
    let key = Some(server.admin_key.as_str());
    let cases: &[(&str, &str, Option<&str>, u16, &str)] = &[
        (
            "POST",
            "/api/v1/apikeys",
            Some("{\"name\": "),
            400,
            "bad_request",
        ),
        ("POST", "/api/v1/apikeys", Some("[1,2]"), 400, "bad_request"),
        ("POST", "/api/v1/apikeys", Some(""), 400, "bad_request"),
        (
            "POST",
            "/api/v1/apikeys",
            Some(r#"{"name":"x","role":"admin","extra":1}"#),
            400,
            "bad_request",
        ),
        (
            "POST",
            "/api/v1/apikeys",
            Some(r#"{"name":"x","role":"root"}"#),
            422,
            "invalid_argument",
        ),
        (
            "POST",
            "/api/v1/apikeys",
            Some(r#"{"name":"","role":"admin"}"#),
            422,
            "invalid_argument",
        ),
        (
            "PATCH",
            "/api/v1/apikeys/nope",
            Some(r#"{"name":"y"}"#),
            404,
            "not_found",
        ),
        (
            "GET",
            "/api/v1/apikeys/01ZZZZZZZZZZZZZZZZZZZZZZZZ",
            None,
            404,
            "not_found",
        ),
        ("GET", "/api/v2/everything", None, 404, "not_found"),
        (
            "PUT",
            "/api/v1/apikeys",
            Some("{}"),
            405,
            "method_not_allowed",
        ),
    ];
    for (method, path, body, status, code) in cases {
        let response = server.request(method, path, key, *body);
        assert_eq!(
            response.status, *status,
            "{method} {path} {body:?}: {}",
            response.body
        );
        assert_eq!(response.json()["error"]["code"], *code, "{method} {path}");
        assert!(response.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    // Nothing was created by any of that.
    let list = server.request("GET", "/api/v1/apikeys", key, None).json();
    assert_eq!(list["apikeys"].as_array().unwrap().len(), 1);
}

#[test]
fn oversized_bodies_get_413() {
    let server = TestServer::start();
    let big = format!(
        r#"{{"name":"{}","role":"admin"}}"#,
        "x".repeat(2 * 1024 * 1024)
    );
    let response = server.request(
        "POST",
        "/api/v1/apikeys",
        Some(&server.admin_key),
        Some(&big),
    );
    assert_eq!(
        response.status,
        413,
        "{}",
        &response.body[..response.body.len().min(200)]
    );
    assert_eq!(response.json()["error"]["code"], "payload_too_large");
    assert_eq!(
        server.request("GET", "/health/live", None, None).status,
        200
    );
}

#[test]
fn garbage_on_the_ports_leaves_the_server_serving() {
    use std::io::{Read, Write};
    let server = TestServer::start();
    let junk: &[&[u8]] = &[
        b"\x00\x01\x02\xff\xfe garbage\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
        &[0xffu8; 70_000],
    ];
    for address in [server.http, server.grpc] {
        for bytes in junk {
            let mut stream = std::net::TcpStream::connect(address).unwrap();
            stream
                .set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
            let _ = stream.write_all(bytes);
            let mut sink = Vec::new();
            let _ = stream.read_to_end(&mut sink);
        }
        // Half-open connections that never speak must not block others either.
        let _idle = std::net::TcpStream::connect(address).unwrap();
    }
    assert_eq!(
        server.request("GET", "/health/ready", None, None).status,
        200
    );
    assert_eq!(
        server
            .request("GET", "/api/v1/apikeys", Some(&server.admin_key), None)
            .status,
        200
    );
}

#[test]
fn openapi_documents_every_route() {
    let server = TestServer::start();
    let response = server.request("GET", "/api/v1/openapi.json", None, None);
    assert_eq!(response.status, 200);
    let doc = response.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let routes = [
        ("/health/live", "get"),
        ("/health/ready", "get"),
        ("/metrics", "get"),
        ("/api/v1/openapi.json", "get"),
        ("/.well-known/jwks.json", "get"),
        ("/.well-known/jwt-revocations.json", "get"),
        ("/api/v1/apikeys", "get"),
        ("/api/v1/apikeys", "post"),
        ("/api/v1/apikeys/{id}", "get"),
        ("/api/v1/apikeys/{id}", "patch"),
        ("/api/v1/apikeys/{id}", "delete"),
    ];
    for (path, method) in routes {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} missing"
        );
        // Every path answers a method it does not serve with 405 and Allow.
        assert_eq!(
            doc["paths"][path][method]["responses"]["405"]["$ref"],
            "#/components/responses/MethodNotAllowed",
            "{method} {path}"
        );
    }
    assert_eq!(
        doc["components"]["responses"]["MethodNotAllowed"]["headers"]["Allow"]["required"],
        true
    );
    // The rules the server enforces on bodies are stated.
    for (path, method) in [
        ("/api/v1/apikeys", "post"),
        ("/api/v1/apikeys/{id}", "patch"),
    ] {
        let responses = &doc["paths"][path][method]["responses"];
        for code in ["400", "401", "403", "408", "413", "415", "422", "429"] {
            assert!(responses[code].is_object(), "{method} {path}: no {code}");
        }
        let body = &doc["paths"][path][method]["requestBody"]["content"];
        assert_eq!(body.as_object().unwrap().len(), 1, "application/json only");
    }
    for method in ["patch", "delete"] {
        assert!(doc["paths"]["/api/v1/apikeys/{id}"][method]["responses"]["409"].is_object());
    }
    for schema in ["NewApiKey", "ApiKeyUpdate"] {
        let schema = &doc["components"]["schemas"][schema];
        assert_eq!(schema["additionalProperties"], false);
        let name = &schema["properties"]["name"];
        assert_eq!(
            (name["minLength"].as_u64(), name["maxLength"].as_u64()),
            (Some(1), Some(128))
        );
        assert!(name["pattern"]
            .as_str()
            .unwrap()
            .contains("\\u0000-\\u001F"));
        assert_eq!(schema["properties"]["expires_at"]["format"], "date-time");
        assert_eq!(
            schema["properties"]["role"]["enum"],
            serde_json::json!(["admin", "operator", "readonly"])
        );
    }
}

#[test]
fn svcctl_apikey_end_to_end() {
    let server = TestServer::start();
    let admin = server.admin_key.clone();
    let created = run(server.cli("svcctl").args([
        "--api-key",
        &admin,
        "apikey",
        "create",
        "--name",
        "deploy",
        "--role",
        "operator",
        "-o",
        "json",
    ]));
    assert_eq!(created.code, 0, "{created:?}");
    let record: serde_json::Value = serde_json::from_str(&created.stdout).unwrap();
    let id = record["id"].as_str().unwrap().to_string();
    let key = record["key"].as_str().unwrap().to_string();

    let listed = run(server
        .cli("svcctl")
        .env("SVC_API_KEY", &admin)
        .args(["apikey", "list"]));
    assert_eq!(listed.code, 0, "{listed:?}");
    let header = listed.stdout.lines().next().unwrap();
    assert!(
        header.starts_with("ID") && header.contains("NAME") && header.contains("ROLE"),
        "{listed:?}"
    );
    assert!(
        listed
            .stdout
            .lines()
            .any(|l| l.starts_with(&id) && l.contains("deploy") && l.contains("operator")),
        "{listed:?}"
    );
    assert!(!listed.stdout.contains(&key));

    let json: serde_json::Value = serde_json::from_str(
        &run(server
            .cli("svcctl")
            .env("SVC_API_KEY", &admin)
            .args(["-o", "json", "apikey", "list"]))
        .stdout,
    )
    .unwrap();
    assert_eq!(json.as_array().unwrap().len(), 2);

    let shown = run(server
        .cli("svcctl")
        .env("SVC_API_KEY", &admin)
        .args(["apikey", "show", &id, "-o", "json"]));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&shown.stdout).unwrap()["name"],
        "deploy"
    );

    // The operator key is authenticated but may not manage keys: exit 4.
    let denied = run(server
        .cli("svcctl")
        .env("SVC_API_KEY", &key)
        .args(["apikey", "list"]));
    assert_eq!(denied.code, 4, "{denied:?}");
    assert!(denied.stderr.starts_with("svcctl: "), "{denied:?}");

    let deleted = run(server
        .cli("svcctl")
        .env("SVC_API_KEY", &admin)
        .args(["apikey", "delete", &id]));
    assert_eq!(deleted.code, 0, "{deleted:?}");
    let missing = run(server
        .cli("svcctl")
        .env("SVC_API_KEY", &admin)
        .args(["apikey", "show", &id]));
    assert_eq!(missing.code, 5, "{missing:?}");
    assert!(missing.stderr.contains("not found"), "{missing:?}");
    let gone = run(server
        .cli("svcctl")
        .env("SVC_API_KEY", &key)
        .args(["apikey", "list"]));
    assert_eq!(gone.code, 4, "{gone:?}");

    let no_key = run(server.cli("svcctl").args(["apikey", "list"]));
    assert_eq!(no_key.code, 4, "{no_key:?}");
    let bad_role = run(server
        .cli("svcctl")
        .env("SVC_API_KEY", &admin)
        .args(["apikey", "create", "--name", "x", "--role", "root"]));
    assert_eq!(bad_role.code, 2, "a usage error: {bad_role:?}");
    assert!(
        bad_role
            .stderr
            .contains("'root': not a role; expected one of admin, operator, readonly"),
        "{bad_role:?}"
    );
}

#[test]
fn sigterm_stops_cleanly_and_data_survives_a_restart() {
    let mut server = TestServer::start();
    let (id, key) = server.create_key("persist", "readonly");
    assert_eq!(server.stop_with(libc::SIGTERM), Some(0), "{}", server.log());
    assert!(
        server.log().contains("svc-server stopped"),
        "{}",
        server.log()
    );
    server.spawn(&[]);
    let shown = server.request(
        "GET",
        &format!("/api/v1/apikeys/{id}"),
        Some(&server.admin_key),
        None,
    );
    assert_eq!(shown.status, 200);
    let list = server
        .request("GET", "/api/v1/apikeys", Some(&server.admin_key), None)
        .json();
    assert_eq!(
        list["apikeys"].as_array().unwrap().len(),
        2,
        "no second bootstrap key on restart"
    );
    assert_eq!(
        server
            .request("GET", "/api/v1/apikeys", Some(&key), None)
            .status,
        403
    );
}

#[test]
fn bootstrap_key_from_the_environment() {
    let key = format!("svc_{}", "b".repeat(40));
    let server = TestServer::start_with(Options {
        env: vec![("SVC_BOOTSTRAP_API_KEY".into(), key.clone())],
        ..Options::default()
    });
    assert!(!server.data_dir.join("bootstrap-admin.key").exists());
    assert_eq!(
        server
            .request("GET", "/api/v1/apikeys", Some(&key), None)
            .status,
        200
    );
}

#[test]
fn bootstrap_key_file_is_private() {
    let server = TestServer::start();
    common::assert_private(&server.data_dir.join("bootstrap-admin.key"));
    assert!(svc::auth::looks_like_api_key(&server.admin_key));
}

/// Reads what the server sends on `stream` until it closes (or 5 s pass).
fn read_until_closed(stream: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut text = Vec::new();
    let _ = stream.read_to_end(&mut text);
    String::from_utf8_lossy(&text).into_owned()
}

#[test]
fn connection_caps_close_what_is_over_them_and_leave_other_ports_serving() {
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let server = TestServer::start_with(Options {
        config_yaml: "limits: { max_connections: 3, max_connections_per_address: 3 }\n".into(),
        ..Options::default()
    });
    // Connections that each served a request fill the REST cap (at most three of them: one
    // may still be the start-up probe's, which the server sees closing a moment later); the
    // next reads a 503 and is closed.
    let mut idle = Vec::new();
    let answer = loop {
        let mut connection = TcpStream::connect(server.http).unwrap();
        connection
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        std::io::Write::write_all(
            &mut connection,
            b"GET /health/live HTTP/1.1\r\nhost: x\r\n\r\n",
        )
        .unwrap();
        let mut buffer = [0u8; 4096];
        let read = std::io::Read::read(&mut connection, &mut buffer).unwrap_or(0);
        let text = String::from_utf8_lossy(&buffer[..read]).into_owned();
        if !text.starts_with("HTTP/1.1 200") {
            let rest = read_until_closed(&mut connection);
            break text + &rest;
        }
        idle.push(connection);
        assert!(idle.len() <= 3, "more than 3 connections held");
    };
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("limits.max_connections"), "{answer}");
    // gRPC has its own cap: fill it too, and the fifth gRPC connection is closed unanswered.
    let grpc_idle: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(server.grpc).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut grpc_over = TcpStream::connect(server.grpc).unwrap();
    let started = Instant::now();
    assert_eq!(read_until_closed(&mut grpc_over), "");
    assert!(started.elapsed() < Duration::from_secs(4));
    // The bus is not held up by either flood.
    let mut bus = TcpStream::connect(common::bus_socket(&server.bus)).unwrap();
    bus.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut info = [0u8; 5];
    std::io::Read::read_exact(&mut bus, &mut info).unwrap();
    assert_eq!(&info, b"INFO ");
    // Freed slots are taken again at once.
    drop(idle);
    drop(grpc_idle);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ready = http_request(server.http, "GET", "/health/ready", &[], None);
        if ready.as_ref().map(|r| r.status).ok() == Some(200) {
            break;
        }
        assert!(Instant::now() < deadline, "REST did not recover");
        std::thread::sleep(Duration::from_millis(50));
    }
    let health = run(server
        .cli("svcctl")
        .args(["--api-key", &server.admin_key, "apikey", "list"]));
    assert_eq!(health.code, 0, "{health:?}");
}

#[test]
fn one_request_id_follows_a_request_through_the_log() {
    let server = TestServer::start_with(Options {
        config_yaml: "log_format: json\n".into(),
        ..Options::default()
    });
    let auth = format!("Bearer {}", server.admin_key);
    let response = http_request(
        server.http,
        "POST",
        "/api/v1/apikeys",
        &[("Authorization", &auth), ("X-Request-Id", "trace-me-42")],
        Some(br#"{"name":"traced","role":"readonly"}"#),
    )
    .unwrap();
    assert_eq!(response.status, 201, "{}", response.body);
    assert_eq!(response.header("x-request-id"), Some("trace-me-42"));
    let admin_id = server
        .request("GET", "/api/v1/apikeys", Some(&server.admin_key), None)
        .json()["apikeys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "bootstrap-admin")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let log = server.log();
    let line = log
        .lines()
        .find(|l| l.contains("trace-me-42") && l.contains("API key created"))
        .unwrap_or_else(|| panic!("no log line with the request id:\n{log}"));
    let line: serde_json::Value = serde_json::from_str(line).unwrap();
    let span = &line["span"];
    assert_eq!(span["id"], "trace-me-42", "{line}");
    assert_eq!(span["transport"], "rest", "{line}");
    assert_eq!(span["route"], "/api/v1/apikeys", "{line}");
    assert_eq!(span["key_id"], admin_id.as_str(), "{line}");
    // Without a header the server makes one.
    let made = server.request("GET", "/health/live", None, None);
    assert!(made.header("x-request-id").is_some_and(|id| !id.is_empty()));
}

// ---- Hostile clients (issue 23): body deadlines, in-flight caps, media types, last admin.

/// Sends `bytes` on a new connection and returns everything the server sends until it
/// closes (or 10 s pass).
fn raw_exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    stream.write_all(bytes).unwrap();
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    String::from_utf8_lossy(&raw).into_owned()
}

/// A POST whose body never completes (the header promises 100 bytes, 5 are sent), by `key`:
/// an operator key, since the role is checked before a body is read, so the route must be
/// one the key may use.
fn stalled_post(addr: std::net::SocketAddr, key: &str) -> std::net::TcpStream {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST /api/v1/agents/web-1/quarantine HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"na"
    )
    .unwrap();
    stream
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn metric(server: &TestServer, name: &str) -> f64 {
    let text = server.request("GET", "/metrics", None, None).body;
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

#[test]
fn stalled_bodies_get_408_at_the_deadline_and_their_sockets_are_released() {
    use std::time::{Duration, Instant};
    let server = TestServer::start_with(Options {
        config_yaml: "limits: { body_timeout: 1s }\nrate_limit: { max_in_flight: 100 }\n".into(),
        // SQLite whatever SVC_TEST_STORE says: this counts the server's open fds, and a
        // PostgreSQL pool that grows under the 40 requests would count as well.
        sqlite_only: true,
        ..Options::default()
    });
    let (_, operator) = server.create_key("stalling", "operator");
    // (The connection create_key used may still be closing.)
    std::thread::sleep(Duration::from_millis(200));
    let before = open_fds(server.pid());
    let started = Instant::now();
    let mut stalled: Vec<_> = (0..40)
        .map(|_| stalled_post(server.http, &operator))
        .collect();
    // Meanwhile the server answers others at once.
    let list = server.request("GET", "/api/v1/apikeys", Some(&server.admin_key), None);
    assert_eq!(list.status, 200, "{}", list.body);
    assert!(started.elapsed() < Duration::from_millis(900));
    // (Accepting may trail the connects a little.)
    let deadline = Instant::now() + Duration::from_millis(700);
    while open_fds(server.pid()) < before + 38 {
        assert!(
            Instant::now() < deadline,
            "the stalled connections are not all held"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for stream in &mut stalled {
        let answer = read_until_closed(stream);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(
            answer.to_ascii_lowercase().contains("connection: close"),
            "{answer}"
        );
        let body = answer.split("\r\n\r\n").nth(1).unwrap();
        let error: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(error["error"]["code"], "request_timeout", "{answer}");
        assert!(error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limits.body_timeout"));
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(6),
        "{elapsed:?}"
    );
    drop(stalled);
    // The server closed its side of every stalled connection: back to where it was.
    let deadline = Instant::now() + Duration::from_secs(5);
    while open_fds(server.pid()) > before + 2 {
        assert!(
            Instant::now() < deadline,
            "{} fds open, {before} before",
            open_fds(server.pid())
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(metric(&server, "svc_api_errors_total") >= 40.0);
}

#[test]
fn a_trickled_body_gets_408_below_the_minimum_rate() {
    use std::io::Write;
    use std::time::{Duration, Instant};
    let server = TestServer::start_with(Options {
        config_yaml: "limits: { body_timeout: 60s, min_body_rate: 1000 }\n".into(),
        ..Options::default()
    });
    let mut stream = std::net::TcpStream::connect(server.http).unwrap();
    write!(
        stream,
        "POST /api/v1/apikeys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n",
        server.admin_key
    )
    .unwrap();
    let started = Instant::now();
    // Ten bytes a second: far below 1000 bytes/s. Due by 5 s (the grace) + what was sent.
    let mut answer = String::new();
    for _ in 0..100 {
        if stream.write_all(b"          ").is_err() {
            break;
        }
        stream
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut buffer = [0u8; 4096];
        if let Ok(read @ 1..) = std::io::Read::read(&mut stream, &mut buffer) {
            answer = String::from_utf8_lossy(&buffer[..read]).into_owned();
            break;
        }
    }
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("limits.min_body_rate"), "{answer}");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(4) && elapsed < Duration::from_secs(8),
        "{elapsed:?}"
    );
}

#[test]
fn idle_keep_alive_connections_are_closed_after_the_idle_timeout() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let server = TestServer::start_with(Options {
        config_yaml: "limits: { idle_timeout: 1s }\n".into(),
        ..Options::default()
    });
    let mut stream = std::net::TcpStream::connect(server.http).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buffer = [0u8; 4096];
    let read = stream.read(&mut buffer).unwrap();
    assert!(buffer[..read].starts_with(b"HTTP/1.1 200"));
    // Kept alive, then idle: closed by the server (read gives EOF) about a second later.
    let started = Instant::now();
    assert_eq!(stream.read(&mut buffer).unwrap_or(0), 0);
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(800) && elapsed < Duration::from_secs(4),
        "{elapsed:?}"
    );
    // A connection that never sends a request is closed the same way.
    let mut silent = std::net::TcpStream::connect(server.http).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    assert_eq!(silent.read(&mut buffer).unwrap_or(0), 0);
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[test]
fn requests_in_flight_past_the_cap_get_429_and_other_keys_are_served() {
    use std::time::{Duration, Instant};
    let server = TestServer::start_with(Options {
        // The stalled bodies must hold their slots for the whole test: body_timeout 20 s and
        // no body-rate floor (its 5 s grace could free a slot on a loaded machine before the
        // third is taken).
        config_yaml:
            "limits: { body_timeout: 20s, min_body_rate: 0 }\nrate_limit: { max_in_flight: 3 }\n"
                .into(),
        ..Options::default()
    });
    // Operators: they may send the stalled POST, and are refused (403) what the loop asks.
    let (_, greedy) = server.create_key("greedy", "operator");
    let (_, other) = server.create_key("other", "operator");
    let errors_before = metric(&server, "svc_api_errors_total");
    let stalled: Vec<_> = (0..3).map(|_| stalled_post(server.http, &greedy)).collect();
    // The fourth request of that key, whatever it is, is refused while those are held.
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        let response = server.request("GET", "/api/v1/apikeys", Some(&greedy), None);
        if response.status == 429 {
            break response;
        }
        assert_eq!(response.status, 403, "{}", response.body);
        assert!(Instant::now() < deadline, "never refused");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(refused.json()["error"]["code"], "too_many_in_flight");
    assert!(refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("rate_limit.max_in_flight"));
    assert_eq!(refused.header("retry-after"), Some("1"));
    // Other keys are served meanwhile.
    let served = server.request("GET", "/api/v1/apikeys", Some(&other), None);
    assert_eq!(served.status, 403, "{}", served.body);
    let admin = server.request("GET", "/api/v1/apikeys", Some(&server.admin_key), None);
    assert_eq!(admin.status, 200, "{}", admin.body);
    assert!(metric(&server, "svc_api_errors_total") > errors_before);
    // Hanging up gives the slots back.
    drop(stalled);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let response = server.request("GET", "/api/v1/apikeys", Some(&greedy), None);
        if response.status == 403 {
            break;
        }
        assert!(Instant::now() < deadline, "slots not given back");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn bodies_must_be_json_objects_sent_as_json() {
    let server = TestServer::start();
    let auth = format!("Bearer {}", server.admin_key);
    let post = |content_type: Option<&str>, body: &str| {
        let mut request = format!(
            "POST /api/v1/apikeys HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: {auth}\r\nContent-Length: {}\r\n",
            body.len()
        );
        if let Some(content_type) = content_type {
            request.push_str(&format!("Content-Type: {content_type}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(body);
        raw_exchange(server.http, request.as_bytes())
    };
    let body = r#"{"name":"ci","role":"readonly"}"#;
    for content_type in [
        Some("text/plain"),
        None,
        Some("application/json; charset=latin1"),
        Some("application/jsonx"),
        Some("multipart/form-data; boundary=x"),
    ] {
        let answer = post(content_type, body);
        assert!(
            answer.starts_with("HTTP/1.1 415"),
            "{content_type:?}: {answer}"
        );
        assert!(answer.contains("\"unsupported_media_type\""), "{answer}");
    }
    for content_type in ["application/json", "Application/JSON; charset=\"UTF-8\""] {
        let answer = post(Some(content_type), body);
        assert!(
            answer.starts_with("HTTP/1.1 201"),
            "{content_type}: {answer}"
        );
    }
    // serde would read a sequence as the struct's fields in order; the API takes objects only.
    let created = server.request(
        "POST",
        "/api/v1/apikeys",
        Some(&server.admin_key),
        Some(r#"["name","operator"]"#),
    );
    assert_eq!(created.status, 400, "{}", created.body);
    assert_eq!(created.json()["error"]["code"], "bad_request");
    let (id, _) = server.create_key("target", "readonly");
    for body in ["[null, null]", " [\"x\"]", "null", "\"x\"", "1", "{} {}"] {
        let patched = server.request(
            "PATCH",
            &format!("/api/v1/apikeys/{id}"),
            Some(&server.admin_key),
            Some(body),
        );
        assert_eq!(patched.status, 400, "{body}: {}", patched.body);
        assert_eq!(patched.json()["error"]["code"], "bad_request");
    }
    // Duplicate fields stay refused too.
    let duplicate = server.request(
        "PATCH",
        &format!("/api/v1/apikeys/{id}"),
        Some(&server.admin_key),
        Some(r#"{"role":"admin","role":"readonly"}"#),
    );
    assert_eq!(duplicate.status, 400, "{}", duplicate.body);
    let list = server
        .request("GET", "/api/v1/apikeys", Some(&server.admin_key), None)
        .json();
    let names: Vec<&str> = list["apikeys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bootstrap-admin", "ci", "ci", "target"]);
    assert_eq!(list["apikeys"][3]["role"], "readonly");
    // 128 characters, not bytes, as the OpenAPI document says.
    for (count, status) in [(128, 201), (129, 422)] {
        let body = format!(r#"{{"name":"{}","role":"readonly"}}"#, "é".repeat(count));
        let response = server.request(
            "POST",
            "/api/v1/apikeys",
            Some(&server.admin_key),
            Some(&body),
        );
        assert_eq!(response.status, status, "{count}: {}", response.body);
    }
}

#[test]
fn every_405_says_allow_and_a_malformed_content_length_is_refused() {
    let server = TestServer::start();
    let key = Some(server.admin_key.as_str());
    for (method, path, allow) in [
        ("PUT", "/api/v1/apikeys", "GET, POST"),
        (
            "DELETE",
            "/api/v1/apikeys/01ZZZZZZZZZZZZZZZZZZZZZZZZ",
            "GET, PATCH, DELETE",
        ),
        ("POST", "/health/live", "GET"),
        ("POST", "/health/ready", "GET"),
        ("DELETE", "/metrics", "GET"),
        ("PUT", "/api/v1/openapi.json", "GET"),
        ("POST", "/.well-known/jwks.json", "GET"),
        ("PATCH", "/.well-known/jwt-revocations.json", "GET"),
    ] {
        let method = if method == "DELETE" && path.contains("apikeys/") {
            "PUT"
        } else {
            method
        };
        let response = server.request(method, path, key, None);
        assert_eq!(response.status, 405, "{method} {path}: {}", response.body);
        assert_eq!(response.header("allow"), Some(allow), "{method} {path}");
        assert_eq!(response.json()["error"]["code"], "method_not_allowed");
    }
    // hyper refuses a malformed Content-Length itself, before the router: a 400 without a
    // body (it offers no hook for one), and the connection is closed rather than left to
    // guess where the next request starts.
    for length in ["abc", "-1", "1, 2", "31, 31", "99999999999999999999999", ""] {
        let answer = raw_exchange(
            server.http,
            format!(
                "POST /api/v1/apikeys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
                 Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n{{}}",
                server.admin_key
            )
            .as_bytes(),
        );
        assert!(answer.starts_with("HTTP/1.1 400"), "{length}: {answer}");
        assert!(answer.contains("connection: close"), "{length}: {answer}");
    }
    assert_eq!(
        server.request("GET", "/health/live", None, None).status,
        200
    );
}

fn patch(server: &TestServer, key: &str, id: &str, body: &str) -> common::HttpResponse {
    server.request(
        "PATCH",
        &format!("/api/v1/apikeys/{id}"),
        Some(key),
        Some(body),
    )
}

fn delete(server: &TestServer, key: &str, id: &str) -> common::HttpResponse {
    server.request("DELETE", &format!("/api/v1/apikeys/{id}"), Some(key), None)
}

fn assert_last_admin(response: &common::HttpResponse) {
    assert_eq!(response.status, 409, "{}", response.body);
    assert_eq!(response.json()["error"]["code"], "failed_precondition");
    assert!(
        response.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("last active admin key"),
        "{}",
        response.body
    );
}

#[test]
fn the_last_active_admin_key_cannot_be_deleted_demoted_or_given_an_expiry() {
    let server = TestServer::start();
    let admin = server.admin_key.clone();
    let list = server
        .request("GET", "/api/v1/apikeys", Some(&admin), None)
        .json();
    let bootstrap = list["apikeys"][0]["id"].as_str().unwrap().to_string();
    let (_, _operator) = server.create_key("ops", "operator");
    let later = svc::clock::format_rfc3339(svc::clock::now_millis() + 86_400_000);

    assert_last_admin(&delete(&server, &admin, &bootstrap));
    assert_last_admin(&patch(
        &server,
        &admin,
        &bootstrap,
        r#"{"role":"operator"}"#,
    ));
    assert_last_admin(&patch(
        &server,
        &admin,
        &bootstrap,
        &format!(r#"{{"expires_at":"{later}"}}"#),
    ));
    // Renaming is fine, and the key still works.
    assert_eq!(
        patch(&server, &admin, &bootstrap, r#"{"name":"root"}"#).status,
        200
    );
    // Refused by a rule, not failed: the three refusals are audited as denied (contract §9).
    let rows = common::audit_rows(&server, &["--resource-type", "apikey"]);
    let outcomes: Vec<(&str, &str)> = rows
        .iter()
        .filter(|r| r["resource_id"] == bootstrap.as_str())
        .map(|r| {
            (
                r["action"].as_str().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("apikey.update", "success"),
            ("apikey.update", "denied"),
            ("apikey.update", "denied"),
            ("apikey.delete", "denied"),
        ],
        "{rows:?}"
    );

    // Through svcctl: exit 1 with the server's reason.
    let cli = |args: &[&str]| {
        run(server
            .cli("svcctl")
            .args(["--api-key", &admin, "apikey"])
            .args(args))
    };
    for args in [
        vec!["delete", bootstrap.as_str()],
        vec!["update", bootstrap.as_str(), "--role", "readonly"],
        vec!["update", bootstrap.as_str(), "--ttl", "30d"],
        vec!["update", bootstrap.as_str(), "--expires-at", later.as_str()],
    ] {
        let refused = cli(&args);
        assert_eq!(refused.code, 1, "{args:?}: {refused:?}");
        assert!(
            refused.stderr.contains("last active admin key"),
            "{refused:?}"
        );
    }

    // With a second admin, either may go, but not both.
    let (second, second_key) = server.create_key("second", "admin");
    let expiring = cli(&["update", &bootstrap, "--ttl", "30d"]);
    assert_eq!(expiring.code, 0, "{expiring:?}");
    assert_eq!(
        patch(&server, &second_key, &bootstrap, r#"{"role":"operator"}"#).status,
        200
    );
    assert_last_admin(&delete(&server, &second_key, &second));
    assert_last_admin(&patch(
        &server,
        &second_key,
        &second,
        r#"{"role":"readonly"}"#,
    ));
    let still = server.request("GET", "/api/v1/apikeys", Some(&second_key), None);
    assert_eq!(still.status, 200);

    // Two admins demoting each other at once: one of them wins, never both.
    let third = server.request(
        "POST",
        "/api/v1/apikeys",
        Some(&second_key),
        Some(r#"{"name":"third","role":"admin"}"#),
    );
    assert_eq!(third.status, 201, "{}", third.body);
    let third_key = third.json()["key"].as_str().unwrap().to_string();
    let third = third.json()["id"].as_str().unwrap().to_string();
    let (a, b) = std::thread::scope(|scope| {
        let a =
            scope.spawn(|| patch(&server, &second_key, &third, r#"{"role":"operator"}"#).status);
        let b =
            scope.spawn(|| patch(&server, &third_key, &second, r#"{"role":"operator"}"#).status);
        (a.join().unwrap(), b.join().unwrap())
    });
    let mut statuses = [a, b];
    statuses.sort();
    // The loser may also be refused for having just lost its own role (403).
    assert!(
        statuses == [200, 409] || statuses == [200, 403],
        "{statuses:?}"
    );
    let admins = server
        .request(
            "GET",
            "/api/v1/apikeys",
            Some(if a == 200 { &second_key } else { &third_key }),
            None,
        )
        .json()["apikeys"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["role"] == "admin")
        .count();
    assert_eq!(admins, 1);
}

#[test]
fn recover_admin_refuses_a_running_server_then_mints_an_audited_admin_key() {
    let mut server = TestServer::start();
    let help = run(server.names.command("svc-server").arg("--help"));
    assert!(help.stdout.contains("--recover-admin"), "{help:?}");
    let recover = |server: &TestServer| {
        run(server
            .names
            .command("svc-server")
            .arg("--recover-admin")
            .arg("--config")
            .arg(&server.config_file))
    };
    let refused = recover(&server);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(
        refused
            .stderr
            .contains("a server is running on this data dir"),
        "{refused:?}"
    );

    assert_eq!(server.stop_with(libc::SIGTERM), Some(0));
    let recovered = recover(&server);
    assert_eq!(recovered.code, 0, "{recovered:?}");
    let key_file = std::path::PathBuf::from(recovered.stdout.trim());
    assert!(key_file.starts_with(&server.data_dir), "{recovered:?}");
    common::assert_private(&key_file);
    let key = std::fs::read_to_string(&key_file)
        .unwrap()
        .trim()
        .to_string();
    assert!(svc::auth::looks_like_api_key(&key));
    assert!(
        !recovered.stdout.contains(&key) && !recovered.stderr.contains(&key),
        "the key is not printed"
    );

    server.spawn(&[]);
    let list = server.request("GET", "/api/v1/apikeys", Some(&key), None);
    assert_eq!(list.status, 200, "{}", list.body);
    let mine = list.json()["apikeys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"].as_str().unwrap().starts_with("recovered-admin-"))
        .cloned()
        .expect("the recovered key is listed");
    assert_eq!(mine["role"], "admin");
    let rows = common::audit_rows(&server, &[]);
    let row = rows
        .iter()
        .find(|row| row["action"] == "apikey.recover")
        .unwrap_or_else(|| panic!("no apikey.recover row in {rows:#?}"));
    assert_eq!(row["user"], "server", "{row}");
    assert_eq!(row["resource_id"], mine["id"], "{row}");
    assert!(!server.data_dir.join("admin-recoveries.jsonl").exists());
    // Audited once: a restart does not record it again.
    assert_eq!(server.stop_with(libc::SIGTERM), Some(0));
    server.spawn(&[]);
    let rows = common::audit_rows(&server, &[]);
    assert_eq!(
        rows.iter()
            .filter(|row| row["action"] == "apikey.recover")
            .count(),
        1
    );
}

/// A gRPC health check over a fresh connection: Some(true) when it answers SERVING.
fn grpc_health(server: &TestServer) -> bool {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let check = async {
            let channel =
                tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
                    .ok()?
                    .connect()
                    .await
                    .ok()?;
            let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
            let answer = client
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await
                .ok()?;
            Some(answer.into_inner().status == 1)
        };
        tokio::time::timeout(std::time::Duration::from_secs(2), check)
            .await
            .ok()
            .flatten()
            .unwrap_or(false)
    })
}

#[test]
fn silent_floods_under_a_low_file_limit_leave_every_port_serving() {
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    // 256 descriptors: the caps are fitted under it with a reserve, so a flood on one port
    // meets that port's cap, not EMFILE. Silent connections go after the handshake timeout.
    let server = TestServer::start_with(Options {
        config_yaml: "limits: { handshake_timeout: 1s }\n".into(),
        nofile: Some(256),
        ..Options::default()
    });
    let log = server.log();
    assert!(log.contains("open-file limit and connection caps"), "{log}");
    let bus_ping = || {
        let mut bus = TcpStream::connect(common::bus_socket(&server.bus)).ok()?;
        bus.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut reader = std::io::BufReader::new(bus.try_clone().ok()?);
        let mut info = String::new();
        std::io::BufRead::read_line(&mut reader, &mut info).ok()?;
        let connect = serde_json::json!({"verbose": false, "auth_token": server.admin_key});
        std::io::Write::write_all(
            &mut bus,
            format!("CONNECT {connect}\r\nPING\r\n").as_bytes(),
        )
        .ok()?;
        Some(common::lines_until_pong(&mut reader).last().cloned() == Some("PONG".into()))
    };
    for (port, address) in [("grpc", server.grpc), ("http", server.http)] {
        // 300 silent connections: more than the whole limit.
        let flood: Vec<TcpStream> = (0..300)
            .filter_map(|_| TcpStream::connect(address).ok())
            .collect();
        assert!(flood.len() > 200, "{port}: only {} connected", flood.len());
        // The other ports answer at once; this one again once the silent ones are closed.
        let started = Instant::now();
        let ready = http_request(server.http, "GET", "/health/ready", &[], None);
        if port == "grpc" {
            assert_eq!(ready.map(|r| r.status).ok(), Some(200), "{port}");
            assert!(started.elapsed() < Duration::from_secs(2), "{port}");
        }
        assert_eq!(bus_ping(), Some(true), "bus during the {port} flood");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let back = match port {
                "grpc" => grpc_health(&server),
                _ => http_request(server.http, "GET", "/health/live", &[], None)
                    .map(|r| r.status == 200)
                    .unwrap_or(false),
            };
            if back {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{port} never came back\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        // The server closed the silent ones (EOF), the first within about the timeout.
        let mut first = flood.into_iter().next().unwrap();
        first
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buffer = [0u8; 16];
        assert!(matches!(
            std::io::Read::read(&mut first, &mut buffer),
            Ok(0) | Err(_)
        ));
    }
    assert!(grpc_health(&server), "gRPC serves after both floods");
}

/// The verified-key cache (issue 21) under concurrent use: while other clients keep using a
/// key, a change to it applies to every request sent after the change returned — a demotion
/// at once, a delete with 401 — and never a request answered from a stale cached row.
#[test]
fn key_changes_apply_to_every_request_after_they_return_under_concurrent_use() {
    use std::sync::atomic::{AtomicU8, Ordering};
    let server = TestServer::start();
    let (id, key) = server.create_key("busy", "admin");
    // 0: admin; 1: demoted to readonly; 2: deleted. Read before each request is sent.
    let phase = AtomicU8::new(0);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| loop {
                let seen = phase.load(Ordering::SeqCst);
                let status = server
                    .request("GET", "/api/v1/apikeys", Some(&key), None)
                    .status;
                // A request sent earlier may be answered after a later change: only answers
                // older than what the client already saw are wrong.
                match seen {
                    0 => assert!([200, 403, 401, 429].contains(&status), "{status}"),
                    1 => assert!(
                        [403, 401, 429].contains(&status),
                        "after demotion: {status}"
                    ),
                    _ => {
                        assert_eq!(status, 401, "a request after the delete");
                        return;
                    }
                }
            });
        }
        // No assertion until the phase reaches 2, so the clients always stop.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let patched = server.request(
            "PATCH",
            &format!("/api/v1/apikeys/{id}"),
            Some(&server.admin_key),
            Some(r#"{"role":"readonly"}"#),
        );
        phase.store(1, Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let deleted = delete(&server, &server.admin_key, &id);
        phase.store(2, Ordering::SeqCst);
        assert_eq!(patched.status, 200, "{}", patched.body);
        assert_eq!(deleted.status, 204, "{}", deleted.body);
    });
}

/// One source address may hold only its share of each listener (issue: a client that keeps
/// reopening idle connections kept REST and gRPC down for everyone); other addresses are
/// served meanwhile.
#[test]
fn one_address_holds_only_its_share_of_each_listener() {
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start_with(Options {
        config_yaml: "limits: { max_connections: 8, max_connections_per_address: 2 }\n".into(),
        ..Options::default()
    });
    // Reads what a connection from `from` gets for `send` until it closes (or 3 s pass).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let exchange = |from: &str, to: SocketAddr, send: &'static [u8]| -> Vec<u8> {
        runtime.block_on(async {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
            let mut stream = socket.connect(to).await.unwrap();
            stream.write_all(send).await.unwrap();
            let mut answer = Vec::new();
            let mut buffer = [0u8; 4096];
            let _ = tokio::time::timeout(Duration::from_secs(3), async {
                while let Ok(n) = stream.read(&mut buffer).await {
                    if n == 0 {
                        break;
                    }
                    answer.extend_from_slice(&buffer[..n]);
                    if answer.starts_with(b"HTTP/1.1 200")
                        || answer.len() >= 9 && !answer.starts_with(b"HTTP")
                    {
                        break;
                    }
                }
            })
            .await;
            answer
        })
    };
    const READY: &[u8] = b"GET /health/ready HTTP/1.1\r\nhost: x\r\n\r\n";
    const H2: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    // 127.0.0.1 fills its share of both listeners with idle connections.
    let held: Vec<TcpStream> = [server.http, server.http, server.grpc, server.grpc]
        .iter()
        .map(|to| TcpStream::connect(to).unwrap())
        .collect();
    // The server counts them once it has accepted them: on a loaded machine that can take
    // longer than a moment, so ask until the share is full (at most 5 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let refused = loop {
        std::thread::sleep(Duration::from_millis(200));
        let answer = String::from_utf8(exchange("127.0.0.1", server.http, READY)).unwrap();
        if answer.starts_with("HTTP/1.1 503") || std::time::Instant::now() > deadline {
            break answer;
        }
    };
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.contains("limits.max_connections_per_address"),
        "{refused}"
    );
    assert_eq!(
        exchange("127.0.0.1", server.grpc, H2),
        b"",
        "closed unanswered"
    );
    // Another address is served on both.
    let served = String::from_utf8(exchange("127.0.0.2", server.http, READY)).unwrap();
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    let settings = exchange("127.0.0.2", server.grpc, H2);
    assert!(
        settings.len() >= 9 && settings[3] == 4,
        "a SETTINGS frame: {settings:?}"
    );
    // The share comes back when the held connections close.
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    let again = String::from_utf8(exchange("127.0.0.1", server.http, READY)).unwrap();
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
}
