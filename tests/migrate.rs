//! svc-migrate end to end over the real binary: a real server's SQLite store copied into
//! PostgreSQL and served from there (audit chain, secrets, transit, API keys), resume after a
//! kill, the refusals (non-empty target, running server, schema versions) and `--force`,
//! validate, version, progress output, and bad input. The PostgreSQL schema is checked against
//! the table catalogue here too.
//!
//! Tests that need PostgreSQL skip (with a line saying so) when its binaries are missing and
//! CI is not set; `SVC_TEST_PG_URL` points them at an existing server instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{json_of, postgres, run, Names, Run, TestServer};
use svc::store::tables::{ColumnType, TABLES};
use svc::store::AuditRow;

// ---- helpers ----

/// A connection to one database, with a runtime of its own for blocking calls.
struct Db {
    runtime: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Db {
    fn connect(url: &str) -> Db {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .unwrap_or_else(|e| panic!("connect {url}: {e}"));
            tokio::spawn(connection);
            client
        });
        Db { runtime, client }
    }

    fn execute(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        self.runtime.block_on(self.client.batch_execute(sql))
    }

    fn count(&self, table: &str) -> i64 {
        self.runtime
            .block_on(
                self.client
                    .query_one(&format!("SELECT COUNT(*) FROM {table}"), &[]),
            )
            .unwrap()
            .get(0)
    }

    fn rows(&self, sql: &str) -> Vec<tokio_postgres::Row> {
        self.runtime
            .block_on(self.client.query(sql, &[]))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }
}

/// The svc schema in the database at `url`, as a server makes it at start. The connection is
/// named so that it is not taken for a server's (svc-migrate refuses a database an `svc`
/// session uses, and a closed connection's session may linger a moment).
fn apply_migrations(db: &Db, url: &str) {
    let named = format!("{url}?application_name=svc-test");
    db.runtime.block_on(async {
        let target = svc::store::postgres::Target::from_url(&named).unwrap();
        drop(svc::store::PostgresStore::open(&target).await.unwrap());
    });
}

fn migrate(names: &Names, args: &[&str]) -> Run {
    run(names.command("svc-migrate").args(args))
}

fn sqlite_arg(path: &Path) -> String {
    format!("sqlite:{}", path.display())
}

/// A store made by the real migrations, filled by direct inserts: `audit_rows` rows of a valid
/// chain, `secrets` secrets with two versions each, and one row in a few other tables
/// (NULLs included).
fn synthetic_store(dir: &Path, audit_rows: i64, secrets: i64) -> PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let path = data.join("svc.db");
    drop(svc::store::SqliteStore::open(&path).unwrap());
    let mut db = rusqlite::Connection::open(&path).unwrap();
    let tx = db.transaction().unwrap();
    {
        let mut insert = tx.prepare(svc::store::INSERT_AUDIT_SQL).unwrap();
        let mut prev = svc::audit::chain::GENESIS.to_string();
        for seq in 1..=audit_rows {
            let mut row = AuditRow {
                seq,
                id: format!("01M8{seq:022}"),
                timestamp: svc::clock::format_rfc3339(1_790_000_000_000 + seq),
                user: "tester".into(),
                action: "secret.put".into(),
                resource_type: "secret".into(),
                resource_id: format!("app/{seq}"),
                outcome: "success".into(),
                policy_id: (seq % 3 == 0).then(|| "p".to_string()),
                decision: (seq % 3 == 0).then(|| "allow".to_string()),
                severity: "info".into(),
                detail: format!(r#"{{"n":{seq},"note":"é ✓ \"quoted\""}}"#),
                prev_hash: prev,
                hash: String::new(),
            };
            row.hash = svc::audit::chain::seal(&row);
            svc::store::insert_audit_row(&mut insert, &row).unwrap();
            prev = row.hash;
        }
        for i in 0..secrets {
            // Paths whose byte order differs from a locale's (case, punctuation, non-ASCII):
            // resume depends on both stores ordering keys by bytes.
            let path = match i % 4 {
                0 => format!("app/{i}"),
                1 => format!("App/{i}"),
                2 => format!("app-{i}/é"),
                _ => format!("_app/{i}"),
            };
            tx.execute(
                "INSERT INTO secrets VALUES (?1, 'wrapped', 2, '2026-01-01T00:00:00.000Z', '2026-01-02T00:00:00.000Z')",
                [&path],
            )
            .unwrap();
            for version in 1..=2 {
                tx.execute(
                    "INSERT INTO secret_versions VALUES (?1, ?2, 'cipher', '2026-01-01T00:00:00.000Z', NULL, 0)",
                    rusqlite::params![path, version],
                )
                .unwrap();
            }
        }
        tx.execute_batch(
            "INSERT INTO api_keys VALUES ('k1', 'admin', 'admin', 'hash1', '2026-01-01T00:00:00.000Z', NULL, NULL, 'sealed:k1');
             INSERT INTO agents VALUES ('web-01', '{}', 'fp', '2026-01-01T00:00:00.000Z', 1, 'why', NULL, NULL, NULL, NULL);
             INSERT INTO transit_keys VALUES ('k', 'aes256-gcm', 1, 1, 't', 't');
             INSERT INTO transit_key_versions VALUES ('k', 1, 'material', '', 't');",
        )
        .unwrap();
    }
    tx.commit().unwrap();
    drop(db);
    path
}

/// The audit chain read back from PostgreSQL, verified row by row as the server does.
fn verify_chain(db: &Db) -> u64 {
    let rows = db.rows(
        "SELECT seq, id, timestamp, user_id, action, resource_type, resource_id, outcome, \
         policy_id, decision, severity, detail, prev_hash, hash FROM audit_events ORDER BY seq",
    );
    let mut verifier = svc::audit::chain::Verifier::default();
    for row in rows {
        let audit = AuditRow {
            seq: row.get(0),
            id: row.get(1),
            timestamp: row.get(2),
            user: row.get(3),
            action: row.get(4),
            resource_type: row.get(5),
            resource_id: row.get(6),
            outcome: row.get(7),
            policy_id: row.get(8),
            decision: row.get(9),
            severity: row.get(10),
            detail: row.get(11),
            prev_hash: row.get(12),
            hash: row.get(13),
        };
        verifier.check(&audit).unwrap();
    }
    verifier.rows
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

// ---- the schema ----

/// A table as the catalogue spells it: name, columns with types, primary key.
type Shape = (String, Vec<(String, ColumnType)>, Vec<String>);

#[test]
fn catalogue_matches_the_postgres_schema() {
    let Some(pg) = postgres::shared() else {
        return;
    };
    let url = pg.fresh_database();
    let db = Db::connect(&url);
    apply_migrations(&db, &url);
    // cluster_* tables hold the members' live state (docs/cluster.md): never copied.
    let columns = db.rows(
        "SELECT table_name::text, column_name::text, data_type::text, collation_name::text \
         FROM information_schema.columns WHERE table_schema = current_schema() \
         AND table_name <> 'schema_version' AND table_name NOT LIKE 'cluster\\_%' \
         ORDER BY table_name, ordinal_position",
    );
    let keys = db.rows(
        "SELECT tc.table_name::text, kcu.column_name::text \
         FROM information_schema.table_constraints tc \
         JOIN information_schema.key_column_usage kcu \
           ON kcu.constraint_name = tc.constraint_name AND kcu.table_schema = tc.table_schema \
         WHERE tc.constraint_type = 'PRIMARY KEY' AND tc.table_schema = current_schema() \
         AND tc.table_name NOT LIKE 'cluster\\_%' \
         ORDER BY tc.table_name, kcu.ordinal_position",
    );
    let mut schema: Vec<Shape> = Vec::new();
    for row in &columns {
        let (table, column, kind, collation): (String, String, String, Option<String>) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let kind = match kind.as_str() {
            "text" => {
                // Keys and order by bytes, as on SQLite: resuming a copy depends on it.
                assert_eq!(collation.as_deref(), Some("C"), "{table}.{column}");
                ColumnType::Text
            }
            "bigint" => ColumnType::Int,
            other => panic!("{table}.{column}: type {other} has no ColumnType"),
        };
        if schema.last().is_none_or(|t| t.0 != table) {
            schema.push((table.clone(), Vec::new(), Vec::new()));
        }
        schema.last_mut().unwrap().1.push((column, kind));
    }
    for row in &keys {
        let (table, column): (String, String) = (row.get(0), row.get(1));
        if let Some(entry) = schema.iter_mut().find(|t| t.0 == table) {
            entry.2.push(column);
        }
    }
    let mut catalogue: Vec<Shape> = TABLES
        .iter()
        .map(|t| {
            (
                t.name.to_string(),
                t.columns
                    .iter()
                    .map(|c| (c.name.to_string(), c.kind))
                    .collect(),
                t.primary_key.iter().map(|k| k.to_string()).collect(),
            )
        })
        .collect();
    catalogue.sort_by(|a, b| a.0.cmp(&b.0));
    for table in &schema {
        let entry = catalogue
            .iter()
            .find(|entry| entry.0 == table.0)
            .unwrap_or_else(|| panic!("table {} is in PostgreSQL but not in TABLES", table.0));
        assert_eq!(
            table, entry,
            "table {} (PostgreSQL, then catalogue)",
            table.0
        );
    }
    assert_eq!(
        schema.iter().map(|t| &t.0).collect::<Vec<_>>(),
        catalogue.iter().map(|t| &t.0).collect::<Vec<_>>()
    );
}

// ---- a real server's store ----

#[test]
fn a_real_store_copied_to_postgres_serves_the_same_data() {
    let Some(pg) = postgres::shared() else {
        return;
    };
    // On SQLite first, whatever SVC_TEST_STORE says: the store to move is its svc.db.
    let mut server = TestServer::start_sqlite();
    let admin = server.admin_key.clone();
    let (_, operator) = server.create_key("ops", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    let secrets = |server: &TestServer, key: &str, args: &[&str]| {
        let result = run(server
            .cli("svc-secrets")
            .arg("--api-key")
            .arg(key)
            .args(args));
        assert_eq!(result.code, 0, "{args:?}: {result:?}");
        result.stdout
    };
    secrets(
        &server,
        &operator,
        &["put", "db/prod", "user=app", "password=one"],
    );
    secrets(
        &server,
        &operator,
        &["put", "db/prod", "user=app", "password=two"],
    );
    secrets(&server, &operator, &["transit", "create-key", "k"]);
    let sealed = secrets(&server, &operator, &["transit", "encrypt", "k", "payload"]);
    let token = json_of(&run(server.cli("svc-identity").args([
        "--api-key",
        &admin,
        "-o",
        "json",
        "token",
        "create",
    ])));
    let token_id = token["id"].as_str().unwrap().to_string();
    let verify = |server: &TestServer| {
        let result =
            run(server
                .cli("svc-audit")
                .args(["--api-key", &admin, "-o", "json", "verify"]));
        assert_eq!(result.code, 0, "{result:?}");
        json_of(&result)["rows"].as_u64().unwrap()
    };
    let audited = verify(&server);
    let log_before = common::audit_rows(&server, &["--limit", "100"]);
    assert!(audited >= 7, "{audited} audit rows");
    server.stop_with(libc::SIGTERM);

    let source = server.data_dir.join("svc.db");
    let files_before = files_in(&server.data_dir);
    let url = pg.fresh_database();
    let copied = migrate(
        &server.names,
        &[
            "run",
            "--from",
            &sqlite_arg(&source),
            "--to",
            &url,
            "-o",
            "json",
        ],
    );
    assert_eq!(copied.code, 0, "{copied:?}");
    let summary = json_of(&copied);
    let audit = summary["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["table"] == "audit_events")
        .unwrap();
    assert_eq!(audit["rows"], audited);
    assert_eq!(summary["resumed"], false);
    // Off a terminal: one plain line per table on stderr, no bar.
    assert!(
        copied.stderr.contains("svc-migrate: audit_events: ") && !copied.stderr.contains('\r'),
        "{copied:?}"
    );
    // Read-only, and nothing was created beside the file (no -wal or -shm owned by us).
    assert_eq!(files_in(&server.data_dir), files_before);
    let validated = migrate(
        &server.names,
        &["validate", "--from", &sqlite_arg(&source), "--to", &url],
    );
    assert_eq!(validated.code, 0, "{validated:?}");
    assert!(validated.stdout.contains("They match"), "{validated:?}");

    // The same server configuration on PostgreSQL; the SQLite file moves away, so everything
    // served now comes from the copy.
    std::fs::rename(&source, server.data_dir.join("svc.db.migrated")).unwrap();
    let mut config = std::fs::read_to_string(&server.config_file).unwrap();
    config.push_str(&format!("store:\n  driver: postgres\n  url: \"{url}\"\n"));
    std::fs::write(&server.config_file, config).unwrap();
    server.spawn(&[]);
    assert!(
        !server.data_dir.join("svc.db").exists(),
        "the server is on PostgreSQL"
    );

    assert!(verify(&server) >= audited);
    let log_after = common::audit_rows(&server, &["--limit", "100"]);
    for row in &log_before {
        assert!(
            log_after.contains(row),
            "audit row not identical after the copy: {row}"
        );
    }
    let password = secrets(
        &server,
        &operator,
        &["get", "db/prod", "--field", "password"],
    );
    assert_eq!(password, "two\n");
    let first = secrets(
        &server,
        &operator,
        &["get", "db/prod", "--version", "1", "--field", "password"],
    );
    assert_eq!(first, "one\n");
    let opened = secrets(
        &server,
        &operator,
        &["transit", "decrypt", "k", sealed.trim()],
    );
    assert_eq!(opened.trim(), "payload");
    let tokens =
        run(server
            .cli("svc-identity")
            .args(["--api-key", &admin, "-o", "json", "token", "list"]));
    assert!(tokens.stdout.contains(&token_id), "{tokens:?}");
    // Every key still authenticates, with its role; a made-up one does not.
    let log = run(server
        .cli("svc-audit")
        .args(["--api-key", &readonly, "log", "--limit", "1"]));
    assert_eq!(log.code, 0, "{log:?}");
    let denied = run(server
        .cli("svc-secrets")
        .args(["--api-key", &readonly, "get", "db/prod"]));
    assert_eq!(denied.code, 4, "{denied:?}");
    let bogus = format!("svc_{}", "x".repeat(40));
    let unknown = run(server
        .cli("svc-audit")
        .args(["--api-key", &bogus, "verify"]));
    assert_eq!(unknown.code, 4, "{unknown:?}");

    // While that server uses the database, even --force refuses to touch it.
    let elsewhere = tempfile::tempdir().unwrap();
    let copy = elsewhere.path().join("svc.db");
    std::fs::copy(server.data_dir.join("svc.db.migrated"), &copy).unwrap();
    let refused = migrate(
        &server.names,
        &["run", "--force", "--from", &sqlite_arg(&copy), "--to", &url],
    );
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(
        refused.stderr.contains("session(s) of an svc server"),
        "{refused:?}"
    );
}

#[test]
fn a_running_server_locks_its_store() {
    let names = Names::new();
    let server = TestServer::start_sqlite();
    // Checked before PostgreSQL is contacted: no database is needed to see it.
    let refused = migrate(
        &names,
        &[
            "run",
            "--from",
            &sqlite_arg(&server.data_dir.join("svc.db")),
            "--to",
            "postgres://u:secret@127.0.0.1:1/db",
        ],
    );
    assert_eq!(refused.code, 1, "{refused:?}");
    assert_eq!(
        refused.stderr.trim_end(),
        format!(
            "svc-migrate: a server is running on {} ({} is locked): stop it before copying its store",
            server.data_dir.display(),
            server.data_dir.join("server.lock").display()
        )
    );
}

// ---- resume, refusals, --force ----

#[test]
fn a_killed_copy_resumes_where_it_stopped_without_duplicates() {
    let Some(pg) = postgres::shared() else {
        return;
    };
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let source = synthetic_store(dir.path(), 150_000, 2_000);
    let url = pg.fresh_database();
    let db = Db::connect(&url);
    let args = [
        "run",
        "--from",
        &sqlite_arg(&source),
        "--to",
        &url,
        "--batch-rows",
        "1000",
        "-o",
        "json",
    ];
    let mut child = names
        .command("svc-migrate")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once some batches of audit_events are in, mid-table (most likely mid-COPY).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let present = db
            .rows("SELECT to_regclass('audit_events') IS NOT NULL")
            .first()
            .is_some_and(|row| row.get::<_, bool>(0))
            && db.count("audit_events") >= 5_000;
        if present {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "finished before it could be killed"
        );
        assert!(Instant::now() < deadline, "no rows copied in time");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let partial = db.count("audit_events");
    assert!(partial < 150_000, "the copy was over before the kill");
    assert_eq!(db.count("secrets"), 0);
    // Whole batches only: what is there is a prefix of the chain.
    assert_eq!(partial % 1000, 0, "{partial} rows: a batch was cut");
    assert_eq!(verify_chain(&db), partial as u64);

    // Validate sees the unfinished copy.
    let validated = migrate(
        &names,
        &["validate", "--from", &sqlite_arg(&source), "--to", &url],
    );
    assert_eq!(validated.code, 1, "{validated:?}");
    assert!(
        validated.stdout.contains("unfinished copy"),
        "{validated:?}"
    );

    let resumed = migrate(&names, &args);
    assert_eq!(resumed.code, 0, "{resumed:?}");
    let summary = json_of(&resumed);
    assert_eq!(summary["resumed"], true);
    let audit = &summary["tables"][1];
    assert_eq!(audit["table"], "audit_events");
    assert_eq!(audit["resumed_rows"], partial);
    assert_eq!(audit["rows"], 150_000 - partial);
    assert_eq!(db.count("audit_events"), 150_000);
    assert_eq!(db.count("secret_versions"), 4_000);
    assert_eq!(verify_chain(&db), 150_000);
    let validated = migrate(
        &names,
        &[
            "validate",
            "--from",
            &sqlite_arg(&source),
            "--to",
            &url,
            "-o",
            "json",
        ],
    );
    assert_eq!(validated.code, 0, "{validated:?}");
    assert_eq!(json_of(&validated)["match"], true);
    assert_eq!(json_of(&validated)["copy_state"], "done");
}

#[test]
fn other_rows_in_the_target_are_refused_unless_forced() {
    let Some(pg) = postgres::shared() else {
        return;
    };
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let source = synthetic_store(dir.path(), 50, 10);
    let from = sqlite_arg(&source);

    // Someone else's rows: a server's store.
    let url = pg.fresh_database();
    let db = Db::connect(&url);
    apply_migrations(&db, &url);
    db.execute(
        "INSERT INTO api_keys VALUES ('theirs', 'n', 'admin', 'h', 't', NULL, NULL, NULL);
         INSERT INTO audit_events VALUES (1, 'a1', 't', 'u', 'x', 'r', 'i', 'success', NULL, NULL, 'info', '{}', 'p', 'h')",
    )
    .unwrap();
    let refused = migrate(&names, &["run", "--from", &from, "--to", &url]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(
        refused
            .stderr
            .contains("is not empty: api_keys (1), audit_events (1)"),
        "{refused:?}"
    );
    assert!(refused.stderr.contains("--force empties it"), "{refused:?}");
    assert_eq!(db.count("api_keys"), 1, "nothing changed");

    let forced = migrate(&names, &["run", "--force", "--from", &from, "--to", &url]);
    assert_eq!(forced.code, 0, "{forced:?}");
    assert!(
        forced.stdout.contains("emptied first (--force)"),
        "{forced:?}"
    );
    assert!(db
        .rows("SELECT 1 FROM api_keys WHERE id = 'theirs'")
        .is_empty());
    assert_eq!(verify_chain(&db), 50);
    // The append-only guard is back once the copy committed.
    let error = db.execute("TRUNCATE audit_events").unwrap_err();
    assert!(format!("{error:?}").contains("append-only"), "{error:?}");
    assert!(db.execute("DELETE FROM audit_events").is_err());

    // A finished copy is not redone without --force either.
    let again = migrate(&names, &["run", "--from", &from, "--to", &url]);
    assert_eq!(again.code, 1, "{again:?}");
    assert!(
        again.stderr.contains("already holds a finished copy of"),
        "{again:?}"
    );

    // An unfinished copy resumes only from its own, unchanged source.
    db.execute("UPDATE svc_migrate SET state = 'copying'")
        .unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let other = synthetic_store(other_dir.path(), 50, 10);
    let foreign = migrate(
        &names,
        &["run", "--from", &sqlite_arg(&other), "--to", &url],
    );
    assert_eq!(foreign.code, 1, "{foreign:?}");
    assert!(
        foreign.stderr.contains("unfinished copy of another source"),
        "{foreign:?}"
    );
    let changed = rusqlite::Connection::open(&source).unwrap();
    changed
        .execute(
            "INSERT INTO api_keys VALUES ('k2', 'n', 'readonly', 'h2', 't', NULL, NULL, NULL)",
            [],
        )
        .unwrap();
    drop(changed);
    let stale = migrate(&names, &["run", "--from", &from, "--to", &url]);
    assert_eq!(stale.code, 1, "{stale:?}");
    assert!(stale.stderr.contains("the source has changed"), "{stale:?}");
    let forced = migrate(&names, &["run", "--force", "--from", &from, "--to", &url]);
    assert_eq!(forced.code, 0, "{forced:?}");
    assert_eq!(db.count("api_keys"), 2);

    // One copy at a time into a database.
    // COPY_LOCK in src/store/copy.rs (0x7376_6300_0101).
    db.execute("SELECT pg_advisory_lock(126952304279809)")
        .unwrap();
    let busy = migrate(&names, &["run", "--force", "--from", &from, "--to", &url]);
    assert_eq!(busy.code, 1, "{busy:?}");
    assert!(
        busy.stderr.contains("another svc-migrate is copying into"),
        "{busy:?}"
    );
    db.execute("SELECT pg_advisory_unlock_all()").unwrap();

    // A target newer than the binary is left alone, --force or not.
    let latest = svc::store::MIGRATIONS.last().unwrap().0;
    db.execute(&format!(
        "INSERT INTO schema_version VALUES ({}, 'future', 't')",
        latest + 1
    ))
    .unwrap();
    let newer = migrate(&names, &["run", "--force", "--from", &from, "--to", &url]);
    assert_eq!(newer.code, 1, "{newer:?}");
    assert!(
        newer.stderr.contains(&format!(
            "is at schema version {}, newer than this binary's {latest}",
            latest + 1
        )),
        "{newer:?}"
    );
    assert_eq!(db.count("api_keys"), 2, "nothing changed");
}

/// The highest migration below the latest: versions may have gaps while branches that add
/// migrations are merged in any order.
fn previous_version() -> i64 {
    let migrations = svc::store::MIGRATIONS;
    migrations[migrations.len() - 2].0
}

#[test]
fn a_source_at_another_schema_version_is_refused() {
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let source = synthetic_store(dir.path(), 3, 0);
    let latest = svc::store::MIGRATIONS.last().unwrap().0;
    let to = "postgres://u:secret@127.0.0.1:1/db";
    let db = rusqlite::Connection::open(&source).unwrap();
    db.execute("DELETE FROM schema_version WHERE version = ?1", [latest])
        .unwrap();
    let older = migrate(&names, &["run", "--from", &sqlite_arg(&source), "--to", to]);
    assert_eq!(older.code, 1, "{older:?}");
    assert!(
        older
            .stderr
            .contains(&format!("is at schema version {}", previous_version()))
            && older.stderr.contains(&format!("this binary's is {latest}"))
            && older
                .stderr
                .contains("start this release's svc-server on it once"),
        "{older:?}"
    );
    db.execute(
        "INSERT INTO schema_version VALUES (?1, 'x', 't'), (?2, 'future', 't')",
        [latest, latest + 1],
    )
    .unwrap();
    let newer = migrate(&names, &["run", "--from", &sqlite_arg(&source), "--to", to]);
    assert_eq!(newer.code, 1, "{newer:?}");
    assert!(
        newer
            .stderr
            .contains(&format!("is at schema version {}", latest + 1))
            && newer.stderr.contains("written by a newer svc"),
        "{newer:?}"
    );
}

// ---- validate, version ----

#[test]
fn validate_names_what_differs() {
    let Some(pg) = postgres::shared() else {
        return;
    };
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let source = synthetic_store(dir.path(), 20, 5);
    let from = sqlite_arg(&source);
    let url = pg.fresh_database();

    // Nothing copied yet: every non-empty table and the head differ, the schema is missing.
    let empty = migrate(&names, &["validate", "--from", &from, "--to", &url]);
    assert_eq!(empty.code, 1, "{empty:?}");
    assert!(empty.stdout.contains("missing"), "{empty:?}");

    assert_eq!(
        migrate(&names, &["run", "--from", &from, "--to", &url]).code,
        0
    );
    let db = Db::connect(&url);
    db.execute(
        "INSERT INTO api_keys VALUES ('extra', 'n', 'admin', 'h-extra', 't', NULL, NULL, NULL);
         INSERT INTO audit_events SELECT seq + 1, id || 'x', timestamp, user_id, action,
           resource_type, resource_id, outcome, policy_id, decision, severity, detail, hash, 'h'
           FROM audit_events WHERE seq = 20",
    )
    .unwrap();
    let table = migrate(&names, &["validate", "--from", &from, "--to", &url]);
    assert_eq!(table.code, 1, "{table:?}");
    let line = |name: &str| {
        table
            .stdout
            .lines()
            .find(|line| line.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} line: {table:?}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(line("api_keys"), ["api_keys", "1", "2", "DIFFERS"]);
    assert_eq!(
        line("audit_events"),
        ["audit_events", "20", "21", "DIFFERS"]
    );
    assert_eq!(line("secrets "), ["secrets", "5", "5", "ok"]);
    assert_eq!(*line("(audit head)").last().unwrap(), "DIFFERS");
    assert_eq!(
        table.stderr.trim_end(),
        "svc-migrate: the target differs from the source: api_keys, audit_events, audit head"
    );

    let json = migrate(
        &names,
        &["-o", "json", "validate", "--from", &from, "--to", &url],
    );
    assert_eq!(json.code, 1, "{json:?}");
    let document = json_of(&json);
    assert_eq!(document["match"], false);
    assert_eq!(document["audit_head_match"], false);
    assert_eq!(document["source_audit_head"]["seq"], 20);
    assert_eq!(document["target_audit_head"]["seq"], 21);
    let api_keys = &document["tables"][0];
    assert_eq!(
        (
            &api_keys["table"],
            &api_keys["source"],
            &api_keys["target"],
            &api_keys["match"]
        ),
        (
            &serde_json::json!("api_keys"),
            &serde_json::json!(1),
            &serde_json::json!(2),
            &serde_json::json!(false)
        )
    );
}

#[test]
fn version_prints_the_binary_and_store_versions() {
    let names = Names::new();
    let latest = svc::store::MIGRATIONS.last().unwrap().0;
    let binary = migrate(&names, &["version"]);
    assert_eq!(binary.code, 0, "{binary:?}");
    assert_eq!(
        binary.stdout,
        format!("this binary: schema version {latest}\n")
    );

    let dir = tempfile::tempdir().unwrap();
    let source = synthetic_store(dir.path(), 1, 0);
    let same = migrate(
        &names,
        &["version", "--store", &sqlite_arg(&source), "-o", "json"],
    );
    assert_eq!(same.code, 0, "{same:?}");
    let document = json_of(&same);
    assert_eq!(document["binary"], latest);
    assert_eq!(document["store"]["schema_version"], latest);
    assert_eq!(document["match"], true);

    let db = rusqlite::Connection::open(&source).unwrap();
    db.execute("DELETE FROM schema_version WHERE version = ?1", [latest])
        .unwrap();
    let older = migrate(&names, &["version", "--store", &sqlite_arg(&source)]);
    assert_eq!(older.code, 0, "{older:?}");
    assert!(
        older
            .stdout
            .contains(&format!("schema version {}", previous_version()))
            && older
                .stdout
                .contains("note: the store is older than this binary"),
        "{older:?}"
    );

    if let Some(pg) = postgres::shared() {
        let url = pg.fresh_database();
        let empty = migrate(&names, &["version", "--store", &url]);
        assert_eq!(empty.code, 0, "{empty:?}");
        assert!(empty.stdout.contains("/svc_test_"), "{empty:?}");
        assert!(empty.stdout.contains(": schema version 0\n"), "{empty:?}");
        assert!(
            !empty.stdout.contains("admin-pw"),
            "password shown: {empty:?}"
        );
    }
}

// ---- progress on a terminal ----

#[test]
fn a_terminal_gets_a_progress_bar() {
    let Some(pg) = postgres::shared() else {
        return;
    };
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let source = synthetic_store(dir.path(), 2_000, 10);
    let url = pg.fresh_database();
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills two descriptors; no other memory is passed.
    let opened = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(opened, 0);
    use std::os::fd::FromRawFd;
    // SAFETY: both descriptors were just opened and are owned here alone.
    let (master, slave) = unsafe {
        (
            std::fs::File::from_raw_fd(master),
            std::os::fd::OwnedFd::from_raw_fd(slave),
        )
    };
    let child = names
        .command("svc-migrate")
        .args(["run", "--from", &sqlite_arg(&source), "--to", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    // Read while it runs (a full pty would block it): what was written, until the last
    // slave descriptor closes (then EIO).
    let reader = std::thread::spawn(move || {
        let mut drawn = Vec::new();
        let _ = std::io::Read::read_to_end(&mut &master, &mut drawn);
        drawn
    });
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let drawn = reader.join().unwrap();
    let drawn = String::from_utf8_lossy(&drawn);
    assert!(
        drawn.contains(&format!(
            "\raudit_events (2/{})",
            svc::store::tables::TABLES.len()
        )) && drawn.contains("] 2000/2000 rows"),
        "{drawn:?}"
    );
    // The bar is erased at the end; the summary is on stdout.
    assert!(drawn.ends_with("\r\x1b[K"), "{drawn:?}");
    assert!(!drawn.contains("svc-migrate: audit_events:"), "{drawn:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("TABLE"));
}

// ---- bad input ----

#[test]
fn bad_input_is_refused_clearly() {
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let not_a_database = dir.path().join("notes.txt");
    std::fs::write(
        &not_a_database,
        "hello, this is not SQLite at all, not even close\n",
    )
    .unwrap();
    let empty_sqlite = dir.path().join("empty.db");
    rusqlite::Connection::open(&empty_sqlite)
        .unwrap()
        .execute_batch("CREATE TABLE t (x)")
        .unwrap();
    let store_dir = tempfile::tempdir().unwrap();
    let store = synthetic_store(store_dir.path(), 1, 0);
    let unreachable = "postgres://svc:hunter2secret@127.0.0.1:1/svc";
    let cases: Vec<(Vec<String>, i32, String)> = vec![
        (vec![], 2, "svc-migrate: missing command".into()),
        (
            vec!["copy".into()],
            2,
            "svc-migrate: unknown command 'copy'".into(),
        ),
        (
            vec!["run".into(), "--to".into(), unreachable.into()],
            2,
            "Required options not provided".into(),
        ),
        (
            vec![
                "run".into(),
                "--from".into(),
                "/var/lib/svc/svc.db".into(),
                "--to".into(),
                unreachable.into(),
            ],
            2,
            "--from must be sqlite:PATH".into(),
        ),
        (
            vec![
                "run".into(),
                "--from".into(),
                unreachable.into(),
                "--to".into(),
                unreachable.into(),
            ],
            2,
            "svc-migrate copies from SQLite to PostgreSQL".into(),
        ),
        (
            vec![
                "run".into(),
                "--from".into(),
                sqlite_arg(&store),
                "--to".into(),
                "mysql://u:hunter2secret@h/db".into(),
            ],
            2,
            "--to must be a PostgreSQL URL".into(),
        ),
        (
            vec![
                "run".into(),
                "--from".into(),
                sqlite_arg(&store),
                "--to".into(),
                "postgres://u:hunter2secret@h/db?sslmode=maybe".into(),
            ],
            2,
            "--to: sslmode: 'maybe' is not one of".into(),
        ),
        (
            vec![
                "run".into(),
                "--from".into(),
                sqlite_arg(&store),
                "--to".into(),
                unreachable.into(),
                "--batch-rows".into(),
                "0".into(),
            ],
            2,
            "--batch-rows must be at least 1".into(),
        ),
        (
            vec![
                "run".into(),
                "--from".into(),
                "sqlite:/nonexistent/svc.db".into(),
                "--to".into(),
                unreachable.into(),
            ],
            5,
            "svc-migrate: /nonexistent/svc.db: no such file".into(),
        ),
        (
            vec![
                "run".into(),
                "--from".into(),
                sqlite_arg(&not_a_database),
                "--to".into(),
                unreachable.into(),
            ],
            1,
            "not a SQLite database".into(),
        ),
        (
            vec![
                "run".into(),
                "--from".into(),
                sqlite_arg(&empty_sqlite),
                "--to".into(),
                unreachable.into(),
            ],
            1,
            "not an svc store (it has no schema_version table)".into(),
        ),
        (
            vec![
                "run".into(),
                "--from".into(),
                sqlite_arg(&store),
                "--to".into(),
                unreachable.into(),
            ],
            3,
            "svc-migrate: cannot connect to PostgreSQL at 127.0.0.1:1/svc".into(),
        ),
        (
            vec![
                "validate".into(),
                "--from".into(),
                sqlite_arg(&store),
                "--to".into(),
                unreachable.into(),
            ],
            3,
            "cannot connect to PostgreSQL at 127.0.0.1:1/svc".into(),
        ),
        (
            vec!["version".into(), "--store".into(), unreachable.into()],
            3,
            "cannot connect to PostgreSQL at 127.0.0.1:1/svc".into(),
        ),
        (
            vec!["version".into(), "--store".into(), "mysql://x".into()],
            2,
            "--store must be sqlite:PATH or postgres://".into(),
        ),
        (
            vec![
                "version".into(),
                "--store".into(),
                "sqlite:/nonexistent/svc.db".into(),
            ],
            5,
            "no such file".into(),
        ),
        (
            vec!["-o".into(), "yaml".into(), "version".into()],
            2,
            "unknown output format 'yaml'".into(),
        ),
    ];
    for (args, code, message) in cases {
        let result = run(names.command("svc-migrate").args(&args));
        assert_eq!(result.code, code, "{args:?}: {result:?}");
        assert!(result.stderr.contains(&message), "{args:?}: {result:?}");
        assert!(
            result.stderr.starts_with("svc-migrate"),
            "{args:?}: {result:?}"
        );
        assert!(
            !result.stderr.contains("hunter2secret"),
            "password shown: {result:?}"
        );
        assert!(result.stdout.is_empty(), "{args:?}: {result:?}");
    }
    // A PGPASSWORD is used, and not shown either.
    let result = run(names
        .command("svc-migrate")
        .env("PGPASSWORD", "hunter2secret")
        .args(["version", "--store", "postgres://svc@127.0.0.1:1/svc"]));
    assert_eq!(result.code, 3, "{result:?}");
    assert!(!result.stderr.contains("hunter2secret"), "{result:?}");

    for command in ["run", "validate", "version"] {
        let help = migrate(&names, &[command, "--help"]);
        assert_eq!(help.code, 0, "{help:?}");
        assert!(
            help.stdout
                .starts_with(&format!("Usage: svc-migrate {command}")),
            "{help:?}"
        );
    }
    let help = migrate(&names, &["--help"]);
    assert!(help.stdout.contains("Commands:\n  run"), "{help:?}");
}
