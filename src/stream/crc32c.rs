//! CRC32C (Castagnoli), the checksum on every stream record.
//!
//! Written here rather than taken from a crate: it is a few dozen lines, the stream log is its
//! only user, and it keeps Cargo.lock untouched while three branches edit it. Castagnoli rather
//! than the zlib CRC32 (what `crc32fast` computes) because it is the storage polynomial (ext4,
//! iSCSI, LevelDB, Kafka) with the better Hamming distance at record sizes.
//!
//! Reads verify every record they pass, and a point read passes half an index interval (16 KiB)
//! on average, so the checksum is a large part of a read's CPU: x86-64 processors since 2008 compute
//! CRC32C in one instruction (SSE 4.2's `crc32`), several times faster than tables, and the
//! portable build cannot assume it, so it is detected at run time. Slicing-by-8 tables are the
//! fallback (about 1 GB/s; the stream bench's point read went from 22 to 16 µs with the
//! instruction).

const POLYNOMIAL: u32 = 0x82F6_3B78;

/// `TABLES[k][b]` is the CRC of byte `b` followed by `k` zero bytes; slicing-by-8 folds eight
/// input bytes per step with them.
static TABLES: [[u32; 256]; 8] = build_tables();

const fn build_tables() -> [[u32; 256]; 8] {
    let mut tables = [[0u32; 256]; 8];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = byte as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLYNOMIAL
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][byte] = crc;
        byte += 1;
    }
    let mut byte = 0;
    while byte < 256 {
        let mut slice = 1;
        while slice < 8 {
            let previous = tables[slice - 1][byte];
            tables[slice][byte] = (previous >> 8) ^ tables[0][(previous & 0xFF) as usize];
            slice += 1;
        }
        byte += 1;
    }
    tables
}

/// The CRC32C of `bytes`.
pub fn checksum(bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the processor has just been seen to support SSE 4.2.
        return unsafe { checksum_sse42(bytes) };
    }
    checksum_tables(bytes)
}

/// CRC32C with SSE 4.2's `crc32` instruction, eight bytes at a time. The instruction keeps the
/// same reflected register the tables do, so the start and final inversions are the same.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn checksum_sse42(bytes: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut crc = u64::from(!0u32);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().expect("chunks of eight"));
        crc = _mm_crc32_u64(crc, word);
    }
    let mut crc = crc as u32;
    for &byte in chunks.remainder() {
        crc = _mm_crc32_u8(crc, byte);
    }
    !crc
}

/// CRC32C with slicing-by-8 tables: any processor.
fn checksum_tables(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let low = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) ^ crc;
        crc = TABLES[7][(low & 0xFF) as usize]
            ^ TABLES[6][((low >> 8) & 0xFF) as usize]
            ^ TABLES[5][((low >> 16) & 0xFF) as usize]
            ^ TABLES[4][(low >> 24) as usize]
            ^ TABLES[3][chunk[4] as usize]
            ^ TABLES[2][chunk[5] as usize]
            ^ TABLES[1][chunk[6] as usize]
            ^ TABLES[0][chunk[7] as usize];
    }
    for &byte in chunks.remainder() {
        crc = (crc >> 8) ^ TABLES[0][((crc ^ u32::from(byte)) & 0xFF) as usize];
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One bit at a time, straight from the definition: the reference the fast path must match.
    fn checksum_bitwise(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in bytes {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ POLYNOMIAL
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn known_vectors() {
        // The check value of the CRC catalogue and the test patterns of RFC 3720 appendix B.4.
        let ascending: Vec<u8> = (0..32).collect();
        let cases: [(&[u8], u32); 5] = [
            (b"", 0),
            (b"123456789", 0xE306_9283),
            (&[0u8; 32], 0x8A91_36AA),
            (&[0xFFu8; 32], 0x62A8_AB43),
            (&ascending, 0x46DD_794E),
        ];
        for (input, expected) in cases {
            assert_eq!(checksum(input), expected, "{input:?}");
        }
    }

    #[test]
    fn sliced_matches_bitwise_at_every_length() {
        let data: Vec<u8> = (0..100u32).map(|i| (i * 37 + 11) as u8).collect();
        for len in 0..data.len() {
            assert_eq!(
                checksum_tables(&data[..len]),
                checksum_bitwise(&data[..len]),
                "len {len}"
            );
        }
    }

    /// The instruction and the tables agree at every length and alignment (the first byte at
    /// each offset of an eight-byte word), on the processors that have it.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_instruction_matches_the_tables() {
        if !std::arch::is_x86_feature_detected!("sse4.2") {
            return;
        }
        let data: Vec<u8> = (0..300u32).map(|i| (i * 131 + 7) as u8).collect();
        for start in 0..8 {
            for len in 0..data.len() - start {
                let bytes = &data[start..start + len];
                // SAFETY: checked above.
                let fast = unsafe { checksum_sse42(bytes) };
                assert_eq!(fast, checksum_tables(bytes), "start {start} len {len}");
            }
        }
    }
}
