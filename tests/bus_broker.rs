//! The embedded bus broker against stock clients: async-nats for behaviour, raw TCP for the
//! exact protocol bytes. Every test starts its own broker on 127.0.0.1:0.

mod bus_support;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bus_support::{start_broker, start_open_broker, url, Raw, PATIENCE};
use futures_util::StreamExt;
use svc::bus::{AllowDeny, BrokerConfig, NoAuth, Permissions, StaticAuth};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

async fn client(handle: &svc::bus::BrokerHandle) -> async_nats::Client {
    async_nats::connect(url(handle)).await.unwrap()
}

async fn next(subscriber: &mut async_nats::Subscriber) -> async_nats::Message {
    timeout(PATIENCE, subscriber.next())
        .await
        .expect("message in time")
        .expect("subscription open")
}

#[tokio::test]
async fn publish_subscribe_and_wildcards() {
    let broker = start_open_broker().await;
    let subscriber = client(&broker).await;
    let publisher = client(&broker).await;
    let cases = [
        ("svc.events.agent", vec!["svc.events.agent"]),
        ("svc.events.*", vec!["svc.events.a", "svc.events.b"]),
        ("svc.>", vec!["svc.x", "svc.agent.a1.heartbeat"]),
    ];
    for (pattern, subjects) in cases {
        let mut subscription = subscriber.subscribe(pattern).await.unwrap();
        subscriber.flush().await.unwrap();
        publisher
            .publish("other.subject", "no".into())
            .await
            .unwrap();
        for subject in &subjects {
            publisher
                .publish(subject.to_string(), "yes".into())
                .await
                .unwrap();
        }
        publisher.flush().await.unwrap();
        for subject in &subjects {
            let message = next(&mut subscription).await;
            assert_eq!(
                (message.subject.as_str(), &message.payload[..]),
                (*subject, &b"yes"[..]),
                "{pattern}"
            );
        }
        subscription.unsubscribe().await.unwrap();
    }
}

#[tokio::test]
async fn queue_group_delivers_each_message_to_one_member() {
    let broker = start_open_broker().await;
    let publisher = client(&broker).await;
    let mut members = Vec::new();
    for _ in 0..3 {
        let connection = client(&broker).await;
        let subscription = connection
            .queue_subscribe("jobs", "workers".into())
            .await
            .unwrap();
        connection.flush().await.unwrap();
        members.push((connection, subscription));
    }
    let watcher = client(&broker).await;
    let mut plain = watcher.subscribe("jobs").await.unwrap();
    watcher.flush().await.unwrap();
    const TOTAL: usize = 300;
    for index in 0..TOTAL {
        publisher
            .publish("jobs", index.to_string().into())
            .await
            .unwrap();
    }
    publisher.flush().await.unwrap();
    for _ in 0..TOTAL {
        next(&mut plain).await;
    }
    // The plain subscriber saw everything, so every member's share is already queued to it.
    let mut counts = Vec::new();
    for (connection, subscription) in &mut members {
        connection.flush().await.unwrap();
        let mut count = 0;
        while let Ok(Some(_)) = timeout(Duration::from_millis(200), subscription.next()).await {
            count += 1;
        }
        counts.push(count);
    }
    assert_eq!(counts.iter().sum::<usize>(), TOTAL, "{counts:?}");
    assert!(
        counts.iter().all(|&count| count > 0),
        "every member gets some: {counts:?}"
    );
}

#[tokio::test]
async fn request_reply_headers_and_no_responders() {
    let broker = start_open_broker().await;
    let responder = client(&broker).await;
    let mut service = responder.subscribe("svc.enroll").await.unwrap();
    responder.flush().await.unwrap();
    tokio::spawn(async move {
        while let Some(request) = service.next().await {
            let mut headers = async_nats::HeaderMap::new();
            let seen = request
                .headers
                .as_ref()
                .and_then(|h| h.get("X-Csr"))
                .map(|v| v.to_string())
                .unwrap_or_default();
            headers.insert("X-Seen", seen.as_str());
            headers.append("Multi", "1");
            headers.append("Multi", "2");
            let reply = request.reply.expect("request has a reply subject");
            responder
                .publish_with_headers(reply, headers, request.payload)
                .await
                .unwrap();
        }
    });
    let requester = client(&broker).await;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("X-Csr", "pem");
    let reply = requester
        .request_with_headers("svc.enroll", headers, "hello".into())
        .await
        .unwrap();
    assert_eq!(&reply.payload[..], b"hello");
    let reply_headers = reply.headers.expect("headers kept");
    assert_eq!(
        reply_headers.get("X-Seen").map(|v| v.to_string()),
        Some("pem".into())
    );
    let multi: Vec<String> = reply_headers
        .get_all("Multi")
        .map(|v| v.to_string())
        .collect();
    assert_eq!(multi, ["1", "2"]);

    let error = requester
        .request("nobody.listens", "x".into())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), async_nats::RequestErrorKind::NoResponders);
}

#[tokio::test]
async fn echo_false_skips_own_subscriptions() {
    let broker = start_open_broker().await;
    let quiet = async_nats::ConnectOptions::new()
        .no_echo()
        .connect(url(&broker))
        .await
        .unwrap();
    let mut own = quiet.subscribe("chat").await.unwrap();
    let other = client(&broker).await;
    let mut theirs = other.subscribe("chat").await.unwrap();
    other.flush().await.unwrap();
    quiet.publish("chat", "from quiet".into()).await.unwrap();
    // Two connections have no order between them: "from quiet" must be routed first.
    quiet.flush().await.unwrap();
    other.publish("chat", "from other".into()).await.unwrap();
    other.flush().await.unwrap();
    assert_eq!(&next(&mut own).await.payload[..], b"from other");
    assert_eq!(&next(&mut theirs).await.payload[..], b"from quiet");
    assert_eq!(&next(&mut theirs).await.payload[..], b"from other");
}

#[tokio::test]
async fn max_payload_is_announced_and_enforced() {
    let config = BrokerConfig {
        max_payload: 1024,
        ..BrokerConfig::default()
    };
    let broker = start_broker(config, Arc::new(NoAuth)).await;
    let nats = client(&broker).await;
    assert_eq!(nats.server_info().max_payload, 1024);
    let error = nats
        .publish("big", vec![0u8; 1025].into())
        .await
        .unwrap_err();
    assert_eq!(
        error.kind(),
        async_nats::client::PublishErrorKind::MaxPayloadExceeded
    );

    let (mut raw, _) = Raw::connect_after_info(broker.local_addr()).await;
    raw.send(b"CONNECT {\"verbose\":false}\r\nPUB big 1025\r\n")
        .await;
    assert_eq!(
        raw.expect_closed().await,
        b"-ERR 'Maximum Payload Violation'\r\n"
    );
}

#[tokio::test]
async fn permissions_violations_keep_the_connection() {
    let alice = Permissions {
        user: "alice".into(),
        publish: AllowDeny::only(["svc.>", "_INBOX.>"]).deny(["svc.secret"]),
        subscribe: AllowDeny::only(["svc.>", "_INBOX.>"]).deny(["svc.hidden.>"]),
        internal: false,
        quota: false,
    };
    let auth = StaticAuth::new().with_user("alice", "pw", alice);
    let broker = start_broker(BrokerConfig::default(), Arc::new(auth)).await;
    let (mut raw, info) = Raw::connect_after_info(broker.local_addr()).await;
    assert!(info.contains("\"auth_required\":true"), "{info}");
    raw.send(b"CONNECT {\"verbose\":false,\"user\":\"alice\",\"pass\":\"pw\"}\r\n")
        .await;
    raw.send(b"PUB svc.secret 0\r\n\r\nSUB other 1\r\nSUB other q 2\r\nSUB svc.> 3\r\nPUB svc.hidden.x 1\r\nh\r\nPUB svc.ok 1\r\nk\r\n").await;
    let replies = raw.flush().await;
    assert_eq!(
        String::from_utf8_lossy(&replies),
        "-ERR 'Permissions Violation for Publish to \"svc.secret\"'\r\n\
         -ERR 'Permissions Violation for Subscription to \"other\"'\r\n\
         -ERR 'Permissions Violation for Subscription to \"other\" using queue \"q\"'\r\n\
         MSG svc.ok 3 1\r\nk\r\n"
    );

    let nats = async_nats::ConnectOptions::with_user_and_password("alice".into(), "bad".into())
        .connect(url(&broker))
        .await;
    assert!(nats.is_err(), "wrong password is refused");
}

#[tokio::test]
async fn anonymous_enrolment_permissions() {
    let auth = StaticAuth::new()
        .with_token("admin-token", Permissions::allow_all("admin"))
        .with_anonymous(Permissions::enrolment());
    let broker = start_broker(BrokerConfig::default(), Arc::new(auth)).await;
    let server = async_nats::ConnectOptions::with_token("admin-token".into())
        .connect(url(&broker))
        .await
        .unwrap();
    let mut enrolments = server.subscribe("svc.enroll").await.unwrap();
    server.flush().await.unwrap();
    tokio::spawn(async move {
        while let Some(request) = enrolments.next().await {
            server
                .publish(request.reply.unwrap(), "certificate".into())
                .await
                .unwrap();
        }
    });
    // An agent with no credentials: async-nats' inbox is `_INBOX.<22-char nuid>.*`.
    let agent = async_nats::connect(url(&broker)).await.unwrap();
    let reply = agent.request("svc.enroll", "csr".into()).await.unwrap();
    assert_eq!(&reply.payload[..], b"certificate");

    let (mut raw, _) = Raw::connect_after_info(broker.local_addr()).await;
    raw.send(b"CONNECT {\"verbose\":false}\r\nSUB _INBOX.> 1\r\nSUB _INBOX.*.x 2\r\nSUB _INBOX.abcdefghijklmnop.* 3\r\nPUB svc.agent.a1.result 0\r\n\r\n").await;
    assert_eq!(
        String::from_utf8_lossy(&raw.flush().await),
        "-ERR 'Permissions Violation for Subscription to \"_INBOX.>\"'\r\n\
         -ERR 'Permissions Violation for Subscription to \"_INBOX.*.x\"'\r\n\
         -ERR 'Permissions Violation for Publish to \"svc.agent.a1.result\"'\r\n"
    );
}

#[tokio::test]
async fn authentication_failures() {
    let auth = StaticAuth::new().with_token("secret", Permissions::allow_all("t"));
    let config = BrokerConfig {
        auth_timeout: Duration::from_millis(300),
        ..BrokerConfig::default()
    };
    let broker = start_broker(config, Arc::new(auth)).await;
    let cases: [(&[u8], &[u8]); 4] = [
        (b"PING\r\n", b"-ERR 'Authorization Violation'\r\n"),
        (
            b"CONNECT {\"auth_token\":\"wrong\"}\r\n",
            b"-ERR 'Authorization Violation'\r\n",
        ),
        (b"CONNECT {}\r\n", b"-ERR 'Authorization Violation'\r\n"),
        (b"", b"-ERR 'Authentication Timeout'\r\n"),
    ];
    for (sent, expected) in cases {
        let (mut raw, _) = Raw::connect_after_info(broker.local_addr()).await;
        raw.send(sent).await;
        assert_eq!(
            String::from_utf8_lossy(&raw.expect_closed().await),
            String::from_utf8_lossy(expected)
        );
    }
    let (mut raw, _) = Raw::connect_after_info(broker.local_addr()).await;
    raw.send(b"CONNECT {\"auth_token\":\"secret\"}\r\n").await;
    raw.expect(b"+OK\r\n").await;
}

#[tokio::test]
async fn garbage_closes_only_the_sender() {
    let broker = start_open_broker().await;
    let bystander = client(&broker).await;
    let mut subscription = bystander.subscribe("still.working").await.unwrap();
    bystander.flush().await.unwrap();
    let cases: [(&[u8], &[u8]); 6] = [
        (b"FOO BAR\r\n", b"-ERR 'Unknown Protocol Operation'\r\n"),
        (
            b"PUB a 2\r\nabc\r\n",
            b"-ERR 'Unknown Protocol Operation'\r\n",
        ),
        (
            b"MSG a 1 1\r\nx\r\n",
            b"-ERR 'Unknown Protocol Operation'\r\n",
        ),
        (b"PUB a\r\n", b""),
        (b"CONNECT {bad json\r\n", b""),
        (
            b"\x00\x01\x02\r\n",
            b"-ERR 'Unknown Protocol Operation'\r\n",
        ),
    ];
    for (garbage, expected) in cases {
        let (mut raw, _) = Raw::connect_after_info(broker.local_addr()).await;
        raw.send(b"CONNECT {\"verbose\":false}\r\n").await;
        raw.send(garbage).await;
        assert_eq!(
            String::from_utf8_lossy(&raw.expect_closed().await),
            String::from_utf8_lossy(expected)
        );
        bystander
            .publish("still.working", "yes".into())
            .await
            .unwrap();
        assert_eq!(&next(&mut subscription).await.payload[..], b"yes");
    }
    let long_line = format!("SUB {} 1\r\n", "a".repeat(5000));
    let (mut raw, _) = Raw::connect_after_info(broker.local_addr()).await;
    raw.send(long_line.as_bytes()).await;
    assert_eq!(
        raw.expect_closed().await,
        b"-ERR 'maximum control line exceeded'\r\n"
    );
}

#[tokio::test]
async fn split_and_coalesced_frames() {
    let broker = start_open_broker().await;
    let (mut raw, _) = Raw::connect_after_info(broker.local_addr()).await;
    let session: &[u8] = b"CONNECT {\"verbose\":false,\"headers\":true}\r\nSUB a.* 1\r\nPUB a.b r 5\r\nhe\r\no\r\nHPUB a.c 12 14\r\nNATS/1.0\r\n\r\nhi\r\n";
    // One byte per write, then everything in one write.
    for byte in session {
        raw.send(std::slice::from_ref(byte)).await;
        tokio::task::yield_now().await;
    }
    raw.send(&session[42..]).await;
    let expected = "MSG a.b 1 r 5\r\nhe\r\no\r\nHMSG a.c 1 12 14\r\nNATS/1.0\r\n\r\nhi\r\n";
    assert_eq!(
        String::from_utf8_lossy(&raw.flush().await),
        expected.repeat(2)
    );
}

#[tokio::test]
async fn verbose_unsub_max_and_pedantic() {
    let broker = start_open_broker().await;
    let cases: [(&[u8], &str); 5] = [
        (b"CONNECT {}\r\nSUB a 1\r\nUNSUB 1\r\nUNSUB 99\r\n", "+OK\r\n+OK\r\n+OK\r\n+OK\r\n"),
        (
            b"CONNECT {\"verbose\":false}\r\nSUB a 1\r\nUNSUB 1 2\r\nPUB a 1\r\nx\r\nPUB a 1\r\ny\r\nPUB a 1\r\nz\r\n",
            "MSG a 1 1\r\nx\r\nMSG a 1 1\r\ny\r\n",
        ),
        (
            b"CONNECT {\"verbose\":false}\r\nSUB a 1\r\nPUB a 1\r\nx\r\nUNSUB 1 1\r\nPUB a 1\r\ny\r\n",
            "MSG a 1 1\r\nx\r\n",
        ),
        (
            b"CONNECT {\"verbose\":false,\"pedantic\":true}\r\nSUB a.* 1\r\nPUB a.* 1\r\nx\r\nSUB a..b 2\r\n",
            "-ERR 'Invalid Publish Subject'\r\nMSG a.* 1 1\r\nx\r\n-ERR 'Invalid Subject'\r\n",
        ),
        (b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\nSUB a.* 1\r\nPUB a.* 1\r\nx\r\n", "MSG a.* 1 1\r\nx\r\n"),
    ];
    for (session, expected) in cases {
        let (mut raw, _) = Raw::connect_after_info(broker.local_addr()).await;
        raw.send(session).await;
        assert_eq!(
            String::from_utf8_lossy(&raw.flush().await),
            expected,
            "{}",
            String::from_utf8_lossy(session)
        );
    }
}

#[tokio::test]
async fn connect_errors() {
    let broker = start_open_broker().await;
    let cases: [(&[u8], &[u8]); 3] = [
        (
            b"CONNECT {\"protocol\":2}\r\n",
            b"-ERR 'invalid client protocol'\r\n",
        ),
        (
            b"CONNECT {\"no_responders\":true}\r\n",
            b"-ERR 'no responders requires headers support'\r\n",
        ),
        (
            b"CONNECT {\"verbose\":false}\r\nHPUB a 12 12\r\nNATS/1.0\r\n\r\n\r\n",
            b"",
        ),
    ];
    for (session, expected) in cases {
        let (mut raw, _) = Raw::connect_after_info(broker.local_addr()).await;
        raw.send(session).await;
        assert_eq!(
            String::from_utf8_lossy(&raw.expect_closed().await),
            String::from_utf8_lossy(expected)
        );
    }
}

#[tokio::test]
async fn info_announces_what_clients_need() {
    let broker = start_open_broker().await;
    let (_raw, info) = Raw::connect_after_info(broker.local_addr()).await;
    let json: serde_json::Value =
        serde_json::from_str(info.trim_start_matches("INFO ").trim_end()).unwrap();
    let expected = [
        ("proto", serde_json::json!(1)),
        ("headers", serde_json::json!(true)),
        ("max_payload", serde_json::json!(1024 * 1024)),
        ("version", serde_json::json!("2.9.10")),
    ];
    for (field, value) in expected {
        assert_eq!(json[field], value, "{field}");
    }
    assert!(
        json["go"]
            .as_str()
            .is_some_and(|go| go.starts_with("rust1.")),
        "go: {info}"
    );
    for absent in ["nonce", "jetstream", "ldm", "auth_required", "tls_required"] {
        assert!(json[absent].is_null(), "{absent} present: {info}");
    }
    for field in [
        "server_id",
        "server_name",
        "client_id",
        "client_ip",
        "host",
        "port",
        "svc_version",
    ] {
        assert!(!json[field].is_null(), "{field} missing: {info}");
    }
}

#[tokio::test]
async fn idle_clients_are_pinged_and_stale_ones_closed() {
    let config = BrokerConfig {
        ping_interval: Duration::from_millis(200),
        max_pings_out: 2,
        ..BrokerConfig::default()
    };
    let broker = start_broker(config, Arc::new(NoAuth)).await;
    let (mut answering, _) = Raw::connect_after_info(broker.local_addr()).await;
    answering.send(b"CONNECT {\"verbose\":false}\r\n").await;
    for _ in 0..4 {
        answering.expect(b"PING\r\n").await;
        answering.send(b"PONG\r\n").await;
    }
    // Four ticks answered, more than max_pings_out: a client answering PINGs stays. (Checked
    // now: it stops answering below, and would be closed as stale itself in time.)
    assert!(
        !answering.snapshot().closed,
        "a client answering PINGs stays"
    );
    let (mut silent, _) = Raw::connect_after_info(broker.local_addr()).await;
    silent.send(b"CONNECT {\"verbose\":false}\r\n").await;
    // Two unanswered PINGs are tolerated; the third tick closes the connection. (On a loaded
    // machine a late tick may add a PING, never a missing one or another ending.)
    let seen = String::from_utf8_lossy(&silent.expect_closed().await).into_owned();
    let pings = seen
        .strip_suffix("-ERR 'Stale Connection'\r\n")
        .unwrap_or_else(|| panic!("not closed as stale: {seen:?}"));
    assert!(
        pings.len() >= 12 && pings.split_terminator("\r\n").all(|op| op == "PING"),
        "{seen:?}"
    );
}

#[tokio::test]
async fn thousand_concurrent_connections() {
    let broker = start_open_broker().await;
    let mut connections = Vec::new();
    for index in 0..1000 {
        let mut raw = Raw::connect(broker.local_addr()).await;
        raw.send(
            format!("CONNECT {{\"verbose\":false}}\r\nSUB fanout {index}\r\nPING\r\n").as_bytes(),
        )
        .await;
        connections.push(raw);
    }
    for raw in &mut connections {
        raw.read_line().await; // INFO
        raw.expect(b"PONG\r\n").await;
    }
    assert_eq!(broker.stats().connections.load(Ordering::Relaxed), 1000);
    let publisher = client(&broker).await;
    publisher.publish("fanout", "all".into()).await.unwrap();
    publisher.flush().await.unwrap();
    for (index, raw) in connections.iter_mut().enumerate() {
        raw.expect(format!("MSG fanout {index} 3\r\nall\r\n").as_bytes())
            .await;
    }
}

#[tokio::test]
async fn slow_consumer_is_dropped_without_slowing_others() {
    let config = BrokerConfig {
        max_pending_bytes: 4 * 1024 * 1024,
        ..BrokerConfig::default()
    };
    let broker = start_broker(config, Arc::new(NoAuth)).await;
    // Subscribes and then never reads: its socket buffers fill, then its outbound buffer.
    let mut slow = tokio::net::TcpStream::connect(broker.local_addr())
        .await
        .unwrap();
    slow.write_all(b"CONNECT {\"verbose\":false}\r\nSUB firehose 1\r\nPING\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    while !seen.ends_with(b"PONG\r\n") {
        seen.push(slow.read_u8().await.unwrap());
    }
    let healthy = client(&broker).await;
    let mut subscription = healthy.subscribe("firehose").await.unwrap();
    healthy.flush().await.unwrap();
    let publisher = client(&broker).await;
    let payload = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
    // 64 MiB in 1 MiB batches. Each batch waits until the healthy subscriber has it, so its
    // backlog stays far under the limit while the slow one's only grows.
    const BATCH: usize = 16;
    for _ in 0..64 {
        for _ in 0..BATCH {
            publisher
                .publish("firehose", payload.clone())
                .await
                .unwrap();
        }
        publisher.flush().await.unwrap();
        for _ in 0..BATCH {
            assert_eq!(next(&mut subscription).await.payload.len(), payload.len());
        }
    }
    assert_eq!(broker.stats().slow_consumers.load(Ordering::Relaxed), 1);
    // The slow socket reaches EOF once its buffered bytes are read, with no -ERR at the end.
    let mut tail = Vec::new();
    let _ = timeout(PATIENCE, slow.read_to_end(&mut tail))
        .await
        .expect("slow socket closed");
    assert!(
        !String::from_utf8_lossy(&tail).contains("-ERR"),
        "closed without -ERR"
    );
}

/// Lets every CONNECT through, but only when the test says so: a login held mid-verification.
struct GatedAuth(tokio::sync::Semaphore);

#[async_trait::async_trait]
impl svc::bus::Authenticator for GatedAuth {
    fn auth_required(&self) -> bool {
        true
    }

    async fn authenticate(&self, _request: &svc::bus::AuthRequest<'_>) -> Option<Permissions> {
        self.0.acquire().await.ok()?.forget();
        Some(Permissions::allow_all("gated"))
    }
}

#[tokio::test]
async fn logins_past_the_bound_wait_for_a_permit_then_are_closed() {
    let auth = Arc::new(GatedAuth(tokio::sync::Semaphore::new(0)));
    let config = BrokerConfig {
        max_concurrent_logins: 1,
        auth_timeout: Duration::from_millis(500),
        ..BrokerConfig::default()
    };
    let broker = start_broker(config, auth.clone()).await;
    // The only permit: a login whose CONNECT is being verified.
    let (mut first, _) = Raw::connect_after_info(broker.local_addr()).await;
    first.send(b"CONNECT {}\r\n").await;
    // The next one waits without INFO, then is closed unanswered at the auth timeout.
    let mut waiting = Raw::connect(broker.local_addr()).await;
    assert_eq!(waiting.expect_closed().await, b"");
    assert_eq!(broker.stats().logins_timed_out.load(Ordering::Relaxed), 1);
    assert_eq!(broker.stats().logins_in_progress.load(Ordering::Relaxed), 1);
    // One that arrives while the permit is held is served as soon as it is free.
    let mut queued = Raw::connect(broker.local_addr()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    auth.0.add_permits(2);
    first.expect(b"+OK\r\n").await;
    assert!(queued.read_line().await.starts_with("INFO "));
    queued.send(b"CONNECT {}\r\n").await;
    queued.expect(b"+OK\r\n").await;
    assert_eq!(broker.stats().logins_in_progress.load(Ordering::Relaxed), 0);
    assert_eq!(broker.stats().logins_timed_out.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn connection_cap() {
    let config = BrokerConfig {
        max_connections: 2,
        ..BrokerConfig::default()
    };
    let broker = start_broker(config, Arc::new(NoAuth)).await;
    let (_first, _) = Raw::connect_after_info(broker.local_addr()).await;
    let (_second, _) = Raw::connect_after_info(broker.local_addr()).await;
    let (mut third, _) = Raw::connect_after_info(broker.local_addr()).await;
    assert_eq!(
        third.expect_closed().await,
        b"-ERR 'maximum connections exceeded'\r\n"
    );
}

#[tokio::test]
async fn shutdown_sends_lame_duck_info_then_closes() {
    let broker = start_open_broker().await;
    let addr = broker.local_addr();
    let (mut raw, _) = Raw::connect_after_info(addr).await;
    raw.send(b"CONNECT {\"verbose\":false,\"protocol\":1}\r\n")
        .await;
    raw.flush().await;
    // Protocol 0 clients get no async INFO (as nats-server).
    let (mut old, _) = Raw::connect_after_info(addr).await;
    old.send(b"CONNECT {\"verbose\":false}\r\n").await;
    old.flush().await;
    broker.shutdown(Duration::from_millis(100)).await;
    let rest = String::from_utf8_lossy(&raw.expect_closed().await).into_owned();
    assert!(
        rest.starts_with("INFO ") && rest.contains("\"ldm\":true"),
        "{rest}"
    );
    assert_eq!(old.expect_closed().await, b"");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn lame_duck_stops_accepting_notifies_then_closes() {
    let broker = start_open_broker().await;
    let addr = broker.local_addr();
    let mut clients = Vec::new();
    for _ in 0..3 {
        let (mut raw, _) = Raw::connect_after_info(addr).await;
        raw.send(b"CONNECT {\"verbose\":false,\"protocol\":1}\r\n")
            .await;
        raw.flush().await;
        clients.push(raw);
    }
    broker.enter_lame_duck(Duration::from_millis(600), Duration::from_millis(200));
    for raw in &mut clients {
        let info = raw.read_line().await;
        assert!(info.contains("\"ldm\":true"), "{info}");
        assert!(raw.expect_closed().await.is_empty());
    }
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    assert!(broker.view().is_lame_duck() && !broker.view().is_accepting());
    timeout(PATIENCE, broker.shutdown(Duration::from_millis(100)))
        .await
        .unwrap();
}

#[tokio::test]
async fn stats_count_traffic() {
    let broker = start_open_broker().await;
    let (mut raw, _) = Raw::connect_after_info(broker.local_addr()).await;
    raw.send(b"CONNECT {\"verbose\":false}\r\nSUB a 1\r\nSUB a 2\r\nPUB a 3\r\nabc\r\n")
        .await;
    raw.flush().await;
    let stats = broker.stats();
    let got: HashMap<&str, u64> = [
        ("messages_in", stats.messages_in.load(Ordering::Relaxed)),
        ("bytes_in", stats.bytes_in.load(Ordering::Relaxed)),
        ("messages_out", stats.messages_out.load(Ordering::Relaxed)),
        ("bytes_out", stats.bytes_out.load(Ordering::Relaxed)),
    ]
    .into_iter()
    .collect();
    let expected: HashMap<&str, u64> = [
        ("messages_in", 1),
        ("bytes_in", 3),
        ("messages_out", 2),
        ("bytes_out", 6),
    ]
    .into_iter()
    .collect();
    assert_eq!(got, expected);
}

/// A self-signed certificate for 127.0.0.1 made with the openssl CLI, or `None` without it.
fn self_signed_certificate(
    dir: &std::path::Path,
) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    let status = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .args(["-days", "1", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .ok()?;
    status.success().then_some((cert, key))
}

#[tokio::test]
async fn tls_upgrade_and_tls_first() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let dir = tempfile::tempdir().unwrap();
    let Some((cert_path, key_path)) = self_signed_certificate(dir.path()) else {
        println!("skip: openssl CLI not available to make a test certificate");
        return;
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_path)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&key_path).unwrap();
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let tls = Arc::new(tls);
    for handshake_first in [false, true] {
        let config = BrokerConfig {
            tls: Some(tls.clone()),
            tls_handshake_first: handshake_first,
            ..BrokerConfig::default()
        };
        let broker = start_broker(config, Arc::new(NoAuth)).await;
        let mut options = async_nats::ConnectOptions::new()
            .add_root_certificates(cert_path.clone())
            .require_tls(true);
        if handshake_first {
            options = options.tls_first();
        }
        let nats = options
            .connect(format!("tls://127.0.0.1:{}", broker.local_addr().port()))
            .await
            .unwrap();
        let mut subscription = nats.subscribe("secure").await.unwrap();
        nats.publish("secure", "over tls".into()).await.unwrap();
        assert_eq!(
            &next(&mut subscription).await.payload[..],
            b"over tls",
            "tls_first={handshake_first}"
        );
    }
}
