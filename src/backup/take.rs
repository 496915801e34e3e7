//! Taking a snapshot of a running server (`ClusterService/Backup`).
//!
//! Owns what goes into a snapshot and in which order; the file format is `snapshot.rs`'s.
//! Two steps: [`prepare`] (async) exports the store into a SQLite file in the data dir
//! (`snapshot-<ulid>.db.tmp`, the one temporary copy the server makes), reads the audit head
//! and schema version from that file (so the manifest describes exactly the store it ships
//! with), takes each stream log's consistent copy and reads the policy files; then
//! [`Prepared::write`] (blocking) streams the tar out and deletes the exported file as soon as
//! it has been sent, or when the snapshot is dropped half-way (a client that went away).
//!
//! The store and the streams are not one transaction: the store is exported first, the
//! streams are copied right after, so the streams may hold a few records more than the store
//! knows of (events emitted, audit rows mirrored in between). Never fewer: the audit mirror is
//! written after the row is committed in the store.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::snapshot::{self, ChainHead, Manifest, Writer};
use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::domain::Domain;
use crate::store::Store;
use crate::stream::{SegmentCopy, Stream};
use crate::{Error, Result};

/// What a snapshot is taken of: the running server's parts.
pub struct Source {
    pub store: Arc<dyn Store>,
    pub data_dir: PathBuf,
    pub streams: Vec<(&'static str, Arc<dyn Stream>)>,
    pub policy_dir: PathBuf,
    pub server_id: String,
}

/// A snapshot ready to be written: the exported store file, the streams' copies, the policy
/// files, and the manifest without its file list.
pub struct Prepared {
    store_file: TempFile,
    streams: Vec<(&'static str, Vec<SegmentCopy>)>,
    policies: Vec<(String, Vec<u8>)>,
    manifest: Manifest,
}

/// A file deleted when dropped (unless already gone).
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The server id a manifest records: the bus server name when one was configured, else the
/// host name.
pub fn server_id(configured_name: &str) -> String {
    if !configured_name.is_empty() && configured_name != "svc" {
        return configured_name.to_string();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| configured_name.to_string())
}

/// Admin only; writes one `cluster.backup` audit row (refused and failed attempts too).
pub async fn prepare(domain: &Domain, principal: &Principal, source: &Source) -> Result<Prepared> {
    let result = async {
        principal.require(Role::Admin)?;
        prepare_unaudited(source).await
    }
    .await;
    let detail = match &result {
        Ok(prepared) => serde_json::json!({
            "audit_seq": prepared.manifest.audit_head.as_ref().map(|head| head.seq),
            "streams": prepared.manifest.streams,
            "store_driver": prepared.manifest.store_driver,
        }),
        Err(_) => serde_json::json!({}),
    };
    domain
        .auditor
        .record(
            principal,
            Action::new("cluster.backup", "cluster", source.server_id.clone()).detail(detail),
            &result,
        )
        .await;
    result
}

/// [`prepare`] without the role check and audit row (benchmarks, tests).
pub async fn prepare_unaudited(source: &Source) -> Result<Prepared> {
    let store_file = TempFile(
        source
            .data_dir
            .join(format!("snapshot-{}.db.tmp", crate::ids::ulid())),
    );
    source.store.export_sqlite(&store_file.0).await?;
    let (schema_version, audit_head) = read_store_facts(&store_file.0)?;
    let mut streams = Vec::new();
    let mut last_seqs = BTreeMap::new();
    for (name, log) in &source.streams {
        let (last_seq, copies) = match log.local() {
            Some(local) => local.snapshot(),
            None => copy_shared_stream(log.as_ref(), &source.data_dir).await?,
        };
        last_seqs.insert(name.to_string(), last_seq);
        streams.push((*name, copies));
    }
    let policies = read_policies(&source.policy_dir)?;
    let manifest = Manifest {
        format_version: snapshot::FORMAT_VERSION,
        svc_version: env!("CARGO_PKG_VERSION").to_string(),
        created_at: crate::clock::now_rfc3339(),
        server_id: source.server_id.clone(),
        store_driver: source.store.driver().to_string(),
        schema_version,
        audit_head,
        streams: last_seqs,
        files: Vec::new(),
    };
    Ok(Prepared {
        store_file,
        streams,
        policies,
        manifest,
    })
}

/// A stream that is not a local log (a JetStream stream) goes into a snapshot as a local log
/// would: its records are copied into a temporary log in the data dir, whose segment copies
/// stay readable after the directory is removed (the handles are open).
async fn copy_shared_stream(log: &dyn Stream, data_dir: &Path) -> Result<(u64, Vec<SegmentCopy>)> {
    let dir = data_dir.join(format!(
        "snapshot-{}-{}.stream.tmp",
        crate::ids::ulid(),
        log.name()
    ));
    let copied = crate::stream::copy_to_local(log, &dir).await;
    let snapshot = copied.map(|local| local.snapshot());
    let _ = std::fs::remove_dir_all(&dir);
    snapshot
}

/// The schema version and the audit chain's last row of a SQLite store file.
pub fn read_store_facts(path: &Path) -> Result<(i64, Option<ChainHead>)> {
    use rusqlite::OptionalExtension;
    let connection =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| Error::Invalid(format!("cannot open {}: {e}", path.display())))?;
    let facts = || -> rusqlite::Result<(i64, Option<ChainHead>)> {
        let version = connection.query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_version",
            [],
            |row| row.get(0),
        )?;
        let head = connection
            .query_row(
                "SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1",
                [],
                |row| {
                    Ok(ChainHead {
                        seq: row.get(0)?,
                        hash: row.get(1)?,
                    })
                },
            )
            .optional()?;
        Ok((version, head))
    };
    facts().map_err(|e| Error::Invalid(format!("{}: not a svc store: {e}", path.display())))
}

/// The regular files directly in the policy directory (none when it does not exist).
fn read_policies(dir: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(Error::Internal(format!(
                "cannot read the policy dir {}: {e}",
                dir.display()
            )))
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if !entry.file_type()?.is_file() || name.starts_with('.') {
            continue;
        }
        files.push((name, std::fs::read(entry.path())?));
    }
    files.sort();
    Ok(files)
}

impl Prepared {
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Streams the snapshot into `out` (blocking): the store file (deleted once sent), the
    /// stream segments, the policy files, the manifest.
    pub fn write<W: Write>(self, out: W) -> Result<(Manifest, W)> {
        let Prepared {
            store_file,
            streams,
            policies,
            manifest,
        } = self;
        let mut writer = Writer::new(out);
        {
            let file = std::fs::File::open(&store_file.0)?;
            let size = file.metadata()?.len();
            writer.add(snapshot::STORE_ENTRY, size, std::io::BufReader::new(file))?;
        }
        drop(store_file);
        for (name, copies) in &streams {
            for copy in copies {
                let path = format!("streams/{name}/{}", copy.name);
                writer.add(&path, copy.len, copy.reader())?;
            }
        }
        for (name, data) in &policies {
            writer.add(
                &format!("policies/{name}"),
                data.len() as u64,
                data.as_slice(),
            )?;
        }
        writer.finish(manifest)
    }
}

/// A `Write` that cuts what it gets into chunks and sends them down a bounded channel, so a
/// blocking snapshot writer feeds an async stream (the gRPC response) at the pace the client
/// reads. Fails with BrokenPipe once the receiver is gone, which ends the snapshot.
pub struct ChannelWriter {
    sender: tokio::sync::mpsc::Sender<Result<Vec<u8>>>,
    buffer: Vec<u8>,
}

/// Bytes per chunk sent: big enough to keep per-message costs small, well under gRPC's 4 MiB
/// message limit.
pub const CHUNK_BYTES: usize = 256 * 1024;

impl ChannelWriter {
    pub fn new(sender: tokio::sync::mpsc::Sender<Result<Vec<u8>>>) -> Self {
        ChannelWriter {
            sender,
            buffer: Vec::with_capacity(CHUNK_BYTES),
        }
    }

    fn send(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK_BYTES));
        self.sender
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "client went away"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let room = CHUNK_BYTES - self.buffer.len();
        let taken = room.min(data.len());
        self.buffer.extend_from_slice(&data[..taken]);
        if self.buffer.len() == CHUNK_BYTES {
            self.send()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// `ClusterService/Backup`: checks the role, prepares the snapshot, then writes it on a
/// blocking thread into the returned channel (errors arrive as the last item).
pub async fn open_backup(
    domain: &Arc<Domain>,
    principal: &Principal,
    source: Source,
) -> Result<tokio::sync::mpsc::Receiver<Result<Vec<u8>>>> {
    let prepared = prepare(domain, principal, &source).await?;
    let (sender, receiver) = tokio::sync::mpsc::channel(8);
    tokio::task::spawn_blocking(move || {
        let errors = sender.clone();
        let written = prepared
            .write(ChannelWriter::new(sender))
            .and_then(|(_, mut out)| out.flush().map_err(Error::from));
        if let Err(error) = written {
            tracing::warn!(%error, "snapshot not completed");
            let _ = errors.blocking_send(Err(error));
        }
    });
    Ok(receiver)
}

/// Reads everything from `input` (for tests of the writer).
#[cfg(test)]
fn read_all(mut input: impl std::io::Read) -> Vec<u8> {
    let mut out = Vec::new();
    input.read_to_end(&mut out).unwrap();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_snapshot_holds_the_store_streams_and_policies() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(crate::store::SqliteStore::open(&dir.path().join("svc.db")).unwrap());
        let auditor = crate::audit::Auditor::new(store.clone(), dir.path().join("policies"));
        let admin = Principal::server();
        for i in 0..3 {
            auditor
                .record(
                    &admin,
                    Action::new("apikey.create", "apikey", format!("k{i}")),
                    &Ok::<(), Error>(()),
                )
                .await;
        }
        let events = crate::stream::StreamLog::open(
            &dir.path().join("jetstream/events"),
            Default::default(),
        )
        .unwrap();
        for _ in 0..5 {
            events
                .append(crate::clock::now_millis(), b"event".to_vec())
                .await
                .unwrap();
        }
        std::fs::create_dir_all(dir.path().join("policies")).unwrap();
        std::fs::write(dir.path().join("policies/p.yaml"), b"id: p\n").unwrap();
        let source = Source {
            store,
            data_dir: dir.path().to_path_buf(),
            streams: vec![("events", events as Arc<dyn Stream>)],
            policy_dir: dir.path().join("policies"),
            server_id: "test".into(),
        };
        let prepared = prepare_unaudited(&source).await.unwrap();
        assert_eq!(prepared.manifest().audit_head.as_ref().unwrap().seq, 3);
        let (manifest, bytes) = prepared.write(Vec::new()).unwrap();
        assert_eq!(manifest.streams["events"], 5);
        // The exported store file is gone once written.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        let mut paths = Vec::new();
        let read_back = snapshot::read(bytes.as_slice(), |path, data| {
            paths.push(path.to_string());
            read_all(data);
            Ok(())
        })
        .unwrap();
        assert_eq!(read_back, manifest);
        assert_eq!(paths[0], snapshot::STORE_ENTRY);
        assert!(paths.iter().any(|p| p.starts_with("streams/events/")));
        assert_eq!(paths.last().unwrap(), "policies/p.yaml");
    }
}
