//! Identity (contract §10): the embedded CA, one-shot join tokens, PSKs, and enrolment;
//! JWT-SVIDs (`jwt`) and, for an external cluster with `bus.external_auth: jwt`, the NATS keys
//! and user JWTs (`nats`).
//!
//! Owns every rule about who an agent is. Transports (gRPC `IdentityService`, the bus
//! handlers of `svc.enroll`, `svc.enroll.renew` and `svc.agent.<id>.jwt`, the broker's agent
//! authenticator) call the functions here and translate the result; no crypto or SQL lives in
//! them.
//!
//! The CA lives in the store (`ca` table), keys sealed under master_key, and is read back on
//! each use rather than cached: a rotation is then seen at once by every part of this server
//! and by every server that shares the store, and the cost (one indexed read and an AES-GCM
//! open) is small next to a certificate signature. Keeping it in the store rather than in
//! files under data_dir/ca/ also means backups and `svc-migrate` carry it like every row.

pub mod ca;
pub mod jwt;
pub mod nats;
mod tokens;

use std::collections::BTreeMap;

use base64::Engine;
use serde::Serialize;

use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::config::ServerConfig;
use crate::domain::Domain;
use crate::store::{AgentRow, CaRow, Store};
use crate::{clock, ids, Error, Result};

pub use ca::CertificateInfo;
pub use tokens::{
    cleanup_tokens, create_token, list_tokens, revoke_token, spawn_token_cleanup, token_state,
    CreatedToken, NewToken, TokenFilter, TokenView,
};

/// The server secrets identity needs. `Debug` never shows them. Built once at start and held
/// by the `Domain` (`Domain::identity_keys` gives the ones in force).
#[derive(Clone)]
pub struct Keys {
    master_key: [u8; 32],
    hmacsecret: Vec<u8>,
    /// With `bus.external_auth: jwt`: the keys agents' bus JWTs are issued with.
    nats: Option<std::sync::Arc<nats::NatsKeys>>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys([REDACTED])")
    }
}

impl Keys {
    pub fn new(master_key: [u8; 32], hmacsecret: Vec<u8>) -> Keys {
        Keys {
            master_key,
            hmacsecret,
            nats: None,
        }
    }

    /// Whether agents get NATS user JWTs (cluster mode, `bus.external_auth: jwt`).
    pub fn issues_bus_jwts(&self) -> bool {
        self.nats.is_some()
    }

    /// The same keys, issuing agents' bus JWTs with `nats` (cluster mode, JWT login).
    pub fn with_nats(self, nats: Option<std::sync::Arc<nats::NatsKeys>>) -> Keys {
        Keys { nats, ..self }
    }

    /// From the validated server configuration (master_key: base64 of 32 bytes).
    pub fn from_config(config: &ServerConfig) -> Result<Keys> {
        let master_key =
            crate::datadir::decode_master_key(&config.master_key).ok_or_else(|| {
                Error::Invalid("master_key must be base64 of exactly 32 bytes".into())
            })?;
        Ok(Keys::new(
            master_key,
            config.hmacsecret.expose().as_bytes().to_vec(),
        ))
    }

    /// The configured master key.
    pub fn master_key(&self) -> &[u8; 32] {
        &self.master_key
    }

    /// The same keys under another master key (after `rotate-master`).
    pub fn with_master(&self, master_key: [u8; 32]) -> Keys {
        Keys {
            master_key,
            hmacsecret: self.hmacsecret.clone(),
            nats: self.nats.clone(),
        }
    }
}

/// Re-seals every active CA key from `old` to `new` master key; returns how many.
pub async fn reseal_ca(store: &dyn Store, old: &[u8; 32], new: &[u8; 32]) -> Result<u64> {
    let rows = store.active_ca().await?;
    for row in &rows {
        let context = seal_context(&row.kind, &row.id);
        let key = ca::open(old, &context, &row.key_encrypted)?;
        store
            .update_ca_key(&row.id, &ca::seal(new, &context, &key)?)
            .await?;
    }
    Ok(rows.len() as u64)
}

const ROOT: &str = "root";
const SIGNING: &str = "signing";
/// The command-signing key (not a CA; kept in the same table, sealed the same way).
const COMMAND: &str = "command";

fn seal_context(kind: &str, id: &str) -> String {
    format!("ca:{kind}:{id}")
}

fn sealed_row(keys: &Keys, kind: &str, issued: &ca::Issued) -> Result<CaRow> {
    let id = ids::ulid();
    let info = ca::describe(&issued.cert_pem)?;
    Ok(CaRow {
        key_encrypted: ca::seal(
            &keys.master_key,
            &seal_context(kind, &id),
            issued.key_pem.as_bytes(),
        )?,
        id,
        kind: kind.into(),
        cert_pem: issued.cert_pem.clone(),
        fingerprint: info.fingerprint,
        not_before: info.not_before,
        not_after: info.not_after,
        created_at: clock::now_rfc3339(),
        retired_at: None,
    })
}

fn unseal(keys: &Keys, row: &CaRow) -> Result<ca::Issued> {
    let key = ca::open(
        &keys.master_key,
        &seal_context(&row.kind, &row.id),
        &row.key_encrypted,
    )?;
    Ok(ca::Issued {
        cert_pem: row.cert_pem.clone(),
        key_pem: String::from_utf8(key).map_err(Error::internal)?,
    })
}

/// The active root and signing CA rows.
async fn active(store: &dyn Store) -> Result<(CaRow, CaRow)> {
    let rows = store.active_ca().await?;
    let find = |kind: &str| rows.iter().find(|row| row.kind == kind).cloned();
    match (find(ROOT), find(SIGNING)) {
        (Some(root), Some(signing)) => Ok((root, signing)),
        _ => Err(Error::Unavailable("the CA is not initialised".into())),
    }
}

/// The current signing CA certificate (PEM), which agent identities must chain to.
pub async fn current_signing_pem(store: &dyn Store) -> Result<String> {
    Ok(active(store).await?.1.cert_pem)
}

/// The root CA certificate (DER): the trust anchor for agent certificates presented over
/// mutual TLS on the bus. It is made once, on first start, and never rotated (only the
/// signing CA under it is), so reading it at start is enough.
pub async fn root_der(store: &dyn Store) -> Result<Vec<u8>> {
    ca::pem_to_der(&active(store).await?.0.cert_pem)
}

/// Authenticates an agent on the bus: its certificate must chain to the current signing CA
/// (so a rotation cuts older identities off), be its latest enrolment (a re-bootstrap
/// replaces the previous certificate), and `signature` must sign `nonce` with its key.
/// `signature` may be None only when TLS already proved possession of the key.
pub async fn authenticate_agent(
    store: &dyn Store,
    certificate_der: &[u8],
    nonce: &[u8],
    signature: Option<&[u8]>,
) -> Result<String> {
    let signing = current_signing_pem(store).await?;
    let verified = ca::verify_agent(&signing, certificate_der, nonce, signature)?;
    match store.get_agent(&verified.agent_id).await? {
        Some(agent) if agent.fingerprint == verified.fingerprint => Ok(verified.agent_id),
        Some(_) => Err(Error::Unauthenticated(format!(
            "agent '{}' has enrolled again since this certificate was issued",
            verified.agent_id
        ))),
        None => Err(Error::Unauthenticated(format!(
            "agent '{}' is not enrolled",
            verified.agent_id
        ))),
    }
}

/// At start: makes the root and signing CA on first run, and checks master_key opens them.
pub async fn ensure_ca(store: &dyn Store, keys: &Keys) -> Result<()> {
    // insert_first_ca, not insert_ca: servers sharing one database may start together, and
    // the one that loses the race must use the winner's CA rather than retire it.
    let rows = store.active_ca().await?;
    let root = match rows.iter().find(|row| row.kind == ROOT) {
        Some(row) => unseal(keys, row)?,
        None => {
            let root = ca::make_root()?;
            match store
                .insert_first_ca(&sealed_row(keys, ROOT, &root)?)
                .await?
            {
                Some(theirs) => unseal(keys, &theirs)?,
                None => {
                    tracing::info!("created the root CA");
                    root
                }
            }
        }
    };
    let signing = match rows.iter().find(|row| row.kind == SIGNING) {
        Some(row) => Some(row.clone()),
        None => {
            let signing = ca::make_signing(&root)?;
            let theirs = store
                .insert_first_ca(&sealed_row(keys, SIGNING, &signing)?)
                .await?;
            if theirs.is_none() {
                tracing::info!("created the signing CA");
            }
            theirs
        }
    };
    if let Some(row) = signing {
        unseal(keys, &row)?;
    }
    // Data dirs from before signed commands get their key at the next start.
    let command = match rows.iter().find(|row| row.kind == COMMAND) {
        Some(row) => Some(row.clone()),
        None => {
            let theirs = store
                .insert_first_ca(&sealed_row(keys, COMMAND, &ca::make_command_key(None)?)?)
                .await?;
            if theirs.is_none() {
                tracing::info!("created the command-signing key");
            }
            theirs
        }
    };
    if let Some(row) = command {
        unseal(keys, &row)?;
    }
    Ok(())
}

/// The active command-signing rows, oldest first: the current key alone, or during a
/// rotation's grace the previous one and then the current one.
async fn command_rows(store: &dyn Store) -> Result<Vec<CaRow>> {
    let rows: Vec<CaRow> = store
        .active_ca()
        .await?
        .into_iter()
        .filter(|row| row.kind == COMMAND)
        .collect();
    if rows.is_empty() {
        return Err(Error::Unavailable(
            "the command-signing key is not initialised".into(),
        ));
    }
    Ok(rows)
}

/// The certificates of `rows`, newest (the current key) first.
fn command_bundle(rows: &[CaRow]) -> String {
    rows.iter().rev().map(|row| row.cert_pem.as_str()).collect()
}

/// The public halves of the command-signing keys in force (certificates, PEM, current
/// first): what agents verify commands with. Given at enrolment, so an agent enrolled during
/// a rotation's grace trusts both keys like the agents that got the rotation notice.
pub async fn command_key_pem(store: &dyn Store) -> Result<String> {
    Ok(command_bundle(&command_rows(store).await?))
}

fn command_signer_of(keys: &Keys, row: &CaRow) -> Result<crate::fleet::signature::Signer> {
    crate::fleet::signature::Signer::from_pkcs8_pem(&unseal(keys, row)?.key_pem)
}

/// What signs the commands this server sends to agents: the current key (read and unsealed
/// per job, as the CA is per use: see the module comment; so every server sharing the store
/// signs with the new key as soon as a rotation is committed).
pub async fn command_signer(domain: &Domain) -> Result<crate::fleet::signature::Signer> {
    let rows = command_rows(domain.store.as_ref()).await?;
    command_signer_of(&domain.identity_keys(), rows.last().expect("not empty"))
}

/// A command-key notice's content: the set agents must trust (PEM, current first) and what
/// signs the notice: the oldest key in force, which every agent that
/// is up to date trusts (during a grace the previous key, which agents that missed the
/// rotation still hold; after it the current one).
pub struct CommandKeys {
    pub certificates: String,
    pub signer: crate::fleet::signature::Signer,
}

pub async fn command_keys(domain: &Domain) -> Result<CommandKeys> {
    let rows = command_rows(domain.store.as_ref()).await?;
    Ok(CommandKeys {
        certificates: command_bundle(&rows),
        signer: command_signer_of(&domain.identity_keys(), &rows[0])?,
    })
}

/// `command-key info|rotate|retire`: the keys in force and, after a rotate or retire, how the
/// connected agents took the notice.
#[derive(Clone, Debug, Serialize)]
pub struct CommandKeyInfo {
    pub current: CertificateInfo,
    /// The previous key, still accepted until `retire_after` (a rotation's grace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<CertificateInfo>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub retire_after: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agents: Option<crate::fleet::command_keys::Delivered>,
}

/// When the previous key's grace ends (rows: oldest first, two of them), as Unix ms.
fn retire_after_ms(domain: &Domain, rows: &[CaRow]) -> Option<i64> {
    let rotated = clock::parse_rfc3339(&rows.last()?.created_at)?;
    let grace = domain.fleet.command_key_grace.as_millis() as i64;
    (rows.len() > 1).then_some(rotated + grace)
}

async fn command_key_info(domain: &Domain) -> Result<CommandKeyInfo> {
    let rows = command_rows(domain.store.as_ref()).await?;
    let previous = match &rows[..] {
        [previous, _] => Some(ca::describe(&previous.cert_pem)?),
        _ => None,
    };
    Ok(CommandKeyInfo {
        current: ca::describe(&rows.last().expect("not empty").cert_pem)?,
        previous,
        retire_after: retire_after_ms(domain, &rows)
            .map(clock::format_rfc3339)
            .unwrap_or_default(),
        agents: None,
    })
}

pub async fn command_key_status(domain: &Domain, principal: &Principal) -> Result<CommandKeyInfo> {
    principal.require(Role::Readonly)?;
    command_key_info(domain).await
}

/// `command-key rotate`: a new command-signing key, issued by the root CA, beside the current
/// one, which becomes the previous key: still accepted by agents until it is retired (after
/// `agents.command_key_grace`, or `command-key retire`). The connected agents are sent the
/// notice (signed with the previous key) and their answers counted; the others get it when
/// they reconnect (their heartbeat names the set they trust).
pub async fn rotate_command_key(domain: &Domain, principal: &Principal) -> Result<CommandKeyInfo> {
    let keys = &domain.identity_keys();
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("command_key.rotate", "command_key", COMMAND),
            async {
                principal.require(Role::Admin)?;
                let store = domain.store.as_ref();
                let in_grace = || {
                    Error::FailedPrecondition(
                        "the previous command key is still accepted (a rotation's grace): retire \
                     it first with `svc-identity command-key retire`"
                            .into(),
                    )
                };
                let rows = command_rows(store).await?;
                if rows.len() > 1 {
                    return Err(in_grace());
                }
                let (root, _) = active(store).await?;
                let issued = ca::make_command_key(Some(&unseal(keys, &root)?))?;
                let row = sealed_row(keys, COMMAND, &issued)?;
                if !store.add_ca_generation(&row).await? {
                    return Err(in_grace());
                }
                Ok((rows[0].fingerprint.clone(), row.fingerprint))
            },
        )
        .await;
    let detail = rotation_detail(&result);
    let action = Action::new("command_key.rotate", "command_key", COMMAND).detail(detail);
    audited_then_notified(domain, principal, action, result).await
}

/// Records a rotate or retire; once it is done, the keys in force after the connected agents
/// were sent the notice of them.
async fn audited_then_notified<T>(
    domain: &Domain,
    principal: &Principal,
    action: Action,
    result: Result<T>,
) -> Result<CommandKeyInfo> {
    domain.auditor.record(principal, action, &result).await;
    result?;
    let agents = domain.fleet.registry.connected();
    let count = agents.len() as u64;
    // The change is committed: a notice that cannot go out is reported, not an error (the
    // agents get it when they reconnect).
    let delivered = crate::fleet::command_keys::notify(domain, agents)
        .await
        .unwrap_or_else(|error| {
            tracing::warn!(%error, "command-key notice not sent");
            crate::fleet::command_keys::Delivered {
                unreachable: count,
                ..Default::default()
            }
        });
    Ok(CommandKeyInfo {
        agents: Some(delivered),
        ..command_key_info(domain).await?
    })
}

/// `command-key retire`: ends a rotation's grace now. Agents that get the notice (signed with
/// the current key) stop accepting commands signed with the previous one; an agent that
/// missed both the rotation and this must bootstrap again. `scheduled`: done by the server
/// when the grace ran out.
pub async fn retire_command_key(
    domain: &Domain,
    principal: &Principal,
    scheduled: bool,
) -> Result<CommandKeyInfo> {
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("command_key.retire", "command_key", COMMAND),
            async {
                principal.require(Role::Admin)?;
                let store = domain.store.as_ref();
                let rows = command_rows(store).await?;
                if rows.len() < 2
                    || store
                        .retire_older_ca(COMMAND, &clock::now_rfc3339())
                        .await?
                        == 0
                {
                    return Err(Error::FailedPrecondition(
                        "there is no previous command key to retire (rotate first)".into(),
                    ));
                }
                Ok(rows[0].fingerprint.clone())
            },
        )
        .await;
    let mut detail = serde_json::json!({"scheduled": scheduled});
    if let Ok(retired) = &result {
        detail["retired_fingerprint"] = serde_json::json!(retired);
    }
    let action = Action::new("command_key.retire", "command_key", COMMAND).detail(detail);
    audited_then_notified(domain, principal, action, result).await
}

/// Retires the previous command key when its grace has run out, on the leader, checking every
/// tenth of the grace (between a second and a minute).
pub fn spawn_command_key_retirement(domain: std::sync::Arc<Domain>) {
    let grace = domain.fleet.command_key_grace;
    let period = (grace / 10).clamp(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(60),
    );
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if !domain.cluster.is_leader() {
                continue;
            }
            let due = match command_rows(domain.store.as_ref()).await {
                Ok(rows) => {
                    retire_after_ms(&domain, &rows).is_some_and(|at| at <= clock::now_millis())
                }
                Err(_) => false,
            };
            if due {
                match retire_command_key(&domain, &Principal::server(), true).await {
                    Ok(info) => {
                        tracing::info!(agents = ?info.agents, "previous command key retired: its grace ran out")
                    }
                    Err(error) => tracing::warn!(%error, "previous command key not retired"),
                }
            }
        }
    });
}

/// `ca info`: both certificates.
#[derive(Clone, Debug, Serialize)]
pub struct CaInfo {
    pub root_ca: CertificateInfo,
    pub signing_ca: CertificateInfo,
}

pub async fn ca_info(domain: &Domain, principal: &Principal) -> Result<CaInfo> {
    principal.require(Role::Readonly)?;
    let (root, signing) = active(domain.store.as_ref()).await?;
    Ok(CaInfo {
        root_ca: ca::describe(&root.cert_pem)?,
        signing_ca: ca::describe(&signing.cert_pem)?,
    })
}

/// The audit detail of a rotation: the fingerprints it replaced and made.
fn rotation_detail(result: &Result<(String, String)>) -> serde_json::Value {
    match result {
        Ok((old, new)) => serde_json::json!({"old_fingerprint": old, "new_fingerprint": new}),
        Err(_) => serde_json::json!({}),
    }
}

/// `ca rotate-signing` on a JWT-mode cluster: the next NATS account signing key, the public
/// half (None elsewhere, or when one is already waiting).
async fn rotate_nats_signing(domain: &Domain, keys: &Keys) -> Result<Option<String>> {
    if !keys.issues_bus_jwts() {
        return Ok(None);
    }
    nats::add_next_signing_key(domain.store.as_ref(), keys).await
}

/// `ca rotate-signing`: a new signing CA under the same root. Agent certificates from the old
/// one stop authenticating on the bus at once (the broker checks against the current one).
pub async fn rotate_signing(domain: &Domain, principal: &Principal) -> Result<CaInfo> {
    let keys = &domain.identity_keys();
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("ca.rotate_signing", "ca", SIGNING),
            async {
                principal.require(Role::Admin)?;
                let (root, old) = active(domain.store.as_ref()).await?;
                let signing = ca::make_signing(&unseal(keys, &root)?)?;
                let row = sealed_row(keys, SIGNING, &signing)?;
                domain.store.insert_ca(&row).await?;
                Ok((old.fingerprint, row.fingerprint))
            },
        )
        .await;
    let mut detail = rotation_detail(&result);
    if result.is_ok() {
        // The NATS account's signing key rotates with the CA, in two steps (docs/cluster.md).
        match rotate_nats_signing(domain, keys).await {
            Ok(Some(next)) => detail["nats_next_signing_key"] = serde_json::json!(next),
            Ok(None) => {}
            Err(error) => {
                tracing::error!(%error, "the NATS account signing key was not rotated");
                detail["nats_signing_key_error"] = serde_json::json!(error.to_string());
            }
        }
    }
    domain
        .auditor
        .record(
            principal,
            Action::new("ca.rotate_signing", "ca", SIGNING).detail(detail.clone()),
            &result,
        )
        .await;
    result?;
    domain
        .events
        .emit_system(
            crate::events::EventKind::CaSigningRotated,
            &principal.name,
            detail,
        )
        .await;
    ca_info(domain, principal).await
}

/// `ca export`: the public chain, signing CA first, then the root, then the command-signing
/// certificates in force (current first), which are no CA: a verifier that takes the file as
/// trust anchors gains nothing from them, and an operator has every public certificate the
/// server holds in one place.
pub async fn export_chain(domain: &Domain, principal: &Principal) -> Result<String> {
    let result = async {
        principal.require(Role::Admin)?;
        let store = domain.store.as_ref();
        let (root, signing) = active(store).await?;
        let command = command_key_pem(store).await?;
        Ok(format!("{}{}{command}", signing.cert_pem, root.cert_pem))
    }
    .await;
    domain
        .auditor
        .record(principal, Action::new("ca.export", "ca", "chain"), &result)
        .await;
    result
}

/// PBKDF2 rounds for `ca encrypt` (OWASP's figure for PBKDF2-HMAC-SHA256).
const PBKDF2_ROUNDS: u32 = 600_000;
const MIN_PASSPHRASE: usize = 12;

/// `ca encrypt`: both CA certificates and keys, sealed under a key derived from a passphrase,
/// as a self-describing JSON document for offline keeping.
pub async fn encrypt_ca(
    domain: &Domain,
    principal: &Principal,
    passphrase: &str,
) -> Result<Vec<u8>> {
    let keys = &domain.identity_keys();
    let result = async {
        principal.require(Role::Admin)?;
        if passphrase.chars().count() < MIN_PASSPHRASE {
            return Err(Error::Invalid(format!(
                "the passphrase must have at least {MIN_PASSPHRASE} characters"
            )));
        }
        let (root, signing) = active(domain.store.as_ref()).await?;
        let pair = |row: &CaRow| -> Result<serde_json::Value> {
            let issued = unseal(keys, row)?;
            Ok(serde_json::json!({"certificate": issued.cert_pem, "private_key": issued.key_pem}))
        };
        let command_keys = command_rows(domain.store.as_ref())
            .await?
            .iter()
            .rev()
            .map(pair)
            .collect::<Result<Vec<_>>>()?;
        let plaintext = serde_json::to_vec(&serde_json::json!({
            "root_ca": pair(&root)?,
            "signing_ca": pair(&signing)?,
            "command_keys": command_keys,
        }))
        .map_err(Error::internal)?;
        let salt: [u8; 16] = rand::random();
        let mut key = [0u8; 32];
        ring::pbkdf2::derive(
            ring::pbkdf2::PBKDF2_HMAC_SHA256,
            std::num::NonZeroU32::new(PBKDF2_ROUNDS).expect("rounds are not zero"),
            &salt,
            passphrase.as_bytes(),
            &mut key,
        );
        const FORMAT: &str = "svc-ca-backup/v1";
        let sealed = ca::seal(&key, FORMAT, &plaintext)?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let document = serde_json::json!({
            "format": FORMAT,
            "created_at": clock::now_rfc3339(),
            "kdf": {"name": "pbkdf2-hmac-sha256", "rounds": PBKDF2_ROUNDS, "salt": b64.encode(salt)},
            "cipher": {"name": "aes-256-gcm", "layout": "base64(nonce[12] || ciphertext || tag[16])", "aad": FORMAT},
            "ciphertext": sealed,
            "contents": "JSON {root_ca, signing_ca, command_keys: [current first]}: \
                         {certificate, private_key} in PEM",
        });
        let mut bytes = serde_json::to_vec_pretty(&document).map_err(Error::internal)?;
        bytes.push(b'\n');
        Ok(bytes)
    }
    .await;
    domain
        .auditor
        .record(principal, Action::new("ca.encrypt", "ca", "keys"), &result)
        .await;
    result
}

/// `status`: provider health, token counts by state, and the earliest CA expiry.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Status {
    pub provider: String,
    pub health: String,
    pub detail: String,
    pub tokens: BTreeMap<String, u64>,
    pub ca_not_after: String,
}

pub async fn status(domain: &Domain, principal: &Principal) -> Result<Status> {
    principal.require(Role::Readonly)?;
    let keys = &domain.identity_keys();
    let mut tokens: BTreeMap<String, u64> = ["unused", "used", "revoked", "expired"]
        .into_iter()
        .map(|state| (state.to_string(), 0))
        .collect();
    let now = clock::now_rfc3339();
    for row in domain.store.list_join_tokens().await? {
        *tokens.entry(token_state(&row, &now).into()).or_default() += 1;
    }
    let mut status = Status {
        provider: "embedded".into(),
        tokens,
        ..Status::default()
    };
    let checked = async {
        let (root, signing) = active(domain.store.as_ref()).await?;
        unseal(keys, &root)?;
        unseal(keys, &signing)?;
        Ok::<_, Error>(root.not_after.min(signing.not_after))
    }
    .await;
    match checked {
        Ok(not_after) if not_after > now => {
            status.health = "ok".into();
            status.ca_not_after = not_after;
        }
        Ok(not_after) => {
            status.health = "expired".into();
            status.detail = format!("a CA certificate expired at {not_after}");
            status.ca_not_after = not_after;
        }
        Err(error) => {
            status.health = "error".into();
            status.detail = match error {
                Error::Internal(cause) => cause,
                other => other.to_string(),
            };
        }
    }
    Ok(status)
}

/// The bootstrap PSK of an agent: hex HMAC-SHA256(hmacsecret, agent_id).
pub fn psk_for(keys: &Keys, agent_id: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &keys.hmacsecret);
    hex::encode(ring::hmac::sign(&key, agent_id.as_bytes()).as_ref())
}

fn is_valid_psk(keys: &Keys, agent_id: &str, psk: &str) -> bool {
    let Ok(given) = hex::decode(psk.trim()) else {
        return false;
    };
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &keys.hmacsecret);
    ring::hmac::verify(&key, agent_id.as_bytes(), &given).is_ok()
}

/// `psk AGENT_ID` (admin): the PSK is a credential, so showing it is audited.
pub async fn psk(domain: &Domain, principal: &Principal, agent_id: &str) -> Result<String> {
    let keys = &domain.identity_keys();
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("agent.psk", "agent", agent_id),
            async {
                principal.require(Role::Admin)?;
                validate_agent_id(agent_id)?;
                Ok(psk_for(keys, agent_id))
            },
        )
        .await;
    domain
        .auditor
        .record(
            principal,
            Action::new("agent.psk", "agent", agent_id),
            &result,
        )
        .await;
    result
}

/// Agent ids become bus subject tokens and SAN path segments: letters, digits, `-` and `_`.
pub fn validate_agent_id(agent_id: &str) -> Result<()> {
    let is_valid = !agent_id.is_empty()
        && agent_id.len() <= 64
        && agent_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if is_valid {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "invalid agent id '{agent_id}' (1-64 letters, digits, '-' or '_')"
        )))
    }
}

/// What an agent sends on `svc.enroll`. It carries a CSR, never a private key.
#[derive(Clone, Debug, Default, serde::Deserialize, Serialize)]
#[serde(default)]
pub struct EnrolRequest {
    pub agent_id: String,
    pub labels: BTreeMap<String, String>,
    /// PEM certificate signing request for the agent's locally made key.
    pub csr: String,
    pub token: Option<String>,
    pub psk: Option<String>,
    /// The public half of the nkey the agent made for an external cluster in JWT mode
    /// (`U...`); the seed stays on the host. Sent always; used only in that mode.
    pub bus_nkey: Option<String>,
    /// The agent signs its results and heartbeats with its certificate's key: the server
    /// records the key and drops what it has not signed (`fleet::agent_signature`). False
    /// from an svc-agent older than that, whose messages then go unsigned.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub signs_messages: bool,
}

/// What the agent gets back: public material only.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Enrolled {
    pub certificate: String,
    /// Signing CA then root, PEM.
    pub ca_chain: String,
    /// The server's command-signing certificate (PEM): the agent runs only commands signed
    /// with its key. Empty from servers older than signed commands.
    #[serde(default)]
    pub command_key: String,
    /// In cluster mode with `bus.external_auth: jwt`: the agent's user JWT for `bus_nkey`,
    /// which it logs in to the NATS cluster with. Empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bus_jwt: String,
}

/// Enrols an agent: checks the join token (or PSK), issues its certificate from the signing
/// CA, burns the token, records the agent. Audited as `agent.enroll` whatever the outcome.
pub async fn enrol(domain: &Domain, request: EnrolRequest) -> Result<Enrolled> {
    let keys = &domain.identity_keys();
    let principal = Principal {
        id: format!("agent:{}", request.agent_id),
        name: request.agent_id.clone(),
        role: Role::Readonly,
    };
    let method = if request.token.is_some() {
        "token"
    } else {
        "psk"
    };
    let mut credential_id = None;
    let result = domain
        .auditor
        .gate(
            &principal,
            Action::new("agent.enroll", "agent", &request.agent_id),
            enrol_checked(domain, keys, &request, &mut credential_id),
        )
        .await;
    let mut detail = serde_json::json!({"method": method, "labels": request.labels});
    if let Some(id) = &credential_id {
        detail["credential_id"] = serde_json::json!(id);
    }
    match &result {
        Ok((_, fingerprint)) => detail["fingerprint"] = serde_json::json!(fingerprint),
        Err(error) => detail["reason"] = serde_json::json!(error.to_string()),
    }
    domain
        .auditor
        .record(
            &principal,
            Action::new("agent.enroll", "agent", &request.agent_id).detail(detail),
            &result,
        )
        .await;
    let (enrolled, fingerprint) = result?;
    domain
        .events
        .emit_system(
            crate::events::EventKind::AgentEnrolled,
            &request.agent_id,
            serde_json::json!({
                "agent_id": request.agent_id, "labels": request.labels,
                "fingerprint": fingerprint, "method": method,
            }),
        )
        .await;
    Ok(enrolled)
}

async fn enrol_checked(
    domain: &Domain,
    keys: &Keys,
    request: &EnrolRequest,
    credential_id: &mut Option<String>,
) -> Result<(Enrolled, String)> {
    validate_agent_id(&request.agent_id)?;
    let store = domain.store.as_ref();
    let token = match (&request.token, &request.psk) {
        (Some(_), Some(_)) => {
            return Err(Error::Invalid(
                "give a join token or a PSK, not both".into(),
            ))
        }
        (None, None) => return Err(Error::Invalid("a join token or a PSK is required".into())),
        (Some(token), None) => {
            let row = tokens::check_for_enrolment(store, token, &request.agent_id).await?;
            *credential_id = Some(row.id.clone());
            Some(row)
        }
        (None, Some(psk)) => {
            if !is_valid_psk(keys, &request.agent_id, psk) {
                return Err(Error::Unauthenticated("invalid PSK".into()));
            }
            None
        }
    };
    let (root, signing_row) = active(store).await?;
    let signing = unseal(keys, &signing_row)?;
    let command_key = command_key_pem(store).await?;
    // Issue before burning the token: a bad CSR must not cost the operator a token.
    let certificate = ca::issue_agent(&signing, &request.agent_id, &request.csr)?;
    let bus_jwt =
        match (&keys.nats, &request.bus_nkey) {
            (None, _) => String::new(),
            (Some(nats), Some(user)) => nats::agent_jwt(nats, &request.agent_id, user)?,
            (Some(_), None) => return Err(Error::Invalid(
                "this cluster's NATS logs agents in with JWTs and the request has no bus_nkey: \
                 upgrade svc-agent"
                    .into(),
            )),
        };
    let fingerprint = ca::fingerprint(&ca::pem_to_der(&certificate)?);
    let public_key = if request.signs_messages {
        Some(crate::fleet::agent_signature::public_key_of(&certificate)?)
    } else {
        None
    };
    let now = clock::now_rfc3339();
    if let Some(row) = token {
        if !store
            .use_join_token(&row.id, &now, &request.agent_id)
            .await?
        {
            return Err(Error::Unauthenticated("join token already used".into()));
        }
    }
    let labels = serde_json::to_string(&request.labels).map_err(Error::internal)?;
    store
        .upsert_agent(&AgentRow {
            id: request.agent_id.clone(),
            labels,
            fingerprint: fingerprint.clone(),
            enrolled_at: now,
            public_key,
            ..AgentRow::default()
        })
        .await?;
    Ok((
        Enrolled {
            certificate,
            ca_chain: format!("{}{}", signing_row.cert_pem, root.cert_pem),
            command_key,
            bus_jwt,
        },
        fingerprint,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_ids() {
        let cases = [
            ("web-01", true),
            ("a_b", true),
            ("", false),
            ("a.b", false),
            ("a*", false),
            ("a>", false),
            ("a b", false),
        ];
        for (id, expected) in cases {
            assert_eq!(validate_agent_id(id).is_ok(), expected, "{id:?}");
        }
    }

    #[test]
    fn psk_is_hmac_of_the_agent_id() {
        let keys = Keys::new([0; 32], b"secret".to_vec());
        let psk = psk_for(&keys, "web-01");
        assert_eq!(psk.len(), 64);
        assert!(is_valid_psk(&keys, "web-01", &psk));
        assert!(!is_valid_psk(&keys, "web-02", &psk));
        assert!(!is_valid_psk(&keys, "web-01", "zz"));
    }
}
