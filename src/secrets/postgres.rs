//! The PostgreSQL dynamic-credential backend: a lease is a LOGIN role with a random password
//! and `VALID UNTIL` its expiry; renewing moves `VALID UNTIL`; revoking ends the role's
//! sessions and drops it (with anything it owns).
//!
//! Connects with the admin URL (`secrets.postgres.url`) per operation: leases are created and
//! revoked rarely, and a fresh connection never carries a broken session into the next call.
//! Role names are generated here (`svc_` + lowercase ULID), so quoting them is safe; the
//! password is base62, so it is safe inside a literal. Neither is ever logged.

use std::time::Duration;

use tokio_postgres::NoTls;

use crate::{Error, Result};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A role name made by `new_role_name`; checked again before it meets SQL.
fn checked(role: &str) -> Result<&str> {
    let ok = role.starts_with("svc_")
        && role.len() <= 63
        && role
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(role)
    } else {
        Err(Error::Internal(format!("refusing role name '{role}'")))
    }
}

pub fn new_role_name(lease_ulid: &str) -> String {
    format!("svc_{}", lease_ulid.to_ascii_lowercase())
}

async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    if url.is_empty() {
        return Err(Error::Invalid(
            "the postgres secrets backend is not configured (set secrets.postgres.url)".into(),
        ));
    }
    let connecting = tokio_postgres::connect(url, NoTls);
    let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| Error::Unavailable("postgres backend: connection timed out".into()))?
        .map_err(|e| Error::Unavailable(format!("postgres backend: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "postgres backend connection ended");
        }
    });
    Ok(client)
}

fn failed(e: tokio_postgres::Error) -> Error {
    Error::Unavailable(format!("postgres backend: {e}"))
}

/// Creates the LOGIN role, valid until `valid_until` (RFC 3339).
pub async fn create_role(url: &str, role: &str, password: &str, valid_until: &str) -> Result<()> {
    let role = checked(role)?;
    if !crate::ids::is_base62(password) {
        return Err(Error::Internal("refusing a non-base62 password".into()));
    }
    let client = connect(url).await?;
    let statement = format!(
        "CREATE ROLE \"{role}\" WITH LOGIN PASSWORD '{password}' VALID UNTIL '{valid_until}'"
    );
    client.batch_execute(&statement).await.map_err(failed)
}

/// Moves the role's `VALID UNTIL`.
pub async fn extend_role(url: &str, role: &str, valid_until: &str) -> Result<()> {
    let role = checked(role)?;
    let client = connect(url).await?;
    client
        .batch_execute(&format!(
            "ALTER ROLE \"{role}\" VALID UNTIL '{valid_until}'"
        ))
        .await
        .map_err(failed)
}

/// Ends the role's sessions and drops it; a role that is already gone is fine.
pub async fn drop_role(url: &str, role: &str) -> Result<()> {
    let role = checked(role)?;
    let client = connect(url).await?;
    let exists = client
        .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
        .await
        .map_err(failed)?
        .is_some();
    if !exists {
        return Ok(());
    }
    client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
            &[&role],
        )
        .await
        .map_err(failed)?;
    client
        .batch_execute(&format!(
            "REASSIGN OWNED BY \"{role}\" TO CURRENT_USER; DROP OWNED BY \"{role}\"; DROP ROLE IF EXISTS \"{role}\""
        ))
        .await
        .map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_are_checked() {
        let name = new_role_name(&crate::ids::ulid());
        assert!(checked(&name).is_ok(), "{name}");
        for bad in ["postgres", "svc_\"; DROP", "svc_X", ""] {
            assert!(checked(bad).is_err(), "{bad}");
        }
    }
}
