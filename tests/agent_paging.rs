//! Listing a big fleet a page at a time (docs/fleet.md, "Listing agents"): 1,200 agents
//! enrolled on the wire (tests/common/login.rs), paged through REST, gRPC and `svcctl agent
//! list` with filters on selectors and states; and the fleet metrics operators watch
//! (heartbeats, bus logins, reconnects, fan-out durations) moving when agents do.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::login::{enrol, heartbeat, login, source_address, until_pong};
use common::{bus_socket, http_request, json_of, run, with_key, Options, TestServer};
use tokio::io::AsyncWriteExt;

const AGENTS: usize = 1200;

/// An agent's bootstrap PSK on a test server (derived from its `hmacsecret`).
fn psk(agent_id: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"test-hmac-secret");
    hex::encode(ring::hmac::sign(&key, agent_id.as_bytes()).as_ref())
}

/// The connected agent that falls silent for a while.
const SILENT: usize = 10;

fn id(n: usize) -> String {
    format!("sim-{n:05}")
}

/// A metric's value in a /metrics text (0 when absent); `name` includes its labels.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|line| line.starts_with(name) && line[name.len()..].starts_with(' '))
        .and_then(|line| line.split_whitespace().last())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

fn metrics(server: &TestServer) -> String {
    http_request(server.http, "GET", "/metrics", &[], None)
        .unwrap()
        .body
}

/// Every page of `GET /api/v1/agents?QUERY` (with `limit`), as ids in the order served, and
/// how many pages it took.
fn rest_pages(server: &TestServer, query: &str, limit: usize) -> (Vec<String>, usize) {
    let mut ids = Vec::new();
    let mut cursor = String::new();
    let mut pages = 0;
    loop {
        let path = format!("/api/v1/agents?{query}&limit={limit}&cursor={cursor}");
        let response = server.request("GET", &path, Some(&server.admin_key), None);
        assert_eq!(response.status, 200, "{path}: {}", response.body);
        let page = response.json();
        pages += 1;
        let agents = page["agents"].as_array().unwrap();
        assert!(agents.len() <= limit, "{path}: {} agents", agents.len());
        ids.extend(agents.iter().map(|a| a["id"].as_str().unwrap().to_string()));
        match page["next_cursor"].as_str() {
            Some(next) => {
                assert_eq!(agents.len(), limit, "only a full page has a next one");
                cursor = next.to_string();
            }
            None => return (ids, pages),
        }
        assert!(pages <= AGENTS, "paging never ends");
    }
}

/// Each agent once, in id order.
fn assert_each_once_in_order(ids: &[String], expected: impl IntoIterator<Item = String>) {
    let expected: Vec<String> = expected.into_iter().collect();
    assert_eq!(ids.len(), expected.len(), "how many agents");
    assert_eq!(ids, expected.as_slice());
    assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), ids.len());
}

#[test]
fn a_big_fleet_pages_through_rest_grpc_and_the_cli_and_metrics_move() {
    let server = TestServer::start_with(Options {
        // Short, so that a silent agent is disconnected (and reconnects) within the test.
        config_yaml: "agents:\n  heartbeat_timeout: 1s\n".into(),
        ..Options::default()
    });
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut identities = runtime.block_on(enrol(&server.bus, 0..AGENTS / 2, "a", psk));
    identities.extend(runtime.block_on(enrol(&server.bus, AGENTS / 2..AGENTS, "b", psk)));
    let all = || (0..AGENTS).map(id);

    // Three quarantined, five connected (heartbeating), the rest pending.
    let quarantined = [3, 700, 1199];
    for n in quarantined {
        let path = format!("/api/v1/agents/{}/quarantine", id(n));
        let response = server.request("POST", &path, Some(&server.admin_key), None);
        assert_eq!(response.status, 200, "{}", response.body);
    }
    let before = metrics(&server);
    let bus = bus_socket(&server.bus);
    let connected: Vec<usize> = (SILENT..SILENT + 5).collect();
    // The first of them falls silent when told to (for a reconnection); the others heartbeat
    // every 250 ms throughout, from tasks of their own.
    let silence = Arc::new(AtomicBool::new(false));
    for &n in &connected {
        // Enrolment answers in any order: find the agent by its id.
        let identity = identities.iter().find(|i| i.id == id(n)).unwrap().clone();
        let (mut reader, mut write) = runtime.block_on(async {
            let (mut reader, mut write) = login(&identity, bus, source_address(n)).await.unwrap();
            let mut hello = format!("SUB svc.agent.{}.cmd 1\r\n", identity.id).into_bytes();
            hello.extend(heartbeat(&identity, Some(Default::default())));
            hello.extend_from_slice(b"PING\r\n");
            write.write_all(&hello).await.unwrap();
            until_pong(&mut reader, &mut write).await.unwrap();
            (reader, write)
        });
        runtime.spawn(async move {
            let _ = tokio::io::copy(&mut reader, &mut tokio::io::sink()).await;
        });
        let silence = silence.clone();
        runtime.spawn(async move {
            let identity = identity;
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                if n == SILENT && silence.load(Ordering::Relaxed) {
                    continue;
                }
                if write.write_all(&heartbeat(&identity, None)).await.is_err() {
                    break;
                }
            }
        });
    }
    let started = Instant::now();
    while metric(&metrics(&server), "svc_agents{state=\"connected\"}") < 5.0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "agents never connected"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // REST: every agent once, in order, 100 a page: exactly 12 pages.
    let (ids, pages) = rest_pages(&server, "", 100);
    assert_each_once_in_order(&ids, all());
    assert_eq!(pages, AGENTS / 100);
    let (ids, _) = rest_pages(&server, "", 333);
    assert_each_once_in_order(&ids, all());
    // Without paging parameters: the first 500, and a cursor to the rest.
    let first = server.request("GET", "/api/v1/agents", Some(&server.admin_key), None);
    assert_eq!(first.status, 200);
    assert_eq!(first.json()["agents"].as_array().unwrap().len(), 500);
    assert!(first.json()["next_cursor"].is_string());

    // Filters: a selector, states, both.
    let (ids, _) = rest_pages(&server, "target=sim%3Db", 250);
    assert_each_once_in_order(&ids, (AGENTS / 2..AGENTS).map(id));
    let (ids, _) = rest_pages(&server, "state=quarantined", 2);
    assert_each_once_in_order(&ids, quarantined.map(id));
    let (ids, _) = rest_pages(&server, "state=connected", 1000);
    assert_each_once_in_order(&ids, connected.iter().map(|n| id(*n)));
    let (ids, _) = rest_pages(&server, "state=connected,quarantined", 3);
    let mut both: Vec<usize> = connected.iter().copied().chain(quarantined).collect();
    both.sort();
    assert_each_once_in_order(&ids, both.iter().map(|n| id(*n)));
    let (ids, _) = rest_pages(&server, "state=pending", 500);
    let pending = (0..AGENTS).filter(|n| !quarantined.contains(n) && !connected.contains(n));
    assert_each_once_in_order(&ids, pending.map(id));
    let (ids, _) = rest_pages(&server, "target=sim%3Da&state=quarantined", 1);
    assert_each_once_in_order(&ids, [id(3)]);
    let (ids, pages) = rest_pages(&server, "target=nothing-*", 10);
    assert!(ids.is_empty());
    assert_eq!(pages, 1);

    // Bad input is the caller's: 422 naming what is wrong.
    for (query, says) in [
        ("cursor=%25%25not-ours", "invalid cursor"),
        ("cursor=AAAA", "invalid cursor"),
        ("limit=5001", "limit 5001"),
        ("limit=-1", "limit"),
        ("state=asleep", "unknown agent state 'asleep'"),
    ] {
        let path = format!("/api/v1/agents?{query}");
        let response = server.request("GET", &path, Some(&server.admin_key), None);
        assert_eq!(response.status, 422, "{path}: {}", response.body);
        assert!(response.body.contains(says), "{path}: {}", response.body);
    }

    // gRPC: the same pages, and INVALID_ARGUMENT for a cursor that is not one.
    runtime.block_on(async {
        let mut grpc = svc::proto::fleet_service_client::FleetServiceClient::connect(format!(
            "http://{}",
            server.grpc
        ))
        .await
        .unwrap();
        let mut ids = Vec::new();
        let mut cursor = String::new();
        loop {
            let request = svc::proto::ListAgentsRequest {
                limit: 300,
                cursor,
                ..Default::default()
            };
            let page = grpc
                .list_agents(with_key(request, &server.admin_key))
                .await
                .unwrap()
                .into_inner();
            ids.extend(page.agents.into_iter().map(|a| a.id));
            if page.next_cursor.is_empty() {
                break;
            }
            cursor = page.next_cursor;
        }
        assert_each_once_in_order(&ids, all());
        let request = svc::proto::ListAgentsRequest {
            target: "sim=a".into(),
            state: "quarantined".into(),
            ..Default::default()
        };
        let page = grpc
            .list_agents(with_key(request, &server.admin_key))
            .await
            .unwrap()
            .into_inner();
        let ids: Vec<String> = page.agents.into_iter().map(|a| a.id).collect();
        assert_eq!(ids, [id(3)]);
        assert!(page.next_cursor.is_empty());
        let request = svc::proto::ListAgentsRequest {
            cursor: "!!".into(),
            ..Default::default()
        };
        let status = grpc
            .list_agents(with_key(request, &server.admin_key))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("invalid cursor"), "{status:?}");
    });

    // The CLI follows the cursors itself: all 1,200 (more than a page of its own), or up to
    // --limit.
    let svcctl = |args: &[&str]| {
        run(server
            .cli("svcctl")
            .args(["--api-key", &server.admin_key])
            .args(args))
    };
    let listed = svcctl(&["-o", "json", "agent", "list"]);
    assert_eq!(listed.code, 0, "{listed:?}");
    let ids: Vec<String> = json_of(&listed)
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_string())
        .collect();
    assert_each_once_in_order(&ids, all());
    let table = svcctl(&["agent", "list", "--limit", "1100"]);
    assert_eq!(table.code, 0, "{table:?}");
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(lines.len(), 1101, "a header and 1100 agents");
    assert!(lines[0].starts_with("ID "), "{}", lines[0]);
    assert_eq!(lines.iter().filter(|l| l.starts_with("ID ")).count(), 1);
    let ids: Vec<String> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    assert_each_once_in_order(&ids, (0..1100).map(id));
    let filtered = svcctl(&[
        "-o",
        "json",
        "agent",
        "list",
        "--target",
        "sim=b",
        "--state",
        "quarantined,connected",
    ]);
    assert_eq!(filtered.code, 0, "{filtered:?}");
    let ids: Vec<String> = json_of(&filtered)
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_string())
        .collect();
    assert_each_once_in_order(&ids, [id(700), id(1199)]);
    let bad = svcctl(&["agent", "list", "--state", "asleep"]);
    assert_eq!(bad.code, 1, "{bad:?}");
    assert!(bad.stderr.contains("unknown agent state"), "{bad:?}");

    // Metrics: the logins and heartbeats above moved their counters.
    let after = metrics(&server);
    let logins = "svc_bus_logins_total{outcome=\"accepted\"}";
    assert!(
        metric(&after, logins) >= metric(&before, logins) + 5.0,
        "{after}"
    );
    let heartbeats = "svc_agent_heartbeats_total";
    assert!(
        metric(&after, heartbeats) >= metric(&before, heartbeats) + 5.0,
        "{after}"
    );
    // One agent falls silent past the timeout, then heartbeats again: a reconnection.
    let reconnects = "svc_agent_reconnects_total";
    silence.store(true, Ordering::Relaxed);
    let started = Instant::now();
    while metric(&metrics(&server), "svc_agents{state=\"connected\"}") >= 5.0 {
        assert!(started.elapsed() < Duration::from_secs(10), "never swept");
        std::thread::sleep(Duration::from_millis(50));
    }
    let silent = metrics(&server);
    silence.store(false, Ordering::Relaxed);
    let started = Instant::now();
    while metric(&metrics(&server), reconnects) < metric(&silent, reconnects) + 1.0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no reconnection counted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A fan-out: exec on an agent that never answers ends at its deadline (1 s and the 5 s
    // grace), and its duration is in the histogram under its kind.
    let fan_out = "svc_fan_out_duration_seconds_count{kind=\"exec\"}";
    assert_eq!(metric(&metrics(&server), fan_out), 0.0);
    let exec = svcctl(&["exec", "--target", &id(11), "--timeout", "1s", "--", "true"]);
    assert_eq!(exec.code, 1, "timed out: {exec:?}");
    let text = metrics(&server);
    assert_eq!(metric(&text, fan_out), 1.0, "{text}");
    assert_eq!(
        metric(
            &text,
            "svc_fan_out_duration_seconds_bucket{kind=\"exec\",le=\"5\"}"
        ),
        0.0,
        "took its timeout and the grace: {text}"
    );
    assert_eq!(
        metric(
            &text,
            "svc_fan_out_duration_seconds_bucket{kind=\"exec\",le=\"10\"}"
        ),
        1.0,
        "{text}"
    );
}

/// 50,000 agents (`SVC_PAGING_BENCH=1`; `SVC_PAGING_BENCH_AGENTS` to change): how long one
/// REST page takes at the start and at the end of the fleet (keyset: the same), a whole walk
/// through every page, and a selective filter that scans the fleet for a few agents. Prints.
#[test]
fn bench_paging_a_big_fleet() {
    if std::env::var_os("SVC_PAGING_BENCH").is_none() {
        eprintln!("agent_paging: benchmark not run (set SVC_PAGING_BENCH=1)");
        return;
    }
    let agents: usize = std::env::var("SVC_PAGING_BENCH_AGENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50_000);
    let server = TestServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let started = Instant::now();
    runtime.block_on(enrol(&server.bus, 0..agents - 3, "many", psk));
    runtime.block_on(enrol(&server.bus, agents - 3..agents, "few", psk));
    println!(
        "{agents} agents enrolled in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let timed = |path: &str| {
        let started = Instant::now();
        let response = server.request("GET", path, Some(&server.admin_key), None);
        assert_eq!(response.status, 200, "{path}: {}", response.body);
        (started.elapsed(), response.json())
    };
    let best_of = |path: &str| (0..5).map(|_| timed(path).0).min().unwrap().as_secs_f64() * 1000.0;
    let last = {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id(agents - 501))
    };
    let first_page = best_of("/api/v1/agents?limit=500");
    let last_page = best_of(&format!("/api/v1/agents?limit=500&cursor={last}"));
    let big_page = best_of("/api/v1/agents?limit=5000");
    let few = best_of("/api/v1/agents?target=sim%3Dfew");
    let quarantined = best_of("/api/v1/agents?state=quarantined");
    let started = Instant::now();
    let (ids, pages) = rest_pages(&server, "", 5000);
    let walk = started.elapsed();
    assert_eq!(ids.len(), agents);
    let (few_ids, _) = rest_pages(&server, "target=sim%3Dfew", 500);
    assert_eq!(few_ids.len(), 3);
    println!(
        "REST, best of 5: first page of 500 {first_page:.1} ms, last page of 500 \
         {last_page:.1} ms, a page of 5000 {big_page:.1} ms; a selector matching 3 of \
         {agents} (scans them all) {few:.1} ms; state=quarantined (none; partial index) \
         {quarantined:.1} ms; every agent in {pages} pages of 5000: {:.2} s",
        walk.as_secs_f64()
    );
}
