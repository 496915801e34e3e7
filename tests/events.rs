//! Events end to end: emit/list/get/stats/types through svc-events, subscribe and watch on a
//! live server, a replay+live subscriber that joins mid-stream, and durability across kill -9.

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::{run, with_key, TestServer};
use svc::proto::event_service_client::EventServiceClient;
use svc::proto::{EmitEventRequest, EventFilter, SubscribeEventsRequest};

fn json(result: &common::Run) -> serde_json::Value {
    serde_json::from_str(&result.stdout).unwrap_or_else(|e| panic!("{e}: {result:?}"))
}

#[test]
fn types_emit_get_list_stats() {
    let server = TestServer::start();
    let (_, operator) = server.create_key("ops", "operator");
    let (_, readonly) = server.create_key("ro", "readonly");

    let types = json(&run(server.cli("svc-events").args([
        "--api-key",
        &readonly,
        "types",
        "-o",
        "json",
    ])));
    assert_eq!(types.as_array().unwrap().len(), 26);
    assert!(types
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "agent_connected" && t["category"] == "agent"));

    let emitted = run(server.cli("svc-events").args([
        "--api-key",
        &operator,
        "-o",
        "json",
        "emit",
        "--type",
        "command_failed",
        "--source",
        "web-01",
        "--payload",
        r#"{"exit_code": 3}"#,
    ]));
    assert_eq!(emitted.code, 0, "{emitted:?}");
    let event = json(&emitted);
    assert_eq!(
        (
            event["type"].as_str(),
            event["category"].as_str(),
            event["severity"].as_str()
        ),
        (Some("command_failed"), Some("job"), Some("error"))
    );
    assert!(event["seq"].as_u64().unwrap() > 0);
    let id = event["id"].as_str().unwrap().to_string();

    let got = json(&run(server.cli("svc-events").args([
        "--api-key",
        &readonly,
        "-o",
        "json",
        "get",
        &id,
    ])));
    assert_eq!(got, event);
    let missing = run(server.cli("svc-events").args([
        "--api-key",
        &readonly,
        "get",
        "01ZZZZZZZZZZZZZZZZZZZZZZZZ",
    ]));
    assert_eq!(missing.code, 5, "{missing:?}");

    let list = json(&run(server.cli("svc-events").args([
        "--api-key",
        &readonly,
        "-o",
        "json",
        "list",
        "--category",
        "job",
    ])));
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert!(list["next_cursor"].is_null());
    let errors = json(&run(server.cli("svc-events").args([
        "--api-key",
        &readonly,
        "-o",
        "json",
        "list",
        "--min-severity",
        "error",
    ])));
    assert_eq!(errors["items"][0]["id"], id.as_str());
    let all = json(&run(server.cli("svc-events").args([
        "--api-key",
        &readonly,
        "-o",
        "json",
        "list",
        "--limit",
        "2",
    ])));
    let first_types: Vec<&str> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(first_types, ["server_started", "apikey_created"]);
    let cursor = all["next_cursor"].as_str().unwrap().to_string();
    let rest = json(&run(server.cli("svc-events").args([
        "--api-key",
        &readonly,
        "-o",
        "json",
        "list",
        "--cursor",
        &cursor,
    ])));
    let rest_types: Vec<&str> = rest["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(rest_types, ["apikey_created", "command_failed"]);

    let stats = json(&run(server.cli("svc-events").args([
        "--api-key",
        &readonly,
        "-o",
        "json",
        "stats",
    ])));
    assert_eq!(stats["total"], 4);
    assert_eq!(stats["by_type"]["apikey_created"], 2);
    assert_eq!(stats["by_severity"]["error"], 1);

    // Refusals: readonly may not emit; unknown types and bad payloads are explained.
    let denied = run(server.cli("svc-events").args([
        "--api-key",
        &readonly,
        "emit",
        "--type",
        "bus_healthy",
    ]));
    assert_eq!(denied.code, 4, "{denied:?}");
    let unknown =
        run(server
            .cli("svc-events")
            .args(["--api-key", &operator, "emit", "--type", "made_up"]));
    // A bad flag value is a usage error, caught before the server is asked.
    assert_eq!(unknown.code, 2, "{unknown:?}");
    assert!(
        unknown
            .stderr
            .contains("'made_up': not a canonical event type"),
        "{unknown:?}"
    );
    // The server refuses it too (a client that skips the CLI's check), and audits that.
    let refused = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let address = format!("http://{}", server.grpc);
        let mut client = svc::proto::event_service_client::EventServiceClient::connect(address)
            .await
            .unwrap();
        let request = svc::proto::EmitEventRequest {
            r#type: "made_up".into(),
            ..Default::default()
        };
        client
            .emit(common::with_key(request, &operator))
            .await
            .unwrap_err()
    });
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("unknown event type 'made_up'"),
        "{refused:?}"
    );
    let bad_payload = run(server.cli("svc-events").args([
        "--api-key",
        &operator,
        "emit",
        "--type",
        "bus_healthy",
        "--payload",
        "[1]",
    ]));
    assert_eq!(bad_payload.code, 2, "{bad_payload:?}");
    let bad_since =
        run(server
            .cli("svc-events")
            .args(["--api-key", &operator, "list", "--since", "whenever"]));
    assert_eq!(bad_since.code, 2, "{bad_since:?}");
    assert!(bad_since.stderr.contains("not a time"), "{bad_since:?}");

    // Emit is audited.
    let audit = json(&run(server.cli("svc-audit").args([
        "--api-key",
        &readonly,
        "-o",
        "json",
        "log",
        "--action",
        "event.*",
    ])));
    let outcomes: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["error", "denied", "success"]);
}

#[test]
fn watch_and_subscribe_see_events_emitted_after_they_start() {
    let server = TestServer::start();
    let key = server.admin_key.clone();
    let mut watch = server
        .cli("svc-events")
        .args(["--api-key", &key, "watch", "--type", "state_drift_detected"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut subscribe = server
        .cli("svc-events")
        .args(["--api-key", &key, "subscribe", "--category", "job"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Give both a moment to open their streams; the events below are emitted afterwards.
    std::thread::sleep(Duration::from_millis(500));
    for source in ["web-01", "web-02"] {
        let emitted = run(server.cli("svc-events").args([
            "--api-key",
            &key,
            "emit",
            "--type",
            "state_drift_detected",
            "--source",
            source,
        ]));
        assert_eq!(emitted.code, 0, "{emitted:?}");
    }
    let mut watch_lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let first = watch_lines.next().unwrap().unwrap();
    assert!(
        first.contains("warning")
            && first.contains("state_drift_detected")
            && first.contains("source=web-01"),
        "{first}"
    );
    let second = watch_lines.next().unwrap().unwrap();
    assert!(second.contains("source=web-02"), "{second}");

    let mut subscribe_lines = BufReader::new(subscribe.stdout.take().unwrap()).lines();
    let event: serde_json::Value =
        serde_json::from_str(&subscribe_lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(
        (event["type"].as_str(), event["source"].as_str()),
        (Some("state_drift_detected"), Some("web-01"))
    );
    let _ = watch.kill();
    let _ = subscribe.kill();
    let _ = watch.wait();
    let _ = subscribe.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_joining_mid_stream_sees_every_event_exactly_once() {
    // 300 emits in a burst: lift the per-key rate limit, which is not under test here.
    let server = TestServer::start_with(common::Options {
        config_yaml: "rate_limit: { requests_per_second: 100000, burst: 100000 }\n".into(),
        ..common::Options::default()
    });
    let key = server.admin_key.clone();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let since = svc::clock::now_rfc3339();

    // An emitter writes 300 events while the subscriber joins part way through.
    let emitter = {
        let mut client = EventServiceClient::new(channel.clone());
        let key = key.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..300 {
                let request = EmitEventRequest {
                    r#type: "command_completed".into(),
                    severity: String::new(),
                    source: format!("agent-{}", i % 7),
                    payload_json: format!("{{\"i\":{i}}}"),
                };
                ids.push(
                    client
                        .emit(with_key(request, &key))
                        .await
                        .unwrap()
                        .into_inner()
                        .id,
                );
            }
            ids
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut client = EventServiceClient::new(channel.clone());
    let filter = EventFilter {
        types: vec!["command_completed".into(), "command_failed".into()],
        since,
        ..EventFilter::default()
    };
    let mut stream = client
        .subscribe(with_key(
            SubscribeEventsRequest {
                filter: Some(filter),
            },
            &key,
        ))
        .await
        .unwrap()
        .into_inner();
    let emitted = emitter.await.unwrap();
    // A sentinel after the last one tells the reader it has seen everything before it.
    let sentinel = EmitEventRequest {
        r#type: "command_failed".into(),
        severity: String::new(),
        source: "end".into(),
        payload_json: String::new(),
    };
    client.emit(with_key(sentinel, &key)).await.unwrap();

    let mut seen = Vec::new();
    let mut seqs = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if event.r#type == "command_failed" {
            break;
        }
        seqs.push(event.seq);
        seen.push(event.id);
    }
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no duplicates");
    assert_eq!(seen, emitted, "every event, in order");
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn replay_ends_and_acknowledged_events_survive_kill_9() {
    let mut server = TestServer::start();
    let key = server.admin_key.clone();
    let mut ids = Vec::new();
    for i in 0..5 {
        let emitted = run(server.cli("svc-events").args([
            "--api-key",
            &key,
            "-o",
            "json",
            "emit",
            "--type",
            "agent_enrolled",
            "--source",
            &format!("a{i}"),
        ]));
        ids.push(json(&emitted)["id"].as_str().unwrap().to_string());
    }
    server.stop_with(libc::SIGKILL);
    server.spawn(&[]);
    let replay = run(server.cli("svc-events").args([
        "--api-key",
        &key,
        "replay",
        "--since",
        "1h",
        "--type",
        "agent_enrolled",
    ]));
    assert_eq!(replay.code, 0, "{replay:?}");
    let replayed: Vec<String> = replay
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(replayed, ids);
    let no_since = run(server.cli("svc-events").args(["--api-key", &key, "replay"]));
    assert_eq!(no_since.code, 2, "{no_since:?}");
}
