//! Percent-encoding (RFC 3986 §2.1): the one encoder and decoder of URLs' `%XX` escapes.
//!
//! Callers differ in which bytes may stay as they are (an S3 key keeps its `/`, a path
//! segment keeps no `.`), so `encode` takes that set as a function; `unreserved` and
//! `unreserved_or_slash` are the common ones. Escapes are written in uppercase hex, as
//! RFC 3986 and SigV4 want. Decoding comes in two strengths: `decode` refuses a `%` that is
//! not followed by two hex digits, `decode_lenient` keeps it as it is (what the PostgreSQL
//! driver does with the rest of a connection URL).

use std::fmt;

/// A `%` not followed by two hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidEscape {
    /// The byte offset of the `%`.
    pub at: usize,
}

impl fmt::Display for InvalidEscape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "'%' at byte {} is not followed by two hex digits",
            self.at
        )
    }
}

impl std::error::Error for InvalidEscape {}

/// RFC 3986's unreserved characters: letters, digits, `-`, `.`, `_` and `~`.
pub fn unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// The unreserved characters and `/` (a path whose segments are encoded at once).
pub fn unreserved_or_slash(byte: u8) -> bool {
    unreserved(byte) || byte == b'/'
}

/// `bytes` with every byte for which `keep` is false written as `%XX`.
pub fn encode(bytes: &[u8], keep: fn(u8) -> bool) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut encoded = String::with_capacity(bytes.len());
    for &byte in bytes {
        if keep(byte) && byte.is_ascii() {
            encoded.push(char::from(byte));
        } else {
            encoded.push('%');
            encoded.push(char::from(HEX[usize::from(byte >> 4)]));
            encoded.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
    encoded
}

/// The bytes `text` encodes; a `%` without two hex digits after it is an error.
pub fn decode(text: &str) -> Result<Vec<u8>, InvalidEscape> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            decoded.push(escape_at(bytes, index).ok_or(InvalidEscape { at: index })?);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    Ok(decoded)
}

/// The bytes `text` encodes, a `%` without two hex digits after it kept as it is.
pub fn decode_lenient(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = match bytes[index] {
            b'%' => escape_at(bytes, index),
            _ => None,
        };
        match escaped {
            Some(byte) => {
                decoded.push(byte);
                index += 3;
            }
            None => {
                decoded.push(bytes[index]);
                index += 1;
            }
        }
    }
    decoded
}

/// The byte `%XX` at `index` stands for, if the two bytes after it are hex digits.
fn escape_at(bytes: &[u8], index: usize) -> Option<u8> {
    let digit = |byte: u8| char::from(byte).to_digit(16);
    let high = digit(*bytes.get(index + 1)?)?;
    let low = digit(*bytes.get(index + 2)?)?;
    u8::try_from(high * 16 + low).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding() {
        // (input, which bytes stay, encoded)
        type Case = (&'static str, fn(u8) -> bool, &'static str);
        let cases: [Case; 6] = [
            ("abc-._~XYZ09", unreserved, "abc-._~XYZ09"),
            ("a b/c", unreserved, "a%20b%2Fc"),
            ("a b/c", unreserved_or_slash, "a%20b/c"),
            ("p@ss:w%rd", unreserved, "p%40ss%3Aw%25rd"),
            ("✓", unreserved, "%E2%9C%93"),
            ("", unreserved, ""),
        ];
        for (input, keep, expected) in cases {
            assert_eq!(encode(input.as_bytes(), keep), expected, "{input}");
        }
        assert_eq!(encode(&[0xff, 0x00], unreserved), "%FF%00");
        // A caller's own set: bytes outside ASCII are escaped whatever it says.
        assert_eq!(encode(&[b'.', b'.', 0xe9], |_| true), "..%E9");
    }

    #[test]
    fn strict_decoding() {
        let cases = [
            ("a", Ok("a")),
            ("a+b", Ok("a+b")),
            ("role%3Dweb", Ok("role=web")),
            ("%2f%2F", Ok("//")),
            ("%E2%9C%93", Ok("✓")),
            ("%", Err(InvalidEscape { at: 0 })),
            ("ab%4", Err(InvalidEscape { at: 2 })),
            ("%zz", Err(InvalidEscape { at: 0 })),
            ("%+1", Err(InvalidEscape { at: 0 })),
        ];
        for (input, expected) in cases {
            let expected = expected.map(|text| text.as_bytes().to_vec());
            assert_eq!(decode(input), expected, "{input}");
        }
        assert_eq!(decode("%ff"), Ok(vec![0xff]));
        assert_eq!(
            InvalidEscape { at: 2 }.to_string(),
            "'%' at byte 2 is not followed by two hex digits"
        );
    }

    #[test]
    fn lenient_decoding_keeps_stray_percent_signs() {
        let cases = [
            ("%2Fetc%2Fca.pem", "/etc/ca.pem"),
            ("100%", "100%"),
            ("%zz", "%zz"),
            ("a%2Fb%", "a/b%"),
            ("%%41", "%A"),
        ];
        for (input, expected) in cases {
            assert_eq!(decode_lenient(input), expected.as_bytes(), "{input}");
        }
    }

    /// Whatever is encoded decodes back to the same bytes.
    #[test]
    fn round_trip() {
        let every_byte: Vec<u8> = (0..=255).collect();
        for keep in [unreserved, unreserved_or_slash] {
            let encoded = encode(&every_byte, keep);
            assert_eq!(decode(&encoded), Ok(every_byte.clone()));
            assert_eq!(decode_lenient(&encoded), every_byte);
        }
    }
}
