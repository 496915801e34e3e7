//! A minimal ZIP writer and reader for module archives (and the state tests' ZIP fixtures):
//! stored entries only (no compression), so the format has no knobs that could make two builds
//! of the same files differ.
//!
//! Reproducible by construction: entries in the order given (the caller sorts them), every
//! timestamp 1980-01-01 00:00 (the DOS epoch), no extra fields, no comments, fixed "version
//! made by". The reader accepts only what the writer makes (stored, no encryption, no ZIP64)
//! and checks every CRC-32, so a flipped byte in a member is an error, not silent data.

use crate::{Error, Result};

const LOCAL: u32 = 0x0403_4b50;
const CENTRAL: u32 = 0x0201_4b50;
const END: u32 = 0x0605_4b50;
/// 1980-01-01 00:00:00 in DOS date/time.
const DOS_TIME: u16 = 0;
const DOS_DATE: u16 = (1 << 5) | 1;
/// Readers refuse archives with more entries than this (a module is a handful of files).
pub const MAX_ENTRIES: usize = 10_000;

fn u16le(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn u32le(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// The archive of `entries` (path, bytes), in the order given.
pub fn write<'a>(entries: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    let mut count: u16 = 0;
    for (name, data) in entries {
        let size = u32::try_from(data.len())
            .map_err(|_| Error::TooLarge(format!("{name}: larger than 4 GiB")))?;
        let offset = u32::try_from(out.len())
            .map_err(|_| Error::TooLarge("module archive larger than 4 GiB".into()))?;
        let crc = crc32fast::hash(data);
        let name_len = u16::try_from(name.len())
            .map_err(|_| Error::Invalid(format!("{name}: path too long")))?;
        // Local header.
        u32le(&mut out, LOCAL);
        u16le(&mut out, 20); // version needed
        u16le(&mut out, 0x0800); // flags: UTF-8 names
        u16le(&mut out, 0); // stored
        u16le(&mut out, DOS_TIME);
        u16le(&mut out, DOS_DATE);
        u32le(&mut out, crc);
        u32le(&mut out, size);
        u32le(&mut out, size);
        u16le(&mut out, name_len);
        u16le(&mut out, 0);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        // Central directory entry.
        u32le(&mut central, CENTRAL);
        u16le(&mut central, 0x0314); // made by: Unix, 2.0
        u16le(&mut central, 20);
        u16le(&mut central, 0x0800);
        u16le(&mut central, 0);
        u16le(&mut central, DOS_TIME);
        u16le(&mut central, DOS_DATE);
        u32le(&mut central, crc);
        u32le(&mut central, size);
        u32le(&mut central, size);
        u16le(&mut central, name_len);
        u16le(&mut central, 0); // extra
        u16le(&mut central, 0); // comment
        u16le(&mut central, 0); // disk
        u16le(&mut central, 0); // internal attributes
        u32le(&mut central, 0o100644 << 16); // external: a regular file, 0644
        u32le(&mut central, offset);
        central.extend_from_slice(name.as_bytes());
        count = count
            .checked_add(1)
            .ok_or_else(|| Error::TooLarge("more than 65535 files".into()))?;
    }
    let central_offset = out.len() as u32;
    let central_len = central.len() as u32;
    out.extend_from_slice(&central);
    u32le(&mut out, END);
    u16le(&mut out, 0);
    u16le(&mut out, 0);
    u16le(&mut out, count);
    u16le(&mut out, count);
    u32le(&mut out, central_len);
    u32le(&mut out, central_offset);
    u16le(&mut out, 0);
    Ok(out)
}

fn bad(message: impl Into<String>) -> Error {
    Error::Invalid(format!("not a module archive: {}", message.into()))
}

fn le16(bytes: &[u8], at: usize) -> Result<u16> {
    bytes
        .get(at..at + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .ok_or_else(|| bad("truncated"))
}
fn le32(bytes: &[u8], at: usize) -> Result<u32> {
    bytes
        .get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| bad("truncated"))
}

/// The entries of an archive made by `write` (or any stored, unencrypted ZIP without
/// comments), CRCs checked, in archive order.
pub fn read(bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>> {
    if bytes.len() < 22 {
        return Err(bad("too short"));
    }
    let end = bytes.len() - 22;
    if le32(bytes, end)? != END {
        return Err(bad(
            "no end-of-central-directory record (archives with a comment are not accepted)",
        ));
    }
    let count = le16(bytes, end + 10)? as usize;
    if count > MAX_ENTRIES {
        return Err(bad(format!("{count} entries (at most {MAX_ENTRIES})")));
    }
    let mut at = le32(bytes, end + 16)? as usize;
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        if le32(bytes, at)? != CENTRAL {
            return Err(bad("bad central directory"));
        }
        let flags = le16(bytes, at + 8)?;
        let method = le16(bytes, at + 10)?;
        if method != 0 || flags & 1 != 0 {
            return Err(bad("only stored, unencrypted entries are accepted"));
        }
        let crc = le32(bytes, at + 16)?;
        let size = le32(bytes, at + 20)? as usize;
        let name_len = le16(bytes, at + 28)? as usize;
        let extra_len = le16(bytes, at + 30)? as usize;
        let comment_len = le16(bytes, at + 32)? as usize;
        let offset = le32(bytes, at + 42)? as usize;
        let name = bytes
            .get(at + 46..at + 46 + name_len)
            .ok_or_else(|| bad("truncated name"))?;
        let name = String::from_utf8(name.to_vec()).map_err(|_| bad("a name is not UTF-8"))?;
        at += 46 + name_len + extra_len + comment_len;
        if le32(bytes, offset)? != LOCAL {
            return Err(bad(format!("{name}: bad local header")));
        }
        let local_name = le16(bytes, offset + 26)? as usize;
        let local_extra = le16(bytes, offset + 28)? as usize;
        let start = offset + 30 + local_name + local_extra;
        let data = bytes
            .get(start..start.saturating_add(size))
            .ok_or_else(|| bad(format!("{name}: truncated data")))?;
        if crc32fast::hash(data) != crc {
            return Err(bad(format!(
                "{name}: CRC-32 mismatch (the archive is corrupt)"
            )));
        }
        entries.push((name, data.to_vec()));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let files = [("a.txt", &b"hello"[..]), ("dir/b.star", &b"x = 1\n"[..])];
        let zip = write(files.iter().map(|(n, d)| (*n, *d))).unwrap();
        assert_eq!(zip, write(files.iter().map(|(n, d)| (*n, *d))).unwrap());
        let back = read(&zip).unwrap();
        assert_eq!(back[1], ("dir/b.star".to_string(), b"x = 1\n".to_vec()));
        let mut bad = zip.clone();
        let at = bad.windows(5).position(|w| w == b"hello").unwrap();
        bad[at] = b'j';
        assert!(read(&bad).unwrap_err().to_string().contains("CRC-32"));
    }
}
