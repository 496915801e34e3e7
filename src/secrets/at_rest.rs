//! What the store keeps sealed beside the secrets engine's own values, so that a copy of the
//! database alone (a dump, a stolen file, a snapshot) holds nothing usable without master_key:
//! rendered plans (`agent_states.plan`, `blueprint_applies.plan`), which carry what secret
//! parameters and values rendered into, and the file service's request-signing keys
//! (`api_keys.signing_sealed`, see `auth::keys`).
//!
//! They are sealed (AES-256-GCM, bound to their row as associated data) by one data key,
//! itself wrapped by master_key in `data_keys` under [`NAME`]: a master-key rotation re-wraps
//! that one row in the secrets' rotation transaction, however many rows it seals. The data key
//! itself never changes, so a server keeps it once unwrapped.
//!
//! Rows written before migration 0012 are clear: they are read as they are, and sealed at the
//! next start ([`seal_stored`]).

use super::crypto::{self, AeadKey};
use crate::domain::Domain;
use crate::store::{PlanTable, Store};
use crate::{clock, Error, Result};

/// The `data_keys` row of the at-rest key.
pub const NAME: &str = "at-rest";
/// What a sealed column value starts with (a clear plan is JSON: `{` or `[`).
const PREFIX: &str = "sealed:";
/// Rows sealed per read at start, so a large history is never held whole.
const BATCH: u32 = 100;

pub(super) fn data_key_aad(name: &str) -> Vec<u8> {
    format!("data_key:{name}").into_bytes()
}

/// The store's at-rest key, unwrapped with `master_key`; made on first use (servers sharing a
/// database agree on the first one stored).
pub async fn load(store: &dyn Store, master_key: &[u8; 32]) -> Result<AeadKey> {
    let master = AeadKey::new(master_key);
    let aad = data_key_aad(NAME);
    let wrapped = match store.secrets().data_key(NAME).await? {
        Some(wrapped) => wrapped,
        None => {
            let fresh = master.seal_text(&crypto::random_key(), &aad);
            store
                .secrets()
                .init_data_key(NAME, &fresh, &clock::now_rfc3339())
                .await?
        }
    };
    let bytes = master
        .open_text(&wrapped, &aad)
        .ok()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .ok_or_else(|| {
            Error::Internal(
                "the at-rest data key failed authentication: tampered store or wrong master_key"
                    .into(),
            )
        })?;
    Ok(AeadKey::new(&bytes))
}

/// The running server's at-rest key (loaded once: rotations re-wrap it, never change it).
pub async fn key(domain: &Domain) -> Result<&AeadKey> {
    if let Some(key) = domain.secrets.at_rest.get() {
        return Ok(key);
    }
    let master = domain
        .secrets
        .current_master()
        .ok_or_else(|| Error::Unavailable("the secrets engine has no master key".into()))?;
    let key = load(domain.store.as_ref(), &master).await?;
    Ok(domain.secrets.at_rest.get_or_init(|| key))
}

/// `value` sealed for the row `context` names, as a column stores it.
pub fn seal(key: &AeadKey, context: &str, value: &str) -> String {
    format!(
        "{PREFIX}{}",
        key.seal_text(value.as_bytes(), context.as_bytes())
    )
}

/// A column's value: opened when sealed, as it is when clear (a row from before 0012 that no
/// start has sealed yet).
pub fn open(key: &AeadKey, context: &str, stored: &str) -> Result<String> {
    let Some(sealed) = stored.strip_prefix(PREFIX) else {
        return Ok(stored.to_string());
    };
    let plain = key.open_text(sealed, context.as_bytes()).map_err(|_| {
        Error::Internal(format!(
            "{context}: sealed value failed authentication (tampered store)"
        ))
    })?;
    String::from_utf8(plain).map_err(Error::internal)
}

/// The associated data of a row's sealed plan.
pub fn plan_context(table: PlanTable, key: &str) -> String {
    match table {
        PlanTable::AgentStates => format!("agent_states:{key}"),
        PlanTable::BlueprintApplies => format!("blueprint_applies:{key}"),
    }
}

/// At start: seals what rows from before migration 0012 keep in the clear (plans, and API
/// keys' signing keys); returns how many rows it sealed. Rows another server sealed or
/// rewrote meanwhile are left to it.
pub async fn seal_stored(store: &dyn Store, key: &AeadKey) -> Result<u64> {
    let mut count = crate::auth::seal_legacy_keys(store, key).await?;
    for table in PlanTable::ALL {
        loop {
            // A row that could not be sealed changed since it was read (sealed by another
            // server's write): it is not read again, so each round makes progress.
            let rows = store.clear_plans(table, BATCH).await?;
            let mut sealed_now = 0;
            for (row_key, plan) in &rows {
                let sealed = seal(key, &plan_context(table, row_key), plan);
                if store.seal_plan(table, row_key, plan, &sealed).await? {
                    sealed_now += 1;
                }
            }
            count += sealed_now;
            if rows.len() < BATCH as usize || sealed_now == 0 {
                break;
            }
        }
    }
    if count > 0 {
        tracing::info!(
            rows = count,
            "sealed stored plans and signing keys under master_key"
        );
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_for_their_row_and_clear_ones_pass() {
        let key = AeadKey::new(&[7u8; 32]);
        let sealed = seal(&key, "agent_states:a1", r#"{"resources":[]}"#);
        assert!(sealed.starts_with(PREFIX) && !sealed.contains("resources"));
        assert_eq!(
            open(&key, "agent_states:a1", &sealed).unwrap(),
            r#"{"resources":[]}"#
        );
        assert!(open(&key, "agent_states:a2", &sealed).is_err());
        assert!(open(&AeadKey::new(&[8u8; 32]), "agent_states:a1", &sealed).is_err());
        assert_eq!(open(&key, "x", "{\"clear\":1}").unwrap(), "{\"clear\":1}");
    }
}
