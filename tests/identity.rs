//! Identity end to end: the CA through svc-identity (info, rotate-signing, export, encrypt,
//! status), join tokens and PSKs through real `svc-agent bootstrap` processes on the bus, the
//! audit rows and events they leave, and enrolled agents authenticating on the bus with their
//! certificates (own subjects only; cut off by a signing-CA rotation).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use common::{agent_session, run, Run, TestServer};

use common::{identity_json as identity, json_of as json};

fn create_token(server: &TestServer, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["token", "create"];
    args.extend_from_slice(extra);
    let created = identity(server, &server.admin_key, &args);
    assert_eq!(created.code, 0, "{created:?}");
    json(&created)
}

/// An agent's config file and state dir in a temp dir; the config starts with a key that
/// bootstrap must keep.
struct AgentHome {
    dir: tempfile::TempDir,
}

impl AgentHome {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "agent:\n  heartbeat_interval: 7s\n  state_dir: {}\n",
            dir.path().join("state").display()
        );
        std::fs::write(dir.path().join("agent.yaml"), config).unwrap();
        AgentHome { dir }
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("agent.yaml")
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn bootstrap(&self, server: &TestServer, agent_id: &str, credential: &[&str]) -> Run {
        run(server
            .names
            .command("svc-agent")
            .arg("--config")
            .arg(self.config())
            .args([
                "bootstrap",
                "--non-interactive",
                "--server",
                &server.bus,
                "--agent-id",
                agent_id,
                "--labels",
                "role=web,env=test",
            ])
            .args(credential))
    }
}

fn spiffe_uris(cert_pem: &str) -> Vec<String> {
    use x509_parser::prelude::*;
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).unwrap();
    let cert = pem.parse_x509().unwrap();
    let names = cert.subject_alternative_name().unwrap().unwrap();
    names
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(uri.to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn ca_info_rotation_export_encrypt_status_and_roles() {
    let server = TestServer::start();
    let (_, readonly) = server.create_key("viewer", "readonly");
    let (_, operator) = server.create_key("ops", "operator");

    let info = identity(&server, &readonly, &["ca", "info"]);
    assert_eq!(info.code, 0, "{info:?}");
    let before = json(&info);
    for ca in ["root_ca", "signing_ca"] {
        let fingerprint = before[ca]["fingerprint"].as_str().unwrap();
        assert_eq!(fingerprint.len(), 64, "{before}");
        assert!(fingerprint.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(before[ca]["not_after"].as_str().unwrap().ends_with('Z'));
        assert!(before[ca]["not_before"].is_string());
        assert!(before[ca]["subject"].as_str().unwrap().contains("svc"));
    }

    // Roles: readonly may not create tokens; operator may create but not revoke or rotate.
    let refused = identity(&server, &readonly, &["token", "create"]);
    assert_eq!(refused.code, 4, "{refused:?}");
    assert!(refused.stderr.starts_with("svc-identity: "), "{refused:?}");
    let created = identity(&server, &operator, &["token", "create"]);
    assert_eq!(created.code, 0, "{created:?}");
    let token_id = json(&created)["id"].as_str().unwrap().to_string();
    assert_eq!(
        identity(&server, &operator, &["token", "revoke", &token_id]).code,
        4
    );
    assert_eq!(
        identity(&server, &operator, &["ca", "rotate-signing"]).code,
        4
    );
    assert_eq!(identity(&server, &readonly, &["psk", "web-01"]).code, 4);
    assert_eq!(
        identity(&server, &server.admin_key, &["token", "revoke", "nope"]).code,
        5
    );

    let rotated = identity(&server, &server.admin_key, &["ca", "rotate-signing"]);
    assert_eq!(rotated.code, 0, "{rotated:?}");
    let after = json(&identity(&server, &readonly, &["ca", "info"]));
    assert_eq!(after["root_ca"], before["root_ca"]);
    assert_ne!(
        after["signing_ca"]["fingerprint"],
        before["signing_ca"]["fingerprint"]
    );
    let events = json(&run(server.cli("svc-events").args([
        "--api-key",
        &readonly,
        "-o",
        "json",
        "list",
        "--type",
        "ca_signing_rotated",
    ])));
    assert_eq!(events["items"].as_array().unwrap().len(), 1, "{events}");

    // Export: the public chain, signing CA then root, then the command key's certificate,
    // and no key.
    let export =
        run(server
            .cli("svc-identity")
            .args(["--api-key", &server.admin_key, "ca", "export"]));
    assert_eq!(export.code, 0, "{export:?}");
    assert_eq!(export.stdout.matches("BEGIN CERTIFICATE").count(), 3);
    assert!(!export.stdout.contains("PRIVATE KEY"));

    // Encrypt: a self-describing document that does not show the keys in clear.
    let home = tempfile::tempdir().unwrap();
    let passphrase = home.path().join("passphrase");
    std::fs::write(&passphrase, "correct horse battery staple\n").unwrap();
    let backup = home.path().join("ca.json");
    let encrypted = run(server.cli("svc-identity").args([
        "--api-key",
        &server.admin_key,
        "ca",
        "encrypt",
        "--passphrase-file",
        passphrase.to_str().unwrap(),
        "--output-file",
        backup.to_str().unwrap(),
    ]));
    assert_eq!(encrypted.code, 0, "{encrypted:?}");
    common::assert_private(&backup);
    let document: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&backup).unwrap()).unwrap();
    assert_eq!(document["format"], "svc-ca-backup/v1");
    assert_eq!(document["kdf"]["name"], "pbkdf2-hmac-sha256");
    assert!(!document.to_string().contains("PRIVATE KEY"));
    std::fs::write(&passphrase, "short\n").unwrap();
    let weak = run(server.cli("svc-identity").args([
        "--api-key",
        &server.admin_key,
        "ca",
        "encrypt",
        "--passphrase-file",
        passphrase.to_str().unwrap(),
    ]));
    assert_eq!(weak.code, 1, "{weak:?}");

    let status = json(&identity(&server, &readonly, &["status"]));
    assert_eq!(status["provider"], "embedded");
    assert_eq!(status["health"], "ok", "{status}");
    assert_eq!(status["tokens"]["unused"], 1, "{status}");
    assert_eq!(
        status["ca_not_after"], after["signing_ca"]["not_after"],
        "{status}"
    );

    // Audit rows for the refused and the successful operations.
    let audit = json(&run(server.cli("svc-audit").args([
        "--api-key",
        &server.admin_key,
        "-o",
        "json",
        "log",
        "--action",
        "*",
        "--limit",
        "100",
    ])));
    let rows = audit["items"].as_array().unwrap();
    let has = |action: &str, outcome: &str| {
        rows.iter()
            .any(|row| row["action"] == action && row["outcome"] == outcome)
    };
    for (action, outcome) in [
        ("token.create", "denied"),
        ("token.create", "success"),
        ("token.revoke", "denied"),
        ("ca.rotate_signing", "denied"),
        ("ca.rotate_signing", "success"),
        ("ca.export", "success"),
        ("ca.encrypt", "success"),
    ] {
        assert!(has(action, outcome), "{action} {outcome}: {audit}");
    }
}

#[test]
fn enrolment_with_join_tokens_and_psks() {
    let server = TestServer::start();
    let token = create_token(&server, &["--ttl", "1h"]);
    let cleartext = token["token"].as_str().unwrap();
    assert!(cleartext.starts_with("svcjt_"), "{token}");

    let home = AgentHome::new();
    let enrolled = home.bootstrap(&server, "web-01", &["--token", cleartext]);
    assert_eq!(enrolled.code, 0, "{enrolled:?}\n{}", server.log());
    let key = home.state().join("key.pem");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let cert = std::fs::read_to_string(home.state().join("cert.pem")).unwrap();
    assert_eq!(spiffe_uris(&cert), ["spiffe://svc/agent/web-01"]);
    let chain = std::fs::read_to_string(home.state().join("ca.pem")).unwrap();
    assert_eq!(chain.matches("BEGIN CERTIFICATE").count(), 2);
    let config: serde_json::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(home.config()).unwrap()).unwrap();
    assert_eq!(config["agent"]["id"], "web-01");
    assert_eq!(
        config["agent"]["heartbeat_interval"], "7s",
        "kept: {config}"
    );
    assert_eq!(config["agent"]["labels"]["role"], "web");
    assert_eq!(config["nats"]["urls"][0], server.bus.as_str());

    // One-shot: the same token is refused, clearly.
    let again = AgentHome::new().bootstrap(&server, "web-01", &["--token", cleartext]);
    assert_eq!(again.code, 4, "{again:?}");
    assert!(
        again.stderr.contains("join token already used"),
        "{again:?}"
    );

    // Revoked, expired, bound to another agent, unknown.
    let revoked = create_token(&server, &[]);
    let revoke = identity(
        &server,
        &server.admin_key,
        &["token", "revoke", revoked["id"].as_str().unwrap()],
    );
    assert_eq!(revoke.code, 0, "{revoke:?}");
    assert_eq!(json(&revoke)["state"], "revoked");
    let expired = create_token(&server, &["--ttl", "1s"]);
    let bound = create_token(&server, &["--agent-id", "db-01"]);
    std::thread::sleep(Duration::from_millis(1200));
    for (credential, message) in [
        (&revoked, "join token revoked"),
        (&expired, "join token expired"),
        (&bound, "join token is bound to agent id 'db-01'"),
    ] {
        let refused = AgentHome::new().bootstrap(
            &server,
            "web-02",
            &["--token", credential["token"].as_str().unwrap()],
        );
        assert_eq!(refused.code, 4, "{refused:?}");
        assert!(refused.stderr.contains(message), "{message}: {refused:?}");
    }
    let unknown = AgentHome::new().bootstrap(&server, "web-02", &["--token", "svcjt_nope"]);
    assert!(unknown.stderr.contains("unknown join token"), "{unknown:?}");

    // PSK: the right one works, a wrong one is refused.
    let psk = identity(&server, &server.admin_key, &["psk", "web-03"]);
    assert_eq!(psk.code, 0, "{psk:?}");
    let psk = json(&psk)["psk"].as_str().unwrap().to_string();
    assert_eq!(psk.len(), 64);
    let psk_home = AgentHome::new();
    let with_psk = psk_home.bootstrap(&server, "web-03", &["--psk", &psk]);
    assert_eq!(with_psk.code, 0, "{with_psk:?}");
    let cert = std::fs::read_to_string(psk_home.state().join("cert.pem")).unwrap();
    assert_eq!(spiffe_uris(&cert), ["spiffe://svc/agent/web-03"]);
    let wrong = AgentHome::new().bootstrap(&server, "web-04", &["--psk", &psk]);
    assert_eq!(wrong.code, 4, "{wrong:?}");
    assert!(wrong.stderr.contains("invalid PSK"), "{wrong:?}");

    // Token states and filters.
    let listed = json(&identity(&server, &server.admin_key, &["token", "list"]));
    let states: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["used", "revoked", "expired", "unused"], "{listed}");
    assert!(
        !listed.to_string().contains("svcjt_"),
        "no cleartext: {listed}"
    );
    let unused = json(&identity(
        &server,
        &server.admin_key,
        &["token", "list", "--unused", "--unexpired"],
    ));
    assert_eq!(unused.as_array().unwrap().len(), 1, "{unused}");
    let cleaned = json(&identity(&server, &server.admin_key, &["token", "cleanup"]));
    assert_eq!(cleaned["removed"], 2, "{cleaned}");

    // Audit rows and events.
    let rows = common::audit_rows(&server, &["--action", "agent.enroll", "--limit", "100"]);
    let count = |outcome: &str| rows.iter().filter(|r| r["outcome"] == outcome).count();
    assert_eq!((count("success"), count("denied")), (2, 6), "{rows:?}");
    assert!(rows
        .iter()
        .any(|r| r["user"] == "web-01" && r["resource_id"] == "web-01"));
    let events = json(&run(server.cli("svc-events").args([
        "--api-key",
        &server.admin_key,
        "-o",
        "json",
        "list",
        "--type",
        "agent_enrolled",
    ])));
    let sources: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["source"].as_str().unwrap())
        .collect();
    assert_eq!(sources, ["web-01", "web-03"], "{events}");
}

#[test]
fn enrolled_agents_use_their_own_subjects_until_the_signing_ca_rotates() {
    let server = TestServer::start();
    let web1 = AgentHome::new();
    let web2 = AgentHome::new();
    for (home, id) in [(&web1, "web-01"), (&web2, "web-02")] {
        let token = create_token(&server, &[]);
        let enrolled = home.bootstrap(&server, id, &["--token", token["token"].as_str().unwrap()]);
        assert_eq!(enrolled.code, 0, "{enrolled:?}");
    }

    let own = agent_session(
        &server,
        &web1.state(),
        "SUB svc.agent.web-01.cmd 1\r\nPUB svc.agent.web-01.cmd 2\r\nhi\r\n\
         SUB _INBOX.abcdefghijklmnopqrstuv.* 2\r\n",
    );
    assert!(
        own.iter()
            .any(|l| l.starts_with("MSG svc.agent.web-01.cmd 1 2")),
        "{own:?}"
    );
    assert_eq!(own.last().unwrap(), "PONG", "{own:?}");
    assert!(!own.iter().any(|l| l.starts_with("-ERR")), "{own:?}");

    let other = agent_session(
        &server,
        &web1.state(),
        "SUB svc.agent.web-02.cmd 1\r\nPUB svc.agent.web-02.heartbeat 1\r\nx\r\n\
         SUB _INBOX.> 2\r\nPUB svc.enroll 1\r\nx\r\nPUB _INBOX.abcdefghijklmnopqrstuv.1 1\r\nx\r\n",
    );
    assert_eq!(
        other,
        [
            "-ERR 'Permissions Violation for Subscription to \"svc.agent.web-02.cmd\"'",
            "-ERR 'Permissions Violation for Publish to \"svc.agent.web-02.heartbeat\"'",
            "-ERR 'Permissions Violation for Subscription to \"_INBOX.>\"'",
            "-ERR 'Permissions Violation for Publish to \"svc.enroll\"'",
            "-ERR 'Permissions Violation for Publish to \"_INBOX.abcdefghijklmnopqrstuv.1\"'",
            "PONG",
        ]
    );

    // The stock client's auth callback works too.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let connect = |state: PathBuf| {
        let url = server.bus.clone();
        runtime.block_on(async move {
            svc::agent::connect_options(&state)
                .unwrap()
                .connect(url)
                .await
                .map(|client| client.server_info().nonce.is_empty())
        })
    };
    assert!(connect(web2.state()).is_ok());

    // A certificate signed for another agent's key does not pass (signature check), and a
    // signing-CA rotation cuts every current identity off.
    let forged = tempfile::tempdir().unwrap();
    std::fs::copy(
        web1.state().join("cert.pem"),
        forged.path().join("cert.pem"),
    )
    .unwrap();
    std::fs::copy(web2.state().join("key.pem"), forged.path().join("key.pem")).unwrap();
    assert_eq!(
        agent_session(&server, forged.path(), ""),
        ["-ERR 'Authorization Violation'"]
    );
    let rotated = identity(&server, &server.admin_key, &["ca", "rotate-signing"]);
    assert_eq!(rotated.code, 0, "{rotated:?}");
    assert_eq!(
        agent_session(&server, &web1.state(), ""),
        ["-ERR 'Authorization Violation'"]
    );
    assert!(connect(web2.state()).is_err());

    // Bootstrapping again with a new token restores access.
    let token = create_token(&server, &[]);
    let again = web1.bootstrap(
        &server,
        "web-01",
        &["--token", token["token"].as_str().unwrap()],
    );
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(
        agent_session(&server, &web1.state(), "").last().unwrap(),
        "PONG"
    );
}

#[test]
fn a_new_hmacsecret_invalidates_every_psk() {
    let mut server = TestServer::start();
    let psk_of = |server: &TestServer, id: &str| {
        let psk = identity(server, &server.admin_key, &["psk", id]);
        assert_eq!(psk.code, 0, "{psk:?}");
        json(&psk)["psk"].as_str().unwrap().to_string()
    };
    let old = psk_of(&server, "web-01");
    let enrolled = AgentHome::new().bootstrap(&server, "web-01", &["--psk", &old]);
    assert_eq!(enrolled.code, 0, "{enrolled:?}");

    // The operator edits hmacsecret (here through its environment override) and restarts.
    assert_eq!(server.stop_with(libc::SIGTERM), Some(0));
    server.spawn(&[("SVC_HMACSECRET".into(), "a-new-secret".into())]);
    let refused = AgentHome::new().bootstrap(&server, "web-01", &["--psk", &old]);
    assert_eq!(refused.code, 4, "{refused:?}");
    assert!(refused.stderr.contains("invalid PSK"), "{refused:?}");
    let new = psk_of(&server, "web-01");
    assert_ne!(new, old);
    let again = AgentHome::new().bootstrap(&server, "web-01", &["--psk", &new]);
    assert_eq!(again.code, 0, "{again:?}");
}
