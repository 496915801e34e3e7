//! svc-migrate's engine: copies a SQLite store into PostgreSQL, compares the two, and reads
//! schema versions. The CLI (`cli/migrate.rs`) parses flags and prints; everything that
//! touches a database is here.
//!
//! The copy walks `tables::TABLES` (parents first) and streams each table in primary-key
//! order with `COPY ... FROM STDIN (FORMAT binary)`, one transaction per batch of rows. A
//! reader thread pulls rows out of SQLite and encodes them while the async side feeds
//! PostgreSQL, so the two databases work at the same time. Since every batch commits a prefix
//! of the table in key order, an interrupted copy resumes each table after the largest key
//! already in the target and never inserts a row twice.
//!
//! Whose rows are in the target is recorded in a one-row `svc_migrate` table there: the
//! source file, a fingerprint of it (row counts and the audit chain's head at the start) and
//! the state (`copying`, then `done`). A re-run resumes only its own unfinished copy of an
//! unchanged source; any other rows make it refuse unless `--force` (which empties the target
//! first).

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::SinkExt;
use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, OpenFlags};
use serde::Serialize;

use super::postgres::{schema_version_of, Target};
use super::tables::{ColumnType, Table, TABLES};
use super::{PostgresStore, MIGRATIONS};
use crate::{percent, Error, Result};

/// This binary's schema version: the last migration it carries.
pub fn binary_schema_version() -> i64 {
    MIGRATIONS
        .last()
        .map(|(version, _, _)| *version)
        .unwrap_or(0)
}

/// The session advisory lock a copy holds on the target, so two runs never copy into one
/// database at once ("svc" in ASCII, then a number; postgres.rs uses 1 and 2).
const COPY_LOCK: i64 = 0x7376_6300_0101;

/// The `application_name` svc-server's connections carry unless its URL sets another: a
/// session with it on the target database means a server is using it.
const SERVER_APPLICATION: &str = "svc";

/// Rows per transaction unless `--batch-rows` says otherwise: large enough that commits cost
/// little next to the rows, small enough that an interruption loses seconds of work at most.
pub const DEFAULT_BATCH_ROWS: u64 = 10_000;

/// A batch also ends past this many encoded bytes, so a table of large rows (CA certificates,
/// big secrets) does not hold one huge transaction.
const BATCH_BYTES: usize = 64 << 20;

/// Bytes of encoded rows per message from the reader thread to the COPY.
const CHUNK_BYTES: usize = 1 << 20;

// ---------------------------------------------------------------------------------------------
// The source: a SQLite file, read-only.

/// A SQLite store opened read-only, inside one read transaction so that everything read from
/// it (fingerprint, counts, rows) comes from the same snapshot.
pub struct Source {
    /// The file's canonical path (what the target records).
    pub path: PathBuf,
    connection: Connection,
    /// A shared `flock` on the data dir's `server.lock`, held for the copy, so a server
    /// cannot start on the source while it is read (its exclusive lock fails).
    _lock: Option<std::fs::File>,
}

impl Source {
    /// Opens `path` read-only (a directory means its `svc.db`). With `require_stopped`, first
    /// refuses when a server holds the data dir's lock, and holds a shared lock until dropped.
    ///
    /// Nothing is created beside the file when no server has it open: SQLite would otherwise
    /// make `-wal` and `-shm` files there, owned by whoever runs this (root, often), which the
    /// server's user could then not write. So the file is opened `immutable` (no WAL, no
    /// locks), which is safe because no server can write it meanwhile, unless a `-wal` with
    /// content is there (a server that crashed): its committed rows are read through it.
    pub fn open(path: &Path, require_stopped: bool) -> Result<Source> {
        let mut path = absolute(path)?;
        if path.is_dir() {
            path = path.join("svc.db");
        }
        if !path.is_file() {
            return Err(Error::NotFound(format!(
                "{}: no such file (give the server's svc.db, e.g. sqlite:/var/lib/svc/svc.db)",
                path.display()
            )));
        }
        // Through symlinks: the lock to check is beside the real file, and one file reached
        // by two paths is one source to the ownership record.
        let path = std::fs::canonicalize(&path)?;
        let lock = lock_source(&path)?;
        let server_running = matches!(lock, Lock::ServerRunning(_));
        if let (Lock::ServerRunning(message), true) = (&lock, require_stopped) {
            return Err(Error::Conflict(message.clone()));
        }
        let mut wal = path.clone().into_os_string();
        wal.push("-wal");
        let wal_has_rows = std::fs::metadata(&wal).is_ok_and(|wal| wal.len() > 0);
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let opened = if server_running || wal_has_rows {
            // A running server's -wal and -shm exist already; so do a crashed one's.
            Connection::open_with_flags(&path, flags)
        } else {
            Connection::open_with_flags(
                format!("file:{}?immutable=1", uri_escape(&path)),
                flags | OpenFlags::SQLITE_OPEN_URI,
            )
        };
        let connection =
            opened.map_err(|e| Error::Invalid(format!("{}: cannot open: {e}", path.display())))?;
        let is_store: rusqlite::Result<bool> = connection.query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version')",
            [],
            |row| row.get(0),
        );
        match is_store {
            Ok(true) => {}
            Ok(false) => {
                return Err(Error::Invalid(format!(
                    "{}: not an svc store (it has no schema_version table)",
                    path.display()
                )))
            }
            Err(e) => {
                return Err(Error::Invalid(format!(
                    "{}: not a SQLite database ({e})",
                    path.display()
                )))
            }
        }
        connection
            .execute_batch("BEGIN")
            .map_err(|e| sqlite_error(&path, e))?;
        Ok(Source {
            path,
            connection,
            _lock: match lock {
                Lock::Shared(file) => Some(file),
                _ => None,
            },
        })
    }

    /// The migrations applied to the source, in order.
    pub fn applied_versions(&self) -> Result<Vec<i64>> {
        let mut statement = self
            .connection
            .prepare("SELECT version FROM schema_version ORDER BY version")
            .map_err(|e| sqlite_error(&self.path, e))?;
        let versions = statement
            .query_map([], |row| row.get(0))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<i64>>>())
            .map_err(|e| sqlite_error(&self.path, e))?;
        Ok(versions)
    }

    /// The highest applied migration (0: none).
    pub fn schema_version(&self) -> Result<i64> {
        Ok(self.applied_versions()?.last().copied().unwrap_or(0))
    }

    /// Row counts by table, and the audit chain's head.
    pub fn fingerprint(&self) -> Result<Fingerprint> {
        let mut counts = BTreeMap::new();
        for table in TABLES {
            let count: i64 = self
                .connection
                .query_row(&format!("SELECT COUNT(*) FROM {}", table.name), [], |row| {
                    row.get(0)
                })
                .map_err(|e| sqlite_error(&self.path, e))?;
            counts.insert(table.name.to_string(), count);
        }
        let audit_head = self
            .connection
            .query_row(
                "SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1",
                [],
                |row| {
                    Ok(AuditHead {
                        seq: row.get(0)?,
                        hash: row.get(1)?,
                    })
                },
            )
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                other => Err(sqlite_error(&self.path, other)),
            })?;
        Ok(Fingerprint { counts, audit_head })
    }

    /// Refuses a source whose migrations are not exactly this binary's.
    fn check_schema(&self) -> Result<i64> {
        let applied = self.applied_versions()?;
        let ours: Vec<i64> = MIGRATIONS.iter().map(|(version, _, _)| *version).collect();
        if applied == ours {
            return Ok(binary_schema_version());
        }
        let theirs = applied.last().copied().unwrap_or(0);
        let binary = binary_schema_version();
        let advice = if theirs > binary || applied.iter().any(|v| !ours.contains(v)) {
            "it was written by a newer svc: use the svc-migrate of that release"
        } else {
            "start this release's svc-server on it once (it applies the missing migrations), \
             stop it, then run svc-migrate again"
        };
        Err(Error::FailedPrecondition(format!(
            "the source {} is at schema version {theirs} (migrations {applied:?}), this \
             binary's is {binary} (migrations {ours:?}): {advice}",
            self.path.display()
        )))
    }
}

fn absolute(path: &Path) -> Result<PathBuf> {
    if path.as_os_str().is_empty() {
        return Err(Error::Invalid("the SQLite path is empty".into()));
    }
    Ok(std::path::absolute(path)?)
}

fn sqlite_error(path: &Path, error: rusqlite::Error) -> Error {
    Error::Internal(format!("sqlite {}: {error}", path.display()))
}

/// The data dir's lock (`server.lock` beside the file: an exclusive `flock` while
/// svc-server runs), as this run found it.
enum Lock {
    /// Taken shared: a server started meanwhile fails to take its own lock.
    Shared(std::fs::File),
    /// No lock file: no server has run in this directory since it was made.
    Absent,
    /// A server holds it (the message says so).
    ServerRunning(String),
}

/// Takes a shared lock on the data dir's `server.lock`, opened read-only and never created.
fn lock_source(database: &Path) -> Result<Lock> {
    let lock_path = database
        .parent()
        .map(|dir| dir.join(crate::datadir::LOCK_FILE))
        .unwrap_or_else(|| PathBuf::from(crate::datadir::LOCK_FILE));
    let file = match std::fs::File::open(&lock_path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Lock::Absent),
        Err(e) => {
            return Err(Error::Internal(format!(
                "cannot open {} to check that no server is running: {e}",
                lock_path.display()
            )))
        }
    };
    // SAFETY: flock on a descriptor this function owns; no memory is involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(Lock::ServerRunning(format!(
                "a server is running on {} ({} is locked): stop it before copying its store",
                lock_path.parent().unwrap_or(Path::new(".")).display(),
                lock_path.display()
            )));
        }
        return Err(Error::Internal(format!(
            "cannot lock {}: {error}",
            lock_path.display()
        )));
    }
    Ok(Lock::Shared(file))
}

/// A path for a `file:` URI: `%`, `?` and `#` (and non-ASCII bytes) percent-encoded.
fn uri_escape(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    percent::encode(path.as_os_str().as_bytes(), |byte| {
        byte.is_ascii() && !byte.is_ascii_control() && !matches!(byte, b'%' | b'?' | b'#')
    })
}

/// The last row of the audit chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct AuditHead {
    pub seq: i64,
    pub hash: String,
}

/// What identifies the state of a source cheaply: row counts by table and the audit head.
/// A copy records it at its start; a re-run resumes only if the source still has it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Fingerprint {
    pub counts: BTreeMap<String, i64>,
    pub audit_head: Option<AuditHead>,
}

impl Fingerprint {
    fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a fingerprint always serializes")
    }
}

// ---------------------------------------------------------------------------------------------
// The target: PostgreSQL.

/// The target for `url`, its connections named `svc-migrate` (unless the URL names them), so
/// they are told apart from a server's in `pg_stat_activity`.
pub fn target_from_url(url: &str) -> Result<Target> {
    let named = url.split_once('?').is_some_and(|(_, query)| {
        query
            .split('&')
            .any(|pair| pair.starts_with("application_name="))
    });
    if named {
        return Target::from_url(url);
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    Target::from_url(&format!("{url}{separator}application_name=svc-migrate"))
}

/// Whether `table` exists in the target (on the connection's search path).
async fn table_exists(client: &tokio_postgres::Client, table: &str) -> Result<bool> {
    Ok(client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await?
        .try_get(0)?)
}

/// Row counts of the catalogue's tables in the target; None for a table that does not exist.
async fn target_counts(
    client: &tokio_postgres::Client,
) -> Result<Vec<(&'static Table, Option<i64>)>> {
    let mut counts = Vec::new();
    for table in TABLES {
        let count = if table_exists(client, table.name).await? {
            let count: i64 = client
                .query_one(&format!("SELECT COUNT(*) FROM {}", table.name), &[])
                .await?
                .try_get(0)?;
            Some(count)
        } else {
            None
        };
        counts.push((table, count));
    }
    Ok(counts)
}

async fn target_audit_head(client: &tokio_postgres::Client) -> Result<Option<AuditHead>> {
    if !table_exists(client, "audit_events").await? {
        return Ok(None);
    }
    let row = client
        .query_opt(
            "SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1",
            &[],
        )
        .await?;
    Ok(match row {
        Some(row) => Some(AuditHead {
            seq: row.try_get(0)?,
            hash: row.try_get(1)?,
        }),
        None => None,
    })
}

/// The copy's record in the target (`svc_migrate`, one row).
#[derive(Clone, Debug)]
struct Record {
    source: String,
    fingerprint: String,
    state: String,
    started_at: String,
}

const RECORD_TABLE: &str = "CREATE TABLE IF NOT EXISTS svc_migrate (
    id             BIGINT PRIMARY KEY CHECK (id = 1),
    source         TEXT NOT NULL,
    fingerprint    TEXT NOT NULL,
    state          TEXT NOT NULL,
    schema_version BIGINT NOT NULL,
    started_at     TEXT NOT NULL,
    finished_at    TEXT
)";

async fn read_record(client: &tokio_postgres::Client) -> Result<Option<Record>> {
    if !table_exists(client, "svc_migrate").await? {
        return Ok(None);
    }
    let row = client
        .query_opt(
            "SELECT source, fingerprint, state, started_at FROM svc_migrate WHERE id = 1",
            &[],
        )
        .await?;
    Ok(match row {
        Some(row) => Some(Record {
            source: row.try_get(0)?,
            fingerprint: row.try_get(1)?,
            state: row.try_get(2)?,
            started_at: row.try_get(3)?,
        }),
        None => None,
    })
}

/// Refuses when an svc-server seems to be using the target: a session on the same database
/// with svc-server's application name. Best effort (a server with no pooled connection open
/// at the moment is not seen), but it catches the usual mistake of migrating into a live
/// database.
async fn refuse_if_served(client: &tokio_postgres::Client, target: &Target) -> Result<()> {
    // client_addr is NULL for a Unix socket, and for other roles' sessions unless we may read
    // all statistics; application_name is visible either way. A server stopped a moment ago
    // may leave sessions for as long as their backends take to notice: wait a few seconds.
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    let sessions = loop {
        let sessions = client
            .query(
                "SELECT host(client_addr) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid() \
                 AND application_name = $1",
                &[&SERVER_APPLICATION],
            )
            .await?;
        if sessions.is_empty() || Instant::now() >= deadline {
            break sessions;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    if let Some(first) = sessions.first() {
        let from = match first.try_get::<_, Option<String>>(0)? {
            Some(address) => format!(", from {address}"),
            None => String::new(),
        };
        return Err(Error::Conflict(format!(
            "{} has {} session(s) of an svc server (application_name '{SERVER_APPLICATION}'{from}): \
             stop the servers that use it first",
            target.shown(),
            sessions.len()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// run

/// How to run a copy.
#[derive(Clone, Debug)]
pub struct CopyOptions {
    /// Empty a target that holds other rows (or a finished or foreign copy) first.
    pub force: bool,
    /// Rows per transaction.
    pub batch_rows: u64,
}

/// What the copy reports as it goes, for a progress display.
#[derive(Clone, Debug)]
pub enum Progress<'a> {
    /// A table starts: `present` rows are already in the target (an earlier run), `total`
    /// in the source.
    Table {
        table: &'a str,
        present: u64,
        total: u64,
    },
    /// `copied` rows of the table so far in this run (committed or in the open batch).
    Rows { table: &'a str, copied: u64 },
    /// The table is done.
    TableDone {
        table: &'a str,
        copied: u64,
        seconds: f64,
    },
}

#[derive(Clone, Debug, Serialize)]
pub struct TableSummary {
    pub table: String,
    /// Rows copied by this run.
    pub rows: u64,
    /// Rows already in the target from an earlier, interrupted run.
    pub resumed_rows: u64,
    pub seconds: f64,
    pub rows_per_second: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct CopySummary {
    pub source: String,
    pub target: String,
    pub schema_version: i64,
    /// Whether this run continued an interrupted copy.
    pub resumed: bool,
    /// Whether `--force` emptied a non-empty target first.
    pub emptied_target: bool,
    pub tables: Vec<TableSummary>,
    pub rows: u64,
    pub seconds: f64,
    pub rows_per_second: f64,
}

fn rate(rows: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        (rows as f64 / seconds).round()
    } else {
        0.0
    }
}

/// What to do with the target, given what it holds.
enum Plan {
    Fresh,
    Resume,
    Empty,
}

/// Copies `source` into `target`. See the module's documentation for the protocol.
pub async fn run(
    source: Source,
    target: &Target,
    options: &CopyOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<CopySummary> {
    let started = Instant::now();
    let schema_version = source.check_schema()?;
    let fingerprint = source.fingerprint()?;
    let source_name = source.path.display().to_string();
    let client = target.connect().await?;
    if !take_copy_lock(&client).await? {
        return Err(Error::Conflict(format!(
            "another svc-migrate is copying into {} right now",
            target.shown()
        )));
    }
    let target_version = schema_version_of(&client).await?;
    if target_version > schema_version {
        return Err(Error::FailedPrecondition(format!(
            "the target {} is at schema version {target_version}, newer than this binary's \
             {schema_version}: use the svc-migrate of the release that wrote it",
            target.shown()
        )));
    }
    refuse_if_served(&client, target).await?;

    let plan = decide(&client, target, &source_name, &fingerprint, options.force).await?;
    // The target's migrations, as svc-server would apply them (under their advisory lock).
    drop(PostgresStore::open(target).await?);
    client.batch_execute(RECORD_TABLE).await?;
    let now = crate::clock::now_rfc3339();
    let record_sql =
        "INSERT INTO svc_migrate (id, source, fingerprint, state, schema_version, started_at) \
         VALUES (1, $1, $2, 'copying', $3, $4) \
         ON CONFLICT (id) DO UPDATE SET source = $1, fingerprint = $2, state = 'copying', \
         schema_version = $3, started_at = $4, finished_at = NULL";
    let fingerprint_json = fingerprint.to_json();
    match plan {
        Plan::Fresh => {
            client
                .execute(
                    record_sql,
                    &[&source_name, &fingerprint_json, &schema_version, &now],
                )
                .await?;
        }
        Plan::Empty => {
            // One transaction: the rows go and the new record arrives together, or nothing
            // changes. audit_events refuses TRUNCATE through a trigger (append-only); it is
            // disabled inside this transaction only (ALTER TABLE is transactional, and its
            // ACCESS EXCLUSIVE lock keeps every other session out until COMMIT), so no one
            // ever sees the table unguarded.
            let names: Vec<&str> = TABLES.iter().map(|table| table.name).collect();
            let emptied = client
                .batch_execute(&format!(
                    "BEGIN; SET LOCAL lock_timeout = '10s'; \
                     ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_truncate; \
                     TRUNCATE {}; \
                     ALTER TABLE audit_events ENABLE TRIGGER audit_events_no_truncate;",
                    names.join(", ")
                ))
                .await;
            if let Err(e) = emptied {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(Error::Internal(format!(
                    "cannot empty the target {} (the tables' owner can): {}",
                    target.shown(),
                    message_of(&Error::from(e))
                )));
            }
            let recorded = client
                .execute(
                    record_sql,
                    &[&source_name, &fingerprint_json, &schema_version, &now],
                )
                .await;
            match recorded {
                Ok(_) => client.batch_execute("COMMIT").await?,
                Err(e) => {
                    let _ = client.batch_execute("ROLLBACK").await;
                    return Err(e.into());
                }
            }
        }
        Plan::Resume => {}
    }

    // Batches commit without waiting for their WAL to reach the disk: a commit then costs no
    // fsync. A PostgreSQL crash may lose the last batches, but recovery always ends on a
    // prefix of the commits, which the resume logic handles like an interruption; and the
    // final "done" commit is synchronous, which makes every batch before it durable first.
    client.batch_execute("SET synchronous_commit = off").await?;
    let mut summaries = Vec::new();
    let mut start_keys = Vec::new();
    let mut present = Vec::new();
    for table in TABLES {
        let count: i64 = client
            .query_one(&format!("SELECT COUNT(*) FROM {}", table.name), &[])
            .await?
            .try_get(0)?;
        present.push(count as u64);
        start_keys.push(last_key(&client, table).await?);
    }
    let mut reader = Reader::spawn(source, start_keys, options.batch_rows)?;
    let mut copy = Copier {
        client: &client,
        batch_rows: options.batch_rows,
    };
    for (index, table) in TABLES.iter().enumerate() {
        let total = fingerprint.counts.get(table.name).copied().unwrap_or(0) as u64;
        progress(Progress::Table {
            table: table.name,
            present: present[index],
            total,
        });
        let table_started = Instant::now();
        let copied = copy
            .table(table, &mut reader, progress)
            .await
            .map_err(|e| with_context(e, &format!("copying {}", table.name)))?;
        let seconds = table_started.elapsed().as_secs_f64();
        progress(Progress::TableDone {
            table: table.name,
            copied,
            seconds,
        });
        summaries.push(TableSummary {
            table: table.name.to_string(),
            rows: copied,
            resumed_rows: present[index],
            seconds,
            rows_per_second: rate(copied, seconds),
        });
    }
    reader.join()?;

    // The target must now hold exactly the source's rows; anything else means another writer.
    let counts = target_counts(&client).await?;
    for (table, count) in &counts {
        let expected = fingerprint.counts.get(table.name).copied().unwrap_or(0);
        if *count != Some(expected) {
            return Err(Error::Internal(format!(
                "after the copy {}.{} has {} rows but the source has {expected}: something \
                 else wrote to the target; find it, then run again with --force",
                target.shown(),
                table.name,
                count.unwrap_or(0)
            )));
        }
    }
    let head = target_audit_head(&client).await?;
    if head != fingerprint.audit_head {
        return Err(Error::Internal(format!(
            "after the copy the target's audit chain ends at {head:?}, the source's at {:?}",
            fingerprint.audit_head
        )));
    }
    client.batch_execute("SET synchronous_commit = on").await?;
    client
        .execute(
            "UPDATE svc_migrate SET state = 'done', finished_at = $1 WHERE id = 1",
            &[&crate::clock::now_rfc3339()],
        )
        .await?;
    // Planner statistics now, not when autovacuum gets round to it: without them PostgreSQL
    // planned the audit log query over 200,000 fresh rows at 11 ms instead of 3.5 ms.
    client.batch_execute("ANALYZE").await?;
    let rows = summaries.iter().map(|s| s.rows).sum();
    let seconds = started.elapsed().as_secs_f64();
    Ok(CopySummary {
        source: source_name,
        target: target.shown().to_string(),
        schema_version,
        resumed: matches!(plan, Plan::Resume),
        emptied_target: matches!(plan, Plan::Empty),
        tables: summaries,
        rows,
        seconds,
        rows_per_second: rate(rows, seconds),
    })
}

/// Takes the copy's advisory lock, waiting a few seconds for it: the session of a run that just
/// ended (killed, or finished a moment ago) holds it until its backend notices.
async fn take_copy_lock(client: &tokio_postgres::Client) -> Result<bool> {
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let locked: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&COPY_LOCK])
            .await?
            .try_get(0)?;
        if locked || Instant::now() >= deadline {
            return Ok(locked);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Fresh, resume, empty first, or refuse, from the target's rows and its `svc_migrate` record.
async fn decide(
    client: &tokio_postgres::Client,
    target: &Target,
    source_name: &str,
    fingerprint: &Fingerprint,
    force: bool,
) -> Result<Plan> {
    let counts = target_counts(client).await?;
    let occupied: Vec<String> = counts
        .iter()
        .filter_map(|(table, count)| match count {
            Some(count) if *count > 0 => Some(format!("{} ({count})", table.name)),
            _ => None,
        })
        .collect();
    // An empty target is fresh whatever a record says (a run killed before its first batch).
    if occupied.is_empty() {
        return Ok(Plan::Fresh);
    }
    let record = read_record(client).await?;
    let refusal = match &record {
        Some(record) if record.state == "copying" && record.source == source_name => {
            if record.fingerprint == fingerprint.to_json() {
                return Ok(Plan::Resume);
            }
            format!(
                "{} holds an unfinished copy of {source_name} started {}, but the source has \
                 changed since (row counts or audit head differ: did a server run on it?)",
                target.shown(),
                record.started_at
            )
        }
        Some(record) if record.state == "copying" => format!(
            "{} holds an unfinished copy of another source ({}, started {})",
            target.shown(),
            record.source,
            record.started_at
        ),
        Some(record) => format!(
            "{} already holds a finished copy of {} (started {})",
            target.shown(),
            record.source,
            record.started_at
        ),
        None => format!(
            "{} is not empty: {} (a server may be using it)",
            target.shown(),
            occupied.join(", ")
        ),
    };
    if force {
        return Ok(Plan::Empty);
    }
    Err(Error::Conflict(format!(
        "{refusal}; --force empties it (every row of the svc tables, audit log included) and \
         copies again"
    )))
}

/// The largest primary key of `table` in the target, as SQLite values to resume after.
async fn last_key(client: &tokio_postgres::Client, table: &Table) -> Result<Option<Vec<Value>>> {
    let key = table.primary_key.join(", ");
    let descending: Vec<String> = table
        .primary_key
        .iter()
        .map(|column| format!("{column} DESC"))
        .collect();
    let row = client
        .query_opt(
            &format!(
                "SELECT {key} FROM {} ORDER BY {} LIMIT 1",
                table.name,
                descending.join(", ")
            ),
            &[],
        )
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let mut values = Vec::new();
    for (index, column) in table.key_columns().iter().enumerate() {
        values.push(match column.kind {
            ColumnType::Int => Value::Integer(row.try_get(index)?),
            ColumnType::Text => Value::Text(row.try_get(index)?),
        });
    }
    Ok(Some(values))
}

/// An error's whole message: for `Internal`, its cause (`Display` says only "internal
/// error", which is right for a server's callers but useless to the operator running a copy).
pub fn message_of(error: &Error) -> String {
    match error {
        Error::Internal(cause) => cause.clone(),
        other => other.to_string(),
    }
}

fn with_context(error: Error, context: &str) -> Error {
    match error {
        Error::Unavailable(message) => Error::Unavailable(format!("{context}: {message}")),
        // A duplicate key while copying means another writer: not a conflict of the caller's.
        other => Error::Internal(format!("{context}: {}", message_of(&other))),
    }
}

// ---------------------------------------------------------------------------------------------
// The reader thread: SQLite rows → PostgreSQL binary COPY tuples.

/// A message from the reader: encoded rows of the current table, its end, or a failure.
enum Chunk {
    Rows { rows: u64, data: Bytes },
    End,
    Failed(Error),
}

struct Reader {
    chunks: tokio::sync::mpsc::Receiver<Chunk>,
    thread: std::thread::JoinHandle<()>,
}

impl Reader {
    /// Reads every table in catalogue order, each after its start key, on a thread of its own.
    fn spawn(
        source: Source,
        start_keys: Vec<Option<Vec<Value>>>,
        batch_rows: u64,
    ) -> Result<Reader> {
        // A few chunks in flight: the reader stays ahead without holding much memory.
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        let thread = std::thread::Builder::new()
            .name("migrate-reader".into())
            .spawn(move || {
                for (table, start) in TABLES.iter().zip(start_keys) {
                    let sent = read_table(&source, table, start.as_deref(), batch_rows, &sender);
                    let last = match sent {
                        Ok(()) => Chunk::End,
                        Err(e) => Chunk::Failed(e),
                    };
                    let failed = matches!(last, Chunk::Failed(_));
                    if sender.blocking_send(last).is_err() || failed {
                        return;
                    }
                }
            })?;
        Ok(Reader {
            chunks: receiver,
            thread,
        })
    }

    async fn next(&mut self) -> Chunk {
        match self.chunks.recv().await {
            Some(chunk) => chunk,
            None => Chunk::Failed(Error::Internal("the reader thread stopped".into())),
        }
    }

    fn join(self) -> Result<()> {
        drop(self.chunks);
        self.thread
            .join()
            .map_err(|_| Error::Internal("the reader thread panicked".into()))
    }
}

/// Streams one table's rows after `start`, in key order, as chunks of encoded tuples; a chunk
/// ends at `batch_rows` rows or `CHUNK_BYTES`, so batches end on chunk boundaries.
fn read_table(
    source: &Source,
    table: &Table,
    start: Option<&[Value]>,
    batch_rows: u64,
    sender: &tokio::sync::mpsc::Sender<Chunk>,
) -> Result<()> {
    let key = table.primary_key.join(", ");
    let placeholders: Vec<String> = (1..=table.primary_key.len())
        .map(|i| format!("?{i}"))
        .collect();
    let after = match start {
        Some(_) => format!("WHERE ({key}) > ({})", placeholders.join(", ")),
        None => String::new(),
    };
    let sql = format!(
        "SELECT {} FROM {} {after} ORDER BY {key}",
        table.column_list(),
        table.name
    );
    let path = &source.path;
    let mut statement = source
        .connection
        .prepare(&sql)
        .map_err(|e| sqlite_error(path, e))?;
    let no_start: [Value; 0] = [];
    let mut rows = match start {
        Some(values) => statement.query(rusqlite::params_from_iter(values.iter())),
        None => statement.query(rusqlite::params_from_iter(no_start.iter())),
    }
    .map_err(|e| sqlite_error(path, e))?;
    let mut buffer = BytesMut::with_capacity(CHUNK_BYTES + (64 << 10));
    let mut in_chunk = 0u64;
    let fields = i16::try_from(table.columns.len()).expect("a table has fewer than 32768 columns");
    while let Some(row) = rows.next().map_err(|e| sqlite_error(path, e))? {
        buffer.put_i16(fields);
        for (index, column) in table.columns.iter().enumerate() {
            let value = row.get_ref(index).map_err(|e| sqlite_error(path, e))?;
            encode(&mut buffer, table, column.name, column.kind, value)?;
        }
        in_chunk += 1;
        if in_chunk >= batch_rows || buffer.len() >= CHUNK_BYTES {
            let data = buffer.split().freeze();
            if sender
                .blocking_send(Chunk::Rows {
                    rows: in_chunk,
                    data,
                })
                .is_err()
            {
                // The copy side gave up; its error is the one reported.
                return Ok(());
            }
            in_chunk = 0;
        }
    }
    if in_chunk > 0 {
        let data = buffer.split().freeze();
        let _ = sender.blocking_send(Chunk::Rows {
            rows: in_chunk,
            data,
        });
    }
    Ok(())
}

/// One field of a binary COPY tuple: its length (-1 for NULL), then the bytes (BIGINT:
/// 8 bytes big-endian; TEXT: the UTF-8 bytes as they are).
fn encode(
    buffer: &mut BytesMut,
    table: &Table,
    column: &str,
    kind: ColumnType,
    value: ValueRef<'_>,
) -> Result<()> {
    match (kind, value) {
        (_, ValueRef::Null) => buffer.put_i32(-1),
        (ColumnType::Int, ValueRef::Integer(number)) => {
            buffer.put_i32(8);
            buffer.put_i64(number);
        }
        (ColumnType::Text, ValueRef::Text(text)) => {
            if std::str::from_utf8(text).is_err() {
                return Err(Error::Internal(format!(
                    "{}.{column}: a value is not valid UTF-8",
                    table.name
                )));
            }
            let length = i32::try_from(text.len()).map_err(|_| {
                Error::Internal(format!("{}.{column}: a value is over 2 GiB", table.name))
            })?;
            buffer.put_i32(length);
            buffer.put_slice(text);
        }
        (_, other) => {
            return Err(Error::Internal(format!(
                "{}.{column}: a value of type {} where the schema says {}",
                table.name,
                other.data_type(),
                match kind {
                    ColumnType::Int => "INTEGER",
                    ColumnType::Text => "TEXT",
                }
            )))
        }
    }
    Ok(())
}

/// The start of a binary COPY stream: signature, flags, header extension length.
const COPY_HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
/// The end of one: a field count of -1.
const COPY_TRAILER: &[u8] = &[0xff, 0xff];

/// A COPY in progress (pinned: the sink is `!Unpin`).
type CopySink = std::pin::Pin<Box<tokio_postgres::CopyInSink<Bytes>>>;

/// Feeds the reader's chunks into batches: BEGIN, COPY, rows, COMMIT.
struct Copier<'a> {
    client: &'a tokio_postgres::Client,
    batch_rows: u64,
}

impl Copier<'_> {
    /// Copies one table's chunks; returns the rows copied.
    async fn table(
        &mut self,
        table: &Table,
        reader: &mut Reader,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<u64> {
        let statement = format!(
            "COPY {} ({}) FROM STDIN (FORMAT binary)",
            table.name,
            table.column_list()
        );
        let mut copied = 0u64;
        let mut batch: Option<(CopySink, u64, usize)> = None;
        loop {
            match reader.next().await {
                Chunk::Rows { rows, data } => {
                    if batch.is_none() {
                        self.client.batch_execute("BEGIN").await?;
                        let sink = Box::pin(self.client.copy_in(&statement).await?);
                        batch = Some((sink, 0, 0));
                    }
                    let (sink, batch_rows, batch_bytes) =
                        batch.as_mut().expect("a batch was just opened");
                    if *batch_bytes == 0 {
                        sink.feed(Bytes::from_static(COPY_HEADER)).await?;
                    }
                    *batch_bytes += data.len();
                    *batch_rows += rows;
                    sink.send(data).await?;
                    copied += rows;
                    progress(Progress::Rows {
                        table: table.name,
                        copied,
                    });
                    if *batch_rows >= self.batch_rows || *batch_bytes >= BATCH_BYTES {
                        let (sink, _, _) = batch.take().expect("the batch is open");
                        self.commit(sink).await?;
                    }
                }
                Chunk::End => {
                    if let Some((sink, _, _)) = batch.take() {
                        self.commit(sink).await?;
                    }
                    return Ok(copied);
                }
                Chunk::Failed(error) => {
                    // Dropping the sink aborts the COPY; the open transaction goes with the
                    // connection when the process exits.
                    drop(batch);
                    let _ = self.client.batch_execute("ROLLBACK").await;
                    return Err(error);
                }
            }
        }
    }

    async fn commit(&self, mut sink: CopySink) -> Result<()> {
        sink.send(Bytes::from_static(COPY_TRAILER)).await?;
        sink.as_mut().finish().await?;
        self.client.batch_execute("COMMIT").await?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// validate

/// One table's counts on both sides.
#[derive(Clone, Debug, Serialize)]
pub struct TableCounts {
    pub table: String,
    pub source: i64,
    /// None: the table does not exist in the target.
    pub target: Option<i64>,
    #[serde(rename = "match")]
    pub matches: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub source: String,
    pub target: String,
    pub source_schema_version: i64,
    pub target_schema_version: i64,
    pub tables: Vec<TableCounts>,
    pub source_audit_head: Option<AuditHead>,
    pub target_audit_head: Option<AuditHead>,
    pub audit_head_match: bool,
    /// `copying` when the target holds an unfinished copy, `done` after a finished one, None
    /// when svc-migrate never copied into it.
    pub copy_state: Option<String>,
    /// Whether everything compared is equal.
    #[serde(rename = "match")]
    pub matches: bool,
}

/// Compares row counts by table and the audit chain's head; changes nothing on either side.
pub async fn validate(source: Source, target: &Target) -> Result<Comparison> {
    let fingerprint = source.fingerprint()?;
    let source_schema_version = source.schema_version()?;
    let client = target.connect().await?;
    let target_schema_version = schema_version_of(&client).await?;
    let mut tables = Vec::new();
    for (table, count) in target_counts(&client).await? {
        let source_count = fingerprint.counts.get(table.name).copied().unwrap_or(0);
        tables.push(TableCounts {
            table: table.name.to_string(),
            source: source_count,
            target: count,
            matches: count == Some(source_count),
        });
    }
    let target_audit_head = target_audit_head(&client).await?;
    let audit_head_match = target_audit_head == fingerprint.audit_head;
    let copy_state = read_record(&client).await?.map(|record| record.state);
    let matches = audit_head_match
        && tables.iter().all(|table| table.matches)
        && source_schema_version == target_schema_version;
    Ok(Comparison {
        source: source.path.display().to_string(),
        target: target.shown().to_string(),
        source_schema_version,
        target_schema_version,
        tables,
        source_audit_head: fingerprint.audit_head,
        target_audit_head,
        audit_head_match,
        copy_state,
        matches,
    })
}

// ---------------------------------------------------------------------------------------------
// version

/// The schema version of a PostgreSQL store (0: no svc schema yet); changes nothing.
pub async fn postgres_schema_version(target: &Target) -> Result<i64> {
    let client = target.connect().await?;
    schema_version_of(&client).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_or_without_an_application_name() {
        for url in [
            "postgres://u:p@h/db",
            "postgres://u:p@h/db?sslmode=disable",
            "postgres://u:p@h/db?application_name=mine",
        ] {
            assert_eq!(target_from_url(url).unwrap().shown(), "h:5432/db", "{url}");
        }
    }

    #[test]
    fn encoding_follows_the_binary_copy_format() {
        let table = super::super::tables::find("api_keys").unwrap();
        let mut buffer = BytesMut::new();
        encode(
            &mut buffer,
            table,
            "id",
            ColumnType::Text,
            ValueRef::Text(b"ab"),
        )
        .unwrap();
        encode(&mut buffer, table, "id", ColumnType::Text, ValueRef::Null).unwrap();
        encode(
            &mut buffer,
            table,
            "n",
            ColumnType::Int,
            ValueRef::Integer(-2),
        )
        .unwrap();
        assert_eq!(
            buffer.as_ref(),
            &[
                0, 0, 0, 2, b'a', b'b', // text
                0xff, 0xff, 0xff, 0xff, // NULL
                0, 0, 0, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe, // -2
            ]
        );
        let wrong = encode(
            &mut buffer,
            table,
            "n",
            ColumnType::Int,
            ValueRef::Text(b"x"),
        );
        assert!(
            message_of(&wrong.unwrap_err()).contains("api_keys.n: a value of type Text"),
            "a TEXT value in an INTEGER column is refused"
        );
        assert_eq!(COPY_HEADER.len(), 11 + 4 + 4);
    }
}
