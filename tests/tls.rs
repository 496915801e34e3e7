//! TLS for REST and gRPC (`tls: {cert, key}`): the real server with a certificate from a test
//! CA, reached through the real CLIs over https://, and the configurations it refuses.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use common::pki::Pki;
use common::{run, Names, Options, TestServer};

fn start_tls_server(pki: &Pki) -> TestServer {
    TestServer::start_with(Options {
        config_yaml: pki.config_yaml("server.pem", "server.key"),
        ca_file: Some(pki.path("ca.pem")),
        ..Options::default()
    })
}

/// Whether the server has closed `socket` (EOF or reset) rather than still waiting on it.
fn is_closed(socket: &mut TcpStream) -> bool {
    socket.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    match socket.read(&mut byte) {
        Ok(count) => count == 0,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

#[test]
fn clis_reach_rest_and_grpc_over_https_with_the_ca_file() {
    let pki = Pki::new();
    let server = start_tls_server(&pki);
    assert!(server.http_url().starts_with("https://"));
    let ca = pki.path("ca.pem");

    let created = run(server.cli("svcctl").arg("--ca-file").arg(&ca).args([
        "--api-key",
        &server.admin_key,
        "apikey",
        "create",
        "--name",
        "over-tls",
        "--role",
        "operator",
    ]));
    assert_eq!(created.code, 0, "{created:?}");
    assert!(created.stdout.contains("svc_"), "{created:?}");
    let listed = run(server.cli("svcctl").env("SVC_CA_FILE", &ca).args([
        "--api-key",
        &server.admin_key,
        "apikey",
        "list",
    ]));
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(listed.stdout.contains("over-tls"), "{listed:?}");

    // gRPC: the audit row the REST call wrote, read back over https:// with SVC_CA_FILE.
    let log = run(server.cli("svc-audit").env("SVC_CA_FILE", &ca).args([
        "--api-key",
        &server.admin_key,
        "log",
        "--action",
        "apikey.*",
        "-o",
        "json",
    ]));
    assert_eq!(log.code, 0, "{log:?}");
    let page: serde_json::Value = serde_json::from_str(&log.stdout).unwrap();
    assert_eq!(page["items"][0]["action"], "apikey.create", "{log:?}");
    assert_eq!(page["items"][0]["detail"]["name"], "over-tls", "{log:?}");
    // svcctl runs built-in modes in-process: --ca-file travels with the common flags.
    let events = run(server.cli("svcctl").arg("--ca-file").arg(&ca).args([
        "--api-key",
        &server.admin_key,
        "events",
        "list",
    ]));
    assert_eq!(events.code, 0, "{events:?}");
    assert!(events.stdout.contains("server_started"), "{events:?}");
}

#[test]
fn an_untrusted_certificate_is_unreachable_and_points_at_ca_file() {
    let pki = Pki::new();
    let server = start_tls_server(&pki);
    let rest = run(server
        .cli("svcctl")
        .args(["--api-key", &server.admin_key, "apikey", "list"]));
    let grpc = run(server
        .cli("svc-events")
        .args(["--api-key", &server.admin_key, "list"]));
    for result in [&rest, &grpc] {
        assert_eq!(result.code, 3, "{result:?}");
        assert!(
            result
                .stderr
                .contains("cannot reach the server at https://"),
            "{result:?}"
        );
        assert!(result.stderr.contains("not trusted"), "{result:?}");
        assert!(result.stderr.contains("--ca-file"), "{result:?}");
    }

    // A CA file that is not a certificate is the caller's mistake: usage, naming the file.
    let not_a_ca = pki.path("server.key");
    let bad = run(server.cli("svcctl").arg("--ca-file").arg(&not_a_ca).args([
        "--api-key",
        &server.admin_key,
        "apikey",
        "list",
    ]));
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(
        bad.stderr
            .contains(&format!("--ca-file: {}", not_a_ca.display())),
        "{bad:?}"
    );
}

#[test]
fn plaintext_gets_no_answer_from_tls_listeners() {
    let pki = Pki::new();
    let server = start_tls_server(&pki);
    // Plain HTTP to the TLS REST port: no HTTP response, let alone an API answer.
    let plain = common::http_request(server.http, "GET", "/health/ready", &[], None);
    assert!(plain.is_err(), "{plain:?}");
    // Plain gRPC (h2c) to the TLS gRPC port: no answer either, and the CLI says so (the
    // server's hang-up raises SIGPIPE in the CLI, which must not kill it silently).
    let grpc = run(server
        .cli("svc-events")
        .env("SVC_SERVER", server.grpc.to_string())
        .args(["--api-key", &server.admin_key, "list"]));
    assert_eq!(grpc.code, 3, "{grpc:?}");
    assert!(grpc.stdout.is_empty(), "{grpc:?}");
    assert!(grpc.stderr.contains("https://"), "{grpc:?}");
    // And the TLS path still works afterwards.
    assert_eq!(
        server.request("GET", "/health/ready", None, None).status,
        200
    );
}

#[test]
fn a_silent_client_does_not_block_others() {
    let pki = Pki::new();
    let server = start_tls_server(&pki);
    let ca = pki.path("ca.pem");
    // Connected, never sending a byte: its handshake waits in its own task.
    let mut silent_rest = TcpStream::connect(server.http).unwrap();
    let mut silent_grpc = TcpStream::connect(server.grpc).unwrap();
    std::thread::sleep(Duration::from_millis(100));

    let rest = run(server.cli("svcctl").env("SVC_CA_FILE", &ca).args([
        "--api-key",
        &server.admin_key,
        "apikey",
        "list",
    ]));
    assert_eq!(rest.code, 0, "{rest:?}");
    assert!(rest.stdout.contains("bootstrap-admin"), "{rest:?}");
    let grpc = run(server.cli("svc-events").env("SVC_CA_FILE", &ca).args([
        "--api-key",
        &server.admin_key,
        "list",
    ]));
    assert_eq!(grpc.code, 0, "{grpc:?}");
    assert!(grpc.stdout.contains("server_started"), "{grpc:?}");
    // Both were served while the silent connections were still pending (the handshake
    // timeout had not closed them): the accept loops never waited on them.
    assert!(!is_closed(&mut silent_rest));
    assert!(!is_closed(&mut silent_grpc));
}

#[test]
fn bad_tls_settings_are_refused_at_start_and_by_check_config() {
    let pki = Pki::new();
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let missing = pki.path("missing.pem").display().to_string();
    let other_key = pki.path("other.key").display().to_string();
    let cases: [(&str, &str, &[&str]); 4] = [
        (
            "missing.pem",
            "server.key",
            &["tls.cert: cannot read", &missing],
        ),
        (
            "server.pem",
            "other.key",
            &["tls.key:", &other_key, "does not match"],
        ),
        ("server.pem", "", &["tls.key is missing"]),
        ("", "server.key", &["tls.cert is missing"]),
    ];
    for (cert, key, expected) in cases {
        let file = dir.path().join("server.yaml");
        std::fs::write(
            &file,
            format!(
                "data_dir: {}\nlisten: {{ http: 127.0.0.1:0, grpc: 127.0.0.1:0, bus: 127.0.0.1:0, bus_monitor: 127.0.0.1:0 }}\nhmacsecret: abc\nmaster_key: {}\n{}",
                dir.path().join("data").display(),
                common::random_master_key(),
                pki.config_yaml(cert, key)
            ),
        )
        .unwrap();
        let checked = run(names
            .command("svc-server")
            .arg("--config")
            .arg(&file)
            .arg("--check-config"));
        let started = run(names.command("svc-server").arg("--config").arg(&file));
        for result in [&checked, &started] {
            assert_eq!(result.code, 1, "{cert}/{key}: {result:?}");
            for part in expected {
                assert!(result.stderr.contains(part), "{part}: {result:?}");
            }
        }
        assert!(!Path::new(&dir.path().join("data/listen-addrs.json")).exists());
    }
}
