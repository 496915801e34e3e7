//! NATS JWTs (decentralized authentication, nats-server's operator mode) for an external NATS
//! cluster: the operator, account and user claims svc issues, in the format nats-server 2.9
//! reads (`typ: JWT`, `alg: ed25519-nkey`, claims under `nats` with `version: 2`).
//!
//! Why JWTs: on the embedded broker svc itself decides what each connection may do; on an
//! external cluster nobody would, so each client carries a user JWT whose permissions are the
//! ones the embedded broker grants it, signed by the account signing key svc holds
//! (identity::nats), and proves it holds the user's nkey by signing the server's nonce.
//! Keys are nkeys (Ed25519, NATS's base32 encoding); the signing is the nkeys crate's.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// Subject rules of a user JWT (`pub`/`sub` allow lists; an empty list allows nothing only
/// when the other direction's list is used — see [`user`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserPermissions {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
    /// Denied within what `publish` allows (nats-server: deny wins).
    pub publish_deny: Vec<String>,
    /// Everything: no `pub`/`sub` section at all (members).
    pub all: bool,
}

/// An nkey pair from its seed (`S...`).
pub fn key_pair(seed: &str) -> Result<nkeys::KeyPair> {
    nkeys::KeyPair::from_seed(seed).map_err(|e| Error::Internal(format!("nkey seed: {e}")))
}

/// The seed of a key pair (what is sealed at rest).
pub fn seed(key: &nkeys::KeyPair) -> Result<String> {
    key.seed()
        .map_err(|e| Error::Internal(format!("nkey seed: {e}")))
}

/// Is `value` a user public nkey (`U` + 55 base32 characters, checksum valid)?
pub fn is_user_public_key(value: &str) -> bool {
    value.starts_with('U')
        && nkeys::KeyPair::from_public_key(value)
            .is_ok_and(|key| matches!(key.key_pair_type(), nkeys::KeyPairType::User))
}

/// The operator JWT, self-signed, naming the system account.
pub fn operator(operator: &nkeys::KeyPair, name: &str, system_account: &str) -> Result<String> {
    let claims = json!({
        "name": name,
        "sub": operator.public_key(),
        "nats": {"system_account": system_account, "type": "operator", "version": 2},
    });
    encode(operator, claims)
}

/// An account JWT signed by the operator. `jetstream`: the account may use JetStream without
/// limits (the svc account holds the events, audit and file streams); the system account
/// may not. `revoked`: user public keys whose JWTs issued before the given time (Unix
/// seconds) no longer connect.
pub fn account(
    operator: &nkeys::KeyPair,
    account: &str,
    name: &str,
    signing_keys: &[String],
    jetstream: bool,
    revoked: &[(String, i64)],
) -> Result<String> {
    let mut limits = json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
    });
    if jetstream {
        for field in ["mem_storage", "disk_storage", "streams", "consumer"] {
            limits[field] = json!(-1);
        }
    }
    let mut nats = json!({
        "limits": limits,
        "signing_keys": signing_keys,
        "default_permissions": {"pub": {}, "sub": {}},
        "type": "account",
        "version": 2,
    });
    if !revoked.is_empty() {
        nats["revocations"] = revoked
            .iter()
            .map(|(user, at)| (user.clone(), json!(at)))
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    encode(
        operator,
        json!({"name": name, "sub": account, "nats": nats}),
    )
}

/// A user JWT for `user` (public nkey) in `account`, signed by one of the account's signing
/// keys. `expires`: Unix seconds, or None.
pub fn user(
    signer: &nkeys::KeyPair,
    account: &str,
    user: &str,
    name: &str,
    permissions: &UserPermissions,
    expires: Option<i64>,
    bearer: bool,
) -> Result<String> {
    let mut nats = json!({
        "subs": -1, "data": -1, "payload": -1,
        "issuer_account": account,
        "type": "user",
        "version": 2,
    });
    if !permissions.all {
        nats["pub"] = json!({"allow": permissions.publish});
        if !permissions.publish_deny.is_empty() {
            nats["pub"]["deny"] = json!(permissions.publish_deny);
        }
        nats["sub"] = json!({"allow": permissions.subscribe});
    }
    if bearer {
        nats["bearer_token"] = json!(true);
    }
    let mut claims = json!({"name": name, "sub": user, "nats": nats});
    if let Some(expires) = expires {
        claims["exp"] = json!(expires);
    }
    encode(signer, claims)
}

/// Signs `claims` as `signer`: adds `iss`, `iat` and `jti` (a hash of the claims, as the NATS
/// tools make it unique), then `header.claims.signature`, base64url without padding.
fn encode(signer: &nkeys::KeyPair, mut claims: Value) -> Result<String> {
    claims["iss"] = json!(signer.public_key());
    claims["iat"] = json!(crate::clock::now_millis() / 1000);
    claims["jti"] = json!("");
    let digest = Sha256::digest(serde_json::to_vec(&claims).map_err(Error::internal)?);
    claims["jti"] = json!(base32(&digest));
    let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).map_err(Error::internal)?);
    let signing_input = format!("{header}.{body}");
    let signature = signer
        .sign(signing_input.as_bytes())
        .map_err(|e| Error::Internal(format!("nkey signature: {e}")))?;
    Ok(format!(
        "{signing_input}.{}",
        URL_SAFE_NO_PAD.encode(signature)
    ))
}

/// A `.creds` file as the NATS tools write it: the user JWT and the nkey seed between their
/// markers.
pub fn creds_file(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    )
}

/// The JWT and seed of a `.creds` file (the first line between each pair of markers).
pub fn parse_creds(text: &str) -> Result<(String, String)> {
    let section = |begin: &str| -> Option<String> {
        let mut lines = text.lines().skip_while(|line| !line.contains(begin));
        lines.next()?;
        lines
            .map(str::trim)
            .find(|line| !line.is_empty())
            .filter(|line| !line.starts_with("---"))
            .map(str::to_string)
    };
    match (
        section("BEGIN NATS USER JWT"),
        section("BEGIN USER NKEY SEED"),
    ) {
        (Some(jwt), Some(seed)) => Ok((jwt, seed)),
        _ => Err(Error::Invalid(
            "not a NATS .creds file (a user JWT and an nkey seed between their markers)".into(),
        )),
    }
}

/// The claims of a JWT, unverified (for display and tests).
pub fn claims(jwt: &str) -> Result<Value> {
    let body = jwt
        .split('.')
        .nth(1)
        .ok_or_else(|| Error::Invalid("not a JWT".into()))?;
    let bytes = URL_SAFE_NO_PAD
        .decode(body)
        .map_err(|_| Error::Invalid("JWT claims are not base64url".into()))?;
    serde_json::from_slice(&bytes).map_err(|_| Error::Invalid("JWT claims are not JSON".into()))
}

/// RFC 4648 base32 without padding (the `jti` alphabet of NATS JWTs).
fn base32(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for &byte in bytes {
        buffer = (buffer << 8) | u32::from(byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((buffer >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((buffer << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// The auth callback of an async-nats client that logs in with `jwt` and signs the server's
/// nonce with `key` (nats-server's JWT mode; the embedded broker never sees these clients).
pub fn connect_options(jwt: String, key: nkeys::KeyPair) -> async_nats::ConnectOptions {
    connect_options_with(move || Ok(jwt.clone()), key)
}

/// [`connect_options`] with the JWT read at every (re)connection, so a renewed one is used
/// (the agent's `bus.jwt`).
pub fn connect_options_with(
    jwt: impl Fn() -> std::result::Result<String, String> + Send + Sync + 'static,
    key: nkeys::KeyPair,
) -> async_nats::ConnectOptions {
    let key = std::sync::Arc::new(key);
    let jwt = std::sync::Arc::new(jwt);
    async_nats::ConnectOptions::with_auth_callback(move |nonce: Vec<u8>| {
        let jwt = jwt();
        let key = key.clone();
        async move {
            let mut auth = async_nats::Auth::new();
            auth.jwt = Some(jwt.map_err(async_nats::AuthError::new)?);
            auth.signature = Some(
                key.sign(&nonce)
                    .map_err(|_| async_nats::AuthError::new("cannot sign the nonce"))?,
            );
            Ok(auth)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creds_files_round_trip() {
        let key = nkeys::KeyPair::new_user();
        let seed = seed(&key).unwrap();
        let text = creds_file("aaa.bbb.ccc", &seed);
        assert_eq!(parse_creds(&text).unwrap(), ("aaa.bbb.ccc".into(), seed));
        assert!(parse_creds("nothing here").is_err());
    }

    #[test]
    fn base32_matches_rfc4648() {
        assert_eq!(base32(b""), "");
        assert_eq!(base32(b"f"), "MY");
        assert_eq!(base32(b"foobar"), "MZXW6YTBOI");
    }

    #[test]
    fn user_jwt_is_signed_by_the_signing_key_and_carries_permissions() {
        let account = nkeys::KeyPair::new_account();
        let signing = nkeys::KeyPair::new_account();
        let user_key = nkeys::KeyPair::new_user();
        let permissions = UserPermissions {
            publish: vec!["svc.agent.a1.>".into()],
            subscribe: vec!["svc.agent.a1.>".into()],
            ..UserPermissions::default()
        };
        let jwt = user(
            &signing,
            &account.public_key(),
            &user_key.public_key(),
            "agent:a1",
            &permissions,
            Some(2_000_000_000),
            false,
        )
        .unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        let signed = format!("{}.{}", parts[0], parts[1]);
        signing.verify(signed.as_bytes(), &signature).unwrap();
        let claims = claims(&jwt).unwrap();
        assert_eq!(claims["iss"], signing.public_key());
        assert_eq!(claims["sub"], user_key.public_key());
        assert_eq!(claims["exp"], 2_000_000_000);
        assert_eq!(claims["nats"]["issuer_account"], account.public_key());
        assert_eq!(claims["nats"]["pub"]["allow"][0], "svc.agent.a1.>");
        assert_eq!(claims["nats"]["type"], "user");
        assert!(is_user_public_key(&user_key.public_key()));
        assert!(!is_user_public_key(&account.public_key()));
        assert!(!is_user_public_key("Unot-a-key"));
    }
}
