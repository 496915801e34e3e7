//! API keys: creation (the cleartext is returned once), lookup by hash, and the bootstrap key.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use serde_json::json;

use super::cache::KeyCache;
use super::{Principal, Role};
use crate::audit::Action;
use crate::domain::Domain;
use crate::secrets::at_rest;
use crate::secrets::crypto::AeadKey;
use crate::store::{ApiKeyChange, ApiKeyRow, KeyWrite, Store};
use crate::{clock, ids, Error, Result};

pub const KEY_PREFIX: &str = "svc_";
pub const KEY_RANDOM_LENGTH: usize = 40;
pub const BOOTSTRAP_KEY_NAME: &str = "bootstrap-admin";
const MAX_NAME_LENGTH: usize = 128;
/// `last_used_at` is written at most this often per key, so authenticated reads stay reads.
const TOUCH_INTERVAL_MS: i64 = 60_000;

/// An API key record as every surface shows it (never the hash).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    pub id: String,
    pub name: String,
    pub role: String,
    pub created_at: String,
    pub last_used_at: Option<String>,
    pub expires_at: Option<String>,
}

impl From<ApiKeyRow> for ApiKey {
    fn from(row: ApiKeyRow) -> Self {
        ApiKey {
            id: row.id,
            name: row.name,
            role: row.role,
            created_at: row.created_at,
            last_used_at: row.last_used_at,
            expires_at: row.expires_at,
        }
    }
}

/// A request to create a key.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewKey {
    pub name: String,
    pub role: String,
    #[serde(default)]
    pub expires_at: Option<String>,
}

/// A request to change a key's name, role or expiry.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyUpdate {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub role: Option<String>,
    /// A new expiry, RFC 3339 and in the future.
    #[serde(default)]
    pub expires_at: Option<String>,
}

/// What the store keeps and looks up a key by: hex SHA-256 of the key's signing key (itself
/// SHA-256 of the key, the file service's HMAC key: `files::signature`). So the stored hash
/// signs nothing, and the signing key is kept only sealed (`signing_sealed`).
pub fn hash_key(key: &str) -> String {
    hash_signing_key(&Sha256::digest(key.as_bytes()).into())
}

fn hash_signing_key(signing_key: &[u8; 32]) -> String {
    hex::encode(Sha256::digest(signing_key))
}

/// The associated data of a key's sealed signing key.
fn signing_context(id: &str) -> String {
    format!("api_keys:{id}")
}

/// The file service's HMAC key of a stored key, opened with the at-rest key; None for a row
/// that has none (written by an older server since this one started) or does not open.
pub fn signing_key(at_rest: &AeadKey, row: &ApiKeyRow) -> Option<[u8; 32]> {
    let sealed = row.signing_sealed.as_deref()?;
    let hex_key = at_rest::open(at_rest, &signing_context(&row.id), sealed).ok()?;
    hex::decode(hex_key).ok()?.try_into().ok()
}

/// Converts key rows from before migration 0012, whose `key_hash` is their signing key
/// itself: that key is sealed, and the hash becomes its hash. Returns how many.
pub async fn seal_legacy_keys(store: &dyn Store, at_rest: &AeadKey) -> Result<u64> {
    let mut count = 0;
    for row in store.list_api_keys().await? {
        if row.signing_sealed.is_some() {
            continue;
        }
        let Some(signing_key) = hex::decode(&row.key_hash)
            .ok()
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        else {
            tracing::warn!(key_id = %row.id, "API key row with a malformed hash left as it is");
            continue;
        };
        let sealed = at_rest::seal(at_rest, &signing_context(&row.id), &row.key_hash);
        let hash = hash_signing_key(&signing_key);
        if store
            .seal_api_key(&row.id, &row.key_hash, &hash, &sealed)
            .await?
        {
            count += 1;
        }
    }
    Ok(count)
}

/// Whether `text` has the shape of an API key (`svc_` + 40 base62).
pub fn looks_like_api_key(text: &str) -> bool {
    text.strip_prefix(KEY_PREFIX)
        .is_some_and(|rest| rest.len() == KEY_RANDOM_LENGTH && ids::is_base62(rest))
}

fn generate_key() -> String {
    format!("{KEY_PREFIX}{}", ids::random_base62(KEY_RANDOM_LENGTH))
}

fn validate_name(name: &str) -> Result<String> {
    let name = name.trim();
    if name.is_empty() {
        return Err(Error::Invalid("name must not be empty".into()));
    }
    if name.chars().count() > MAX_NAME_LENGTH || name.chars().any(char::is_control) {
        return Err(Error::Invalid(format!(
            "name must be at most {MAX_NAME_LENGTH} printable characters"
        )));
    }
    Ok(name.to_string())
}

/// Resolves a presented key to its principal, or `Unauthenticated`, reading the store.
pub async fn authenticate(store: &dyn Store, key: &str) -> Result<Principal> {
    authenticate_cached(store, &KeyCache::new(false), key).await
}

/// [`authenticate`] through the verified-key cache (`auth::cache`): a key found there is not
/// read from the store again; expiry is still checked against the clock on every call.
pub async fn authenticate_cached(
    store: &dyn Store,
    cache: &KeyCache,
    key: &str,
) -> Result<Principal> {
    if !looks_like_api_key(key) {
        return Err(Error::Unauthenticated("invalid API key".into()));
    }
    let hash = hash_key(key);
    let row = match cache.get(&hash) {
        Ok(row) => row,
        Err(epoch) => {
            let row = store
                .find_api_key_by_hash(&hash)
                .await?
                .ok_or_else(|| Error::Unauthenticated("invalid API key".into()))?;
            cache.keep(epoch, &row);
            row
        }
    };
    let now = clock::now_millis();
    if let Some(expiry) = row.expires_at.as_deref().and_then(clock::parse_rfc3339) {
        if expiry <= now {
            return Err(Error::Unauthenticated("API key expired".into()));
        }
    }
    let stale = row
        .last_used_at
        .as_deref()
        .and_then(clock::parse_rfc3339)
        .is_none_or(|last| now - last >= TOUCH_INTERVAL_MS);
    if stale {
        let used_at = clock::format_rfc3339(now);
        store.touch_api_key(&row.id, &used_at).await?;
        cache.touched(&hash, &used_at);
    }
    let role = row.role.parse::<Role>()?;
    Ok(Principal {
        id: row.id,
        name: row.name,
        role,
    })
}

/// Creates a key; returns its record and the cleartext, which is never available again.
pub async fn create_key(
    domain: &Domain,
    principal: &Principal,
    input: NewKey,
) -> Result<(ApiKey, String)> {
    let action = Action::new("apikey.create", "apikey", "").detail(json!({
        "name": input.name, "role": input.role, "expires_at": input.expires_at,
    }));
    let result = domain
        .auditor
        .gate(principal, action.clone(), async {
            let at_rest = at_rest::key(domain).await?;
            create_key_checked(domain.store.as_ref(), at_rest, principal, input).await
        })
        .await;
    let action = match &result {
        Ok((record, _)) => Action {
            resource_id: record.id.clone(),
            ..action
        },
        Err(_) => action,
    };
    domain.auditor.record(principal, action, &result).await;
    if let Ok((record, _)) = &result {
        let payload = json!({"id": record.id, "name": record.name, "role": record.role, "by": principal.name});
        domain
            .events
            .emit_system(crate::events::EventKind::ApikeyCreated, "server", payload)
            .await;
    }
    result
}

async fn create_key_checked(
    store: &dyn Store,
    at_rest: &AeadKey,
    principal: &Principal,
    input: NewKey,
) -> Result<(ApiKey, String)> {
    principal.require(Role::Admin)?;
    let name = validate_name(&input.name)?;
    let role: Role = input.role.parse()?;
    let expires_at = match input.expires_at.as_deref() {
        None => None,
        Some(text) => Some(validate_expiry(text)?),
    };
    insert_key(store, at_rest, name, role, expires_at, generate_key()).await
}

/// An RFC 3339 time in the future, normalised as the store keeps it.
fn validate_expiry(text: &str) -> Result<String> {
    let at = clock::parse_rfc3339(text).ok_or_else(|| {
        Error::Invalid(format!("expires_at '{text}' is not an RFC 3339 timestamp"))
    })?;
    if at <= clock::now_millis() {
        return Err(Error::Invalid("expires_at is in the past".into()));
    }
    Ok(clock::format_rfc3339(at))
}

/// Why a change to key `id` was refused by the store: it would leave no active admin key
/// (role admin, not expired), and then no one could manage keys again short of
/// `svc-server --recover-admin` on the server's host.
fn last_admin(id: &str, what: &str) -> Error {
    Error::FailedPrecondition(format!(
        "API key '{id}' is the last active admin key: {what} would leave no admin key; \
         create another admin key first"
    ))
}

async fn insert_key(
    store: &dyn Store,
    at_rest: &AeadKey,
    name: String,
    role: Role,
    expires_at: Option<String>,
    key: String,
) -> Result<(ApiKey, String)> {
    let id = ids::ulid();
    let signing_key = hex::encode(Sha256::digest(key.as_bytes()));
    let row = ApiKeyRow {
        signing_sealed: Some(at_rest::seal(at_rest, &signing_context(&id), &signing_key)),
        id,
        name,
        role: role.as_str().into(),
        key_hash: hash_key(&key),
        created_at: clock::now_rfc3339(),
        last_used_at: None,
        expires_at,
    };
    store.insert_api_key(&row).await?;
    Ok((row.into(), key))
}

pub async fn list_keys(domain: &Domain, principal: &Principal) -> Result<Vec<ApiKey>> {
    principal.require(Role::Admin)?;
    Ok(domain
        .store
        .list_api_keys()
        .await?
        .into_iter()
        .map(ApiKey::from)
        .collect())
}

pub async fn get_key(domain: &Domain, principal: &Principal, id: &str) -> Result<ApiKey> {
    principal.require(Role::Admin)?;
    domain
        .store
        .get_api_key(id)
        .await?
        .map(ApiKey::from)
        .ok_or_else(|| Error::NotFound(format!("API key '{id}' not found")))
}

pub async fn update_key(
    domain: &Domain,
    principal: &Principal,
    id: &str,
    update: KeyUpdate,
) -> Result<ApiKey> {
    let action = Action::new("apikey.update", "apikey", id)
        .detail(json!({"name": update.name, "role": update.role, "expires_at": update.expires_at}));
    let result = domain
        .auditor
        .gate(
            principal,
            action.clone(),
            update_key_checked(domain.store.as_ref(), principal, id, update),
        )
        .await;
    // A new role or expiry applies from the next request: the cached row goes before the
    // answer does.
    domain.uncache_key(id);
    domain.auditor.record(principal, action, &result).await;
    result
}

async fn update_key_checked(
    store: &dyn Store,
    principal: &Principal,
    id: &str,
    update: KeyUpdate,
) -> Result<ApiKey> {
    principal.require(Role::Admin)?;
    let change = ApiKeyChange {
        name: update.name.as_deref().map(validate_name).transpose()?,
        role: update
            .role
            .as_deref()
            .map(|r| r.parse::<Role>().map(|r| r.as_str().to_string()))
            .transpose()?,
        expires_at: match update.expires_at.as_deref() {
            None => None,
            Some(text) => Some(validate_expiry(text)?),
        },
    };
    let what = match (&change.role, &change.expires_at) {
        (Some(_), Some(_)) => "changing its role and giving it an expiry",
        (Some(_), None) => "changing its role",
        _ => "giving it an expiry",
    };
    match store
        .update_api_key(id, &change, &clock::now_rfc3339())
        .await?
    {
        KeyWrite::Done(row) => Ok(row.into()),
        KeyWrite::NotFound => Err(Error::NotFound(format!("API key '{id}' not found"))),
        KeyWrite::LastAdmin => Err(last_admin(id, what)),
    }
}

pub async fn delete_key(domain: &Domain, principal: &Principal, id: &str) -> Result<()> {
    let change = async {
        principal.require(Role::Admin)?;
        let deleted = domain.store.delete_api_key(id, &clock::now_rfc3339()).await;
        // Before the answer, and before the audit row: the key's next request reads the
        // store and finds nothing.
        domain.uncache_key(id);
        match deleted? {
            KeyWrite::Done(()) => Ok(()),
            KeyWrite::NotFound => Err(Error::NotFound(format!("API key '{id}' not found"))),
            KeyWrite::LastAdmin => Err(last_admin(id, "deleting it")),
        }
    };
    let action = Action::new("apikey.delete", "apikey", id);
    let result = domain.auditor.gate(principal, action.clone(), change).await;
    domain.auditor.record(principal, action, &result).await;
    if result.is_ok() {
        domain.forget_key(id);
        let payload = json!({"id": id, "by": principal.name});
        domain
            .events
            .emit_system(crate::events::EventKind::ApikeyRevoked, "server", payload)
            .await;
    }
    result
}

/// On first start (no keys at all), creates the `bootstrap-admin` key: from
/// `SVC_BOOTSTRAP_API_KEY` when given, else a new one written to `key_file` with mode 0600.
/// Returns the new key's id, or None when keys already exist. The key is never logged.
pub async fn ensure_bootstrap_key(
    store: &dyn Store,
    at_rest: &AeadKey,
    key_file: &Path,
    preset: Option<&str>,
) -> Result<Option<String>> {
    if !store.list_api_keys().await?.is_empty() {
        return Ok(None);
    }
    let key = match preset {
        Some(key) if looks_like_api_key(key) => key.to_string(),
        Some(_) => {
            return Err(Error::Invalid(format!(
                "SVC_BOOTSTRAP_API_KEY must be '{KEY_PREFIX}' followed by {KEY_RANDOM_LENGTH} base62 characters"
            )))
        }
        None => generate_key(),
    };
    if preset.is_none() {
        write_private_file(key_file, format!("{key}\n").as_bytes())?;
    }
    let (record, _) = insert_key(
        store,
        at_rest,
        BOOTSTRAP_KEY_NAME.into(),
        Role::Admin,
        None,
        key,
    )
    .await?;
    Ok(Some(record.id))
}

/// `svc-server --recover-admin`: a new admin key named `name`, its cleartext written to
/// `key_file` (0600) before the row is stored. For the server's host only, with the data
/// dir's lock held, when no admin key is left to make one through the API.
pub async fn recover_admin_key(
    store: &dyn Store,
    at_rest: &AeadKey,
    key_file: &Path,
    name: &str,
) -> Result<ApiKey> {
    let name = validate_name(name)?;
    let key = generate_key();
    write_private_file(key_file, format!("{key}\n").as_bytes())?;
    let (record, _) = insert_key(store, at_rest, name, Role::Admin, None, key).await?;
    Ok(record)
}

/// Writes a file readable only by its owner (0600), replacing any old one.
pub fn write_private_file(path: &Path, contents: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::Internal(format!("cannot write {}: {e}", path.display())))?;
    file.write_all(contents)?;
    file.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_shape() {
        let key = generate_key();
        assert!(looks_like_api_key(&key), "{key}");
        assert_eq!(key.len(), 44);
        for bad in [
            "",
            "svc_",
            "svc_short",
            &format!("xyz_{}", &key[4..]),
            &format!("{key}!"),
        ] {
            assert!(!looks_like_api_key(bad), "{bad}");
        }
        assert_eq!(hash_key("abc").len(), 64);
    }
}
