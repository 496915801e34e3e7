//! PostgreSQL driver: tokio-postgres over a bounded deadpool pool, TLS through rustls.
//!
//! Several svc-server processes may share one database (high availability), so every
//! check-then-write that SQLite makes safe with `BEGIN IMMEDIATE` (one writer per file) is made
//! safe here with a lock the other servers see too: the audit chain's tail under a
//! transaction-level advisory lock, the last-admin and CA checks under table locks, secrets
//! under row locks. Migrations run at start under a session advisory lock, so two servers
//! starting together apply each migration once.

mod blueprints;
pub mod cluster;
mod export;
mod fleet;
mod jwt;
mod secrets;
mod tls;
mod webhooks;

use crate::store::columns::*;
use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::{
    AgentRow, ApiKeyChange, ApiKeyRow, AuditFilter, AuditGroup, AuditRow, AuditSeal, CaRow,
    JoinTokenRow, KeyWrite, PlanTable, SqlValue, Store,
};
use crate::config::StoreConfig;
use crate::{percent, Error, Result};

pub use tls::RustlsConnect;

/// The PostgreSQL editions of `super::MIGRATIONS`: the same versions and names, in order.
pub const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "api_keys",
        include_str!("migrations/postgres/0001_api_keys.sql"),
    ),
    (
        2,
        "audit",
        include_str!("migrations/postgres/0002_audit.sql"),
    ),
    (
        3,
        "secrets",
        include_str!("migrations/postgres/0003_secrets.sql"),
    ),
    (
        4,
        "identity",
        include_str!("migrations/postgres/0004_identity.sql"),
    ),
    (
        5,
        "fleet",
        include_str!("migrations/postgres/0005_fleet.sql"),
    ),
    (
        6,
        "jwt_svids",
        include_str!("migrations/postgres/0006_jwt_svids.sql"),
    ),
    (
        7,
        "cluster",
        include_str!("migrations/postgres/0007_cluster.sql"),
    ),
    (
        8,
        "blueprints",
        include_str!("migrations/postgres/0008_blueprints.sql"),
    ),
    (
        9,
        "runbooks_webhooks",
        include_str!("migrations/postgres/0009_runbooks_webhooks.sql"),
    ),
    (
        10,
        "agent_facts",
        include_str!("migrations/postgres/0010_agent_facts.sql"),
    ),
    (
        11,
        "jobs",
        include_str!("migrations/postgres/0011_jobs.sql"),
    ),
    (
        12,
        "sealed_at_rest",
        include_str!("migrations/postgres/0012_sealed_at_rest.sql"),
    ),
    (
        13,
        "audit_attempts",
        include_str!("migrations/postgres/0013_audit_attempts.sql"),
    ),
    (
        14,
        "agents_quarantined_index",
        include_str!("migrations/postgres/0014_agents_quarantined_index.sql"),
    ),
    (
        15,
        "agent_public_key",
        include_str!("migrations/postgres/0015_agent_public_key.sql"),
    ),
];

/// Advisory lock keys (any two constants of ours; "svc" spelled in ASCII, then a number).
const MIGRATION_LOCK: i64 = 0x7376_6300_0001;
const AUDIT_LOCK: i64 = 0x7376_6300_0002;

/// TLS to PostgreSQL, as libpq names the modes (`verify-ca` is not offered: `verify-full`
/// checks the chain and the host name, which is what a CA file is for).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    /// TLS when the server offers it; the certificate is not checked.
    Prefer,
    /// TLS always; the certificate is not checked (encryption against passive listeners).
    Require,
    /// TLS always; the certificate chains to the CA file (or the system store) and names the
    /// host.
    VerifyFull,
}

impl SslMode {
    fn parse(text: &str) -> Result<SslMode> {
        match text {
            "disable" => Ok(SslMode::Disable),
            "" | "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-full" => Ok(SslMode::VerifyFull),
            other => Err(Error::Invalid(format!(
                "store.sslmode: '{other}' is not one of disable, prefer, require, verify-full"
            ))),
        }
    }
}

/// Where and how to connect: a parsed URL, its TLS settings and the pool's bounds.
#[derive(Clone)]
pub struct Target {
    config: tokio_postgres::Config,
    tls: RustlsConnect,
    pool_size: usize,
    timeout: Duration,
    /// host:port/database, for messages (never the password).
    shown: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl Target {
    /// The server's `store` settings (`driver: postgres`).
    pub fn from_config(config: &StoreConfig) -> Result<Target> {
        Target::new(
            config.url.expose(),
            &config.sslmode,
            &config.ca_file,
            config.max_connections,
            config.connect_timeout.0,
        )
    }

    /// A URL alone (svc-migrate's `--to`): TLS settings from its query string.
    pub fn from_url(url: &str) -> Result<Target> {
        let defaults = StoreConfig::default();
        Target::new(
            url,
            "",
            "",
            defaults.max_connections,
            defaults.connect_timeout.0,
        )
    }

    /// `url` is `postgres://user:password@host:port/database?options`. The `sslmode` and
    /// `sslrootcert` options are read here (tokio-postgres knows no `verify-full`); the
    /// arguments override them when not empty.
    pub fn new(
        url: &str,
        sslmode: &str,
        ca_file: &str,
        pool_size: usize,
        timeout: Duration,
    ) -> Result<Target> {
        if url.is_empty() {
            return Err(Error::Invalid(
                "store.url is empty: driver postgres needs postgres://user:password@host:port/database".into(),
            ));
        }
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(Error::Invalid(
                "store.url must start with postgres:// or postgresql://".into(),
            ));
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        let (mut url_mode, mut url_ca) = (String::new(), String::new());
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            match pair.split_once('=') {
                Some(("sslmode", value)) => url_mode = percent_decode(value),
                Some(("sslrootcert", value)) => url_ca = percent_decode(value),
                _ => kept.push(pair),
            }
        }
        let stripped = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let mut config: tokio_postgres::Config = stripped
            .parse()
            .map_err(|e| Error::Invalid(format!("store.url is not a PostgreSQL URL: {e}")))?;
        let mode = SslMode::parse(if sslmode.is_empty() {
            &url_mode
        } else {
            sslmode
        })?;
        let ca_file = if ca_file.is_empty() {
            url_ca
        } else {
            ca_file.to_string()
        };
        let client_config = match mode {
            SslMode::VerifyFull => {
                let ca = (!ca_file.is_empty()).then(|| std::path::Path::new(&ca_file));
                crate::tls::bus_client_config(ca)
                    .map_err(|e| Error::Invalid(format!("store.ca_file: {e}")))?
            }
            _ => crate::tls::unverified_client_config(),
        };
        config.ssl_mode(match mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
        });
        config.connect_timeout(timeout);
        if config.get_application_name().is_none() {
            config.application_name("svc");
        }
        let shown = shown(&config);
        if pool_size == 0 {
            return Err(Error::Invalid(
                "store.max_connections must be at least 1".into(),
            ));
        }
        Ok(Target {
            config,
            tls: RustlsConnect::new(client_config),
            pool_size,
            timeout,
            shown,
        })
    }

    /// One connection outside any pool (migrations, svc-migrate); its I/O runs on a task.
    pub async fn connect(&self) -> Result<tokio_postgres::Client> {
        let (client, connection) = self
            .config
            .connect(self.tls.clone())
            .await
            .map_err(|e| self.unreachable(e))?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "postgres connection closed");
            }
        });
        Ok(client)
    }

    /// One connection outside any pool whose notifications (LISTEN) come out of the returned
    /// receiver; it ends when the connection does, which is how a listener learns to
    /// reconnect.
    pub async fn connect_listening(
        &self,
    ) -> Result<(
        tokio_postgres::Client,
        tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
    )> {
        let (client, mut connection) = self
            .config
            .connect(self.tls.clone())
            .await
            .map_err(|e| self.unreachable(e))?;
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(tokio_postgres::AsyncMessage::Notification(note))) => {
                        if sender.send(note).is_err() {
                            return;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => {
                        tracing::debug!(%error, "postgres listening connection closed");
                        return;
                    }
                    None => return,
                }
            }
        });
        Ok((client, receiver))
    }

    fn unreachable(&self, error: tokio_postgres::Error) -> Error {
        // A refused login is the operator's to fix, not a server to wait for.
        if let Some(code) = error.code() {
            if *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            {
                return Error::Unauthenticated(format!(
                    "PostgreSQL at {} refused the login: {}",
                    self.shown,
                    describe(&error)
                ));
            }
        }
        Error::Unavailable(format!(
            "cannot connect to PostgreSQL at {}: {}",
            self.shown,
            describe(&error)
        ))
    }

    /// host:port/database, never the password.
    pub fn shown(&self) -> &str {
        &self.shown
    }
}

fn shown(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let database = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres");
    format!("{host}:{port}/{database}")
}

/// A URL query value, decoded as the driver decodes the rest of the URL: a stray `%` stays.
fn percent_decode(text: &str) -> String {
    String::from_utf8_lossy(&percent::decode_lenient(text)).into_owned()
}

/// The database's own message (and hint) without the values in `detail`, which can repeat a
/// row's content; or the client's error as it stands.
fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => db.message().to_string(),
        None => {
            use std::error::Error as _;
            match error.source() {
                Some(source) => format!("{error}: {source}"),
                None => error.to_string(),
            }
        }
    }
}

/// A duplicate key is `Conflict`, as on SQLite; a lost connection is `Unavailable`.
impl From<tokio_postgres::Error> for Error {
    fn from(error: tokio_postgres::Error) -> Self {
        let message = format!("postgres: {}", describe(&error));
        match error.code() {
            Some(code) if *code == SqlState::UNIQUE_VIOLATION => Error::Conflict(message),
            Some(_) => Error::Internal(message),
            None if error.is_closed() => Error::Unavailable(message),
            None => Error::Internal(message),
        }
    }
}

fn pool_error(error: deadpool_postgres::PoolError) -> Error {
    match error {
        deadpool_postgres::PoolError::Backend(e) => {
            let mut mapped = Error::from(e);
            if let Error::Internal(message) = mapped {
                mapped = Error::Unavailable(message);
            }
            mapped
        }
        other => Error::Unavailable(format!("postgres: no connection: {other}")),
    }
}

pub struct PostgresStore {
    pool: Pool,
    target: Target,
}

impl PostgresStore {
    /// Connects, applies pending migrations (under an advisory lock) and keeps a pool.
    pub async fn open(target: &Target) -> Result<Self> {
        let client = target.connect().await?;
        migrate(&client).await?;
        drop(client);
        let manager = Manager::from_config(
            target.config.clone(),
            target.tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(target.pool_size)
            .wait_timeout(Some(target.timeout))
            .create_timeout(Some(target.timeout))
            .recycle_timeout(Some(target.timeout))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| Error::Internal(format!("postgres pool: {e}")))?;
        Ok(PostgresStore {
            pool,
            target: target.clone(),
        })
    }

    async fn client(&self) -> Result<Object> {
        self.pool.get().await.map_err(|e| match pool_error(e) {
            Error::Unavailable(message) => {
                Error::Unavailable(format!("{message} (PostgreSQL at {})", self.target.shown))
            }
            other => other,
        })
    }

    /// Every row of a cached statement, each mapped by `map`.
    async fn rows<T>(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        map: fn(&Row) -> std::result::Result<T, tokio_postgres::Error>,
    ) -> Result<Vec<T>> {
        let client = self.client().await?;
        rows_on(&client, sql, params, map).await
    }

    async fn first<T>(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        map: fn(&Row) -> std::result::Result<T, tokio_postgres::Error>,
    ) -> Result<Option<T>> {
        Ok(self.rows(sql, params, map).await?.into_iter().next())
    }

    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql).await?;
        Ok(client.execute(&statement, params).await?)
    }
}

/// `rows` on any client or transaction.
async fn rows_on<C: GenericClient, T>(
    client: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    map: fn(&Row) -> std::result::Result<T, tokio_postgres::Error>,
) -> Result<Vec<T>> {
    let statement = client.prepare_cached(sql).await?;
    let rows = client.query(&statement, params).await?;
    rows.iter()
        .map(|row| map(row).map_err(Error::from))
        .collect()
}

/// The highest migration applied to the database behind `client` (0: none).
pub async fn schema_version_of(client: &tokio_postgres::Client) -> Result<i64> {
    let exists: bool = client
        .query_one("SELECT to_regclass('schema_version') IS NOT NULL", &[])
        .await?
        .try_get(0)?;
    if !exists {
        return Ok(0);
    }
    Ok(client
        .query_one(
            "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_version",
            &[],
        )
        .await?
        .try_get(0)?)
}

/// Applies every migration not yet recorded, each in its own transaction, holding a session
/// advisory lock so concurrent starts wait for each other instead of racing.
async fn migrate(client: &tokio_postgres::Client) -> Result<()> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let applied = apply_migrations(client).await;
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    applied?;
    unlocked?;
    Ok(())
}

async fn apply_migrations(client: &tokio_postgres::Client) -> Result<()> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_version (
                version BIGINT PRIMARY KEY,
                name TEXT COLLATE \"C\" NOT NULL,
                applied_at TEXT COLLATE \"C\" NOT NULL
            )",
        )
        .await?;
    let applied: Vec<i64> = client
        .query("SELECT version FROM schema_version", &[])
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<std::result::Result<_, _>>()?;
    // As on SQLite: every migration not yet recorded, not only those above the highest.
    for (version, name, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        client.batch_execute("BEGIN").await?;
        let done = async {
            client.batch_execute(sql).await.map_err(|e| {
                Error::Internal(format!("migration {version} ({name}): {}", describe(&e)))
            })?;
            client
                .execute(
                    "INSERT INTO schema_version (version, name, applied_at) VALUES ($1, $2, $3)",
                    &[version, name, &crate::clock::now_rfc3339()],
                )
                .await?;
            client.batch_execute("COMMIT").await?;
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = done {
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(e);
        }
        tracing::info!(version, name, "applied store migration (postgres)");
    }
    Ok(())
}

fn api_key(row: &Row) -> std::result::Result<ApiKeyRow, tokio_postgres::Error> {
    Ok(ApiKeyRow {
        id: row.try_get(0)?,
        name: row.try_get(1)?,
        role: row.try_get(2)?,
        key_hash: row.try_get(3)?,
        created_at: row.try_get(4)?,
        last_used_at: row.try_get(5)?,
        expires_at: row.try_get(6)?,
        signing_sealed: row.try_get(7)?,
    })
}

fn audit(row: &Row) -> std::result::Result<AuditRow, tokio_postgres::Error> {
    Ok(AuditRow {
        seq: row.try_get(0)?,
        id: row.try_get(1)?,
        timestamp: row.try_get(2)?,
        user: row.try_get(3)?,
        action: row.try_get(4)?,
        resource_type: row.try_get(5)?,
        resource_id: row.try_get(6)?,
        outcome: row.try_get(7)?,
        policy_id: row.try_get(8)?,
        decision: row.try_get(9)?,
        severity: row.try_get(10)?,
        detail: row.try_get(11)?,
        prev_hash: row.try_get(12)?,
        hash: row.try_get(13)?,
    })
}

fn ca(row: &Row) -> std::result::Result<CaRow, tokio_postgres::Error> {
    Ok(CaRow {
        id: row.try_get(0)?,
        kind: row.try_get(1)?,
        cert_pem: row.try_get(2)?,
        key_encrypted: row.try_get(3)?,
        fingerprint: row.try_get(4)?,
        not_before: row.try_get(5)?,
        not_after: row.try_get(6)?,
        created_at: row.try_get(7)?,
        retired_at: row.try_get(8)?,
    })
}

async fn insert_ca_row(tx: &deadpool_postgres::Transaction<'_>, row: &CaRow) -> Result<()> {
    tx.execute(
        &format!("INSERT INTO ca ({CA_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"),
        &[
            &row.id,
            &row.kind,
            &row.cert_pem,
            &row.key_encrypted,
            &row.fingerprint,
            &row.not_before,
            &row.not_after,
            &row.created_at,
            &row.retired_at,
        ],
    )
    .await?;
    Ok(())
}

fn join_token(row: &Row) -> std::result::Result<JoinTokenRow, tokio_postgres::Error> {
    Ok(JoinTokenRow {
        id: row.try_get(0)?,
        token_hash: row.try_get(1)?,
        agent_id: row.try_get(2)?,
        created_by: row.try_get(3)?,
        created_at: row.try_get(4)?,
        expires_at: row.try_get(5)?,
        used_at: row.try_get(6)?,
        used_by: row.try_get(7)?,
        revoked_at: row.try_get(8)?,
    })
}

/// The audit WHERE clause with `$n` placeholders, and its values ready to bind.
fn audit_where(
    filter: &AuditFilter,
    with_cursor: bool,
) -> (String, Vec<Box<dyn ToSql + Sync + Send>>) {
    let (filter_sql, values) = super::audit_where(
        filter,
        with_cursor,
        |n| format!("${n}"),
        "(o.detail::jsonb ->> 'attempt')",
    );
    let values = values
        .into_iter()
        .map(|value| -> Box<dyn ToSql + Sync + Send> {
            match value {
                SqlValue::Text(text) => Box::new(text),
                SqlValue::Int(int) => Box::new(int),
            }
        })
        .collect();
    (filter_sql, values)
}

fn bound(values: &[Box<dyn ToSql + Sync + Send>]) -> Vec<&(dyn ToSql + Sync)> {
    values
        .iter()
        .map(|value| value.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

/// The last-admin check of `update_api_key` and `delete_api_key`, inside their transaction.
const LAST_ACTIVE_ADMIN: &str = "SELECT COUNT(*) FILTER (WHERE id = $1) = 1 AND COUNT(*) = 1 \
     FROM api_keys WHERE role = 'admin' AND (expires_at IS NULL OR expires_at > $2)";

/// Inserts the batch (already linked and sealed) in one statement: one array per column.
const INSERT_AUDIT_ARRAYS: &str = "INSERT INTO audit_events (seq, id, timestamp, user_id, action, \
     resource_type, resource_id, outcome, policy_id, decision, severity, detail, prev_hash, hash) \
     SELECT * FROM UNNEST($1::BIGINT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], \
     $6::TEXT[], $7::TEXT[], $8::TEXT[], $9::TEXT[], $10::TEXT[], $11::TEXT[], $12::TEXT[], \
     $13::TEXT[], $14::TEXT[])";

fn link(rows: Vec<AuditRow>, last: (i64, String), seal: &AuditSeal) -> Vec<AuditRow> {
    let (mut seq, mut prev_hash) = last;
    rows.into_iter()
        .map(|mut row| {
            seq += 1;
            row.seq = seq;
            row.prev_hash = std::mem::take(&mut prev_hash);
            row.hash = seal(&row);
            prev_hash.clone_from(&row.hash);
            row
        })
        .collect()
}

async fn insert_audit_arrays(
    tx: &deadpool_postgres::Transaction<'_>,
    rows: &[AuditRow],
) -> std::result::Result<u64, tokio_postgres::Error> {
    fn column<'a, T>(rows: &'a [AuditRow], get: impl Fn(&'a AuditRow) -> T) -> Vec<T> {
        rows.iter().map(get).collect()
    }
    let seq = column(rows, |r| r.seq);
    let id = column(rows, |r| r.id.as_str());
    let timestamp = column(rows, |r| r.timestamp.as_str());
    let user = column(rows, |r| r.user.as_str());
    let action = column(rows, |r| r.action.as_str());
    let resource_type = column(rows, |r| r.resource_type.as_str());
    let resource_id = column(rows, |r| r.resource_id.as_str());
    let outcome = column(rows, |r| r.outcome.as_str());
    let policy_id = column(rows, |r| r.policy_id.as_deref());
    let decision = column(rows, |r| r.decision.as_deref());
    let severity = column(rows, |r| r.severity.as_str());
    let detail = column(rows, |r| r.detail.as_str());
    let prev_hash = column(rows, |r| r.prev_hash.as_str());
    let hash = column(rows, |r| r.hash.as_str());
    let statement = tx.prepare_cached(INSERT_AUDIT_ARRAYS).await?;
    tx.execute(
        &statement,
        &[
            &seq,
            &id,
            &timestamp,
            &user,
            &action,
            &resource_type,
            &resource_id,
            &outcome,
            &policy_id,
            &decision,
            &severity,
            &detail,
            &prev_hash,
            &hash,
        ],
    )
    .await
}

impl PostgresStore {
    /// The chain's last (seq, hash), or (0, genesis), read under the audit lock.
    async fn audit_tail(
        tx: &deadpool_postgres::Transaction<'_>,
        genesis: &str,
    ) -> Result<(i64, String)> {
        let statement = tx
            .prepare_cached("SELECT pg_advisory_xact_lock($1)")
            .await?;
        tx.execute(&statement, &[&AUDIT_LOCK]).await?;
        let last = rows_on(
            tx,
            "SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1",
            &[],
            |r| Ok((r.try_get(0)?, r.try_get(1)?)),
        )
        .await?;
        Ok(last
            .into_iter()
            .next()
            .unwrap_or_else(|| (0, genesis.to_string())))
    }

    /// The slow path of `append_audit_batch` after the database refused the batch as a whole:
    /// row by row, each under a savepoint, so a refused row is left out and the rest linked.
    async fn append_audit_one_by_one(
        &self,
        rows: Vec<AuditRow>,
        genesis: &str,
        seal: &AuditSeal,
    ) -> Result<Vec<Result<AuditRow>>> {
        let mut client = self.client().await?;
        let mut tx = client.transaction().await?;
        let mut last = Self::audit_tail(&tx, genesis).await?;
        let mut results = Vec::with_capacity(rows.len());
        for row in rows {
            let row = link(vec![row], last.clone(), seal).remove(0);
            let savepoint = tx.savepoint("audit_row").await?;
            match insert_audit_arrays(&savepoint, std::slice::from_ref(&row)).await {
                Ok(_) => {
                    savepoint.commit().await?;
                    last = (row.seq, row.hash.clone());
                    results.push(Ok(row));
                }
                Err(e) if e.as_db_error().is_some() => {
                    savepoint.rollback().await?;
                    results.push(Err(e.into()));
                }
                Err(e) => return Err(e.into()),
            }
        }
        tx.commit().await?;
        Ok(results)
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn driver(&self) -> &'static str {
        "postgres"
    }

    async fn ping(&self) -> Result<()> {
        self.rows("SELECT 1", &[], |_| Ok(())).await?;
        Ok(())
    }

    async fn export_sqlite(&self, path: &Path) -> Result<()> {
        self.export_into_sqlite(path).await
    }

    async fn schema_version(&self) -> Result<i64> {
        Ok(self
            .first(
                "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_version",
                &[],
                |r| r.try_get(0),
            )
            .await?
            .unwrap_or(0))
    }

    async fn insert_api_key(&self, key: &ApiKeyRow) -> Result<()> {
        self.execute(
            &format!(
                "INSERT INTO api_keys ({API_KEY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
            ),
            &[
                &key.id,
                &key.name,
                &key.role,
                &key.key_hash,
                &key.created_at,
                &key.last_used_at,
                &key.expires_at,
                &key.signing_sealed,
            ],
        )
        .await?;
        Ok(())
    }

    async fn list_api_keys(&self) -> Result<Vec<ApiKeyRow>> {
        self.rows(
            &format!("SELECT {API_KEY_COLUMNS} FROM api_keys ORDER BY id"),
            &[],
            api_key,
        )
        .await
    }

    async fn get_api_key(&self, id: &str) -> Result<Option<ApiKeyRow>> {
        self.first(
            &format!("SELECT {API_KEY_COLUMNS} FROM api_keys WHERE id = $1"),
            &[&id],
            api_key,
        )
        .await
    }

    async fn find_api_key_by_hash(&self, key_hash: &str) -> Result<Option<ApiKeyRow>> {
        self.first(
            &format!("SELECT {API_KEY_COLUMNS} FROM api_keys WHERE key_hash = $1"),
            &[&key_hash],
            api_key,
        )
        .await
    }

    async fn update_api_key(
        &self,
        id: &str,
        change: &ApiKeyChange,
        now: &str,
    ) -> Result<KeyWrite<ApiKeyRow>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // The table lock (other writers wait, readers do not) makes the count still true at
        // commit, across servers; returning early drops `tx`, which rolls back.
        tx.batch_execute("LOCK TABLE api_keys IN SHARE ROW EXCLUSIVE MODE")
            .await?;
        let takes_admin = change.role.as_deref().is_some_and(|role| role != "admin")
            || change.expires_at.is_some();
        if takes_admin {
            let last = rows_on(&tx, LAST_ACTIVE_ADMIN, &[&id, &now], |r| r.try_get(0)).await?;
            if last.first() == Some(&true) {
                return Ok(KeyWrite::LastAdmin);
            }
        }
        let updated = rows_on(
            &tx,
            &format!(
                "UPDATE api_keys SET name = COALESCE($2, name), role = COALESCE($3, role), \
                 expires_at = COALESCE($4, expires_at) WHERE id = $1 RETURNING {API_KEY_COLUMNS}"
            ),
            &[&id, &change.name, &change.role, &change.expires_at],
            api_key,
        )
        .await?;
        let Some(row) = updated.into_iter().next() else {
            return Ok(KeyWrite::NotFound);
        };
        tx.commit().await?;
        Ok(KeyWrite::Done(row))
    }

    async fn delete_api_key(&self, id: &str, now: &str) -> Result<KeyWrite<()>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.batch_execute("LOCK TABLE api_keys IN SHARE ROW EXCLUSIVE MODE")
            .await?;
        let last = rows_on(&tx, LAST_ACTIVE_ADMIN, &[&id, &now], |r| r.try_get(0)).await?;
        if last.first() == Some(&true) {
            return Ok(KeyWrite::LastAdmin);
        }
        let statement = tx
            .prepare_cached("DELETE FROM api_keys WHERE id = $1")
            .await?;
        if tx.execute(&statement, &[&id]).await? == 0 {
            return Ok(KeyWrite::NotFound);
        }
        tx.commit().await?;
        Ok(KeyWrite::Done(()))
    }

    async fn touch_api_key(&self, id: &str, used_at: &str) -> Result<()> {
        self.execute(
            "UPDATE api_keys SET last_used_at = $2 WHERE id = $1",
            &[&id, &used_at],
        )
        .await?;
        Ok(())
    }

    async fn seal_api_key(
        &self,
        id: &str,
        old_hash: &str,
        key_hash: &str,
        signing_sealed: &str,
    ) -> Result<bool> {
        Ok(self
            .execute(
                "UPDATE api_keys SET key_hash = $3, signing_sealed = $4 \
                 WHERE id = $1 AND key_hash = $2 AND signing_sealed IS NULL",
                &[&id, &old_hash, &key_hash, &signing_sealed],
            )
            .await?
            == 1)
    }

    async fn clear_plans(&self, table: PlanTable, limit: u32) -> Result<Vec<(String, String)>> {
        self.rows(&table.clear_sql("$1"), &[&i64::from(limit)], |r| {
            Ok((r.try_get(0)?, r.try_get(1)?))
        })
        .await
    }

    async fn seal_plan(
        &self,
        table: PlanTable,
        key: &str,
        old: &str,
        sealed: &str,
    ) -> Result<bool> {
        let sql = table.seal_sql(["$1", "$2", "$3"]);
        Ok(self.execute(&sql, &[&key, &old, &sealed]).await? == 1)
    }

    async fn record_file_nonce(
        &self,
        nonce: &str,
        signed_at: i64,
        forget_before: Option<i64>,
    ) -> Result<bool> {
        if let Some(before) = forget_before {
            self.execute(
                "DELETE FROM cluster_file_nonces WHERE signed_at < $1",
                &[&before],
            )
            .await?;
        }
        Ok(self
            .execute(
                "INSERT INTO cluster_file_nonces (nonce, signed_at) VALUES ($1, $2) \
                 ON CONFLICT (nonce) DO NOTHING",
                &[&nonce, &signed_at],
            )
            .await?
            == 1)
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
        // Fast path: lock, read the tail, link and seal in memory, insert every row in one
        // statement, commit. The advisory lock serializes appenders on every server sharing
        // the database, so the chain cannot fork; it is released by the commit.
        let batch = rows.len();
        let attempt = async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let last = Self::audit_tail(&tx, genesis).await?;
            let linked = link(rows, last, seal);
            match insert_audit_arrays(&tx, &linked).await {
                Ok(_) => {
                    tx.commit().await?;
                    Ok(Ok(linked))
                }
                // A row the database refused (a duplicate id): find which, below. The rows
                // come back as they are; the slow path links them again.
                Err(e) if e.as_db_error().is_some() && batch > 1 => Ok(Err(linked)),
                Err(e) => Err(Error::from(e)),
            }
        };
        match attempt.await? {
            Ok(linked) => Ok(linked.into_iter().map(Ok).collect()),
            Err(rows) => self.append_audit_one_by_one(rows, genesis, seal).await,
        }
    }

    async fn query_audit(&self, filter: &AuditFilter, limit: usize) -> Result<Vec<AuditRow>> {
        let (filter_sql, values) = audit_where(filter, true);
        let sql = format!(
            "SELECT {AUDIT_COLUMNS} FROM audit_events {filter_sql} ORDER BY seq DESC LIMIT {}",
            limit.min(100_000)
        );
        self.rows(&sql, &bound(&values), audit).await
    }

    async fn count_audit(
        &self,
        filter: &AuditFilter,
        group: AuditGroup,
    ) -> Result<Vec<(String, u64)>> {
        let (filter_sql, values) = audit_where(filter, false);
        let column = group.sql();
        let sql = format!(
            "SELECT {column} AS k, COUNT(*) FROM audit_events {filter_sql} \
             GROUP BY k ORDER BY COUNT(*) DESC, k"
        );
        self.rows(&sql, &bound(&values), |r| {
            Ok((r.try_get(0)?, r.try_get::<_, i64>(1)? as u64))
        })
        .await
    }

    async fn audit_chain(&self, after_seq: i64, limit: usize) -> Result<Vec<AuditRow>> {
        self.rows(
            &format!(
                "SELECT {AUDIT_COLUMNS} FROM audit_events WHERE seq > $1 ORDER BY seq LIMIT $2"
            ),
            &[&after_seq, &(limit as i64)],
            audit,
        )
        .await
    }

    async fn active_ca(&self) -> Result<Vec<CaRow>> {
        self.rows(
            &format!(
                "SELECT {CA_COLUMNS} FROM ca WHERE retired_at IS NULL ORDER BY created_at, id"
            ),
            &[],
            ca,
        )
        .await
    }

    async fn update_ca_key(&self, id: &str, key_encrypted: &str) -> Result<()> {
        self.execute(
            "UPDATE ca SET key_encrypted = $2 WHERE id = $1",
            &[&id, &key_encrypted],
        )
        .await?;
        Ok(())
    }

    async fn insert_ca(&self, row: &CaRow) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // Two servers rotating at once: the second waits, then sees (and retires) the first's
        // new row, so exactly one of each kind stays active.
        tx.batch_execute("LOCK TABLE ca IN SHARE ROW EXCLUSIVE MODE")
            .await?;
        tx.execute(
            "UPDATE ca SET retired_at = $2 WHERE kind = $1 AND retired_at IS NULL",
            &[&row.kind, &row.created_at],
        )
        .await?;
        insert_ca_row(&tx, row).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn insert_first_ca(&self, row: &CaRow) -> Result<Option<CaRow>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // The same lock as rotation: a second first start waits here, then finds this one's.
        tx.batch_execute("LOCK TABLE ca IN SHARE ROW EXCLUSIVE MODE")
            .await?;
        let active = rows_on(
            &tx,
            &format!(
                "SELECT {CA_COLUMNS} FROM ca WHERE kind = $1 AND retired_at IS NULL \
                 ORDER BY created_at LIMIT 1"
            ),
            &[&row.kind],
            ca,
        )
        .await?;
        if let Some(active) = active.into_iter().next() {
            return Ok(Some(active));
        }
        insert_ca_row(&tx, row).await?;
        tx.commit().await?;
        Ok(None)
    }

    async fn add_ca_generation(&self, row: &CaRow) -> Result<bool> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // The rotation lock: two rotations at once cannot both find one active row.
        tx.batch_execute("LOCK TABLE ca IN SHARE ROW EXCLUSIVE MODE")
            .await?;
        let active: i64 = tx
            .query_one(
                "SELECT COUNT(*) FROM ca WHERE kind = $1 AND retired_at IS NULL",
                &[&row.kind],
            )
            .await?
            .get(0);
        if active != 1 {
            return Ok(false);
        }
        insert_ca_row(&tx, row).await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn retire_older_ca(&self, kind: &str, at: &str) -> Result<u64> {
        self.execute(RETIRE_OLDER_CA, &[&at, &kind]).await
    }

    async fn insert_join_token(&self, row: &JoinTokenRow) -> Result<()> {
        self.execute(
            &format!(
                "INSERT INTO join_tokens ({JOIN_TOKEN_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
            ),
            &[
                &row.id,
                &row.token_hash,
                &row.agent_id,
                &row.created_by,
                &row.created_at,
                &row.expires_at,
                &row.used_at,
                &row.used_by,
                &row.revoked_at,
            ],
        )
        .await?;
        Ok(())
    }

    async fn list_join_tokens(&self) -> Result<Vec<JoinTokenRow>> {
        self.rows(
            &format!("SELECT {JOIN_TOKEN_COLUMNS} FROM join_tokens ORDER BY created_at, id"),
            &[],
            join_token,
        )
        .await
    }

    async fn find_join_token_by_hash(&self, token_hash: &str) -> Result<Option<JoinTokenRow>> {
        self.first(
            &format!("SELECT {JOIN_TOKEN_COLUMNS} FROM join_tokens WHERE token_hash = $1"),
            &[&token_hash],
            join_token,
        )
        .await
    }

    async fn revoke_join_token(&self, id: &str, revoked_at: &str) -> Result<Option<JoinTokenRow>> {
        self.execute(
            "UPDATE join_tokens SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL",
            &[&id, &revoked_at],
        )
        .await?;
        self.first(
            &format!("SELECT {JOIN_TOKEN_COLUMNS} FROM join_tokens WHERE id = $1"),
            &[&id],
            join_token,
        )
        .await
    }

    async fn use_join_token(&self, id: &str, used_at: &str, used_by: &str) -> Result<bool> {
        // One statement: PostgreSQL re-checks the WHERE on a row another transaction just
        // changed, so of two racing uses exactly one updates it.
        let changed = self
            .execute(
                "UPDATE join_tokens SET used_at = $2, used_by = $3 \
                 WHERE id = $1 AND used_at IS NULL AND revoked_at IS NULL",
                &[&id, &used_at, &used_by],
            )
            .await?;
        Ok(changed == 1)
    }

    async fn delete_finished_join_tokens(&self, now: &str) -> Result<u64> {
        self.execute(
            "DELETE FROM join_tokens WHERE revoked_at IS NOT NULL OR expires_at <= $1",
            &[&now],
        )
        .await
    }

    async fn upsert_agent(&self, row: &AgentRow) -> Result<()> {
        self.execute(
            "INSERT INTO agents (id, labels, fingerprint, enrolled_at, quarantined, public_key) \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (id) DO UPDATE SET labels = EXCLUDED.labels, \
             fingerprint = EXCLUDED.fingerprint, enrolled_at = EXCLUDED.enrolled_at, \
             public_key = EXCLUDED.public_key",
            &[
                &row.id,
                &row.labels,
                &row.fingerprint,
                &row.enrolled_at,
                &(row.is_quarantined as i64),
                &row.public_key,
            ],
        )
        .await?;
        Ok(())
    }

    async fn get_agent(&self, id: &str) -> Result<Option<AgentRow>> {
        self.first(
            &format!("SELECT {} FROM agents WHERE id = $1", AGENT_COLUMNS),
            &[&id],
            fleet::agent,
        )
        .await
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

    #[test]
    fn the_postgres_migrations_mirror_the_sqlite_ones() {
        let versions = |list: &[(i64, &str, &str)]| -> Vec<(i64, String)> {
            list.iter().map(|(v, n, _)| (*v, n.to_string())).collect()
        };
        assert_eq!(versions(MIGRATIONS), versions(super::super::MIGRATIONS));
    }

    #[test]
    fn urls_carry_tls_settings_and_never_show_the_password() {
        let target = Target::from_url(
            "postgres://svc:s3cret@db.example:6543/svc?sslmode=require&application_name=x",
        )
        .unwrap();
        assert_eq!(target.shown(), "db.example:6543/svc");
        assert!(!format!("{target:?}").contains("s3cret"));
        for (url, problem) in [
            ("", "store.url is empty"),
            ("mysql://x@y/z", "must start with postgres://"),
            (
                "postgres://x@y/z?sslmode=verify-ca",
                "'verify-ca' is not one of",
            ),
            ("postgres://x@y/z?nonsense=1", "not a PostgreSQL URL"),
            (
                "postgres://x@y/z?sslmode=verify-full&sslrootcert=%2Fno%2Fsuch.pem",
                "/no/such.pem",
            ),
        ] {
            let error = Target::from_url(url).unwrap_err().to_string();
            assert!(error.contains(problem), "{url}: {error}");
        }
    }

    #[test]
    fn percent_decoding_leaves_stray_percent_signs() {
        assert_eq!(percent_decode("%2Fetc%2Fca.pem"), "/etc/ca.pem");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
