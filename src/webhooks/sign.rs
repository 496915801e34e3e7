//! Standard Webhooks signing (https://www.standardwebhooks.com): the secret's form and the
//! `webhook-signature` header.
//!
//! A secret is `whsec_` followed by the base64 of 24 to 64 random bytes; the HMAC key is the
//! decoded bytes. The signature is `v1,` and the base64 of HMAC-SHA256(key,
//! `<webhook-id>.<webhook-timestamp>.<body>`), which is what receivers recompute.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use crate::{Error, Result};

const PREFIX: &str = "whsec_";

/// A new secret: 32 random bytes.
pub fn generate_secret() -> String {
    let bytes: [u8; 32] = crate::secrets::crypto::random_array();
    format!("{PREFIX}{}", STANDARD.encode(bytes))
}

/// The HMAC key of a secret, or why the secret is not one.
pub fn secret_key(secret: &str) -> Result<Vec<u8>> {
    let invalid = || {
        Error::Invalid(
            "a webhook secret is 'whsec_' followed by the base64 of 24 to 64 bytes".into(),
        )
    };
    let encoded = secret.trim().strip_prefix(PREFIX).ok_or_else(invalid)?;
    let key = STANDARD.decode(encoded).map_err(|_| invalid())?;
    if !(24..=64).contains(&key.len()) {
        return Err(invalid());
    }
    Ok(key)
}

/// The `webhook-signature` header value for one attempt.
pub fn signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let mut context = ring::hmac::Context::with_key(&key);
    context.update(format!("{id}.{timestamp}.").as_bytes());
    context.update(body);
    format!("v1,{}", STANDARD.encode(context.sign().as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_webhooks_reference_signature() {
        // The example in the Standard Webhooks specification's test vectors.
        let key = secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signature(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn secrets() {
        assert!(secret_key(&generate_secret()).is_ok());
        for bad in ["", "whsec_", "whsec_!!", "plain-secret", "whsec_c2hvcnQ="] {
            assert!(secret_key(bad).is_err(), "{bad}");
        }
    }
}
