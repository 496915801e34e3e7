//! The server's data dir as every program that touches it sees it: its lock and the master
//! key that opens what is sealed in it.
//!
//! A running server, `svc-server --recover-admin` and an offline restore
//! (`svc-cluster-backup restore`) take the lock; `svc-migrate` takes it shared
//! (`store::copy`). The master key is decoded here and nowhere else: the server decodes it
//! once at start (into `identity::Keys`), the configuration check and the restore's
//! master-key check use the same function. Below the server and backup, so neither reaches
//! into the other.

use std::path::Path;

use base64::Engine;

use crate::config::Secret;
use crate::{Error, Result};

/// The data dir's advisory lock (flock), held by a running server, by `--recover-admin` and
/// by an offline restore.
pub const LOCK_FILE: &str = "server.lock";

/// Takes the data dir's lock (an exclusive `flock` on `data_dir/server.lock`), held while the
/// returned file stays open and released by the kernel when the process ends, however it ends.
/// Unavailable when another process holds it.
pub fn lock(data_dir: &Path) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|e| Error::Internal(format!("cannot open {}: {e}", path.display())))?;
    // SAFETY: flock on a file descriptor this function owns; no memory is involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(Error::Unavailable(format!(
                "a server is running on this data dir ({} is locked by another process)",
                path.display()
            )));
        }
        return Err(Error::Internal(format!(
            "cannot lock {}: {error}",
            path.display()
        )));
    }
    Ok(file)
}

/// The data dir's lock when no server holds it (None when one does), for offline tools that
/// change the data dir (`svc-cluster-backup restore`); held until the file is dropped.
pub fn try_lock(data_dir: &Path) -> Result<Option<std::fs::File>> {
    match lock(data_dir) {
        Ok(file) => Ok(Some(file)),
        Err(Error::Unavailable(_)) => Ok(None),
        Err(error) => Err(error),
    }
}

/// The configured `master_key` (base64 of exactly 32 bytes, surrounding blanks ignored) as
/// its bytes; None when it is not that.
pub fn decode_master_key(key: &Secret) -> Option<[u8; 32]> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(key.expose().trim())
        .ok()?;
    bytes.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock(dir.path()).unwrap();
        assert!(try_lock(dir.path()).unwrap().is_none());
        assert!(matches!(lock(dir.path()), Err(Error::Unavailable(_))));
        drop(held);
        assert!(try_lock(dir.path()).unwrap().is_some());
    }

    #[test]
    fn master_keys_are_32_bytes_of_base64() {
        let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        assert_eq!(
            decode_master_key(&Secret(format!(" {key}\n"))),
            Some([7u8; 32])
        );
        let short = base64::engine::general_purpose::STANDARD.encode([7u8; 31]);
        assert_eq!(decode_master_key(&Secret(short)), None);
        assert_eq!(decode_master_key(&Secret("not base64!".into())), None);
    }
}
