//! Outbound webhooks end to end (issue 18): a real server, the real CLI, and a receiver HTTP
//! server here that checks every signature with the published Standard Webhooks algorithm
//! (HMAC-SHA256 over `id.timestamp.body`, key = base64 after `whsec_`), answers 500 when told
//! to, and records what arrived, in order.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use common::{json_of, run, Options, TestServer};

/// One request as the receiver saw it.
#[derive(Clone, Debug)]
struct Received {
    id: String,
    timestamp: String,
    signature: String,
    body: String,
    answered: u16,
}

/// A tiny HTTP/1.1 receiver: answers 500 to the first `fail_first` requests, 200 after.
struct Receiver {
    port: u16,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    fn start(fail_first: usize, delay: Duration) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::<Received>::new()));
        let log = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut headers = HashMap::new();
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    continue;
                }
                loop {
                    line.clear();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((name, value)) = line.trim_end().split_once(':') {
                        headers.insert(name.to_ascii_lowercase(), value.trim().to_string());
                    }
                }
                let length: usize = headers
                    .get("content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_err() {
                    continue;
                }
                std::thread::sleep(delay);
                let mut log = log.lock().unwrap();
                let answered = if log.len() < fail_first { 500 } else { 200 };
                log.push(Received {
                    id: headers.get("webhook-id").cloned().unwrap_or_default(),
                    timestamp: headers
                        .get("webhook-timestamp")
                        .cloned()
                        .unwrap_or_default(),
                    signature: headers
                        .get("webhook-signature")
                        .cloned()
                        .unwrap_or_default(),
                    body: String::from_utf8_lossy(&body).into_owned(),
                    answered,
                });
                drop(log);
                let reason = if answered == 200 {
                    "OK"
                } else {
                    "Internal Server Error"
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {answered} {reason}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
            }
        });
        Receiver { port, received }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook?from=svc", self.port)
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Waits until `done` holds for what arrived (at most 60 s).
    fn wait_for(&self, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let received = self.received();
            if done(&received) {
                return received;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; got {received:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Verifies a signature the way a receiver following the specification does.
fn verify(secret: &str, received: &Received) -> bool {
    use hmac_check::verify_v1;
    verify_v1(secret, received)
}

mod hmac_check {
    use super::*;

    pub fn verify_v1(secret: &str, received: &Received) -> bool {
        let key = base64::engine::general_purpose::STANDARD
            .decode(secret.strip_prefix("whsec_").unwrap())
            .unwrap();
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
        let signed = format!("{}.{}.{}", received.id, received.timestamp, received.body);
        let expected = base64::engine::general_purpose::STANDARD
            .encode(ring::hmac::sign(&key, signed.as_bytes()).as_ref());
        received
            .signature
            .split(' ')
            .any(|candidate| candidate == format!("v1,{expected}"))
    }
}

fn server() -> TestServer {
    TestServer::start_with(Options {
        config_yaml: "webhooks:\n  allow_private: true\n  retry_base: 200ms\n".into(),
        ..Options::default()
    })
}

fn webhook(server: &TestServer, key: &str, args: &[&str]) -> common::Run {
    run(server
        .cli("svc-webhook")
        .arg("--api-key")
        .arg(key)
        .arg("outbound")
        .args(args))
}

fn emit(server: &TestServer, key: &str, n: usize) {
    let emitted = run(server.cli("svc-events").args([
        "--api-key",
        key,
        "emit",
        "--type",
        "command_completed",
        "--payload",
        &format!("{{\"n\":{n}}}"),
    ]));
    assert_eq!(emitted.code, 0, "{emitted:?}");
}

fn n_of(received: &Received) -> Option<u64> {
    let body: serde_json::Value = serde_json::from_str(&received.body).ok()?;
    body["payload"]["n"].as_u64()
}

#[test]
fn signed_deliveries_in_order_with_a_retry_after_500() {
    let server = server();
    let receiver = Receiver::start(1, Duration::ZERO);
    let (_, operator) = server.create_key("hooks-operator", "operator");
    let (_, readonly) = server.create_key("hooks-readonly", "readonly");

    // Readonly may not create; link-local is refused even with allow_private.
    let denied = webhook(
        &server,
        &readonly,
        &[
            "create",
            "--url",
            &receiver.url(),
            "--events",
            "command_completed",
        ],
    );
    assert_eq!(denied.code, 4, "{denied:?}");
    let metadata = webhook(
        &server,
        &operator,
        &[
            "create",
            "--url",
            "http://169.254.169.254/latest",
            "--events",
            "command_completed",
        ],
    );
    assert_eq!(metadata.code, 1, "{metadata:?}");
    assert!(metadata.stderr.contains("link-local"), "{metadata:?}");
    let usage = webhook(&server, &operator, &["create", "--url", &receiver.url()]);
    assert_eq!(usage.code, 2, "{usage:?}");

    let created = webhook(
        &server,
        &operator,
        &[
            "-o",
            "json",
            "create",
            "--url",
            &receiver.url(),
            "--events",
            "command_completed",
        ],
    );
    assert_eq!(created.code, 0, "{created:?}");
    let created = json_of(&created);
    let id = created["id"].as_str().unwrap().to_string();
    let secret = created["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("whsec_"));

    // Nobody sees the secret again; readonly sees only the URL's origin.
    let listed = json_of(&webhook(&server, &readonly, &["-o", "json", "list"]));
    assert_eq!(listed[0]["id"], id.as_str());
    assert!(listed[0].get("secret").is_none());
    assert_eq!(
        listed[0]["url"],
        format!("http://127.0.0.1:{}/…", receiver.port).as_str()
    );
    let shown = json_of(&webhook(&server, &operator, &["-o", "json", "show", &id]));
    assert_eq!(shown["url"], receiver.url().as_str());
    assert!(shown.get("secret").is_none());

    for n in 0..10 {
        emit(&server, &operator, n);
    }
    let received = receiver.wait_for("10 delivered events", |r| {
        r.iter().filter(|r| r.answered == 200).count() >= 10
    });
    for r in &received {
        assert!(verify(&secret, r), "bad signature: {r:?}");
    }
    // The first try got 500 and was retried with the same webhook-id before anything else.
    assert_eq!(received[0].answered, 500);
    assert_eq!(received[0].id, received[1].id);
    assert!(received[0].id.starts_with("msg_"));
    let delivered: Vec<u64> = received
        .iter()
        .filter(|r| r.answered == 200)
        .filter_map(n_of)
        .collect();
    assert_eq!(
        delivered,
        (0..10).collect::<Vec<u64>>(),
        "in order, once each"
    );

    let deliveries = json_of(&webhook(
        &server,
        &readonly,
        &["-o", "json", "deliveries", &id],
    ));
    assert_eq!(deliveries.as_array().unwrap().len(), 10);
    let first = deliveries
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"] == received[0].id.as_str())
        .unwrap();
    assert_eq!(first["attempts"], 2);
    assert_eq!(first["status"], "delivered");
    assert_eq!(first["response_status"], 200);

    // A ping, then a redelivery with the same webhook-id.
    let ping = webhook(&server, &operator, &["test", &id]);
    assert_eq!(ping.code, 0, "{ping:?}");
    let last = receiver.wait_for("the ping", |r| {
        r.iter().any(|r| r.body.contains("webhook.ping"))
    });
    assert!(verify(&secret, last.last().unwrap()));
    let redelivered = webhook(&server, &operator, &["redeliver", &received[0].id]);
    assert_eq!(redelivered.code, 0, "{redelivered:?}");
    receiver.wait_for("the redelivery", |r| {
        r.iter().filter(|x| x.id == received[0].id).count() == 3
    });

    // A master-key rotation re-seals the secret: the next ping is signed with the same one.
    let scratch = tempfile::tempdir().unwrap();
    let new_key = scratch.path().join("new.key");
    std::fs::write(&new_key, common::random_master_key()).unwrap();
    let rotated = run(server
        .cli("svc-secrets")
        .args([
            "--api-key",
            &server.admin_key,
            "rotate-master",
            "--new-key-file",
        ])
        .arg(&new_key));
    assert_eq!(rotated.code, 0, "{rotated:?}");
    let before = receiver.received().len();
    let ping = webhook(&server, &operator, &["test", &id]);
    assert_eq!(ping.code, 0, "{ping:?}");
    let after = receiver.wait_for("the ping after rotation", |r| r.len() > before);
    assert!(verify(&secret, after.last().unwrap()));

    // Updating the filter, then deleting; all audited.
    let updated = webhook(
        &server,
        &operator,
        &["update", &id, "--events", "command_failed"],
    );
    assert_eq!(updated.code, 0, "{updated:?}");
    let deleted = webhook(&server, &operator, &["delete", &id]);
    assert_eq!(deleted.code, 0, "{deleted:?}");
    let gone = webhook(&server, &operator, &["show", &id]);
    assert_eq!(gone.code, 5, "{gone:?}");
    let audit = common::audit_rows(&server, &["--action", "webhook.*"]);
    let actions: Vec<&str> = audit.iter().filter_map(|r| r["action"].as_str()).collect();
    for action in [
        "webhook.create",
        "webhook.update",
        "webhook.delete",
        "webhook.test",
        "webhook.redeliver",
    ] {
        assert!(actions.contains(&action), "{action} in {actions:?}");
    }
    assert!(
        audit
            .iter()
            .any(|r| r["action"] == "webhook.create" && r["outcome"] == "denied"),
        "the readonly attempt is audited as denied: {audit:#?}"
    );
    // The link-local target was refused by a rule, not failed: denied too (contract §9).
    let creates: Vec<(&str, &str)> = audit
        .iter()
        .filter(|r| r["action"] == "webhook.create")
        .map(|r| (r["user"].as_str().unwrap(), r["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(
        creates.iter().filter(|(_, o)| *o == "denied").count(),
        2,
        "{creates:?}"
    );
    assert!(
        creates.contains(&("hooks-operator", "denied")),
        "{creates:?}"
    );
    assert!(!creates.iter().any(|(_, o)| *o == "error"), "{creates:?}");
}

#[test]
fn nothing_is_lost_across_a_kill_9() {
    let mut server = server();
    // A slow receiver, so the kill lands mid-stream.
    let receiver = Receiver::start(0, Duration::from_millis(30));
    let (_, operator) = server.create_key("hooks-operator", "operator");
    let created = webhook(
        &server,
        &operator,
        &[
            "-o",
            "json",
            "create",
            "--url",
            &receiver.url(),
            "--category",
            "job",
        ],
    );
    assert_eq!(created.code, 0, "{created:?}");
    let secret = json_of(&created)["secret"].as_str().unwrap().to_string();

    for n in 0..30 {
        emit(&server, &operator, n);
    }
    receiver.wait_for("some deliveries", |r| r.len() >= 3);
    server.stop_with(libc::SIGKILL);
    server.spawn(&[]);
    for n in 30..40 {
        emit(&server, &operator, n);
    }
    let received = receiver.wait_for("all 40 events", |r| {
        let mut seen: Vec<u64> = r.iter().filter_map(n_of).collect();
        seen.sort();
        seen.dedup();
        seen.len() == 40
    });
    // At-least-once: a repeat (the one in flight at the kill) keeps its webhook-id, and the
    // first arrivals are in event order.
    let mut id_of: HashMap<u64, String> = HashMap::new();
    let mut firsts = Vec::new();
    for r in &received {
        assert!(verify(&secret, r), "bad signature: {r:?}");
        let n = n_of(r).unwrap();
        match id_of.get(&n) {
            Some(id) => assert_eq!(id, &r.id, "a repeat of {n} has a new webhook-id"),
            None => {
                id_of.insert(n, r.id.clone());
                firsts.push(n);
            }
        }
    }
    assert_eq!(firsts, (0..40).collect::<Vec<u64>>());
    let repeats = received.len() - 40;
    assert!(repeats <= 1, "{repeats} repeats: {received:#?}");
}

#[test]
fn a_delivery_that_keeps_failing_is_dead_lettered_and_the_next_goes() {
    let server = TestServer::start_with(Options {
        config_yaml: "webhooks:\n  allow_private: true\n  retry_base: 100ms\n  max_retry_age: 1s\n"
            .into(),
        ..Options::default()
    });
    // Fails everything: each message is tried until max_retry_age, then dead-lettered.
    let receiver = Receiver::start(usize::MAX, Duration::ZERO);
    let (_, operator) = server.create_key("hooks-operator", "operator");
    let created = webhook(
        &server,
        &operator,
        &[
            "-o",
            "json",
            "create",
            "--url",
            &receiver.url(),
            "--events",
            "command_completed",
        ],
    );
    assert_eq!(created.code, 0, "{created:?}");
    let id = json_of(&created)["id"].as_str().unwrap().to_string();
    emit(&server, &operator, 1);
    emit(&server, &operator, 2);
    let deadline = Instant::now() + Duration::from_secs(30);
    let failed = loop {
        let failed = json_of(&webhook(
            &server,
            &operator,
            &["-o", "json", "deliveries", &id, "--failed"],
        ));
        if failed
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["status"] == "dead")
            .count()
            == 2
        {
            break failed;
        }
        assert!(Instant::now() < deadline, "not dead-lettered: {failed:#}");
        std::thread::sleep(Duration::from_millis(100));
    };
    for delivery in failed.as_array().unwrap() {
        assert!(delivery["attempts"].as_u64().unwrap() >= 2, "{delivery:#}");
        assert_eq!(delivery["response_status"], 500);
    }
    // Both were tried, the first to the end before the second began.
    let received = receiver.received();
    let first_of_second = received.iter().position(|r| n_of(r) == Some(2)).unwrap();
    assert!(received[..first_of_second]
        .iter()
        .all(|r| n_of(r) == Some(1)));
    assert!(received[first_of_second..]
        .iter()
        .all(|r| n_of(r) == Some(2)));
}
