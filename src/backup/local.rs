//! Snapshot files on this host, no server involved: open (decrypting), verify, list, and the
//! offline restore into a data dir.
//!
//! Owns the checks a snapshot must pass before anything of it is used: the tar structure and
//! every entry's size and SHA-256 against the manifest (`snapshot::read`), then the store file
//! inside: its schema version and audit chain head equal the manifest's, and the whole chain
//! verifies row by row. A restore stages the snapshot beside the data dir's contents and swaps
//! it in only once all of that (and the configured master key) checked out.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::snapshot::{self, Manifest};
use crate::auth::Principal;
use crate::config::{ServerConfig, StoreDriver};
use crate::store::{SqliteStore, Store};
use crate::{Error, Result};

/// Opens a snapshot file for reading, decrypting it when it is encrypted.
pub fn open(path: &Path, passphrase: Option<&str>) -> Result<Box<dyn Read + Send>> {
    let file = std::fs::File::open(path)
        .map_err(|e| Error::NotFound(format!("cannot open {}: {e}", path.display())))?;
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let start = reader
        .fill_buf()
        .map_err(|e| Error::Invalid(format!("cannot read {}: {e}", path.display())))?;
    if !snapshot::is_encrypted(start) {
        return Ok(Box::new(reader));
    }
    let passphrase = passphrase.ok_or_else(|| {
        Error::Invalid(format!(
            "{} is encrypted: give --passphrase-file FILE or set SVC_BACKUP_PASSPHRASE",
            path.display()
        ))
    })?;
    Ok(Box::new(snapshot::Decrypt::new(reader, passphrase)?))
}

/// Whether the file starts as an encrypted snapshot.
pub fn is_encrypted_file(path: &Path) -> bool {
    let mut start = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut start))
        .is_ok()
        && snapshot::is_encrypted(&start)
}

/// What a verified snapshot holds.
#[derive(Debug, Clone)]
pub struct Verified {
    pub manifest: Manifest,
    /// Audit rows whose chain verified.
    pub audit_rows: u64,
}

/// Checks a snapshot file completely (see the module doc); the error names the first problem.
pub async fn verify(path: &Path, passphrase: Option<&str>) -> Result<Verified> {
    let scratch = TempDir(std::env::temp_dir().join(format!("svc-verify-{}", crate::ids::ulid())));
    std::fs::create_dir_all(&scratch.0)?;
    let store_file = scratch.0.join("svc.db");
    let manifest = {
        let input = open(path, passphrase)?;
        let store_file = store_file.clone();
        tokio::task::spawn_blocking(move || {
            snapshot::read(input, |entry, data| {
                if entry == snapshot::STORE_ENTRY {
                    copy_to(data, &store_file)?;
                }
                Ok(())
            })
        })
        .await
        .map_err(Error::internal)??
    };
    if !store_file.exists() {
        return Err(Error::Invalid(format!(
            "snapshot: no {} entry",
            snapshot::STORE_ENTRY
        )));
    }
    let audit_rows = check_store(&store_file, &manifest).await?;
    Ok(Verified {
        manifest,
        audit_rows,
    })
}

fn copy_to(data: &mut dyn Read, path: &Path) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = std::fs::File::create(path)?;
    std::io::copy(data, &mut file).map_err(|e| {
        Error::Invalid(format!(
            "snapshot: not a readable snapshot: {e} (writing {})",
            path.display()
        ))
    })?;
    file.sync_all()?;
    Ok(())
}

/// The store file of a snapshot against its manifest: schema version, audit head, and the
/// chain row by row. Returns the number of rows verified.
pub async fn check_store(store_file: &Path, manifest: &Manifest) -> Result<u64> {
    let (schema_version, head) = super::take::read_store_facts(store_file)?;
    if schema_version != manifest.schema_version {
        return Err(Error::Invalid(format!(
            "snapshot: the store's schema version is {schema_version}, the manifest says {}",
            manifest.schema_version
        )));
    }
    if head != manifest.audit_head {
        return Err(Error::Invalid(format!(
            "snapshot: the store's audit chain head ({}) is not the manifest's ({})",
            describe_head(&head),
            describe_head(&manifest.audit_head)
        )));
    }
    if schema_version > crate::store::MIGRATIONS.last().map_or(0, |m| m.0) {
        return Err(Error::Invalid(format!(
            "snapshot: schema version {schema_version} is newer than this svc knows; use svc {} or later",
            manifest.svc_version
        )));
    }
    let store = SqliteStore::open(store_file)?;
    let verification = crate::audit::verify(&store, &Principal::server()).await?;
    if !verification.ok {
        return Err(Error::Invalid(format!(
            "snapshot: the audit chain is broken at {}: {}",
            verification.first_bad.unwrap_or_default(),
            verification.detail.unwrap_or_default()
        )));
    }
    Ok(verification.rows)
}

fn describe_head(head: &Option<snapshot::ChainHead>) -> String {
    match head {
        Some(head) => format!("row {} {}", head.seq, head.hash),
        None => "empty".into(),
    }
}

/// One line of `svc-cluster-backup list`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Listed {
    pub name: String,
    pub size: u64,
    pub encrypted: bool,
    pub created_at: Option<String>,
    pub svc_version: Option<String>,
    pub valid: bool,
    /// Why not valid (or "encrypted: not checked without the passphrase").
    pub problem: Option<String>,
}

/// The snapshot files in `dir` (names ending in `.tar.gz` or `.svcsnap`), each read through
/// and checked (hashes and manifest; not the audit chain, which `verify` walks), oldest name
/// first.
pub fn list(dir: &Path, passphrase: Option<&str>) -> Result<Vec<Listed>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::NotFound(format!("cannot read {}: {e}", dir.display())))?;
    let mut names: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .filter(|path| path.is_file() && is_snapshot_name(path))
        .collect();
    names.sort();
    Ok(names.iter().map(|path| listed(path, passphrase)).collect())
}

/// Snapshot file names: `*.tar.gz` plain, `*.svcsnap` encrypted (or either).
pub fn is_snapshot_name(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.ends_with(".tar.gz") || name.ends_with(".svcsnap")
}

fn listed(path: &Path, passphrase: Option<&str>) -> Listed {
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let encrypted = is_encrypted_file(path);
    let mut item = Listed {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        size,
        encrypted,
        created_at: None,
        svc_version: None,
        valid: false,
        problem: None,
    };
    if encrypted && passphrase.is_none() {
        item.problem = Some("encrypted: give the passphrase to check it".into());
        return item;
    }
    match open(path, passphrase).and_then(|input| snapshot::read(input, |_, _| Ok(()))) {
        Ok(manifest) => {
            item.created_at = Some(manifest.created_at);
            item.svc_version = Some(manifest.svc_version);
            item.valid = true;
        }
        Err(error) => item.problem = Some(error.to_string()),
    }
    item
}

// ---- Restore ----

/// Starting and stopping the server's systemd unit (a trait so tests can stand in).
pub trait ServiceControl {
    /// Whether the unit is active.
    fn is_active(&self) -> bool;
    fn stop(&self) -> Result<()>;
    fn start(&self) -> Result<()>;
}

/// The `svc-server` unit through systemctl.
pub struct Systemd {
    pub unit: String,
}

impl Systemd {
    fn systemctl(&self, verb: &str) -> Result<bool> {
        let status = std::process::Command::new("systemctl")
            .arg(verb)
            .arg(&self.unit)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .map_err(|e| Error::Unavailable(format!("systemctl {verb} {}: {e}", self.unit)))?;
        Ok(status.success())
    }
}

impl ServiceControl for Systemd {
    fn is_active(&self) -> bool {
        // `is-active --quiet`: exit 0 only when active; no systemd at all is "not active".
        matches!(
            std::process::Command::new("systemctl")
                .args(["is-active", "--quiet", &self.unit])
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status(),
            Ok(status) if status.success()
        )
    }
    fn stop(&self) -> Result<()> {
        if self.systemctl("stop")? {
            Ok(())
        } else {
            Err(Error::Unavailable(format!(
                "systemctl stop {} failed",
                self.unit
            )))
        }
    }
    fn start(&self) -> Result<()> {
        if self.systemctl("start")? {
            Ok(())
        } else {
            Err(Error::Unavailable(format!(
                "systemctl start {} failed",
                self.unit
            )))
        }
    }
}

/// What `restore` did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Restored {
    pub data_dir: String,
    pub store_driver: String,
    pub created_at: String,
    pub server_id: String,
    pub audit_rows: u64,
    pub streams: std::collections::BTreeMap<String, u64>,
    pub policies: usize,
    /// The server was stopped through systemd and started again.
    pub restarted_server: bool,
}

/// How to restore.
pub struct RestoreOptions<'a> {
    pub input: &'a Path,
    pub passphrase: Option<&'a str>,
    /// Replace a populated target.
    pub force: bool,
}

/// Removes a directory tree when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The offline restore (see the module doc and docs/backup.md "Restore").
pub async fn restore(
    config: &ServerConfig,
    options: &RestoreOptions<'_>,
    service: &dyn ServiceControl,
) -> Result<Restored> {
    let data_dir = config.data_dir.clone();
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| Error::Unavailable(format!("cannot create {}: {e}", data_dir.display())))?;
    if !options.force {
        if let Some(what) = populated(config).await? {
            return Err(Error::Conflict(format!(
                "the target is not empty ({what}); restoring replaces it: add --force"
            )));
        }
    }
    // Stage and check everything before the server is touched: a bad file costs no downtime.
    let staging = TempDir(data_dir.join(format!("restore-{}.tmp", crate::ids::ulid())));
    std::fs::create_dir_all(&staging.0)?;
    let manifest = stage(options, &staging.0).await?;
    let store_file = staging.0.join("svc.db");
    let audit_rows = check_store(&store_file, &manifest).await?;
    check_master_key(config, &store_file).await?;
    for (name, last_seq) in &manifest.streams {
        let dir = staging.0.join("jetstream").join(name);
        std::fs::create_dir_all(&dir)?;
        let log = crate::stream::StreamLog::open(&dir, Default::default())?;
        if log.last_seq() != *last_seq {
            return Err(Error::Invalid(format!(
                "snapshot: stream {name} ends at {}, the manifest says {last_seq}",
                log.last_seq()
            )));
        }
    }

    // Now the server: it must not run on this data dir while the files change.
    let mut restarted_server = false;
    let lock = match crate::datadir::try_lock(&data_dir)? {
        Some(lock) => lock,
        None if service.is_active() => {
            service.stop()?;
            restarted_server = true;
            wait_for_lock(&data_dir).await?
        }
        None => {
            return Err(Error::Unavailable(format!(
                "a server is running on {} (its server.lock is held) and not as the systemd unit svc-server: stop it, then run the restore again",
                data_dir.display()
            )))
        }
    };
    let swapped = swap_in(config, &staging.0, &manifest).await;
    let verified = match swapped {
        Ok(()) => verify_restored(config, &manifest).await,
        Err(error) => Err(error),
    };
    drop(lock);
    if restarted_server {
        if let Err(error) = service.start() {
            return Err(Error::Unavailable(format!(
                "restored, but the server did not start again: {error}"
            )));
        }
    }
    verified?;
    Ok(Restored {
        data_dir: data_dir.display().to_string(),
        store_driver: match config.store.driver {
            StoreDriver::Sqlite => "sqlite".into(),
            StoreDriver::Postgres => "postgres".into(),
        },
        created_at: manifest.created_at.clone(),
        server_id: manifest.server_id.clone(),
        audit_rows,
        streams: manifest.streams.clone(),
        policies: manifest
            .files
            .iter()
            .filter(|file| file.path.starts_with("policies/"))
            .count(),
        restarted_server,
    })
}

async fn wait_for_lock(data_dir: &Path) -> Result<std::fs::File> {
    for _ in 0..100 {
        if let Some(lock) = crate::datadir::try_lock(data_dir)? {
            return Ok(lock);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(Error::Unavailable(format!(
        "svc-server was stopped but {} is still locked by another process",
        data_dir.display()
    )))
}

/// What makes the target populated, if anything: a store with rows, or stream segments.
async fn populated(config: &ServerConfig) -> Result<Option<String>> {
    let data_dir = &config.data_dir;
    match config.store.driver {
        StoreDriver::Sqlite => {
            let file = data_dir.join("svc.db");
            if file.exists() {
                return Ok(Some(format!("{} exists", file.display())));
            }
        }
        StoreDriver::Postgres => {
            let store = crate::store::open(&config.store, data_dir).await?;
            if !store.list_api_keys().await?.is_empty()
                || !store.audit_chain(0, 1).await?.is_empty()
            {
                return Ok(Some("the PostgreSQL store has rows".into()));
            }
        }
    }
    let jetstream = data_dir.join("jetstream");
    let has_segments = std::fs::read_dir(&jetstream)
        .map(|entries| entries.filter_map(|e| e.ok()).any(|e| e.path().is_dir()))
        .unwrap_or(false);
    if has_segments {
        return Ok(Some(format!("{} exists", jetstream.display())));
    }
    Ok(None)
}

/// Extracts the snapshot into `staging`: `svc.db`, `jetstream/<name>/<segment>`,
/// `policies/<file>`; returns the manifest once every entry checked out.
async fn stage(options: &RestoreOptions<'_>, staging: &Path) -> Result<Manifest> {
    let input = open(options.input, options.passphrase)?;
    let staging = staging.to_path_buf();
    tokio::task::spawn_blocking(move || {
        snapshot::read(input, |entry, data| {
            let target = if entry == snapshot::STORE_ENTRY {
                staging.join("svc.db")
            } else if let Some(rest) = entry.strip_prefix("streams/") {
                match rest.split_once('/') {
                    Some((name, file)) if !file.contains('/') => {
                        staging.join("jetstream").join(name).join(file)
                    }
                    _ => {
                        return Err(Error::Invalid(format!(
                            "snapshot: unexpected entry {entry}"
                        )))
                    }
                }
            } else if let Some(file) = entry.strip_prefix("policies/") {
                if file.contains('/') {
                    return Err(Error::Invalid(format!(
                        "snapshot: unexpected entry {entry}"
                    )));
                }
                staging.join("policies").join(file)
            } else {
                return Err(Error::Invalid(format!(
                    "snapshot: unexpected entry {entry}"
                )));
            };
            copy_to(data, &target)
        })
    })
    .await
    .map_err(Error::internal)?
}

/// Refuses a snapshot whose secrets the configured master key cannot open: restored, the
/// server would refuse to start.
async fn check_master_key(config: &ServerConfig, store_file: &Path) -> Result<()> {
    let Some(master_key) = crate::datadir::decode_master_key(&config.master_key) else {
        return Err(Error::Invalid(
            "the configuration has no valid master_key (base64 of 32 bytes): the restored server could not open its secrets".into(),
        ));
    };
    let store = SqliteStore::open(store_file)?;
    crate::secrets::verify_master_key(&store, &master_key)
        .await
        .map_err(|e| {
            Error::Invalid(format!(
                "the configured master_key does not open this snapshot's secrets ({e}); restore with the source server's master_key"
            ))
        })
}

/// Moves the staged store, streams and policies into place (the lock is held).
async fn swap_in(config: &ServerConfig, staging: &Path, manifest: &Manifest) -> Result<()> {
    let data_dir = &config.data_dir;
    match config.store.driver {
        StoreDriver::Sqlite => {
            let target = data_dir.join("svc.db");
            for suffix in ["-wal", "-shm", "-journal"] {
                let _ = std::fs::remove_file(data_dir.join(format!("svc.db{suffix}")));
            }
            std::fs::rename(staging.join("svc.db"), &target)?;
        }
        StoreDriver::Postgres => copy_into_postgres(config, &staging.join("svc.db")).await?,
    }
    let jetstream = data_dir.join("jetstream");
    std::fs::create_dir_all(&jetstream)?;
    for name in manifest.streams.keys() {
        let target = jetstream.join(name);
        if target.exists() {
            std::fs::remove_dir_all(&target)?;
        }
        std::fs::rename(staging.join("jetstream").join(name), &target)?;
    }
    let policies = staging.join("policies");
    if policies.is_dir() {
        std::fs::create_dir_all(&config.policy_dir).map_err(|e| {
            Error::Unavailable(format!(
                "cannot create the policy dir {}: {e}",
                config.policy_dir.display()
            ))
        })?;
        for entry in std::fs::read_dir(&policies)? {
            let entry = entry?;
            std::fs::copy(entry.path(), config.policy_dir.join(entry.file_name()))?;
        }
    }
    sync_dir(data_dir);
    sync_dir(&jetstream);
    Ok(())
}

fn sync_dir(dir: &Path) {
    if let Ok(handle) = std::fs::File::open(dir) {
        let _ = handle.sync_all();
    }
}

/// The staged SQLite store into the configured PostgreSQL database, through svc-migrate's
/// engine in its --force mode (it empties the target first, and refuses while a server's
/// session is on it).
async fn copy_into_postgres(config: &ServerConfig, store_file: &Path) -> Result<()> {
    use crate::store::copy;
    let source = copy::Source::open(store_file, false)?;
    let target = copy::target_from_url(config.store.url.expose())?;
    let options = copy::CopyOptions {
        force: true,
        batch_rows: copy::DEFAULT_BATCH_ROWS,
    };
    copy::run(source, &target, &options, &mut |_| {}).await?;
    Ok(())
}

/// Opens the restored store as the server will and walks its audit chain again.
async fn verify_restored(config: &ServerConfig, manifest: &Manifest) -> Result<()> {
    let store: Arc<dyn Store> = crate::store::open(&config.store, &config.data_dir).await?;
    let verification = crate::audit::verify(store.as_ref(), &Principal::server()).await?;
    let expected = manifest.audit_head.as_ref().map_or(0, |head| head.seq) as u64;
    if !verification.ok || verification.rows != expected {
        return Err(Error::Internal(format!(
            "the restored store's audit chain does not verify ({} rows of {expected}; {})",
            verification.rows,
            verification.detail.unwrap_or_default()
        )));
    }
    Ok(())
}
