//! The server's bus: API keys as bus credentials with role permissions, the anonymous
//! enrolment rights, live events on svc.events.>, health and metrics, and the external mode
//! against Debian's nats-server.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{bus_session, bus_socket, Options, TestServer};
use futures_util::StreamExt;

#[test]
fn api_keys_are_bus_credentials_with_role_permissions() {
    let server = TestServer::start();
    let (_, readonly) = server.create_key("viewer", "readonly");
    let (operator_id, operator) = server.create_key("ops", "operator");
    let quiet = |fields: &str| format!("{{\"verbose\":false,\"pedantic\":false,{fields}}}");

    // Admin: everything but enrolment, agents' subjects and publishing events (contract §7).
    let admin = bus_session(
        &server,
        &quiet(&format!("\"auth_token\":\"{}\"", server.admin_key)),
        "SUB jobs.> 1\r\nPUB jobs.x 2\r\nhi\r\nSUB svc.agent.web.cmd 2\r\nPUB svc.agent.web.cmd 2\r\nhi\r\nPUB svc.events.x 1\r\na\r\n",
    );
    assert_eq!(
        admin,
        [
            "MSG jobs.x 1 2",
            "hi",
            "-ERR 'Permissions Violation for Subscription to \"svc.agent.web.cmd\"'",
            "-ERR 'Permissions Violation for Publish to \"svc.agent.web.cmd\"'",
            "-ERR 'Permissions Violation for Publish to \"svc.events.x\"'",
            "PONG"
        ]
    );

    // Readonly: subscribe to events only, publish nothing.
    let ro = bus_session(
        &server,
        &quiet(&format!("\"auth_token\":\"{readonly}\"")),
        "SUB svc.events.> 1\r\nSUB other 2\r\nPUB svc.events.x 1\r\na\r\n",
    );
    assert_eq!(
        ro,
        [
            "-ERR 'Permissions Violation for Subscription to \"other\"'",
            "-ERR 'Permissions Violation for Publish to \"svc.events.x\"'",
            "PONG"
        ]
    );

    // Operator, with user = key id and pass = key: everything but enrolment and agents' subjects.
    let op = bus_session(
        &server,
        &quiet(&format!(
            "\"user\":\"{operator_id}\",\"pass\":\"{operator}\""
        )),
        "SUB jobs.> 1\r\nSUB svc.agent.web.cmd 2\r\nPUB svc.enroll 1\r\nx\r\n",
    );
    assert_eq!(
        op,
        [
            "-ERR 'Permissions Violation for Subscription to \"svc.agent.web.cmd\"'",
            "-ERR 'Permissions Violation for Publish to \"svc.enroll\"'",
            "PONG"
        ]
    );

    // Wrong or deleted keys are refused.
    let unknown = format!("svc_{}", "q".repeat(40));
    let refused = bus_session(
        &server,
        &quiet(&format!("\"auth_token\":\"{unknown}\"")),
        "",
    );
    assert_eq!(refused, ["-ERR 'Authorization Violation'"]);
    let mismatched = bus_session(
        &server,
        &quiet(&format!("\"user\":\"someone\",\"pass\":\"{operator}\"")),
        "",
    );
    assert_eq!(mismatched, ["-ERR 'Authorization Violation'"]);
}

#[test]
fn anonymous_clients_may_only_enrol() {
    let server = TestServer::start();
    let lines = bus_session(
        &server,
        "{\"verbose\":false,\"pedantic\":false}",
        "SUB _INBOX.> 1\r\nSUB _INBOX.abcdefghijklmnopqrst.* 2\r\nPUB svc.enroll 2\r\nhi\r\nPUB svc.events.x 1\r\na\r\n",
    );
    assert_eq!(
        lines,
        [
            "-ERR 'Permissions Violation for Subscription to \"_INBOX.>\"'",
            "-ERR 'Permissions Violation for Publish to \"svc.events.x\"'",
            "PONG"
        ]
    );
}

#[tokio::test]
async fn events_fan_out_live_to_stock_clients() {
    let server = TestServer::start();
    let (_, readonly) = server.create_key("watcher", "readonly");
    let client = async_nats::ConnectOptions::with_token(readonly)
        .connect(server.bus.as_str())
        .await
        .unwrap();
    let mut events = client.subscribe("svc.events.>").await.unwrap();
    client.flush().await.unwrap();
    let (id, _) = tokio::task::spawn_blocking({
        let http = server.http;
        let key = server.admin_key.clone();
        move || {
            let response = common::http_request(
                http,
                "POST",
                "/api/v1/apikeys",
                &[("Authorization", &format!("Bearer {key}"))],
                Some(br#"{"name":"live","role":"readonly"}"#),
            )
            .unwrap();
            let json = response.json();
            (json["id"].as_str().unwrap().to_string(), ())
        }
    })
    .await
    .unwrap();
    let message = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(message.subject.as_str(), "svc.events.apikey_created");
    let event: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
    assert_eq!(event["payload"]["id"], id.as_str());
    assert!(
        event["seq"].as_u64().unwrap() > 0,
        "live events carry their stream sequence"
    );
}

#[test]
fn health_and_metrics_cover_the_bus_and_the_streams() {
    let server = TestServer::start();
    let ready = server.request("GET", "/health/ready", None, None).json();
    assert_eq!(ready["components"]["bus"]["status"], "ok", "{ready}");
    assert_eq!(
        ready["components"]["stream_store"]["status"], "ok",
        "{ready}"
    );
    let _open = TcpStream::connect(bus_socket(&server.bus)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let metrics = server.request("GET", "/metrics", None, None).body;
    for expected in [
        "svc_health_ready{component=\"bus\"} 1",
        "svc_health_ready{component=\"stream_store\"} 1",
        "svc_bus_messages_total{direction=\"in\"}",
        "svc_bus_bytes_total{direction=\"out\"}",
        "svc_bus_slow_consumers_total 0",
        "svc_events_total{type=\"server_started\"} 1",
    ] {
        assert!(metrics.contains(expected), "missing {expected}:\n{metrics}");
    }
    let connections: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("svc_bus_connections "))
        .unwrap()
        .parse()
        .unwrap();
    // Ours; the server's own connection is not a client (nor in /varz).
    assert!(connections >= 1.0, "{connections}");
}

#[tokio::test]
async fn external_mode_uses_an_existing_nats_server() {
    let Some(nats) = common::start_nats_server() else {
        return;
    };
    let server = TestServer::start_with(Options {
        env: vec![("SVC_BUS__EXTERNAL_URLS".into(), nats.url.clone())],
        ..Options::default()
    });
    assert_eq!(server.bus, nats.url);
    let ready = server.request("GET", "/health/ready", None, None).json();
    assert_eq!(ready["components"]["bus"]["status"], "ok", "{ready}");
    // No embedded broker: nothing listens on the configured bus port, and there are no
    // embedded broker metrics.
    let metrics = server.request("GET", "/metrics", None, None).body;
    assert!(!metrics.contains("svc_bus_connections"), "{metrics}");

    let client = async_nats::connect(nats.url.as_str()).await.unwrap();
    let mut events = client.subscribe("svc.events.apikey_created").await.unwrap();
    client.flush().await.unwrap();
    let http = server.http;
    let key = server.admin_key.clone();
    tokio::task::spawn_blocking(move || {
        let auth = format!("Bearer {key}");
        common::http_request(
            http,
            "POST",
            "/api/v1/apikeys",
            &[("Authorization", &auth)],
            Some(br#"{"name":"ext","role":"readonly"}"#),
        )
        .unwrap()
    })
    .await
    .unwrap();
    let message = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .unwrap()
        .unwrap();
    let event: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
    assert_eq!(event["payload"]["name"], "ext");
}

#[tokio::test]
async fn losing_the_external_cluster_degrades_readiness_and_emits_bus_events() {
    let Some(nats) = common::start_nats_server() else {
        return;
    };
    let port = nats.url.rsplit(':').next().unwrap().to_string();
    let server = TestServer::start_with(Options {
        env: vec![("SVC_BUS__EXTERNAL_URLS".into(), nats.url.clone())],
        ..Options::default()
    });
    drop(nats);
    let wait_for = |status: u16| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let ready = server.request("GET", "/health/ready", None, None);
            if ready.status == status {
                return ready.json();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "readiness never became {status}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let degraded = wait_for(503);
    assert_eq!(
        degraded["components"]["bus"]["status"], "unavailable",
        "{degraded}"
    );
    assert!(degraded["components"]["bus"]["detail"]
        .as_str()
        .unwrap()
        .contains("external cluster"));

    // The cluster comes back on the same port; the server reconnects by itself.
    let _back = std::process::Command::new(
        ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap(),
    )
    .args(["-a", "127.0.0.1", "-p", &port])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let _kill_on_exit = KillOnDrop(_back);
    wait_for(200);
    let key = server.admin_key.clone();
    let events = common::run(server.cli("svc-events").args([
        "--api-key",
        &key,
        "-o",
        "json",
        "list",
        "--category",
        "bus",
    ]));
    let list: serde_json::Value = serde_json::from_str(&events.stdout).unwrap();
    let types: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["bus_degraded", "bus_healthy"], "{list}");
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr2_lame_duck_moves_clients_to_another_server() {
    // Both servers accept the same admin key, so one client may use either.
    let key = format!("svc_{}", "l".repeat(40));
    let options = || Options {
        env: vec![("SVC_BOOTSTRAP_API_KEY".into(), key.clone())],
        config_yaml: "bus:\n  lame_duck_duration: 3s\n  lame_duck_grace_period: 1s\n".into(),
        ..Options::default()
    };
    let mut first = TestServer::start_with(options());
    let second = TestServer::start_with(options());
    let (events_sender, mut events) = tokio::sync::mpsc::unbounded_channel();
    let client = async_nats::ConnectOptions::with_token(key.clone())
        .retain_servers_order()
        .event_callback(move |event| {
            let sender = events_sender.clone();
            async move {
                let _ = sender.send(event);
            }
        })
        .connect(vec![first.bus.clone(), second.bus.clone()])
        .await
        .unwrap();
    let first_port = bus_socket(&first.bus).port();
    let second_port = bus_socket(&second.bus).port();
    assert_eq!(client.server_info().port, first_port);

    unsafe {
        libc::kill(first.pid() as i32, libc::SIGUSR2);
    }
    let saw_lame_duck = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(event) = events.recv().await {
            if matches!(event, async_nats::Event::LameDuckMode) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        saw_lame_duck,
        Ok(true),
        "no lame-duck INFO:\n{}",
        first.log()
    );
    // No new bus connections on the first server (its accept loop drops the listener when it
    // sees the stop, which may come a moment after the INFO on a loaded machine)...
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        while TcpStream::connect(bus_socket(&first.bus)).is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        refused.is_ok(),
        "the first server still accepts bus connections"
    );
    // ...and the client moves to the second once the first closes it.
    tokio::time::timeout(Duration::from_secs(15), async {
        while client.server_info().port != second_port
            || client.connection_state() != async_nats::connection::State::Connected
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("reconnected to the second server");
    let mut subscription = client.subscribe("after.ldm").await.unwrap();
    client.publish("after.ldm", "moved".into()).await.unwrap();
    let message = tokio::time::timeout(Duration::from_secs(5), subscription.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&message.payload[..], b"moved");

    // REST keeps serving on the first server until SIGTERM, which then stops it cleanly.
    assert_eq!(first.request("GET", "/health/live", None, None).status, 200);
    assert_eq!(first.stop_with(libc::SIGTERM), Some(0), "{}", first.log());
    assert!(first.log().contains("lame duck"), "{}", first.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bus_monitoring_with_admin_keys_and_lame_duck_health() {
    let server = tokio::task::spawn_blocking(|| {
        TestServer::start_with(Options {
            config_yaml: "bus:\n  monitor_auth: true\n  lame_duck_duration: 2s\n  lame_duck_grace_period: 500ms\n".into(),
            ..Options::default()
        })
    })
    .await
    .unwrap();
    let monitor = server
        .bus_monitor
        .expect("bus_monitor in listen-addrs.json");
    let (viewer_id, viewer) = server.create_key("viewer", "readonly");
    let client = async_nats::ConnectOptions::with_token(viewer.clone())
        .name("watcher")
        .connect(server.bus.as_str())
        .await
        .unwrap();
    client.flush().await.unwrap();
    let get = |path: &'static str, key: Option<String>| {
        tokio::task::spawn_blocking(move || {
            let header = key.map(|key| format!("Bearer {key}"));
            let headers: Vec<(&str, &str)> = header
                .iter()
                .map(|h| ("Authorization", h.as_str()))
                .collect();
            common::http_request(monitor, "GET", path, &headers, None).unwrap()
        })
    };
    assert_eq!(get("/varz", None).await.unwrap().status, 401);
    assert_eq!(
        get("/varz", Some(viewer.clone())).await.unwrap().status,
        403
    );
    let admin = Some(server.admin_key.clone());
    let connz = get("/connz?auth=1", admin.clone()).await.unwrap();
    assert_eq!(connz.status, 200, "{}", connz.body);
    let watcher = connz.json()["connections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|connection| connection["name"] == "watcher")
        .cloned()
        .unwrap_or_else(|| panic!("{}", connz.body));
    // The key's id names the connection; the key itself never appears.
    assert_eq!(watcher["authorized_user"], viewer_id.as_str());
    assert!(!connz.body.contains(&viewer) && !connz.body.contains(&server.admin_key));
    assert_eq!(get("/healthz", admin.clone()).await.unwrap().status, 200);

    unsafe {
        libc::kill(server.pid() as i32, libc::SIGUSR2);
    }
    let mut health = get("/healthz", admin.clone()).await.unwrap();
    for _ in 0..100 {
        if health.status == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        health = get("/healthz", admin.clone()).await.unwrap();
    }
    assert_eq!(health.status, 503, "{}", health.body);
    assert_eq!(health.json()["status"], "error");
}

/// `/connz` and `/varz` count clients only, as nats-server's do (nats.py's own suite checks
/// both): the server's own bus connection is not listed, and neither its publishes nor what
/// is delivered to it are messages in or out. What it answers a client is delivered to that
/// client, so that counts out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bus_monitoring_counts_clients_only() {
    let server = tokio::task::spawn_blocking(TestServer::start)
        .await
        .unwrap();
    let monitor = server.bus_monitor.expect("bus_monitor");
    let get = move |path: &'static str| {
        tokio::task::spawn_blocking(move || {
            let response = common::http_request(monitor, "GET", path, &[], None).unwrap();
            assert_eq!(response.status, 200, "{}", response.body);
            response.json()
        })
    };
    let connz = get("/connz").await.unwrap();
    assert_eq!(connz["num_connections"], 0, "{connz}");
    assert_eq!(connz["connections"], serde_json::json!([]), "{connz}");
    let varz = get("/varz").await.unwrap();
    for counter in [
        "connections",
        "total_connections",
        "in_msgs",
        "in_bytes",
        "out_msgs",
    ] {
        assert_eq!(varz[counter], 0, "{counter}: {varz}");
    }

    // nats.py's test_publish: 100 one-byte messages, nobody listening.
    let client = async_nats::ConnectOptions::with_token(server.admin_key.clone())
        .connect(server.bus.as_str())
        .await
        .unwrap();
    for i in 0..100 {
        client
            .publish(format!("hello.{i}"), "A".into())
            .await
            .unwrap();
    }
    client.flush().await.unwrap();
    let connz = get("/connz").await.unwrap();
    assert_eq!(connz["num_connections"], 1, "{connz}");
    let varz = get("/varz").await.unwrap();
    assert_eq!(varz["in_msgs"], 100, "{varz}");
    assert_eq!(varz["in_bytes"], 100, "{varz}");
    assert_eq!(varz["out_msgs"], 0, "{varz}");
    assert_eq!(varz["connections"], 1, "{varz}");

    // A request the server's own connection answers: the request is in (delivered to the
    // server, not out), the answer is out (to the client).
    let answer = client
        .request("svc.files.default.limits", "{}".into())
        .await
        .unwrap();
    assert!(answer.payload.starts_with(b"{"), "{answer:?}");
    client.flush().await.unwrap();
    let varz = get("/varz").await.unwrap();
    assert_eq!(varz["in_msgs"], 101, "{varz}");
    assert_eq!(varz["in_bytes"], 102, "{varz}");
    assert_eq!(varz["out_msgs"], 1, "{varz}");
    assert!(varz["out_bytes"].as_u64().unwrap() > 0, "{varz}");

    // nats.py's test_subscribe: once the client has gone, /connz is empty.
    drop(client);
    let mut connz = get("/connz").await.unwrap();
    for _ in 0..100 {
        if connz["num_connections"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        connz = get("/connz").await.unwrap();
    }
    assert_eq!(connz["connections"], serde_json::json!([]), "{connz}");
    let varz = get("/varz").await.unwrap();
    assert_eq!(varz["connections"], 0, "{varz}");
    assert_eq!(varz["total_connections"], 1, "{varz}");
}

/// `bus.max_payload: 0` is the default 1 MiB, as nats-server reads 0 (not a broker that
/// takes nothing).
#[tokio::test]
async fn a_zero_max_payload_is_the_default() {
    let server = tokio::task::spawn_blocking(|| {
        TestServer::start_with(Options {
            config_yaml: "bus:\n  max_payload: 0\n".into(),
            ..Options::default()
        })
    })
    .await
    .unwrap();
    let client = async_nats::ConnectOptions::with_token(server.admin_key.clone())
        .connect(server.bus.as_str())
        .await
        .unwrap();
    assert_eq!(client.server_info().max_payload, 1024 * 1024);
    client.publish("hello", "A".into()).await.unwrap();
    client.flush().await.unwrap();
}

/// The monitoring port is opt-in, as nats-server's `-m` is: a server whose configuration names
/// only the contract's three listeners starts while something else holds 8222, and serves
/// monitoring once `listen.bus_monitor` is set.
#[test]
fn bus_monitoring_is_off_unless_configured() {
    // Another process's port in the real world; this test's socket here. When something
    // already holds it, it is held all the same.
    let _holder = match std::net::TcpListener::bind("127.0.0.1:8222") {
        Ok(listener) => Some(listener),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => None,
        Err(e) => panic!("127.0.0.1:8222: {e}"),
    };
    let mut server = TestServer::start_with(Options {
        contract_listeners_only: true,
        ..Options::default()
    });
    assert_eq!(server.bus_monitor, None, "{}", server.log());
    assert!(
        !server.log().contains("bus monitoring listening"),
        "{}",
        server.log()
    );
    assert_eq!(
        server.request("GET", "/health/ready", None, None).status,
        200
    );

    assert_eq!(server.stop_with(libc::SIGTERM), Some(0), "{}", server.log());
    server.spawn(&[("SVC_LISTEN__BUS_MONITOR".into(), "127.0.0.1:0".into())]);
    let monitor = server.bus_monitor.expect("bus_monitor once configured");
    let varz = common::http_request(monitor, "GET", "/varz", &[], None).unwrap();
    assert_eq!(varz.status, 200, "{}", varz.body);
    assert_eq!(varz.json()["http_port"], monitor.port());
}

/// The server's resident set size, from /proc/<pid>/status, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// Issue 23 (hostile clients): connections that subscribe to `>` and never read, while one
/// client publishes a burst. `bus.max_pending_total` bounds all their buffers together: they
/// are cut off as slow consumers, a normal subscriber gets every message, the server's RSS
/// stays bounded during the burst, and comes back near its pre-burst figure afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumers_share_one_pending_budget_and_memory_comes_back() {
    const SLOW: usize = 200;
    const MESSAGES: usize = 50_000;
    const BUDGET: u64 = 16 * 1024 * 1024;
    let server = tokio::task::spawn_blocking(|| {
        TestServer::start_with(Options {
            config_yaml: format!("bus:\n  max_pending_total: {BUDGET}\n"),
            ..Options::default()
        })
    })
    .await
    .unwrap();
    let pid = server.pid();
    let monitor = server.bus_monitor.expect("bus_monitor");
    let varz = move || {
        let response = common::http_request(monitor, "GET", "/varz", &[], None).unwrap();
        assert_eq!(response.status, 200, "{}", response.body);
        response.json()
    };

    let subscriber = async_nats::ConnectOptions::with_token(server.admin_key.clone())
        .connect(server.bus.as_str())
        .await
        .unwrap();
    let mut subscription = subscriber.subscribe("burst.x").await.unwrap();
    subscriber.flush().await.unwrap();

    // The hostile ones: `SUB > 1`, one PONG read to know the SUB is in, then never a read
    // again; a 4 KiB receive buffer so the kernel does not soak up the burst for them.
    let address = bus_socket(&server.bus);
    let admin_key = server.admin_key.clone();
    let slow = tokio::task::spawn_blocking(move || {
        (0..SLOW)
            .map(|_| stalled_subscriber(address, &admin_key, ">"))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let baseline = rss_bytes(pid);

    // Sample RSS through the burst.
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_bytes(pid));
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        })
    };
    let started = std::time::Instant::now();
    let publisher = async_nats::ConnectOptions::with_token(server.admin_key.clone())
        .connect(server.bus.as_str())
        .await
        .unwrap();
    let payload = bytes::Bytes::from(vec![b'x'; 64]);
    let publish = tokio::spawn(async move {
        for _ in 0..MESSAGES {
            publisher.publish("burst.x", payload.clone()).await.unwrap();
        }
        publisher.flush().await.unwrap();
        // Kept until the subscriber has everything: closing with the broker still reading
        // could reset the connection and lose what it had not read yet.
        publisher
    });
    let mut received = 0;
    while received < MESSAGES {
        match tokio::time::timeout(Duration::from_secs(20), subscription.next()).await {
            Ok(Some(message)) => {
                assert_eq!(message.payload.len(), 64);
                received += 1;
            }
            _ => break,
        }
    }
    let publisher = publish.await.unwrap();
    let burst = started.elapsed();
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.join().unwrap();
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    eprintln!(
        "{SLOW} slow consumers, {MESSAGES} × 64 B in {burst:?}: RSS baseline {:.1} MiB, peak {:.1} MiB",
        mib(baseline),
        mib(peak)
    );
    assert_eq!(
        received,
        MESSAGES,
        "the normal subscriber lost messages; /varz: {}\n{}",
        tokio::task::spawn_blocking(varz).await.unwrap(),
        server.log()
    );

    // Every hostile connection was cut off as a slow consumer.
    let varz = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            let varz = varz();
            if varz["slow_consumers"].as_u64().unwrap_or(0) >= SLOW as u64
                || std::time::Instant::now() > deadline
            {
                return varz;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .unwrap();
    assert!(
        varz["slow_consumers"].as_u64().unwrap() >= SLOW as u64,
        "slow consumers: {}",
        varz["slow_consumers"]
    );
    // The budget holds the buffers to 16 MiB; the rest is the writers' batches, the
    // allocator's slack and the publisher's read buffers.
    let bound = baseline + 3 * BUDGET;
    assert!(
        peak < bound,
        "RSS peak {:.1} MiB over {:.1} MiB (baseline {:.1} MiB)",
        mib(peak),
        mib(bound),
        mib(baseline)
    );

    // The memory is given back: within 2× of the baseline in at most 60 s.
    let returned = std::time::Instant::now();
    let mut now = rss_bytes(pid);
    while now > 2 * baseline && returned.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        now = rss_bytes(pid);
    }
    eprintln!(
        "RSS {:.1} MiB {:?} after the burst",
        mib(now),
        returned.elapsed()
    );
    assert!(
        now <= 2 * baseline,
        "RSS {:.1} MiB after 60 s, baseline {:.1} MiB, peak {:.1} MiB",
        mib(now),
        mib(baseline),
        mib(peak)
    );
    drop((slow, publisher));
}

fn metric(server: &TestServer, name: &str) -> f64 {
    let metrics = server.request("GET", "/metrics", None, None).body;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{metrics}"))
}

/// A raw client with `key` that subscribes to `subject` and then never reads again (a 4 KiB
/// receive buffer, so the kernel does not soak up what is sent to it).
fn stalled_subscriber(address: std::net::SocketAddr, key: &str, subject: &str) -> TcpStream {
    let stream = TcpStream::connect(address).unwrap();
    let size: libc::c_int = 4096;
    unsafe {
        use std::os::fd::AsRawFd;
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &size as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut info = String::new();
    reader.read_line(&mut info).unwrap();
    let mut writer = stream.try_clone().unwrap();
    write!(
        writer,
        "CONNECT {{\"verbose\":false,\"auth_token\":\"{key}\"}}\r\nSUB {subject} 1\r\nPING\r\n"
    )
    .unwrap();
    assert_eq!(common::lines_until_pong(&mut reader), ["PONG"]);
    stream
}

/// Issue 37 item 5: one credential's connections share a publish rate (past it they are slowed,
/// nothing is lost, another key is not slowed) and a pending-bytes budget (past it its own
/// slowest reader is cut, while another key's stalled reader of the same messages is not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_has_its_own_publish_rate_and_pending_budget() {
    const RATE: u64 = 400;
    const BURST: u64 = 100;
    const EACH: u64 = 250;
    let server = tokio::task::spawn_blocking(|| {
        TestServer::start_with(Options {
            config_yaml: format!(
                "bus:\n  publish_rate_per_key: {RATE}\n  publish_burst_per_key: {BURST}\n  \
                 max_pending_per_key: 1048576\n"
            ),
            ..Options::default()
        })
    })
    .await
    .unwrap();
    let ((rated_id, slow_key), (_, fast_key)) = (
        server.create_key("rated", "operator"),
        server.create_key("other", "operator"),
    );
    let bus_url = server.bus.clone();
    let connect = |key: String| {
        let url = bus_url.clone();
        async move {
            async_nats::ConnectOptions::with_token(key)
                .connect(url.as_str())
                .await
                .unwrap()
        }
    };
    let reader = connect(server.admin_key.clone()).await;
    let mut received = reader.subscribe("rated.>").await.unwrap();
    reader.flush().await.unwrap();

    // Two connections of one key publish 2 × 250 = 500 messages: 100 at once, the other 400
    // at 400/s, so they arrive over about a second however the two split it. Meanwhile
    // another key publishes 250, unslowed. (A client's flush returns once its socket took the
    // bytes, so the time is taken where the messages arrive.)
    let publish = |client: async_nats::Client, subject: &'static str| async move {
        for i in 0..EACH {
            client
                .publish(subject, i.to_string().into_bytes().into())
                .await
                .unwrap();
        }
        client.flush().await.unwrap();
        client
    };
    let (first, second, other) = (
        connect(slow_key.clone()).await,
        connect(slow_key.clone()).await,
        connect(fast_key).await,
    );
    let started = std::time::Instant::now();
    let publishers = tokio::spawn(async move {
        tokio::join!(
            publish(first, "rated.a"),
            publish(second, "rated.b"),
            publish(other, "rated.c")
        )
    });
    let mut seen = std::collections::BTreeMap::<String, (u64, Duration)>::new();
    while seen.values().map(|(count, _)| count).sum::<u64>() < 3 * EACH {
        let message = tokio::time::timeout(Duration::from_secs(10), received.next())
            .await
            .expect("every message arrives: a rate slows, it never drops")
            .unwrap();
        let entry = seen.entry(message.subject.to_string()).or_default();
        *entry = (entry.0 + 1, started.elapsed());
    }
    let _publishers = publishers.await.unwrap();
    let counts: Vec<u64> = seen.values().map(|(count, _)| *count).collect();
    assert_eq!(counts, [EACH; 3], "{seen:?}");
    let rated_took = seen["rated.a"].1.max(seen["rated.b"].1);
    let unslowed = seen["rated.c"].1;
    let minimum = Duration::from_millis((2 * EACH - BURST) * 1000 / RATE);
    eprintln!("500 messages of the rated key in {rated_took:?} (the rate allows {minimum:?}); 250 of another key in {unslowed:?}");
    assert!(
        rated_took >= minimum.mul_f64(0.9),
        "500 messages of one key took {rated_took:?}, under the rate's {minimum:?}"
    );
    assert!(
        unslowed < minimum / 2,
        "another key's 250 messages took {unslowed:?}: it was slowed too"
    );
    let server = std::sync::Arc::new(server);
    let throttled = {
        let server = server.clone();
        tokio::task::spawn_blocking(move || metric(&server, "svc_bus_publish_throttled_total"))
            .await
            .unwrap()
    };
    assert!(
        throttled >= 1.0,
        "svc_bus_publish_throttled_total {throttled}"
    );

    // Pending bytes: the rated key has a stalled reader and a reading one on `flood.x`.
    // 12.5 MiB published over about a second (by the admin key) pass its 1 MiB budget long
    // before the 64 MiB each connection may hold: the stalled reader is cut once its socket
    // has been full for 100 ms, the reading one gets every message.
    let stalled = {
        let (address, key) = (bus_socket(&server.bus), slow_key.clone());
        tokio::task::spawn_blocking(move || stalled_subscriber(address, &key, "flood.x"))
            .await
            .unwrap()
    };
    let same_key = connect(slow_key.clone()).await;
    let mut flood_received = same_key.subscribe("flood.x").await.unwrap();
    same_key.flush().await.unwrap();
    let flood = connect(server.admin_key.clone()).await;
    let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
    let flooding = tokio::spawn(async move {
        for _ in 0..200 {
            flood.publish("flood.x", chunk.clone()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        flood.flush().await.unwrap();
        flood
    });
    for i in 0..200 {
        tokio::time::timeout(Duration::from_secs(10), flood_received.next())
            .await
            .unwrap_or_else(|_| panic!("the reading connection got {i} of 200"))
            .unwrap();
    }
    let _flood = flooding.await.unwrap();
    // The stalled one is gone (its socket still holds what the kernel took before the cut,
    // which a 4 KiB window would take long to read, so the server is asked instead); the
    // other three connections of the key are not.
    let monitor = server.bus_monitor.expect("bus_monitor");
    let rated_connections = tokio::task::spawn_blocking(move || {
        let connz = common::http_request(monitor, "GET", "/connz?auth=1", &[], None).unwrap();
        assert_eq!(connz.status, 200, "{}", connz.body);
        connz.json()["connections"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|connection| connection["authorized_user"] == rated_id.as_str())
            .count()
    })
    .await
    .unwrap();
    assert_eq!(
        rated_connections, 3,
        "the stalled reader past its key's budget was not cut (or another was)"
    );
    drop(stalled);
    let slow = tokio::task::spawn_blocking(move || metric(&server, "svc_bus_slow_consumers_total"))
        .await
        .unwrap();
    assert!(slow >= 1.0, "svc_bus_slow_consumers_total {slow}");
}
