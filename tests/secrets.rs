//! Secrets end to end through svc-secrets against the real server: KV versions and deletes,
//! roles, audit rows, encryption at rest (no cleartext on disk or in the log, tampering
//! detected, wrong master key refused, master rotation), transit rotation, and PostgreSQL
//! leases against the test process's PostgreSQL (`common::postgres`).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use common::{run, Options, Run, TestServer};

fn json(result: &Run) -> serde_json::Value {
    serde_json::from_str(&result.stdout).unwrap_or_else(|e| panic!("{e}: {result:?}"))
}

fn secrets(server: &TestServer, key: &str, args: &[&str]) -> Run {
    run(server
        .cli("svc-secrets")
        .arg("--api-key")
        .arg(key)
        .args(args))
}

/// Runs and insists on exit 0.
fn ok(server: &TestServer, key: &str, args: &[&str]) -> Run {
    let result = secrets(server, key, args);
    assert_eq!(result.code, 0, "{args:?}: {result:?}");
    result
}

#[test]
fn kv_versions_deletes_and_roles() {
    let server = TestServer::start();
    let admin = server.admin_key.clone();
    let (_, operator) = server.create_key("app", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");

    let put = json(&ok(
        &server,
        &operator,
        &["put", "db/prod", "user=app", "password=one", "-o", "json"],
    ));
    assert_eq!(put["version"], 1);
    ok(
        &server,
        &operator,
        &["put", "db/prod", "user=app", "password=two"],
    );
    let latest = json(&ok(&server, &operator, &["get", "db/prod", "-o", "json"]));
    assert_eq!(latest["version"], 2);
    assert_eq!(latest["data"]["password"], "two");
    let field = ok(
        &server,
        &operator,
        &["get", "db/prod", "--version", "1", "--field", "password"],
    );
    assert_eq!(field.stdout, "one\n");
    assert_eq!(
        secrets(&server, &operator, &["get", "db/prod", "--field", "nope"]).code,
        5
    );

    // From a YAML file, with a pair overriding a field.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fields.yaml");
    std::fs::write(&file, "host: db.internal\nport: 5432\n").unwrap();
    ok(
        &server,
        &operator,
        &[
            "put",
            "db/replica",
            "--from-file",
            file.to_str().unwrap(),
            "port=6432",
        ],
    );
    let replica = json(&ok(
        &server,
        &operator,
        &["get", "db/replica", "-o", "json"],
    ));
    assert_eq!(
        replica["data"],
        serde_json::json!({"host": "db.internal", "port": "6432"})
    );

    // Readonly lists metadata but may not read values.
    let listed = json(&ok(&server, &readonly, &["list", "db/", "-o", "json"]));
    let paths: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["db/prod", "db/replica"]);
    assert_eq!(listed[0]["version"], 2);
    assert!(!listed.to_string().contains("two"), "no values in a list");
    let denied = secrets(&server, &readonly, &["get", "db/prod"]);
    assert_eq!(denied.code, 4, "{denied:?}");
    assert!(denied.stdout.is_empty());
    assert_eq!(
        secrets(&server, &readonly, &["put", "db/prod", "a=b"]).code,
        4
    );

    // Soft delete of the latest; older versions stay readable; destroy erases.
    ok(&server, &operator, &["delete", "db/prod"]);
    let gone = secrets(&server, &operator, &["get", "db/prod"]);
    assert_eq!(gone.code, 5, "{gone:?}");
    assert!(
        gone.stderr
            .starts_with("svc-secrets: secret 'db/prod' version 2 is deleted"),
        "{gone:?}"
    );
    assert_eq!(
        json(&ok(
            &server,
            &operator,
            &["get", "db/prod", "--version", "1", "-o", "json"]
        ))["data"]["password"],
        "one"
    );

    // A path whose latest version is deleted is not listed like a live one: left out, or
    // marked with --include-deleted.
    let listed = json(&ok(&server, &readonly, &["list", "db/", "-o", "json"]));
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["path"], "db/replica");
    assert_eq!(listed[0]["deleted"], false);
    assert_eq!(listed[0]["deleted_at"], serde_json::Value::Null);
    let table = ok(&server, &readonly, &["list", "db/"]);
    assert!(!table.stdout.contains("db/prod"), "{table:?}");
    let all = json(&ok(
        &server,
        &readonly,
        &["list", "db/", "--include-deleted", "-o", "json"],
    ));
    assert_eq!(all.as_array().unwrap().len(), 2, "{all}");
    assert_eq!(all[0]["path"], "db/prod");
    assert_eq!(all[0]["deleted"], true, "{all}");
    assert!(
        all[0]["deleted_at"].as_str().unwrap().ends_with('Z'),
        "{all}"
    );
    assert_eq!(all[1]["deleted"], false, "{all}");
    let table = ok(&server, &readonly, &["list", "db/", "--include-deleted"]);
    let header = table.stdout.lines().next().unwrap();
    assert!(header.contains("DELETED"), "{table:?}");
    let prod = table
        .stdout
        .lines()
        .find(|line| line.starts_with("db/prod"))
        .unwrap();
    assert!(prod
        .trim_end()
        .ends_with(all[0]["deleted_at"].as_str().unwrap()));
    let replica = table
        .stdout
        .lines()
        .find(|line| line.starts_with("db/replica"))
        .unwrap();
    assert!(replica.trim_end().ends_with('-'), "{table:?}");
    // Written again, it is live again.
    ok(
        &server,
        &operator,
        &["put", "db/prod", "user=app", "password=three"],
    );
    let listed = json(&ok(&server, &readonly, &["list", "db/", "-o", "json"]));
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    ok(&server, &operator, &["delete", "db/prod"]);

    ok(
        &server,
        &operator,
        &["delete", "db/prod", "--versions", "1", "--destroy"],
    );
    assert_eq!(
        secrets(&server, &operator, &["get", "db/prod", "--version", "1"]).code,
        5
    );
    ok(&server, &admin, &["delete", "db/prod", "--destroy"]);
    let listed = json(&ok(&server, &readonly, &["list", "-o", "json"]));
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(secrets(&server, &operator, &["get", "no/such"]).code, 5);
    assert_eq!(
        secrets(&server, &operator, &["put", "db/prod"]).code,
        2,
        "nothing to write"
    );
}

#[test]
fn reads_and_writes_are_audited_without_values() {
    let server = TestServer::start();
    let (_, operator) = server.create_key("app", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    let value = "audit-canary-7f3a9";
    ok(
        &server,
        &operator,
        &["put", "svc/api", &format!("token={value}")],
    );
    ok(&server, &operator, &["get", "svc/api"]);
    assert_eq!(secrets(&server, &readonly, &["get", "svc/api"]).code, 4);
    ok(&server, &operator, &["delete", "svc/api"]);
    ok(&server, &operator, &["transit", "create-key", "k"]);
    ok(&server, &operator, &["transit", "encrypt", "k", value]);

    let log = run(server
        .cli("svc-audit")
        .args(["--api-key", &readonly, "log", "-o", "json"]));
    assert_eq!(log.code, 0, "{log:?}");
    assert!(
        !log.stdout.contains(value),
        "value leaked into the audit log: {log:?}"
    );
    let page = json(&log);
    let rows: Vec<(String, String, String, String)> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| !e["action"].as_str().unwrap().starts_with("apikey."))
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_string(),
                e["user"].as_str().unwrap().to_string(),
                e["resource_id"].as_str().unwrap().to_string(),
                e["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected = [
        ("transit.encrypt", "app", "k", "success"),
        ("transit.create_key", "app", "k", "success"),
        ("secret.delete", "app", "svc/api", "success"),
        ("secret.read", "viewer", "svc/api", "denied"),
        ("secret.read", "app", "svc/api", "success"),
        ("secret.write", "app", "svc/api", "success"),
    ];
    let expected: Vec<(String, String, String, String)> = expected
        .iter()
        .map(|(a, b, c, d)| (a.to_string(), b.to_string(), c.to_string(), d.to_string()))
        .collect();
    assert_eq!(rows, expected);
    let write = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "secret.write")
        .unwrap();
    assert_eq!(write["detail"]["fields"], serde_json::json!(["token"]));
    assert_eq!(write["severity"], "high");
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn values_never_rest_in_cleartext() {
    // SQLite whatever SVC_TEST_STORE says: this reads every file the store wrote, and only
    // SQLite writes them under data_dir.
    let mut server = TestServer::start_sqlite();
    let (_, operator) = server.create_key("app", "operator");
    let unique = format!("cleartext-canary-{}", std::process::id());
    ok(
        &server,
        &operator,
        &["put", "team/a", &format!("password={unique}")],
    );
    ok(&server, &operator, &["get", "team/a"]);
    ok(&server, &operator, &["transit", "create-key", "k"]);
    let sealed = ok(&server, &operator, &["transit", "encrypt", "k", &unique]).stdout;
    assert!(sealed.starts_with("svc:v1:"));
    let check = |server: &TestServer| {
        let files = files_under(&server.data_dir);
        assert!(files.iter().any(|f| f.ends_with("svc.db")), "{files:?}");
        for file in files {
            let bytes = std::fs::read(&file).unwrap();
            assert!(
                !contains(&bytes, unique.as_bytes()),
                "cleartext in {}",
                file.display()
            );
        }
        assert!(
            !server.log().contains(&unique),
            "cleartext in the server log"
        );
    };
    check(&server);
    // And after a clean stop, when the WAL has been checkpointed into the database.
    server.stop_with(libc::SIGTERM);
    check(&server);
}

fn write_master_key(server: &TestServer, key: &str) {
    let config = std::fs::read_to_string(&server.config_file).unwrap();
    let replaced: Vec<String> = config
        .lines()
        .map(|line| {
            if line.starts_with("master_key:") {
                format!("master_key: {key}")
            } else {
                line.to_string()
            }
        })
        .collect();
    std::fs::write(&server.config_file, replaced.join("\n") + "\n").unwrap();
}

fn current_master_key(server: &TestServer) -> String {
    let config = std::fs::read_to_string(&server.config_file).unwrap();
    config
        .lines()
        .find_map(|l| l.strip_prefix("master_key: "))
        .unwrap()
        .to_string()
}

fn start_fails(server: &TestServer) -> Run {
    run(server
        .names
        .command("svc-server")
        .arg("--config")
        .arg(&server.config_file))
}

#[test]
fn wrong_master_key_is_refused_and_rotation_needs_no_restart() {
    let mut server = TestServer::start();
    let admin = server.admin_key.clone();
    ok(
        &server,
        &admin,
        &["put", "db/prod", "password=before-rotation"],
    );
    ok(&server, &admin, &["transit", "create-key", "k"]);
    let sealed = ok(&server, &admin, &["transit", "encrypt", "k", "payload"]).stdout;
    let old_key = current_master_key(&server);

    // Rotation happens live: the same server keeps serving old and new data.
    let dir = tempfile::tempdir().unwrap();
    let new_key = common::random_master_key();
    let key_file = dir.path().join("new.key");
    std::fs::write(&key_file, format!("{new_key}\n")).unwrap();
    let (_, operator) = server.create_key("app", "operator");
    assert_eq!(
        secrets(
            &server,
            &operator,
            &[
                "rotate-master",
                "--new-key-file",
                key_file.to_str().unwrap()
            ]
        )
        .code,
        4,
        "admin only"
    );
    let rotated = json(&ok(
        &server,
        &admin,
        &[
            "rotate-master",
            "--new-key-file",
            key_file.to_str().unwrap(),
            "-o",
            "json",
        ],
    ));
    assert_eq!(
        rotated["rewrapped"], 7,
        "check value, one data key, one transit key, the at-rest data key, the two CA keys and \
         the command-signing key"
    );
    assert_eq!(
        ok(&server, &admin, &["get", "db/prod", "--field", "password"]).stdout,
        "before-rotation\n"
    );
    ok(
        &server,
        &admin,
        &["put", "db/prod", "password=after-rotation"],
    );
    assert_eq!(
        ok(&server, &admin, &["transit", "decrypt", "k", sealed.trim()]).stdout,
        "payload"
    );

    // Restarting with the old key is refused, with a message that says what to do.
    server.stop_with(libc::SIGTERM);
    let refused = start_fails(&server);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(
        refused
            .stderr
            .contains("svc-server: master_key does not match"),
        "{refused:?}"
    );
    assert!(refused.stderr.contains("rotate-master"), "{refused:?}");
    // So is any other wrong key.
    write_master_key(&server, &common::random_master_key());
    assert_eq!(start_fails(&server).code, 1);
    assert_ne!(old_key, new_key);

    write_master_key(&server, &new_key);
    server.spawn(&[]);
    assert_eq!(
        ok(
            &server,
            &admin,
            &["get", "db/prod", "--version", "1", "--field", "password"]
        )
        .stdout,
        "before-rotation\n"
    );
    assert_eq!(
        ok(&server, &admin, &["get", "db/prod", "--field", "password"]).stdout,
        "after-rotation\n"
    );
    // The at-rest data key followed the rotation: the server opens it at start, and refuses
    // to start when it cannot. Keys made before the rotation still sign in.
    let whoami = server.request("GET", "/api/v1/whoami", Some(&operator), None);
    assert_eq!(whoami.status, 200, "{whoami:?}");
    // The CA keys followed the rotation: the restarted server can still issue identities.
    let token = run(server.cli("svc-identity").args([
        "--api-key",
        &admin,
        "-o",
        "json",
        "token",
        "create",
    ]));
    assert_eq!(token.code, 0, "{token:?}");
    let rotated_ca =
        run(server
            .cli("svc-identity")
            .args(["--api-key", &admin, "ca", "rotate-signing"]));
    assert_eq!(rotated_ca.code, 0, "{rotated_ca:?}");
}

#[test]
fn tampered_or_moved_ciphertext_is_detected_not_returned() {
    // SQLite whatever SVC_TEST_STORE says: the tampering goes through svc.db.
    let server = TestServer::start_sqlite();
    let admin = server.admin_key.clone();
    ok(&server, &admin, &["put", "a/one", "password=first-value"]);
    ok(&server, &admin, &["put", "a/two", "password=second-value"]);
    let db = rusqlite::Connection::open(server.data_dir.join("svc.db")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    let read = |path: &str| -> String {
        db.query_row(
            "SELECT ciphertext FROM secret_versions WHERE path = ?1",
            [path],
            |r| r.get(0),
        )
        .unwrap()
    };
    // One flipped bit in a.one's ciphertext.
    let engine = base64::engine::general_purpose::STANDARD;
    let mut bytes = engine.decode(read("a/one")).unwrap();
    bytes[20] ^= 0x01;
    db.execute(
        "UPDATE secret_versions SET ciphertext = ?1 WHERE path = 'a/one'",
        [engine.encode(&bytes)],
    )
    .unwrap();
    let tampered = secrets(&server, &admin, &["get", "a/one"]);
    assert_eq!(tampered.code, 1, "{tampered:?}");
    assert!(tampered.stdout.is_empty(), "{tampered:?}");
    assert!(!tampered.stderr.contains("value"), "{tampered:?}");
    // a/two's valid ciphertext copied to a/one: bound to its path, so it does not decrypt.
    db.execute(
        "UPDATE secret_versions SET ciphertext = ?1 WHERE path = 'a/one'",
        [read("a/two")],
    )
    .unwrap();
    let moved = secrets(&server, &admin, &["get", "a/one"]);
    assert_eq!(moved.code, 1, "{moved:?}");
    assert!(!moved.stdout.contains("second-value"), "{moved:?}");
    assert!(server.log().contains("integrity") || server.log().contains("failed authentication"));
    // The untouched secret still reads.
    assert_eq!(
        ok(&server, &admin, &["get", "a/two", "--field", "password"]).stdout,
        "second-value\n"
    );
}

#[test]
fn transit_rotation_keeps_old_ciphertexts_until_retired() {
    let server = TestServer::start();
    let (_, operator) = server.create_key("app", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    ok(&server, &operator, &["transit", "create-key", "orders"]);
    assert_eq!(
        secrets(&server, &operator, &["transit", "create-key", "orders"]).code,
        1
    );
    assert_eq!(
        secrets(&server, &readonly, &["transit", "encrypt", "orders", "x"]).code,
        4
    );
    let v1 = ok(
        &server,
        &operator,
        &["transit", "encrypt", "orders", "card 4111"],
    )
    .stdout
    .trim()
    .to_string();
    assert!(v1.starts_with("svc:v1:"), "{v1}");
    let rotated = json(&ok(
        &server,
        &operator,
        &["transit", "rotate", "orders", "-o", "json"],
    ));
    assert_eq!(rotated["latest_version"], 2);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("blob");
    std::fs::write(&file, [0u8, 159, 146, 150]).unwrap();
    let encrypted = json(&ok(
        &server,
        &operator,
        &[
            "transit",
            "encrypt",
            "orders",
            "--file",
            file.to_str().unwrap(),
            "-o",
            "json",
        ],
    ));
    let v2 = encrypted["ciphertext"].as_str().unwrap().to_string();
    assert!(v2.starts_with("svc:v2:"), "{v2}");
    assert_eq!(
        ok(&server, &operator, &["transit", "decrypt", "orders", &v1]).stdout,
        "card 4111"
    );
    let binary = json(&ok(
        &server,
        &operator,
        &["transit", "decrypt", "orders", &v2, "-o", "json"],
    ));
    assert_eq!(
        binary["plaintext"],
        base64::engine::general_purpose::STANDARD.encode([0u8, 159, 146, 150])
    );

    let rewrapped = ok(&server, &operator, &["transit", "rewrap", "orders", &v1])
        .stdout
        .trim()
        .to_string();
    assert!(rewrapped.starts_with("svc:v2:"), "{rewrapped}");
    ok(
        &server,
        &operator,
        &[
            "transit",
            "config",
            "orders",
            "--min-decryption-version",
            "2",
        ],
    );
    let retired = secrets(&server, &operator, &["transit", "decrypt", "orders", &v1]);
    assert_eq!(retired.code, 1, "{retired:?}");
    assert!(retired.stderr.contains("retired"), "{retired:?}");
    assert_eq!(
        ok(
            &server,
            &operator,
            &["transit", "decrypt", "orders", &rewrapped]
        )
        .stdout,
        "card 4111"
    );
    let mut altered = v2.clone();
    altered.truncate(altered.len() - 6);
    assert_eq!(
        secrets(
            &server,
            &operator,
            &["transit", "decrypt", "orders", &altered]
        )
        .code,
        1
    );

    // Signatures survive rotation too.
    ok(
        &server,
        &operator,
        &["transit", "create-key", "release", "--type", "ed25519"],
    );
    let signature = ok(
        &server,
        &operator,
        &["transit", "sign", "release", "v1.2.3"],
    )
    .stdout
    .trim()
    .to_string();
    ok(&server, &operator, &["transit", "rotate", "release"]);
    assert_eq!(
        ok(
            &server,
            &operator,
            &["transit", "verify", "release", "v1.2.3", &signature]
        )
        .stdout,
        "valid\n"
    );
    assert_eq!(
        secrets(
            &server,
            &operator,
            &["transit", "verify", "release", "v1.2.4", &signature]
        )
        .code,
        1
    );
    assert_eq!(
        secrets(&server, &operator, &["transit", "sign", "orders", "x"]).code,
        1,
        "aes keys do not sign"
    );
    let keys = json(&ok(
        &server,
        &operator,
        &["transit", "list-keys", "-o", "json"],
    ));
    assert_eq!(keys.as_array().unwrap().len(), 2);
    assert_eq!(keys[0]["min_decryption_version"], 2);
}

// ---- PostgreSQL ----

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn postgres_leases_create_renew_revoke_and_expire() {
    let Some(postgres) = common::postgres::shared() else {
        return;
    };
    let mut server = TestServer::start_with(Options {
        config_yaml: format!(
            "secrets:\n  postgres:\n    url: {}\n    default_ttl: 1m\n    max_ttl: 10m\n",
            postgres.admin_url()
        ),
        ..Options::default()
    });
    let (_, operator) = server.create_key("app", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    assert_eq!(secrets(&server, &readonly, &["creds", "postgres"]).code, 4);

    // A lease is a working login role with a random password.
    let creds = json(&ok(
        &server,
        &operator,
        &["creds", "postgres", "-o", "json"],
    ));
    let user = creds["username"].as_str().unwrap().to_string();
    let password = creds["password"].as_str().unwrap().to_string();
    let lease = creds["lease"]["id"].as_str().unwrap().to_string();
    assert!(lease.starts_with("postgres/creds/"), "{lease}");
    assert!(postgres.can_login(&user, &password));
    assert!(!postgres.can_login(&user, "wrong-password"));
    assert!(
        !server.log().contains(&password),
        "password in the server log"
    );

    // Renew is capped by max_ttl.
    let renewed = json(&ok(
        &server,
        &operator,
        &[
            "leases",
            "renew",
            &lease,
            "--increment",
            "48h",
            "-o",
            "json",
        ],
    ));
    assert_eq!(renewed["expires_at"], renewed["max_expires_at"]);
    let listed = json(&ok(
        &server,
        &operator,
        &["leases", "list", "postgres/", "-o", "json"],
    ));
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(
        json(&ok(
            &server,
            &operator,
            &["leases", "show", &lease, "-o", "json"]
        ))["data"]["username"],
        user.as_str()
    );

    // Revoke drops the role at once.
    ok(&server, &operator, &["leases", "revoke", &lease]);
    assert!(!postgres.role_exists(&user));
    assert!(!postgres.can_login(&user, &password));
    assert_eq!(
        secrets(&server, &operator, &["leases", "renew", &lease]).code,
        5
    );

    // Revoke by prefix.
    let a = json(&ok(
        &server,
        &operator,
        &["creds", "postgres", "-o", "json"],
    ));
    let b = json(&ok(
        &server,
        &operator,
        &["creds", "postgres", "-o", "json"],
    ));
    let revoked = json(&ok(
        &server,
        &operator,
        &[
            "leases",
            "revoke",
            "--prefix",
            "postgres/creds/",
            "-o",
            "json",
        ],
    ));
    assert_eq!(revoked["revoked"], 2);
    for c in [&a, &b] {
        assert!(!postgres.role_exists(c["username"].as_str().unwrap()));
    }

    // Expiry: the reaper drops the role on its own.
    let short = json(&ok(
        &server,
        &operator,
        &["creds", "postgres", "--ttl", "2s", "-o", "json"],
    ));
    let short_user = short["username"].as_str().unwrap().to_string();
    assert!(postgres.role_exists(&short_user));
    wait_until(
        "expired lease's role dropped",
        Duration::from_secs(30),
        || !postgres.role_exists(&short_user),
    );
    assert!(
        json(&ok(&server, &operator, &["leases", "list", "-o", "json"]))
            .as_array()
            .unwrap()
            .is_empty()
    );

    // Expiry survives a restart: a lease that expires while the server is down is revoked
    // when it comes back.
    let down = json(&ok(
        &server,
        &operator,
        &["creds", "postgres", "--ttl", "2s", "-o", "json"],
    ));
    let down_user = down["username"].as_str().unwrap().to_string();
    server.stop_with(libc::SIGKILL);
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        postgres.role_exists(&down_user),
        "nothing revoked it while the server was down"
    );
    server.spawn(&[]);
    wait_until(
        "lease expired during downtime revoked after restart",
        Duration::from_secs(30),
        || !postgres.role_exists(&down_user),
    );

    let audit = run(server.cli("svc-audit").args([
        "--api-key",
        &server.admin_key,
        "log",
        "--action",
        "lease.*",
        "-o",
        "json",
    ]));
    assert!(!audit.stdout.contains(&password));
    let actions: Vec<String> = json(&audit)["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap().to_string())
        .collect();
    assert!(
        actions.contains(&"lease.create".to_string())
            && actions.contains(&"lease.renew".to_string()),
        "{actions:?}"
    );
    let expired_by_server = json(&audit)["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["user"] == "server" && e["detail"]["reason"] == "expired");
    assert!(expired_by_server, "{}", audit.stdout);
}

/// A data dir from before migration 0012 (API keys stored as the SHA-256 that signs file
/// requests, plans in the clear): the next start seals them, and nothing is lost: the old key
/// still signs in and its row then holds neither the signing key nor the plan in the clear.
#[test]
fn rows_from_before_sealing_are_sealed_at_the_next_start() {
    use sha2::{Digest, Sha256};
    let mut server = TestServer::start_sqlite();
    server.stop_with(libc::SIGTERM);
    let old_key = format!("svc_{}", "o".repeat(40));
    let signing = hex::encode(Sha256::digest(old_key.as_bytes()));
    let db_path = server.data_dir.join("svc.db");
    {
        let db = rusqlite::Connection::open(&db_path).unwrap();
        db.execute(
            "INSERT INTO api_keys (id, name, role, key_hash, created_at) \
             VALUES ('legacy', 'legacy', 'operator', ?1, '2026-01-01T00:00:00.000Z')",
            [&signing],
        )
        .unwrap();
        db.execute(
            "INSERT INTO agent_states (agent_id, plan, job_id, applied_by, applied_at) \
             VALUES ('a1', '{\"inline\":{\"resources\":[],\"note\":\"clearvalue\"}}', 'j', \
             'me', '2026-01-01T00:00:00.000Z')",
            [],
        )
        .unwrap();
    }
    server.spawn(&[]);
    let whoami = server.request("GET", "/api/v1/whoami", Some(&old_key), None);
    assert_eq!(whoami.status, 200, "{whoami:?}");
    let db = rusqlite::Connection::open(&db_path).unwrap();
    let (hash, sealed): (String, Option<String>) = db
        .query_row(
            "SELECT key_hash, signing_sealed FROM api_keys WHERE id = 'legacy'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_ne!(hash, signing, "the stored hash is the signing key still");
    assert!(sealed.is_some_and(|s| s.starts_with("sealed:") && !s.contains(&signing)));
    let plan: String = db
        .query_row(
            "SELECT plan FROM agent_states WHERE agent_id = 'a1'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        plan.starts_with("sealed:") && !plan.contains("clearvalue"),
        "{plan}"
    );
}
