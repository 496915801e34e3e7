//! The NATS keys of cluster mode with `bus.external_auth: jwt` (docs/cluster.md): an operator,
//! a system account, the svc account and the svc account's signing key, each an nkey whose
//! seed is sealed under master_key in the `ca` table (kinds `nats-*`, the public key where a
//! CA row keeps its certificate), so a database dump alone signs nothing. Made on first use,
//! by `svc-cluster nats-config` (offline) or a member's start, whichever comes first; the
//! race between members is settled by `insert_first_ca`, as for the CA.
//!
//! The account signing key rotates with the CA, in two steps because a memory resolver
//! reads the account JWT (which lists the signing keys) from every node's configuration: a
//! CA rotation adds the next key beside the current one, which keeps signing
//! ([`add_next_signing_key`]); once the nodes have the block listing both, the previous one
//! is retired and the next signs ([`retire_previous_signing_key`]).
//!
//! What is issued from them:
//! - every NATS node's configuration block: operator JWT, system account, memory resolver
//!   preloaded with both account JWTs ([`server_config`]);
//! - a member's user JWT (everything), for a key the member makes at start and never stores;
//! - an agent's user JWT at enrolment, for the nkey the agent made (its seed never leaves the
//!   host), with exactly the subjects the embedded broker grants it;
//! - the enrolment JWT: a bearer JWT that may only publish enrolment requests and read their
//!   replies, which bootstrap needs because the cluster admits no anonymous client.

use crate::bus::natsjwt::{self, UserPermissions};
use crate::bus::subjects;
use crate::store::{CaRow, Store};
use crate::{clock, ids, Error, Result};

use super::{ca, Keys};

const OPERATOR: &str = "nats-operator";
const SYSTEM: &str = "nats-system";
const ACCOUNT: &str = "nats-account";
const SIGNING: &str = "nats-signing";

/// Where enrolment replies go in JWT mode: the enrolment JWT may subscribe here and nowhere
/// else. A reply holds only public material (certificates, the agent's user JWT).
pub const ENROL_REPLY_PREFIX: &str = "svc.enroll.reply";

/// How long an agent's user JWT is valid unless the server says otherwise
/// (`agents.bus_jwt_ttl`): short, because a JWT cannot be taken back before it expires
/// (memory resolver), and the agent renews it with its certificate at half-life.
pub const DEFAULT_AGENT_JWT_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// What an agent signs to renew its JWT: a domain, its nkey and the time.
const RENEW_DOMAIN: &str = "svc-bus-jwt-v1";
/// How far a renewal's time may be from the server's clock.
const RENEW_WINDOW_MS: i64 = 5 * 60 * 1000;

/// The four keys, unsealed.
pub struct NatsKeys {
    operator: nkeys::KeyPair,
    system: nkeys::KeyPair,
    account: nkeys::KeyPair,
    /// The account signing key that issues user JWTs: the oldest active one.
    signing: nkeys::KeyPair,
    /// Every active account signing key (public), oldest first: the account JWT lists them
    /// all. A second one exists between a CA rotation and `--retire-previous-signing-key`
    /// ([`add_next_signing_key`]): listed, so the NATS nodes learn it before it signs.
    listed_signing: Vec<String>,
    agent_ttl: std::time::Duration,
}

impl NatsKeys {
    /// Agents' JWTs valid for `ttl` (`agents.bus_jwt_ttl`).
    pub fn with_agent_ttl(self, ttl: std::time::Duration) -> NatsKeys {
        NatsKeys {
            agent_ttl: ttl,
            ..self
        }
    }

    /// The svc account's public key (the account every svc client is in).
    pub fn account(&self) -> String {
        self.account.public_key()
    }
}

/// Reads the keys, making those that do not exist yet.
pub async fn ensure(store: &dyn Store, keys: &Keys) -> Result<NatsKeys> {
    let rows = store.active_ca().await?;
    let signing = key(store, keys, &rows, SIGNING, nkeys::KeyPair::new_account).await?;
    // Rows come oldest first; on first use the one just made is the only one.
    let mut listed_signing: Vec<String> = rows
        .iter()
        .filter(|row| row.kind == SIGNING)
        .map(|row| row.cert_pem.clone())
        .collect();
    if listed_signing.is_empty() {
        listed_signing.push(signing.public_key());
    }
    Ok(NatsKeys {
        operator: key(store, keys, &rows, OPERATOR, nkeys::KeyPair::new_operator).await?,
        system: key(store, keys, &rows, SYSTEM, nkeys::KeyPair::new_account).await?,
        account: key(store, keys, &rows, ACCOUNT, nkeys::KeyPair::new_account).await?,
        signing,
        listed_signing,
        agent_ttl: DEFAULT_AGENT_JWT_TTL,
    })
}

/// With a CA rotation (`svc-identity ca rotate-signing`): makes the next account signing key
/// and stores it sealed beside the current one, which keeps signing. The account JWT of
/// `svc-cluster nats-config` lists both from now on; once every NATS node has that block,
/// `--retire-previous-signing-key` retires the current one ([`retire_previous_signing_key`])
/// and the next signs. Returns its public key; None when the keys were never made (not a
/// JWT-mode cluster) or a next key is already waiting.
pub async fn add_next_signing_key(store: &dyn Store, keys: &Keys) -> Result<Option<String>> {
    let active = store.active_ca().await?;
    if !active.iter().any(|row| row.kind == SIGNING) {
        return Ok(None);
    }
    let next = nkeys::KeyPair::new_account();
    let row = sealed_row(keys, SIGNING, &next)?;
    Ok(store
        .add_ca_generation(&row)
        .await?
        .then(|| next.public_key()))
}

/// Retires every account signing key but the newest: the one a CA rotation added signs from
/// the members' next start, and the account JWT lists it alone. Returns the public keys
/// retired (none when there was only one).
pub async fn retire_previous_signing_key(store: &dyn Store) -> Result<Vec<String>> {
    let active = store.active_ca().await?;
    let signing: Vec<&CaRow> = active.iter().filter(|row| row.kind == SIGNING).collect();
    if signing.len() < 2 {
        return Ok(Vec::new());
    }
    store
        .retire_older_ca(SIGNING, &clock::now_rfc3339())
        .await?;
    Ok(signing[..signing.len() - 1]
        .iter()
        .map(|row| row.cert_pem.clone())
        .collect())
}

/// The active key of `kind`, made with `make` (and stored sealed) when there is none.
async fn key(
    store: &dyn Store,
    keys: &Keys,
    rows: &[CaRow],
    kind: &str,
    make: fn() -> nkeys::KeyPair,
) -> Result<nkeys::KeyPair> {
    let row = match rows.iter().find(|row| row.kind == kind) {
        Some(row) => row.clone(),
        None => {
            let fresh = sealed_row(keys, kind, &make())?;
            match store.insert_first_ca(&fresh).await? {
                Some(theirs) => theirs,
                None => {
                    tracing::info!(kind, "created a NATS key");
                    fresh
                }
            }
        }
    };
    unseal(keys, &row)
}

fn seal_context(kind: &str, id: &str) -> String {
    format!("ca:{kind}:{id}")
}

fn sealed_row(keys: &Keys, kind: &str, key: &nkeys::KeyPair) -> Result<CaRow> {
    let id = ids::ulid();
    let now = clock::now_rfc3339();
    Ok(CaRow {
        key_encrypted: ca::seal(
            keys.master_key(),
            &seal_context(kind, &id),
            natsjwt::seed(key)?.as_bytes(),
        )?,
        id,
        kind: kind.into(),
        // The public key stands where a CA row keeps its certificate.
        cert_pem: key.public_key(),
        fingerprint: key.public_key(),
        not_before: now.clone(),
        not_after: "9999-12-31T23:59:59Z".into(),
        created_at: now,
        retired_at: None,
    })
}

fn unseal(keys: &Keys, row: &CaRow) -> Result<nkeys::KeyPair> {
    let seed = ca::open(
        keys.master_key(),
        &seal_context(&row.kind, &row.id),
        &row.key_encrypted,
    )?;
    let seed = String::from_utf8(seed).map_err(Error::internal)?;
    natsjwt::key_pair(&seed)
}

/// The block every NATS node of the cluster includes: trust the operator, name the system
/// account, resolve accounts from memory (preloaded: no account server to run).
pub fn server_config(keys: &NatsKeys) -> Result<String> {
    let system = keys.system.public_key();
    let account = keys.account.public_key();
    let operator = natsjwt::operator(&keys.operator, "svc", &system)?;
    let system_jwt = natsjwt::account(&keys.operator, &system, "SYS", &[], false, &[])?;
    let account_jwt = natsjwt::account(
        &keys.operator,
        &account,
        "SVC",
        &keys.listed_signing,
        true,
        &[],
    )?;
    Ok(format!(
        "# svc: NATS JWT authentication (operator mode). Include this file in every node's\n\
         # configuration. Generated by `svc-cluster nats-config`; contains no private key.\n\
         operator: {operator}\n\
         system_account: {system}\n\
         resolver: MEMORY\n\
         resolver_preload: {{\n  \
           {system}: {system_jwt}\n  \
           {account}: {account_jwt}\n\
         }}\n"
    ))
}

/// The reply inbox prefix of a client logged in with a `.creds` file: its own, named by its
/// public key, since its JWT may subscribe there and on no other inbox.
pub fn client_inbox(user: &str) -> String {
    format!("_INBOX.{user}")
}

/// What an API-key client may do on a JWT-mode cluster with a `.creds` file of `role`: as on
/// the embedded broker (auth::bus_permissions), except that nats-server has no "private inbox"
/// rule, so a client reads only its own inbox ([`client_inbox`]) and the events, and may not
/// touch what only members use (JetStream's API, the streams' subjects, the file store).
pub fn client_permissions(role: crate::auth::Role, user: &str) -> UserPermissions {
    use crate::auth::Role;
    let subscribe = vec![
        subjects::EVENTS_ALL.to_string(),
        format!("{}.>", client_inbox(user)),
    ];
    match role {
        Role::Admin | Role::Operator => UserPermissions {
            publish: vec![">".into()],
            publish_deny: [
                subjects::ENROLL,
                "svc.enroll.>",
                subjects::AGENTS_ALL,
                subjects::EVENTS_ALL,
                "_INBOX.>",
                "$JS.>",
                "$KV.>",
                "$O.>",
                "$SYS.>",
                "svc.js.>",
                "svc.filestore.>",
            ]
            .map(String::from)
            .to_vec(),
            subscribe,
            all: false,
        },
        Role::Readonly => UserPermissions {
            publish: subjects::FILES_READ_OPERATIONS
                .iter()
                .map(|operation| subjects::files("*", operation))
                .collect(),
            subscribe,
            ..UserPermissions::default()
        },
    }
}

/// `svc-cluster nats-config --creds ROLE`: a `.creds` file (user JWT and a fresh nkey seed)
/// for a client such as svc-files, valid for `ttl`.
pub async fn offline_creds(
    config: &crate::config::ServerConfig,
    name: &str,
    role: crate::auth::Role,
    ttl: std::time::Duration,
) -> Result<String> {
    let (_, nats) = open_offline(config).await?;
    let user = nkeys::KeyPair::new_user();
    let expires = clock::now_millis() / 1000 + ttl.as_secs().max(1) as i64;
    let jwt = natsjwt::user(
        &nats.signing,
        &nats.account.public_key(),
        &user.public_key(),
        &format!("client:{name}:{}", role.as_str()),
        &client_permissions(role, &user.public_key()),
        Some(expires),
        false,
    )?;
    Ok(natsjwt::creds_file(&jwt, &natsjwt::seed(&user)?))
}

/// The store of `config` and its NATS keys, made if missing (no server needed).
async fn open_offline(
    config: &crate::config::ServerConfig,
) -> Result<(std::sync::Arc<dyn Store>, NatsKeys)> {
    if config.bus.external_auth != crate::config::ExternalAuth::Jwt {
        return Err(Error::Invalid(
            "bus.external_auth is not jwt in this configuration: set it (with bus.external_urls) \
             on every member first"
                .into(),
        ));
    }
    let store = crate::store::open(&config.store, &config.data_dir).await?;
    let keys = Keys::from_config(config)?;
    crate::secrets::verify_master_key(store.as_ref(), keys.master_key()).await?;
    let nats = ensure(store.as_ref(), &keys).await?;
    Ok((store, nats))
}

/// `svc-cluster nats-config --retire-previous-signing-key`: offline, as the rest of the
/// command; the public keys retired.
pub async fn offline_retire_previous(config: &crate::config::ServerConfig) -> Result<Vec<String>> {
    let (store, _) = open_offline(config).await?;
    retire_previous_signing_key(store.as_ref()).await
}

/// What `svc-cluster nats-config` prints.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Printed {
    pub account: String,
    pub nats_config: String,
    pub enrol_jwt: String,
}

/// `svc-cluster nats-config`: opens the configured store (no server needed), checks the
/// master key against it, makes the keys if they do not exist yet.
pub async fn offline_config(config: &crate::config::ServerConfig) -> Result<Printed> {
    let (_, nats) = open_offline(config).await?;
    Ok(Printed {
        account: nats.account(),
        nats_config: server_config(&nats)?,
        enrol_jwt: enrolment_jwt(&nats)?,
    })
}

/// A member's bus login: a fresh user key and a JWT allowing everything in the svc account.
pub fn member_login(keys: &NatsKeys, member_id: &str) -> Result<(String, nkeys::KeyPair)> {
    let user = nkeys::KeyPair::new_user();
    let permissions = UserPermissions {
        all: true,
        ..UserPermissions::default()
    };
    let jwt = natsjwt::user(
        &keys.signing,
        &keys.account.public_key(),
        &user.public_key(),
        &format!("member:{member_id}"),
        &permissions,
        None,
        false,
    )?;
    Ok((jwt, user))
}

/// What an enrolled agent may do on an external cluster: the same as on the embedded broker
/// (server::bus::agent_bus_permissions) — publish and subscribe under its own subjects only.
pub fn agent_permissions(agent_id: &str) -> UserPermissions {
    let own = subjects::agent_all(agent_id);
    UserPermissions {
        publish: vec![own.clone()],
        subscribe: vec![own],
        ..UserPermissions::default()
    }
}

/// An agent's user JWT for the nkey it made (`user`, a `U...` public key).
pub fn agent_jwt(keys: &NatsKeys, agent_id: &str, user: &str) -> Result<String> {
    if !natsjwt::is_user_public_key(user) {
        return Err(Error::Invalid(
            "bus_nkey is not a NATS user public key (U...)".into(),
        ));
    }
    let expires = clock::now_millis() / 1000 + keys.agent_ttl.as_secs().max(1) as i64;
    natsjwt::user(
        &keys.signing,
        &keys.account.public_key(),
        user,
        &format!("agent:{agent_id}"),
        &agent_permissions(agent_id),
        Some(expires),
        false,
    )
}

/// The enrolment JWT (bearer: the cluster checks no nonce signature, so it is usable alone).
/// Publish `svc.enroll` and `svc.enroll.renew`, subscribe under [`ENROL_REPLY_PREFIX`]:
/// nothing else.
pub fn enrolment_jwt(keys: &NatsKeys) -> Result<String> {
    let user = nkeys::KeyPair::new_user();
    let permissions = UserPermissions {
        publish: vec![subjects::ENROLL.into(), subjects::ENROLL_RENEW.into()],
        subscribe: vec![format!("{ENROL_REPLY_PREFIX}.>")],
        ..UserPermissions::default()
    };
    natsjwt::user(
        &keys.signing,
        &keys.account.public_key(),
        &user.public_key(),
        "enrolment",
        &permissions,
        None,
        true,
    )
}

/// An agent's request for a new user JWT, signed with its identity key.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RenewRequest {
    /// The agent's certificate, PEM.
    pub certificate: String,
    /// The public nkey the JWT is for (`U...`).
    pub bus_nkey: String,
    pub issued_at_ms: i64,
    /// base64url ECDSA P-256 (ASN.1) signature of [`renew_message`] with the agent's key.
    pub signature: String,
}

/// The reply: the new JWT, or `{"error": ...}` (as enrolment's).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Renewed {
    pub bus_jwt: String,
}

/// What an agent signs to renew its JWT.
pub fn renew_message(bus_nkey: &str, issued_at_ms: i64) -> Vec<u8> {
    format!("{RENEW_DOMAIN}\0{bus_nkey}\0{issued_at_ms}").into_bytes()
}

/// Renews an agent's user JWT: the certificate must be the agent's latest enrolment under the
/// current signing CA and the signature fresh and its own (`authenticate_agent`, the embedded
/// broker's login check), so a removed or re-enrolled agent gets nothing and its old JWT
/// stops connecting when it expires. Not audited (every agent renews daily); refusals are
/// logged by the caller.
pub async fn renew(domain: &crate::domain::Domain, request: RenewRequest) -> Result<Renewed> {
    use base64::Engine;
    let keys = domain.identity_keys();
    let Some(nats) = keys.nats.as_ref() else {
        return Err(Error::Invalid(
            "this server does not issue NATS JWTs (bus.external_auth is not jwt)".into(),
        ));
    };
    if (clock::now_millis() - request.issued_at_ms).abs() > RENEW_WINDOW_MS {
        return Err(Error::Unauthenticated(
            "the renewal is not fresh (check the agent's clock)".into(),
        ));
    }
    let certificate = ca::pem_to_der(&request.certificate)?;
    let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(request.signature.trim_end_matches('='))
        .map_err(|_| Error::Unauthenticated("malformed renewal signature".into()))?;
    let agent_id = super::authenticate_agent(
        domain.store.as_ref(),
        &certificate,
        &renew_message(&request.bus_nkey, request.issued_at_ms),
        Some(&signature),
    )
    .await?;
    Ok(Renewed {
        bus_jwt: agent_jwt(nats, &agent_id, &request.bus_nkey)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `iss` of a JWT: the key that signed it.
    fn issuer(jwt: &str) -> String {
        natsjwt::claims(jwt).unwrap()["iss"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// The signing keys the account JWT in a configuration block lists.
    fn listed(block: &str, account: &str) -> Vec<String> {
        let line = block
            .lines()
            .find(|line| line.trim_start().starts_with(account))
            .unwrap();
        let jwt = line.split_once(':').unwrap().1.trim();
        let claims = natsjwt::claims(jwt).unwrap();
        let keys = claims["nats"]["signing_keys"].as_array().unwrap();
        // A set in the account JWT: its order carries nothing (and varies from run to run).
        let mut keys: Vec<String> = keys
            .iter()
            .map(|key| key.as_str().unwrap().to_string())
            .collect();
        keys.sort();
        keys
    }

    #[tokio::test]
    async fn the_account_signing_key_rotates_in_two_steps() {
        let dir = tempfile::tempdir().unwrap();
        let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(
            crate::store::SqliteStore::open(&dir.path().join("svc.db")).unwrap(),
        );
        let keys = Keys::new([7; 32], b"secret".to_vec());
        let user = nkeys::KeyPair::new_user().public_key();
        let first = ensure(store.as_ref(), &keys).await.unwrap();
        let account = first.account();
        let old = first.signing.public_key();
        assert_eq!(
            listed(&server_config(&first).unwrap(), &account),
            std::slice::from_ref(&old)
        );
        assert!(retire_previous_signing_key(store.as_ref())
            .await
            .unwrap()
            .is_empty());

        // A rotation adds the next key: listed beside the current one, which still signs.
        let next = add_next_signing_key(store.as_ref(), &keys)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            add_next_signing_key(store.as_ref(), &keys).await.unwrap(),
            None
        );
        let during = ensure(store.as_ref(), &keys).await.unwrap();
        assert_eq!(during.account(), account);
        assert_eq!(listed(&server_config(&during).unwrap(), &account), {
            let mut both = [old.clone(), next.clone()];
            both.sort();
            both
        });
        assert_eq!(issuer(&agent_jwt(&during, "a1", &user).unwrap()), old);

        // Retired: the next signs and is the only one listed.
        let retired = retire_previous_signing_key(store.as_ref()).await.unwrap();
        assert_eq!(retired, [old]);
        let after = ensure(store.as_ref(), &keys).await.unwrap();
        assert_eq!(
            listed(&server_config(&after).unwrap(), &account),
            std::slice::from_ref(&next)
        );
        assert_eq!(issuer(&agent_jwt(&after, "a1", &user).unwrap()), next);
        assert_eq!(issuer(&member_login(&after, "m1").unwrap().0), next);
    }

    #[test]
    fn agent_jwt_refuses_what_is_not_a_user_key() {
        let keys = NatsKeys {
            operator: nkeys::KeyPair::new_operator(),
            system: nkeys::KeyPair::new_account(),
            account: nkeys::KeyPair::new_account(),
            signing: nkeys::KeyPair::new_account(),
            listed_signing: Vec::new(),
            agent_ttl: DEFAULT_AGENT_JWT_TTL,
        };
        assert!(agent_jwt(&keys, "a1", &keys.account.public_key()).is_err());
        let user = nkeys::KeyPair::new_user();
        let jwt = agent_jwt(&keys, "a1", &user.public_key()).unwrap();
        let claims = natsjwt::claims(&jwt).unwrap();
        assert_eq!(claims["nats"]["sub"]["allow"][0], "svc.agent.a1.>");
        let config = server_config(&keys).unwrap();
        assert!(config.contains("resolver: MEMORY"));
        assert!(!config.contains(&natsjwt::seed(&keys.signing).unwrap()));
    }
}
