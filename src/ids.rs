//! Identifiers and random credentials.
//!
//! Ids are ULIDs (48-bit millisecond time + 80 random bits, Crockford base32): they sort by
//! creation time, which keeps pagination cursors simple. API keys are `svc_` + 40 base62
//! characters from the OS RNG (~238 bits).

use rand::rngs::OsRng;
use rand::{Rng, RngCore};

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A new ULID as 26 characters. The 80 random bits come from the thread's generator
/// (ChaCha, seeded from the OS RNG once per thread and reseeded by `rand`), not a `getrandom`
/// call per id: ids are made on every emit and audit row, and they need to be unique and
/// unguessable, which that generator is, not fresh from the kernel.
pub fn ulid() -> String {
    let millis = crate::clock::now_millis().max(0) as u128 & ((1 << 48) - 1);
    let mut random = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut random[6..]);
    let value = millis << 80 | u128::from_be_bytes(random);
    let mut text = [0u8; 26];
    for (i, slot) in text.iter_mut().enumerate() {
        *slot = CROCKFORD[((value >> (5 * (25 - i))) & 31) as usize];
    }
    // Every byte is from the Crockford alphabet: ASCII.
    String::from_utf8(text.to_vec()).expect("ULID alphabet is ASCII")
}

/// The creation time (Unix milliseconds) a ULID carries, or None if `id` is not a ULID.
pub fn ulid_millis(id: &str) -> Option<i64> {
    if id.len() != 26 {
        return None;
    }
    let mut value: u128 = 0;
    for byte in id.bytes() {
        let digit = CROCKFORD
            .iter()
            .position(|c| *c == byte.to_ascii_uppercase())?;
        value = (value << 5) | digit as u128;
    }
    Some((value >> 80) as i64)
}

/// `count` random base62 characters from the OS RNG.
pub fn random_base62(count: usize) -> String {
    let mut rng = OsRng;
    (0..count)
        .map(|_| BASE62[rng.gen_range(0..BASE62.len())] as char)
        .collect()
}

/// Whether `text` is only base62 characters.
pub fn is_base62(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulids_sort_by_time_and_differ() {
        let a = ulid();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = ulid();
        assert_eq!(a.len(), 26);
        assert!(a < b, "{a} < {b}");
        assert_ne!(ulid(), ulid());
        let now = crate::clock::now_millis();
        let millis = ulid_millis(&ulid()).unwrap();
        assert!((millis - now).abs() < 1000);
        assert_eq!(ulid_millis("not-a-ulid"), None);
    }

    #[test]
    fn ulid_text_decodes_to_its_time_and_is_crockford() {
        for _ in 0..1000 {
            let before = crate::clock::now_millis();
            let id = ulid();
            let after = crate::clock::now_millis();
            assert_eq!(id.len(), 26);
            assert!(id.bytes().all(|b| CROCKFORD.contains(&b)), "{id}");
            let millis = ulid_millis(&id).unwrap();
            assert!(before <= millis && millis <= after, "{id}");
        }
        let many: std::collections::HashSet<String> = (0..10_000).map(|_| ulid()).collect();
        assert_eq!(many.len(), 10_000);
    }

    #[test]
    fn base62_alphabet() {
        let key = random_base62(40);
        assert_eq!(key.len(), 40);
        assert!(is_base62(&key));
        assert!(!is_base62("svc_"));
    }
}
