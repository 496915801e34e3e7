//! svc-migrate benchmark: a SQLite store of 1,000,000 audit rows (a valid hash chain),
//! 100,000 secrets and 200,000 secret versions, copied into a throwaway PostgreSQL by the real
//! `svc-migrate run` (the binary cargo built for this bench); and, as the reference in the
//! same run, the transport's own ceiling: the same rows, already in memory, sent with one raw
//! `COPY ... FROM STDIN (FORMAT binary)` per table, in one transaction, into scratch tables of
//! the same shape (`LIKE ... INCLUDING ALL`: the same indexes and constraints, plus
//! secret_versions' foreign key).
//!
//! Usage: cargo bench --bench migrate [-- --audit-rows N --secrets N] (CI runs
//! `--audit-rows 2000 --secrets 200` on the debug build). Without PostgreSQL's binaries (and no
//! `SVC_BENCH_PG_URL`) it is skipped, or fails when `CI` is set.
//! `SVC_BENCH_PG_URL=postgres://user:pw@host:port/db` uses that server (it creates and drops
//! a database `mig_bench` there) instead of starting a cluster with initdb/pg_ctl.
//! `SVC_BENCH_SERVER=/path/to/svc` runs another build of svc-migrate.
//!
//! The cluster keeps PostgreSQL's durable defaults (fsync on): every batch commit is a real
//! commit, for ours and the ceiling alike. Everything shares the machine: svc-migrate's reader
//! thread, its COPY feeder and the PostgreSQL backend.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::SinkExt;
use svc::store::tables::{self, ColumnType};
use svc::store::AuditRow;

#[path = "common/run.rs"]
mod run;

const GOAL_ROWS_PER_SECOND: f64 = 50_000.0;
const VERSIONS_PER_SECRET: i64 = 2;
const TABLES: [&str; 3] = ["audit_events", "secrets", "secret_versions"];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: i64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let audit_rows = flag("--audit-rows", 1_000_000);
    let secrets = flag("--secrets", 100_000);
    if std::env::var_os("SVC_BENCH_PG_URL").is_none() && find_postgres().is_none() {
        run::missing_peer(
            "PostgreSQL (initdb, pg_ctl)",
            "apt-get install postgresql, or set SVC_BENCH_PG_URL",
            "the migrate bench",
        );
        return;
    }

    let work = tempfile::tempdir().unwrap();
    let source = work.path().join("data").join("svc.db");
    std::fs::create_dir_all(source.parent().unwrap()).unwrap();
    let started = Instant::now();
    build_source(&source, audit_rows, secrets);
    let size = std::fs::metadata(&source).unwrap().len();
    println!(
        "source: {audit_rows} audit rows, {secrets} secrets, {} versions; {:.0} MiB SQLite, built in {:.1} s",
        secrets * VERSIONS_PER_SECRET,
        size as f64 / (1 << 20) as f64,
        started.elapsed().as_secs_f64()
    );

    let postgres = Postgres::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = runtime.block_on(postgres.fresh_database("mig_bench"));

    // Ours: the real binary, end to end (process start, target migrations, copy, checks).
    let binary = std::env::var_os("SVC_BENCH_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_svc").into());
    let started = Instant::now();
    let output = Command::new(&binary)
        .args(["migrate", "run", "-o", "json", "--from"])
        .arg(format!("sqlite:{}", source.display()))
        .args(["--to", &url])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let wall = started.elapsed().as_secs_f64();
    assert!(output.status.success(), "svc-migrate run failed");
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();

    // The ceiling: the same rows from memory, one COPY per table.
    let ceiling = runtime.block_on(ceiling(&source, &url));

    let total_rows = summary["rows"].as_f64().unwrap();
    let ours_overall = total_rows / wall;
    println!();
    println!(
        "{:<16} {:>10} {:>14} {:>16} {:>7}",
        "table", "rows", "ours rows/s", "ceiling rows/s", "ratio"
    );
    let mut ceiling_seconds = 0.0;
    for table in TABLES {
        let ours = summary["tables"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["table"] == table)
            .unwrap();
        let (rows, seconds) = ceiling
            .iter()
            .find(|c| c.0 == table)
            .map(|c| (c.1, c.2))
            .unwrap();
        ceiling_seconds += seconds;
        let ours_rate = ours["rows_per_second"].as_f64().unwrap();
        let ceiling_rate = rows as f64 / seconds;
        println!(
            "{table:<16} {rows:>10} {ours_rate:>14.0} {ceiling_rate:>16.0} {:>7.2}",
            ours_rate / ceiling_rate
        );
    }
    let ceiling_overall = total_rows / ceiling_seconds;
    println!(
        "{:<16} {:>10.0} {:>14.0} {:>16.0} {:>7.2}",
        "overall",
        total_rows,
        ours_overall,
        ceiling_overall,
        ours_overall / ceiling_overall
    );
    println!(
        "\nours overall: wall time of the svc-migrate process ({wall:.2} s: start, target \
         migrations, copy, final checks); per table: the copy itself as svc-migrate reports it."
    );
    println!(
        "goal >= {GOAL_ROWS_PER_SECOND:.0} rows/s: {}",
        if ours_overall >= GOAL_ROWS_PER_SECOND {
            "met"
        } else {
            "NOT met"
        }
    );
    drop(postgres);
}

// ---- the source ----

/// A store made by the real migrations, then filled with direct inserts in one transaction.
fn build_source(path: &Path, audit_rows: i64, secrets: i64) {
    drop(svc::store::SqliteStore::open(path).unwrap());
    let mut db = rusqlite::Connection::open(path).unwrap();
    db.pragma_update(None, "synchronous", "OFF").unwrap();
    let tx = db.transaction().unwrap();
    let base_millis: i64 = 1_790_000_000_000;
    let b64 = base64::engine::general_purpose::STANDARD;
    {
        let mut insert = tx.prepare(svc::store::INSERT_AUDIT_SQL).unwrap();
        let actions = ["secret.put", "secret.get", "apikey.create", "exec"];
        let mut prev = svc::audit::chain::GENESIS.to_string();
        for seq in 1..=audit_rows {
            let millis = base_millis + seq;
            let action = actions[(seq % 4) as usize];
            let mut row = AuditRow {
                seq,
                id: ulid_at(millis, seq),
                timestamp: svc::clock::format_rfc3339(millis),
                user: "01M8AKEYBENCHADMIN00000000".into(),
                action: action.into(),
                resource_type: action.split('.').next().unwrap().into(),
                resource_id: format!("app/{:06}/db", seq % 100_000),
                outcome: "success".into(),
                policy_id: (seq % 10 == 0).then(|| "pci-secrets".to_string()),
                decision: (seq % 10 == 0).then(|| "allow".to_string()),
                severity: "info".into(),
                detail: format!(
                    r#"{{"path":"app/{:06}/db","version":{},"remote":"10.0.{}.{}"}}"#,
                    seq % 100_000,
                    seq % 7,
                    seq % 256,
                    seq % 200
                ),
                prev_hash: prev,
                hash: String::new(),
            };
            row.hash = svc::audit::chain::seal(&row);
            svc::store::insert_audit_row(&mut insert, &row).unwrap();
            prev = row.hash;
        }
        let mut secret = tx
            .prepare(
                "INSERT INTO secrets (path, wrapped_key, current_version, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .unwrap();
        let mut version = tx
            .prepare(
                "INSERT INTO secret_versions (path, version, ciphertext, created_at, deleted_at, \
                 destroyed) VALUES (?1, ?2, ?3, ?4, NULL, 0)",
            )
            .unwrap();
        for i in 0..secrets {
            let path = format!("app/{i:06}/db");
            let at = svc::clock::format_rfc3339(base_millis + i);
            // Sizes as the engine writes them: a 60-byte wrapped key, ~100-byte ciphertexts.
            let wrapped = b64.encode(pseudo_random(i, 60));
            secret
                .execute(rusqlite::params![
                    path,
                    wrapped,
                    VERSIONS_PER_SECRET,
                    at,
                    at
                ])
                .unwrap();
            for v in 1..=VERSIONS_PER_SECRET {
                let ciphertext = b64.encode(pseudo_random(i * 10 + v, 100));
                version
                    .execute(rusqlite::params![path, v, ciphertext, at])
                    .unwrap();
            }
        }
    }
    tx.commit().unwrap();
    // As a stopped server leaves it: everything in the main file, no WAL.
    db.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
}

/// A ULID-shaped id, unique per `n`, sorting by time as real ones do.
fn ulid_at(millis: i64, n: i64) -> String {
    const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let value = ((millis as u128) << 80) | (n as u128);
    (0..26)
        .map(|i| CROCKFORD[((value >> (5 * (25 - i))) & 31) as usize] as char)
        .collect()
}

fn pseudo_random(seed: i64, len: usize) -> Vec<u8> {
    let mut state = (seed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

// ---- the ceiling ----

enum Field {
    Null,
    Int(i64),
    Text(String),
}

/// Loads each table's rows into memory, then times one binary COPY of them into a scratch
/// table of the same shape. Returns (table, rows, seconds).
async fn ceiling(source: &Path, url: &str) -> Vec<(&'static str, u64, f64)> {
    let db = rusqlite::Connection::open(source).unwrap();
    let target = svc::store::postgres::Target::from_url(url).unwrap();
    let client = target.connect().await.unwrap();
    let mut results = Vec::new();
    for name in TABLES {
        let table = tables::find(name).unwrap();
        let mut rows: Vec<Vec<Field>> = Vec::new();
        let mut statement = db
            .prepare(&format!("SELECT {} FROM {name}", table.column_list()))
            .unwrap();
        let mut cursor = statement.query([]).unwrap();
        while let Some(row) = cursor.next().unwrap() {
            let mut fields = Vec::with_capacity(table.columns.len());
            for (i, column) in table.columns.iter().enumerate() {
                fields.push(match (column.kind, row.get_ref(i).unwrap()) {
                    (_, rusqlite::types::ValueRef::Null) => Field::Null,
                    (ColumnType::Int, value) => Field::Int(value.as_i64().unwrap()),
                    (ColumnType::Text, value) => Field::Text(value.as_str().unwrap().into()),
                });
            }
            rows.push(fields);
        }
        let scratch = format!("ceiling_{name}");
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {scratch}; CREATE TABLE {scratch} (LIKE {name} INCLUDING ALL)"
            ))
            .await
            .unwrap();
        // LIKE copies no foreign key; the real secret_versions checks each row's parent in
        // secrets (filled by the copy just before), so the scratch table does too.
        if name == "secret_versions" {
            client
                .batch_execute(&format!(
                    "ALTER TABLE {scratch} ADD FOREIGN KEY (path) REFERENCES secrets (path)"
                ))
                .await
                .unwrap();
        }
        let started = Instant::now();
        client.batch_execute("BEGIN").await.unwrap();
        let sink = client
            .copy_in::<_, Bytes>(&format!(
                "COPY {scratch} ({}) FROM STDIN (FORMAT binary)",
                table.column_list()
            ))
            .await
            .unwrap();
        let mut sink = Box::pin(sink);
        // Encoded into 1 MiB messages: the cheapest way through the client library.
        let mut buffer = BytesMut::with_capacity(2 << 20);
        buffer.put_slice(b"PGCOPY\n\xff\r\n\0");
        buffer.put_i32(0);
        buffer.put_i32(0);
        for row in &rows {
            buffer.put_i16(row.len() as i16);
            for field in row {
                match field {
                    Field::Null => buffer.put_i32(-1),
                    Field::Int(n) => {
                        buffer.put_i32(8);
                        buffer.put_i64(*n);
                    }
                    Field::Text(text) => {
                        buffer.put_i32(text.len() as i32);
                        buffer.put_slice(text.as_bytes());
                    }
                }
            }
            if buffer.len() >= 1 << 20 {
                sink.send(buffer.split().freeze()).await.unwrap();
            }
        }
        buffer.put_i16(-1);
        sink.send(buffer.split().freeze()).await.unwrap();
        let copied = sink.as_mut().finish().await.unwrap();
        client.batch_execute("COMMIT").await.unwrap();
        let seconds = started.elapsed().as_secs_f64();
        assert_eq!(copied, rows.len() as u64);
        client
            .batch_execute(&format!("DROP TABLE {scratch}"))
            .await
            .unwrap();
        results.push((name, copied, seconds));
    }
    results
}

// ---- PostgreSQL ----

/// A throwaway cluster (initdb/pg_ctl in a temp dir, run as `nobody` when root, since
/// postgres refuses root) or the server `SVC_BENCH_PG_URL` names.
struct Postgres {
    admin_url: String,
    cluster: Option<(PathBuf, tempfile::TempDir, bool)>,
}

const PASSWORD: &str = "bench-pw";

impl Postgres {
    fn start() -> Postgres {
        if let Ok(url) = std::env::var("SVC_BENCH_PG_URL") {
            return Postgres {
                admin_url: url,
                cluster: None,
            };
        }
        let bin = find_postgres().expect(
            "PostgreSQL binaries (initdb, pg_ctl) not found: install postgresql or set SVC_BENCH_PG_URL",
        );
        let dir = tempfile::tempdir().unwrap();
        let as_nobody = unsafe { libc::geteuid() } == 0;
        std::fs::write(dir.path().join("pw"), PASSWORD).unwrap();
        if as_nobody {
            assert!(Command::new("chown")
                .args(["-R", "nobody"])
                .arg(dir.path())
                .status()
                .unwrap()
                .success());
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let data = dir.path().join("data");
        let run = |tool: &str, args: &[&str]| {
            let program = bin.join(tool);
            let mut command = if as_nobody {
                let mut c = Command::new("runuser");
                c.args(["-u", "nobody", "--"]).arg(&program);
                c
            } else {
                Command::new(&program)
            };
            let output = command.args(args).current_dir(dir.path()).output().unwrap();
            assert!(
                output.status.success(),
                "{tool}: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        };
        run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=scram-sha-256",
                &format!("--pwfile={}", dir.path().join("pw").display()),
                "-E",
                "UTF8",
            ],
        );
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1",
            dir.path().display()
        );
        run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-l",
                dir.path().join("log").to_str().unwrap(),
                "-o",
                &options,
                "-w",
                "start",
            ],
        );
        Postgres {
            admin_url: format!("postgres://postgres:{PASSWORD}@127.0.0.1:{port}/postgres"),
            cluster: Some((bin, dir, as_nobody)),
        }
    }

    /// Drops and creates `name`; returns its URL.
    async fn fresh_database(&self, name: &str) -> String {
        let target = svc::store::postgres::Target::from_url(&self.admin_url).unwrap();
        let client = target.connect().await.unwrap();
        client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .await
            .unwrap();
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let (base, query) = self
            .admin_url
            .split_once('?')
            .map(|(b, q)| (b, format!("?{q}")))
            .unwrap_or((&self.admin_url, String::new()));
        let (server, _) = base.rsplit_once('/').unwrap();
        format!("{server}/{name}{query}")
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some((bin, dir, as_nobody)) = &self.cluster {
            let program = bin.join("pg_ctl");
            let mut command = if *as_nobody {
                let mut c = Command::new("runuser");
                c.args(["-u", "nobody", "--"]).arg(&program);
                c
            } else {
                Command::new(&program)
            };
            let _ = command
                .args(["-D", dir.path().join("data").to_str().unwrap()])
                .args(["-m", "immediate", "stop"])
                .output();
        }
    }
}

fn find_postgres() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dirs| dirs.flatten().map(|d| d.path().join("bin")).collect())
        .unwrap_or_default();
    candidates.sort();
    candidates.reverse();
    candidates.push(PathBuf::from("/usr/local/bin"));
    candidates.push(PathBuf::from("/usr/bin"));
    candidates
        .into_iter()
        .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
}
