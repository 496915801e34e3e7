//! The single-server backend: objects on local disk under `data_dir/files/<cluster>/`.
//!
//! Layout (docs/files.md):
//! ```text
//! files/<cluster>/chunks/<aa>/<sha256>     content-addressed chunks (aa: the hash's first byte)
//! files/<cluster>/chunks/<aa>/<sha256>.pending  a chunk received, not yet durable
//! files/<cluster>/objects/<hex(path)>.json one metadata record per file path
//! files/<cluster>/kv/<bucket>/<hex(key)>.json  one record per kv key (bytes in chunks/)
//! files/<cluster>/tmp/                     files being written, renamed into place
//! ```
//! Every file is written to `tmp/` and renamed into place, so a crash leaves either the old file
//! or the new one. Records are fsync'd before the rename (and the directory after). Chunks are
//! not, one by one: a chunk arrives as `<sha256>.pending`, and the commit that needs it makes
//! its pending chunks durable together, renames them to their names and syncs the names, before
//! it writes the record: up to 16 chunks one by one, more with one `syncfs` for their bytes and
//! one for their names. A put of 1 GiB costs four syncs instead of two per 256 KiB chunk. Pending chunks count as present only for the process that wrote them:
//! after a restart they may be half-written, so a resumed put sends them again.
//! An object is visible only through its metadata record, written last: an interrupted put
//! leaves chunks and no record, so nothing is listed, and a retried put finds the durable
//! chunks and does not send them again.
//! Paths are hex-encoded in record names so no user path can reach outside the directory.
//!
//! Chunks no record refers to (a put that never finished, a deleted or replaced object) are
//! removed by [`LocalStore::collect_garbage`], after each delete and replacement, once older
//! than `ORPHAN_GRACE`, which leaves time to resume. The blocking file I/O runs on tokio's blocking pool.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;

use super::{ObjectMeta, ObjectStore, Remote};
use crate::{Error, Result};

/// Unreferenced chunks younger than this are kept, so an interrupted put can resume.
const ORPHAN_GRACE: Duration = Duration::from_secs(24 * 3600);

pub struct LocalStore {
    root: PathBuf,
    /// The final paths of the chunks this process wrote as `.pending` and no commit has made
    /// durable yet.
    pending: Arc<Mutex<HashSet<PathBuf>>>,
}

impl LocalStore {
    /// Objects under `root` (`data_dir/files`).
    pub fn new(root: PathBuf) -> LocalStore {
        LocalStore {
            root,
            pending: Arc::default(),
        }
    }

    fn cluster_dir(&self, cluster: &str) -> PathBuf {
        self.root.join(cluster)
    }

    fn chunk_path(&self, cluster: &str, sha256: &str) -> PathBuf {
        self.cluster_dir(cluster)
            .join("chunks")
            .join(&sha256[..2])
            .join(sha256)
    }

    fn record_path(&self, cluster: &str, remote: &Remote) -> PathBuf {
        let dir = self.cluster_dir(cluster);
        match remote {
            Remote::File(path) => dir
                .join("objects")
                .join(format!("{}.json", hex::encode(path))),
            Remote::Kv { bucket, key } => dir
                .join("kv")
                .join(bucket)
                .join(format!("{}.json", hex::encode(key))),
        }
    }

    /// Removes chunks no record refers to that are older than `ORPHAN_GRACE`.
    pub fn collect_garbage(&self, cluster: &str) -> Result<u64> {
        let mut referenced = std::collections::HashSet::new();
        for record in read_records(&self.cluster_dir(cluster))? {
            referenced.extend(record.chunks);
        }
        let chunks = self.cluster_dir(cluster).join("chunks");
        let mut removed = 0;
        let now = SystemTime::now();
        for dir in read_dir_or_empty(&chunks)? {
            for entry in read_dir_or_empty(&dir)? {
                let Some(name) = entry.file_name().and_then(|n| n.to_str()).map(String::from)
                else {
                    continue;
                };
                if referenced.contains(&name) {
                    continue;
                }
                let old = fs::metadata(&entry)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|modified| now.duration_since(modified).ok())
                    .is_some_and(|age| age > ORPHAN_GRACE);
                if old && fs::remove_file(&entry).is_ok() {
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Internal(format!("{what} {}: {e}", path.display()))
}

fn read_dir_or_empty(dir: &Path) -> Result<Vec<PathBuf>> {
    match fs::read_dir(dir) {
        Ok(entries) => Ok(entries.filter_map(|e| e.ok().map(|e| e.path())).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io_error("cannot read", dir, e)),
    }
}

/// `chunks/aa/<sha256>.pending`.
fn pending_path(target: &Path) -> PathBuf {
    target.with_extension("pending")
}

/// Flushes everything written to the file system holding `dir` (data and names) in one call.
fn sync_file_system(dir: &Path) -> Result<()> {
    let handle = fs::File::open(dir).map_err(|e| io_error("cannot open", dir, e))?;
    // SAFETY: syncfs takes a descriptor, which `handle` keeps open for the call.
    if unsafe { libc::syncfs(handle.as_raw_fd()) } != 0 {
        return Err(io_error(
            "cannot sync",
            dir,
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Whether a write is durable when it returns (records) or made so later (chunks, by the
/// commit that needs them).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Durability {
    Now,
    AtCommit,
}

/// Writes `bytes` to `target` through `tmp_dir` and renames it into place; with `Durability::Now`
/// the file is fsync'd before the rename and the directory after.
fn write_atomically(
    tmp_dir: &Path,
    target: &Path,
    bytes: &[u8],
    durability: Durability,
) -> Result<()> {
    fs::create_dir_all(tmp_dir).map_err(|e| io_error("cannot create", tmp_dir, e))?;
    let parent = target
        .parent()
        .expect("targets are inside a cluster directory");
    fs::create_dir_all(parent).map_err(|e| io_error("cannot create", parent, e))?;
    let temp = tmp_dir.join(format!("{}.tmp", crate::ids::random_base62(20)));
    let written = fs::File::create(&temp)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            match durability {
                Durability::Now => file.sync_data(),
                Durability::AtCommit => Ok(()),
            }
        })
        .and_then(|()| fs::rename(&temp, target));
    if let Err(e) = written {
        let _ = fs::remove_file(&temp);
        return Err(io_error("cannot write", target, e));
    }
    if durability == Durability::Now {
        if let Ok(dir) = fs::File::open(parent) {
            let _ = dir.sync_all();
        }
    }
    Ok(())
}

fn read_record(path: &Path) -> Result<Option<ObjectMeta>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Internal(format!("damaged record {}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("cannot read", path, e)),
    }
}

/// Every record of one cluster: files, then kv values.
fn read_records(cluster_dir: &Path) -> Result<Vec<ObjectMeta>> {
    let mut files = read_dir_or_empty(&cluster_dir.join("objects"))?;
    for bucket in read_dir_or_empty(&cluster_dir.join("kv"))? {
        files.extend(read_dir_or_empty(&bucket)?);
    }
    let mut records = Vec::new();
    for file in files {
        if file.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        if let Some(record) = read_record(&file)? {
            records.push(record);
        }
    }
    Ok(records)
}

/// Past this many chunks a commit syncs the whole file system once rather than each chunk:
/// `syncfs` also waits for whatever else the host has written, which a small put should not.
const SYNC_EACH_UP_TO: usize = 16;

/// Makes the pending chunks among `chunks` durable under their names: their bytes synced
/// (each one, or one `syncfs` for many), the renames, then the names synced. A chunk neither
/// durable nor pending is an error (the caller checked they had all arrived).
fn make_durable(
    cluster_dir: &Path,
    chunks: &[PathBuf],
    pending: &Mutex<HashSet<PathBuf>>,
) -> Result<()> {
    let mut waiting: Vec<&PathBuf> = chunks.iter().filter(|path| !path.exists()).collect();
    waiting.dedup();
    if waiting.is_empty() {
        return Ok(());
    }
    let each = waiting.len() <= SYNC_EACH_UP_TO;
    if each {
        for target in &waiting {
            let path = pending_path(target);
            match fs::File::open(&path).and_then(|file| file.sync_data()) {
                Ok(()) => {}
                Err(_) if target.exists() => {}
                Err(e) => return Err(io_error("cannot sync", &path, e)),
            }
        }
    } else {
        sync_file_system(cluster_dir)?;
    }
    let mut directories = HashSet::new();
    for target in waiting {
        match fs::rename(pending_path(target), target) {
            Ok(()) => {}
            // Another commit of the same chunk got there first.
            Err(_) if target.exists() => {}
            Err(e) => return Err(io_error("cannot store", target, e)),
        }
        pending.lock().expect("pending chunks lock").remove(target);
        if let Some(parent) = target.parent() {
            directories.insert(parent.to_path_buf());
        }
    }
    if !each {
        return sync_file_system(cluster_dir);
    }
    for directory in directories {
        fs::File::open(&directory)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| io_error("cannot sync", &directory, e))?;
    }
    Ok(())
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Internal(format!("file task failed: {e}")))?
}

#[async_trait]
impl ObjectStore for LocalStore {
    async fn stat(&self, cluster: &str, remote: &Remote) -> Result<Option<ObjectMeta>> {
        let path = self.record_path(cluster, remote);
        blocking(move || read_record(&path)).await
    }

    async fn list(&self, cluster: &str, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let dir = self.cluster_dir(cluster);
        let prefix = prefix.to_string();
        blocking(move || {
            let mut records: Vec<ObjectMeta> = read_records(&dir)?
                .into_iter()
                .filter(|record| record.path.starts_with(&prefix))
                .collect();
            crate::sort::sort_by(&mut records, |a, b| a.path.cmp(&b.path));
            Ok(records)
        })
        .await
    }

    async fn missing_chunks(&self, cluster: &str, chunks: &[String]) -> Result<Vec<usize>> {
        let paths: Vec<PathBuf> = chunks
            .iter()
            .map(|sha| self.chunk_path(cluster, sha))
            .collect();
        let pending = self.pending.clone();
        blocking(move || {
            let pending = pending.lock().expect("pending chunks lock");
            Ok(paths
                .iter()
                .enumerate()
                .filter(|(_, path)| {
                    let held = pending.contains(*path) && pending_path(path).exists();
                    !(held || path.exists())
                })
                .map(|(index, _)| index)
                .collect())
        })
        .await
    }

    async fn write_chunk(&self, cluster: &str, sha256: &str, bytes: Bytes) -> Result<()> {
        let target = self.chunk_path(cluster, sha256);
        let tmp = self.cluster_dir(cluster).join("tmp");
        let pending = self.pending.clone();
        blocking(move || {
            if target.exists() {
                return Ok(());
            }
            write_atomically(&tmp, &pending_path(&target), &bytes, Durability::AtCommit)?;
            pending.lock().expect("pending chunks lock").insert(target);
            Ok(())
        })
        .await
    }

    async fn read_chunk(&self, cluster: &str, sha256: &str) -> Result<Bytes> {
        let path = self.chunk_path(cluster, sha256);
        // A chunk this process received and no commit has made durable yet is there for it
        // (as `missing_chunks` says): a commit reads the chunk list a client sent as chunks.
        let held = self
            .pending
            .lock()
            .expect("pending chunks lock")
            .contains(&path);
        blocking(move || match fs::read(&path) {
            Ok(bytes) => Ok(Bytes::from(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && held => {
                let pending = pending_path(&path);
                fs::read(&pending)
                    .map(Bytes::from)
                    .map_err(|e| io_error("cannot read", &pending, e))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::NotFound(format!(
                "chunk {} is missing",
                path.file_name().and_then(|n| n.to_str()).unwrap_or("")
            ))),
            Err(e) => Err(io_error("cannot read", &path, e)),
        })
        .await
    }

    async fn commit(&self, cluster: &str, remote: &Remote, meta: &ObjectMeta) -> Result<()> {
        let target = self.record_path(cluster, remote);
        let cluster_dir = self.cluster_dir(cluster);
        let tmp = cluster_dir.join("tmp");
        let bytes = serde_json::to_vec(meta).expect("records serialize");
        let store = LocalStore::new(self.root.clone());
        let chunks: Vec<PathBuf> = meta
            .chunks
            .iter()
            .map(|sha| self.chunk_path(cluster, sha))
            .collect();
        let pending = self.pending.clone();
        let cluster = cluster.to_string();
        blocking(move || {
            make_durable(&cluster_dir, &chunks, &pending)?;
            let replaces = target.exists();
            write_atomically(&tmp, &target, &bytes, Durability::Now)?;
            // The replaced version's chunks may now be unreferenced.
            if replaces {
                if let Err(e) = store.collect_garbage(&cluster) {
                    tracing::warn!(cluster, error = %e, "chunk garbage collection failed");
                }
            }
            Ok(())
        })
        .await
    }

    async fn delete(&self, cluster: &str, remote: &Remote) -> Result<bool> {
        let target = self.record_path(cluster, remote);
        let store = LocalStore::new(self.root.clone());
        let cluster = cluster.to_string();
        blocking(move || {
            let existed = match fs::remove_file(&target) {
                Ok(()) => true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(e) => return Err(io_error("cannot remove", &target, e)),
            };
            if existed {
                if let Err(e) = store.collect_garbage(&cluster) {
                    tracing::warn!(cluster, error = %e, "chunk garbage collection failed");
                }
            }
            Ok(existed)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(path: &str, chunks: Vec<String>) -> ObjectMeta {
        ObjectMeta {
            path: path.into(),
            size: 1,
            sha256: "0".repeat(64),
            chunk_size: 1,
            chunks,
            created_at: String::new(),
            updated_at: String::new(),
            writer: Default::default(),
        }
    }

    #[tokio::test]
    async fn an_object_is_visible_only_after_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path().to_path_buf());
        let chunk = Bytes::from_static(b"x");
        let sha = super::super::sha256_hex(&chunk);
        let remote = Remote::parse("a/b").unwrap();
        assert_eq!(
            store
                .missing_chunks("c", std::slice::from_ref(&sha))
                .await
                .unwrap(),
            [0]
        );
        store.write_chunk("c", &sha, chunk.clone()).await.unwrap();
        assert!(store
            .missing_chunks("c", std::slice::from_ref(&sha))
            .await
            .unwrap()
            .is_empty());
        assert!(
            store.list("c", "").await.unwrap().is_empty(),
            "not yet committed"
        );
        store
            .commit("c", &remote, &meta("a/b", vec![sha.clone()]))
            .await
            .unwrap();
        assert_eq!(store.list("c", "a/").await.unwrap().len(), 1);
        assert!(store.list("other", "").await.unwrap().is_empty());
        assert_eq!(store.read_chunk("c", &sha).await.unwrap(), chunk);
        assert!(store.delete("c", &remote).await.unwrap());
        assert!(!store.delete("c", &remote).await.unwrap());
        assert!(store.stat("c", &remote).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn chunks_become_durable_at_commit_and_a_restart_distrusts_pending_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path().to_path_buf());
        let chunk = Bytes::from_static(b"y");
        let sha = super::super::sha256_hex(&chunk);
        let chunks = std::slice::from_ref(&sha);
        store.write_chunk("c", &sha, chunk.clone()).await.unwrap();
        let target = store.chunk_path("c", &sha);
        assert!(!target.exists() && pending_path(&target).exists());
        assert!(store.missing_chunks("c", chunks).await.unwrap().is_empty());
        // Another process (a restart) cannot know the pending chunk was written whole.
        let restarted = LocalStore::new(dir.path().to_path_buf());
        assert_eq!(restarted.missing_chunks("c", chunks).await.unwrap(), [0]);
        let remote = Remote::parse("a").unwrap();
        store
            .commit("c", &remote, &meta("a", vec![sha.clone()]))
            .await
            .unwrap();
        assert!(target.exists() && !pending_path(&target).exists());
        assert!(restarted
            .missing_chunks("c", chunks)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(restarted.read_chunk("c", &sha).await.unwrap(), chunk);
        // Many chunks at once: one sync of the file system for them all.
        let many: Vec<String> = (0..SYNC_EACH_UP_TO + 4)
            .map(|n| super::super::sha256_hex(format!("chunk {n}").as_bytes()))
            .collect();
        for (n, sha) in many.iter().enumerate() {
            let bytes = Bytes::from(format!("chunk {n}"));
            store.write_chunk("c", sha, bytes).await.unwrap();
        }
        store
            .commit("c", &Remote::parse("m").unwrap(), &meta("m", many.clone()))
            .await
            .unwrap();
        assert!(restarted
            .missing_chunks("c", &many)
            .await
            .unwrap()
            .is_empty());
        // A commit naming a chunk that never arrived fails and writes no record.
        let absent = super::super::sha256_hex(b"absent");
        let failed = store
            .commit("c", &Remote::parse("b").unwrap(), &meta("b", vec![absent]))
            .await;
        assert!(failed.is_err());
        assert!(store
            .stat("c", &Remote::parse("b").unwrap())
            .await
            .unwrap()
            .is_none());
    }
}
