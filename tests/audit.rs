//! Audit log and policies end to end: rows written by real operations, queried and verified
//! through svc-audit and svc-policy, tampering done directly in the SQLite file.

mod common;

use common::{run, Options, TestServer};

fn json(result: &common::Run) -> serde_json::Value {
    serde_json::from_str(&result.stdout).unwrap_or_else(|e| panic!("{e}: {result:?}"))
}

const DENY_ADMIN_KEYS: &str = "id: no-admin-keys\nseverity: critical\nrules:\n  - effect: deny\n    actions: [\"apikey.create\"]\n    principals: [\"role:admin\"]\n    resources: [\"apikey:*\"]\n";

fn server_with_policy() -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keys.yaml"), DENY_ADMIN_KEYS).unwrap();
    std::fs::write(dir.path().join("broken.yaml"), "id: [unclosed\n").unwrap();
    let server = TestServer::start_with(Options {
        config_yaml: format!("policy_dir: {}\n", dir.path().display()),
        ..Options::default()
    });
    (server, dir)
}

#[test]
fn mutations_are_audited_redacted_and_queryable() {
    let server = TestServer::start();
    let (id, key) = server.create_key("deployer", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    // A refused mutation is audited too.
    let refused = server.request(
        "POST",
        "/api/v1/apikeys",
        Some(&readonly),
        Some(r#"{"name":"x","role":"admin"}"#),
    );
    assert_eq!(refused.status, 403);
    server.request(
        "DELETE",
        &format!("/api/v1/apikeys/{id}"),
        Some(&server.admin_key),
        None,
    );

    let log = run(server
        .cli("svc-audit")
        .args(["--api-key", &readonly, "log", "-o", "json"]));
    assert_eq!(log.code, 0, "{log:?}");
    let page = json(&log);
    assert!(page["next_cursor"].is_null());
    let items = page["items"].as_array().unwrap();
    let actions: Vec<(&str, &str, &str)> = items
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap(),
                e["user"].as_str().unwrap(),
                e["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("apikey.delete", "bootstrap-admin", "success"),
            ("apikey.create", "viewer", "denied"),
            ("apikey.create", "bootstrap-admin", "success"),
            ("apikey.create", "bootstrap-admin", "success"),
        ]
    );
    assert_eq!(items[3]["resource_id"], id.as_str());
    assert_eq!(items[3]["detail"]["name"], "deployer");
    assert_eq!(items[3]["severity"], "high");
    // No cleartext key in any audit entry.
    assert!(!log.stdout.contains(&key) && !log.stdout.contains(&readonly));

    let filtered = json(&run(server.cli("svc-audit").args([
        "--api-key",
        &readonly,
        "-o",
        "json",
        "log",
        "--action",
        "apikey.d*",
    ])));
    assert_eq!(filtered["items"].as_array().unwrap().len(), 1);
    let by_user = json(&run(server.cli("svc-audit").args([
        "--api-key",
        &readonly,
        "-o",
        "json",
        "log",
        "--user",
        "viewer",
    ])));
    assert_eq!(by_user["items"].as_array().unwrap().len(), 1);

    // Paging: two pages of two.
    let first = json(&run(server.cli("svc-audit").args([
        "--api-key",
        &readonly,
        "-o",
        "json",
        "log",
        "--limit",
        "2",
    ])));
    let cursor = first["next_cursor"].as_str().unwrap().to_string();
    let second = json(&run(server.cli("svc-audit").args([
        "--api-key",
        &readonly,
        "-o",
        "json",
        "log",
        "--limit",
        "2",
        "--cursor",
        &cursor,
    ])));
    assert_eq!(second["items"][0]["id"], items[2]["id"]);
    assert!(second["next_cursor"].is_null());

    let table = run(server
        .cli("svc-audit")
        .args(["--api-key", &readonly, "log"]));
    assert!(table.stdout.starts_with("TIME"), "{table:?}");

    let bad =
        run(server
            .cli("svc-audit")
            .args(["--api-key", &readonly, "log", "--since", "yesterday"]));
    assert_eq!(bad.code, 2, "a usage error: {bad:?}");
    assert!(
        bad.stderr
            .contains("'--since' with value 'yesterday': not a time"),
        "{bad:?}"
    );
}

#[test]
fn verify_detects_tampering_in_the_database_file() {
    // SQLite whatever SVC_TEST_STORE says: the attacker edits svc.db (tests/store.rs checks
    // that PostgreSQL refuses raw UPDATE and DELETE of audit rows too).
    let server = TestServer::start_sqlite();
    for name in ["a", "b", "c", "d"] {
        server.create_key(name, "readonly");
    }
    let key = server.admin_key.clone();
    let ok = run(server.cli("svc-audit").args(["--api-key", &key, "verify"]));
    assert_eq!(ok.code, 0, "{ok:?}");
    // Each change wrote two rows: its attempt before it ran, its outcome after.
    assert!(ok.stdout.contains("8 rows verified"), "{ok:?}");

    let db = rusqlite::Connection::open(server.data_dir.join("svc.db")).unwrap();
    // The database itself refuses updates and deletes.
    assert!(db
        .execute(
            "UPDATE audit_events SET outcome = 'denied' WHERE seq = 2",
            []
        )
        .is_err());
    assert!(db
        .execute("DELETE FROM audit_events WHERE seq = 2", [])
        .is_err());
    let target: String = db
        .query_row("SELECT id FROM audit_events WHERE seq = 2", [], |r| {
            r.get(0)
        })
        .unwrap();
    // An attacker with file access drops the guard and edits a row.
    db.execute_batch("DROP TRIGGER audit_events_no_update; DROP TRIGGER audit_events_no_delete;")
        .unwrap();
    db.execute(
        "UPDATE audit_events SET user_id = 'someone-else' WHERE seq = 2",
        [],
    )
    .unwrap();
    let altered = run(server
        .cli("svc-audit")
        .args(["--api-key", &key, "verify", "-o", "json"]));
    assert_eq!(altered.code, 1, "{altered:?}");
    let report = json(&altered);
    assert_eq!(report["ok"], false);
    assert_eq!(report["first_bad"], target.as_str());
    assert!(
        report["detail"].as_str().unwrap().contains("altered"),
        "{report}"
    );

    // Removing a row instead is caught at the row after the gap.
    db.execute(
        "UPDATE audit_events SET user_id = 'bootstrap-admin' WHERE seq = 2",
        [],
    )
    .unwrap();
    assert_eq!(
        run(server.cli("svc-audit").args(["--api-key", &key, "verify"])).code,
        0
    );
    let next: String = db
        .query_row("SELECT id FROM audit_events WHERE seq = 3", [], |r| {
            r.get(0)
        })
        .unwrap();
    db.execute("DELETE FROM audit_events WHERE seq = 2", [])
        .unwrap();
    let removed = run(server.cli("svc-audit").args(["--api-key", &key, "verify"]));
    assert_eq!(removed.code, 1, "{removed:?}");
    assert!(removed.stderr.contains(&next), "{removed:?}");
}

#[test]
fn policies_in_audit_mode_record_but_never_block() {
    let (server, _policies) = server_with_policy();
    let key = server.admin_key.clone();
    // The policy denies admins creating keys; audit mode records it and lets it through.
    let (id, _) = server.create_key("allowed-anyway", "readonly");
    let log = json(&run(server.cli("svc-audit").args([
        "--api-key",
        &key,
        "-o",
        "json",
        "log",
        "--policy-id",
        "no-admin-keys",
    ])));
    let entry = &log["items"][0];
    assert_eq!(entry["resource_id"], id.as_str());
    assert_eq!(entry["outcome"], "success");
    assert_eq!(entry["severity"], "critical");

    let violations = json(&run(server.cli("svc-policy").args([
        "--api-key",
        &key,
        "-o",
        "json",
        "violations",
    ])));
    assert_eq!(violations["items"].as_array().unwrap().len(), 1);

    let list = run(server.cli("svc-policy").args(["--api-key", &key, "list"]));
    assert_eq!(list.code, 0, "{list:?}");
    assert!(
        list.stdout
            .lines()
            .any(|l| l.starts_with("no-admin-keys") && l.contains("critical")),
        "{list:?}"
    );
    assert_eq!(
        list.stdout.lines().count(),
        2,
        "the broken file is skipped: {list:?}"
    );
    let show = run(server
        .cli("svc-policy")
        .args(["--api-key", &key, "show", "no-admin-keys"]));
    assert_eq!(show.stdout, DENY_ADMIN_KEYS);
    let missing = run(server
        .cli("svc-policy")
        .args(["--api-key", &key, "show", "nope"]));
    assert_eq!(missing.code, 5, "{missing:?}");

    for command in [
        ["create", "x.yaml"],
        ["update", "x.yaml"],
        ["delete", "no-admin-keys"],
    ] {
        let result = run(server
            .cli("svc-policy")
            .args(["--api-key", &key])
            .args(command));
        assert_eq!(result.code, 1, "{command:?}: {result:?}");
        assert!(result.stderr.contains("Unimplemented"), "{result:?}");
    }
    // Refused changes are audited, as `denied` (contract §9).
    let refused = common::audit_rows(&server, &["--action", "policy.*"]);
    let rows: Vec<(&str, &str, &str)> = refused
        .iter()
        .map(|r| {
            (
                r["action"].as_str().unwrap(),
                r["resource_id"].as_str().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("policy.delete", "no-admin-keys", "denied"),
            ("policy.update", "x.yaml", "denied"),
            ("policy.create", "x.yaml", "denied"),
        ]
    );
}

#[test]
fn policy_eval_and_validate_run_without_a_server() {
    let names = common::Names::new();
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, DENY_ADMIN_KEYS).unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "id: x\nrules:\n  - effect: maybe\n    actions: [a]\n").unwrap();

    let valid = run(names.command("svc-policy").arg("validate").arg(&good));
    assert_eq!(valid.code, 0, "{valid:?}");
    let invalid = run(names.command("svc-policy").arg("validate").arg(&bad));
    assert_eq!(invalid.code, 1, "{invalid:?}");
    assert!(invalid.stderr.contains("line 3"), "{invalid:?}");
    let missing = run(names
        .command("svc-policy")
        .args(["validate", "/nonexistent.yaml"]));
    assert_eq!(missing.code, 5, "{missing:?}");

    let deny = run(names.command("svc-policy").arg("eval").arg(&good).args([
        "--action",
        "apikey.create",
        "--principal",
        "role:admin",
        "--resource",
        "apikey:k1",
        "-o",
        "json",
    ]));
    assert_eq!(deny.code, 1, "{deny:?}");
    assert_eq!(json(&deny)["decision"], "deny");
    let no_match = run(names.command("svc-policy").arg("eval").arg(&good).args([
        "--action",
        "secret.read",
        "--principal",
        "user:bob",
        "--resource",
        "secret:x",
    ]));
    assert_eq!((no_match.code, no_match.stdout.as_str()), (0, "no-match\n"));
}

#[test]
fn export_is_admin_only_redacted_and_complete() {
    let server = TestServer::start();
    let (_, operator) = server.create_key("op", "operator");
    server.create_key("b", "readonly");
    let admin = server.admin_key.clone();
    let denied = run(server
        .cli("svc-audit")
        .args(["--api-key", &operator, "export"]));
    assert_eq!(denied.code, 4, "{denied:?}");

    let jsonl =
        run(server
            .cli("svc-audit")
            .args(["--api-key", &admin, "export", "--format", "jsonl"]));
    assert_eq!(jsonl.code, 0, "{jsonl:?}");
    let lines: Vec<serde_json::Value> = jsonl
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The export is the whole chain: each create's attempt row and its outcome row.
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0]["action"], "apikey.create");
    assert_eq!(lines[0]["outcome"], "attempt");
    assert_eq!(lines[1]["detail"]["attempt"], lines[0]["id"]);
    assert!(!jsonl.stdout.contains(&operator));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("audit.json");
    let to_file = run(server
        .cli("svc-audit")
        .args([
            "--api-key",
            &admin,
            "export",
            "--format",
            "json",
            "--output-file",
        ])
        .arg(&file));
    assert_eq!(to_file.code, 0, "{to_file:?}");
    common::assert_private(&file);
    let array: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(array.len(), 4);

    let csv = run(server
        .cli("svc-audit")
        .args(["--api-key", &admin, "export", "--format", "csv"]));
    let mut csv_lines = csv.stdout.lines();
    assert!(csv_lines
        .next()
        .unwrap()
        .starts_with("id,timestamp,user,action"));
    assert_eq!(csv_lines.count(), 4, "{csv:?}");

    let empty = run(server.cli("svc-audit").args([
        "--api-key",
        &admin,
        "export",
        "--format",
        "json",
        "--since",
        "2099-01-01T00:00:00Z",
    ]));
    assert_eq!(empty.stdout.trim(), "[]", "{empty:?}");
    let bad = run(server
        .cli("svc-audit")
        .args(["--api-key", &admin, "export", "--format", "xml"]));
    assert_eq!(bad.code, 2, "{bad:?}");
}

#[test]
fn stats_and_compliance_reports() {
    let (server, _policies) = server_with_policy();
    let key = server.admin_key.clone();
    let (_, readonly) = server.create_key("r", "readonly");
    server.create_key("s", "readonly");
    server.request(
        "POST",
        "/api/v1/apikeys",
        Some(&readonly),
        Some(r#"{"name":"x","role":"admin"}"#),
    );

    let stats = json(&run(server.cli("svc-audit").args([
        "--api-key",
        &readonly,
        "-o",
        "json",
        "stats",
    ])));
    assert_eq!(stats["total"], 3);
    assert_eq!(stats["by_outcome"]["success"], 2);
    assert_eq!(stats["by_outcome"]["denied"], 1);
    assert_eq!(stats["by_action"]["apikey.create"], 3);

    let report = json(&run(server.cli("svc-audit").args([
        "--api-key",
        &key,
        "-o",
        "json",
        "report",
    ])));
    // Both admin creates matched the deny policy; the readonly attempt matched none.
    assert_eq!(
        (
            report["total"].as_u64(),
            report["violations"].as_u64(),
            report["refused"].as_u64()
        ),
        (Some(3), Some(2), Some(1))
    );
    assert!(
        (report["compliance_rate"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-9,
        "{report}"
    );
    assert_eq!(report["top_violations"]["no-admin-keys"], 2);
    assert_eq!(report["trend"].as_array().unwrap().len(), 1);

    let compliance = json(&run(server.cli("svc-policy").args([
        "--api-key",
        &key,
        "-o",
        "json",
        "compliance",
        "--since",
        "1h",
    ])));
    assert_eq!(compliance["violations"], 2);
    let table = run(server.cli("svc-audit").args(["--api-key", &key, "report"]));
    assert!(
        table.stdout.contains("compliance rate: 33.33%"),
        "{table:?}"
    );
}

#[test]
fn sighup_reloads_policies_and_decisions_become_events_and_stream_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start_with(Options {
        config_yaml: format!("policy_dir: {}\n", dir.path().display()),
        ..Options::default()
    });
    let key = server.admin_key.clone();
    let empty = run(server
        .cli("svc-policy")
        .args(["--api-key", &key, "-o", "json", "list"]));
    assert_eq!(json(&empty), serde_json::json!([]));

    let with_set = DENY_ADMIN_KEYS.replace(
        "severity: critical",
        "severity: critical\npolicy_set: baseline",
    );
    std::fs::write(dir.path().join("keys.yaml"), with_set).unwrap();
    unsafe {
        libc::kill(server.pid() as i32, libc::SIGHUP);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let list = json(&run(server.cli("svc-policy").args([
            "--api-key",
            &key,
            "-o",
            "json",
            "list",
        ])));
        if list.as_array().unwrap().len() == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "SIGHUP did not reload the policies"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let sets = run(server
        .cli("svc-policy")
        .args(["--api-key", &key, "list", "--policy-sets"]));
    assert!(
        sets.stdout
            .lines()
            .any(|l| l.starts_with("baseline") && l.ends_with('1')),
        "{sets:?}"
    );
    let set =
        run(server
            .cli("svc-policy")
            .args(["--api-key", &key, "show", "baseline", "--policy-set"]));
    assert_eq!(set.stdout.trim(), "no-admin-keys", "{set:?}");

    server.create_key("after-reload", "readonly");
    let events = json(&run(server.cli("svc-events").args([
        "--api-key",
        &key,
        "-o",
        "json",
        "list",
        "--type",
        "policy_deny",
    ])));
    let event = &events["items"][0];
    assert_eq!(event["payload"]["policy_id"], "no-admin-keys");
    assert_eq!(event["payload"]["action"], "apikey.create");
    assert_eq!(event["category"], "policy");

    // Every audit row is mirrored to the audit stream (read once the server has stopped),
    // attempts included.
    let rows = json(&run(server.cli("svc-audit").args([
        "--api-key",
        &key,
        "-o",
        "json",
        "log",
        "--attempts",
    ])));
    let ids: Vec<String> = rows["items"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(server.stop_with(libc::SIGTERM), Some(0));
    let mirror = svc::stream::StreamLog::open(
        &server.data_dir.join("jetstream/audit"),
        svc::stream::StreamConfig::default(),
    )
    .unwrap();
    let mirrored: Vec<String> = mirror
        .read(1, 1000)
        .unwrap()
        .iter()
        .map(|r| {
            serde_json::from_slice::<serde_json::Value>(&r.payload).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(mirrored, ids);
}

/// Audit before acting, end to end: each change's attempt row is in the chain before it runs
/// and its outcome row names it; the log shows one row per finished change, and an attempt
/// whose outcome could not be written stays visible and verifiable.
#[test]
fn changes_are_recorded_before_they_run_and_a_missing_outcome_shows() {
    let server = TestServer::start_sqlite();
    let admin = server.admin_key.clone();
    let audit = |args: &[&str]| {
        json(&run(server
            .cli("svc-audit")
            .args(["--api-key", &admin, "-o", "json"])
            .args(args)))
    };
    server.create_key("first", "readonly");
    let shown = audit(&["log", "--action", "apikey.create"]);
    assert_eq!(shown["items"].as_array().unwrap().len(), 1, "{shown}");
    let all = audit(&["log", "--action", "apikey.create", "--attempts"]);
    let rows = all["items"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{all}");
    let (outcome, attempt) = (&rows[0], &rows[1]);
    assert_eq!(attempt["outcome"], "attempt");
    assert_eq!(attempt["detail"]["name"], "first");
    assert_eq!(outcome["outcome"], "success");
    assert_eq!(outcome["detail"]["attempt"], attempt["id"]);
    let unfinished = audit(&["log", "--outcome", "attempt"]);
    assert_eq!(unfinished["items"], serde_json::json!([]), "{unfinished}");

    // The store takes attempt rows but refuses outcome rows: the change has run (the key
    // works) and its attempt is what the chain holds of it.
    let db = rusqlite::Connection::open(server.data_dir.join("svc.db")).unwrap();
    db.execute_batch(
        "CREATE TRIGGER refuse_outcomes BEFORE INSERT ON audit_events \
         WHEN NEW.outcome <> 'attempt' \
         BEGIN SELECT RAISE(ABORT, 'outcome refused by the test'); END;",
    )
    .unwrap();
    let (_, second) = server.create_key("second", "readonly");
    db.execute_batch("DROP TRIGGER refuse_outcomes;").unwrap();
    let listed = run(server.cli("svc-audit").args([
        "--api-key",
        &second,
        "-o",
        "json",
        "log",
        "--limit",
        "1",
    ]));
    assert_eq!(listed.code, 0, "the key was created: {listed:?}");
    let unfinished = audit(&["log", "--outcome", "attempt"]);
    let items = unfinished["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{unfinished}");
    assert_eq!(items[0]["action"], "apikey.create");
    assert_eq!(items[0]["detail"]["name"], "second");
    let verified = audit(&["verify"]);
    assert_eq!(verified["ok"], true, "{verified}");

    let bad = run(server
        .cli("svc-audit")
        .args(["--api-key", &admin, "log", "--outcome", "maybe"]));
    assert_ne!(bad.code, 0, "{bad:?}");
    assert!(
        bad.stderr.contains("outcome 'maybe' is not one of"),
        "{bad:?}"
    );
}
