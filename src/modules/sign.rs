//! Detached ed25519 signatures of module ZIPs (ring), and the check of the trust policy that
//! requires them (its settings, `config::TrustPolicy`, are the configuration's).
//!
//! Files are one line of standard base64 each, so they paste into YAML and survive email:
//! a private key is the PKCS#8 document ring makes (written 0600), a public key is its 32
//! raw bytes, a signature (`MODULE.zip.sig`) the 64 bytes over the whole ZIP. A signature
//! covers the exact bytes, which the reproducible build makes a function of the sources.

use std::path::Path;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};

use crate::config::TrustPolicy;
use crate::{Error, Result};

/// A new key pair: (private PKCS#8, public), both base64.
pub fn keygen() -> Result<(String, String)> {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| Error::internal("keygen"))?;
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|_| Error::internal("keygen"))?;
    Ok((
        STANDARD.encode(pkcs8.as_ref()),
        STANDARD.encode(pair.public_key().as_ref()),
    ))
}

fn decode(what: &str, text: &str) -> Result<Vec<u8>> {
    STANDARD
        .decode(text.trim())
        .map_err(|_| Error::Invalid(format!("{what} is not base64")))
}

/// The signature of `zip` with the private key `key` (base64 PKCS#8), base64.
pub fn sign(zip: &[u8], key: &str) -> Result<String> {
    let pair = Ed25519KeyPair::from_pkcs8(&decode("the private key", key)?)
        .map_err(|_| Error::Invalid("the private key is not an ed25519 PKCS#8 key".into()))?;
    Ok(STANDARD.encode(pair.sign(zip).as_ref()))
}

/// Whether `signature` (base64) is `public_key`'s (base64) over `zip`.
pub fn verify(zip: &[u8], signature: &str, public_key: &str) -> Result<()> {
    let key = decode("the public key", public_key)?;
    if key.len() != 32 {
        return Err(Error::Invalid(
            "the public key is not 32 bytes of ed25519".into(),
        ));
    }
    let sig = decode("the signature", signature)?;
    UnparsedPublicKey::new(&ED25519, key)
        .verify(zip, &sig)
        .map_err(|_| Error::Forbidden("bad signature: the module was not signed by this key, or it was changed after signing".into()))
}

/// The trust policy applied to a ZIP.
impl TrustPolicy {
    fn keys(&self) -> Result<Vec<String>> {
        self.trusted_keys
            .iter()
            .map(|k| {
                if k.contains('/') && Path::new(k).exists() {
                    std::fs::read_to_string(k)
                        .map(|t| t.trim().to_string())
                        .map_err(|e| Error::NotFound(format!("trusted key {k}: {e}")))
                } else {
                    Ok(k.trim().to_string())
                }
            })
            .collect()
    }

    /// Checks `zip` against the policy: with require_signature, a signature by one of the
    /// trusted keys; without, a signature given is still checked when keys are configured.
    pub fn check(&self, what: &str, zip: &[u8], signature: Option<&str>) -> Result<()> {
        let keys = self.keys()?;
        match signature {
            None if self.require_signature => Err(Error::Forbidden(format!(
                "{what} is not signed and modules.require_signature is true"
            ))),
            None => Ok(()),
            Some(_) if keys.is_empty() && self.require_signature => Err(Error::Forbidden(
                "modules.require_signature is true but modules.trusted_keys is empty".into(),
            )),
            Some(_) if keys.is_empty() => Ok(()),
            Some(sig) => {
                if keys.iter().any(|k| verify(zip, sig, k).is_ok()) {
                    Ok(())
                } else {
                    Err(Error::Forbidden(format!(
                        "{what}: the signature is not by a trusted key, or the ZIP was changed after signing"
                    )))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify_tamper() {
        let (key, public) = keygen().unwrap();
        let sig = sign(b"zip bytes", &key).unwrap();
        verify(b"zip bytes", &sig, &public).unwrap();
        assert!(verify(b"zip bytez", &sig, &public).is_err());
        let policy = TrustPolicy {
            require_signature: true,
            trusted_keys: vec![public],
        };
        assert!(policy.check("m", b"zip bytes", None).is_err());
        policy.check("m", b"zip bytes", Some(&sig)).unwrap();
    }
}
