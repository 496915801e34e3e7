//! TLS on the embedded bus (`bus.tls: {cert, key}`): the real server with a certificate from a
//! test CA; its own bus client over TLS (readiness), a plain client refused, API keys over
//! tls:// with async-nats, a real agent enrolled and commanded over TLS, agents logging in by
//! mutual TLS (own subjects only, foreign certificates refused, cut off by a signing-CA
//! rotation), bootstrap without the CA, and the configurations the server refuses.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::pki::Pki;
use common::{bus_socket, run, Names, Options, TestServer};
use futures_util::StreamExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

fn start_bus_tls_server(pki: &Pki) -> TestServer {
    TestServer::start_with(Options {
        config_yaml: pki.bus_config_yaml("server.pem", "server.key"),
        ..Options::default()
    })
}

/// An async-nats client over tls:// with `key`, trusting the test CA (the stock way: a root
/// certificate file, as any NATS client takes it).
async fn tls_client(server: &TestServer, pki: &Pki, key: &str) -> async_nats::Client {
    async_nats::ConnectOptions::with_token(key.to_string())
        .add_root_certificates(pki.path("ca.pem"))
        .require_tls(true)
        .connect(server.bus.as_str())
        .await
        .expect("TLS client connects")
}

/// The next message on `subscription` within 5 s.
async fn next_message(subscription: &mut async_nats::Subscriber) -> async_nats::Message {
    tokio::time::timeout(Duration::from_secs(5), subscription.next())
        .await
        .expect("a message within 5 s")
        .expect("subscription open")
}

#[test]
fn the_server_is_ready_over_a_tls_bus() {
    let pki = Pki::new();
    let server = start_bus_tls_server(&pki);
    assert!(server.bus.starts_with("tls://127.0.0.1:"), "{}", server.bus);
    // TestServer waited for readiness; the bus component is the server's own client, which
    // can only be connected over TLS now.
    let ready = server.request("GET", "/health/ready", None, None);
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(ready.json()["components"]["bus"]["status"], "ok");
}

#[tokio::test]
async fn a_plain_client_is_refused_and_nothing_it_sends_is_routed() {
    let pki = Pki::new();
    let server = start_bus_tls_server(&pki);
    let admin = tls_client(&server, &pki, &server.admin_key).await;
    let mut watched = admin.subscribe("plain.>").await.unwrap();
    admin.flush().await.unwrap();

    let plain = std::thread::spawn({
        let address = bus_socket(&server.bus);
        let key = server.admin_key.clone();
        move || {
            let stream = TcpStream::connect(address).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut info = String::new();
            reader.read_line(&mut info).unwrap();
            let info: serde_json::Value =
                serde_json::from_str(info.trim_start_matches("INFO ")).unwrap();
            // The API key in clear, then traffic: the broker expects a TLS handshake instead.
            let connect = serde_json::json!({"verbose": false, "auth_token": key});
            let mut writer = stream;
            let _ = write!(
                writer,
                "CONNECT {connect}\r\nSUB plain.> 1\r\nPUB plain.leak 5\r\nhello\r\nPING\r\n"
            );
            // The broker closes the socket (within its 2 s handshake limit); until then
            // nothing it sends may be NATS protocol.
            let mut rest = Vec::new();
            let closed = reader.read_to_end(&mut rest);
            (info, closed.map(|_| rest))
        }
    });
    let (info, closed) = tokio::task::spawn_blocking(move || plain.join().unwrap())
        .await
        .unwrap();
    assert_eq!(info["tls_required"], true, "{info}");
    // Closed either way: a FIN, or a reset when the broker closes with the client's clear
    // text still unread in its socket buffer (the kernel then answers with RST).
    let rest = match closed {
        Ok(rest) => rest,
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => Vec::new(),
        Err(error) => panic!("the broker closes a client that does not start TLS: {error}"),
    };
    let text = String::from_utf8_lossy(&rest);
    for word in ["PONG", "MSG", "+OK", "-ERR"] {
        assert!(!text.contains(word), "{word} in {text:?}");
    }

    // Nothing was routed: the first message the TLS subscriber sees is the marker sent now.
    admin.publish("plain.marker", "m".into()).await.unwrap();
    let first = next_message(&mut watched).await;
    assert_eq!(first.subject.as_str(), "plain.marker");
}

#[tokio::test]
async fn api_keys_work_over_tls_with_their_roles() {
    let pki = Pki::new();
    let server = start_bus_tls_server(&pki);
    let (_, operator_key) = server.create_key("ops", "operator");
    let (_, readonly_key) = server.create_key("viewer", "readonly");

    // Operator: publish and subscribe on its own subjects.
    let operator = tls_client(&server, &pki, &operator_key).await;
    let mut jobs = operator.subscribe("jobs.>").await.unwrap();
    operator.flush().await.unwrap();
    operator.publish("jobs.one", "1".into()).await.unwrap();
    let message = next_message(&mut jobs).await;
    assert_eq!(message.subject.as_str(), "jobs.one");
    assert_eq!(&message.payload[..], b"1");

    // Readonly: live events arrive; its publish is refused and reaches no one.
    let (errors_sender, mut errors) = tokio::sync::mpsc::unbounded_channel();
    let readonly = async_nats::ConnectOptions::with_token(readonly_key)
        .add_root_certificates(pki.path("ca.pem"))
        .event_callback(move |event| {
            let sender = errors_sender.clone();
            async move {
                if let async_nats::Event::ServerError(error) = event {
                    let _ = sender.send(error.to_string());
                }
            }
        })
        .connect(server.bus.as_str())
        .await
        .unwrap();
    let mut events = readonly.subscribe("svc.events.>").await.unwrap();
    readonly.flush().await.unwrap();
    let emitted = run(server.cli("svc-events").args([
        "--api-key",
        &server.admin_key,
        "emit",
        "--type",
        "state_drift_detected",
        "--source",
        "web-01",
        "--payload",
        "{}",
    ]));
    assert_eq!(emitted.code, 0, "{emitted:?}");
    let event = next_message(&mut events).await;
    assert_eq!(event.subject.as_str(), "svc.events.state_drift_detected");

    readonly
        .publish("jobs.from-readonly", "x".into())
        .await
        .unwrap();
    readonly.flush().await.unwrap();
    let refusal = tokio::time::timeout(Duration::from_secs(5), errors.recv())
        .await
        .expect("a refusal within 5 s")
        .unwrap();
    assert!(
        refusal.to_lowercase().contains("permissions violation"),
        "{refusal}"
    );
    operator.publish("jobs.marker", "m".into()).await.unwrap();
    assert_eq!(
        next_message(&mut jobs).await.subject.as_str(),
        "jobs.marker"
    );

    // A wrong key is refused over TLS as in clear.
    let wrong = async_nats::ConnectOptions::with_token("svc_not-a-key".into())
        .add_root_certificates(pki.path("ca.pem"))
        .connect(server.bus.as_str())
        .await;
    assert!(wrong.is_err());
}

fn agent_state(server: &TestServer, id: &str) -> Option<String> {
    let listed = run(server.cli("svcctl").args([
        "--api-key",
        &server.admin_key,
        "-o",
        "json",
        "agent",
        "list",
    ]));
    assert_eq!(listed.code, 0, "{listed:?}");
    let agents: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    agents
        .as_array()
        .unwrap()
        .iter()
        .find(|agent| agent["id"] == id)
        .map(|agent| agent["state"].as_str().unwrap().to_string())
}

#[test]
fn an_agent_enrols_connects_and_runs_commands_over_tls() {
    let pki = Pki::new();
    // Debug for the bus authenticator: its log says how each agent logged in.
    let server = TestServer::start_with(Options {
        config_yaml: pki.bus_config_yaml("server.pem", "server.key"),
        env: vec![("SVC_LOG".into(), "info,svc::server::bus=debug".into())],
        ..Options::default()
    });
    let mut agent = Agent::new("tls-01");
    let ca = pki.path("ca.pem");
    let enrolled = agent.bootstrap(
        &server,
        &["--server", &server.bus, "--ca-file", ca.to_str().unwrap()],
    );
    assert_eq!(enrolled.code, 0, "{enrolled:?}");
    // The daemon is told to trust the same CA.
    let config: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(agent.config()).unwrap()).unwrap();
    assert_eq!(config["nats"]["ca_file"].as_str(), ca.to_str());
    assert_eq!(
        config["nats"]["urls"][0].as_str(),
        Some(server.bus.as_str())
    );

    agent.spawn(&server.names);
    let deadline = Instant::now() + Duration::from_secs(15);
    while agent_state(&server, "tls-01").as_deref() != Some("connected") {
        assert!(
            Instant::now() < deadline,
            "tls-01 not connected in time\n--- agent\n{}\n--- server\n{}",
            agent.log(),
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let exec = run(server.cli("svcctl").args([
        "--api-key",
        &server.admin_key,
        "-o",
        "json",
        "exec",
        "--target",
        "tls-01",
        "--",
        "true",
    ]));
    assert_eq!(exec.code, 0, "{exec:?}\n--- agent\n{}", agent.log());
    let result: serde_json::Value = exec
        .stdout
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .find(|line| line["agent_id"] == "tls-01")
        .unwrap_or_else(|| panic!("no result from tls-01: {exec:?}"));
    assert_eq!(result["status"], "ok", "{result}");
    assert_eq!(result["exit_code"], 0, "{result}");
    // The daemon presented its certificate: the broker took it from the TLS session.
    let log = server.log();
    assert!(
        log.lines()
            .any(|line| line.contains("agent logged in on the bus")
                && line.contains("tls-01")
                && line.contains("\"mutual TLS\"")),
        "{log}"
    );

    // The daemon without the CA (the system's store only) stops at once and says why.
    let without_ca = std::fs::read_to_string(agent.config())
        .unwrap()
        .lines()
        .filter(|line| !line.contains("ca_file"))
        .collect::<Vec<_>>()
        .join("\n");
    let other_config = agent.home.path().join("no-ca.yaml");
    std::fs::write(&other_config, without_ca).unwrap();
    let refused = run(server
        .names
        .command("svc-agent")
        .arg("--config")
        .arg(&other_config));
    assert_eq!(refused.code, 3, "{refused:?}");
    assert!(refused.stderr.contains("not trusted"), "{refused:?}");
    assert!(refused.stderr.contains("--ca-file"), "{refused:?}");
}

/// A client certificate chain (leaf first) and its key.
type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// What a raw mutual-TLS session saw: INFO (in clear, before the handshake), the protocol
/// lines after CONNECT up to PONG, and how it ended when it ended before PONG.
struct Session {
    info: serde_json::Value,
    lines: Vec<String>,
    closed: Option<std::io::Error>,
}

impl Session {
    /// Ended without a PONG and not by the 5 s read timeout: the broker closed the socket
    /// (a TLS alert, a FIN, or a reset: all mean closed).
    fn assert_refused(&self, what: &str) {
        assert!(
            !self.lines.iter().any(|line| line == "PONG"),
            "{what}: {:?}",
            self.lines
        );
        if let Some(error) = &self.closed {
            assert!(
                !matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "{what}: not closed within 5 s: {error}"
            );
        }
    }
}

/// A raw NATS session over TLS (rustls, trusting the test CA) that presents `identity` as its
/// client certificate when the broker asks, and sends CONNECT with no credentials at all
/// (no jwt, sig, token or user), then `ops` and PING.
fn mtls_session(server: &TestServer, pki: &Pki, identity: Option<Identity>, ops: &str) -> Session {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(pki.path("ca.pem")).unwrap() {
        roots.add(certificate.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match identity {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key).unwrap(),
        None => builder.with_no_client_auth(),
    };
    let address = bus_socket(&server.bus);
    let tcp = TcpStream::connect(address).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // INFO comes in clear; the broker sends nothing more until the client's TLS hello.
    let mut info = String::new();
    BufReader::new(tcp.try_clone().unwrap())
        .read_line(&mut info)
        .unwrap();
    let info: serde_json::Value = serde_json::from_str(info.trim_start_matches("INFO ")).unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(address.ip().into());
    let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    let mut session = Session {
        info,
        lines: Vec::new(),
        closed: None,
    };
    let connect = serde_json::json!({"verbose": false, "pedantic": false, "name": "mtls-test"});
    if let Err(error) = write!(tls, "CONNECT {connect}\r\n{ops}PING\r\n").and_then(|_| tls.flush())
    {
        session.closed = Some(error);
        return session;
    }
    let mut reader = BufReader::new(tls);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => {
                session.closed = Some(std::io::ErrorKind::UnexpectedEof.into());
                break;
            }
            Ok(_) => {
                let line = line.trim_end().to_string();
                let done = line == "PONG";
                session.lines.push(line);
                if done {
                    break;
                }
            }
            Err(error) => {
                session.closed = Some(error);
                break;
            }
        }
    }
    session
}

/// `svc-agent bootstrap` over tls:// trusting the test CA.
fn enrol_over_tls(server: &TestServer, pki: &Pki, agent: &Agent) {
    let ca = pki.path("ca.pem");
    let enrolled = agent.bootstrap(
        server,
        &["--server", &server.bus, "--ca-file", ca.to_str().unwrap()],
    );
    assert_eq!(enrolled.code, 0, "{enrolled:?}");
}

/// What the agent daemon presents as its TLS client certificate (cert.pem + ca.pem, key.pem).
fn agent_identity(agent: &Agent) -> Identity {
    svc::agent::tls_client_certificate(&agent.home.path().join("state"))
        .expect("an enrolled agent has a TLS client certificate")
}

#[test]
fn agents_log_in_by_mutual_tls_until_the_signing_ca_rotates() {
    let pki = Pki::new();
    let server = start_bus_tls_server(&pki);
    let (one, two) = (Agent::new("mtls-01"), Agent::new("mtls-02"));
    enrol_over_tls(&server, &pki, &one);
    enrol_over_tls(&server, &pki, &two);

    // The certificate alone is the login: CONNECT carries no credential. Own subjects work.
    let own = mtls_session(
        &server,
        &pki,
        Some(agent_identity(&one)),
        "SUB svc.agent.mtls-01.cmd 1\r\nPUB svc.agent.mtls-01.cmd 2\r\nhi\r\n",
    );
    // Client certificates are asked for, not required: INFO does not announce tls_verify.
    assert_eq!(own.info["tls_required"], true, "{}", own.info);
    assert_ne!(own.info["tls_verify"], true, "{}", own.info);
    assert!(
        own.lines
            .iter()
            .any(|line| line.starts_with("MSG svc.agent.mtls-01.cmd 1 2")),
        "{:?} {:?}\n{}",
        own.lines,
        own.closed,
        server.log()
    );
    assert_eq!(own.lines.last().map(String::as_str), Some("PONG"));
    assert!(!own.lines.iter().any(|line| line.starts_with("-ERR")));

    // Another agent's subjects are refused.
    let other = mtls_session(
        &server,
        &pki,
        Some(agent_identity(&one)),
        "SUB svc.agent.mtls-02.cmd 1\r\nPUB svc.agent.mtls-02.heartbeat 1\r\nx\r\n",
    );
    assert_eq!(
        other.lines,
        [
            "-ERR 'Permissions Violation for Subscription to \"svc.agent.mtls-02.cmd\"'",
            "-ERR 'Permissions Violation for Publish to \"svc.agent.mtls-02.heartbeat\"'",
            "PONG",
        ]
    );

    // Without a certificate the same CONNECT is anonymous: enrolment rights only.
    let anonymous = mtls_session(&server, &pki, None, "SUB svc.agent.mtls-01.cmd 1\r\n");
    assert_eq!(
        anonymous.lines,
        [
            "-ERR 'Permissions Violation for Subscription to \"svc.agent.mtls-01.cmd\"'",
            "PONG",
        ]
    );

    // A certificate naming the agent but issued by another CA (here the one that issued the
    // bus's own certificate) is refused, and so is the agent's leaf without the signing CA
    // that links it to the embedded root.
    let foreign = mtls_session(
        &server,
        &pki,
        Some(pki.client("spiffe://svc/agent/mtls-01")),
        "SUB svc.agent.mtls-01.cmd 1\r\n",
    );
    foreign.assert_refused("a certificate from another CA");
    let (chain, key) = agent_identity(&one);
    let leaf_only = mtls_session(
        &server,
        &pki,
        Some((chain[..1].to_vec(), key)),
        "SUB svc.agent.mtls-01.cmd 1\r\n",
    );
    leaf_only.assert_refused("the leaf without its signing CA");

    // A signing-CA rotation cuts the old certificate off, over mutual TLS too: the chain
    // still reaches the root, but it is no longer the current signing CA's.
    let rotated = run(server.cli("svc-identity").args([
        "--api-key",
        &server.admin_key,
        "ca",
        "rotate-signing",
    ]));
    assert_eq!(rotated.code, 0, "{rotated:?}");
    let cut_off = mtls_session(
        &server,
        &pki,
        Some(agent_identity(&one)),
        "SUB svc.agent.mtls-01.cmd 1\r\n",
    );
    assert_eq!(cut_off.lines, ["-ERR 'Authorization Violation'"]);
    cut_off.assert_refused("a certificate from the rotated-out signing CA");

    // Enrolling again gives a certificate (and ca.pem) that works.
    enrol_over_tls(&server, &pki, &one);
    let again = mtls_session(
        &server,
        &pki,
        Some(agent_identity(&one)),
        "SUB svc.agent.mtls-01.cmd 1\r\n",
    );
    assert_eq!(again.lines, ["PONG"], "{:?}", again.closed);
}

#[test]
fn bootstrap_without_the_ca_file_fails_and_names_it() {
    let pki = Pki::new();
    let server = start_bus_tls_server(&pki);
    let plain_url = server.bus.replacen("tls://", "nats://", 1);
    // tls:// asks for TLS; with nats:// the server's INFO does. Either way the certificate is
    // checked against the system's store, which does not hold the test CA.
    for url in [server.bus.as_str(), plain_url.as_str()] {
        let agent = Agent::new("no-ca");
        let refused = agent.bootstrap(&server, &["--server", url]);
        assert_eq!(refused.code, 3, "{url}: {refused:?}");
        assert!(refused.stderr.contains("not trusted"), "{url}: {refused:?}");
        assert!(refused.stderr.contains("--ca-file"), "{url}: {refused:?}");
        assert!(!agent.home.path().join("state/cert.pem").exists());
    }
    // A CA file that holds no certificate is a usage error naming the flag.
    let agent = Agent::new("bad-ca");
    let key = pki.path("server.key");
    let bad = agent.bootstrap(
        &server,
        &["--server", &server.bus, "--ca-file", key.to_str().unwrap()],
    );
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(bad.stderr.contains("--ca-file"), "{bad:?}");
}

#[test]
fn bad_bus_tls_settings_are_refused_at_start_and_by_check_config() {
    let pki = Pki::new();
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let missing = pki.path("missing.pem").display().to_string();
    let other_key = pki.path("other.key").display().to_string();
    let pair = pki.pair("server.pem", "server.key");
    let cert_only = pki.path("server.pem").display().to_string();
    // (server.yaml lines, environment, what the error says)
    type Case<'a> = (String, Vec<(&'a str, &'a str)>, Vec<&'a str>);
    let cases: [Case; 6] = [
        (
            pki.bus_config_yaml("server.pem", ""),
            vec![],
            vec!["bus.tls.key is missing"],
        ),
        (
            pki.bus_config_yaml("", "server.key"),
            vec![],
            vec!["bus.tls.cert is missing"],
        ),
        (
            pki.bus_config_yaml("missing.pem", "server.key"),
            vec![],
            vec!["bus.tls.cert: cannot read", &missing],
        ),
        (
            pki.bus_config_yaml("server.pem", "other.key"),
            vec![],
            vec!["bus.tls.key:", &other_key, "does not match"],
        ),
        (
            String::new(),
            vec![("SVC_BUS__TLS__CERT", cert_only.as_str())],
            vec!["bus.tls.key is missing"],
        ),
        (
            format!("bus:\n  external_urls: [nats://127.0.0.1:1]\n  tls: {pair}\n"),
            vec![],
            vec!["bus.tls", "bus.external_urls"],
        ),
    ];
    for (yaml, env, expected) in cases {
        let file = dir.path().join("server.yaml");
        std::fs::write(
            &file,
            format!(
                "data_dir: {}\nlisten: {{ http: 127.0.0.1:0, grpc: 127.0.0.1:0, bus: 127.0.0.1:0, bus_monitor: 127.0.0.1:0 }}\nhmacsecret: abc\nmaster_key: {}\n{yaml}",
                dir.path().join("data").display(),
                common::random_master_key(),
            ),
        )
        .unwrap();
        let command = |check: bool| {
            let mut command = names.command("svc-server");
            command.arg("--config").arg(&file);
            if check {
                command.arg("--check-config");
            }
            command.envs(env.iter().copied());
            command
        };
        let checked = run(&mut command(true));
        let started = run(&mut command(false));
        for result in [&checked, &started] {
            assert_eq!(result.code, 1, "{yaml} {env:?}: {result:?}");
            for part in &expected {
                assert!(result.stderr.contains(part), "{part}: {result:?}");
            }
        }
        assert!(!Path::new(&dir.path().join("data/listen-addrs.json")).exists());
    }
}
