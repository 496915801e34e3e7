//! JWT-SVIDs end to end through the real server and CLIs: `svc-identity jwt issue|list|revoke|
//! verify` (offline from `ca export` PEM and from the public JWKS, and online), the public
//! /.well-known documents, revocation, a signing-CA rotation, roles, audit rows without the
//! token, and enrolled agents asking for their own token over the bus.

mod common;

use std::path::Path;
use std::time::Duration;

use common::agent::Agent;
use common::{agent_session, audit_rows, run, Run, TestServer};

use common::{identity_json as identity, json_of as json};

fn issue(server: &TestServer, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["jwt", "issue"];
    all.extend_from_slice(args);
    let issued = identity(server, &server.admin_key, &all);
    assert_eq!(issued.code, 0, "{issued:?}");
    json(&issued)
}

/// `jwt verify` with `extra` flags before the token (`--ca-file` goes with the common flags).
fn verify(server: &TestServer, token: &str, audience: &str, extra: &[&str]) -> Run {
    run(server
        .cli("svc-identity")
        .args(["--api-key", &server.admin_key, "-o", "json"])
        .args(extra)
        .args(["jwt", "verify", token, "--audience", audience]))
}

fn verify_offline(server: &TestServer, token: &str, audience: &str, jwks: &Path) -> Run {
    run(server
        .cli("svc-identity")
        .args(["-o", "json", "jwt", "verify", token, "--audience", audience])
        .arg("--jwks")
        .arg(jwks))
}

fn save_jwks(server: &TestServer, dir: &Path, name: &str) -> std::path::PathBuf {
    let response = server.request("GET", "/.well-known/jwks.json", None, None);
    assert_eq!(response.status, 200, "{}", response.body);
    let path = dir.join(name);
    std::fs::write(&path, &response.body).unwrap();
    path
}

#[test]
fn issue_verify_revoke_and_rotate() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();

    // The JWKS needs no key and holds public material only.
    let jwks = server.request("GET", "/.well-known/jwks.json", None, None);
    assert_eq!(jwks.status, 200, "{}", jwks.body);
    let key = &jwks.json()["keys"][0];
    assert_eq!(
        (
            key["kty"].as_str(),
            key["crv"].as_str(),
            key["alg"].as_str()
        ),
        (Some("EC"), Some("P-256"), Some("ES256"))
    );
    assert!(key.get("d").is_none(), "{key}");
    assert_eq!(key["x5c"].as_array().unwrap().len(), 2, "{key}");
    let info = json(&identity(&server, &server.admin_key, &["ca", "info"]));
    assert_eq!(key["kid"], info["signing_ca"]["fingerprint"]);
    let jwks_file = save_jwks(&server, dir.path(), "jwks.json");

    // Issue: -o json shows the record and the token; plain output is the token alone.
    let issued = issue(&server, &["--audience", "db", "--audience", "vault"]);
    let token = issued["token"].as_str().unwrap().to_string();
    let id = issued["id"].as_str().unwrap().to_string();
    assert_eq!(token.split('.').count(), 3);
    assert!(
        issued["subject"]
            .as_str()
            .unwrap()
            .starts_with("spiffe://svc/apikey/"),
        "{issued}"
    );
    assert_eq!(issued["audience"], serde_json::json!(["db", "vault"]));
    assert!(issued["expires_at"].is_string());
    let plain = run(server.cli("svc-identity").args([
        "--api-key",
        &server.admin_key,
        "jwt",
        "issue",
        "--audience",
        "db",
        "--subject",
        "spiffe://svc/workload/backup",
    ]));
    assert_eq!(plain.code, 0, "{plain:?}");
    assert_eq!(plain.stdout.trim().split('.').count(), 3, "{plain:?}");

    // Offline from `ca export` PEM, offline from the JWKS, and online.
    let export = dir.path().join("ca.pem");
    let exported = run(server
        .cli("svc-identity")
        .args([
            "--api-key",
            &server.admin_key,
            "ca",
            "export",
            "--output-file",
        ])
        .arg(&export));
    assert_eq!(exported.code, 0, "{exported:?}");
    let ca_file = export.to_str().unwrap();
    let from_pem = verify(&server, &token, "db", &["--ca-file", ca_file]);
    assert_eq!(from_pem.code, 0, "{from_pem:?}");
    assert_eq!(json(&from_pem)["claims"]["jti"], id.as_str());
    assert_eq!(json(&from_pem)["claims"]["sub"], issued["subject"]);
    let from_jwks = verify_offline(&server, &token, "vault", &jwks_file);
    assert_eq!(from_jwks.code, 0, "{from_jwks:?}");
    let online = verify(&server, &token, "db", &[]);
    assert_eq!(online.code, 0, "{online:?}");
    assert_eq!(json(&online)["claims"]["jti"], id.as_str());

    // Refusals, each with its reason (exit 1).
    let wrong = verify_offline(&server, &token, "web", &jwks_file);
    assert_eq!(wrong.code, 1, "{wrong:?}");
    assert!(wrong.stderr.contains("wrong audience"), "{wrong:?}");
    assert_eq!(verify(&server, &token, "web", &[]).code, 1);
    // One character inside the signature changes; not the last one, whose low bits must be
    // zero in canonical base64url (changing it can make the token undecodable instead).
    let mut tampered: Vec<char> = token.chars().collect();
    let at = tampered.len() - 10;
    tampered[at] = if tampered[at] == 'A' { 'B' } else { 'A' };
    let tampered: String = tampered.into_iter().collect();
    let bad = verify(&server, &tampered, "db", &["--ca-file", ca_file]);
    assert_eq!(bad.code, 1, "{bad:?}");
    assert!(bad.stderr.contains("bad signature"), "{bad:?}");
    let short = issue(&server, &["--audience", "db", "--ttl", "1s"]);
    std::thread::sleep(Duration::from_millis(2100));
    let expired = verify_offline(&server, short["token"].as_str().unwrap(), "db", &jwks_file);
    assert_eq!(expired.code, 1, "{expired:?}");
    assert!(expired.stderr.contains("expired"), "{expired:?}");
    let expired_online = verify(&server, short["token"].as_str().unwrap(), "db", &[]);
    assert!(
        expired_online.stderr.contains("expired"),
        "{expired_online:?}"
    );

    // Usage errors (exit 2) and bounds.
    let admin = server.admin_key.clone();
    for args in [
        &["jwt", "issue"][..],
        &["jwt", "issue", "--audience", "db", "--ttl", "soon"],
        &["jwt", "verify", "x"],
        &["jwt", "bogus"],
    ] {
        assert_eq!(identity(&server, &admin, args).code, 2, "{args:?}");
    }
    let too_long = identity(
        &server,
        &admin,
        &["jwt", "issue", "--audience", "db", "--ttl", "48h"],
    );
    assert_eq!(too_long.code, 1, "{too_long:?}");
    assert!(too_long.stderr.contains("at most"), "{too_long:?}");
    let foreign = identity(
        &server,
        &admin,
        &[
            "jwt",
            "issue",
            "--audience",
            "db",
            "--subject",
            "spiffe://other/x",
        ],
    );
    assert_eq!(foreign.code, 1, "{foreign:?}");

    // Roles: only admins issue, list and revoke.
    let (_, operator) = server.create_key("ops", "operator");
    let (_, readonly) = server.create_key("ro", "readonly");
    assert_eq!(
        identity(&server, &operator, &["jwt", "issue", "--audience", "db"]).code,
        4
    );
    assert_eq!(identity(&server, &readonly, &["jwt", "list"]).code, 4);
    assert_eq!(
        identity(&server, &operator, &["jwt", "revoke", &id]).code,
        4
    );

    // List, then revoke: the server refuses it at once, the public list carries it, and an
    // offline verifier given that list refuses it too.
    let listed = json(&identity(&server, &admin, &["jwt", "list"]));
    let entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == id.as_str())
        .unwrap_or_else(|| panic!("{listed}"))
        .clone();
    assert_eq!(entry["state"], "active");
    assert!(entry.get("token").is_none(), "{entry}");
    assert!(
        !listed
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["id"] == short["id"]),
        "expired tokens are not listed: {listed}"
    );
    let revoked = identity(&server, &admin, &["jwt", "revoke", &id]);
    assert_eq!(revoked.code, 0, "{revoked:?}");
    assert_eq!(json(&revoked)["state"], "revoked");
    assert_eq!(
        identity(&server, &admin, &["jwt", "revoke", "nope"]).code,
        5
    );
    let refused = verify(&server, &token, "db", &[]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stderr.contains("revoked"), "{refused:?}");
    let list = server.request("GET", "/.well-known/jwt-revocations.json", None, None);
    assert_eq!(list.status, 200, "{}", list.body);
    let revocations = list.json();
    assert_eq!(
        revocations["revoked"][0]["jti"],
        id.as_str(),
        "{revocations}"
    );
    let revocations_file = dir.path().join("revocations.json");
    std::fs::write(&revocations_file, &list.body).unwrap();
    let offline_revoked = run(server
        .cli("svc-identity")
        .args(["jwt", "verify", &token, "--audience", "db", "--jwks"])
        .arg(&jwks_file)
        .arg("--revocations")
        .arg(&revocations_file));
    assert_eq!(offline_revoked.code, 1, "{offline_revoked:?}");
    assert!(
        offline_revoked.stderr.contains("revoked"),
        "{offline_revoked:?}"
    );

    // A signing-CA rotation: the JWKS has the new key only, so earlier tokens fail with an
    // unknown kid (offline and online) while new ones verify.
    let second = issue(&server, &["--audience", "db"]);
    let second_token = second["token"].as_str().unwrap();
    assert_eq!(identity(&server, &admin, &["ca", "rotate-signing"]).code, 0);
    let new_jwks = save_jwks(&server, dir.path(), "jwks-new.json");
    let stale = verify_offline(&server, second_token, "db", &new_jwks);
    assert_eq!(stale.code, 1, "{stale:?}");
    assert!(stale.stderr.contains("unknown kid"), "{stale:?}");
    let stale_online = verify(&server, second_token, "db", &[]);
    assert!(
        stale_online.stderr.contains("unknown kid"),
        "{stale_online:?}"
    );
    let listed = json(&identity(&server, &admin, &["jwt", "list"]));
    let rotated = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == second["id"])
        .unwrap();
    assert_eq!(rotated["state"], "rotated");
    let fresh = issue(&server, &["--audience", "db"]);
    let fresh_ok = verify_offline(&server, fresh["token"].as_str().unwrap(), "db", &new_jwks);
    assert_eq!(fresh_ok.code, 0, "{fresh_ok:?}");

    // Audit: issue (including the refused one) and revoke rows, never the token.
    let rows = audit_rows(&server, &["--action", "jwt.*", "--limit", "100"]);
    let actions: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["action"].as_str().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(actions.contains(&("jwt.issue", "success")), "{actions:?}");
    assert!(actions.contains(&("jwt.issue", "denied")), "{actions:?}");
    assert!(actions.contains(&("jwt.revoke", "success")), "{actions:?}");
    let revoke_row = rows
        .iter()
        .find(|r| r["action"] == "jwt.revoke" && r["outcome"] == "success")
        .unwrap();
    assert_eq!(revoke_row["resource_id"], id.as_str());
    let everything = serde_json::to_string(&rows).unwrap();
    let log = server.log();
    for secret in [
        token.as_str(),
        second_token,
        short["token"].as_str().unwrap(),
    ] {
        let signature = secret.rsplit('.').next().unwrap();
        assert!(!everything.contains(signature), "a token in the audit log");
        assert!(!log.contains(signature), "a token in the server log");
    }
    // Issue and revoke are events too, naming the token's id and never the token.
    let listed = run(server.cli("svc-events").args([
        "--api-key",
        &server.admin_key,
        "-o",
        "json",
        "list",
        "--type",
        "jwt_issued",
        "--type",
        "jwt_revoked",
    ]));
    assert_eq!(listed.code, 0, "{listed:?}");
    let events: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    let items = events["items"].as_array().unwrap();
    assert!(
        items
            .iter()
            .any(|e| e["type"] == "jwt_revoked" && e["payload"]["id"] == id.as_str()),
        "{events}"
    );
    assert!(items.iter().any(|e| e["type"] == "jwt_issued"), "{events}");
    assert!(!listed.stdout.contains(token.rsplit('.').next().unwrap()));
}

#[test]
fn agents_get_their_own_jwt_svid_over_the_bus_only() {
    let server = TestServer::start();
    let web = Agent::new("web-01");
    let db = Agent::new("db-01");
    for agent in [&web, &db] {
        let enrolled = agent.bootstrap(&server, &["--server", &server.bus]);
        assert_eq!(enrolled.code, 0, "{enrolled:?}");
    }
    let agent_jwt = |agent: &Agent, args: &[&str]| {
        run(server
            .names
            .command("svc-agent")
            .arg("--config")
            .arg(agent.config())
            .arg("jwt")
            .args(args))
    };

    let got = agent_jwt(&web, &["--audience", "db", "-o", "json"]);
    assert_eq!(got.code, 0, "{got:?}");
    let got = json(&got);
    assert_eq!(got["subject"], "spiffe://svc/agent/web-01");
    let token = got["token"].as_str().unwrap();
    let checked = verify(&server, token, "db", &[]);
    assert_eq!(checked.code, 0, "{checked:?}");
    assert_eq!(json(&checked)["claims"]["sub"], "spiffe://svc/agent/web-01");
    let plain = agent_jwt(&db, &["--audience", "x", "--ttl", "5m"]);
    assert_eq!(plain.code, 0, "{plain:?}");
    assert_eq!(plain.stdout.trim().split('.').count(), 3);
    assert_eq!(agent_jwt(&web, &[]).code, 2, "no --audience");
    let too_long = agent_jwt(&web, &["--audience", "db", "--ttl", "2d"]);
    assert_eq!(too_long.code, 1, "{too_long:?}");

    // web-01 may neither ask as db-01 nor read db-01's answers.
    let other = agent_session(
        &server,
        &web.home.path().join("state"),
        "SUB svc.agent.db-01.jwt.reply.> 1\r\n\
         PUB svc.agent.db-01.jwt svc.agent.web-01.jwt.reply.abc 2\r\n{}\r\n",
    );
    assert_eq!(
        other,
        [
            "-ERR 'Permissions Violation for Subscription to \"svc.agent.db-01.jwt.reply.>\"'",
            "-ERR 'Permissions Violation for Publish to \"svc.agent.db-01.jwt\"'",
            "PONG",
        ]
    );

    // A quarantined agent is refused (exit 4).
    let (_, operator) = server.create_key("ops", "operator");
    let quarantined =
        run(server
            .cli("svcctl")
            .args(["--api-key", &operator, "agent", "quarantine", "db-01"]));
    assert_eq!(quarantined.code, 0, "{quarantined:?}");
    let refused = agent_jwt(&db, &["--audience", "db"]);
    assert_eq!(refused.code, 4, "{refused:?}");
    assert!(refused.stderr.contains("quarantined"), "{refused:?}");

    // Audited as the agent, without the token.
    let rows = audit_rows(&server, &["--action", "jwt.issue"]);
    let mine = rows
        .iter()
        .find(|r| r["user"] == "web-01" && r["outcome"] == "success")
        .unwrap_or_else(|| panic!("{rows:?}"));
    assert_eq!(mine["resource_id"], got["id"]);
    assert_eq!(mine["detail"]["via"], "bus");
    let signature = token.rsplit('.').next().unwrap();
    assert!(!serde_json::to_string(&rows).unwrap().contains(signature));
}
