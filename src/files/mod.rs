//! The file service (issue 15, docs/files.md): objects by path and small `kv://bucket/key`
//! values, per cluster, behind one [`ObjectStore`] interface.
//!
//! Owns the rules: remote-path syntax, who may do what (the bus user's API key decides; the
//! declared principal is recorded and may only lower the role), the limits from
//! `files:` in the config, the manifest a put declares and the audit row of every put and
//! delete. It never touches the bus: `server::files` parses messages and calls one function
//! here per operation.
//!
//! Backends: [`local::LocalStore`] keeps objects under `data_dir/files/<cluster>/` (the
//! single-server mode); [`jetstream::JetStreamStore`] keeps them in a JetStream stream on the
//! NATS cluster (cluster mode, `cluster.enabled`). `server::files::start` picks one.
//!
//! Who is calling: on the embedded broker, the key the broker stamps ([`key_principal`]); on
//! an external NATS, the key that signed the request ([`signature`], [`signed_principal`]).

pub mod jetstream;
pub mod local;
pub mod signature;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::audit::Action;
use crate::auth::{Principal, Role};
use crate::config::FilesConfig;
use crate::domain::Domain;
use crate::{Error, Result};

/// The message headers of the bus protocol (docs/files.md), shared by the server's handlers
/// and the CLI.
pub mod wire {
    /// The client's declared principal id, recorded in metadata and audit.
    pub const PRINCIPAL_ID_HEADER: &str = "Svc-Principal-Id";
    /// The client's declared role; refused when above the API key's.
    pub const PRINCIPAL_ROLE_HEADER: &str = "Svc-Principal-Role";
    /// The manifest of a put/commit request, or the object of a get reply, as JSON.
    pub const MANIFEST_HEADER: &str = "Svc-Manifest";
    /// The SHA-256 (hex) of the chunk a `read` asks for or a `chunk` carries.
    pub const CHUNK_HEADER: &str = "Svc-Chunk";
    /// On an error reply: the error code (`not_found`, `permission_denied`, ...).
    pub const ERROR_HEADER: &str = "Svc-Error";
    /// On a `list` reply that is one page of a longer list (`true`): ask again with `after`
    /// the last path for the rest.
    pub const MORE_HEADER: &str = "Svc-More";
}

/// The cluster the server keeps stored state plans in (`fleet::content`): admin keys only,
/// since a plan can carry secret template values.
pub const STATE_CLUSTER: &str = "svc-state";

/// Largest `kv://` value.
pub const MAX_KV_SIZE: u64 = 1024 * 1024;
/// The most levels of chunk lists a commit may name (`list_depth`): each level is the one
/// below packed into chunks, so 8 levels reach past any object size at any chunk size.
pub const MAX_LIST_DEPTH: u32 = 8;

/// Bytes of a file-service message left for its body under `max_payload` (the bus's, from
/// INFO): up to [`crate::config::FILES_HEADER_ROOM`] is kept for headers (the manifest, the
/// chunk hash, the request signature, the sender the broker stamps), but never more than
/// half, so that a small `max_payload` still carries a body.
pub fn body_capacity(max_payload: u64) -> u64 {
    max_payload - crate::config::FILES_HEADER_ROOM.min(max_payload / 2)
}

/// The chunk size the file service uses: `files.chunk_size`, lowered so that a chunk fits in
/// one bus message with its headers. With the default 1 MiB `max_payload` that is the
/// configured 256 KiB; with nats.py's 1 KiB test servers, 512 bytes.
pub fn chunk_size_for(configured: u64, max_payload: u64) -> u64 {
    configured.min(body_capacity(max_payload)).max(1)
}

/// How many 32-byte chunk hashes one message body carries (a page of a chunk list).
pub fn hashes_per_message(max_payload: u64) -> usize {
    ((body_capacity(max_payload) / 32) as usize).max(1)
}
/// Longest remote path or key, in bytes.
const MAX_PATH_LEN: usize = 1024;
/// Longest cluster or bucket name.
const MAX_NAME_LEN: usize = 64;

/// A remote path: a file path, or a value in a key-value bucket.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Remote {
    /// `a/b.txt` (a leading `/` is dropped).
    File(String),
    /// `kv://bucket/key`.
    Kv { bucket: String, key: String },
}

impl Remote {
    /// Parses and normalizes what a user typed; errors say what is wrong.
    pub fn parse(text: &str) -> Result<Remote> {
        if let Some(rest) = text.strip_prefix("kv://") {
            let Some((bucket, key)) = rest.split_once('/') else {
                return Err(Error::Invalid(format!(
                    "'{text}': a kv path is kv://BUCKET/KEY"
                )));
            };
            check_name("bucket", bucket)?;
            check_path(key).map_err(|e| Error::Invalid(format!("'{text}': {e}")))?;
            return Ok(Remote::Kv {
                bucket: bucket.to_string(),
                key: key.to_string(),
            });
        }
        if text.contains("://") {
            return Err(Error::Invalid(format!(
                "'{text}': only bare paths and kv://BUCKET/KEY are remote paths"
            )));
        }
        let path = text.trim_start_matches('/');
        check_path(path).map_err(|e| Error::Invalid(format!("'{text}': {e}")))?;
        Ok(Remote::File(path.to_string()))
    }

    /// The canonical form, as list and stat show it.
    pub fn display(&self) -> String {
        match self {
            Remote::File(path) => path.clone(),
            Remote::Kv { bucket, key } => format!("kv://{bucket}/{key}"),
        }
    }

    /// The size limit for this kind of path: the config's for files, 1 MiB for kv values.
    fn max_size(&self, limits: &FilesConfig) -> (u64, &'static str) {
        match self {
            Remote::File(_) => (limits.max_object_size, "files.max_object_size"),
            Remote::Kv { .. } => (MAX_KV_SIZE, "the kv value limit"),
        }
    }
}

/// Path segments are non-empty, not `.` or `..`, printable, without control characters.
fn check_path(path: &str) -> std::result::Result<(), String> {
    if path.is_empty() {
        return Err("the path is empty".into());
    }
    if path.len() > MAX_PATH_LEN {
        return Err(format!("the path is longer than {MAX_PATH_LEN} bytes"));
    }
    if path.chars().any(char::is_control) {
        return Err("the path has control characters".into());
    }
    for segment in path.split('/') {
        if segment.is_empty() || segment == "." || segment == ".." {
            return Err("empty, '.' and '..' segments are not allowed".into());
        }
    }
    Ok(())
}

/// Cluster and bucket names: one bus subject token, `[A-Za-z0-9_-]{1,64}`.
pub fn check_name(what: &str, name: &str) -> Result<()> {
    let is_valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if is_valid {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{what} '{name}' must be 1-{MAX_NAME_LEN} of A-Z a-z 0-9 - _"
        )))
    }
}

/// Who stored an object: the key that authorized it and what the client declared.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Writer {
    pub key_id: String,
    pub key_name: String,
    /// `--principal-id`, when the client sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal_id: Option<String>,
    /// The role the write ran with (the declared one, or the key's).
    pub role: String,
}

/// What a put declares: the whole object's size and SHA-256 and every chunk's SHA-256.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub size: u64,
    pub sha256: String,
    pub chunk_size: u64,
    pub chunks: Vec<String>,
}

impl Manifest {
    /// How many chunks the object has.
    pub fn chunk_count(&self) -> Result<u64> {
        if self.chunk_size == 0 {
            return Err(Error::Invalid("chunk_size must be positive".into()));
        }
        Ok(self.size.div_ceil(self.chunk_size))
    }

    /// Checks a page of the chunk list, `chunks` being the hashes from index `from` on: they
    /// are hex and within the object's chunk count.
    pub fn check_page(&self, from: u64) -> Result<()> {
        let expected = self.chunk_count()?;
        if from + self.chunks.len() as u64 > expected {
            return Err(Error::Invalid(format!(
                "chunks {from}..{} declared; {} bytes in chunks of {} have {expected}",
                from + self.chunks.len() as u64,
                self.size,
                self.chunk_size
            )));
        }
        self.check_hashes()
    }

    /// Checks the shape: the chunk count matches size and chunk size, hashes are hex.
    pub fn check(&self) -> Result<()> {
        let expected = self.chunk_count()?;
        if self.chunks.len() as u64 != expected {
            return Err(Error::Invalid(format!(
                "{} chunks declared; {} bytes in chunks of {} need {expected}",
                self.chunks.len(),
                self.size,
                self.chunk_size
            )));
        }
        self.check_hashes()
    }

    /// Every chunk hash and the whole file's are SHA-256 in hex.
    fn check_hashes(&self) -> Result<()> {
        for hash in self.chunks.iter().chain([&self.sha256]) {
            if !is_sha256_hex(hash) {
                return Err(Error::Invalid(format!("'{hash}' is not a SHA-256 (hex)")));
            }
        }
        Ok(())
    }
}

/// One object's metadata record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// The canonical remote path (`a/b`, `kv://bucket/key`).
    pub path: String,
    pub size: u64,
    pub sha256: String,
    pub chunk_size: u64,
    /// Chunk hashes in order; left out of list and stat answers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<String>,
    pub created_at: String,
    pub updated_at: String,
    pub writer: Writer,
}

impl ObjectMeta {
    /// The record without its chunk list (what list and stat show).
    pub fn summary(mut self) -> ObjectMeta {
        self.chunks = Vec::new();
        self
    }
}

/// Chunk hashes (hex) as 32 raw bytes each: how a chunk list travels and is stored when it
/// does not fit one message (the file service's list pages and stored lists, a stored plan's
/// list).
pub fn pack_hashes(chunks: &[String]) -> Result<Vec<u8>> {
    let mut packed = Vec::with_capacity(chunks.len() * 32);
    for chunk in chunks {
        let bytes = hex::decode(chunk)
            .map_err(|_| Error::Internal(format!("damaged chunk hash '{chunk}'")))?;
        packed.extend_from_slice(&bytes);
    }
    Ok(packed)
}

pub fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Where objects live. Every method is atomic per object: `commit` makes an object visible
/// whole (its chunks were written before), `delete` removes it whole; nothing else changes
/// what `stat` and `list` see.
///
/// Implementations: [`local::LocalStore`] (disk, single server) and
/// [`jetstream::JetStreamStore`] (cluster mode: chunks and records as messages of one
/// JetStream stream).
#[async_trait]
pub trait ObjectStore: Send + Sync {
    async fn stat(&self, cluster: &str, remote: &Remote) -> Result<Option<ObjectMeta>>;
    /// Every object whose canonical path starts with `prefix`, sorted by path.
    async fn list(&self, cluster: &str, prefix: &str) -> Result<Vec<ObjectMeta>>;
    /// The indices of `chunks` this store does not hold (the resumable part of a put).
    async fn missing_chunks(&self, cluster: &str, chunks: &[String]) -> Result<Vec<usize>>;
    /// Stores one chunk under its SHA-256, which the caller has checked.
    async fn write_chunk(&self, cluster: &str, sha256: &str, bytes: Bytes) -> Result<()>;
    /// A chunk's bytes as stored (the reader checks the hash); NotFound if absent.
    async fn read_chunk(&self, cluster: &str, sha256: &str) -> Result<Bytes>;
    /// Makes `meta` visible at `remote` atomically; every chunk must already be stored.
    async fn commit(&self, cluster: &str, remote: &Remote, meta: &ObjectMeta) -> Result<()>;
    /// Removes the object; false when there was none.
    async fn delete(&self, cluster: &str, remote: &Remote) -> Result<bool>;
}

/// The file service: a backend, the limits, and the rules.
pub struct Files {
    store: Arc<dyn ObjectStore>,
    limits: FilesConfig,
    /// The bus's `max_payload` now (the embedded broker's, or the external cluster's from
    /// its INFO), which the chunk size must fit; None: unknown, the configured size is used.
    max_payload: Option<Box<dyn Fn() -> u64 + Send + Sync>>,
}

/// Who is calling: the API key the bus connection authenticated with, and the principal the
/// client declared in its headers (recorded; the role may only be lowered).
#[derive(Clone, Debug)]
pub struct Caller {
    pub key: Principal,
    pub declared_id: Option<String>,
    pub declared_role: Option<Role>,
}

impl Caller {
    /// The principal a request runs as: the key's, with the declared role if it is not
    /// higher. A declared role above the key's is refused (never an escalation).
    fn principal(&self) -> Result<Principal> {
        let mut principal = self.key.clone();
        if let Some(declared) = self.declared_role {
            if declared > self.key.role {
                return Err(Error::Forbidden(format!(
                    "declared role '{declared}' is higher than the API key's role '{}'",
                    self.key.role
                )));
            }
            principal.role = declared;
        }
        Ok(principal)
    }

    fn writer(&self, role: Role) -> Writer {
        Writer {
            key_id: self.key.id.clone(),
            key_name: self.key.name.clone(),
            principal_id: self.declared_id.clone(),
            role: role.to_string(),
        }
    }
}

/// What a client needs before a put: the chunk size and the limits.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Limits {
    pub chunk_size: u64,
    pub max_object_size: u64,
    pub max_kv_size: u64,
}

impl Files {
    /// The service over one backend (the hook for cluster mode's JetStream backend).
    pub fn new(store: Arc<dyn ObjectStore>, limits: FilesConfig) -> Files {
        Files {
            store,
            limits,
            max_payload: None,
        }
    }

    /// Chunks sized for the bus `max_payload` reports, read at each use: in cluster mode it
    /// is the external nats-server's, known once connected.
    pub fn with_max_payload(
        mut self,
        max_payload: impl Fn() -> u64 + Send + Sync + 'static,
    ) -> Files {
        self.max_payload = Some(Box::new(max_payload));
        self
    }

    fn bus_max_payload(&self) -> Option<u64> {
        self.max_payload
            .as_ref()
            .map(|read| read())
            .filter(|max| *max > 0)
    }

    /// The chunk size new objects get (and a put must declare): `files.chunk_size`, lowered
    /// to fit the bus's `max_payload` ([`chunk_size_for`]). Stored objects keep the chunk size
    /// they were put with; a chunk larger than a message now is read in pieces.
    pub fn chunk_size(&self) -> u64 {
        match self.bus_max_payload() {
            Some(max_payload) => chunk_size_for(self.limits.chunk_size, max_payload),
            None => self.limits.chunk_size,
        }
    }

    /// The most bytes of a chunk one `read` answers: all of it when it fits in a message,
    /// whatever chunk size it was put with.
    pub fn read_piece(&self) -> usize {
        match self.bus_max_payload() {
            Some(max_payload) => body_capacity(max_payload) as usize,
            None => usize::MAX,
        }
    }

    /// How many chunk hashes one message carries (a page of a `get`'s chunk list).
    pub fn hashes_per_message(&self) -> usize {
        match self.bus_max_payload() {
            Some(max_payload) => hashes_per_message(max_payload),
            None => usize::MAX,
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            chunk_size: self.chunk_size(),
            max_object_size: self.limits.max_object_size,
            max_kv_size: MAX_KV_SIZE,
        }
    }

    /// The role check first (so a refused caller learns nothing), then the cluster.
    fn admit(&self, caller: &Caller, cluster: &str, needed: Role) -> Result<Principal> {
        let principal = caller.principal()?;
        principal.require(needed)?;
        check_name("cluster", cluster)?;
        if cluster == STATE_CLUSTER && principal.role < Role::Admin {
            return Err(Error::Forbidden(format!(
                "cluster '{STATE_CLUSTER}' holds the server's stored state plans: admin keys only"
            )));
        }
        let allowed = [&caller.key.id, &caller.key.name]
            .iter()
            .find_map(|name| self.limits.key_clusters.get(name.as_str()));
        if let Some(clusters) = allowed {
            if !clusters.iter().any(|c| c == cluster) {
                return Err(Error::Forbidden(format!(
                    "API key '{}' may not use cluster '{cluster}' (files.key_clusters)",
                    caller.key.name
                )));
            }
        }
        Ok(principal)
    }

    pub async fn stat(&self, caller: &Caller, cluster: &str, path: &str) -> Result<ObjectMeta> {
        self.admit(caller, cluster, Role::Readonly)?;
        let remote = Remote::parse(path)?;
        self.store
            .stat(cluster, &remote)
            .await?
            .map(ObjectMeta::summary)
            .ok_or_else(|| not_found(cluster, &remote))
    }

    pub async fn list(
        &self,
        caller: &Caller,
        cluster: &str,
        prefix: &str,
    ) -> Result<Vec<ObjectMeta>> {
        self.admit(caller, cluster, Role::Readonly)?;
        let prefix = prefix.trim_start_matches('/');
        let objects = self.store.list(cluster, prefix).await?;
        Ok(objects.into_iter().map(ObjectMeta::summary).collect())
    }

    /// The whole record, chunk list included, for a get.
    pub async fn open(&self, caller: &Caller, cluster: &str, path: &str) -> Result<ObjectMeta> {
        self.admit(caller, cluster, Role::Readonly)?;
        let remote = Remote::parse(path)?;
        self.store
            .stat(cluster, &remote)
            .await?
            .ok_or_else(|| not_found(cluster, &remote))
    }

    pub async fn read_chunk(&self, caller: &Caller, cluster: &str, sha256: &str) -> Result<Bytes> {
        self.admit(caller, cluster, Role::Readonly)?;
        if !is_sha256_hex(sha256) {
            return Err(Error::Invalid(format!("'{sha256}' is not a SHA-256 (hex)")));
        }
        self.store.read_chunk(cluster, sha256).await
    }

    /// The first step of a put: checks the role, the limits and the quota, and answers which
    /// chunks the server lacks (all of them for a new object; fewer for a retried one).
    ///
    /// `manifest.chunks` may be a page of the chunk list, from index `from` on (a list too
    /// long for one message is asked about in pages); the answer's indices are the object's.
    pub async fn begin_put(
        &self,
        domain: &Domain,
        caller: &Caller,
        cluster: &str,
        path: &str,
        manifest: &Manifest,
        from: u64,
    ) -> Result<Vec<usize>> {
        let result = domain
            .auditor
            .gate(
                &caller.key,
                put_action(caller, cluster, path, manifest),
                self.check_put(caller, cluster, path, manifest, Some(from)),
            )
            .await;
        let result = match result {
            Ok(()) => self
                .store
                .missing_chunks(cluster, &manifest.chunks)
                .await
                .map(|missing| missing.into_iter().map(|i| i + from as usize).collect()),
            Err(error) => Err(error),
        };
        // A refused put is audited here; an accepted one when it commits.
        if matches!(result, Err(Error::Forbidden(_))) {
            let action = put_action(caller, cluster, path, manifest);
            domain.auditor.record(&caller.key, action, &result).await;
        }
        result
    }

    /// `page`: the manifest's chunks are a page from that index on; None: the whole list.
    async fn check_put(
        &self,
        caller: &Caller,
        cluster: &str,
        path: &str,
        manifest: &Manifest,
        page: Option<u64>,
    ) -> Result<()> {
        self.admit(caller, cluster, Role::Operator)?;
        let remote = Remote::parse(path)?;
        match page {
            Some(from) => manifest.check_page(from)?,
            None => manifest.check()?,
        }
        let chunk_size = self.chunk_size();
        if manifest.chunk_size != chunk_size {
            return Err(Error::Invalid(format!(
                "chunk size {} differs from the service's ({chunk_size}: files.chunk_size, \
                 at most what fits in bus.max_payload)",
                manifest.chunk_size
            )));
        }
        let (max, limit) = remote.max_size(&self.limits);
        if manifest.size > max {
            return Err(Error::Invalid(format!(
                "{} is {} bytes, over {limit} ({max} bytes)",
                remote.display(),
                manifest.size
            )));
        }
        if self.limits.cluster_quota > 0 {
            let used: u64 = self
                .store
                .list(cluster, "")
                .await?
                .iter()
                .filter(|object| object.path != remote.display())
                .map(|object| object.size)
                .sum();
            if used + manifest.size > self.limits.cluster_quota {
                return Err(Error::Invalid(format!(
                    "cluster '{cluster}' would hold {} bytes, over files.cluster_quota ({} bytes)",
                    used + manifest.size,
                    self.limits.cluster_quota
                )));
            }
        }
        Ok(())
    }

    /// Stores one chunk of a put after checking its SHA-256.
    pub async fn write_chunk(
        &self,
        caller: &Caller,
        cluster: &str,
        sha256: &str,
        bytes: Bytes,
    ) -> Result<()> {
        self.admit(caller, cluster, Role::Operator)?;
        let chunk_size = self.chunk_size();
        if bytes.len() as u64 > chunk_size {
            return Err(Error::Invalid(format!(
                "a chunk of {} bytes is over the chunk size ({chunk_size})",
                bytes.len(),
            )));
        }
        let actual = sha256_hex(&bytes);
        if actual != sha256 {
            return Err(Error::Invalid(format!(
                "chunk SHA-256 mismatch: declared {sha256}, received {actual}"
            )));
        }
        self.store.write_chunk(cluster, sha256, bytes).await
    }

    /// The last step of a put: every chunk is there, so the object becomes visible whole.
    /// Writes the audit row.
    ///
    /// With `list_depth` 0 `manifest.chunks` is the chunk list; past it, a list too long for
    /// one message was sent as chunks, and `manifest.chunks` lists those (and so on up).
    pub async fn commit_put(
        &self,
        domain: &Domain,
        caller: &Caller,
        cluster: &str,
        path: &str,
        manifest: &Manifest,
        list_depth: u32,
    ) -> Result<ObjectMeta> {
        let result = domain
            .auditor
            .gate(
                &caller.key,
                put_action(caller, cluster, path, manifest),
                async {
                    self.admit(caller, cluster, Role::Operator)?;
                    let manifest = self.resolve_list(cluster, manifest, list_depth).await?;
                    self.commit_checked(caller, cluster, path, &manifest).await
                },
            )
            .await;
        let action = put_action(caller, cluster, path, manifest);
        domain.auditor.record(&caller.key, action, &result).await;
        result
    }

    /// The manifest with its whole chunk list: `list_depth` times, the listed chunks (which
    /// the client sent with `chunk`, hashes checked there) are read and their bytes taken as
    /// the next level's 32-byte hashes. Stateless, so any member of a cluster can commit.
    async fn resolve_list(
        &self,
        cluster: &str,
        manifest: &Manifest,
        list_depth: u32,
    ) -> Result<Manifest> {
        if list_depth > MAX_LIST_DEPTH {
            return Err(Error::Invalid(format!(
                "list_depth {list_depth} is over {MAX_LIST_DEPTH}"
            )));
        }
        let longest = manifest.chunk_count()?.saturating_mul(32);
        let mut chunks = manifest.chunks.clone();
        for _ in 0..list_depth {
            let mut packed = Vec::new();
            for hash in &chunks {
                if !is_sha256_hex(hash) {
                    return Err(Error::Invalid(format!("'{hash}' is not a SHA-256 (hex)")));
                }
                let bytes = self
                    .store
                    .read_chunk(cluster, hash)
                    .await
                    .map_err(|e| match e {
                        Error::NotFound(_) => Error::Conflict(format!(
                        "chunk {hash} of the chunk list has not arrived; send it and commit again"
                    )),
                        other => other,
                    })?;
                if sha256_hex(&bytes) != *hash {
                    return Err(Error::Internal(format!(
                        "chunk {hash} of cluster '{cluster}' does not match its SHA-256"
                    )));
                }
                packed.extend_from_slice(&bytes);
                if packed.len() as u64 > longest {
                    return Err(Error::Invalid(
                        "the chunk list is longer than the object's chunks".into(),
                    ));
                }
            }
            if packed.len() % 32 != 0 {
                return Err(Error::Invalid(
                    "the chunk list must be whole 32-byte SHA-256s".into(),
                ));
            }
            chunks = packed.chunks(32).map(hex::encode).collect();
        }
        Ok(Manifest {
            chunks,
            ..manifest.clone()
        })
    }

    async fn commit_checked(
        &self,
        caller: &Caller,
        cluster: &str,
        path: &str,
        manifest: &Manifest,
    ) -> Result<ObjectMeta> {
        self.check_put(caller, cluster, path, manifest, None)
            .await?;
        let principal = caller.principal()?;
        let remote = Remote::parse(path)?;
        let missing = self.store.missing_chunks(cluster, &manifest.chunks).await?;
        if !missing.is_empty() {
            return Err(Error::Conflict(format!(
                "{} of {} chunks have not arrived; send them and commit again",
                missing.len(),
                manifest.chunks.len()
            )));
        }
        let now = crate::clock::now_rfc3339();
        let created_at = match self.store.stat(cluster, &remote).await? {
            Some(previous) => previous.created_at,
            None => now.clone(),
        };
        let meta = ObjectMeta {
            path: remote.display(),
            size: manifest.size,
            sha256: manifest.sha256.clone(),
            chunk_size: manifest.chunk_size,
            chunks: manifest.chunks.clone(),
            created_at,
            updated_at: now,
            writer: caller.writer(principal.role),
        };
        self.store.commit(cluster, &remote, &meta).await?;
        Ok(meta.summary())
    }

    /// Stores `bytes` at `path` for the server itself (the state plans agents fetch,
    /// `fleet::content`): no caller and no audit row, since the operation that needs the object
    /// is audited; chunks already held are not written again, and an object already there
    /// with the same content is left alone. Returns the object's record with its chunks.
    pub async fn put_own(&self, cluster: &str, path: &str, bytes: &[u8]) -> Result<ObjectMeta> {
        let remote = Remote::parse(path)?;
        let chunk_size = self.chunk_size();
        let pieces: Vec<&[u8]> = bytes.chunks(chunk_size as usize).collect();
        let chunks: Vec<String> = pieces.iter().map(|piece| sha256_hex(piece)).collect();
        // Even for an object already there: a chunk lost since is written again.
        for index in self.store.missing_chunks(cluster, &chunks).await? {
            let piece = Bytes::copy_from_slice(pieces[index]);
            self.store
                .write_chunk(cluster, &chunks[index], piece)
                .await?;
        }
        let sha256 = sha256_hex(bytes);
        if let Some(existing) = self.store.stat(cluster, &remote).await? {
            if existing.sha256 == sha256 && existing.chunks == chunks {
                return Ok(existing);
            }
        }
        let now = crate::clock::now_rfc3339();
        let meta = ObjectMeta {
            path: remote.display(),
            size: bytes.len() as u64,
            sha256,
            chunk_size,
            chunks,
            created_at: now.clone(),
            updated_at: now,
            writer: Writer {
                key_id: "server".into(),
                key_name: "server".into(),
                principal_id: None,
                role: Role::Admin.to_string(),
            },
        };
        self.store.commit(cluster, &remote, &meta).await?;
        Ok(meta)
    }

    /// A chunk the server reads for itself or for an agent it has checked; the hash is
    /// checked here, so a damaged store answers an error rather than wrong bytes.
    pub async fn read_own_chunk(&self, cluster: &str, sha256: &str) -> Result<Bytes> {
        let bytes = self.store.read_chunk(cluster, sha256).await?;
        if sha256_hex(&bytes) != sha256 {
            return Err(Error::Internal(format!(
                "chunk {sha256} of cluster '{cluster}' does not match its SHA-256"
            )));
        }
        Ok(bytes)
    }

    /// Deletes an object; writes the audit row.
    pub async fn delete(
        &self,
        domain: &Domain,
        caller: &Caller,
        cluster: &str,
        path: &str,
    ) -> Result<()> {
        let result = domain
            .auditor
            .gate(
                &caller.key,
                Action::new("file.delete", "file", format!("{cluster}:{path}")),
                async {
                    self.admit(caller, cluster, Role::Operator)?;
                    let remote = Remote::parse(path)?;
                    if self.store.delete(cluster, &remote).await? {
                        Ok(())
                    } else {
                        Err(not_found(cluster, &remote))
                    }
                },
            )
            .await;
        let action = Action::new("file.delete", "file", format!("{cluster}:{path}")).detail(
            serde_json::json!({
                "cluster": cluster,
                "path": path,
                "principal_id": caller.declared_id,
                "principal_role": caller.declared_role.map(|r| r.to_string()),
            }),
        );
        domain.auditor.record(&caller.key, action, &result).await;
        result
    }
}

/// The principal of the API key with id `key_id` (what the broker stamps on a request):
/// looked up on every request, so a deleted or expired key fails at once. Agents, the
/// server's own client and connections without a key are not API keys and are refused.
pub async fn key_principal(store: &dyn crate::store::Store, key_id: &str) -> Result<Principal> {
    let refused = || Error::Unauthenticated("an API key is required (--api-key)".into());
    if key_id.is_empty() || key_id == "anonymous" || key_id.contains(':') || key_id == "server" {
        return Err(refused());
    }
    let row = store.get_api_key(key_id).await?.ok_or_else(refused)?;
    row_principal(row)
}

/// The principal of the API key that signed a request (external NATS): the key is found by
/// the signature's key id among the stored keys (every request: a deleted or expired key fails
/// at once), then the MAC is checked with its signing key, which the store keeps sealed
/// (`auth::signing_key`, opened with the at-rest key).
///
/// The lookup reads every key row and opens and tags each signing key: the store has no index
/// by tag (the tag derives from the key the store must not hold in the clear), and the number
/// of API keys is small. (A key cache in `auth` can replace the read.)
pub async fn signed_principal(
    store: &dyn crate::store::Store,
    at_rest: &crate::secrets::crypto::AeadKey,
    key_ids: &signature::KeyIds,
    signature: &signature::Signature,
    request: &signature::Request<'_>,
) -> Result<Principal> {
    let refused = || Error::Unauthenticated("the request's signing key is not an API key".into());
    let opened = |row: crate::store::ApiKeyRow| {
        let key = crate::auth::signing_key(at_rest, &row)?;
        Some((signature::key_id(&key), row, key))
    };
    // The row this key id was last seen on, read again (so a deleted key fails at once).
    let cached = match key_ids.row_of(&signature.key_id) {
        Some(row_id) => store
            .get_api_key(&row_id)
            .await?
            .and_then(opened)
            .filter(|(key_id, _, _)| *key_id == signature.key_id),
        None => None,
    };
    let (row, key) = match cached {
        Some((_, row, key)) => (row, key),
        None => {
            // Unknown here (a key made since, or none): open every row, noting each. Every
            // row, not only those not noted yet: a scan running beside this one may have
            // noted the row this request needs after this one's lookup missed it.
            key_ids.forget(&signature.key_id);
            let mut found = None;
            for row in store.list_api_keys().await? {
                let Some((key_id, row, key)) = opened(row) else {
                    continue;
                };
                key_ids.note(&key_id, &row.id);
                if key_id == signature.key_id {
                    found = Some((row, key));
                }
            }
            found.ok_or_else(refused)?
        }
    };
    signature.verify(&key, request)?;
    row_principal(row)
}

/// A key row as a principal, refused when expired.
fn row_principal(row: crate::store::ApiKeyRow) -> Result<Principal> {
    if let Some(expiry) = row
        .expires_at
        .as_deref()
        .and_then(crate::clock::parse_rfc3339)
    {
        if expiry <= crate::clock::now_millis() {
            return Err(Error::Unauthenticated("API key expired".into()));
        }
    }
    Ok(Principal {
        id: row.id,
        name: row.name,
        role: row.role.parse()?,
    })
}

fn put_action(caller: &Caller, cluster: &str, path: &str, manifest: &Manifest) -> Action {
    Action::new("file.put", "file", format!("{cluster}:{path}")).detail(serde_json::json!({
        "cluster": cluster,
        "path": path,
        "size": manifest.size,
        "sha256": manifest.sha256,
        "principal_id": caller.declared_id,
        "principal_role": caller.declared_role.map(|r| r.to_string()),
    }))
}

fn not_found(cluster: &str, remote: &Remote) -> Error {
    Error::NotFound(format!(
        "'{}' not found in cluster '{cluster}'",
        remote.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_paths() {
        let cases = [
            ("a/b.txt", Some("a/b.txt")),
            ("/a/b", Some("a/b")),
            ("kv://cfg/db/url", Some("kv://cfg/db/url")),
            ("kv://cfg", None),
            ("kv://c.d/x", None),
            ("a/../b", None),
            ("a//b", None),
            ("", None),
            ("s3://x/y", None),
            ("a/\nb", None),
        ];
        for (text, expected) in cases {
            let parsed = Remote::parse(text).ok().map(|r| r.display());
            assert_eq!(parsed.as_deref(), expected, "{text:?}");
        }
    }

    #[test]
    fn chunks_fit_the_bus() {
        const CONFIGURED: u64 = 256 * 1024;
        // The default bus keeps the configured chunk size, and its 5 GiB chunk list whole.
        assert_eq!(chunk_size_for(CONFIGURED, 1024 * 1024), CONFIGURED);
        assert!(hashes_per_message(1024 * 1024) >= 20480);
        // Smaller buses: 4 KiB of headers at most, half the message at most.
        assert_eq!(chunk_size_for(CONFIGURED, 64 * 1024), 60 * 1024);
        assert_eq!(chunk_size_for(CONFIGURED, 4096), 2048);
        assert_eq!(chunk_size_for(CONFIGURED, 1024), 512);
        assert_eq!(hashes_per_message(1024), 16);
        assert_eq!(chunk_size_for(CONFIGURED, 1), 1);
        assert_eq!(hashes_per_message(1), 1);
    }

    #[test]
    fn manifest_pages() {
        let hash = "0".repeat(64);
        let manifest = Manifest {
            size: 100,
            sha256: hash.clone(),
            chunk_size: 10,
            chunks: vec![hash.clone(); 4],
        };
        assert!(manifest.check_page(0).is_ok());
        assert!(manifest.check_page(6).is_ok());
        assert!(manifest.check_page(7).is_err());
        assert!(manifest.check().is_err());
    }

    #[test]
    fn manifest_shape() {
        let hash = "0".repeat(64);
        let manifest = |size, chunks: usize| Manifest {
            size,
            sha256: hash.clone(),
            chunk_size: 10,
            chunks: vec![hash.clone(); chunks],
        };
        assert!(manifest(0, 0).check().is_ok());
        assert!(manifest(10, 1).check().is_ok());
        assert!(manifest(11, 2).check().is_ok());
        assert!(manifest(11, 1).check().is_err());
        assert!(manifest(0, 1).check().is_err());
    }

    #[test]
    fn declared_role_may_only_lower() {
        let key = Principal {
            id: "k".into(),
            name: "k".into(),
            role: Role::Operator,
        };
        let caller = |role| Caller {
            key: key.clone(),
            declared_id: None,
            declared_role: role,
        };
        assert_eq!(caller(None).principal().unwrap().role, Role::Operator);
        assert_eq!(
            caller(Some(Role::Readonly)).principal().unwrap().role,
            Role::Readonly
        );
        assert!(caller(Some(Role::Admin)).principal().is_err());
    }
}
