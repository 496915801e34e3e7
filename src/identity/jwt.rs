//! Identity tokens: SPIFFE JWT-SVIDs (seed "Authentication 8"), signed by the current signing
//! CA's own key (ECDSA P-256, JWS `ES256`).
//!
//! - Header `{"alg":"ES256","kid":K,"typ":"JWT"}`; `kid` is the signing CA certificate's
//!   SHA-256 fingerprint (hex), the same value `svc-identity ca info` shows.
//! - Claims `sub` (a SPIFFE ID in trust domain `svc`), `aud` (array), `exp`, `iat`, `jti`
//!   (a ULID, also the token's id for list and revoke).
//! - The public key set (`/.well-known/jwks.json`) holds the active signing CA's key only, with
//!   `x5c` = [signing CA, root]: after `ca rotate-signing` every earlier token names a `kid`
//!   that is no longer there and fails verification, as agent certificates do on the bus.
//! - Revocation is by `jti`, stored, checked by the server's own verification, and published
//!   (`/.well-known/jwt-revocations.json`: revoked ids that have not expired yet).
//!
//! Verification (`verify_token`) is a pure function over a [`KeySet`] (from a JWKS or from
//! `ca export` PEM) and an optional revocation list, so `svc-identity jwt verify` works
//! offline with exactly the code the server uses. The token is never stored, logged,
//! audited or put in an event: the store keeps its claims, audit rows its id.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::signature::{
    EcdsaKeyPair, UnparsedPublicKey, ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{active, ca, unseal, Keys, SIGNING};
use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::store::{JwtSvidRow, Store};
use crate::{clock, ids, Error, Result};

/// Lifetime when none is asked for, and the longest one granted.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// The one algorithm issued and accepted.
pub const ALG: &str = "ES256";
/// The SPIFFE trust domain of every subject.
pub const TRUST_DOMAIN_PREFIX: &str = "spiffe://svc/";
const MAX_AUDIENCES: usize = 16;
const MAX_AUDIENCE_LEN: usize = 256;
const MAX_SUBJECT_LEN: usize = 2048;

/// The claims of a verified token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub aud: Vec<String>,
    pub exp: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    pub jti: String,
}

/// One public key as a JWK (RFC 7517/7518): EC P-256 with its certificate chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwk {
    pub kty: String,
    #[serde(default)]
    pub crv: String,
    #[serde(default)]
    pub x: String,
    #[serde(default)]
    pub y: String,
    #[serde(default)]
    pub kid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub alg: String,
    #[serde(rename = "use", default, skip_serializing_if = "String::is_empty")]
    pub key_use: String,
    /// Standard base64 DER: the signing CA (whose key this is), then the root.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub x5c: Vec<String>,
}

/// `/.well-known/jwks.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwks {
    pub keys: Vec<Jwk>,
}

/// One entry of the published revocation list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revoked {
    pub jti: String,
    pub revoked_at: String,
    /// After this the token fails on `exp` anyway and the entry may be forgotten.
    pub expires_at: String,
}

/// `/.well-known/jwt-revocations.json`: revoked tokens that have not expired yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocations {
    pub generated_at: String,
    pub revoked: Vec<Revoked>,
}

impl Revocations {
    /// jti → revoked_at, for [`verify_token`].
    pub fn by_id(&self) -> BTreeMap<String, String> {
        self.revoked
            .iter()
            .map(|r| (r.jti.clone(), r.revoked_at.clone()))
            .collect()
    }
}

/// An issued token as `jwt list` shows it (never the token).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JwtView {
    pub id: String,
    pub subject: String,
    pub audience: Vec<String>,
    pub kid: String,
    /// `active`, `revoked`, `rotated` (its signing CA was rotated out) or `expired`.
    pub state: String,
    pub issued_by: String,
    pub issued_at: String,
    pub expires_at: String,
    pub revoked_at: Option<String>,
}

/// A freshly issued token: its record and the token, shown this once.
#[derive(Clone, Serialize, Deserialize)]
pub struct IssuedJwt {
    #[serde(flatten)]
    pub svid: JwtView,
    pub token: String,
}

impl std::fmt::Debug for IssuedJwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedJwt")
            .field("svid", &self.svid)
            .field("token", &"[REDACTED]")
            .finish()
    }
}

/// What an admin asks for (`jwt issue`).
#[derive(Clone, Debug, Default)]
pub struct IssueRequest {
    pub audience: Vec<String>,
    /// Default [`DEFAULT_TTL`], at most [`MAX_TTL`].
    pub ttl: Option<Duration>,
    /// Default `spiffe://svc/apikey/<key id>`.
    pub subject: Option<String>,
}

/// What an agent sends on `svc.agent.<id>.jwt` (its subject is always its own SPIFFE ID).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentRequest {
    pub audience: Vec<String>,
    /// A duration (`30m`, `1h`); empty: the default.
    pub ttl: String,
}

/// The answer of the server's own verification (`VerifyJwt`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verification {
    pub valid: bool,
    /// Why not, when not valid.
    pub reason: Option<String>,
    pub claims: Option<Claims>,
}

// ---- keys ----------------------------------------------------------------------------------

/// A public key a token may name by `kid`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct VerifyingKey {
    kid: String,
    /// Uncompressed P-256 point (0x04 ‖ x ‖ y).
    point: Vec<u8>,
}

/// The keys a verifier trusts, by `kid`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeySet {
    keys: Vec<VerifyingKey>,
}

impl KeySet {
    /// From a JWKS document: EC P-256 keys with a `kid` (others are skipped).
    pub fn from_jwks(jwks: &Jwks) -> KeySet {
        let coordinate = |text: &str| {
            URL_SAFE_NO_PAD
                .decode(text.trim_end_matches('='))
                .ok()
                .filter(|bytes| bytes.len() == 32)
        };
        let keys = jwks
            .keys
            .iter()
            .filter(|jwk| jwk.kty == "EC" && jwk.crv == "P-256" && !jwk.kid.is_empty())
            .filter(|jwk| jwk.alg.is_empty() || jwk.alg == ALG)
            .filter_map(|jwk| {
                let mut point = vec![4u8];
                point.extend(coordinate(&jwk.x)?);
                point.extend(coordinate(&jwk.y)?);
                Some(VerifyingKey {
                    kid: jwk.kid.clone(),
                    point,
                })
            })
            .collect();
        KeySet { keys }
    }

    /// From PEM certificates (`svc-identity ca export`): each P-256 certificate's key, its
    /// `kid` being the certificate's SHA-256 fingerprint. Certificates outside their validity
    /// are left out.
    pub fn from_pem_certificates(pem: &str) -> Result<KeySet> {
        let mut keys = Vec::new();
        for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
            let block = block.map_err(|e| Error::Invalid(format!("not PEM certificates: {e}")))?;
            if block.label != "CERTIFICATE" {
                continue;
            }
            let cert = block
                .parse_x509()
                .map_err(|e| Error::Invalid(format!("not an X.509 certificate: {e}")))?;
            if !cert.validity().is_valid() {
                continue;
            }
            if let Some(point) = p256_point(cert.public_key().subject_public_key.data.as_ref()) {
                keys.push(VerifyingKey {
                    kid: ca::fingerprint(&block.contents),
                    point,
                });
            }
        }
        if keys.is_empty() {
            return Err(Error::Invalid(
                "no valid P-256 certificate in the CA file".into(),
            ));
        }
        Ok(KeySet { keys })
    }

    fn find(&self, kid: &str) -> Option<&VerifyingKey> {
        self.keys.iter().find(|key| key.kid == kid)
    }
}

fn p256_point(bytes: &[u8]) -> Option<Vec<u8>> {
    (bytes.len() == 65 && bytes[0] == 4).then(|| bytes.to_vec())
}

/// The JWK of a signing CA: its public key, `kid` = its fingerprint, `x5c` = it and the root.
fn jwk_of(signing_pem: &str, root_pem: &str) -> Result<Jwk> {
    let der = ca::pem_to_der(signing_pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|_| Error::internal("the signing CA certificate does not parse"))?;
    let point = p256_point(cert.public_key().subject_public_key.data.as_ref())
        .ok_or_else(|| Error::internal("the signing CA key is not ECDSA P-256"))?;
    Ok(Jwk {
        kty: "EC".into(),
        crv: "P-256".into(),
        x: URL_SAFE_NO_PAD.encode(&point[1..33]),
        y: URL_SAFE_NO_PAD.encode(&point[33..65]),
        kid: ca::fingerprint(&der),
        alg: ALG.into(),
        key_use: "sig".into(),
        x5c: vec![
            STANDARD.encode(&der),
            STANDARD.encode(ca::pem_to_der(root_pem)?),
        ],
    })
}

// ---- signing and verifying -----------------------------------------------------------------

/// Signs `claims` as a compact JWS with the PKCS#8 P-256 key in `key_pem`.
fn sign(claims: &Claims, kid: &str, key_pem: &str) -> Result<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(key_pem.as_bytes())
        .map_err(|_| Error::internal("the signing CA key is not PEM"))?;
    let rng = ring::rand::SystemRandom::new();
    let signer = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &pem.contents, &rng)
        .map_err(|_| Error::internal("the signing CA key is not a PKCS#8 P-256 key"))?;
    let header = json!({"alg": ALG, "kid": kid, "typ": "JWT"});
    let encode = |value: &Value| URL_SAFE_NO_PAD.encode(value.to_string());
    let claims = serde_json::to_value(claims).map_err(Error::internal)?;
    let signing_input = format!("{}.{}", encode(&header), encode(&claims));
    let signature = signer
        .sign(&rng, signing_input.as_bytes())
        .map_err(|_| Error::internal("ECDSA signing failed"))?;
    Ok(format!(
        "{signing_input}.{}",
        URL_SAFE_NO_PAD.encode(signature.as_ref())
    ))
}

fn decode_part(part: &str, what: &str) -> std::result::Result<Value, String> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| format!("malformed token: the {what} is not base64url"))?;
    serde_json::from_slice(&bytes).map_err(|_| format!("malformed token: the {what} is not JSON"))
}

/// Reads the `jti` of a token without verifying anything (for revocation by token).
pub fn unverified_jti(token: &str) -> Option<String> {
    let claims = decode_part(token.trim().split('.').nth(1)?, "claims").ok()?;
    claims.get("jti")?.as_str().map(str::to_string)
}

/// Verifies a compact JWT-SVID: `ES256` only, a `kid` in `keys`, the signature, then `exp`
/// against `now` (Unix seconds), `audience` among `aud`, a SPIFFE `sub`, and `jti` not in
/// `revoked` (jti → revoked_at). `Err` is the reason, in words.
pub fn verify_token(
    token: &str,
    keys: &KeySet,
    audience: &str,
    revoked: &BTreeMap<String, String>,
    now: i64,
) -> std::result::Result<Claims, String> {
    let token = token.trim();
    let parts: Vec<&str> = token.split('.').collect();
    let [header_part, claims_part, signature_part] = parts[..] else {
        return Err("malformed token: not three base64url parts (header.claims.signature)".into());
    };
    let header = decode_part(header_part, "header")?;
    match header.get("alg").and_then(Value::as_str) {
        Some(ALG) => {}
        Some(other) => return Err(format!("unsupported alg '{other}' (only {ALG})")),
        None => return Err("malformed token: no alg in the header".into()),
    }
    if let Some(typ) = header.get("typ") {
        if !matches!(typ.as_str(), Some("JWT" | "JOSE")) {
            return Err(format!("unsupported typ {typ} (JWT or JOSE)"));
        }
    }
    let kid = header
        .get("kid")
        .and_then(Value::as_str)
        .ok_or("malformed token: no kid in the header")?;
    let key = keys.find(kid).ok_or_else(|| {
        format!("unknown kid '{kid}': not in the trusted keys (was the signing CA rotated?)")
    })?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature_part)
        .map_err(|_| "malformed token: the signature is not base64url".to_string())?;
    let signing_input = &token[..header_part.len() + 1 + claims_part.len()];
    UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &key.point)
        .verify(signing_input.as_bytes(), &signature)
        .map_err(|_| "bad signature".to_string())?;

    let claims = decode_part(claims_part, "claims")?;
    let text = |name: &str| {
        claims
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("malformed token: no {name} claim"))
    };
    let exp = claims
        .get("exp")
        .and_then(Value::as_i64)
        .ok_or("malformed token: no numeric exp claim")?;
    let aud = match claims.get("aud") {
        Some(Value::String(one)) => vec![one.clone()],
        Some(Value::Array(many)) => many
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or("malformed token: aud holds a non-string")?,
        _ => return Err("malformed token: no aud claim".into()),
    };
    let verified = Claims {
        sub: text("sub")?,
        aud,
        exp,
        iat: claims.get("iat").and_then(Value::as_i64),
        jti: text("jti")?,
    };
    if now >= exp {
        return Err(format!("expired at {}", clock::format_rfc3339(exp * 1000)));
    }
    if !verified.aud.iter().any(|a| a == audience) {
        return Err(format!(
            "wrong audience: the token is for {:?}, not '{audience}'",
            verified.aud
        ));
    }
    if !verified.sub.starts_with("spiffe://") {
        return Err(format!("subject '{}' is not a SPIFFE ID", verified.sub));
    }
    if let Some(at) = revoked.get(&verified.jti) {
        return Err(format!("revoked at {at}"));
    }
    Ok(verified)
}

// ---- validation ----------------------------------------------------------------------------

fn validate_audience(audience: &[String]) -> Result<Vec<String>> {
    let audience: Vec<String> = audience.iter().map(|a| a.trim().to_string()).collect();
    if audience.is_empty() {
        return Err(Error::Invalid("at least one --audience is required".into()));
    }
    if audience.len() > MAX_AUDIENCES {
        return Err(Error::Invalid(format!("at most {MAX_AUDIENCES} audiences")));
    }
    for value in &audience {
        if value.is_empty()
            || value.len() > MAX_AUDIENCE_LEN
            || value.chars().any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(Error::Invalid(format!(
                "invalid audience {value:?} (1-{MAX_AUDIENCE_LEN} characters, no spaces)"
            )));
        }
    }
    Ok(audience)
}

/// A SPIFFE ID in our trust domain: `spiffe://svc/` then `/`-separated segments of letters,
/// digits, `.`, `-` and `_` (not `.` or `..` alone).
pub fn validate_subject(subject: &str) -> Result<()> {
    let invalid = || {
        Error::Invalid(format!(
            "invalid subject '{subject}' (a SPIFFE ID {TRUST_DOMAIN_PREFIX}PATH; segments of \
             letters, digits, '.', '-', '_')"
        ))
    };
    let path = subject
        .strip_prefix(TRUST_DOMAIN_PREFIX)
        .ok_or_else(invalid)?;
    let is_valid = subject.len() <= MAX_SUBJECT_LEN
        && path.split('/').all(|segment| {
            !segment.is_empty()
                && segment != "."
                && segment != ".."
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
        });
    if is_valid {
        Ok(())
    } else {
        Err(invalid())
    }
}

fn validate_ttl(ttl: Option<Duration>) -> Result<Duration> {
    let ttl = ttl.unwrap_or(DEFAULT_TTL);
    if ttl < Duration::from_secs(1) {
        return Err(Error::Invalid("--ttl must be at least 1s".into()));
    }
    if ttl > MAX_TTL {
        return Err(Error::Invalid(format!(
            "--ttl may be at most {}",
            clock::format_duration(MAX_TTL)
        )));
    }
    Ok(ttl)
}

// ---- domain --------------------------------------------------------------------------------

fn state(row: &JwtSvidRow, now: &str, current_kid: &str) -> &'static str {
    if row.revoked_at.is_some() {
        "revoked"
    } else if row.expires_at.as_str() <= now {
        "expired"
    } else if row.kid != current_kid {
        "rotated"
    } else {
        "active"
    }
}

fn view(row: JwtSvidRow, now: &str, current_kid: &str) -> JwtView {
    JwtView {
        state: state(&row, now, current_kid).into(),
        audience: serde_json::from_str(&row.audience).unwrap_or_default(),
        id: row.id,
        subject: row.subject,
        kid: row.kid,
        issued_by: row.issued_by,
        issued_at: row.issued_at,
        expires_at: row.expires_at,
        revoked_at: row.revoked_at,
    }
}

/// Signs and records a token for `subject`; the caller audits.
async fn mint(
    domain: &Domain,
    keys: &Keys,
    principal: &Principal,
    subject: String,
    audience: &[String],
    ttl: Option<Duration>,
) -> Result<IssuedJwt> {
    validate_subject(&subject)?;
    let audience = validate_audience(audience)?;
    let ttl = validate_ttl(ttl)?;
    let (_, signing_row) = active(domain.store.as_ref()).await?;
    let signing = unseal(keys, &signing_row)?;
    let kid = signing_row.fingerprint.clone();
    let issued_at = clock::now_millis() / 1000;
    let claims = Claims {
        sub: subject,
        aud: audience,
        exp: issued_at + ttl.as_secs() as i64,
        iat: Some(issued_at),
        jti: ids::ulid(),
    };
    let token = sign(&claims, &kid, &signing.key_pem)?;
    let row = JwtSvidRow {
        id: claims.jti.clone(),
        subject: claims.sub.clone(),
        audience: serde_json::to_string(&claims.aud).map_err(Error::internal)?,
        kid: kid.clone(),
        issued_by: principal.id.clone(),
        issued_at: clock::format_rfc3339(issued_at * 1000),
        expires_at: clock::format_rfc3339(claims.exp * 1000),
        revoked_at: None,
        revoked_by: None,
    };
    domain.store.jwts().insert_jwt_svid(&row).await?;
    Ok(IssuedJwt {
        svid: view(row, &clock::now_rfc3339(), &kid),
        token,
    })
}

async fn audit_issue(
    domain: &Domain,
    principal: &Principal,
    via: &str,
    result: &Result<IssuedJwt>,
    asked: Value,
) {
    let (id, detail) = match result {
        Ok(issued) => (
            issued.svid.id.clone(),
            json!({
                "via": via, "subject": issued.svid.subject, "audience": issued.svid.audience,
                "expires_at": issued.svid.expires_at, "kid": issued.svid.kid,
            }),
        ),
        Err(_) => (String::new(), json!({"via": via, "asked": asked})),
    };
    domain
        .auditor
        .record(
            principal,
            Action::new("jwt.issue", "jwt_svid", &id).detail(detail.clone()),
            result,
        )
        .await;
    if result.is_ok() {
        emit(
            domain,
            principal,
            crate::events::EventKind::JwtIssued,
            &id,
            detail,
        )
        .await;
    }
}

/// The event of an issue or revoke: who did it and the token's id and claims, never the token.
async fn emit(
    domain: &Domain,
    principal: &Principal,
    kind: crate::events::EventKind,
    id: &str,
    mut payload: Value,
) {
    payload["id"] = json!(id);
    payload["by"] = json!(principal.name);
    domain.events.emit_system(kind, "server", payload).await;
}

/// `jwt issue` (admin): a token for `subject` (default the caller's own
/// `spiffe://svc/apikey/<key id>`).
pub async fn issue_jwt(
    domain: &Domain,
    principal: &Principal,
    request: IssueRequest,
) -> Result<IssuedJwt> {
    let keys = &domain.identity_keys();
    let subject = request
        .subject
        .clone()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| format!("{TRUST_DOMAIN_PREFIX}apikey/{}", principal.id));
    let result = domain
        .auditor
        .gate(principal, Action::new("jwt.issue", "jwt_svid", ""), async {
            principal.require(Role::Admin)?;
            mint(
                domain,
                keys,
                principal,
                subject.clone(),
                &request.audience,
                request.ttl,
            )
            .await
        })
        .await;
    let asked = json!({"subject": subject, "audience": request.audience});
    audit_issue(domain, principal, "api", &result, asked).await;
    result
}

/// An agent's own token, asked for on `svc.agent.<id>.jwt`: the broker lets only that agent
/// publish there, so the subject proves who asks and no role applies. The agent must be
/// enrolled and not quarantined; the token's subject is always `spiffe://svc/agent/<id>`.
pub async fn issue_agent_jwt(
    domain: &Domain,
    agent_id: &str,
    request: AgentRequest,
) -> Result<IssuedJwt> {
    let keys = &domain.identity_keys();
    let principal = Principal {
        id: format!("agent:{agent_id}"),
        name: agent_id.to_string(),
        role: Role::Readonly,
    };
    let result = domain
        .auditor
        .gate(
            &principal,
            Action::new("jwt.issue", "jwt_svid", ""),
            async {
                super::validate_agent_id(agent_id)?;
                match domain.store.get_agent(agent_id).await? {
                    None => {
                        return Err(Error::Unauthenticated(format!(
                            "agent '{agent_id}' is not enrolled"
                        )))
                    }
                    Some(agent) if agent.is_quarantined => {
                        return Err(Error::Forbidden(format!(
                            "agent '{agent_id}' is quarantined"
                        )))
                    }
                    Some(_) => {}
                }
                let ttl = match request.ttl.trim() {
                    "" => None,
                    text => Some(clock::parse_duration(text).ok_or_else(|| {
                        Error::Invalid(format!("invalid ttl '{text}' (e.g. 30m, 1h)"))
                    })?),
                };
                mint(
                    domain,
                    keys,
                    &principal,
                    ca::spiffe_id(agent_id),
                    &request.audience,
                    ttl,
                )
                .await
            },
        )
        .await;
    let asked = json!({"audience": request.audience});
    audit_issue(domain, &principal, "bus", &result, asked).await;
    result
}

/// `jwt list` (admin): tokens not expired yet, revoked ones marked.
pub async fn list_jwts(domain: &Domain, principal: &Principal) -> Result<Vec<JwtView>> {
    principal.require(Role::Admin)?;
    let (_, signing) = active(domain.store.as_ref()).await?;
    let now = clock::now_rfc3339();
    Ok(domain
        .store
        .jwts()
        .list_unexpired_jwt_svids(&now)
        .await?
        .into_iter()
        .map(|row| view(row, &now, &signing.fingerprint))
        .collect())
}

/// `jwt revoke ID` (admin). Revoking twice is not an error; the first time is kept.
pub async fn revoke_jwt(domain: &Domain, principal: &Principal, id: &str) -> Result<JwtView> {
    let result = domain
        .auditor
        .gate(
            principal,
            Action::new("jwt.revoke", "jwt_svid", id),
            async {
                principal.require(Role::Admin)?;
                let now = clock::now_rfc3339();
                let row = domain
                    .store
                    .jwts()
                    .revoke_jwt_svid(id, &now, &principal.id)
                    .await?
                    .ok_or_else(|| Error::NotFound(format!("JWT-SVID '{id}' not found")))?;
                let (_, signing) = active(domain.store.as_ref()).await?;
                Ok(view(row, &now, &signing.fingerprint))
            },
        )
        .await;
    let detail = match &result {
        Ok(view) => json!({"subject": view.subject, "expires_at": view.expires_at}),
        Err(_) => json!({}),
    };
    domain
        .auditor
        .record(
            principal,
            Action::new("jwt.revoke", "jwt_svid", id).detail(detail.clone()),
            &result,
        )
        .await;
    if result.is_ok() {
        emit(
            domain,
            principal,
            crate::events::EventKind::JwtRevoked,
            id,
            detail,
        )
        .await;
    }
    result
}

/// The public key set: the active signing CA's key (public; no key needed to read it).
pub async fn jwks(store: &dyn Store) -> Result<Jwks> {
    let (root, signing) = active(store).await?;
    debug_assert_eq!(signing.kind, SIGNING);
    Ok(Jwks {
        keys: vec![jwk_of(&signing.cert_pem, &root.cert_pem)?],
    })
}

/// The public revocation list: revoked tokens not expired yet.
pub async fn revocations(store: &dyn Store) -> Result<Revocations> {
    let now = clock::now_rfc3339();
    Ok(Revocations {
        revoked: store
            .jwts()
            .list_revoked_jwt_svids(&now)
            .await?
            .into_iter()
            .map(|row| Revoked {
                jti: row.id,
                revoked_at: row.revoked_at.unwrap_or_default(),
                expires_at: row.expires_at,
            })
            .collect(),
        generated_at: now,
    })
}

/// `jwt verify` against the server (readonly and up): the current key set, then the store's
/// record of the token (revocation, and that this server issued it). An invalid token is a
/// `Verification` with the reason, not an error.
pub async fn verify_jwt(
    domain: &Domain,
    principal: &Principal,
    token: &str,
    audience: &str,
) -> Result<Verification> {
    principal.require(Role::Readonly)?;
    let store = domain.store.as_ref();
    let keys = KeySet::from_jwks(&jwks(store).await?);
    let now = clock::now_millis() / 1000;
    let checked = match verify_token(token, &keys, audience, &BTreeMap::new(), now) {
        Ok(claims) => match store.jwts().get_jwt_svid(&claims.jti).await? {
            None => Err("not issued by this server (unknown jti)".to_string()),
            Some(row) => match row.revoked_at {
                Some(at) => Err(format!("revoked at {at}")),
                None => Ok(claims),
            },
        },
        Err(reason) => Err(reason),
    };
    Ok(match checked {
        Ok(claims) => Verification {
            valid: true,
            reason: None,
            claims: Some(claims),
        },
        Err(reason) => Verification {
            valid: false,
            reason: Some(reason),
            claims: None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (ca::Issued, ca::Issued, KeySet, String) {
        let root = ca::make_root().unwrap();
        let signing = ca::make_signing(&root).unwrap();
        let jwks = Jwks {
            keys: vec![jwk_of(&signing.cert_pem, &root.cert_pem).unwrap()],
        };
        let kid = jwks.keys[0].kid.clone();
        (root, signing, KeySet::from_jwks(&jwks), kid)
    }

    fn claims(exp: i64) -> Claims {
        Claims {
            sub: "spiffe://svc/agent/web-01".into(),
            aud: vec!["vault".into(), "db".into()],
            exp,
            iat: Some(exp - 60),
            jti: "01JTI".into(),
        }
    }

    #[test]
    fn signed_tokens_verify_from_jwks_and_from_ca_pem() {
        let (root, signing, keys, kid) = setup();
        let token = sign(&claims(2_000), &kid, &signing.key_pem).unwrap();
        let none = BTreeMap::new();
        assert_eq!(
            verify_token(&token, &keys, "db", &none, 1_000),
            Ok(claims(2_000))
        );
        let from_pem =
            KeySet::from_pem_certificates(&format!("{}{}", signing.cert_pem, root.cert_pem))
                .unwrap();
        assert!(verify_token(&token, &from_pem, "vault", &none, 1_000).is_ok());
        assert_eq!(unverified_jti(&token).as_deref(), Some("01JTI"));
    }

    #[test]
    fn each_refusal_has_its_reason() {
        let (root, signing, keys, kid) = setup();
        let none = BTreeMap::new();
        let token = sign(&claims(2_000), &kid, &signing.key_pem).unwrap();
        let reason = |token: &str, keys: &KeySet, aud: &str, revoked, now| {
            verify_token(token, keys, aud, revoked, now).unwrap_err()
        };
        assert!(reason(&token, &keys, "db", &none, 2_000).starts_with("expired at"));
        assert!(reason(&token, &keys, "other", &none, 1_000).starts_with("wrong audience"));
        let revoked = BTreeMap::from([("01JTI".to_string(), "then".to_string())]);
        assert_eq!(
            reason(&token, &keys, "db", &revoked, 1_000),
            "revoked at then"
        );
        // Another signing CA (a rotation) has another kid.
        let rotated = ca::make_signing(&root).unwrap();
        let other = KeySet::from_jwks(&Jwks {
            keys: vec![jwk_of(&rotated.cert_pem, &root.cert_pem).unwrap()],
        });
        assert!(reason(&token, &other, "db", &none, 1_000).starts_with("unknown kid"));
        // Signed by another key under the same kid.
        let forged = sign(&claims(2_000), &kid, &rotated.key_pem).unwrap();
        assert_eq!(reason(&forged, &keys, "db", &none, 1_000), "bad signature");
        // Changed claims under the original signature.
        let parts: Vec<&str> = token.split('.').collect();
        let mut changed = claims(9_000);
        changed.aud = vec!["db".into()];
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&changed).unwrap());
        let tampered = format!("{}.{body}.{}", parts[0], parts[2]);
        assert_eq!(
            reason(&tampered, &keys, "db", &none, 1_000),
            "bad signature"
        );
        // alg none is refused before any key is looked at.
        let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none","kid":"x"}"#);
        let unsigned = format!("{header}.{}.", parts[1]);
        assert!(reason(&unsigned, &keys, "db", &none, 1_000).starts_with("unsupported alg"));
        assert!(reason("abc", &keys, "db", &none, 1_000).starts_with("malformed"));
    }

    #[test]
    fn subjects_audiences_and_ttls() {
        for (subject, ok) in [
            ("spiffe://svc/agent/web-01", true),
            ("spiffe://svc/apikey/01ABC", true),
            ("spiffe://svc/a/b.c/d_e", true),
            ("spiffe://other/agent/x", false),
            ("spiffe://svc/", false),
            ("spiffe://svc/a//b", false),
            ("spiffe://svc/a/../b", false),
            ("spiffe://svc/a?b", false),
            ("https://svc/a", false),
        ] {
            assert_eq!(validate_subject(subject).is_ok(), ok, "{subject}");
        }
        assert!(validate_audience(&[]).is_err());
        assert!(validate_audience(&["a b".into()]).is_err());
        assert!(validate_audience(&["https://vault.example".into()]).is_ok());
        assert_eq!(validate_ttl(None).unwrap(), DEFAULT_TTL);
        assert!(validate_ttl(Some(Duration::from_millis(500))).is_err());
        assert!(validate_ttl(Some(MAX_TTL + Duration::from_secs(1))).is_err());
    }
}
