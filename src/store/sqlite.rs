//! SQLite driver: WAL mode, busy retries of tens of microseconds (not SQLite's millisecond
//! busy timeout), a small pool of connections, one audit-writer connection and a checkpoint
//! thread.
//!
//! Queries here take microseconds, so they run inline on the async worker under a std mutex
//! (nothing awaits while a connection is checked out) instead of paying a `spawn_blocking`
//! hop per call. WAL lets the pooled readers run beside the one writer.

mod blueprints;
mod fleet;
mod jwt;
mod secrets;
mod webhooks;

use crate::store::columns::*;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};

use super::{
    AgentRow, ApiKeyChange, ApiKeyRow, AuditFilter, AuditGroup, AuditRow, AuditSeal, CaRow,
    JoinTokenRow, KeyWrite, PlanTable, SqlValue, Store, MIGRATIONS,
};
use crate::{Error, Result};

/// Connections kept for reuse; more are opened under load and closed when the pool is full.
const POOL_SIZE: usize = 8;

pub struct SqliteStore {
    path: PathBuf,
    pool: Mutex<Vec<Connection>>,
    /// The connection that appends audit rows, kept out of the pool, and the lock that
    /// serializes those appends in this process. Without the lock, concurrent writers meet in
    /// SQLite's busy handler, which sleeps in millisecond steps: 16 concurrent audited requests
    /// then ran at a few hundred per second instead of tens of thousands. Being one connection,
    /// its page cache stays valid from one append to the next (SQLite drops a connection's cache
    /// whenever *another* connection wrote), so the chain's tail and the index pages it inserts
    /// into are not read again for every batch.
    writer: Arc<Mutex<AuditWriter>>,
    /// Checkpoints the WAL off the request path (see `Checkpointer`).
    checkpointer: Checkpointer,
}

struct AuditWriter {
    connection: Connection,
    /// Transactions since the last checkpoint request.
    commits: u32,
}

impl SqliteStore {
    /// Opens (creating if needed) the database and applies pending migrations.
    pub fn open(path: &Path) -> Result<Self> {
        let mut connection = connect(path)?;
        migrate(&mut connection)?;
        // The audit writer does not checkpoint when it commits: a checkpoint fsyncs the WAL
        // (everything written since the last one, megabytes) and the database file, which
        // stalled every caller waiting on that commit for tens of milliseconds on a busy disk.
        // The checkpointer thread does it instead. (Pool connections keep SQLite's automatic
        // checkpoint; they write rarely.)
        connection.pragma_update(None, "wal_autocheckpoint", 0)?;
        let writer = Arc::new(Mutex::new(AuditWriter {
            connection,
            commits: 0,
        }));
        Ok(SqliteStore {
            path: path.to_path_buf(),
            pool: Mutex::new(Vec::new()),
            checkpointer: Checkpointer::start(connect(path)?, writer.clone())?,
            writer,
        })
    }

    fn connect(&self) -> Result<Connection> {
        connect(&self.path)
    }

    fn release(&self, connection: Connection) {
        let mut pool = self.pool.lock().expect("pool lock poisoned");
        if pool.len() < POOL_SIZE {
            pool.push(connection);
        }
    }

    /// Runs `work` on a pooled connection.
    fn with<T>(&self, work: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let pooled = self.pool.lock().expect("pool lock poisoned").pop();
        let mut connection = match pooled {
            Some(connection) => connection,
            None => self.connect()?,
        };
        let result = work(&mut connection);
        self.release(connection);
        result
    }
}

/// A new connection with the settings every connection here uses.
fn connect(path: &Path) -> Result<Connection> {
    let mut connection = Connection::open(path)
        .map_err(|e| Error::Unavailable(format!("cannot open {}: {e}", path.display())))?;
    // SQLite's own busy timeout sleeps 1, 2, 5 ... 100 ms between retries, which turned
    // 16 concurrent audited writes into ~2,000/s. Our writes hold the lock for tens of
    // microseconds, so retry at that scale instead (still giving up after ~5 s).
    connection.busy_handler(Some(retry_soon))?;
    // WAL: readers never block the writer; NORMAL sync is durable across process
    // crashes and loses at most the last commits on power loss.
    connection.pragma_update(None, "journal_mode", "WAL")?;
    connection.pragma_update(None, "synchronous", "NORMAL")?;
    connection.pragma_update(None, "foreign_keys", "ON")?;
    // LIKE (secret and lease prefixes, audit action globs) compares case-sensitively, as
    // paths are and as PostgreSQL's LIKE does; SQLite's default folds ASCII case.
    connection.pragma_update(None, "case_sensitive_like", "ON")?;
    Ok(connection)
}

/// Audit commits between two checkpoint requests: about SQLite's own default of 1000 WAL
/// pages, at the four or more pages (the row and its three index entries) a commit writes.
const CHECKPOINT_EVERY: u32 = 250;

/// Runs WAL checkpoints on its own thread and connection, so no caller waits for the bulk of
/// one.
///
/// A cycle has two passes. The first, PASSIVE, runs beside the writers and readers: it syncs
/// the WAL, copies its pages into the database file and syncs that, which is where the time
/// goes. It cannot finish the WAL while the audit writer keeps appending, and SQLite starts
/// writing the WAL from its beginning again only once a checkpoint has copied all of it; without
/// that the file grows for as long as writes go on. So the second pass, RESTART, holds the audit
/// writer's lock: it copies only what was appended during the first pass (two small syncs),
/// waits for readers still on the old WAL, and makes the next write start the WAL over. Audit
/// commits wait for that second pass only.
struct Checkpointer {
    wake: Option<mpsc::SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    fn start(mut connection: Connection, writer: Arc<Mutex<AuditWriter>>) -> Result<Self> {
        // The second pass holds the audit writer, so it must not wait long for a reader: after
        // a few milliseconds it gives up and copies what it can, as a PASSIVE pass would (a
        // long `svc-audit stats` must not stall every audited operation behind it).
        connection.busy_handler(Some(retry_briefly))?;
        let (wake, woken) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || {
                while woken.recv().is_ok() {
                    if let Err(error) = checkpoint(&connection, &writer) {
                        tracing::warn!(%error, "WAL checkpoint failed");
                    }
                }
            })?;
        Ok(Checkpointer {
            wake: Some(wake),
            thread: Some(thread),
        })
    }

    /// Asks for a checkpoint; a request already pending covers this one.
    fn request(&self) {
        if let Some(wake) = &self.wake {
            let _ = wake.try_send(());
        }
    }
}

/// One checkpoint cycle (see `Checkpointer`).
fn checkpoint(connection: &Connection, writer: &Mutex<AuditWriter>) -> Result<()> {
    checkpoint_beside_writers(connection)?;
    checkpoint_to_restart(connection, writer)
}

fn checkpoint_beside_writers(connection: &Connection) -> Result<()> {
    connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
    Ok(())
}

fn checkpoint_to_restart(connection: &Connection, writer: &Mutex<AuditWriter>) -> Result<()> {
    let _writer = writer.lock().expect("writer lock poisoned");
    connection.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))?;
    Ok(())
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.wake.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Busy handler: wait 50 µs per retry, for at most ~5 s in all.
fn retry_soon(attempt: i32) -> bool {
    if attempt >= BUSY_RETRIES {
        return false;
    }
    std::thread::sleep(BUSY_WAIT);
    true
}

/// The checkpointer's busy handler: 50 µs per retry, for at most ~5 ms.
fn retry_briefly(attempt: i32) -> bool {
    if attempt >= 100 {
        return false;
    }
    std::thread::sleep(BUSY_WAIT);
    true
}

const BUSY_WAIT: Duration = Duration::from_micros(50);
const BUSY_RETRIES: i32 = 5_000_000 / 50;

fn migrate(connection: &mut Connection) -> Result<()> {
    connection.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (
            version INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            applied_at TEXT NOT NULL
        )",
    )?;
    // Every migration not yet recorded is applied, not only those above the highest: branches
    // may add migrations out of order, and none of ours depends on a later one.
    let applied: Vec<i64> = {
        let mut statement = connection.prepare("SELECT version FROM schema_version")?;
        let rows = statement.query_map([], |row| row.get(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for (version, name, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        let tx = connection.transaction()?;
        tx.execute_batch(sql)
            .map_err(|e| Error::Internal(format!("migration {version} ({name}): {e}")))?;
        tx.execute(
            "INSERT INTO schema_version (version, name, applied_at) VALUES (?1, ?2, ?3)",
            params![version, name, crate::clock::now_rfc3339()],
        )?;
        tx.commit()?;
        tracing::info!(version, name, "applied store migration");
    }
    Ok(())
}

/// Whether key `id` is an active admin key (role admin, not expired at `now`) and no other
/// is. Expiries are all written by `clock::format_rfc3339` (fixed width, UTC), so text order
/// is time order.
fn is_last_active_admin(c: &Connection, id: &str, now: &str) -> rusqlite::Result<bool> {
    c.query_row(
        "SELECT COALESCE(SUM(id = ?1), 0) = 1 AND COUNT(*) = 1 FROM api_keys \
         WHERE role = 'admin' AND (expires_at IS NULL OR expires_at > ?2)",
        params![id, now],
        |row| row.get(0),
    )
}

fn api_key_from_row(row: &Row<'_>) -> rusqlite::Result<ApiKeyRow> {
    Ok(ApiKeyRow {
        id: row.get(0)?,
        name: row.get(1)?,
        role: row.get(2)?,
        key_hash: row.get(3)?,
        created_at: row.get(4)?,
        last_used_at: row.get(5)?,
        expires_at: row.get(6)?,
        signing_sealed: row.get(7)?,
    })
}

fn audit_from_row(row: &Row<'_>) -> rusqlite::Result<AuditRow> {
    Ok(AuditRow {
        seq: row.get(0)?,
        id: row.get(1)?,
        timestamp: row.get(2)?,
        user: row.get(3)?,
        action: row.get(4)?,
        resource_type: row.get(5)?,
        resource_id: row.get(6)?,
        outcome: row.get(7)?,
        policy_id: row.get(8)?,
        decision: row.get(9)?,
        severity: row.get(10)?,
        detail: row.get(11)?,
        prev_hash: row.get(12)?,
        hash: row.get(13)?,
    })
}

/// The statement `insert_audit_row` runs (prepare it once per transaction).
pub const INSERT_AUDIT_SQL: &str =
    "INSERT INTO audit_events (seq, id, timestamp, user_id, action, \
     resource_type, resource_id, outcome, policy_id, decision, severity, detail, prev_hash, hash) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)";

/// Inserts one audit row exactly as given (already linked and sealed) through a statement
/// prepared from [`INSERT_AUDIT_SQL`]: the store's own appends use it after linking, and
/// benchmarks and tests use it to fill a database fast with a chain they built themselves.
pub fn insert_audit_row(
    insert: &mut rusqlite::Statement<'_>,
    row: &AuditRow,
) -> rusqlite::Result<usize> {
    insert.execute(params![
        row.seq,
        row.id,
        row.timestamp,
        row.user,
        row.action,
        row.resource_type,
        row.resource_id,
        row.outcome,
        row.policy_id,
        row.decision,
        row.severity,
        row.detail,
        row.prev_hash,
        row.hash
    ])
}

/// Links and inserts `rows` after the chain's last row, inside the caller's transaction.
fn insert_audit_rows(
    c: &Connection,
    rows: Vec<AuditRow>,
    genesis: &str,
    seal: &AuditSeal,
) -> Result<Vec<Result<AuditRow>>> {
    let last: Option<(i64, String)> = c
        .prepare_cached("SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let (mut last_seq, mut prev_hash) = last.unwrap_or((0, genesis.to_string()));
    let mut insert = c.prepare_cached(INSERT_AUDIT_SQL)?;
    let mut results = Vec::with_capacity(rows.len());
    for mut row in rows {
        row.seq = last_seq + 1;
        row.prev_hash = prev_hash.clone();
        row.hash = seal(&row);
        let inserted = insert_audit_row(&mut insert, &row);
        match inserted {
            Ok(_) => {
                last_seq = row.seq;
                prev_hash.clone_from(&row.hash);
                results.push(Ok(row));
            }
            // A constraint failure undoes only its own statement; an I/O error or a full disk
            // can roll the whole transaction back, and then no row of the batch is stored, the
            // earlier ones included.
            Err(e) if c.is_autocommit() => return Err(e.into()),
            Err(e) => results.push(Err(e.into())),
        }
    }
    Ok(results)
}

fn ca_from_row(row: &Row<'_>) -> rusqlite::Result<CaRow> {
    Ok(CaRow {
        id: row.get(0)?,
        kind: row.get(1)?,
        cert_pem: row.get(2)?,
        key_encrypted: row.get(3)?,
        fingerprint: row.get(4)?,
        not_before: row.get(5)?,
        not_after: row.get(6)?,
        created_at: row.get(7)?,
        retired_at: row.get(8)?,
    })
}

fn insert_ca_row(c: &Connection, row: &CaRow) -> rusqlite::Result<usize> {
    c.execute(
        &format!("INSERT INTO ca ({CA_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"),
        params![
            row.id,
            row.kind,
            row.cert_pem,
            row.key_encrypted,
            row.fingerprint,
            row.not_before,
            row.not_after,
            row.created_at,
            row.retired_at
        ],
    )
}

fn join_token_from_row(row: &Row<'_>) -> rusqlite::Result<JoinTokenRow> {
    Ok(JoinTokenRow {
        id: row.get(0)?,
        token_hash: row.get(1)?,
        agent_id: row.get(2)?,
        created_by: row.get(3)?,
        created_at: row.get(4)?,
        expires_at: row.get(5)?,
        used_at: row.get(6)?,
        used_by: row.get(7)?,
        revoked_at: row.get(8)?,
    })
}

/// The WHERE clause of an audit query and its bound values.
fn audit_where(filter: &AuditFilter, with_cursor: bool) -> (String, Vec<Box<dyn rusqlite::ToSql>>) {
    let (filter_sql, values) = super::audit_where(
        filter,
        with_cursor,
        |n| format!("?{n}"),
        "json_extract(o.detail, '$.attempt')",
    );
    // `+action`: with case-sensitive LIKE, SQLite would search the action index for the glob's
    // prefix and then sort every match by seq (47 ms for `secret.*` over 200,000 rows), where
    // walking seq backwards and stopping at the limit takes a few. The unary plus keeps the
    // index out of the plan.
    let filter_sql = filter_sql.replace("action LIKE", "+action LIKE");
    let values = values
        .into_iter()
        .map(|value| -> Box<dyn rusqlite::ToSql> {
            match value {
                SqlValue::Text(text) => Box::new(text),
                SqlValue::Int(int) => Box::new(int),
            }
        })
        .collect();
    (filter_sql, values)
}

#[async_trait]
impl Store for SqliteStore {
    fn driver(&self) -> &'static str {
        "sqlite"
    }

    async fn ping(&self) -> Result<()> {
        // Pooled connections keep working on a database file that was deleted or replaced
        // underneath them, while the next new connection would silently create an empty one:
        // readiness must notice that, so check the file as well as a round trip.
        match std::fs::metadata(&self.path) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => {
                return Err(Error::Unavailable(format!(
                    "{} is not a file",
                    self.path.display()
                )))
            }
            Err(e) => return Err(Error::Unavailable(format!("{}: {e}", self.path.display()))),
        }
        self.with(|c| {
            c.query_row("SELECT 1", [], |_| Ok(()))?;
            Ok(())
        })
    }

    async fn export_sqlite(&self, path: &Path) -> Result<()> {
        let target = path
            .to_str()
            .ok_or_else(|| Error::Invalid(format!("{} is not UTF-8", path.display())))?
            .to_string();
        // VACUUM INTO reads the database inside one read transaction (WAL: writers go on) and
        // writes a compact copy, so the copy is one consistent state of the store. It runs on
        // a connection of its own: the pool's are for short requests.
        let connection = self.connect()?;
        tokio::task::spawn_blocking(move || -> Result<()> {
            connection.execute("VACUUM INTO ?1", [target])?;
            Ok(())
        })
        .await
        .map_err(Error::internal)?
    }

    async fn schema_version(&self) -> Result<i64> {
        self.with(|c| {
            Ok(c.query_row(
                "SELECT COALESCE(MAX(version), 0) FROM schema_version",
                [],
                |row| row.get(0),
            )?)
        })
    }

    async fn insert_api_key(&self, key: &ApiKeyRow) -> Result<()> {
        self.with(|c| {
            c.prepare_cached(&format!(
                "INSERT INTO api_keys ({API_KEY_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            ))?
            .execute(params![
                key.id,
                key.name,
                key.role,
                key.key_hash,
                key.created_at,
                key.last_used_at,
                key.expires_at,
                key.signing_sealed
            ])?;
            Ok(())
        })
    }

    async fn list_api_keys(&self) -> Result<Vec<ApiKeyRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {API_KEY_COLUMNS} FROM api_keys ORDER BY id"
            ))?;
            let rows = statement.query_map([], api_key_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    async fn get_api_key(&self, id: &str) -> Result<Option<ApiKeyRow>> {
        self.with(|c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {API_KEY_COLUMNS} FROM api_keys WHERE id = ?1"
            ))?
            .query_row([id], api_key_from_row)
            .optional()?)
        })
    }

    async fn find_api_key_by_hash(&self, key_hash: &str) -> Result<Option<ApiKeyRow>> {
        self.with(|c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {API_KEY_COLUMNS} FROM api_keys WHERE key_hash = ?1"
            ))?
            .query_row([key_hash], api_key_from_row)
            .optional()?)
        })
    }

    async fn update_api_key(
        &self,
        id: &str,
        change: &ApiKeyChange,
        now: &str,
    ) -> Result<KeyWrite<ApiKeyRow>> {
        self.with(|c| {
            // IMMEDIATE: the write lock is taken before the count, so the count still holds
            // at commit. Returning early drops `tx`, which rolls back.
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let takes_admin = change.role.as_deref().is_some_and(|role| role != "admin")
                || change.expires_at.is_some();
            if takes_admin && is_last_active_admin(&tx, id, now)? {
                return Ok(KeyWrite::LastAdmin);
            }
            let changed = tx.execute(
                "UPDATE api_keys SET name = COALESCE(?2, name), role = COALESCE(?3, role), \
                 expires_at = COALESCE(?4, expires_at) WHERE id = ?1",
                params![id, change.name, change.role, change.expires_at],
            )?;
            if changed == 0 {
                return Ok(KeyWrite::NotFound);
            }
            let row = tx.query_row(
                &format!("SELECT {API_KEY_COLUMNS} FROM api_keys WHERE id = ?1"),
                [id],
                api_key_from_row,
            )?;
            tx.commit()?;
            Ok(KeyWrite::Done(row))
        })
    }

    async fn delete_api_key(&self, id: &str, now: &str) -> Result<KeyWrite<()>> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if is_last_active_admin(&tx, id, now)? {
                return Ok(KeyWrite::LastAdmin);
            }
            if tx.execute("DELETE FROM api_keys WHERE id = ?1", [id])? == 0 {
                return Ok(KeyWrite::NotFound);
            }
            tx.commit()?;
            Ok(KeyWrite::Done(()))
        })
    }

    async fn append_audit_batch(
        &self,
        rows: Vec<AuditRow>,
        genesis: &str,
        seal: &AuditSeal,
    ) -> Result<Vec<Result<AuditRow>>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let mut writer = self.writer.lock().expect("writer lock poisoned");
        let c = &writer.connection;
        // IMMEDIATE takes the write lock first, so two appenders cannot both read the same
        // last hash and fork the chain. One transaction per batch: the commit writes each
        // touched page to the WAL once for all its rows instead of once per row.
        c.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let appended = insert_audit_rows(c, rows, genesis, seal)
            .and_then(|results| Ok(c.prepare_cached("COMMIT")?.execute([]).map(|_| results)?));
        if appended.is_err() && !c.is_autocommit() {
            let _ = c.execute_batch("ROLLBACK");
        }
        writer.commits += 1;
        if writer.commits >= CHECKPOINT_EVERY {
            writer.commits = 0;
            self.checkpointer.request();
        }
        appended
    }

    async fn query_audit(&self, filter: &AuditFilter, limit: usize) -> Result<Vec<AuditRow>> {
        let (filter_sql, values) = audit_where(filter, true);
        let sql = format!(
            "SELECT {AUDIT_COLUMNS} FROM audit_events {filter_sql} ORDER BY seq DESC LIMIT {}",
            limit.min(100_000)
        );
        self.with(|c| {
            let mut statement = c.prepare_cached(&sql)?;
            let params: Vec<&dyn rusqlite::ToSql> = values.iter().map(|v| v.as_ref()).collect();
            let rows = statement.query_map(params.as_slice(), audit_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    async fn count_audit(
        &self,
        filter: &AuditFilter,
        group: AuditGroup,
    ) -> Result<Vec<(String, u64)>> {
        let (filter_sql, values) = audit_where(filter, false);
        let column = group.sql();
        let sql = format!(
            "SELECT {column} AS k, COUNT(*) FROM audit_events {filter_sql} GROUP BY k ORDER BY COUNT(*) DESC, k"
        );
        self.with(|c| {
            let mut statement = c.prepare_cached(&sql)?;
            let params: Vec<&dyn rusqlite::ToSql> = values.iter().map(|v| v.as_ref()).collect();
            let rows = statement.query_map(params.as_slice(), |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    async fn audit_chain(&self, after_seq: i64, limit: usize) -> Result<Vec<AuditRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {AUDIT_COLUMNS} FROM audit_events WHERE seq > ?1 ORDER BY seq LIMIT ?2"
            ))?;
            let rows = statement.query_map(params![after_seq, limit as i64], audit_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    async fn touch_api_key(&self, id: &str, used_at: &str) -> Result<()> {
        self.with(|c| {
            c.prepare_cached("UPDATE api_keys SET last_used_at = ?2 WHERE id = ?1")?
                .execute(params![id, used_at])?;
            Ok(())
        })
    }

    async fn seal_api_key(
        &self,
        id: &str,
        old_hash: &str,
        key_hash: &str,
        signing_sealed: &str,
    ) -> Result<bool> {
        self.with(|c| {
            let changed = c.execute(
                "UPDATE api_keys SET key_hash = ?3, signing_sealed = ?4 \
                 WHERE id = ?1 AND key_hash = ?2 AND signing_sealed IS NULL",
                params![id, old_hash, key_hash, signing_sealed],
            )?;
            Ok(changed == 1)
        })
    }

    async fn clear_plans(&self, table: PlanTable, limit: u32) -> Result<Vec<(String, String)>> {
        self.with(|c| {
            let mut statement = c.prepare(&table.clear_sql("?1"))?;
            let rows = statement.query_map([limit], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    async fn seal_plan(
        &self,
        table: PlanTable,
        key: &str,
        old: &str,
        sealed: &str,
    ) -> Result<bool> {
        self.with(|c| {
            let changed = c.execute(
                &table.seal_sql(["?1", "?2", "?3"]),
                params![key, old, sealed],
            )?;
            Ok(changed == 1)
        })
    }

    async fn record_file_nonce(&self, _: &str, _: i64, _: Option<i64>) -> Result<bool> {
        Err(Error::Unavailable(
            "a shared replay window needs the PostgreSQL store (cluster mode)".into(),
        ))
    }

    async fn active_ca(&self) -> Result<Vec<CaRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {CA_COLUMNS} FROM ca WHERE retired_at IS NULL ORDER BY created_at, id"
            ))?;
            let rows = statement.query_map([], ca_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    async fn update_ca_key(&self, id: &str, key_encrypted: &str) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE ca SET key_encrypted = ?2 WHERE id = ?1",
                params![id, key_encrypted],
            )?;
            Ok(())
        })
    }

    async fn insert_ca(&self, row: &CaRow) -> Result<()> {
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute(
                "UPDATE ca SET retired_at = ?2 WHERE kind = ?1 AND retired_at IS NULL",
                params![row.kind, row.created_at],
            )?;
            insert_ca_row(&tx, row)?;
            tx.commit()?;
            Ok(())
        })
    }

    async fn insert_first_ca(&self, row: &CaRow) -> Result<Option<CaRow>> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let active = tx
                .query_row(
                    &format!(
                        "SELECT {CA_COLUMNS} FROM ca WHERE kind = ?1 AND retired_at IS NULL \
                         ORDER BY created_at LIMIT 1"
                    ),
                    [&row.kind],
                    ca_from_row,
                )
                .optional()?;
            if active.is_some() {
                return Ok(active);
            }
            insert_ca_row(&tx, row)?;
            tx.commit()?;
            Ok(None)
        })
    }

    async fn add_ca_generation(&self, row: &CaRow) -> Result<bool> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let active: i64 = tx.query_row(
                "SELECT COUNT(*) FROM ca WHERE kind = ?1 AND retired_at IS NULL",
                [&row.kind],
                |r| r.get(0),
            )?;
            if active != 1 {
                return Ok(false);
            }
            insert_ca_row(&tx, row)?;
            tx.commit()?;
            Ok(true)
        })
    }

    async fn retire_older_ca(&self, kind: &str, at: &str) -> Result<u64> {
        self.with(|c| Ok(c.execute(RETIRE_OLDER_CA, params![at, kind])? as u64))
    }

    async fn insert_join_token(&self, row: &JoinTokenRow) -> Result<()> {
        self.with(|c| {
            c.prepare_cached(&format!(
                "INSERT INTO join_tokens ({JOIN_TOKEN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ))?
            .execute(params![
                row.id,
                row.token_hash,
                row.agent_id,
                row.created_by,
                row.created_at,
                row.expires_at,
                row.used_at,
                row.used_by,
                row.revoked_at
            ])?;
            Ok(())
        })
    }

    async fn list_join_tokens(&self) -> Result<Vec<JoinTokenRow>> {
        self.with(|c| {
            let mut statement = c.prepare_cached(&format!(
                "SELECT {JOIN_TOKEN_COLUMNS} FROM join_tokens ORDER BY created_at, id"
            ))?;
            let rows = statement.query_map([], join_token_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    async fn find_join_token_by_hash(&self, token_hash: &str) -> Result<Option<JoinTokenRow>> {
        self.with(|c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {JOIN_TOKEN_COLUMNS} FROM join_tokens WHERE token_hash = ?1"
            ))?
            .query_row([token_hash], join_token_from_row)
            .optional()?)
        })
    }

    async fn revoke_join_token(&self, id: &str, revoked_at: &str) -> Result<Option<JoinTokenRow>> {
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute(
                "UPDATE join_tokens SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                params![id, revoked_at],
            )?;
            let row = tx
                .query_row(
                    &format!("SELECT {JOIN_TOKEN_COLUMNS} FROM join_tokens WHERE id = ?1"),
                    [id],
                    join_token_from_row,
                )
                .optional()?;
            tx.commit()?;
            Ok(row)
        })
    }

    async fn use_join_token(&self, id: &str, used_at: &str, used_by: &str) -> Result<bool> {
        self.with(|c| {
            let changed = c
                .prepare_cached(
                    "UPDATE join_tokens SET used_at = ?2, used_by = ?3 \
                     WHERE id = ?1 AND used_at IS NULL AND revoked_at IS NULL",
                )?
                .execute(params![id, used_at, used_by])?;
            Ok(changed == 1)
        })
    }

    async fn delete_finished_join_tokens(&self, now: &str) -> Result<u64> {
        self.with(|c| {
            let deleted = c
                .prepare_cached(
                    "DELETE FROM join_tokens WHERE revoked_at IS NOT NULL OR expires_at <= ?1",
                )?
                .execute([now])?;
            Ok(deleted as u64)
        })
    }

    async fn upsert_agent(&self, row: &AgentRow) -> Result<()> {
        self.with(|c| {
            c.prepare_cached(
                "INSERT INTO agents (id, labels, fingerprint, enrolled_at, quarantined, public_key) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                 ON CONFLICT (id) DO UPDATE SET labels = excluded.labels, \
                 fingerprint = excluded.fingerprint, enrolled_at = excluded.enrolled_at, \
                 public_key = excluded.public_key",
            )?
            .execute(params![
                row.id,
                row.labels,
                row.fingerprint,
                row.enrolled_at,
                row.is_quarantined,
                row.public_key
            ])?;
            Ok(())
        })
    }

    async fn get_agent(&self, id: &str) -> Result<Option<AgentRow>> {
        self.with(|c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {} FROM agents WHERE id = ?1",
                AGENT_COLUMNS
            ))?
            .query_row([id], fleet::agent_from_row)
            .optional()?)
        })
    }

    fn secrets(&self) -> &dyn super::SecretStore {
        self
    }

    fn fleet(&self) -> &dyn super::FleetStore {
        self
    }

    fn jwts(&self) -> &dyn super::JwtStore {
        self
    }

    fn webhooks(&self) -> &dyn super::WebhookStore {
        self
    }

    fn runbooks(&self) -> &dyn super::RunbookStore {
        self
    }

    fn blueprints(&self) -> &dyn super::BlueprintStore {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, hash: &str) -> ApiKeyRow {
        ApiKeyRow {
            id: id.into(),
            name: format!("key {id}"),
            role: "readonly".into(),
            key_hash: hash.into(),
            created_at: "2026-11-21T08:15:02.123Z".into(),
            last_used_at: None,
            expires_at: None,
            signing_sealed: None,
        }
    }

    #[tokio::test]
    async fn api_key_rows_round_trip_and_migrations_are_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.db");
        let store = SqliteStore::open(&path).unwrap();
        store.insert_api_key(&row("a", "h1")).await.unwrap();
        store.insert_api_key(&row("b", "h2")).await.unwrap();
        assert!(
            store.insert_api_key(&row("c", "h1")).await.is_err(),
            "hash is unique"
        );
        assert_eq!(
            store.find_api_key_by_hash("h2").await.unwrap().unwrap().id,
            "b"
        );
        let now = "2026-11-21T09:00:00.000Z";
        let change = ApiKeyChange {
            role: Some("admin".into()),
            ..ApiKeyChange::default()
        };
        let KeyWrite::Done(updated) = store.update_api_key("a", &change, now).await.unwrap() else {
            panic!("not updated");
        };
        assert_eq!(
            (updated.name.as_str(), updated.role.as_str()),
            ("key a", "admin")
        );
        let missing = store.update_api_key("zz", &change, now).await.unwrap();
        assert_eq!(missing, KeyWrite::NotFound);
        // "a" is the only admin: it stays.
        assert_eq!(
            store.delete_api_key("a", now).await.unwrap(),
            KeyWrite::LastAdmin
        );
        store.update_api_key("b", &change, now).await.unwrap();
        assert_eq!(
            store.delete_api_key("a", now).await.unwrap(),
            KeyWrite::Done(())
        );
        assert_eq!(
            store.delete_api_key("a", now).await.unwrap(),
            KeyWrite::NotFound
        );
        drop(store);
        let reopened = SqliteStore::open(&path).unwrap();
        assert_eq!(
            reopened.schema_version().await.unwrap(),
            MIGRATIONS.last().map(|m| m.0).unwrap()
        );
        assert_eq!(reopened.list_api_keys().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn the_last_active_admin_key_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("svc.db")).unwrap();
        let now = "2026-11-21T09:00:00.000Z";
        let admin = |id: &str, expires_at: Option<&str>| ApiKeyRow {
            role: "admin".into(),
            expires_at: expires_at.map(str::to_string),
            ..row(id, id)
        };
        store.insert_api_key(&admin("live", None)).await.unwrap();
        // Expired admins do not count; deleting one is fine.
        store
            .insert_api_key(&admin("old", Some("2026-11-21T08:59:59.999Z")))
            .await
            .unwrap();
        let demote = ApiKeyChange {
            role: Some("operator".into()),
            ..ApiKeyChange::default()
        };
        let expire = ApiKeyChange {
            expires_at: Some("2027-01-01T00:00:00.000Z".into()),
            ..ApiKeyChange::default()
        };
        let rename = ApiKeyChange {
            name: Some("root".into()),
            ..ApiKeyChange::default()
        };
        for change in [&demote, &expire] {
            let refused = store.update_api_key("live", change, now).await.unwrap();
            assert_eq!(refused, KeyWrite::LastAdmin);
        }
        assert_eq!(
            store.delete_api_key("live", now).await.unwrap(),
            KeyWrite::LastAdmin
        );
        assert!(matches!(
            store.update_api_key("live", &rename, now).await.unwrap(),
            KeyWrite::Done(_)
        ));
        let kept = store.get_api_key("live").await.unwrap().unwrap();
        assert_eq!((kept.role.as_str(), kept.expires_at), ("admin", None));
        assert_eq!(
            store.delete_api_key("old", now).await.unwrap(),
            KeyWrite::Done(())
        );
        // A second admin with a future expiry is active: either may now be changed.
        store
            .insert_api_key(&admin("next", Some("2027-01-01T00:00:00.000Z")))
            .await
            .unwrap();
        assert!(matches!(
            store.update_api_key("live", &demote, now).await.unwrap(),
            KeyWrite::Done(_)
        ));
        assert_eq!(
            store.delete_api_key("next", now).await.unwrap(),
            KeyWrite::LastAdmin
        );
    }

    #[tokio::test]
    async fn audit_batch_links_rows_and_skips_a_refused_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("svc.db")).unwrap();
        let seal = |row: &AuditRow| format!("h({},{})", row.id, row.prev_hash);
        let row = |id: &str| AuditRow {
            id: id.into(),
            detail: "{}".into(),
            ..AuditRow::default()
        };
        let first = store
            .append_audit(row("a"), "genesis", &seal)
            .await
            .unwrap();
        assert_eq!((first.seq, first.prev_hash.as_str()), (1, "genesis"));
        // "a" again violates the UNIQUE id: only that row is refused.
        let results = store
            .append_audit_batch(vec![row("b"), row("a"), row("c")], "genesis", &seal)
            .await
            .unwrap();
        let outcomes: Vec<Option<(i64, String)>> = results
            .iter()
            .map(|r| r.as_ref().ok().map(|r| (r.seq, r.prev_hash.clone())))
            .collect();
        assert_eq!(
            outcomes,
            [
                Some((2, "h(a,genesis)".to_string())),
                None,
                Some((3, "h(b,h(a,genesis))".to_string())),
            ]
        );
        let chain: Vec<String> = store
            .audit_chain(0, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(chain, ["a", "b", "c"]);
    }

    #[tokio::test]
    async fn a_checkpoint_cycle_lets_the_wal_start_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.db");
        let store = SqliteStore::open(&path).unwrap();
        let seal = |row: &AuditRow| format!("h({})", row.id);
        let mut next = 0;
        let mut append = || {
            next += 1;
            let row = AuditRow {
                id: format!("r{next}"),
                detail: "{}".into(),
                ..AuditRow::default()
            };
            store.append_audit(row, "genesis", &seal)
        };
        for _ in 0..100 {
            append().await.unwrap();
        }
        let checkpointer = connect(&path).unwrap();
        // PRAGMA wal_checkpoint answers (busy, frames in the WAL, frames copied).
        let wal_frames = || -> i64 {
            checkpointer
                .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))
                .unwrap()
        };
        // A reader on an older snapshot keeps the first pass from copying the newest frames,
        // as appends made while that pass runs do in production.
        let reader = connect(&path).unwrap();
        reader
            .execute_batch("BEGIN; SELECT COUNT(*) FROM audit_events;")
            .unwrap();
        append().await.unwrap();
        checkpoint_beside_writers(&checkpointer).unwrap();
        reader.execute_batch("COMMIT").unwrap();
        checkpoint_to_restart(&checkpointer, &store.writer).unwrap();
        append().await.unwrap();
        assert!(
            wal_frames() < 20,
            "the WAL started over: {} frames",
            wal_frames()
        );
    }
}
