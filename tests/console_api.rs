//! The REST routes the web console uses (docs/console.md): events (paging, filters, the SSE
//! tail and its resume), audit (filters, paging, verify, export), agents (list, show,
//! quarantine by role, audited), secrets metadata (never values), whoami, and the /ui/ files
//! with their security headers. Every call goes through the real server over plain HTTP.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::{run, TestServer};

fn emit(server: &TestServer, key: &str, event_type: &str, source: &str, payload: &str) -> u64 {
    let emitted = run(server.cli("svc-events").args([
        "--api-key",
        key,
        "-o",
        "json",
        "emit",
        "--type",
        event_type,
        "--source",
        source,
        "--payload",
        payload,
    ]));
    assert_eq!(emitted.code, 0, "{emitted:?}");
    common::json_of(&emitted)["seq"].as_u64().unwrap()
}

fn get(server: &TestServer, path: &str, key: &str) -> serde_json::Value {
    let response = server.request("GET", path, Some(key), None);
    assert_eq!(response.status, 200, "GET {path}: {}", response.body);
    response.json()
}

#[test]
fn every_console_route_needs_a_key_and_bad_queries_are_refused() {
    let server = TestServer::start();
    for path in [
        "/api/v1/whoami",
        "/api/v1/events",
        "/api/v1/events/stream",
        "/api/v1/events/timeline",
        "/api/v1/events/1",
        "/api/v1/audit",
        "/api/v1/audit/verify",
        "/api/v1/audit/export",
        "/api/v1/agents",
        "/api/v1/agents/web-01",
        "/api/v1/secrets",
        "/api/v1/jobs",
        "/api/v1/jobs/01JZZZZZZZZZZZZZZZZZZZZZZZ",
    ] {
        let response = server.request("GET", path, None, None);
        assert_eq!(response.status, 401, "{path}: {}", response.body);
        let wrong = server.request("GET", path, Some("svc_not-a-key"), None);
        assert_eq!(wrong.status, 401, "{path}: {}", wrong.body);
    }
    let admin = &server.admin_key;
    for (path, status) in [
        ("/api/v1/events?bogus=1", 422),
        ("/api/v1/events?type=not_a_type", 422),
        ("/api/v1/events?severity=loud", 422),
        ("/api/v1/events?limit=ten", 422),
        ("/api/v1/events?cursor=abc", 422),
        ("/api/v1/events?since=%zz", 422),
        ("/api/v1/audit?min_severity=loud", 422),
        ("/api/v1/audit/export?format=xml", 422),
        ("/api/v1/events/stream?after=x", 422),
        ("/api/v1/events/424242", 404),
        ("/api/v1/agents/nobody", 404),
        ("/api/v1/jobs?limit=ten", 422),
        ("/api/v1/jobs?bogus=1", 422),
        ("/api/v1/jobs/nobody?after=a&limit=x", 422),
        ("/ui/nothing.js", 404),
    ] {
        let response = server.request("GET", path, Some(admin), None);
        assert_eq!(response.status, status, "{path}: {}", response.body);
    }
    let who = get(&server, "/api/v1/whoami", admin);
    assert_eq!(
        (who["name"].as_str(), who["role"].as_str()),
        (Some("bootstrap-admin"), Some("admin"))
    );
}

#[test]
fn events_page_by_cursor_with_filters() {
    let server = TestServer::start();
    let (_, operator) = server.create_key("emitter", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    let mut emitted = Vec::new();
    for index in 0..5 {
        let payload = format!(r#"{{"n": {index}}}"#);
        emitted.push(emit(
            &server,
            &operator,
            "command_failed",
            "web-01",
            &payload,
        ));
    }
    emit(&server, &operator, "command_completed", "db-01", "{}");

    // Three pages of two, in stream order, each event once.
    let mut seen = Vec::new();
    let mut cursor = String::new();
    let mut pages = 0;
    loop {
        let page = get(
            &server,
            &format!("/api/v1/events?type=command_failed&limit=2&cursor={cursor}"),
            &readonly,
        );
        pages += 1;
        for item in page["items"].as_array().unwrap() {
            assert_eq!(item["type"], "command_failed");
            assert_eq!(item["source"], "web-01");
            seen.push(item["seq"].as_u64().unwrap());
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = next.to_string(),
            None => break,
        }
        assert!(pages < 10, "paging does not end");
    }
    assert_eq!(seen, emitted);
    assert_eq!(pages, 3);

    // The other filters: category, minimum severity, source, several types.
    let jobs = get(
        &server,
        "/api/v1/events?category=job&source=db-01",
        &readonly,
    );
    assert_eq!(jobs["items"].as_array().unwrap().len(), 1);
    let errors = get(&server, "/api/v1/events?severity=error", &readonly);
    assert_eq!(errors["items"].as_array().unwrap().len(), 5);
    let both = get(
        &server,
        "/api/v1/events?type=command_failed,command_completed",
        &readonly,
    );
    assert_eq!(both["items"].as_array().unwrap().len(), 6);

    // One event by sequence and by id.
    let by_seq = get(
        &server,
        &format!("/api/v1/events/{}", emitted[0]),
        &readonly,
    );
    let by_id = get(
        &server,
        &format!("/api/v1/events/{}", by_seq["id"].as_str().unwrap()),
        &readonly,
    );
    assert_eq!(by_seq, by_id);

    // The timeline counts them in the current minute (or the one before, at a boundary).
    let timeline = get(&server, "/api/v1/events/timeline?minutes=5", &readonly);
    let counts: Vec<u64> = timeline["counts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    assert_eq!(counts.len(), 5);
    assert!(counts.iter().sum::<u64>() >= 6, "{timeline}");
}

/// An open SSE response: the raw socket and what was read so far.
struct Tail {
    socket: TcpStream,
    text: String,
}

impl Tail {
    fn open(server: &TestServer, path: &str, key: &str, headers: &[(&str, &str)]) -> Tail {
        let mut socket = TcpStream::connect(server.http).unwrap();
        let mut request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {key}\r\nAccept: text/event-stream\r\n",
            server.http
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        socket.write_all(request.as_bytes()).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        Tail {
            socket,
            text: String::new(),
        }
    }

    /// Reads until the stream's preamble arrived: the server has opened the tail.
    fn wait_open(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut buffer = [0u8; 8192];
        while !self.text.contains(": tail open") {
            assert!(
                Instant::now() < deadline,
                "tail never opened: {}",
                self.text
            );
            if let Ok(n) = self.socket.read(&mut buffer) {
                assert!(n > 0, "tail closed: {}", self.text);
                self.text.push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        }
    }

    /// Reads until `done` holds for the sequences received, or fails after 15 s.
    fn until(&mut self, done: impl Fn(&[u64]) -> bool) -> Vec<u64> {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut buffer = [0u8; 8192];
        loop {
            let seqs = self.seqs();
            if done(&seqs) {
                return seqs;
            }
            assert!(Instant::now() < deadline, "tail stalled: {}", self.text);
            match self.socket.read(&mut buffer) {
                Ok(0) => panic!("tail closed: {}", self.text),
                Ok(n) => self.text.push_str(&String::from_utf8_lossy(&buffer[..n])),
                Err(_) => continue,
            }
        }
    }

    /// The `id:` of every complete event frame so far.
    fn seqs(&self) -> Vec<u64> {
        self.text
            .lines()
            .filter_map(|line| line.strip_prefix("id: "))
            .filter_map(|id| id.trim().parse().ok())
            .collect()
    }
}

#[test]
fn the_tail_resumes_after_the_last_seen_sequence_and_follows_live() {
    let server = TestServer::start();
    let (_, operator) = server.create_key("emitter", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    let first: Vec<u64> = (0..4)
        .map(|n| {
            emit(
                &server,
                &operator,
                "command_completed",
                "web-01",
                &format!(r#"{{"n":{n}}}"#),
            )
        })
        .collect();

    // Reconnect as after a drop: Last-Event-ID is the second event; the rest follow, once.
    let mut tail = Tail::open(
        &server,
        "/api/v1/events/stream",
        &readonly,
        &[("Last-Event-ID", &first[1].to_string())],
    );
    let seqs = tail.until(|s| s.len() >= 2);
    assert_eq!(seqs, first[2..]);
    assert!(tail.text.starts_with("HTTP/1.1 200"), "{}", tail.text);
    assert!(tail
        .text
        .to_lowercase()
        .contains("content-type: text/event-stream"));
    // Then live events, without a gap at the seam.
    let live = emit(&server, &operator, "command_failed", "web-02", "{}");
    let seqs = tail.until(|s| s.contains(&live));
    assert_eq!(seqs, [first[2], first[3], live]);
    assert!(tail.text.contains(r#""type":"command_failed""#));

    // `?after=` does the same and wins over the header; filters apply to the tail.
    let mut filtered = Tail::open(
        &server,
        &format!(
            "/api/v1/events/stream?after={}&type=command_failed",
            first[0]
        ),
        &readonly,
        &[("Last-Event-ID", "999999")],
    );
    assert_eq!(filtered.until(|s| !s.is_empty()), [live]);

    // A new tail without a resume point starts now: it sees only what comes next.
    let mut fresh = Tail::open(&server, "/api/v1/events/stream", &readonly, &[]);
    fresh.wait_open();
    let next = emit(&server, &operator, "command_completed", "web-03", "{}");
    assert_eq!(fresh.until(|s| !s.is_empty()), [next]);

    // History only: from the start, ending by itself.
    let history = server.request(
        "GET",
        "/api/v1/events/stream?follow=false&after=0",
        Some(&readonly),
        None,
    );
    assert_eq!(history.status, 200);
    let ids: Vec<u64> = history
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(|id| id.parse().unwrap())
        .collect();
    assert!(
        ids.ends_with(&[first[0], first[1], first[2], first[3], live, next]),
        "{ids:?}"
    );
}

#[test]
fn quarantine_needs_operator_and_is_audited_like_the_cli() {
    let server = TestServer::start();
    let (_, operator) = server.create_key("oncall", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    let _agent = Agent::start(&server, "web-01", "role=web,env=prod");
    let _other = Agent::start(&server, "db-01", "role=db");

    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let agents = get(&server, "/api/v1/agents?target=role%3Dweb", &readonly);
        let list = agents["agents"].as_array().unwrap();
        if list.len() == 1 && list[0]["state"] == "connected" {
            assert_eq!(list[0]["id"], "web-01");
            assert_eq!(list[0]["labels"]["env"], "prod");
            assert!(list[0]["last_heartbeat_at"].is_string());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "web-01 never connected: {agents}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let all = get(&server, "/api/v1/agents", &readonly);
    assert_eq!(all["agents"].as_array().unwrap().len(), 2);

    // readonly: 403 and nothing changes; the refusal is audited as denied.
    let refused = server.request(
        "POST",
        "/api/v1/agents/web-01/quarantine",
        Some(&readonly),
        Some(r#"{"reason":"looks odd"}"#),
    );
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(refused.json()["error"]["code"], "permission_denied");
    assert_eq!(
        get(&server, "/api/v1/agents/web-01", &readonly)["quarantined"],
        false
    );

    let quarantined = server.request(
        "POST",
        "/api/v1/agents/web-01/quarantine",
        Some(&operator),
        Some(r#"{"reason":"looks odd"}"#),
    );
    assert_eq!(quarantined.status, 200, "{}", quarantined.body);
    let agent = quarantined.json();
    assert_eq!(
        (
            agent["quarantined"].as_bool(),
            agent["quarantine_reason"].as_str()
        ),
        (Some(true), Some("looks odd"))
    );

    let rows = get(&server, "/api/v1/audit?action=agent.quarantine", &readonly);
    let outcomes: Vec<(&str, &str)> = rows["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["user"].as_str().unwrap(), r["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(outcomes, [("oncall", "success"), ("viewer", "denied")]);
    let events = get(&server, "/api/v1/events?type=agent_quarantined", &readonly);
    assert_eq!(events["items"][0]["source"], "web-01", "{events}");

    // Unquarantine without a body.
    let lifted = server.request(
        "POST",
        "/api/v1/agents/web-01/unquarantine",
        Some(&operator),
        None,
    );
    assert_eq!(lifted.status, 200, "{}", lifted.body);
    assert_eq!(lifted.json()["quarantined"], false);
    let wrong_method = server.request(
        "GET",
        "/api/v1/agents/web-01/quarantine",
        Some(&operator),
        None,
    );
    assert_eq!(wrong_method.status, 405);
    assert_eq!(wrong_method.header("allow"), Some("POST"));
}

#[test]
fn audit_pages_filters_verifies_and_exports_for_admins_only() {
    let server = TestServer::start();
    let (_, operator) = server.create_key("emitter", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    for n in 0..5 {
        emit(
            &server,
            &operator,
            "command_completed",
            "web-01",
            &format!(r#"{{"n":{n}}}"#),
        );
    }
    // Newest first, by cursor, filtered by action and user.
    let mut ids = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = get(
            &server,
            &format!("/api/v1/audit?action=event.emit&user=emitter&limit=2&cursor={cursor}"),
            &readonly,
        );
        for row in page["items"].as_array().unwrap() {
            assert_eq!(row["action"], "event.emit");
            ids.push(row["seq"].as_i64().unwrap());
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = next.to_string(),
            None => break,
        }
    }
    assert_eq!(ids.len(), 5);
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "{ids:?}");
    let denied = get(&server, "/api/v1/audit?outcome=denied", &readonly);
    assert_eq!(denied["items"].as_array().unwrap().len(), 0);

    let verified = get(&server, "/api/v1/audit/verify", &readonly);
    assert_eq!(verified["ok"], true);
    assert!(verified["rows"].as_u64().unwrap() >= 7, "{verified}");

    let refused = server.request(
        "GET",
        "/api/v1/audit/export?format=csv",
        Some(&readonly),
        None,
    );
    assert_eq!(refused.status, 403);
    let csv = server.request(
        "GET",
        "/api/v1/audit/export?format=csv",
        Some(&server.admin_key),
        None,
    );
    assert_eq!(csv.status, 200);
    assert!(csv.header("content-type").unwrap().starts_with("text/csv"));
    assert!(
        csv.body.starts_with("id,timestamp,user,action,"),
        "{}",
        csv.body
    );
    assert!(csv.body.lines().count() >= 8);
    let json = server.request(
        "GET",
        "/api/v1/audit/export?format=json",
        Some(&server.admin_key),
        None,
    );
    assert_eq!(json.status, 200);
    let rows: serde_json::Value = serde_json::from_str(&json.body).unwrap();
    assert!(rows.as_array().unwrap().len() >= 7);
    // The key the admin created is redacted in exports as everywhere.
    assert!(!json.body.contains("svc_"), "a key leaked into the export");
}

#[test]
fn secrets_list_metadata_and_never_values() {
    let server = TestServer::start();
    let (_, operator) = server.create_key("app", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    let put = run(server.cli("svc-secrets").args([
        "--api-key",
        &operator,
        "put",
        "db/prod",
        "user=app",
        "password=hunter2-very-secret",
    ]));
    assert_eq!(put.code, 0, "{put:?}");
    let response = server.request("GET", "/api/v1/secrets?prefix=db%2F", Some(&readonly), None);
    assert_eq!(response.status, 200, "{}", response.body);
    assert!(!response.body.contains("hunter2"), "{}", response.body);
    let listed = response.json();
    assert_eq!(listed["secrets"][0]["path"], "db/prod");
    assert_eq!(listed["secrets"][0]["version"], 1);
    let none = get(&server, "/api/v1/secrets?prefix=app%2F", &readonly);
    assert_eq!(none["secrets"].as_array().unwrap().len(), 0);
}

#[test]
fn the_console_files_are_served_with_strict_headers_and_no_cookie() {
    let server = TestServer::start();
    for (path, content_type) in [
        ("/ui/", "text/html"),
        ("/ui/index.html", "text/html"),
        ("/ui/console.js", "text/javascript"),
        ("/ui/console.css", "text/css"),
    ] {
        let response = server.request("GET", path, None, None);
        assert_eq!(response.status, 200, "{path}");
        assert!(
            response
                .header("content-type")
                .unwrap()
                .starts_with(content_type),
            "{path}"
        );
        let csp = response.header("content-security-policy").unwrap();
        for directive in [
            "default-src 'self'",
            "frame-ancestors 'none'",
            "script-src 'self'",
            "style-src 'self'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(
            !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
            "{csp}"
        );
        assert_eq!(response.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(response.header("referrer-policy"), Some("no-referrer"));
        assert_eq!(response.header("set-cookie"), None);
    }
    // Nothing inline in the page: no <script> body, no style attribute, no on* handler, no
    // innerHTML in the script; nothing fetched from elsewhere.
    let page = server.request("GET", "/ui/", None, None).body;
    assert!(
        !page.contains("style=") && !page.contains("<style"),
        "inline style"
    );
    assert!(
        !page.contains(" onclick") && !page.contains(" onload"),
        "inline handler"
    );
    for script in page.split("<script").skip(1) {
        assert!(
            script.starts_with(" src=\"/ui/console.js\" defer></script>"),
            "{script}"
        );
    }
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "external reference"
    );
    let script = server.request("GET", "/ui/console.js", None, None).body;
    assert!(!script.contains(".innerHTML") && !script.contains("insertAdjacentHTML"));
    assert!(!script.contains("localStorage") && !script.contains("document.cookie"));
}
