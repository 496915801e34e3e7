//! The transit engine: encryption and signing as a service with named, versioned keys that
//! never leave the server.
//!
//! Key types: `aes256-gcm` (encrypt, decrypt, rewrap) and `ed25519` (sign, verify).
//! Ciphertexts and signatures read `svc:v<version>:<base64>`, so after `rotate` old ones still
//! decrypt or verify with their version, until `min_decryption_version` retires it. Key material
//! is wrapped by the master key at rest and cached decrypted in memory per name; every change
//! to a key (create, rotate, config, master rotation) drops its cache entry.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use base64::Engine;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use serde::Serialize;
use serde_json::json;

use super::crypto::{self, AeadKey};
use super::{audited, store, Keyring};
use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::store::{TransitKeyRow, TransitVersionRow};
use crate::{clock, Error, Result};

pub const AES256_GCM: &str = "aes256-gcm";
pub const ED25519_TYPE: &str = "ed25519";
const PREFIX: &str = "svc:v";

/// A transit key's metadata (never its material).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct KeyInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub key_type: String,
    pub latest_version: i64,
    pub min_decryption_version: i64,
    pub created_at: String,
}

impl From<&TransitKeyRow> for KeyInfo {
    fn from(row: &TransitKeyRow) -> Self {
        KeyInfo {
            name: row.name.clone(),
            key_type: row.key_type.clone(),
            latest_version: row.latest_version,
            min_decryption_version: row.min_decryption_version,
            created_at: row.created_at.clone(),
        }
    }
}

/// Output of encrypt, sign and rewrap.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Sealed {
    pub ciphertext: String,
    pub key_version: i64,
}

enum Material {
    // Boxed: ring's expanded AES key schedule is several times the size of an Ed25519 pair.
    Aes(Box<AeadKey>),
    Ed25519(Ed25519KeyPair),
}

/// A key's decrypted versions, as cached.
pub struct KeySet {
    info: KeyInfo,
    versions: BTreeMap<i64, Material>,
}

impl fmt::Debug for KeySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeySet({:?}, [REDACTED])", self.info)
    }
}

pub(super) fn material_aad(name: &str, version: i64) -> Vec<u8> {
    format!("svc:transit-key:{name}#{version}").into_bytes()
}

fn data_aad(name: &str) -> Vec<u8> {
    format!("svc:transit:{name}").into_bytes()
}

fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "invalid transit key name '{name}' (letters, digits, '.', '_', '-')"
        )))
    }
}

/// Makes one version of key material; returns (material to wrap, public key).
fn generate(key_type: &str) -> Result<(Vec<u8>, Vec<u8>)> {
    match key_type {
        AES256_GCM => Ok((crypto::random_key().to_vec(), Vec::new())),
        ED25519_TYPE => {
            let pkcs8 = Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
                .map_err(|_| Error::Internal("cannot generate an Ed25519 key".into()))?;
            let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
                .map_err(|_| Error::Internal("generated Ed25519 key does not parse".into()))?;
            Ok((pkcs8.as_ref().to_vec(), pair.public_key().as_ref().to_vec()))
        }
        other => Err(Error::Invalid(format!(
            "unknown transit key type '{other}' (expected {AES256_GCM} or {ED25519_TYPE})"
        ))),
    }
}

fn version_row(
    keyring: &Keyring,
    name: &str,
    version: i64,
    key_type: &str,
) -> Result<TransitVersionRow> {
    let (material, public_key) = generate(key_type)?;
    Ok(TransitVersionRow {
        name: name.to_string(),
        version,
        material: keyring.wrap(&material, &material_aad(name, version)),
        public_key: base64::engine::general_purpose::STANDARD.encode(public_key),
        created_at: clock::now_rfc3339(),
    })
}

/// The decrypted key set of `name`, from the cache or the store.
async fn key_set(domain: &Domain, keyring: &Keyring, name: &str) -> Result<Arc<KeySet>> {
    if let Some(set) = domain
        .secrets
        .transit_cache
        .lock()
        .expect("cache lock poisoned")
        .get(name)
    {
        return Ok(set.clone());
    }
    let row = store(domain)
        .get_transit_key(name)
        .await?
        .ok_or_else(|| Error::NotFound(format!("transit key '{name}' not found")))?;
    let mut versions = BTreeMap::new();
    for version in store(domain).transit_key_versions(name).await? {
        let what = format!("transit key '{name}' version {}", version.version);
        let bytes = keyring.unwrap_key(
            &version.material,
            &material_aad(name, version.version),
            &what,
        )?;
        let material = match row.key_type.as_str() {
            AES256_GCM => {
                let key: [u8; crypto::KEY_LEN] = bytes
                    .try_into()
                    .map_err(|_| Error::Internal(format!("{what}: bad key length")))?;
                Material::Aes(Box::new(AeadKey::new(&key)))
            }
            _ => Material::Ed25519(
                Ed25519KeyPair::from_pkcs8(&bytes)
                    .map_err(|_| Error::Internal(format!("{what}: bad Ed25519 key")))?,
            ),
        };
        versions.insert(version.version, material);
    }
    let set = Arc::new(KeySet {
        info: KeyInfo::from(&row),
        versions,
    });
    domain
        .secrets
        .transit_cache
        .lock()
        .expect("cache lock poisoned")
        .insert(name.to_string(), set.clone());
    Ok(set)
}

fn forget(domain: &Domain, name: &str) {
    domain
        .secrets
        .transit_cache
        .lock()
        .expect("cache lock poisoned")
        .remove(name);
}

/// Splits `svc:v<version>:<base64>` into its version and bytes.
fn parse_tagged(text: &str, what: &str) -> Result<(i64, Vec<u8>)> {
    let invalid = || Error::Invalid(format!("{what} is not of the form svc:v<version>:<base64>"));
    let rest = text.trim().strip_prefix(PREFIX).ok_or_else(invalid)?;
    let (version, body) = rest.split_once(':').ok_or_else(invalid)?;
    let version: i64 = version.parse().map_err(|_| invalid())?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|_| invalid())?;
    Ok((version, bytes))
}

fn tagged(version: i64, bytes: &[u8]) -> String {
    format!(
        "{PREFIX}{version}:{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// The version's material, if it exists and is not retired.
fn usable(set: &KeySet, version: i64) -> Result<&Material> {
    if version < set.info.min_decryption_version {
        return Err(Error::Invalid(format!(
            "transit key '{}' version {version} is retired (min_decryption_version is {})",
            set.info.name, set.info.min_decryption_version
        )));
    }
    set.versions.get(&version).ok_or_else(|| {
        Error::Invalid(format!(
            "transit key '{}' has no version {version}",
            set.info.name
        ))
    })
}

fn aes_latest(set: &KeySet) -> Result<(i64, &AeadKey)> {
    let version = set.info.latest_version;
    match set.versions.get(&version) {
        Some(Material::Aes(key)) => Ok((version, key)),
        Some(Material::Ed25519(_)) => Err(Error::Invalid(format!(
            "transit key '{}' is {ED25519_TYPE}: it signs, it does not encrypt",
            set.info.name
        ))),
        None => Err(Error::Internal(format!(
            "transit key '{}' lacks its latest version",
            set.info.name
        ))),
    }
}

fn open_with(set: &KeySet, ciphertext: &str) -> Result<Vec<u8>> {
    let (version, bytes) = parse_tagged(ciphertext, "ciphertext")?;
    let Material::Aes(key) = usable(set, version)? else {
        return Err(Error::Invalid(format!(
            "transit key '{}' is {ED25519_TYPE}: it does not decrypt",
            set.info.name
        )));
    };
    key.open(&bytes, &data_aad(&set.info.name)).map_err(|_| {
        Error::Invalid(format!(
            "ciphertext does not decrypt with transit key '{}' (altered, or another key's)",
            set.info.name
        ))
    })
}

fn action(name: &'static str, key: &str) -> Action {
    Action::new(name, "transit_key", key)
}

/// `transit create-key NAME --type T`.
pub async fn create_key(
    domain: &Domain,
    principal: &Principal,
    name: &str,
    key_type: &str,
) -> Result<KeyInfo> {
    let result = domain
        .auditor
        .gate(principal, action("transit.create_key", name), async {
            principal.require(Role::Operator)?;
            validate_name(name)?;
            let keyring = domain.secrets.keyring().await?;
            let now = clock::now_rfc3339();
            let row = TransitKeyRow {
                name: name.to_string(),
                key_type: key_type.to_string(),
                latest_version: 1,
                min_decryption_version: 1,
                created_at: now.clone(),
                updated_at: now,
            };
            let first = version_row(&keyring, name, 1, key_type)?;
            store(domain).insert_transit_key(&row, &first).await?;
            forget(domain, name);
            Ok(KeyInfo::from(&row))
        })
        .await;
    let detail = json!({ "type": key_type });
    audited(
        domain,
        principal,
        action("transit.create_key", name).detail(detail),
        result,
    )
    .await
}

/// `transit rotate NAME`: adds a version and makes it the one that encrypts and signs.
pub async fn rotate(domain: &Domain, principal: &Principal, name: &str) -> Result<KeyInfo> {
    let result = domain
        .auditor
        .gate(principal, action("transit.rotate", name), async {
            principal.require(Role::Operator)?;
            let keyring = domain.secrets.keyring().await?;
            let row = store(domain)
                .get_transit_key(name)
                .await?
                .ok_or_else(|| Error::NotFound(format!("transit key '{name}' not found")))?;
            let next = version_row(&keyring, name, row.latest_version + 1, &row.key_type)?;
            store(domain)
                .add_transit_version(&next, &clock::now_rfc3339())
                .await?;
            forget(domain, name);
            let row = store(domain)
                .get_transit_key(name)
                .await?
                .ok_or_else(|| Error::NotFound(format!("transit key '{name}' not found")))?;
            Ok(KeyInfo::from(&row))
        })
        .await;
    let detail = json!({ "version": result.as_ref().ok().map(|k| k.latest_version) });
    audited(
        domain,
        principal,
        action("transit.rotate", name).detail(detail),
        result,
    )
    .await
}

/// `transit config NAME --min-decryption-version N`: versions below N no longer decrypt or
/// verify. N may not pass the latest version (that would retire every version).
pub async fn set_min_decryption_version(
    domain: &Domain,
    principal: &Principal,
    name: &str,
    version: i64,
) -> Result<KeyInfo> {
    let result = domain
        .auditor
        .gate(principal, action("transit.config", name), async {
            principal.require(Role::Operator)?;
            let row = store(domain)
                .get_transit_key(name)
                .await?
                .ok_or_else(|| Error::NotFound(format!("transit key '{name}' not found")))?;
            if version < 1 || version > row.latest_version {
                return Err(Error::Invalid(format!(
                    "min_decryption_version must be between 1 and the latest version {}",
                    row.latest_version
                )));
            }
            store(domain)
                .set_transit_min_decryption(name, version, &clock::now_rfc3339())
                .await?;
            forget(domain, name);
            Ok(KeyInfo {
                min_decryption_version: version,
                ..KeyInfo::from(&row)
            })
        })
        .await;
    let detail = json!({ "min_decryption_version": version });
    audited(
        domain,
        principal,
        action("transit.config", name).detail(detail),
        result,
    )
    .await
}

/// `transit list-keys`: metadata only.
pub async fn list_keys(domain: &Domain, principal: &Principal) -> Result<Vec<KeyInfo>> {
    let result = async {
        principal.require(Role::Operator)?;
        let rows = store(domain).list_transit_keys().await?;
        Ok(rows.iter().map(KeyInfo::from).collect())
    }
    .await;
    audited(domain, principal, action("transit.list_keys", "*"), result).await
}

/// `transit encrypt NAME PLAINTEXT` with the latest version.
pub async fn encrypt(
    domain: &Domain,
    principal: &Principal,
    name: &str,
    plaintext: &[u8],
) -> Result<Sealed> {
    let result = async {
        principal.require(Role::Operator)?;
        let keyring = domain.secrets.keyring().await?;
        let set = key_set(domain, &keyring, name).await?;
        let (version, key) = aes_latest(&set)?;
        Ok(Sealed {
            ciphertext: tagged(version, &key.seal(plaintext, &data_aad(name))),
            key_version: version,
        })
    }
    .await;
    let detail = json!({ "bytes": plaintext.len() });
    audited(
        domain,
        principal,
        action("transit.encrypt", name).detail(detail),
        result,
    )
    .await
}

/// `transit decrypt NAME CIPHERTEXT`.
pub async fn decrypt(
    domain: &Domain,
    principal: &Principal,
    name: &str,
    ciphertext: &str,
) -> Result<Vec<u8>> {
    let result = async {
        principal.require(Role::Operator)?;
        let keyring = domain.secrets.keyring().await?;
        let set = key_set(domain, &keyring, name).await?;
        open_with(&set, ciphertext)
    }
    .await;
    audited(domain, principal, action("transit.decrypt", name), result).await
}

/// `transit rewrap NAME CIPHERTEXT`: decrypts and encrypts again with the latest version,
/// without the plaintext leaving the server.
pub async fn rewrap(
    domain: &Domain,
    principal: &Principal,
    name: &str,
    ciphertext: &str,
) -> Result<Sealed> {
    let result = async {
        principal.require(Role::Operator)?;
        let keyring = domain.secrets.keyring().await?;
        let set = key_set(domain, &keyring, name).await?;
        let plaintext = open_with(&set, ciphertext)?;
        let (version, key) = aes_latest(&set)?;
        Ok(Sealed {
            ciphertext: tagged(version, &key.seal(&plaintext, &data_aad(name))),
            key_version: version,
        })
    }
    .await;
    audited(domain, principal, action("transit.rewrap", name), result).await
}

/// `transit sign NAME DATA` with the latest version.
pub async fn sign(
    domain: &Domain,
    principal: &Principal,
    name: &str,
    data: &[u8],
) -> Result<Sealed> {
    let result = async {
        principal.require(Role::Operator)?;
        let keyring = domain.secrets.keyring().await?;
        let set = key_set(domain, &keyring, name).await?;
        let version = set.info.latest_version;
        match set.versions.get(&version) {
            Some(Material::Ed25519(pair)) => Ok(Sealed {
                ciphertext: tagged(version, pair.sign(data).as_ref()),
                key_version: version,
            }),
            _ => Err(Error::Invalid(format!(
                "transit key '{name}' is not {ED25519_TYPE}: it does not sign"
            ))),
        }
    }
    .await;
    let detail = json!({ "bytes": data.len() });
    audited(
        domain,
        principal,
        action("transit.sign", name).detail(detail),
        result,
    )
    .await
}

/// `transit verify NAME DATA SIGNATURE`: whether the signature is valid.
pub async fn verify(
    domain: &Domain,
    principal: &Principal,
    name: &str,
    data: &[u8],
    signature: &str,
) -> Result<bool> {
    let result = async {
        principal.require(Role::Operator)?;
        let keyring = domain.secrets.keyring().await?;
        let set = key_set(domain, &keyring, name).await?;
        let (version, bytes) = parse_tagged(signature, "signature")?;
        match usable(&set, version)? {
            Material::Ed25519(pair) => {
                Ok(UnparsedPublicKey::new(&ED25519, pair.public_key().as_ref())
                    .verify(data, &bytes)
                    .is_ok())
            }
            Material::Aes(_) => Err(Error::Invalid(format!(
                "transit key '{name}' is not {ED25519_TYPE}: it does not verify"
            ))),
        }
    }
    .await;
    let detail = json!({ "valid": result.as_ref().ok() });
    audited(
        domain,
        principal,
        action("transit.verify", name).detail(detail),
        result,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;

    #[tokio::test]
    async fn rotation_keeps_old_versions_until_retired() {
        let (domain, _dir, _) = testing::domain().await;
        let admin = Principal::server();
        create_key(&domain, &admin, "k", AES256_GCM).await.unwrap();
        assert!(matches!(
            create_key(&domain, &admin, "k", AES256_GCM).await,
            Err(Error::Conflict(_))
        ));
        let v1 = encrypt(&domain, &admin, "k", b"one").await.unwrap();
        assert!(v1.ciphertext.starts_with("svc:v1:"));
        rotate(&domain, &admin, "k").await.unwrap();
        let v2 = encrypt(&domain, &admin, "k", b"two").await.unwrap();
        assert!(v2.ciphertext.starts_with("svc:v2:"));
        assert_eq!(
            decrypt(&domain, &admin, "k", &v1.ciphertext).await.unwrap(),
            b"one"
        );
        let rewrapped = rewrap(&domain, &admin, "k", &v1.ciphertext).await.unwrap();
        assert_eq!(rewrapped.key_version, 2);
        set_min_decryption_version(&domain, &admin, "k", 2)
            .await
            .unwrap();
        assert!(matches!(
            decrypt(&domain, &admin, "k", &v1.ciphertext).await,
            Err(Error::Invalid(_))
        ));
        assert_eq!(
            decrypt(&domain, &admin, "k", &rewrapped.ciphertext)
                .await
                .unwrap(),
            b"one"
        );
        let mut bad = v2.ciphertext.clone();
        bad.replace_range(bad.len() - 4.., "AAA=");
        assert!(decrypt(&domain, &admin, "k", &bad).await.is_err());
    }

    #[tokio::test]
    async fn signatures() {
        let (domain, _dir, _) = testing::domain().await;
        let admin = Principal::server();
        create_key(&domain, &admin, "s", ED25519_TYPE)
            .await
            .unwrap();
        let signature = sign(&domain, &admin, "s", b"doc").await.unwrap().ciphertext;
        rotate(&domain, &admin, "s").await.unwrap();
        assert!(verify(&domain, &admin, "s", b"doc", &signature)
            .await
            .unwrap());
        assert!(!verify(&domain, &admin, "s", b"dog", &signature)
            .await
            .unwrap());
        assert!(encrypt(&domain, &admin, "s", b"x").await.is_err());
    }
}
