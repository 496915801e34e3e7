//! Snapshots end to end: svc-cluster-backup backup from a real server, verify and list without
//! one, the restore drill (a fresh data dir restored, then served by a new server with the
//! same master_key and hmacsecret), and the files a restore or verify must refuse.

mod common;

use std::io::{Read, Write};
use std::path::Path;

use common::agent::Agent;
use common::{json_of, run, Options, Run, TestServer};

const POLICY: &str = "id: watch-secrets\nseverity: high\nrules:\n  - effect: deny\n    actions: [\"secret.read\"]\n    principals: [\"role:readonly\"]\n    resources: [\"secret:prod/*\"]\n";

fn cluster_backup(server: &TestServer, key: &str, args: &[&str]) -> Run {
    run(server
        .cli("svc-cluster-backup")
        .args(["--api-key", key])
        .args(args))
}

fn offline(server: &TestServer, args: &[&str]) -> Run {
    run(server.names.command("svc-cluster-backup").args(args))
}

/// The server's config file with `data_dir` and `policy_dir` moved to `dir` (and, on
/// PostgreSQL, the store to a fresh database).
fn config_for(server: &TestServer, dir: &Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(&server.config_file).unwrap();
    let moved: Vec<String> = text
        .lines()
        .map(|line| {
            if line.starts_with("data_dir:") {
                format!("data_dir: {}", dir.join("data").display())
            } else if line.starts_with("  url:") {
                let postgres = common::postgres::shared().unwrap();
                format!("  url: \"{}\"", postgres.fresh_database())
            } else if line.starts_with("policy_dir:") {
                format!("policy_dir: {}", dir.join("policies").display())
            } else {
                line.to_string()
            }
        })
        .collect();
    let path = dir.join("server.yaml");
    std::fs::write(&path, moved.join("\n") + "\n").unwrap();
    path
}

#[test]
fn restore_drill_keys_secrets_agents_events_and_audit_survive() {
    let scratch = tempfile::tempdir().unwrap();
    let policies = scratch.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("watch.yaml"), POLICY).unwrap();
    let mut server = TestServer::start_with(Options {
        config_yaml: format!("policy_dir: {}\n", policies.display()),
        ..Options::default()
    });
    let admin = server.admin_key.clone();
    let (_, operator) = server.create_key("ops", "operator");
    let put = run(server.cli("svc-secrets").args([
        "--api-key",
        &operator,
        "put",
        "db/prod",
        "password=hunter2",
    ]));
    assert_eq!(put.code, 0, "{put:?}");
    for i in 0..3 {
        let emitted = run(server.cli("svc-events").args([
            "--api-key",
            &operator,
            "emit",
            "--type",
            "command_failed",
            "--source",
            &format!("drill-{i}"),
        ]));
        assert_eq!(emitted.code, 0, "{emitted:?}");
    }
    let mut agent = Agent::new("web-1");
    let enrolled = agent.bootstrap(&server, &["--server", &server.bus]);
    assert_eq!(enrolled.code, 0, "{enrolled:?}");
    agent.stop();

    // Backups: plain and encrypted; neither leaves a temp file on the server.
    let snapshots = scratch.path().join("snapshots");
    std::fs::create_dir_all(&snapshots).unwrap();
    let plain = snapshots.join("drill.tar.gz");
    let taken = cluster_backup(
        &server,
        &admin,
        &["backup", "--output", plain.to_str().unwrap()],
    );
    assert_eq!(taken.code, 0, "{taken:?}");
    let sealed = snapshots.join("drill.svcsnap");
    let encrypted = run(server
        .cli("svc-cluster-backup")
        .env("SVC_BACKUP_PASSPHRASE", "correct horse battery")
        .args(["--api-key", &admin, "backup", "--encrypt", "--output"])
        .arg(&sealed));
    assert_eq!(encrypted.code, 0, "{encrypted:?}");
    let leftovers: Vec<String> = std::fs::read_dir(&server.data_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(!snapshots.join("drill.tar.gz.partial").exists());
    let readonly = server.create_key("viewer", "readonly").1;
    assert_eq!(
        cluster_backup(&server, &readonly, &["backup", "--output", "/dev/null"]).code,
        4
    );
    let audited = common::audit_rows(&server, &["--action", "cluster.backup"]);
    assert!(
        audited.iter().any(|row| row["outcome"] == "success")
            && audited.iter().any(|row| row["outcome"] == "denied"),
        "{audited:?}"
    );

    // Verify and list, no server needed.
    let verified = offline(
        &server,
        &["verify", "--input", plain.to_str().unwrap(), "-o", "json"],
    );
    assert_eq!(verified.code, 0, "{verified:?}");
    let verified = json_of(&verified);
    assert_eq!(verified["valid"], true);
    assert!(verified["audit_rows"].as_u64().unwrap() > 3, "{verified}");
    assert!(verified["streams"]["events"].as_u64().unwrap() >= 3);
    let no_passphrase = offline(&server, &["verify", "--input", sealed.to_str().unwrap()]);
    assert_eq!(no_passphrase.code, 1, "{no_passphrase:?}");
    assert!(
        no_passphrase.stderr.contains("encrypted"),
        "{no_passphrase:?}"
    );
    let wrong = run(server
        .names
        .command("svc-cluster-backup")
        .env("SVC_BACKUP_PASSPHRASE", "wrong")
        .args(["verify", "--input"])
        .arg(&sealed));
    assert_eq!(wrong.code, 1, "{wrong:?}");
    assert!(wrong.stderr.contains("wrong passphrase"), "{wrong:?}");
    let right = run(server
        .names
        .command("svc-cluster-backup")
        .env("SVC_BACKUP_PASSPHRASE", "correct horse battery")
        .args(["verify", "--input"])
        .arg(&sealed));
    assert_eq!(right.code, 0, "{right:?}");
    let listed = offline(
        &server,
        &["list", snapshots.to_str().unwrap(), "-o", "json"],
    );
    assert_eq!(listed.code, 0, "{listed:?}");
    let listed = json_of(&listed);
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    assert_eq!(listed[0]["name"], "drill.svcsnap");
    assert_eq!(listed[0]["valid"], false); // encrypted, no passphrase given
    assert_eq!(listed[1]["name"], "drill.tar.gz");
    assert_eq!(listed[1]["valid"], true);

    // A populated target is refused without --force; a running server without systemd too.
    let own = offline(
        &server,
        &[
            "restore",
            "--input",
            plain.to_str().unwrap(),
            "--config",
            server.config_file.to_str().unwrap(),
        ],
    );
    assert_eq!(own.code, 1, "{own:?}");
    assert!(own.stderr.contains("--force"), "{own:?}");
    let running = offline(
        &server,
        &[
            "restore",
            "--force",
            "--input",
            plain.to_str().unwrap(),
            "--config",
            server.config_file.to_str().unwrap(),
        ],
    );
    assert_eq!(running.code, 3, "{running:?}");
    assert!(running.stderr.contains("server is running"), "{running:?}");
    server.stop_with(libc::SIGTERM);

    // The drill: a fresh data dir (and policy dir), the same master_key and hmacsecret.
    let target = scratch.path().join("restored");
    std::fs::create_dir_all(&target).unwrap();
    let config = config_for(&server, &target);
    let restored = run(server
        .names
        .command("svc-cluster-backup")
        .env("SVC_BACKUP_PASSPHRASE", "correct horse battery")
        .args(["restore", "--input"])
        .arg(&sealed)
        .arg("--config")
        .arg(&config));
    assert_eq!(restored.code, 0, "{restored:?}");
    assert!(
        restored.stdout.contains("audit rows verified"),
        "{restored:?}"
    );
    assert_eq!(
        std::fs::read_to_string(target.join("policies/watch.yaml")).unwrap(),
        POLICY
    );
    server.data_dir = target.join("data");
    server.config_file = config;
    server.spawn(&[]);

    // The same keys authenticate; secrets decrypt; the agent is enrolled; events replay.
    assert_eq!(
        server
            .request("GET", "/api/v1/apikeys", Some(&admin), None)
            .status,
        200
    );
    let secret = run(server.cli("svc-secrets").args([
        "--api-key",
        &operator,
        "get",
        "db/prod",
        "--field",
        "password",
    ]));
    assert_eq!(secret.code, 0, "{secret:?}");
    assert_eq!(secret.stdout, "hunter2\n");
    let agents =
        run(server
            .cli("svcctl")
            .args(["--api-key", &admin, "-o", "json", "agent", "list"]));
    assert!(agents.stdout.contains("web-1"), "{agents:?}");
    let events = run(server.cli("svc-events").args([
        "--api-key",
        &operator,
        "-o",
        "json",
        "list",
        "--type",
        "command_failed",
    ]));
    assert_eq!(events.code, 0, "{events:?}");
    assert_eq!(json_of(&events)["items"].as_array().unwrap().len(), 3);
    let audit = run(server
        .cli("svc-audit")
        .args(["--api-key", &admin, "verify"]));
    assert_eq!(audit.code, 0, "{audit:?}");
    // The restored data dir holds no staging left-overs.
    let leftovers: Vec<String> = std::fs::read_dir(&server.data_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Garbage, a truncated file and a tampered entry: verify exits 1 naming the problem, and a
/// restore of them leaves the target untouched.
#[test]
fn bad_snapshots_are_refused() {
    let server = TestServer::start();
    let scratch = tempfile::tempdir().unwrap();
    let good = scratch.path().join("good.tar.gz");
    let taken = cluster_backup(
        &server,
        &server.admin_key,
        &["backup", "--output", good.to_str().unwrap()],
    );
    assert_eq!(taken.code, 0, "{taken:?}");
    let bytes = std::fs::read(&good).unwrap();

    let garbage = scratch.path().join("garbage.tar.gz");
    std::fs::write(&garbage, b"this is not a snapshot at all").unwrap();
    let truncated = scratch.path().join("truncated.tar.gz");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    // A byte of the store entry changed, the gzip rebuilt so only the manifest can tell.
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(bytes.as_slice())
        .read_to_end(&mut tar)
        .unwrap();
    tar[512 + 2000] ^= 0x01;
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gzip.write_all(&tar).unwrap();
    let tampered = scratch.path().join("tampered.tar.gz");
    std::fs::write(&tampered, gzip.finish().unwrap()).unwrap();

    for (file, expected) in [
        (&garbage, "not a readable snapshot"),
        (&truncated, "snapshot"),
        (&tampered, "does not match the manifest"),
    ] {
        let verified = offline(&server, &["verify", "--input", file.to_str().unwrap()]);
        assert_eq!(verified.code, 1, "{verified:?}");
        assert!(
            verified.stderr.starts_with("svc-cluster-backup: ")
                && verified.stderr.contains(expected),
            "{file:?}: {verified:?}"
        );
        let target = tempfile::tempdir().unwrap();
        let config = target.path().join("server.yaml");
        std::fs::write(
            &config,
            format!(
                "data_dir: {}\nhmacsecret: x\nmaster_key: {}\n",
                target.path().join("data").display(),
                common::random_master_key()
            ),
        )
        .unwrap();
        let restored = offline(
            &server,
            &[
                "restore",
                "--input",
                file.to_str().unwrap(),
                "--config",
                config.to_str().unwrap(),
            ],
        );
        assert_eq!(restored.code, 1, "{restored:?}");
        assert!(!target.path().join("data/svc.db").exists());
    }
    let missing = offline(&server, &["verify", "--input", "/nonexistent.tar.gz"]);
    assert_eq!(missing.code, 5, "{missing:?}");

    // The right file with another master key: refused before anything is replaced.
    let target = tempfile::tempdir().unwrap();
    let config = target.path().join("server.yaml");
    std::fs::write(
        &config,
        format!(
            "data_dir: {}\nhmacsecret: x\nmaster_key: {}\n",
            target.path().join("data").display(),
            common::random_master_key()
        ),
    )
    .unwrap();
    let other_key = offline(
        &server,
        &[
            "restore",
            "--input",
            good.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
    );
    if common::test_store() == common::TestStore::Sqlite {
        assert_eq!(other_key.code, 1, "{other_key:?}");
        assert!(other_key.stderr.contains("master_key"), "{other_key:?}");
    }
    assert!(!target.path().join("data/svc.db").exists());
}

/// svc-backup against moto: create (twice, pruned to one), list, verify, restore into a fresh
/// data dir; no credentials exit 4, a missing bucket exit 5.
#[test]
fn svc_backup_round_trips_through_s3() {
    let Some(moto) = common::moto::Moto::start() else {
        return;
    };
    let mut server = TestServer::start();
    let endpoint = moto.endpoint();
    let s3 = |server: &TestServer, command: &str, extra: &[&str]| -> Run {
        run(server
            .cli("svc-backup")
            .env("AWS_ACCESS_KEY_ID", "test-access")
            .env("AWS_SECRET_ACCESS_KEY", "test-secret")
            .env("AWS_ENDPOINT_URL", &endpoint)
            .args([command, "--s3-ssl", "false", "--bucket", "drill"])
            .args(extra))
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = svc::backup::s3::S3Client::new(
        svc::backup::s3::S3Config::from_lookup_and_flags(
            |name| match name {
                "AWS_ACCESS_KEY_ID" => Some("test-access".into()),
                "AWS_SECRET_ACCESS_KEY" => Some("test-secret".into()),
                _ => None,
            },
            svc::backup::s3::S3Flags {
                endpoint: Some(moto.endpoint()),
                ssl: Some(false),
                ..Default::default()
            },
        )
        .unwrap(),
    )
    .unwrap();
    runtime.block_on(client.create_bucket("drill")).unwrap();

    let admin = server.admin_key.clone();
    let first = s3(&server, "create", &["--api-key", &admin, "-o", "json"]);
    assert_eq!(first.code, 0, "{first:?}");
    std::thread::sleep(std::time::Duration::from_millis(1100)); // a new name (seconds)
    let second = s3(
        &server,
        "create",
        &["--api-key", &admin, "--keep", "1", "-o", "json"],
    );
    assert_eq!(second.code, 0, "{second:?}");
    let second = json_of(&second);
    assert_eq!(second["pruned"].as_array().unwrap().len(), 1, "{second}");
    assert!(!second.to_string().contains("test-secret"));
    let listed = s3(&server, "list", &["-o", "json"]);
    assert_eq!(listed.code, 0, "{listed:?}");
    let listed = json_of(&listed);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let key = listed[0]["key"].as_str().unwrap().to_string();
    assert_eq!(key, second["key"].as_str().unwrap());
    let verified = s3(&server, "verify", &["--key", &key]);
    assert_eq!(verified.code, 0, "{verified:?}");

    server.stop_with(libc::SIGTERM);
    let target = tempfile::tempdir().unwrap();
    let config = config_for(&server, target.path());
    let restored = s3(
        &server,
        "restore",
        &["--key", &key, "--config", config.to_str().unwrap()],
    );
    assert_eq!(restored.code, 0, "{restored:?}");
    server.data_dir = target.path().join("data");
    server.config_file = config;
    server.spawn(&[]);
    assert_eq!(
        server
            .request("GET", "/api/v1/apikeys", Some(&admin), None)
            .status,
        200
    );

    let missing_bucket = run(server
        .cli("svc-backup")
        .env("AWS_ACCESS_KEY_ID", "test-access")
        .env("AWS_SECRET_ACCESS_KEY", "test-secret")
        .env("AWS_ENDPOINT_URL", moto.endpoint())
        .args(["list", "--s3-ssl", "false", "--bucket", "no-such-bucket"]));
    assert_eq!(missing_bucket.code, 5, "{missing_bucket:?}");
    let no_credentials = run(server
        .cli("svc-backup")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .args([
            "list",
            "--bucket",
            "drill",
            "--s3-endpoint",
            &moto.endpoint(),
        ]));
    assert_eq!(no_credentials.code, 4, "{no_credentials:?}");

    // Credentials that are present but wrong: moto checks signatures once its auth is on
    // (POST /moto-api/reset-auth; the body is how many unchecked requests remain).
    let moto_addr: std::net::SocketAddr = moto
        .endpoint()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let auth_on = common::http_request(
        moto_addr,
        "POST",
        "/moto-api/reset-auth",
        &[("Content-Type", "text/plain")],
        Some(b"0"),
    )
    .unwrap();
    assert_eq!(auth_on.status, 200, "{}", auth_on.body);
    let wrong = run(server.cli("svc-backup").args([
        "list",
        "--bucket",
        "drill",
        "--s3-endpoint",
        &moto.endpoint(),
        "--s3-ssl",
        "false",
        "--s3-access-key",
        "AKIAWRONGWRONGWRONG1",
        "--s3-secret-key",
        "wrong-secret-never-printed",
    ]));
    assert_eq!(wrong.code, 4, "{wrong:?}");
    assert!(
        !wrong.stderr.contains("wrong-secret-never-printed"),
        "{wrong:?}"
    );
    assert!(
        !wrong.stdout.contains("wrong-secret-never-printed"),
        "{wrong:?}"
    );
}

/// Stands in for systemctl: the "unit" is a TestServer process, stopped with SIGTERM and
/// spawned again on its (restored) data dir.
struct Unit<'a>(
    std::sync::Mutex<&'a mut TestServer>,
    std::sync::Mutex<Vec<&'static str>>,
);

impl svc::backup::local::ServiceControl for Unit<'_> {
    fn is_active(&self) -> bool {
        self.1.lock().unwrap().push("is-active");
        true
    }
    fn stop(&self) -> svc::Result<()> {
        self.1.lock().unwrap().push("stop");
        self.0.lock().unwrap().stop_with(libc::SIGTERM);
        Ok(())
    }
    fn start(&self) -> svc::Result<()> {
        self.1.lock().unwrap().push("start");
        self.0.lock().unwrap().spawn(&[]);
        Ok(())
    }
}

/// Restoring the data dir of a server that runs under its unit: the restore stops it through
/// the service control, restores, and starts it again; the restarted server serves the
/// snapshot's keys.
#[test]
fn restore_stops_and_starts_a_server_running_under_its_unit() {
    let mut server = TestServer::start();
    let (_, key) = server.create_key("from-snapshot", "readonly");
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("snapshot.tar.gz");
    let taken = cluster_backup(
        &server,
        &server.admin_key.clone(),
        &["backup", "--output", file.to_str().unwrap()],
    );
    assert_eq!(taken.code, 0, "{taken:?}");
    // The same server (same master_key and hmacsecret) moved to an empty data dir: the unit
    // whose data the restore replaces.
    server.stop_with(libc::SIGTERM);
    let target = tempfile::tempdir().unwrap();
    let config = config_for(&server, target.path());
    server.data_dir = target.path().join("data");
    server.config_file = config.clone();
    server.spawn(&[]);
    assert_eq!(
        server
            .request("GET", "/api/v1/apikeys", Some(&key), None)
            .status,
        401,
        "the new data dir does not know the key yet"
    );

    let loaded = svc::config::load_server(Some(&config), &[]).unwrap();
    let unit = Unit(std::sync::Mutex::new(&mut server), Default::default());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let restored = runtime
        .block_on(svc::backup::local::restore(
            &loaded.config,
            &svc::backup::local::RestoreOptions {
                input: &file,
                passphrase: None,
                force: true,
            },
            &unit,
        ))
        .unwrap();
    assert!(restored.restarted_server);
    let calls = unit.1.lock().unwrap().clone();
    assert_eq!(calls, ["is-active", "stop", "start"]);
    drop(unit);
    assert_eq!(
        server
            .request("GET", "/api/v1/apikeys", Some(&key), None)
            .status,
        403,
        "the restored readonly key authenticates (and is refused the admin list)"
    );
}

/// ClusterService/Restore never restores inside a running server: an admin is refused by
/// that rule (FAILED_PRECONDITION, pointing to the offline restore), and the refusal is
/// audited as `denied`, not `error` (contract §9), as a readonly caller's is.
#[test]
fn an_online_restore_is_refused_and_audited_as_denied() {
    let server = TestServer::start();
    let (_, readonly) = server.create_key("restorer", "readonly");
    let codes = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let address = format!("http://{}", server.grpc);
        let mut client = svc::proto::cluster_service_client::ClusterServiceClient::connect(address)
            .await
            .unwrap();
        let mut codes = Vec::new();
        for key in [&server.admin_key, &readonly] {
            let chunks = tokio_stream::iter(vec![svc::proto::SnapshotChunk {
                data: b"not a snapshot".to_vec(),
                force: false,
            }]);
            let refused = client
                .restore(common::with_key(chunks, key))
                .await
                .unwrap_err();
            codes.push((
                refused.code(),
                refused.message().contains("svc-cluster-backup"),
            ));
        }
        codes
    });
    assert_eq!(
        codes,
        [
            (tonic::Code::FailedPrecondition, true),
            (tonic::Code::PermissionDenied, false)
        ]
    );
    let rows = common::audit_rows(&server, &["--action", "cluster.restore"]);
    let outcomes: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r["user"].as_str().unwrap(), r["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(outcomes.len(), 2, "{rows:?}");
    assert!(
        outcomes.iter().all(|(_, outcome)| *outcome == "denied"),
        "{rows:?}"
    );
    assert!(
        outcomes.iter().any(|(user, _)| *user == "restorer"),
        "{rows:?}"
    );
}
