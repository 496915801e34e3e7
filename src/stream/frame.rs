//! Record framing: how one record is laid out in a segment file, and how bytes become records.
//!
//! `[crc u32][len u32][seq u64][timestamp_ms i64][payload: len bytes]`, little-endian, 24 bytes
//! of header. The CRC32C covers everything after itself, so a damaged length, sequence or
//! timestamp is caught as surely as a damaged payload. Decoding tells "the bytes stop inside a
//! record" (a torn tail, or a read window that ended early) apart from "these bytes are wrong";
//! nothing here touches files.

use super::crc32c;

/// Bytes before the payload.
pub const HEADER_LEN: usize = 24;

/// The largest payload the log accepts. A length field above it is damage, not a record, which
/// keeps a flipped high bit from making recovery wait for gigabytes that will never come.
pub const MAX_PAYLOAD: usize = 8 * 1024 * 1024;

/// What a byte slice starting at a record boundary holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole record whose checksum matches; `len` is its size on disk, header included.
    Record {
        seq: u64,
        timestamp_ms: i64,
        payload: &'a [u8],
        len: usize,
    },
    /// The slice ends inside a record; `needed` bytes from the start would make progress.
    Incomplete { needed: usize },
    /// The bytes cannot be a record written by this log.
    Corrupt(&'static str),
}

/// Appends one framed record to `out`.
pub fn encode(out: &mut Vec<u8>, seq: u64, timestamp_ms: i64, payload: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&timestamp_ms.to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32c::checksum(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

/// The on-disk size of a record with this payload.
pub fn encoded_len(payload_len: usize) -> usize {
    HEADER_LEN + payload_len
}

/// The whole record's length as its header claims, if the header is there. Unverified: use it
/// only to decide how many bytes to read before calling [`decode`].
pub fn claimed_len(bytes: &[u8]) -> Option<usize> {
    let len = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?) as usize;
    (bytes.len() >= HEADER_LEN).then_some(HEADER_LEN + len)
}

/// The sequence number as the header claims it, unverified; recovery uses it to skip most
/// offsets cheaply while it searches past damage for the next good record.
pub fn claimed_seq(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?))
}

/// Decodes the record at the start of `bytes`.
pub fn decode(bytes: &[u8]) -> Decoded<'_> {
    let Some(header) = bytes.get(..HEADER_LEN) else {
        return Decoded::Incomplete { needed: HEADER_LEN };
    };
    let field = |range: std::ops::Range<usize>| -> [u8; 8] {
        let mut out = [0; 8];
        out[..range.len()].copy_from_slice(&header[range]);
        out
    };
    let stored_crc = u64::from_le_bytes(field(0..4)) as u32;
    let payload_len = u64::from_le_bytes(field(4..8)) as usize;
    if payload_len > MAX_PAYLOAD {
        return Decoded::Corrupt("length beyond the payload limit");
    }
    let len = HEADER_LEN + payload_len;
    let Some(whole) = bytes.get(..len) else {
        return Decoded::Incomplete { needed: len };
    };
    if crc32c::checksum(&whole[4..]) != stored_crc {
        return Decoded::Corrupt("checksum mismatch");
    }
    Decoded::Record {
        seq: u64::from_le_bytes(field(8..16)),
        timestamp_ms: i64::from_le_bytes(field(16..24)),
        payload: &whole[HEADER_LEN..],
        len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(seq: u64, timestamp_ms: i64, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(&mut out, seq, timestamp_ms, payload);
        out
    }

    fn with(mut bytes: Vec<u8>, edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        edit(&mut bytes);
        bytes
    }

    #[test]
    fn round_trips() {
        let big = vec![7u8; 70_000];
        let cases: [(u64, i64, &[u8]); 5] = [
            (1, 0, b""),
            (2, 1_795_248_902_123, b"hello"),
            (u64::MAX, i64::MIN, b"\x00\xff"),
            (42, -1, &[0u8; 255]),
            (7, 9, &big),
        ];
        for (seq, timestamp_ms, payload) in cases {
            let mut bytes = framed(seq, timestamp_ms, payload);
            assert_eq!(bytes.len(), encoded_len(payload.len()));
            assert_eq!(claimed_len(&bytes), Some(bytes.len()));
            assert_eq!(claimed_seq(&bytes), Some(seq));
            bytes.extend_from_slice(b"next record");
            let expected = Decoded::Record {
                seq,
                timestamp_ms,
                payload,
                len: encoded_len(payload.len()),
            };
            assert_eq!(decode(&bytes), expected, "seq {seq}");
        }
    }

    #[test]
    fn short_and_damaged_input() {
        let good = framed(5, 1000, b"payload");
        let cases: [(&str, Vec<u8>, Decoded); 9] = [
            ("empty", vec![], Decoded::Incomplete { needed: 24 }),
            (
                "half a header",
                good[..10].to_vec(),
                Decoded::Incomplete { needed: 24 },
            ),
            (
                "header only",
                good[..24].to_vec(),
                Decoded::Incomplete { needed: 31 },
            ),
            (
                "payload cut",
                good[..30].to_vec(),
                Decoded::Incomplete { needed: 31 },
            ),
            (
                "payload byte flipped",
                with(good.clone(), |b| b[26] ^= 1),
                Decoded::Corrupt("checksum mismatch"),
            ),
            (
                "seq flipped",
                with(good.clone(), |b| b[8] ^= 0x80),
                Decoded::Corrupt("checksum mismatch"),
            ),
            (
                "crc flipped",
                with(good.clone(), |b| b[0] ^= 1),
                Decoded::Corrupt("checksum mismatch"),
            ),
            ("zeroed", vec![0; 64], Decoded::Corrupt("checksum mismatch")),
            (
                "huge length",
                with(good.clone(), |b| b[7] = 0xFF),
                Decoded::Corrupt("length beyond the payload limit"),
            ),
        ];
        for (name, bytes, expected) in cases {
            assert_eq!(decode(&bytes), expected, "{name}");
        }
    }

    #[test]
    fn claims_need_a_whole_header() {
        let good = framed(5, 1000, b"payload");
        assert_eq!(claimed_len(&good[..23]), None);
        assert_eq!(claimed_seq(&good[..15]), None);
    }
}
