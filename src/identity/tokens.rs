//! Join tokens: one-shot enrolment credentials. The cleartext is shown once, at creation;
//! the store keeps its SHA-256. A token is unused, used, revoked or expired (in that order of
//! precedence when several apply: revoked wins over used, used over expired).

use std::time::Duration;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::store::{JoinTokenRow, Store};
use crate::{clock, ids, Error, Result};

/// Cleartext tokens look like `svcjt_` + 40 base62 characters.
const TOKEN_PREFIX: &str = "svcjt_";
const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);

fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.trim().as_bytes()))
}

/// The state word of a token at `now` (RFC 3339).
pub fn token_state(row: &JoinTokenRow, now: &str) -> &'static str {
    if row.revoked_at.is_some() {
        "revoked"
    } else if row.used_at.is_some() {
        "used"
    } else if row.expires_at.as_str() <= now {
        "expired"
    } else {
        "unused"
    }
}

/// A token as every surface shows it (never the hash).
#[derive(Clone, Debug, Serialize)]
pub struct TokenView {
    pub id: String,
    pub state: String,
    pub agent_id: Option<String>,
    pub created_by: String,
    pub created_at: String,
    pub expires_at: String,
    pub used_at: Option<String>,
    pub used_by: Option<String>,
    pub revoked_at: Option<String>,
}

fn view(row: JoinTokenRow, now: &str) -> TokenView {
    TokenView {
        state: token_state(&row, now).into(),
        id: row.id,
        agent_id: row.agent_id,
        created_by: row.created_by,
        created_at: row.created_at,
        expires_at: row.expires_at,
        used_at: row.used_at,
        used_by: row.used_by,
        revoked_at: row.revoked_at,
    }
}

#[derive(Clone, Debug, Default)]
pub struct NewToken {
    /// Default 24h.
    pub ttl: Option<Duration>,
    /// Bind the token to this agent id.
    pub agent_id: Option<String>,
}

/// The created token: its record and the cleartext, shown this once.
#[derive(Clone, Debug, Serialize)]
pub struct CreatedToken {
    #[serde(flatten)]
    pub token: TokenView,
    #[serde(rename = "token")]
    pub cleartext: String,
}

/// `token create` (operator or admin).
pub async fn create_token(
    domain: &Domain,
    principal: &Principal,
    new: NewToken,
) -> Result<CreatedToken> {
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("token.create", "join_token", ""),
            async {
                principal.require(Role::Operator)?;
                if let Some(agent_id) = &new.agent_id {
                    super::validate_agent_id(agent_id)?;
                }
                let ttl = new.ttl.unwrap_or(DEFAULT_TTL);
                if ttl.is_zero() {
                    return Err(Error::Invalid("--ttl must be positive".into()));
                }
                let cleartext = format!("{TOKEN_PREFIX}{}", ids::random_base62(40));
                let now_ms = clock::now_millis();
                let row = JoinTokenRow {
                    id: ids::ulid(),
                    token_hash: hash(&cleartext),
                    agent_id: new.agent_id.clone(),
                    created_by: principal.id.clone(),
                    created_at: clock::format_rfc3339(now_ms),
                    expires_at: clock::format_rfc3339(
                        now_ms.saturating_add(ttl.as_millis() as i64),
                    ),
                    ..JoinTokenRow::default()
                };
                domain.store.insert_join_token(&row).await?;
                let now = clock::now_rfc3339();
                Ok(CreatedToken {
                    token: view(row, &now),
                    cleartext,
                })
            },
        )
        .await;
    let (id, detail) = match &result {
        Ok(created) => (
            created.token.id.clone(),
            serde_json::json!({"agent_id": created.token.agent_id, "expires_at": created.token.expires_at}),
        ),
        Err(_) => (String::new(), serde_json::json!({"agent_id": new.agent_id})),
    };
    domain
        .auditor
        .record(
            principal,
            Action::new("token.create", "join_token", id).detail(detail),
            &result,
        )
        .await;
    result
}

#[derive(Clone, Copy, Debug, Default)]
pub struct TokenFilter {
    /// Only tokens never used (nor revoked).
    pub unused: bool,
    /// Only tokens not yet expired.
    pub unexpired: bool,
}

/// `token list` (readonly and up: no secret is shown).
pub async fn list_tokens(
    domain: &Domain,
    principal: &Principal,
    filter: TokenFilter,
) -> Result<Vec<TokenView>> {
    principal.require(Role::Readonly)?;
    let now = clock::now_rfc3339();
    Ok(domain
        .store
        .list_join_tokens()
        .await?
        .into_iter()
        .filter(|row| !filter.unused || (row.used_at.is_none() && row.revoked_at.is_none()))
        .filter(|row| !filter.unexpired || row.expires_at > now)
        .map(|row| view(row, &now))
        .collect())
}

/// `token revoke ID` (admin). Revoking twice is not an error; the first time is kept.
pub async fn revoke_token(domain: &Domain, principal: &Principal, id: &str) -> Result<TokenView> {
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("token.revoke", "join_token", id),
            async {
                principal.require(Role::Admin)?;
                let now = clock::now_rfc3339();
                match domain.store.revoke_join_token(id, &now).await? {
                    Some(row) => Ok(view(row, &now)),
                    None => Err(Error::NotFound(format!("join token '{id}' not found"))),
                }
            },
        )
        .await;
    domain
        .auditor
        .record(
            principal,
            Action::new("token.revoke", "join_token", id),
            &result,
        )
        .await;
    result
}

/// `token cleanup` (admin): removes revoked and expired tokens; used ones stay as history.
pub async fn cleanup_tokens(domain: &Domain, principal: &Principal) -> Result<u64> {
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("token.cleanup", "join_token", "*"),
            async {
                principal.require(Role::Admin)?;
                domain
                    .store
                    .delete_finished_join_tokens(&clock::now_rfc3339())
                    .await
            },
        )
        .await;
    let detail = match &result {
        Ok(removed) => serde_json::json!({"removed": removed}),
        Err(_) => serde_json::json!({}),
    };
    domain
        .auditor
        .record(
            principal,
            Action::new("token.cleanup", "join_token", "*").detail(detail),
            &result,
        )
        .await;
    result
}

/// How often the leader removes expired and revoked join tokens by itself.
const TOKEN_CLEANUP_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes finished join tokens once an hour on the leader (the admin's `token cleanup` does
/// the same at once); audited only when something was removed.
pub fn spawn_token_cleanup(domain: std::sync::Arc<Domain>) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(TOKEN_CLEANUP_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            if !domain.cluster.is_leader() {
                continue;
            }
            let result = domain
                .store
                .delete_finished_join_tokens(&clock::now_rfc3339())
                .await;
            match &result {
                Ok(0) => continue,
                Ok(removed) => tracing::info!(removed, "finished join tokens removed"),
                Err(error) => tracing::warn!(%error, "join token cleanup failed"),
            }
            let detail = serde_json::json!({"removed": result.as_ref().ok(), "scheduled": true});
            domain
                .auditor
                .record(
                    &Principal::server(),
                    Action::new("token.cleanup", "join_token", "*").detail(detail),
                    &result,
                )
                .await;
        }
    });
}

/// The token row for an enrolment, if it may be used by `agent_id` now; otherwise the clear
/// refusal the agent is shown.
pub(super) async fn check_for_enrolment(
    store: &dyn Store,
    token: &str,
    agent_id: &str,
) -> Result<JoinTokenRow> {
    let row = store
        .find_join_token_by_hash(&hash(token))
        .await?
        .ok_or_else(|| Error::Unauthenticated("unknown join token".into()))?;
    let refusal = match token_state(&row, &clock::now_rfc3339()) {
        "revoked" => Some("join token revoked"),
        "used" => Some("join token already used"),
        "expired" => Some("join token expired"),
        _ => None,
    };
    if let Some(refusal) = refusal {
        return Err(Error::Unauthenticated(refusal.into()));
    }
    if let Some(bound) = &row.agent_id {
        if bound != agent_id {
            return Err(Error::Unauthenticated(format!(
                "join token is bound to agent id '{bound}'"
            )));
        }
    }
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states() {
        let base = JoinTokenRow {
            expires_at: "2026-01-02T00:00:00.000Z".into(),
            ..JoinTokenRow::default()
        };
        let now = "2026-01-01T00:00:00.000Z";
        let later = "2026-01-03T00:00:00.000Z";
        let used = JoinTokenRow {
            used_at: Some(now.into()),
            ..base.clone()
        };
        let revoked = JoinTokenRow {
            revoked_at: Some(now.into()),
            ..used.clone()
        };
        let cases = [
            (&base, now, "unused"),
            (&base, later, "expired"),
            (&used, later, "used"),
            (&revoked, now, "revoked"),
        ];
        for (row, at, expected) in cases {
            assert_eq!(token_state(row, at), expected);
        }
    }
}
