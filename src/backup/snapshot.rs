//! The snapshot file: one format for `svc-cluster backup`, `svc-cluster-backup` and
//! `svc-backup`.
//!
//! A snapshot is a gzip'd tar. Its entries are the store as a SQLite file (`store/svc.db`,
//! whatever the server's driver: PostgreSQL exports its rows into one), the stream logs'
//! segment files (`streams/<name>/<segment>`), the policy files (`policies/<file>`), and, last,
//! `manifest.json`: format and svc versions, when and where it was taken, the chain head of the
//! audit log, each stream's last sequence, and every other entry's size and SHA-256. The
//! manifest comes last because the hashes are computed while the entries stream out: the
//! server never stages a copy of the snapshot on its disk.
//!
//! Nothing secret is in clear: CA keys, wrapped data keys and secret values are in the store
//! sealed by the master key, as they are at rest; API keys and join tokens are hashes. With a
//! passphrase the whole file is encrypted as well (`encrypt`): an argon2id-derived key and
//! AES-256-GCM in 64 KiB chunks whose nonces number them and mark the last, so reordering,
//! truncation and any flipped bit are refused.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use ring::aead;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// Bumped when a reader of the previous version could not read the new one.
pub const FORMAT_VERSION: u32 = 1;
pub const MANIFEST: &str = "manifest.json";
pub const STORE_ENTRY: &str = "store/svc.db";

/// What a snapshot holds and how to check it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub svc_version: String,
    pub created_at: String,
    /// The server that took it (its bus server name, else its host name).
    pub server_id: String,
    /// The source server's store driver (the snapshot always holds a SQLite file).
    pub store_driver: String,
    pub schema_version: i64,
    /// The audit chain's last row at the time of the snapshot; None for an empty log.
    pub audit_head: Option<ChainHead>,
    /// Each stream's last sequence in the snapshot.
    pub streams: BTreeMap<String, u64>,
    /// Every entry but the manifest, in the order they are in the tar.
    pub files: Vec<FileEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainHead {
    pub seq: i64,
    pub hash: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// Writes a snapshot: entries, then the manifest (see the module doc).
pub struct Writer<W: Write> {
    tar: tar::Builder<flate2::write::GzEncoder<W>>,
    files: Vec<FileEntry>,
    /// Fixed in every header, so two snapshots of the same state differ only in the manifest.
    mtime: u64,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W) -> Self {
        // Level 1: a snapshot is mostly SQLite pages and stream frames, which compress well
        // already at the fastest level; a higher one would make the snapshot CPU-bound.
        let gzip = flate2::write::GzEncoder::new(out, flate2::Compression::fast());
        let mut tar = tar::Builder::new(gzip);
        tar.mode(tar::HeaderMode::Deterministic);
        Writer {
            tar,
            files: Vec::new(),
            mtime: 0,
        }
    }

    /// Adds an entry of exactly `size` bytes read from `data`, hashing it on the way.
    pub fn add(&mut self, path: &str, size: u64, data: impl Read) -> Result<()> {
        check_entry_path(path)?;
        let mut header = tar::Header::new_gnu();
        header.set_size(size);
        header.set_mode(0o600);
        header.set_mtime(self.mtime);
        header.set_entry_type(tar::EntryType::Regular);
        let mut hashing = Hashing::new(data.take(size));
        self.tar
            .append_data(&mut header, path, &mut hashing)
            .map_err(|e| Error::Internal(format!("snapshot: writing {path}: {e}")))?;
        if hashing.count != size {
            return Err(Error::Internal(format!(
                "snapshot: {path} ended after {} of {size} bytes",
                hashing.count
            )));
        }
        self.files.push(FileEntry {
            path: path.to_string(),
            size,
            sha256: hex::encode(hashing.hasher.finalize()),
        });
        Ok(())
    }

    /// Writes the manifest (with the entries' hashes filled in) and ends the file.
    pub fn finish(mut self, mut manifest: Manifest) -> Result<(Manifest, W)> {
        manifest.files = std::mem::take(&mut self.files);
        let json = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| Error::Internal(format!("snapshot manifest: {e}")))?;
        let mut header = tar::Header::new_gnu();
        header.set_size(json.len() as u64);
        header.set_mode(0o600);
        header.set_mtime(self.mtime);
        header.set_entry_type(tar::EntryType::Regular);
        self.tar
            .append_data(&mut header, MANIFEST, json.as_slice())
            .map_err(|e| Error::Internal(format!("snapshot: writing the manifest: {e}")))?;
        let gzip = self
            .tar
            .into_inner()
            .map_err(|e| Error::Internal(format!("snapshot: {e}")))?;
        let out = gzip
            .finish()
            .map_err(|e| Error::Internal(format!("snapshot: {e}")))?;
        Ok((manifest, out))
    }
}

/// Entry paths are relative, `/`-separated, without `..`: a snapshot never writes outside
/// the directory it is restored into.
fn check_entry_path(path: &str) -> Result<()> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..");
    if bad {
        return Err(Error::Invalid(format!(
            "snapshot: '{path}' is not a relative entry path"
        )));
    }
    Ok(())
}

struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R> Hashing<R> {
    fn new(inner: R) -> Self {
        Hashing {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// Reads a snapshot entry by entry, checking each against the manifest at the end. `visit` gets
/// every entry but the manifest (its path and a reader of its bytes) and may copy it out; what
/// it does not read is read (and hashed) here.
pub fn read(
    input: impl Read,
    mut visit: impl FnMut(&str, &mut dyn Read) -> Result<()>,
) -> Result<Manifest> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(input));
    let mut seen: Vec<FileEntry> = Vec::new();
    let mut manifest: Option<Manifest> = None;
    let entries = archive.entries().map_err(invalid)?;
    for entry in entries {
        let mut entry = entry.map_err(invalid)?;
        if manifest.is_some() {
            return Err(Error::Invalid(
                "snapshot: entries after the manifest".into(),
            ));
        }
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(Error::Invalid(
                "snapshot: an entry that is not a regular file".into(),
            ));
        }
        let path = entry
            .path()
            .map_err(invalid)?
            .to_str()
            .ok_or_else(|| Error::Invalid("snapshot: an entry path that is not UTF-8".into()))?
            .to_string();
        check_entry_path(&path).map_err(|e| Error::Invalid(e.to_string()))?;
        if path == MANIFEST {
            let mut json = Vec::new();
            entry.read_to_end(&mut json).map_err(invalid)?;
            let parsed: Manifest = serde_json::from_slice(&json)
                .map_err(|e| Error::Invalid(format!("snapshot: manifest.json: {e}")))?;
            manifest = Some(parsed);
            continue;
        }
        let mut hashing = Hashing::new(&mut entry);
        visit(&path, &mut hashing)?;
        io::copy(&mut hashing, &mut io::sink()).map_err(invalid)?;
        seen.push(FileEntry {
            path,
            size: hashing.count,
            sha256: hex::encode(hashing.hasher.finalize()),
        });
    }
    let manifest = manifest.ok_or_else(|| {
        Error::Invalid("snapshot: no manifest.json (not a snapshot, or cut short)".into())
    })?;
    if manifest.format_version > FORMAT_VERSION {
        return Err(Error::Invalid(format!(
            "snapshot: format version {} is newer than this svc reads ({FORMAT_VERSION})",
            manifest.format_version
        )));
    }
    for (listed, found) in manifest.files.iter().zip(&seen) {
        if listed != found {
            return Err(Error::Invalid(format!(
                "snapshot: {} does not match the manifest (size {} sha256 {}, listed {} {})",
                found.path, found.size, found.sha256, listed.size, listed.sha256
            )));
        }
    }
    if manifest.files.len() != seen.len() {
        return Err(Error::Invalid(format!(
            "snapshot: the manifest lists {} entries, the file holds {}",
            manifest.files.len(),
            seen.len()
        )));
    }
    Ok(manifest)
}

fn invalid(error: io::Error) -> Error {
    Error::Invalid(format!("snapshot: not a readable snapshot: {error}"))
}

// ---- Encryption of the whole file ----

/// The first bytes of an encrypted snapshot (a plain one starts with gzip's 1f 8b).
pub const ENCRYPTED_MAGIC: &[u8; 8] = b"SVCSNAP\x01";
const CHUNK: usize = 64 * 1024;
const SALT_LEN: usize = 16;
const NONCE_PREFIX_LEN: usize = 7;
/// argon2id cost: 64 MiB and 3 passes (OWASP's first recommended setting), one lane.
const ARGON2_MEMORY_KIB: u32 = 64 * 1024;
const ARGON2_PASSES: u32 = 3;

/// Whether `start` (a file's first bytes) is an encrypted snapshot.
pub fn is_encrypted(start: &[u8]) -> bool {
    start.starts_with(ENCRYPTED_MAGIC)
}

fn derive_key(
    passphrase: &str,
    salt: &[u8],
    memory_kib: u32,
    passes: u32,
) -> Result<aead::LessSafeKey> {
    let params = argon2::Params::new(memory_kib, passes, 1, Some(32))
        .map_err(|e| Error::Invalid(format!("snapshot: key derivation parameters: {e}")))?;
    let argon = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut key = [0u8; 32];
    argon
        .hash_password_into(passphrase.as_bytes(), salt, &mut key)
        .map_err(|e| Error::Internal(format!("snapshot: key derivation: {e}")))?;
    let unbound = aead::UnboundKey::new(&aead::AES_256_GCM, &key)
        .map_err(|_| Error::internal("snapshot: AES key"))?;
    Ok(aead::LessSafeKey::new(unbound))
}

fn nonce(prefix: &[u8; NONCE_PREFIX_LEN], counter: u32, last: bool) -> aead::Nonce {
    let mut bytes = [0u8; 12];
    bytes[..NONCE_PREFIX_LEN].copy_from_slice(prefix);
    bytes[NONCE_PREFIX_LEN..11].copy_from_slice(&counter.to_be_bytes());
    bytes[11] = u8::from(last);
    aead::Nonce::assume_unique_for_key(bytes)
}

/// Encrypts what is written to it into `out`: the header (magic, argon2id cost and salt, nonce
/// prefix), then chunks of `CHUNK` plaintext bytes, each sealed with its number and a last
/// flag in its nonce, each preceded by one byte saying whether it is the last. `finish` seals
/// the last (possibly empty) chunk; a file without it is refused as cut short.
pub struct Encrypt<W: Write> {
    out: W,
    key: aead::LessSafeKey,
    prefix: [u8; NONCE_PREFIX_LEN],
    counter: u32,
    buffer: Vec<u8>,
}

impl<W: Write> Encrypt<W> {
    pub fn new(out: W, passphrase: &str) -> Result<Self> {
        Self::with_cost(out, passphrase, ARGON2_MEMORY_KIB, ARGON2_PASSES)
    }

    fn with_cost(mut out: W, passphrase: &str, memory_kib: u32, passes: u32) -> Result<Self> {
        if passphrase.is_empty() {
            return Err(Error::Invalid("snapshot: the passphrase is empty".into()));
        }
        let random = ring::rand::SystemRandom::new();
        let mut salt = [0u8; SALT_LEN];
        let mut prefix = [0u8; NONCE_PREFIX_LEN];
        ring::rand::SecureRandom::fill(&random, &mut salt)
            .and_then(|()| ring::rand::SecureRandom::fill(&random, &mut prefix))
            .map_err(|_| Error::internal("snapshot: no randomness"))?;
        let key = derive_key(passphrase, &salt, memory_kib, passes)?;
        let mut header = Vec::with_capacity(8 + 8 + SALT_LEN + NONCE_PREFIX_LEN);
        header.extend_from_slice(ENCRYPTED_MAGIC);
        header.extend_from_slice(&memory_kib.to_be_bytes());
        header.extend_from_slice(&passes.to_be_bytes());
        header.extend_from_slice(&salt);
        header.extend_from_slice(&prefix);
        out.write_all(&header).map_err(write_error)?;
        Ok(Encrypt {
            out,
            key,
            prefix,
            counter: 0,
            buffer: Vec::with_capacity(CHUNK + 16),
        })
    }

    fn seal(&mut self, last: bool) -> io::Result<()> {
        let nonce = nonce(&self.prefix, self.counter, last);
        self.counter = self
            .counter
            .checked_add(1)
            .ok_or_else(|| io::Error::other("snapshot too large to encrypt"))?;
        self.key
            .seal_in_place_append_tag(nonce, aead::Aad::empty(), &mut self.buffer)
            .map_err(|_| io::Error::other("snapshot: sealing failed"))?;
        self.out.write_all(&[u8::from(last)])?;
        self.out.write_all(&self.buffer)?;
        self.buffer.clear();
        Ok(())
    }

    /// Seals the last chunk and returns the inner writer.
    pub fn finish(mut self) -> Result<W> {
        self.seal(true).map_err(write_error)?;
        self.out.flush().map_err(write_error)?;
        Ok(self.out)
    }
}

impl<W: Write> Write for Encrypt<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = CHUNK - self.buffer.len();
        let taken = room.min(data.len());
        self.buffer.extend_from_slice(&data[..taken]);
        if self.buffer.len() == CHUNK {
            self.seal(false)?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

fn write_error(error: io::Error) -> Error {
    Error::Internal(format!("snapshot: writing: {error}"))
}

/// Decrypts an encrypted snapshot as it is read. A wrong passphrase or any change to the file
/// fails the first chunk it touches; a file cut short fails at its end.
pub struct Decrypt<R: Read> {
    input: R,
    key: aead::LessSafeKey,
    prefix: [u8; NONCE_PREFIX_LEN],
    counter: u32,
    plain: Vec<u8>,
    position: usize,
    done: bool,
}

impl<R: Read> Decrypt<R> {
    pub fn new(mut input: R, passphrase: &str) -> Result<Self> {
        let mut header = [0u8; 8 + 8 + SALT_LEN + NONCE_PREFIX_LEN];
        input
            .read_exact(&mut header)
            .map_err(|_| Error::Invalid("snapshot: cut short in its header".into()))?;
        if !is_encrypted(&header) {
            return Err(Error::Invalid("snapshot: not an encrypted snapshot".into()));
        }
        let word = |at: usize| u32::from_be_bytes(header[at..at + 4].try_into().expect("4 bytes"));
        let (memory_kib, passes) = (word(8), word(12));
        // A hostile header must not make us allocate gigabytes or spin for hours.
        if memory_kib > 4 * 1024 * 1024 || passes > 64 {
            return Err(Error::Invalid(
                "snapshot: key derivation cost out of range".into(),
            ));
        }
        let salt = &header[16..16 + SALT_LEN];
        let mut prefix = [0u8; NONCE_PREFIX_LEN];
        prefix.copy_from_slice(&header[16 + SALT_LEN..]);
        let key = derive_key(passphrase, salt, memory_kib, passes)?;
        Ok(Decrypt {
            input,
            key,
            prefix,
            counter: 0,
            plain: Vec::with_capacity(CHUNK + 16),
            position: 0,
            done: false,
        })
    }

    fn next_chunk(&mut self) -> io::Result<()> {
        let mut marker = [0u8; 1];
        if self.input.read(&mut marker)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "encrypted snapshot cut short (no last chunk)",
            ));
        }
        let last = match marker[0] {
            0 => false,
            1 => true,
            _ => return Err(io::Error::other("encrypted snapshot: bad chunk marker")),
        };
        self.plain.clear();
        let want = if last { usize::MAX } else { CHUNK + 16 };
        (&mut self.input)
            .take(want as u64)
            .read_to_end(&mut self.plain)?;
        if !last && self.plain.len() != CHUNK + 16 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "encrypted snapshot cut short",
            ));
        }
        if last && self.plain.len() > CHUNK + 16 {
            return Err(io::Error::other(
                "encrypted snapshot: data after the last chunk",
            ));
        }
        let nonce = nonce(&self.prefix, self.counter, last);
        self.counter = self.counter.wrapping_add(1);
        let opened = self
            .key
            .open_in_place(nonce, aead::Aad::empty(), &mut self.plain)
            .map_err(|_| {
                io::Error::other(
                    "cannot decrypt the snapshot: wrong passphrase, or the file was changed",
                )
            })?
            .len();
        self.plain.truncate(opened);
        self.position = 0;
        self.done = last;
        Ok(())
    }
}

impl<R: Read> Read for Decrypt<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.position == self.plain.len() {
            if self.done {
                return Ok(0);
            }
            self.next_chunk()?;
        }
        let n = buf.len().min(self.plain.len() - self.position);
        buf[..n].copy_from_slice(&self.plain[self.position..self.position + n]);
        self.position += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            svc_version: "test".into(),
            created_at: "2026-11-25T00:00:00.000Z".into(),
            server_id: "here".into(),
            store_driver: "sqlite".into(),
            schema_version: 6,
            audit_head: Some(ChainHead {
                seq: 2,
                hash: "ab".into(),
            }),
            streams: BTreeMap::from([("events".to_string(), 9)]),
            files: Vec::new(),
        }
    }

    fn snapshot(entries: &[(&str, &[u8])]) -> (Manifest, Vec<u8>) {
        let mut writer = Writer::new(Vec::new());
        for (path, data) in entries {
            writer.add(path, data.len() as u64, *data).unwrap();
        }
        writer.finish(manifest()).unwrap()
    }

    #[test]
    fn entries_and_manifest_round_trip() {
        let big = vec![7u8; 300_000];
        let (written, bytes) = snapshot(&[("store/svc.db", b"db"), ("streams/events/1.seg", &big)]);
        assert_eq!(written.files.len(), 2);
        let mut seen = Vec::new();
        let read_back = read(bytes.as_slice(), |path, data| {
            let mut content = Vec::new();
            data.read_to_end(&mut content).unwrap();
            seen.push((path.to_string(), content.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(read_back, written);
        assert_eq!(
            seen,
            [
                ("store/svc.db".to_string(), 2),
                ("streams/events/1.seg".to_string(), 300_000)
            ]
        );
        // Entries the visitor skips are still checked.
        assert_eq!(read(bytes.as_slice(), |_, _| Ok(())).unwrap(), written);
    }

    #[test]
    fn damage_and_bad_paths_are_refused() {
        let (_, bytes) = snapshot(&[("store/svc.db", b"database bytes")]);
        // A flipped byte inside the compressed data: gzip's CRC or the manifest's hash.
        let mut damaged = bytes.clone();
        let middle = damaged.len() / 2;
        damaged[middle] ^= 0x40;
        assert!(read(damaged.as_slice(), |_, _| Ok(())).is_err());
        // Cut short: no manifest.
        let cut = &bytes[..bytes.len() / 2];
        assert!(read(cut, |_, _| Ok(())).is_err());
        assert!(read(&b"not a snapshot"[..], |_, _| Ok(())).is_err());
        let mut writer = Writer::new(Vec::new());
        for path in ["../etc/passwd", "/abs", "a//b", "a/./b", ""] {
            assert!(writer.add(path, 0, &b""[..]).is_err(), "{path}");
        }
        // A size that the data does not reach.
        assert!(writer.add("short", 10, &b"abc"[..]).is_err());
    }

    #[test]
    fn encryption_round_trips_and_refuses_tampering() {
        // Incompressible content, so the file spans several chunks.
        let mut noise = vec![0u8; 200_000];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut noise).unwrap();
        let (_, plain) = snapshot(&[("store/svc.db", &noise)]);
        assert!(plain.len() > 2 * CHUNK);
        let mut encrypt = Encrypt::with_cost(Vec::new(), "correct horse", 64, 1).unwrap();
        encrypt.write_all(&plain).unwrap();
        let sealed = encrypt.finish().unwrap();
        assert!(is_encrypted(&sealed));
        assert!(!is_encrypted(&plain));
        let decrypt = |bytes: &[u8], passphrase: &str| -> io::Result<Vec<u8>> {
            let mut reader = Decrypt::new(bytes, passphrase).map_err(io::Error::other)?;
            let mut out = Vec::new();
            reader.read_to_end(&mut out)?;
            Ok(out)
        };
        assert_eq!(decrypt(&sealed, "correct horse").unwrap(), plain);
        let wrong = decrypt(&sealed, "wrong").unwrap_err().to_string();
        assert!(wrong.contains("wrong passphrase"), "{wrong}");
        let mut flipped = sealed.clone();
        let at = flipped.len() - 100;
        flipped[at] ^= 1;
        assert!(decrypt(&flipped, "correct horse").is_err());
        // Cut at a chunk boundary: the last chunk is missing, which is noticed.
        let header = 8 + 8 + SALT_LEN + NONCE_PREFIX_LEN;
        let one_chunk = header + 1 + CHUNK + 16;
        let cut = decrypt(&sealed[..one_chunk], "correct horse").unwrap_err();
        assert_eq!(cut.kind(), io::ErrorKind::UnexpectedEof, "{cut}");
        assert!(Encrypt::new(Vec::new(), "").is_err());
    }
}
