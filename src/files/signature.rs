//! Request signatures for the file service on an external NATS (docs/files.md, "Who is
//! calling"): there no broker of ours stamps the sender, so each request carries
//! `Svc-Auth: v1,<key id>,<unix time>,<nonce>,<base64 HMAC-SHA256>` and the API key itself
//! never crosses the bus.
//!
//! The HMAC key is SHA-256 of the API key, which the store keeps only sealed under master_key
//! (`auth::keys`: its lookup hash is SHA-256 of the HMAC key), so the server verifies without
//! ever holding the cleartext key, and a copy of the database alone signs nothing. The key id
//! is a tag derived from the HMAC key (not the store's key id, which the CLI does not know). The signed text binds the subject, the reply
//! subject (a replayed request answers only the original inbox), the time, the nonce, the
//! headers that change what a request does (manifest, chunk, declared principal) and the
//! payload's SHA-256. For a chunk being stored (a payload and an `Svc-Chunk` header) that is
//! the header's value: the server checks the payload against it before storing anything, so
//! neither side hashes a chunk twice, and for an honest request the text is the same.
//!
//! Owns the format, signing, checking and the nonce memory; the lookup of the key lives in
//! `files::signed_principal`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine;
use sha2::{Digest, Sha256};

use super::wire::{CHUNK_HEADER, MANIFEST_HEADER, PRINCIPAL_ID_HEADER, PRINCIPAL_ROLE_HEADER};
use crate::store::Store;
use crate::{Error, Result};

/// The header a signature travels in.
pub const AUTH_HEADER: &str = "Svc-Auth";
/// How far a request's time may be from the server's, either way.
pub const WINDOW_SECS: i64 = 60;
/// The headers the signature covers, in this order (absent = empty).
pub const SIGNED_HEADERS: [&str; 4] = [
    MANIFEST_HEADER,
    CHUNK_HEADER,
    PRINCIPAL_ID_HEADER,
    PRINCIPAL_ROLE_HEADER,
];
const VERSION: &str = "v1";
/// Hex characters of the key id tag (96 bits: collisions between a fleet's keys are not a
/// concern, and the tag says nothing about the HMAC key).
const KEY_ID_LEN: usize = 24;

/// The HMAC key of an API key: its SHA-256 (raw), what the store keeps as hex.
pub fn signing_key(api_key: &str) -> [u8; 32] {
    Sha256::digest(api_key.as_bytes()).into()
}

/// The public key id a signature names: a tag of the signing key.
pub fn key_id(signing_key: &[u8; 32]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"svc-files key id\n");
    hasher.update(signing_key);
    hex::encode(hasher.finalize())[..KEY_ID_LEN].to_string()
}

/// Which API key row each signing key id was found on, so that a signed request costs one
/// row read and one unsealing (`files::signed_principal`), not one per key; only a key id
/// not seen yet costs a scan of every key. Only a hint: the row is read again for every
/// request, so a deleted or changed key fails at once.
#[derive(Default)]
pub struct KeyIds {
    rows: Mutex<KeyIdMap>,
}

#[derive(Default)]
struct KeyIdMap {
    by_key_id: HashMap<String, String>,
}

/// Rows noted at most; past it the map starts again (a key table this large is unusual).
const MAX_KEY_IDS: usize = 100_000;

impl KeyIds {
    fn lock(&self) -> std::sync::MutexGuard<'_, KeyIdMap> {
        self.rows
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn row_of(&self, key_id: &str) -> Option<String> {
        self.lock().by_key_id.get(key_id).cloned()
    }

    pub fn note(&self, key_id: &str, row_id: &str) {
        let mut map = self.lock();
        if map.by_key_id.len() >= MAX_KEY_IDS {
            *map = KeyIdMap::default();
        }
        map.by_key_id.insert(key_id.to_string(), row_id.to_string());
    }

    pub fn forget(&self, key_id: &str) {
        self.lock().by_key_id.remove(key_id);
    }
}

/// What a request is, for signing: everything that decides what it does and where the
/// answer goes.
pub struct Request<'a> {
    pub subject: &'a str,
    pub reply: &'a str,
    /// The values of [`SIGNED_HEADERS`], in order ("" when absent).
    pub headers: [&'a str; 4],
    pub payload: &'a [u8],
}

/// A parsed `Svc-Auth` header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    pub key_id: String,
    pub time: i64,
    pub nonce: String,
    pub mac: Vec<u8>,
}

fn text(request: &Request, key_id: &str, time: i64, nonce: &str) -> Vec<u8> {
    let mut text = format!(
        "{VERSION}\n{key_id}\n{time}\n{nonce}\n{}\n{}\n",
        request.subject, request.reply
    );
    for value in request.headers {
        // Lengths first, so no value can borrow another's bytes.
        text.push_str(&format!("{}:{value}\n", value.len()));
    }
    let chunk = request.headers[1];
    if !request.payload.is_empty() && super::is_sha256_hex(chunk) {
        text.push_str(chunk);
    } else {
        text.push_str(&hex::encode(Sha256::digest(request.payload)));
    }
    text.into_bytes()
}

fn mac(signing_key: &[u8; 32], message: &[u8]) -> Vec<u8> {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, signing_key);
    ring::hmac::sign(&key, message).as_ref().to_vec()
}

/// The `Svc-Auth` value for `request`, signed at `time` (Unix seconds) with `nonce`.
pub fn sign(signing_key: &[u8; 32], request: &Request, time: i64, nonce: &str) -> String {
    let id = key_id(signing_key);
    let mac = mac(signing_key, &text(request, &id, time, nonce));
    let mac = base64::engine::general_purpose::STANDARD.encode(mac);
    format!("{VERSION},{id},{time},{nonce},{mac}")
}

/// A fresh nonce: 22 base62 characters (about 131 bits).
pub fn nonce() -> String {
    crate::ids::random_base62(22)
}

impl Signature {
    /// Parses a header value; errors say what is malformed.
    pub fn parse(value: &str) -> Result<Signature> {
        let bad = |what: &str| Error::Unauthenticated(format!("malformed {AUTH_HEADER}: {what}"));
        let parts: Vec<&str> = value.split(',').collect();
        let [version, key_id, time, nonce, mac] = parts[..] else {
            return Err(bad("expected v1,<key id>,<time>,<nonce>,<mac>"));
        };
        if version != VERSION {
            return Err(bad("unknown version"));
        }
        if key_id.len() != KEY_ID_LEN || !key_id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("bad key id"));
        }
        let time = time.parse::<i64>().map_err(|_| bad("bad time"))?;
        if nonce.len() < 16 || nonce.len() > 64 || !crate::ids::is_base62(nonce) {
            return Err(bad("bad nonce"));
        }
        let mac = base64::engine::general_purpose::STANDARD
            .decode(mac)
            .map_err(|_| bad("bad mac"))?;
        Ok(Signature {
            key_id: key_id.to_string(),
            time,
            nonce: nonce.to_string(),
            mac,
        })
    }

    /// Whether the time is within [`WINDOW_SECS`] of `now` (Unix seconds).
    pub fn check_time(&self, now: i64) -> Result<()> {
        if (self.time - now).abs() > WINDOW_SECS {
            return Err(Error::Unauthenticated(format!(
                "request signed at {} is more than {WINDOW_SECS} s from the server's clock ({now}); \
                 check the client's clock",
                self.time
            )));
        }
        Ok(())
    }

    /// Checks the MAC against `signing_key` (constant time).
    pub fn verify(&self, signing_key: &[u8; 32], request: &Request) -> Result<()> {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, signing_key);
        let message = text(request, &self.key_id, self.time, &self.nonce);
        ring::hmac::verify(&key, &message, &self.mac)
            .map_err(|_| Error::Unauthenticated(format!("{AUTH_HEADER} does not verify")))
    }
}

/// The nonces seen within the window, so a request replayed within it is refused: in memory
/// for one server; in cluster mode in the store the members share (`cluster_file_nonces`), so
/// a replay that reaches another member is refused too.
#[derive(Default)]
pub struct Nonces {
    seen: Mutex<HashMap<String, i64>>,
    shared: Option<Arc<dyn Store>>,
    /// When the shared table was last rid of expired nonces (Unix seconds).
    forgot_at: AtomicI64,
}

impl Nonces {
    /// Nonces kept in `store`, for every member to see.
    pub fn shared(store: Arc<dyn Store>) -> Nonces {
        Nonces {
            shared: Some(store),
            ..Nonces::default()
        }
    }

    /// Records `nonce` at `time`; Err when it was seen within the window.
    pub async fn admit(&self, signature: &Signature, now: i64) -> Result<()> {
        let key = format!("{}:{}", signature.key_id, signature.nonce);
        let fresh = match &self.shared {
            Some(store) => {
                // A nonce matters while its request's time is accepted (WINDOW_SECS either
                // way); twice that leaves room for members' clocks to differ. Expired rows go
                // once per window, by whichever request comes first.
                let last = self.forgot_at.load(Ordering::Relaxed);
                let forget = (now - last >= WINDOW_SECS
                    && self
                        .forgot_at
                        .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok())
                .then_some(now - 2 * WINDOW_SECS);
                store
                    .record_file_nonce(&key, signature.time, forget)
                    .await?
            }
            None => {
                let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                if seen.len() > 4096 {
                    seen.retain(|_, at| now - *at <= 2 * WINDOW_SECS);
                }
                seen.insert(key, signature.time).is_none()
            }
        };
        if !fresh {
            return Err(Error::Unauthenticated(format!(
                "{AUTH_HEADER}: nonce already used (a replayed request)"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "svc_0123456789abcdefghijABCDEFGHIJ0123456789";

    #[test]
    fn key_ids_remember_rows_until_forgotten() {
        let key_ids = KeyIds::default();
        assert_eq!(key_ids.row_of("k1"), None);
        key_ids.note("k1", "row-1");
        key_ids.note("k2", "row-2");
        assert_eq!(key_ids.row_of("k1").as_deref(), Some("row-1"));
        key_ids.forget("k1");
        assert_eq!(key_ids.row_of("k1"), None);
        assert_eq!(key_ids.row_of("k2").as_deref(), Some("row-2"));
    }

    fn request<'a>(payload: &'a [u8]) -> Request<'a> {
        Request {
            subject: "svc.files.default.put",
            reply: "_INBOX.abcdefghijklmnopqrstuv.1",
            headers: [r#"{"path":"a"}"#, "", "alice", "operator"],
            payload,
        }
    }

    #[test]
    fn known_vector() {
        let key = signing_key(KEY);
        // The hash the store looks keys up by is not the signing key.
        assert_ne!(crate::auth::hash_key(KEY), hex::encode(key));
        let value = sign(
            &key,
            &request(b"hello"),
            1_800_000_000,
            "nonce0123456789abcdef",
        );
        assert_eq!(
            value,
            "v1,8af8d62892863d602929a946,1800000000,nonce0123456789abcdef,\
             3tnbgqZo8rmEFr0bSZeHpxI03eYtXrJnWat90b1L/38="
        );
        let signature = Signature::parse(&value).unwrap();
        signature.verify(&key, &request(b"hello")).unwrap();
    }

    #[test]
    fn tampering_with_any_field_fails() {
        let key = signing_key(KEY);
        let value = sign(
            &key,
            &request(b"hello"),
            1_800_000_000,
            "nonce0123456789abcdef",
        );
        let signature = Signature::parse(&value).unwrap();
        let mut variants: Vec<Request> = Vec::new();
        variants.push(Request {
            subject: "svc.files.other.put",
            ..request(b"hello")
        });
        variants.push(Request {
            reply: "_INBOX.attackerattackerxx.1",
            ..request(b"hello")
        });
        variants.push(request(b"hellO"));
        for i in 0..4 {
            let mut r = request(b"hello");
            r.headers[i] = "x";
            variants.push(r);
        }
        for variant in &variants {
            assert!(signature.verify(&key, variant).is_err());
        }
        // The time, the nonce, the key id and the MAC itself.
        let parts: Vec<&str> = value.split(',').collect();
        for (i, replacement) in [
            (1, "000000000000000000000000"),
            (2, "1800000001"),
            (3, "nonce0123456789abcdeX"),
            (4, "4tnbgqZo8rmEFr0bSZeHpxI03eYtXrJnWat90b1L/38="),
        ] {
            let mut changed = parts.clone();
            changed[i] = replacement;
            let parsed = Signature::parse(&changed.join(","));
            assert!(parsed.is_ok_and(|s| s.verify(&key, &request(b"hello")).is_err()));
        }
        // Another key.
        let other = signing_key("svc_ZZZZ456789abcdefghijABCDEFGHIJ0123456789");
        assert!(signature.verify(&other, &request(b"hello")).is_err());
    }

    #[test]
    fn time_window_and_nonces() {
        let key = signing_key(KEY);
        let signature =
            Signature::parse(&sign(&key, &request(b""), 1000, "nonce0123456789abcdef")).unwrap();
        assert!(signature.check_time(1000 + WINDOW_SECS).is_ok());
        assert!(signature.check_time(1000 - WINDOW_SECS).is_ok());
        assert!(signature.check_time(1001 + WINDOW_SECS).is_err());
        assert!(signature.check_time(999 - WINDOW_SECS).is_err());
        let nonces = Nonces::default();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(runtime.block_on(nonces.admit(&signature, 1000)).is_ok());
        assert!(runtime.block_on(nonces.admit(&signature, 1000)).is_err());
    }

    #[test]
    fn malformed_headers() {
        for value in [
            "",
            "v2,8af8d62892863d602929a946,1,nonce0123456789abcdef,AA==",
            "v1,short,1,nonce0123456789abcdef,AA==",
            "v1,8af8d62892863d602929a946,x,nonce0123456789abcdef,AA==",
            "v1,8af8d62892863d602929a946,1,n,AA==",
            "v1,8af8d62892863d602929a946,1,nonce0123456789abcdef,!!",
        ] {
            assert!(Signature::parse(value).is_err(), "{value}");
        }
    }
}
