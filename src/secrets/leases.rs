//! Dynamic-secret leases: create (through a backend), list, show, renew, revoke, and the
//! reaper that revokes expired leases on its own.
//!
//! Lease state lives in the store, so the reaper picks up where it left off after a restart:
//! a lease that expired while the server was down is revoked at the first tick. A revocation
//! that fails (backend down) stays pending with its error recorded and is retried with
//! back-off. The only backend today is PostgreSQL (`postgres.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::{audited, postgres, store};
use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::store::LeaseRow;
use crate::{clock, ids, Error, Result};

pub const POSTGRES: &str = "postgres";
const POSTGRES_PATH: &str = "postgres/creds";
/// How often the reaper looks for expired leases.
const REAP_INTERVAL: Duration = Duration::from_secs(1);
const REAP_BATCH: usize = 100;
const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);

/// A lease as every surface shows it (no password).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Lease {
    pub id: String,
    pub path: String,
    pub backend: String,
    pub created_at: String,
    pub expires_at: String,
    pub max_expires_at: String,
    pub renewable: bool,
    /// What the lease stands for (e.g. `{"username": "svc_..."}`); never a password.
    pub data: serde_json::Value,
    pub revoked_at: Option<String>,
    pub last_error: Option<String>,
}

impl From<LeaseRow> for Lease {
    fn from(row: LeaseRow) -> Self {
        Lease {
            data: serde_json::from_str(&row.backend_data).unwrap_or(serde_json::Value::Null),
            id: row.id,
            path: row.path,
            backend: row.backend,
            created_at: row.created_at,
            expires_at: row.expires_at,
            max_expires_at: row.max_expires_at,
            renewable: row.is_renewable,
            revoked_at: row.revoked_at,
            last_error: row.last_error,
        }
    }
}

/// Credentials handed out once with their lease. `Debug` hides the password.
#[derive(Clone, Serialize)]
pub struct Credentials {
    pub lease: Lease,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("lease", &self.lease.id)
            .field("username", &self.username)
            .field("password", &"[REDACTED]")
            .finish()
    }
}

fn role_of(row: &LeaseRow) -> Result<String> {
    let data: serde_json::Value = serde_json::from_str(&row.backend_data)
        .map_err(|e| Error::Internal(format!("lease '{}': {e}", row.id)))?;
    data["username"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| Error::Internal(format!("lease '{}' names no role", row.id)))
}

fn at_offset(now_ms: i64, duration: Duration) -> String {
    clock::format_rfc3339(now_ms.saturating_add(duration.as_millis() as i64))
}

/// `svc-secrets creds postgres [--ttl D]`: a new LOGIN role and its lease.
pub async fn create_credentials(
    domain: &Domain,
    principal: &Principal,
    backend: &str,
    ttl: Option<Duration>,
) -> Result<Credentials> {
    let result = domain
        .auditor
        .gate(principal, Action::new("lease.create", "lease", ""), async {
            principal.require(Role::Operator)?;
            if backend != POSTGRES {
                return Err(Error::Invalid(format!(
                    "unknown credentials backend '{backend}' (expected {POSTGRES})"
                )));
            }
            let config = domain.secrets.config().postgres;
            let max_ttl = config.max_ttl.0;
            let ttl = ttl.unwrap_or(config.default_ttl.0).min(max_ttl);
            if ttl.is_zero() {
                return Err(Error::Invalid("a lease needs a positive TTL".into()));
            }
            let ulid = ids::ulid();
            let username = postgres::new_role_name(&ulid);
            let password = ids::random_base62(32);
            let now = clock::now_millis();
            let row = LeaseRow {
                id: format!("{POSTGRES_PATH}/{ulid}"),
                path: POSTGRES_PATH.into(),
                backend: POSTGRES.into(),
                backend_data: json!({ "username": username }).to_string(),
                created_at: clock::format_rfc3339(now),
                expires_at: at_offset(now, ttl),
                max_expires_at: at_offset(now, max_ttl),
                is_renewable: true,
                revoked_at: None,
                last_error: None,
            };
            // The lease is stored first: if the server dies right after the role is made, the
            // reaper still knows the role and drops it at expiry.
            store(domain).insert_lease(&row).await?;
            if let Err(e) =
                postgres::create_role(config.url.expose(), &username, &password, &row.expires_at)
                    .await
            {
                store(domain)
                    .mark_lease_revoked(&row.id, &clock::now_rfc3339())
                    .await?;
                return Err(e);
            }
            Ok(Credentials {
                lease: row.into(),
                username,
                password,
            })
        })
        .await;
    let lease_id = result
        .as_ref()
        .map(|c| c.lease.id.clone())
        .unwrap_or_default();
    let detail = json!({ "backend": POSTGRES, "ttl": ttl.map(clock::format_duration) });
    audited(
        domain,
        principal,
        Action::new("lease.create", "lease", lease_id).detail(detail),
        result,
    )
    .await
}

/// `leases list [PREFIX]`: unrevoked leases.
pub async fn list(domain: &Domain, principal: &Principal, prefix: &str) -> Result<Vec<Lease>> {
    let result = async {
        principal.require(Role::Operator)?;
        let rows = store(domain).list_leases(prefix).await?;
        Ok(rows.into_iter().map(Lease::from).collect())
    }
    .await;
    audited(
        domain,
        principal,
        Action::new("lease.list", "lease", prefix),
        result,
    )
    .await
}

async fn find(domain: &Domain, id: &str) -> Result<LeaseRow> {
    store(domain)
        .get_lease(id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("lease '{id}' not found")))
}

/// `leases show ID`.
pub async fn show(domain: &Domain, principal: &Principal, id: &str) -> Result<Lease> {
    let result = async {
        principal.require(Role::Operator)?;
        Ok(find(domain, id).await?.into())
    }
    .await;
    audited(
        domain,
        principal,
        Action::new("lease.read", "lease", id),
        result,
    )
    .await
}

/// `leases renew ID [--increment D]`: expiry becomes now + increment (default: the backend's
/// default TTL), capped by the lease's max expiry.
pub async fn renew(
    domain: &Domain,
    principal: &Principal,
    id: &str,
    increment: Option<Duration>,
) -> Result<Lease> {
    let result = domain
        .auditor
        .gate(principal, Action::new("lease.renew", "lease", id), async {
            principal.require(Role::Operator)?;
            let row = find(domain, id).await?;
            if row.revoked_at.is_some() {
                return Err(Error::NotFound(format!("lease '{id}' was revoked")));
            }
            let now = clock::now_millis();
            if clock::parse_rfc3339(&row.expires_at).is_some_and(|at| at <= now) {
                return Err(Error::Invalid(format!("lease '{id}' has expired")));
            }
            let increment = increment.unwrap_or(domain.secrets.config().postgres.default_ttl.0);
            let wanted = at_offset(now, increment);
            let expires_at = wanted.min(row.max_expires_at.clone());
            if row.backend == POSTGRES {
                let url = domain.secrets.config().postgres.url;
                postgres::extend_role(url.expose(), &role_of(&row)?, &expires_at).await?;
            }
            store(domain).set_lease_expiry(id, &expires_at).await?;
            Ok(Lease {
                expires_at,
                ..row.into()
            })
        })
        .await;
    let detail = json!({ "increment": increment.map(clock::format_duration),
        "expires_at": result.as_ref().ok().map(|l| l.expires_at.clone()) });
    audited(
        domain,
        principal,
        Action::new("lease.renew", "lease", id).detail(detail),
        result,
    )
    .await
}

/// Revokes at the backend, then records it.
async fn revoke_row(domain: &Domain, row: &LeaseRow) -> Result<()> {
    if row.backend == POSTGRES {
        let url = domain.secrets.config().postgres.url;
        postgres::drop_role(url.expose(), &role_of(row)?).await?;
    }
    store(domain)
        .mark_lease_revoked(&row.id, &clock::now_rfc3339())
        .await?;
    Ok(())
}

/// `leases revoke ID`.
pub async fn revoke(domain: &Domain, principal: &Principal, id: &str) -> Result<u64> {
    let result = domain
        .auditor
        .gate(principal, Action::new("lease.revoke", "lease", id), async {
            principal.require(Role::Operator)?;
            let row = find(domain, id).await?;
            if row.revoked_at.is_some() {
                return Ok(0);
            }
            revoke_row(domain, &row).await?;
            Ok(1)
        })
        .await;
    audited(
        domain,
        principal,
        Action::new("lease.revoke", "lease", id),
        result,
    )
    .await
}

/// `leases revoke --prefix P`: every unrevoked lease whose id starts with P.
pub async fn revoke_prefix(domain: &Domain, principal: &Principal, prefix: &str) -> Result<u64> {
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("lease.revoke_prefix", "lease", prefix),
            async {
                principal.require(Role::Operator)?;
                if prefix.is_empty() {
                    return Err(Error::Invalid(
                        "revoke --prefix needs a non-empty prefix".into(),
                    ));
                }
                let mut count = 0;
                for row in store(domain).list_leases(prefix).await? {
                    revoke_row(domain, &row).await?;
                    count += 1;
                }
                Ok(count)
            },
        )
        .await;
    let detail = json!({ "revoked": result.as_ref().ok() });
    audited(
        domain,
        principal,
        Action::new("lease.revoke_prefix", "lease", prefix).detail(detail),
        result,
    )
    .await
}

/// Revokes what expired; failed revocations wait in `retry` (lease id → next attempt).
async fn reap(domain: &Domain, retry: &mut HashMap<String, (Instant, Duration)>) {
    let expired = match store(domain)
        .expired_leases(&clock::now_rfc3339(), REAP_BATCH)
        .await
    {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "lease reaper cannot read leases");
            return;
        }
    };
    let server = Principal::server();
    for row in expired {
        if retry
            .get(&row.id)
            .is_some_and(|(at, _)| *at > Instant::now())
        {
            continue;
        }
        let result = revoke_row(domain, &row).await;
        match &result {
            Ok(()) => {
                retry.remove(&row.id);
                tracing::info!(lease = %row.id, "expired lease revoked");
            }
            Err(e) => {
                let delay = retry
                    .get(&row.id)
                    .map(|(_, d)| (*d * 2).min(MAX_RETRY_DELAY))
                    .unwrap_or(REAP_INTERVAL);
                retry.insert(row.id.clone(), (Instant::now() + delay, delay));
                tracing::warn!(lease = %row.id, error = %e, retry_in = ?delay, "expired lease not revoked yet");
                let _ = store(domain).set_lease_error(&row.id, &e.to_string()).await;
            }
        }
        let action =
            Action::new("lease.revoke", "lease", &row.id).detail(json!({ "reason": "expired" }));
        domain.auditor.record(&server, action, &result).await;
    }
}

/// Starts the reaper on the current runtime; it runs until the runtime stops.
pub fn spawn_reaper(domain: Arc<Domain>) {
    tokio::spawn(async move {
        let mut retry = HashMap::new();
        let mut ticks = tokio::time::interval(REAP_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            // Leader-only work in a cluster: one member revokes, not all at once.
            if domain.cluster.is_leader() {
                reap(&domain, &mut retry).await;
            }
        }
    });
}
