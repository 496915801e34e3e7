//! The cryptography of the secrets domain, on `ring`: AES-256-GCM sealing with associated
//! data, random keys, and the master-key check value.
//!
//! Sealed form: `nonce (12 bytes) || ciphertext || tag (16 bytes)`. Nonces are random: every
//! KV secret has its own data key, so the 2^32-messages-per-key bound of random 96-bit nonces
//! only concerns transit keys, which operators rotate. The associated data binds a ciphertext
//! to where it belongs (a path and version, a transit key name), so a ciphertext copied to
//! another row fails authentication instead of decrypting.

use std::fmt;

use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

use crate::{Error, Result};

pub const KEY_LEN: usize = 32;
const TAG_LEN: usize = 16;

/// The known marker sealed under the master key at first start.
const CHECK_MARKER: &[u8] = b"svc master key check v1";
const CHECK_AAD: &[u8] = b"svc:master-check";

/// A ciphertext that failed authentication: tampered, truncated, moved, or the wrong key.
#[derive(Debug)]
pub struct Tampered;

/// An AES-256-GCM key. `Debug` never shows the key.
pub struct AeadKey {
    key: LessSafeKey,
}

impl fmt::Debug for AeadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AeadKey([REDACTED])")
    }
}

impl AeadKey {
    pub fn new(bytes: &[u8; KEY_LEN]) -> Self {
        let unbound = UnboundKey::new(&AES_256_GCM, bytes).expect("AES-256 takes a 32-byte key");
        AeadKey {
            key: LessSafeKey::new(unbound),
        }
    }

    /// Encrypts `plaintext` bound to `aad`; returns nonce || ciphertext || tag.
    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Vec<u8> {
        let nonce_bytes: [u8; NONCE_LEN] = random_array();
        let mut sealed = Vec::with_capacity(NONCE_LEN + plaintext.len() + TAG_LEN);
        sealed.extend_from_slice(&nonce_bytes);
        sealed.extend_from_slice(plaintext);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce_bytes),
                Aad::from(aad),
                &mut sealed[NONCE_LEN..],
            )
            .expect("AES-GCM seals any message below 64 GiB");
        sealed.extend_from_slice(tag.as_ref());
        sealed
    }

    /// Decrypts what `seal` made with the same `aad`, or says it was tampered with.
    pub fn open(&self, sealed: &[u8], aad: &[u8]) -> Result<Vec<u8>, Tampered> {
        if sealed.len() < NONCE_LEN + TAG_LEN {
            return Err(Tampered);
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| Tampered)?;
        let mut buffer = rest.to_vec();
        let plaintext = self
            .key
            .open_in_place(nonce, Aad::from(aad), &mut buffer)
            .map_err(|_| Tampered)?;
        Ok(plaintext.to_vec())
    }

    /// `seal`, as base64 text for a TEXT column or a message.
    pub fn seal_text(&self, plaintext: &[u8], aad: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.seal(plaintext, aad))
    }

    /// `open` of base64 text.
    pub fn open_text(&self, sealed: &str, aad: &[u8]) -> Result<Vec<u8>, Tampered> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(sealed)
            .map_err(|_| Tampered)?;
        self.open(&bytes, aad)
    }
}

/// Fills an array from the operating system's CSPRNG.
pub fn random_array<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    SystemRandom::new()
        .fill(&mut bytes)
        .expect("the OS random source works");
    bytes
}

/// A fresh random AES-256 key.
pub fn random_key() -> [u8; KEY_LEN] {
    random_array()
}

/// The check value stored at first start: the marker sealed under the master key.
pub fn master_check_value(master: &AeadKey) -> String {
    master.seal_text(CHECK_MARKER, CHECK_AAD)
}

/// Whether `check_value` was made by `master`.
pub fn verify_master_check(master: &AeadKey, check_value: &str) -> bool {
    matches!(master.open_text(check_value, CHECK_AAD), Ok(marker) if marker == CHECK_MARKER)
}

/// Re-seals a check value from one master key to another (master-key rotation).
pub fn rewrap_master_check(old: &AeadKey, new: &AeadKey, check_value: &str) -> Result<String> {
    if !verify_master_check(old, check_value) {
        return Err(Error::Internal(
            "stored master-key check does not match the running master key".into(),
        ));
    }
    Ok(master_check_value(new))
}

/// Decodes a master key given as base64 of 32 bytes.
pub fn decode_key(text: &str) -> Result<[u8; KEY_LEN]> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or_else(|| Error::Invalid("a master key must be base64 of exactly 32 bytes".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_and_every_kind_of_tampering() {
        let key = AeadKey::new(&random_key());
        let other = AeadKey::new(&random_key());
        let sealed = key.seal(b"hunter2", b"db/prod#1");
        assert_eq!(key.open(&sealed, b"db/prod#1").unwrap(), b"hunter2");
        let mut flipped = sealed.clone();
        flipped[NONCE_LEN + 1] ^= 1;
        let cases: [(&str, &AeadKey, Vec<u8>, &[u8]); 4] = [
            ("flipped bit", &key, flipped, b"db/prod#1"),
            ("other path", &key, sealed.clone(), b"db/test#1"),
            ("other key", &other, sealed.clone(), b"db/prod#1"),
            ("truncated", &key, sealed[..10].to_vec(), b"db/prod#1"),
        ];
        for (name, key, bytes, aad) in cases {
            assert!(key.open(&bytes, aad).is_err(), "{name}");
        }
    }

    #[test]
    fn master_check() {
        let master = AeadKey::new(&random_key());
        let check = master_check_value(&master);
        assert!(verify_master_check(&master, &check));
        assert!(!verify_master_check(&AeadKey::new(&random_key()), &check));
        assert!(!verify_master_check(&master, "not base64!"));
    }
}
