//! The audit log (contract §9): one recording function for every mutating operation, the hash
//! chain, redaction, queries, and the policy engine in audit mode.
//!
//! `record` (with `record_failure`, for a refusal that holds no result) is the only writer of
//! audit rows. It redacts the detail, evaluates the policies
//! (recording decision and policy id, never blocking), and appends the row at the end of the
//! hash chain. Nothing updates or deletes rows; the database refuses it too (triggers).

pub mod chain;
mod commit;
pub mod policy;
pub mod redact;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};

use serde::Serialize;
use serde_json::Value;

use crate::auth::{Principal, Role};
use crate::store::{AuditFilter, AuditGroup, AuditRow, Store};
use crate::{clock, ids, Error, Result};

pub use policy::{Decision, Effect, PolicySet, Severity};

/// Owns the policy set and writes audit rows.
pub struct Auditor {
    store: Arc<dyn Store>,
    policy_dir: PathBuf,
    policies: RwLock<Arc<PolicySet>>,
    /// Where policy_allow / policy_deny go.
    events: Option<Arc<crate::events::Events>>,
    /// Rows waiting for their write transaction (group commit, see `commit`).
    queue: Arc<commit::Queue>,
    /// The `audit` stream log: a second, append-only copy of every row.
    mirror: Option<Arc<commit::Mirror>>,
    /// Set when the last row could not be written (the error); cleared by the next row that
    /// is. While set, `admit` refuses mutations (see `admit`).
    degraded: std::sync::Mutex<Option<Error>>,
    /// The attempt row `gate` wrote for a change, by the task performing it and the action,
    /// until `record` writes its outcome and links it (see `gate`).
    attempts: std::sync::Mutex<HashMap<(Performer, &'static str), String>>,
}

/// The outcome of the row `gate` writes before a change is performed: the request (who, what,
/// which resource). Its outcome follows in a second row whose detail names it (`attempt`).
pub const ATTEMPT: &str = "attempt";

/// Who performs a change: the tokio task (a request's), or the thread when it runs outside
/// any task (`block_on`: the CLIs, tests). `gate` and `record` run in the same one.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Performer {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

fn performer() -> Performer {
    match tokio::task::try_id() {
        Some(task) => Performer::Task(task),
        None => Performer::Thread(std::thread::current().id()),
    }
}

/// Every outcome a row can have.
pub const OUTCOMES: [&str; 4] = ["success", "denied", "error", ATTEMPT];

/// Attempt ids waiting for their outcome beyond this many mean callers returned between
/// `gate` and `record`; the map is cleared then (those outcomes are written unlinked).
const MAX_WAITING_ATTEMPTS: usize = 65_536;

/// What happened, before it is recorded.
#[derive(Clone)]
pub struct Action {
    /// Dotted name: `apikey.create`, `secret.read`, ...
    pub action: &'static str,
    pub resource_type: &'static str,
    pub resource_id: String,
    /// Context for the row; redacted before it is stored.
    pub detail: Value,
}

impl Action {
    pub fn new(
        action: &'static str,
        resource_type: &'static str,
        resource_id: impl Into<String>,
    ) -> Self {
        Action {
            action,
            resource_type,
            resource_id: resource_id.into(),
            detail: Value::Object(Default::default()),
        }
    }

    pub fn detail(mut self, detail: Value) -> Self {
        self.detail = detail;
        self
    }
}

/// An audit row as every surface shows it.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct Entry {
    pub id: String,
    pub seq: i64,
    pub timestamp: String,
    pub user: String,
    pub action: String,
    pub resource_type: String,
    pub resource_id: String,
    pub outcome: String,
    pub policy_id: Option<String>,
    pub decision: Option<String>,
    pub severity: String,
    pub detail: Value,
    pub prev_hash: String,
    pub hash: String,
}

impl From<AuditRow> for Entry {
    fn from(row: AuditRow) -> Self {
        let detail = serde_json::from_str(&row.detail).unwrap_or(Value::Null);
        Entry {
            detail,
            ..Entry::from_row_without_detail(row)
        }
    }
}

impl Entry {
    /// The entry of a row whose detail the caller already holds as a value (`Value::Null`
    /// here, to be filled in).
    fn from_row_without_detail(row: AuditRow) -> Self {
        Entry {
            detail: Value::Null,
            id: row.id,
            seq: row.seq,
            timestamp: row.timestamp,
            user: row.user,
            action: row.action,
            resource_type: row.resource_type,
            resource_id: row.resource_id,
            outcome: row.outcome,
            policy_id: row.policy_id,
            decision: row.decision,
            severity: row.severity,
            prev_hash: row.prev_hash,
            hash: row.hash,
        }
    }
}

/// The severity of an action before policies weigh in.
fn action_severity(action: &str) -> Severity {
    let family = action.split('.').next().unwrap_or("");
    match family {
        "ca" | "cluster" => Severity::Critical,
        "apikey" | "secret" | "transit" | "lease" | "exec" | "token" | "jwt" => Severity::High,
        _ => Severity::Medium,
    }
}

/// The outcome word for a result: refused operations are `denied`, other failures `error`
/// (`Error::is_refusal` tells them apart). The one place an outcome is derived.
pub fn outcome_of<T>(result: &Result<T>) -> &'static str {
    match result {
        Ok(_) => "success",
        Err(error) => failure_outcome(error),
    }
}

/// The outcome word of an operation that ended in `error`: `denied` or `error`.
pub fn failure_outcome(error: &Error) -> &'static str {
    if error.is_refusal() {
        "denied"
    } else {
        "error"
    }
}

impl Auditor {
    pub fn new(store: Arc<dyn Store>, policy_dir: PathBuf) -> Self {
        let auditor = Auditor {
            store,
            policy_dir,
            policies: RwLock::new(Arc::new(PolicySet::default())),
            events: None,
            queue: Arc::default(),
            mirror: None,
            degraded: std::sync::Mutex::new(None),
            attempts: Default::default(),
        };
        auditor.reload_policies();
        auditor
    }

    pub fn with_events(mut self, events: Arc<crate::events::Events>) -> Self {
        self.events = Some(events);
        self
    }

    pub fn with_mirror(mut self, mirror: Option<Arc<dyn crate::stream::Stream>>) -> Self {
        self.mirror = mirror.map(commit::Mirror::new);
        self
    }

    /// Loads the policy directory again (start and SIGHUP); bad files are logged and skipped.
    pub fn reload_policies(&self) -> usize {
        let (set, problems) = policy::load_dir(&self.policy_dir);
        for problem in problems {
            tracing::warn!(%problem, "policy file skipped");
        }
        let count = set.policies.len();
        *self.policies.write().expect("policy lock poisoned") = Arc::new(set);
        tracing::info!(count, dir = %self.policy_dir.display(), "policies loaded");
        count
    }

    pub fn policies(&self) -> Arc<PolicySet> {
        self.policies.read().expect("policy lock poisoned").clone()
    }

    /// Records one operation and its result. A failure to write is logged, not returned:
    /// the operation itself already happened and its caller must learn its real outcome. The
    /// log line carries the row's action, resource and outcome, so the record survives there,
    /// and the auditor turns degraded: `admit` refuses further mutations until a row is written.
    pub async fn record<T>(&self, principal: &Principal, action: Action, result: &Result<T>) {
        self.record_outcome(principal, action, outcome_of(result))
            .await
    }

    /// `record` for an operation that ended in `error` before it was attempted (a refusal
    /// at the transport, which holds no `Result` of the operation).
    pub async fn record_failure(&self, principal: &Principal, action: Action, error: &Error) {
        self.record_outcome(principal, action, failure_outcome(error))
            .await
    }

    async fn record_outcome(
        &self,
        principal: &Principal,
        mut action: Action,
        outcome: &'static str,
    ) {
        if let (Some(attempt), Value::Object(detail)) =
            (self.take_attempt(action.action), &mut action.detail)
        {
            detail.insert("attempt".into(), Value::String(attempt));
        }
        let (name, resource_type, resource_id) = (
            action.action,
            action.resource_type,
            action.resource_id.clone(),
        );
        if let Err(e) = self.append(principal, action, outcome).await {
            tracing::error!(
                error = ?e,
                user = %principal.name,
                action = name,
                resource = %format!("{resource_type}:{resource_id}"),
                outcome,
                "audit row could not be written; mutations are refused until one can"
            );
        }
    }

    /// Whether a mutation may go ahead: refused while the last audit row could not be written,
    /// so that nothing is performed unaudited (docs/reliability.md, "Disk full"). Call it
    /// before the change and record its refusal like any outcome: that refusal's row is the
    /// probe, and the first one stored clears the state.
    pub fn admit(&self) -> Result<()> {
        let degraded = self.degraded.lock().unwrap_or_else(PoisonError::into_inner);
        match degraded.as_ref() {
            None => Ok(()),
            Some(Error::StorageFull(cause)) => Err(Error::StorageFull(format!(
                "the audit log cannot be written ({cause}); changes are refused until it can"
            ))),
            Some(other) => Err(Error::Unavailable(format!(
                "the audit log cannot be written ({other}); changes are refused until it can"
            ))),
        }
    }

    /// Performs `change` under the audit gate. First the request is written to the chain
    /// (`intent`, outcome `attempt`: who, what, which resource) and made durable; only then
    /// does the change run, and the caller's `record` writes its outcome, linked to the
    /// attempt (`detail.attempt`). When the attempt cannot be written the change is refused
    /// (StorageFull or Unavailable, see `admit`) without being started, so no change is ever
    /// performed without a record in the chain; when the outcome cannot be written, the
    /// attempt is there (`svc-audit log` shows it without an outcome). Also refused at once
    /// while degraded. This is the one guard every domain function that changes something
    /// wraps its change in; reads do not, and are never refused. Used by: API keys,
    /// secrets and rotate-master, transit keys, leases, events, exec and state apply, fleet
    /// labels and quarantine, identity (CA rotation, join tokens, JWTs, PSKs, enrolment),
    /// files, webhooks, runbooks, blueprints, cluster operations and restore.
    pub async fn gate<T>(
        &self,
        principal: &Principal,
        intent: Action,
        change: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        self.admit()?;
        let name = intent.action;
        match self.append(principal, intent, ATTEMPT).await {
            Ok(entry) => self.await_outcome(name, entry.id),
            // `append` turned the auditor degraded: refuse as `admit` now does.
            Err(_) => {
                return Err(self.admit().err().unwrap_or_else(|| {
                    Error::Unavailable("the audit log cannot be written; change refused".into())
                }))
            }
        }
        change.await
    }

    /// Remembers the attempt row of the change this task is about to perform, for `record`.
    fn await_outcome(&self, action: &'static str, attempt: String) {
        let mut waiting = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.len() >= MAX_WAITING_ATTEMPTS {
            waiting.clear();
        }
        waiting.insert((performer(), action), attempt);
    }

    /// The attempt row this task's change of `action` wrote in `gate`, if any.
    fn take_attempt(&self, action: &'static str) -> Option<String> {
        self.attempts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(performer(), action))
    }

    /// For readiness: whether the audit log is writable. While degraded it tries to write an
    /// `audit.recover` row (by the server), so the state clears once space is back even when
    /// no client sends a mutation (a balancer that stopped routing to an unready server sends
    /// none); that row also marks in the chain where the outage ended.
    pub async fn health(&self) -> Result<()> {
        let cause = match self.admit() {
            Ok(()) => return Ok(()),
            Err(cause) => cause,
        };
        let action = Action::new("audit.recover", "audit", "").detail(serde_json::json!({
            "after": cause.to_string(),
        }));
        self.append(&Principal::server(), action, "success")
            .await
            .map(|_| ())
            .map_err(|_| cause)
    }

    /// Appends one row; returns it as stored.
    pub async fn append(
        &self,
        principal: &Principal,
        action: Action,
        outcome: &'static str,
    ) -> Result<Entry> {
        let mut detail = action.detail;
        redact::redact(&mut detail);
        let resource = format!("{}:{}", action.resource_type, action.resource_id);
        let decision = self
            .policies()
            .evaluate(action.action, principal, &resource);
        let mut severity = action_severity(action.action);
        if let Some(d) = decision.as_ref().filter(|d| d.effect == Effect::Deny) {
            severity = severity.max(d.severity);
        }
        let row = AuditRow {
            seq: 0,
            id: ids::ulid(),
            timestamp: clock::now_rfc3339(),
            user: principal.name.clone(),
            action: action.action.to_string(),
            resource_type: action.resource_type.to_string(),
            resource_id: action.resource_id,
            outcome: outcome.to_string(),
            policy_id: decision.as_ref().map(|d| d.policy_id.clone()),
            decision: decision.as_ref().map(|d| match d.effect {
                Effect::Allow => "allow".to_string(),
                Effect::Deny => "deny".to_string(),
            }),
            severity: severity.to_string(),
            detail: detail.to_string(),
            prev_hash: String::new(),
            hash: String::new(),
        };
        // Stored together with the rows of concurrent callers, then copied to the mirror.
        let appended = self
            .queue
            .append(&self.store, self.mirror.as_ref(), row, detail)
            .await;
        *self.degraded.lock().unwrap_or_else(PoisonError::into_inner) = match &appended {
            Ok(_) => None,
            Err(Error::StorageFull(cause)) => Some(Error::StorageFull(cause.clone())),
            Err(other) => Some(Error::Unavailable(other.to_string())),
        };
        let entry = appended?;
        // A policy's decision is announced once per change: with its outcome, not its attempt.
        let decision = decision.filter(|_| outcome != ATTEMPT);
        if let (Some(events), Some(decision)) = (&self.events, &decision) {
            let event_type = match decision.effect {
                Effect::Allow => crate::events::EventKind::PolicyAllow,
                Effect::Deny => crate::events::EventKind::PolicyDeny,
            };
            let payload = serde_json::json!({
                "policy_id": decision.policy_id, "action": entry.action, "user": entry.user,
                "resource": resource, "audit_id": entry.id,
            });
            events.emit_system(event_type, "policy", payload).await;
        }
        Ok(entry)
    }
}

/// A page of audit entries.
#[derive(Debug, Serialize)]
pub struct Page {
    pub items: Vec<Entry>,
    pub next_cursor: Option<String>,
}

/// Filters as the CLIs and RPCs give them (times as RFC 3339 or durations ago).
#[derive(Clone, Debug, Default)]
pub struct Query {
    pub since: Option<String>,
    pub until: Option<String>,
    pub user: Option<String>,
    pub action: Option<String>,
    pub resource_type: Option<String>,
    pub policy_id: Option<String>,
    pub min_severity: Option<String>,
    pub outcome: Option<String>,
    pub limit: Option<u32>,
    pub cursor: Option<String>,
    /// Also the attempt rows of finished changes (see `ATTEMPT`; hidden otherwise).
    pub attempts: bool,
}

pub const DEFAULT_PAGE: u32 = 50;
pub const MAX_PAGE: u32 = 1000;

fn time_bound(text: &Option<String>, name: &str) -> Result<Option<String>> {
    match text.as_deref().filter(|t| !t.is_empty()) {
        None => Ok(None),
        Some(t) => clock::parse_time_or_ago(t)
            .map(|ms| Some(clock::format_rfc3339(ms)))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{name} '{t}' is neither RFC 3339 nor a duration like 24h"
                ))
            }),
    }
}

fn non_empty(value: &Option<String>) -> Option<String> {
    value.clone().filter(|v| !v.is_empty())
}

impl Query {
    fn to_filter(&self) -> Result<AuditFilter> {
        let severities = match non_empty(&self.min_severity) {
            None => Vec::new(),
            Some(min) => {
                let min = Severity::parse(&min).ok_or_else(|| {
                    Error::Invalid(format!(
                        "min severity '{min}' is not one of {}",
                        policy::SEVERITIES.join(", ")
                    ))
                })?;
                Severity::ALL
                    .into_iter()
                    .filter(|s| *s >= min)
                    .map(|s| s.to_string())
                    .collect()
            }
        };
        let before_seq = match non_empty(&self.cursor) {
            None => None,
            Some(cursor) => Some(
                cursor
                    .parse::<i64>()
                    .map_err(|_| Error::Invalid(format!("invalid cursor '{cursor}'")))?,
            ),
        };
        Ok(AuditFilter {
            since: time_bound(&self.since, "since")?,
            until: time_bound(&self.until, "until")?,
            user: non_empty(&self.user),
            action: non_empty(&self.action),
            resource_type: non_empty(&self.resource_type),
            policy_id: non_empty(&self.policy_id),
            outcome: match non_empty(&self.outcome) {
                Some(o) if !OUTCOMES.contains(&o.as_str()) => {
                    return Err(Error::Invalid(format!(
                        "outcome '{o}' is not one of {}",
                        OUTCOMES.join(", ")
                    )))
                }
                outcome => outcome,
            },
            decision: None,
            severities,
            before_seq,
            attempts: self.attempts,
        })
    }
}

/// `svc-audit log`: newest first, paged by cursor.
pub async fn log(store: &dyn Store, principal: &Principal, query: &Query) -> Result<Page> {
    principal.require(Role::Readonly)?;
    page(store, query, None).await
}

/// `svc-policy violations`: audited actions a policy denied (audit mode records, never blocks).
pub async fn violations(store: &dyn Store, principal: &Principal, query: &Query) -> Result<Page> {
    principal.require(Role::Readonly)?;
    page(store, query, Some("deny")).await
}

async fn page(store: &dyn Store, query: &Query, decision: Option<&str>) -> Result<Page> {
    let limit = query
        .limit
        .filter(|l| *l > 0)
        .unwrap_or(DEFAULT_PAGE)
        .min(MAX_PAGE) as usize;
    let mut filter = query.to_filter()?;
    filter.decision = decision.map(str::to_string);
    // One extra row tells whether another page exists.
    let mut rows = store.query_audit(&filter, limit + 1).await?;
    let next_cursor = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|r| r.seq.to_string())
    } else {
        None
    };
    Ok(Page {
        items: rows.into_iter().map(Entry::from).collect(),
        next_cursor,
    })
}

/// A time window; `since` defaults to `default_since` ago.
fn window(
    since: &Option<String>,
    until: &Option<String>,
    default_since: &str,
) -> Result<AuditFilter> {
    let since = match non_empty(since) {
        Some(s) => Some(s),
        None => Some(default_since.to_string()),
    };
    Ok(AuditFilter {
        since: time_bound(&since, "since")?,
        until: time_bound(until, "until")?,
        ..AuditFilter::default()
    })
}

/// `svc-audit stats`: headline counts over a window (default the last 24 h).
#[derive(Debug, Serialize)]
pub struct Stats {
    pub since: String,
    pub until: Option<String>,
    pub total: u64,
    pub by_outcome: Vec<(String, u64)>,
    pub by_severity: Vec<(String, u64)>,
    pub by_action: Vec<(String, u64)>,
    pub by_user: Vec<(String, u64)>,
}

pub async fn stats(
    store: &dyn Store,
    principal: &Principal,
    since: &Option<String>,
    until: &Option<String>,
) -> Result<Stats> {
    principal.require(Role::Readonly)?;
    let filter = window(since, until, "24h")?;
    let by_outcome = store.count_audit(&filter, AuditGroup::Outcome).await?;
    let total = by_outcome.iter().map(|(_, n)| n).sum();
    let top = |mut counts: Vec<(String, u64)>| {
        counts.truncate(10);
        counts
    };
    Ok(Stats {
        since: filter.since.clone().unwrap_or_default(),
        until: filter.until.clone(),
        total,
        by_outcome,
        by_severity: store.count_audit(&filter, AuditGroup::Severity).await?,
        by_action: top(store.count_audit(&filter, AuditGroup::Action).await?),
        by_user: top(store.count_audit(&filter, AuditGroup::User).await?),
    })
}

/// `svc-audit report` / `svc-policy compliance` over a window (default the last 30 days).
#[derive(Debug, Serialize)]
pub struct Report {
    pub since: String,
    pub until: Option<String>,
    pub total: u64,
    /// Rows a policy denied (audit mode: recorded, not blocked).
    pub violations: u64,
    /// Rows refused by the role check (outcome `denied`).
    pub refused: u64,
    /// (total - violations) / total; 1.0 for an empty window.
    pub compliance_rate: f64,
    pub top_violations: Vec<(String, u64)>,
    /// (day, total, violations), oldest first.
    pub trend: Vec<(String, u64, u64)>,
}

pub async fn report(
    store: &dyn Store,
    principal: &Principal,
    since: &Option<String>,
    until: &Option<String>,
) -> Result<Report> {
    principal.require(Role::Readonly)?;
    let filter = window(since, until, "30d")?;
    let denied_filter = AuditFilter {
        decision: Some("deny".into()),
        ..filter.clone()
    };
    let by_day = store.count_audit(&filter, AuditGroup::Day).await?;
    let violations_by_day = store.count_audit(&denied_filter, AuditGroup::Day).await?;
    let mut top_violations = store
        .count_audit(&denied_filter, AuditGroup::PolicyId)
        .await?;
    top_violations.truncate(10);
    let refused = store
        .count_audit(
            &AuditFilter {
                outcome: Some("denied".into()),
                ..filter.clone()
            },
            AuditGroup::Outcome,
        )
        .await?
        .iter()
        .map(|(_, n)| n)
        .sum();
    let total: u64 = by_day.iter().map(|(_, n)| n).sum();
    let violations: u64 = violations_by_day.iter().map(|(_, n)| n).sum();
    let mut trend: Vec<(String, u64, u64)> = by_day
        .into_iter()
        .map(|(day, n)| {
            let v = violations_by_day
                .iter()
                .find(|(d, _)| *d == day)
                .map(|(_, v)| *v)
                .unwrap_or(0);
            (day, n, v)
        })
        .collect();
    trend.sort();
    Ok(Report {
        since: filter.since.clone().unwrap_or_default(),
        until: filter.until.clone(),
        total,
        violations,
        refused,
        compliance_rate: if total == 0 {
            1.0
        } else {
            (total - violations) as f64 / total as f64
        },
        top_violations,
        trend,
    })
}

/// Export formats of `svc-audit export`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    Json,
    Jsonl,
    Csv,
}

impl std::str::FromStr for ExportFormat {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "" | "jsonl" => Ok(ExportFormat::Jsonl),
            "json" => Ok(ExportFormat::Json),
            "csv" => Ok(ExportFormat::Csv),
            other => Err(Error::Invalid(format!(
                "export format '{other}' is not json, jsonl or csv"
            ))),
        }
    }
}

const CSV_COLUMNS: &[&str] = &[
    "id",
    "timestamp",
    "user",
    "action",
    "resource_type",
    "resource_id",
    "outcome",
    "policy_id",
    "decision",
    "severity",
    "detail",
    "prev_hash",
    "hash",
];

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// `svc-audit export` (admin): the rows as chunks of CSV or JSON Lines in the returned
/// channel. The role is checked before anything streams, so a readonly caller gets
/// "forbidden", not an empty file; when the receiver goes away the export stops.
pub fn open_export(
    domain: &Arc<crate::domain::Domain>,
    principal: &Principal,
    format: ExportFormat,
    since: Option<String>,
    until: Option<String>,
) -> Result<tokio::sync::mpsc::Receiver<Result<Vec<u8>>>> {
    principal.require(Role::Admin)?;
    let (sender, receiver) = tokio::sync::mpsc::channel(8);
    let domain = domain.clone();
    let principal = principal.clone();
    tokio::spawn(async move {
        let store = domain.store.as_ref();
        let result = export(store, &principal, format, &since, &until, &sender).await;
        if let Err(error) = result {
            let _ = sender.send(Err(error)).await;
        }
    });
    Ok(receiver)
}

/// Streams the log (chain order, redacted again on the way out) as chunks of bytes into
/// `out`; stops early when the receiver goes away. Admin only: an export is the whole history.
pub async fn export(
    store: &dyn Store,
    principal: &Principal,
    format: ExportFormat,
    since: &Option<String>,
    until: &Option<String>,
    out: &tokio::sync::mpsc::Sender<Result<Vec<u8>>>,
) -> Result<u64> {
    principal.require(Role::Admin)?;
    let since = time_bound(since, "since")?;
    let until = time_bound(until, "until")?;
    let mut after = 0;
    let mut count = 0u64;
    let mut header = match format {
        ExportFormat::Json => b"[".to_vec(),
        ExportFormat::Jsonl => Vec::new(),
        ExportFormat::Csv => format!("{}\n", CSV_COLUMNS.join(",")).into_bytes(),
    };
    loop {
        let rows = store.audit_chain(after, 1000).await?;
        let Some(last) = rows.last() else { break };
        after = last.seq;
        let mut chunk = std::mem::take(&mut header);
        for row in rows {
            if since.as_ref().is_some_and(|s| row.timestamp < *s)
                || until.as_ref().is_some_and(|u| row.timestamp >= *u)
            {
                continue;
            }
            let mut entry = Entry::from(row);
            redact::redact(&mut entry.detail);
            match format {
                ExportFormat::Json => {
                    if count > 0 {
                        chunk.push(b',');
                    }
                    chunk.extend(serde_json::to_vec(&entry).map_err(Error::internal)?);
                }
                ExportFormat::Jsonl => {
                    chunk.extend(serde_json::to_vec(&entry).map_err(Error::internal)?);
                    chunk.push(b'\n');
                }
                ExportFormat::Csv => {
                    let fields = [
                        entry.id,
                        entry.timestamp,
                        entry.user,
                        entry.action,
                        entry.resource_type,
                        entry.resource_id,
                        entry.outcome,
                        entry.policy_id.unwrap_or_default(),
                        entry.decision.unwrap_or_default(),
                        entry.severity,
                        entry.detail.to_string(),
                        entry.prev_hash,
                        entry.hash,
                    ];
                    let line: Vec<String> = fields.iter().map(|f| csv_field(f)).collect();
                    chunk.extend(line.join(",").into_bytes());
                    chunk.push(b'\n');
                }
            }
            count += 1;
        }
        if !chunk.is_empty() && out.send(Ok(chunk)).await.is_err() {
            return Ok(count);
        }
    }
    let tail = match format {
        ExportFormat::Json if count == 0 && !header.is_empty() => b"[]\n".to_vec(),
        ExportFormat::Json => b"]\n".to_vec(),
        _ => std::mem::take(&mut header),
    };
    if !tail.is_empty() {
        let _ = out.send(Ok(tail)).await;
    }
    Ok(count)
}

/// The result of walking the whole chain.
#[derive(Debug, Serialize)]
pub struct Verification {
    pub ok: bool,
    pub rows: u64,
    pub first_bad: Option<String>,
    pub detail: Option<String>,
}

/// `svc-audit verify`: walks the chain in order and names the first bad row.
pub async fn verify(store: &dyn Store, principal: &Principal) -> Result<Verification> {
    principal.require(Role::Readonly)?;
    let mut verifier = chain::Verifier::default();
    let mut after = 0;
    loop {
        let rows = store.audit_chain(after, 1000).await?;
        let Some(last) = rows.last() else { break };
        after = last.seq;
        for row in &rows {
            if let Err(broken) = verifier.check(row) {
                return Ok(Verification {
                    ok: false,
                    rows: verifier.rows,
                    first_bad: Some(broken.id),
                    detail: Some(format!("row {}: {}", broken.seq, broken.reason)),
                });
            }
        }
    }
    Ok(Verification {
        ok: true,
        rows: verifier.rows,
        first_bad: None,
        detail: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_denied_and_failures_error() {
        let denied = [
            Error::Forbidden("role".into()),
            Error::Unauthenticated("token used".into()),
            Error::Refused("link-local".into()),
            Error::FailedPrecondition("last admin key".into()),
            Error::Unimplemented("policies are files".into()),
        ];
        for error in denied {
            assert_eq!(outcome_of::<()>(&Err(error)), "denied");
        }
        let failed = [
            Error::Invalid("bad ttl".into()),
            Error::Malformed("not JSON".into()),
            Error::NotFound("agent".into()),
            Error::Unavailable("audit".into()),
            Error::Internal("bug".into()),
        ];
        for error in failed {
            assert_eq!(outcome_of::<()>(&Err(error)), "error");
        }
        assert_eq!(outcome_of(&Ok(())), "success");
        // A refusal by rule answers as invalid input does; only the audit outcome differs.
        let refused = Error::Refused("x".into());
        assert_eq!(
            (refused.http_status(), refused.code()),
            (422, "invalid_argument")
        );
        assert_eq!(
            tonic::Status::from(refused).code(),
            tonic::Code::InvalidArgument
        );
    }

    #[tokio::test]
    async fn record_chains_redacts_and_pages() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(crate::store::SqliteStore::open(&dir.path().join("db")).unwrap());
        let auditor = Auditor::new(store.clone(), dir.path().join("policies"));
        let admin = Principal::server();
        for i in 0..5 {
            let action = Action::new("apikey.create", "apikey", format!("k{i}"))
                .detail(serde_json::json!({"name": "ci", "key": "svc_secret"}));
            auditor.record(&admin, action, &Ok::<(), Error>(())).await;
        }
        auditor
            .record(
                &admin,
                Action::new("apikey.delete", "apikey", "k9"),
                &Err::<(), _>(Error::Forbidden("no".into())),
            )
            .await;
        let page = log(
            store.as_ref(),
            &admin,
            &Query {
                limit: Some(4),
                ..Query::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(page.items.len(), 4);
        assert_eq!(page.items[0].action, "apikey.delete");
        assert_eq!(page.items[0].outcome, "denied");
        assert_eq!(page.items[1].detail["key"], "[REDACTED]");
        let next = Query {
            limit: Some(4),
            cursor: page.next_cursor,
            ..Query::default()
        };
        let page2 = log(store.as_ref(), &admin, &next).await.unwrap();
        assert_eq!(page2.items.len(), 2);
        assert!(page2.next_cursor.is_none());
        let filtered = Query {
            action: Some("apikey.d*".into()),
            ..Query::default()
        };
        assert_eq!(
            log(store.as_ref(), &admin, &filtered)
                .await
                .unwrap()
                .items
                .len(),
            1
        );
        let verification = verify(store.as_ref(), &admin).await.unwrap();
        assert!(verification.ok, "{verification:?}");
        assert_eq!(verification.rows, 6);
    }
}

/// The audit gate over every kind of change (docs/reliability.md, "Disk full"): once a row
/// cannot be written, each change below is refused before it starts, reads go on, and the
/// first row written again (readiness's `audit.recover`) lets changes through.
#[cfg(test)]
mod gate_tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use crate::auth::Principal;
    use crate::Error;

    use super::{log, verify, Action, Query, ATTEMPT};
    use crate::store::Store;

    fn is_refused<T: std::fmt::Debug>(what: &str, result: crate::Result<T>) {
        match result {
            Err(Error::Unavailable(message)) if message.contains("audit log cannot be written") => {
            }
            other => panic!("{what} was not refused by the audit gate: {other:?}"),
        }
    }

    #[tokio::test]
    async fn every_kind_of_change_is_refused_while_the_audit_log_cannot_be_written() {
        let (domain, dir, _) = crate::secrets::testing::domain().await;
        let domain = Arc::new(domain);
        let admin = Principal::server();
        crate::secrets::transit::create_key(&domain, &admin, "k", "aes256-gcm")
            .await
            .unwrap();
        let blocker = rusqlite::Connection::open(dir.path().join("svc.db")).unwrap();
        blocker
            .execute_batch(
                "CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_events \
                 BEGIN SELECT RAISE(ABORT, 'audit refused by the test'); END;",
            )
            .unwrap();
        // A read whose row fails: answered, and the auditor turns degraded.
        let keys = crate::secrets::transit::list_keys(&domain, &admin).await;
        assert_eq!(keys.unwrap().len(), 1);
        assert!(domain.auditor.admit().is_err());

        // Each would otherwise succeed or fail for its own reason (not found, not clustered):
        // the gate answers first.
        use crate::secrets::{leases, transit};
        is_refused(
            "transit create-key",
            transit::create_key(&domain, &admin, "k2", "aes256-gcm").await,
        );
        is_refused(
            "transit rotate",
            transit::rotate(&domain, &admin, "k").await,
        );
        is_refused(
            "transit config",
            transit::set_min_decryption_version(&domain, &admin, "k", 1).await,
        );
        is_refused(
            "lease revoke",
            leases::revoke(&domain, &admin, "nope").await,
        );
        is_refused(
            "lease revoke-prefix",
            leases::revoke_prefix(&domain, &admin, "db/").await,
        );
        is_refused(
            "token create",
            crate::identity::create_token(&domain, &admin, Default::default()).await,
        );
        is_refused(
            "token revoke",
            crate::identity::revoke_token(&domain, &admin, "nope").await,
        );
        is_refused(
            "token cleanup",
            crate::identity::cleanup_tokens(&domain, &admin).await,
        );
        is_refused(
            "jwt revoke",
            crate::identity::jwt::revoke_jwt(&domain, &admin, "nope").await,
        );
        is_refused(
            "ca rotate-signing",
            crate::identity::rotate_signing(&domain, &admin).await,
        );
        is_refused("psk", crate::identity::psk(&domain, &admin, "web-1").await);
        is_refused(
            "agent quarantine",
            crate::fleet::quarantine(&domain, &admin, "web-1", "test").await,
        );
        is_refused(
            "webhook create",
            crate::webhooks::create(
                &domain,
                &admin,
                crate::webhooks::NewWebhook {
                    url: "https://example.com/hook".into(),
                    event_types: vec!["*".into()],
                    category: String::new(),
                    min_severity: String::new(),
                    description: String::new(),
                    secret: String::new(),
                },
            )
            .await,
        );
        is_refused(
            "webhook delete",
            crate::webhooks::delete(&domain, &admin, "nope").await,
        );
        is_refused(
            "runbook execute",
            crate::runbooks::execute(&domain, &admin, "nope", BTreeMap::new(), false).await,
        );
        is_refused(
            "blueprint remove",
            crate::blueprint::catalogue::remove(&domain, &admin, "nope", false).await,
        );
        is_refused(
            "cluster remove",
            crate::cluster::ops::remove(&domain, &admin, "m2").await,
        );
        is_refused(
            "cluster rebalance",
            crate::cluster::ops::rebalance(&domain, &admin).await,
        );
        // Reads go on, and nothing was changed.
        let keys = crate::secrets::transit::list_keys(&domain, &admin)
            .await
            .unwrap();
        assert_eq!((keys.len(), keys[0].latest_version), (1, 1));

        blocker.execute_batch("DROP TRIGGER refuse_audit;").unwrap();
        domain.auditor.health().await.unwrap();
        let rotated = transit::rotate(&domain, &admin, "k").await.unwrap();
        assert_eq!(rotated.latest_version, 2);
    }

    /// Vault's rule: the request is in the chain before the change runs, and its outcome
    /// follows, naming it. An outcome that cannot be written leaves the attempt there, and
    /// the chain still verifies.
    #[tokio::test]
    async fn a_change_is_recorded_before_it_runs_and_its_outcome_after() {
        let (domain, dir, _) = crate::secrets::testing::domain().await;
        let admin = Principal::server();
        let newest = |store: Arc<dyn Store>| async move {
            let page = log(store.as_ref(), &Principal::server(), &Query::default()).await;
            page.unwrap().items.remove(0)
        };
        let action = || Action::new("secret.write", "secret", "db/x");
        let store = domain.store.clone();
        let seen = domain
            .auditor
            .gate(&admin, action(), async { Ok(newest(store).await) })
            .await
            .unwrap();
        assert_eq!(
            (
                seen.outcome.as_str(),
                seen.action.as_str(),
                seen.resource_id.as_str()
            ),
            (ATTEMPT, "secret.write", "db/x")
        );
        domain
            .auditor
            .record(&admin, action(), &Ok::<_, Error>(()))
            .await;
        let outcome = newest(domain.store.clone()).await;
        assert_eq!(outcome.outcome, "success");
        assert_eq!(outcome.detail["attempt"], seen.id.as_str());

        // Outcomes cannot be written, attempts can: the change ran, its attempt stays.
        let blocker = rusqlite::Connection::open(dir.path().join("svc.db")).unwrap();
        blocker
            .execute_batch(
                "CREATE TRIGGER refuse_outcomes BEFORE INSERT ON audit_events \
                 WHEN NEW.outcome <> 'attempt' \
                 BEGIN SELECT RAISE(ABORT, 'outcome refused by the test'); END;",
            )
            .unwrap();
        let ran = domain.auditor.gate(&admin, action(), async { Ok(7) }).await;
        assert_eq!(ran.unwrap(), 7);
        domain
            .auditor
            .record(&admin, action(), &Ok::<_, Error>(()))
            .await;
        blocker
            .execute_batch("DROP TRIGGER refuse_outcomes;")
            .unwrap();
        let left = newest(domain.store.clone()).await;
        assert_eq!(left.outcome, ATTEMPT);
        let verified = verify(domain.store.as_ref(), &admin).await.unwrap();
        assert!(verified.ok, "{verified:?}");
    }
}
