//! The state store: the `Store` trait every domain module talks to, and its drivers.
//!
//! SQLite (default) lives in `sqlite.rs`, PostgreSQL in `postgres.rs`, behind the same traits.
//! Both hold one schema: the same tables, columns and meanings (TEXT timestamps in RFC 3339,
//! INTEGER/BIGINT numbers and 0/1 flags), so rows copy between them unchanged (svc-migrate).
//! The migrations in `migrations/` (SQLite) and `migrations/postgres/` (the same versions in
//! PostgreSQL's dialect) are embedded in the binary and applied in order at start.

mod blueprints;
mod columns;
pub mod copy;
mod fleet;
mod jwt;
pub mod postgres;
mod secrets;
mod sqlite;
pub mod tables;
mod webhooks;

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use crate::config::{StoreConfig, StoreDriver};
use crate::Result;

pub use blueprints::{BlueprintAgentRow, BlueprintApplyRow, BlueprintRow, BlueprintStore};
pub use fleet::{AgentStateRow, FleetStore, JobResultRow, JobRow};
pub use jwt::{JwtStore, JwtSvidRow};
pub use postgres::PostgresStore;
pub use secrets::{
    LeaseRow, Rewrap, SecretRow, SecretStore, SecretVersionRow, TransitKeyRow, TransitVersionRow,
    Wrapped,
};
pub use sqlite::{insert_audit_row, SqliteStore, INSERT_AUDIT_SQL};
pub use webhooks::{
    DeliveryRow, DeliveryStatus, ExecutionRow, ExecutionStatus, RunbookStore, StepRow, StepStatus,
    UnknownStatus, WebhookRow, WebhookStore,
};

/// Every migration, in order. A migration is never edited once released: add a new one.
pub const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "api_keys", include_str!("migrations/0001_api_keys.sql")),
    (2, "audit", include_str!("migrations/0002_audit.sql")),
    (3, "secrets", include_str!("migrations/0003_secrets.sql")),
    (4, "identity", include_str!("migrations/0004_identity.sql")),
    (5, "fleet", include_str!("migrations/0005_fleet.sql")),
    (
        6,
        "jwt_svids",
        include_str!("migrations/0006_jwt_svids.sql"),
    ),
    (7, "cluster", include_str!("migrations/0007_cluster.sql")),
    (
        8,
        "blueprints",
        include_str!("migrations/0008_blueprints.sql"),
    ),
    (
        9,
        "runbooks_webhooks",
        include_str!("migrations/0009_runbooks_webhooks.sql"),
    ),
    (
        10,
        "agent_facts",
        include_str!("migrations/0010_agent_facts.sql"),
    ),
    (11, "jobs", include_str!("migrations/0011_jobs.sql")),
    (
        12,
        "sealed_at_rest",
        include_str!("migrations/0012_sealed_at_rest.sql"),
    ),
    (
        13,
        "audit_attempts",
        include_str!("migrations/0013_audit_attempts.sql"),
    ),
    (
        14,
        "agents_quarantined_index",
        include_str!("migrations/0014_agents_quarantined_index.sql"),
    ),
    (
        15,
        "agent_public_key",
        include_str!("migrations/0015_agent_public_key.sql"),
    ),
];

/// A stored API key (never the key itself: only a hash, and its file-request signing key
/// sealed; `auth::keys`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiKeyRow {
    pub id: String,
    pub name: String,
    pub role: String,
    pub key_hash: String,
    pub created_at: String,
    pub last_used_at: Option<String>,
    pub expires_at: Option<String>,
    /// The file service's HMAC key for this key, sealed; None for a row from before
    /// migration 0012 (its `key_hash` is then that HMAC key, until the next start seals it).
    pub signing_sealed: Option<String>,
}

/// The tables whose `plan` column holds rendered plans, which may carry what secret
/// parameters rendered into: sealed at rest (`secrets::at_rest`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanTable {
    AgentStates,
    BlueprintApplies,
}

impl PlanTable {
    pub const ALL: [PlanTable; 2] = [PlanTable::AgentStates, PlanTable::BlueprintApplies];

    /// The table and its key column.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            PlanTable::AgentStates => ("agent_states", "agent_id"),
            PlanTable::BlueprintApplies => ("blueprint_applies", "id"),
        }
    }

    /// `SELECT key, plan` of the rows whose plan is clear (sealed ones start with `sealed:`).
    fn clear_sql(self, limit_parameter: &str) -> String {
        let (table, key) = self.names();
        format!(
            "SELECT {key}, plan FROM {table} WHERE substr(plan, 1, 7) <> 'sealed:' \
             ORDER BY {key} LIMIT {limit_parameter}"
        )
    }

    /// `UPDATE` of one row's plan from (key, old) to the sealed one, in parameter order.
    fn seal_sql(self, p: [&str; 3]) -> String {
        let (table, key) = self.names();
        format!(
            "UPDATE {table} SET plan = {} WHERE {key} = {} AND plan = {}",
            p[2], p[0], p[1]
        )
    }
}

/// A change to an API key; `None` leaves the field as it is.
#[derive(Clone, Debug, Default)]
pub struct ApiKeyChange {
    pub name: Option<String>,
    pub role: Option<String>,
    /// A new expiry (RFC 3339 as `clock::format_rfc3339` writes it).
    pub expires_at: Option<String>,
}

/// The outcome of a change to `api_keys` that must not delete, demote or set an expiry on
/// the last active admin key (role admin, `expires_at` unset or after the given `now`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyWrite<T> {
    Done(T),
    NotFound,
    /// Refused, nothing changed: the key is the last active admin key.
    LastAdmin,
}

/// One audit row as stored. `seq` orders the hash chain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditRow {
    pub seq: i64,
    pub id: String,
    pub timestamp: String,
    pub user: String,
    pub action: String,
    pub resource_type: String,
    pub resource_id: String,
    pub outcome: String,
    pub policy_id: Option<String>,
    pub decision: Option<String>,
    pub severity: String,
    /// Redacted JSON object, as text.
    pub detail: String,
    pub prev_hash: String,
    pub hash: String,
}

/// Filters of an audit query; every field narrows the result.
#[derive(Clone, Debug, Default)]
pub struct AuditFilter {
    pub since: Option<String>,
    pub until: Option<String>,
    pub user: Option<String>,
    /// A glob on the dotted action (`secret.*`); `*` matches any run of characters.
    pub action: Option<String>,
    pub resource_type: Option<String>,
    pub policy_id: Option<String>,
    pub outcome: Option<String>,
    /// `allow` or `deny`: the policy decision recorded on the row.
    pub decision: Option<String>,
    /// Only these severities (the domain expands `--min-severity`).
    pub severities: Vec<String>,
    /// Newest first, strictly before this seq (paging).
    pub before_seq: Option<i64>,
    /// Also the attempt rows whose outcome row is stored (hidden otherwise: one row per
    /// finished change, see `audit::ATTEMPT`). An attempt without an outcome always shows.
    pub attempts: bool,
}

/// A column audit rows can be counted by (a closed set, so it can go into SQL as is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuditGroup {
    Action,
    Outcome,
    Severity,
    PolicyId,
    User,
    /// The UTC day, `YYYY-MM-DD`.
    Day,
}

impl AuditGroup {
    pub fn sql(self) -> &'static str {
        match self {
            AuditGroup::Action => "action",
            AuditGroup::Outcome => "outcome",
            AuditGroup::Severity => "severity",
            AuditGroup::PolicyId => "COALESCE(policy_id, '')",
            AuditGroup::User => "user_id",
            AuditGroup::Day => "SUBSTR(timestamp, 1, 10)",
        }
    }
}

/// Seals a row about to be appended: given the row with `prev_hash` set, returns its hash.
pub type AuditSeal = dyn Fn(&AuditRow) -> String + Send + Sync;

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// "sqlite" or "postgres", for health and logs.
    fn driver(&self) -> &'static str;
    /// A cheap round trip, for readiness.
    async fn ping(&self) -> Result<()>;
    /// The highest applied migration.
    async fn schema_version(&self) -> Result<i64>;

    async fn insert_api_key(&self, row: &ApiKeyRow) -> Result<()>;
    async fn list_api_keys(&self) -> Result<Vec<ApiKeyRow>>;
    async fn get_api_key(&self, id: &str) -> Result<Option<ApiKeyRow>>;
    async fn find_api_key_by_hash(&self, key_hash: &str) -> Result<Option<ApiKeyRow>>;
    /// Applies `change`, unless it demotes or sets an expiry on the last active admin key at
    /// `now`; the check and the change are one write transaction, so two admins demoting
    /// each other at once cannot both succeed.
    async fn update_api_key(
        &self,
        id: &str,
        change: &ApiKeyChange,
        now: &str,
    ) -> Result<KeyWrite<ApiKeyRow>>;
    /// Deletes a key, unless it is the last active admin key at `now` (one write
    /// transaction, as `update_api_key`).
    async fn delete_api_key(&self, id: &str, now: &str) -> Result<KeyWrite<()>>;
    async fn touch_api_key(&self, id: &str, used_at: &str) -> Result<()>;
    /// Gives a key row from before migration 0012 its new hash and sealed signing key, unless
    /// it changed since it was read (`old_hash`) or was converted already; true when written.
    async fn seal_api_key(
        &self,
        id: &str,
        old_hash: &str,
        key_hash: &str,
        signing_sealed: &str,
    ) -> Result<bool>;
    /// Up to `limit` rows of `table` whose plan is not sealed yet (from before migration
    /// 0012): (key, plan).
    async fn clear_plans(&self, table: PlanTable, limit: u32) -> Result<Vec<(String, String)>>;
    /// Replaces a row's clear plan `old` by `sealed`, unless it changed since it was read.
    async fn seal_plan(&self, table: PlanTable, key: &str, old: &str, sealed: &str)
        -> Result<bool>;
    /// Records a signed file request's nonce (cluster mode: shared by every member), first
    /// deleting those signed before `forget_before` when given; false when it was recorded
    /// already (a replay). PostgreSQL only: cluster mode needs it.
    async fn record_file_nonce(
        &self,
        nonce: &str,
        signed_at: i64,
        forget_before: Option<i64>,
    ) -> Result<bool>;

    /// Appends an audit row at the end of the chain: sets `seq` and `prev_hash` (the last
    /// row's hash, or `genesis`), then `hash` from `seal`, all in one write transaction.
    async fn append_audit(
        &self,
        row: AuditRow,
        genesis: &str,
        seal: &AuditSeal,
    ) -> Result<AuditRow> {
        self.append_audit_batch(vec![row], genesis, seal)
            .await?
            .pop()
            .unwrap_or_else(|| Err(crate::Error::internal("audit batch returned no row")))
    }
    /// Appends rows at the end of the chain in the given order, in one write transaction, each
    /// linked as `append_audit` links one. A row the database refuses gets its own error and
    /// stays out of the chain (the next row links to the one before it); the others are still
    /// stored. `Err` means the transaction as a whole failed and no row of the batch is stored.
    async fn append_audit_batch(
        &self,
        rows: Vec<AuditRow>,
        genesis: &str,
        seal: &AuditSeal,
    ) -> Result<Vec<Result<AuditRow>>>;
    /// Rows matching `filter`, newest first, at most `limit`.
    async fn query_audit(&self, filter: &AuditFilter, limit: usize) -> Result<Vec<AuditRow>>;
    /// Row counts matching `filter` (its `before_seq` ignored), grouped, largest first.
    async fn count_audit(
        &self,
        filter: &AuditFilter,
        group: AuditGroup,
    ) -> Result<Vec<(String, u64)>>;
    /// Rows in chain order with `seq > after_seq`, at most `limit` (verify and export).
    async fn audit_chain(&self, after_seq: i64, limit: usize) -> Result<Vec<AuditRow>>;

    /// The secrets tables (KV, transit, leases, master-key check).
    fn secrets(&self) -> &dyn SecretStore;
    /// The fleet tables (registry, quarantine, heartbeats, applied states).
    fn fleet(&self) -> &dyn FleetStore;
    /// The identity-token table (issued JWT-SVIDs and their revocation).
    fn jwts(&self) -> &dyn JwtStore;
    /// The outbound webhook tables (subscriptions, deliveries, cursors).
    fn webhooks(&self) -> &dyn WebhookStore;
    /// The runbook execution tables.
    fn runbooks(&self) -> &dyn RunbookStore;
    fn blueprints(&self) -> &dyn BlueprintStore;
    /// The active (not retired) CA rows.
    async fn active_ca(&self) -> Result<Vec<CaRow>>;
    /// Replaces a CA row's sealed key (master-key rotation).
    async fn update_ca_key(&self, id: &str, key_encrypted: &str) -> Result<()>;
    /// Inserts `row` and retires the active CA of its kind at `row.created_at` in the same
    /// transaction, so there is never more or less than one (signing-CA rotation).
    async fn insert_ca(&self, row: &CaRow) -> Result<()>;
    /// Inserts `row` only when no CA of its kind is active, in one transaction; returns the
    /// active row that was found instead (None: `row` was inserted). First starts of several
    /// servers on one database then agree on one CA.
    async fn insert_first_ca(&self, row: &CaRow) -> Result<Option<CaRow>>;
    /// Inserts `row` beside the active row of its kind, only when exactly one is active, in
    /// one transaction (command-key rotation: the previous key stays active for its grace);
    /// false when another is still beside it.
    async fn add_ca_generation(&self, row: &CaRow) -> Result<bool>;
    /// Retires every active row of `kind` but the newest at `at`; returns how many.
    async fn retire_older_ca(&self, kind: &str, at: &str) -> Result<u64>;
    async fn insert_join_token(&self, row: &JoinTokenRow) -> Result<()>;
    async fn list_join_tokens(&self) -> Result<Vec<JoinTokenRow>>;
    async fn find_join_token_by_hash(&self, token_hash: &str) -> Result<Option<JoinTokenRow>>;
    /// Sets revoked_at unless already revoked; returns the row (None: unknown id).
    async fn revoke_join_token(&self, id: &str, revoked_at: &str) -> Result<Option<JoinTokenRow>>;
    /// Marks an unused, unrevoked token used; false when another use won the race.
    async fn use_join_token(&self, id: &str, used_at: &str, used_by: &str) -> Result<bool>;
    /// Deletes revoked tokens and tokens that expired before `now`; returns how many.
    async fn delete_finished_join_tokens(&self, now: &str) -> Result<u64>;
    /// Inserts or replaces the agent's enrolment (labels, fingerprint, time), keeping its
    /// quarantine flag.
    async fn upsert_agent(&self, row: &AgentRow) -> Result<()>;
    async fn get_agent(&self, id: &str) -> Result<Option<AgentRow>>;

    /// Writes a consistent copy of the whole store to a new SQLite file at `path` (which
    /// must not exist), for snapshots: SQLite copies itself with `VACUUM INTO`; PostgreSQL
    /// reads every catalogue table in one REPEATABLE READ transaction into a file made by
    /// `SqliteStore::open`. The server keeps serving meanwhile.
    async fn export_sqlite(&self, path: &Path) -> Result<()>;
}

/// A CA certificate and its encrypted key (identity).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaRow {
    pub id: String,
    /// `root` or `signing`.
    pub kind: String,
    pub cert_pem: String,
    /// AES-256-GCM under master_key; never cleartext.
    pub key_encrypted: String,
    pub fingerprint: String,
    pub not_before: String,
    pub not_after: String,
    pub created_at: String,
    pub retired_at: Option<String>,
}

/// A join token as stored (only its hash).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JoinTokenRow {
    pub id: String,
    pub token_hash: String,
    pub agent_id: Option<String>,
    pub created_by: String,
    pub created_at: String,
    pub expires_at: String,
    pub used_at: Option<String>,
    pub used_by: Option<String>,
    pub revoked_at: Option<String>,
}

/// An enrolled agent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentRow {
    pub id: String,
    /// JSON object, as text.
    pub labels: String,
    pub fingerprint: String,
    pub enrolled_at: String,
    pub is_quarantined: bool,
    pub quarantine_reason: Option<String>,
    pub quarantined_at: Option<String>,
    pub last_heartbeat_at: Option<String>,
    /// What the agent last reported about its host: a JSON object, as text (`crate::facts`);
    /// None until it reports.
    pub facts: Option<String>,
    /// The agent certificate's public key (base64url of the P-256 point) that its results
    /// and heartbeats must be signed with (`fleet::agent_signature`); None for an agent
    /// enrolled before signing, or by an svc-agent that does not sign.
    pub public_key: Option<String>,
}

/// Opens the configured store and applies pending migrations.
pub async fn open(config: &StoreConfig, data_dir: &Path) -> Result<Arc<dyn Store>> {
    match config.driver {
        StoreDriver::Sqlite => Ok(Arc::new(SqliteStore::open(&data_dir.join("svc.db"))?)),
        StoreDriver::Postgres => {
            let target = postgres::Target::from_config(config)?;
            Ok(Arc::new(PostgresStore::open(&target).await?))
        }
    }
}

/// A value bound to a driver's statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SqlValue {
    Text(String),
    Int(i64),
}

/// The WHERE clause of an audit query and its values, with the driver's placeholder for the
/// n-th value (`?n` on SQLite, `$n` on PostgreSQL). Empty when nothing filters.
pub(crate) fn audit_where(
    filter: &AuditFilter,
    with_cursor: bool,
    placeholder: fn(usize) -> String,
    attempt_of: &str,
) -> (String, Vec<SqlValue>) {
    let mut clauses = Vec::new();
    let mut values = Vec::new();
    let mut push = |clause: &str, value: SqlValue| {
        values.push(value);
        clauses.push(clause.replace('?', &placeholder(values.len())));
    };
    let text = |v: &String| SqlValue::Text(v.clone());
    if let Some(v) = &filter.since {
        push("timestamp >= ?", text(v));
    }
    if let Some(v) = &filter.until {
        push("timestamp < ?", text(v));
    }
    if let Some(v) = &filter.user {
        push("user_id = ?", text(v));
    }
    if let Some(v) = &filter.action {
        push("action LIKE ? ESCAPE '\\'", SqlValue::Text(glob_to_like(v)));
    }
    if let Some(v) = &filter.resource_type {
        push("resource_type = ?", text(v));
    }
    if let Some(v) = &filter.policy_id {
        push("policy_id = ?", text(v));
    }
    if let Some(v) = &filter.outcome {
        push("outcome = ?", text(v));
    }
    if let Some(v) = &filter.decision {
        push("decision = ?", text(v));
    }
    if let Some(v) = filter.before_seq.filter(|_| with_cursor) {
        push("seq < ?", SqlValue::Int(v));
    }
    if !filter.severities.is_empty() {
        let mut placeholders = Vec::new();
        for severity in &filter.severities {
            values.push(SqlValue::Text(severity.clone()));
            placeholders.push(placeholder(values.len()));
        }
        clauses.push(format!("severity IN ({})", placeholders.join(", ")));
    }
    if !filter.attempts {
        // `attempt_of` is the driver's expression for a row's detail.attempt, written as its
        // migration 13 index is, so the lookup uses the index.
        clauses.push(format!(
            "NOT (outcome = 'attempt' AND EXISTS (SELECT 1 FROM audit_events o \
             WHERE {attempt_of} = audit_events.id))"
        ));
    }
    let filter_sql = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    (filter_sql, values)
}

/// A glob with `*` as a LIKE pattern, escaping LIKE's own wildcards.
fn glob_to_like(glob: &str) -> String {
    let mut like = String::with_capacity(glob.len());
    for c in glob.chars() {
        match c {
            '*' => like.push('%'),
            '%' | '_' | '\\' => {
                like.push('\\');
                like.push(c);
            }
            c => like.push(c),
        }
    }
    like
}

/// A prefix as a LIKE pattern (with `ESCAPE '\'`) that matches it literally.
pub(crate) fn prefix_like(prefix: &str) -> String {
    let mut like = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '%' | '_' | '\\') {
            like.push('\\');
        }
        like.push(c);
    }
    like.push('%');
    like
}
