//! The cluster-mode backend: objects in one JetStream stream on the NATS cluster, so every
//! member serves every object (docs/files.md, "Cluster mode").
//!
//! Layout: the stream `SVC_FILES` (file storage, min(3, cluster size) replicas, at most one
//! message per subject) on subjects
//! ```text
//! svc.filestore.<cluster>.c.<sha256>        one content-addressed chunk (payload: its bytes)
//! svc.filestore.<cluster>.m.<hex(path)>     one metadata record per canonical path
//! ```
//! A record is header `Svc-Manifest: <object JSON without chunks>` and a body of the chunks'
//! raw 32-byte SHA-256s (what the wire protocol sends: 640 KiB for 5 GiB in 256 KiB chunks,
//! under the 1 MiB NATS payload limit, where JSON would not be). `kv://` values are records of
//! their canonical path `kv://bucket/key`, with their bytes in chunks like files.
//!
//! A chunk list longer than the nats-server's `max_payload` leaves room for (a small one, from
//! its INFO) is itself stored as chunks, and the record lists those, with header
//! `Svc-List-Depth: <levels>` (as a `commit` request does, `Files::commit_put`). Those chunks
//! are referred to by the record: garbage collection, when cluster mode has one, must follow
//! them.
//!
//! Atomic per object: a commit is one publish of the record (acknowledged by the stream's
//! quorum), after every chunk was acknowledged; a replacement is the next message on the same
//! subject, and the one-message-per-subject limit drops the old one, so a reader sees the
//! old record or the new one. A delete purges the record's subject. An interrupted put leaves
//! chunks and no record: nothing is listed, and the retried put finds the chunks.
//!
//! Plain streams rather than JetStream's object store: the object store keeps one object's
//! chunks under that object (no sharing between objects, no asking "which of these chunks do
//! you have"), and a resumable put needs exactly that question. This needs only the
//! `jetstream` feature, and nats-server 2.9's per-subject limits, purge by subject and stream
//! info with a subjects filter.
//!
//! Reads of records go to the stream leader (`STREAM.MSG.GET`): a record committed through
//! one member is seen at once through every other. Chunks are read with direct gets, which
//! any replica answers; a replica that has not applied a chunk yet answers "not found", and
//! the read then asks the leader (a chunk's content is its hash: a replica can be behind,
//! never wrong).

use std::time::Duration;

use async_nats::jetstream::{self, stream as js};
use async_nats::HeaderMap;
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};

use super::wire::MANIFEST_HEADER;
use super::{ObjectMeta, ObjectStore, Remote, MAX_LIST_DEPTH};
use crate::{Error, Result};

/// The JetStream stream that holds every cluster's objects.
pub const STREAM_NAME: &str = "SVC_FILES";
/// Its subjects' common prefix.
const SUBJECT_PREFIX: &str = "svc.filestore";
/// What one JetStream API request may take (a chunk publish waits for the quorum).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `open` keeps trying while the NATS cluster forms.
const OPEN_RETRY_FOR: Duration = Duration::from_secs(30);
/// Requests in flight while asking which chunks exist or reading records for a list.
const PARALLEL: usize = 32;
/// On a record whose body lists chunks holding its chunk list: how many levels.
const LIST_DEPTH_HEADER: &str = "Svc-List-Depth";
/// Bytes kept free in a record message beside its headers and body (the publish's own).
const RECORD_SLACK: usize = 256;

pub struct JetStreamStore {
    context: jetstream::Context,
    stream: js::Stream<()>,
}

/// The stream's configuration.
pub fn stream_config(replicas: usize) -> js::Config {
    js::Config {
        name: STREAM_NAME.to_string(),
        description: Some("svc-files objects (docs/files.md)".to_string()),
        subjects: vec![format!("{SUBJECT_PREFIX}.>")],
        storage: js::StorageType::File,
        num_replicas: replicas.max(1),
        retention: js::RetentionPolicy::Limits,
        discard: js::DiscardPolicy::Old,
        // A chunk written again, or a record replaced, keeps only the newest message.
        max_messages_per_subject: 1,
        max_messages: -1,
        max_bytes: -1,
        max_message_size: -1,
        max_consumers: -1,
        allow_direct: true,
        ..Default::default()
    }
}

fn chunk_subject(cluster: &str, sha256: &str) -> String {
    format!("{SUBJECT_PREFIX}.{cluster}.c.{sha256}")
}

fn record_subject(cluster: &str, remote: &Remote) -> String {
    format!(
        "{SUBJECT_PREFIX}.{cluster}.m.{}",
        hex::encode(remote.display())
    )
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Unavailable(format!("files (JetStream {STREAM_NAME}): {what}: {e}"))
}

impl JetStreamStore {
    /// Creates (or brings to `replicas`) the stream, retrying while the NATS cluster forms.
    pub async fn open(client: async_nats::Client, replicas: usize) -> Result<JetStreamStore> {
        let mut context = jetstream::new(client);
        context.set_timeout(REQUEST_TIMEOUT);
        let deadline = tokio::time::Instant::now() + OPEN_RETRY_FOR;
        let started = tokio::time::Instant::now();
        loop {
            match context
                .create_or_update_stream(stream_config(replicas))
                .await
            {
                Ok(_) => break,
                Err(e)
                    if crate::stream::jetstream::is_no_peers(&e)
                        && started.elapsed() < crate::stream::jetstream::NO_PEERS_GRACE =>
                {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e)
                    if !crate::stream::jetstream::is_transient(&e)
                        || tokio::time::Instant::now() >= deadline =>
                {
                    return Err(unavailable("create or update", e));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "JetStream not ready for files; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        let stream = context
            .get_stream_no_info(STREAM_NAME)
            .await
            .map_err(|e| unavailable("open", e))?;
        tracing::info!(stream = STREAM_NAME, replicas, "files in JetStream");
        Ok(JetStreamStore { context, stream })
    }

    /// A record by subject, from the stream leader, and how many levels of stored chunk
    /// lists its chunk list is behind (0: it is the record's); None when there is none.
    async fn record(&self, subject: &str) -> Result<Option<(ObjectMeta, u32)>> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind as Kind;
        match self.stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => decode_record(&message.headers, &message.payload).map(Some),
            Err(e) if matches!(e.kind(), Kind::NoMessageFound) => Ok(None),
            Err(e) => Err(unavailable("read record", e)),
        }
    }

    /// The record's whole chunk list, read from the chunks holding it (`depth` levels).
    async fn resolve(&self, cluster: &str, mut meta: ObjectMeta, depth: u32) -> Result<ObjectMeta> {
        for _ in 0..depth {
            let mut packed = Vec::new();
            for hash in &meta.chunks {
                let bytes = self.read_chunk(cluster, hash).await?;
                if super::sha256_hex(&bytes) != *hash {
                    return Err(Error::Internal(format!(
                        "chunk {hash} of cluster '{cluster}' does not match its SHA-256"
                    )));
                }
                packed.extend_from_slice(&bytes);
            }
            if packed.len() % 32 != 0 {
                return Err(Error::Internal("damaged files record: chunk list".into()));
            }
            meta.chunks = packed.chunks(32).map(hex::encode).collect();
        }
        Ok(meta)
    }

    /// The nats-server's `max_payload` (INFO), 0 when not known yet.
    fn max_payload(&self) -> usize {
        self.context.client().server_info().max_payload
    }

    /// Whether a chunk is stored: stream info filtered to its subject (no payload moves).
    async fn has_chunk(&self, subject: String) -> Result<bool> {
        let subjects = self
            .stream
            .info_with_subjects(&subject)
            .await
            .map_err(|e| unavailable("look up chunk", e))?;
        let found: Vec<(String, usize)> = subjects
            .try_collect()
            .await
            .map_err(|e| unavailable("look up chunk", e))?;
        Ok(found.iter().any(|(s, count)| *s == subject && *count > 0))
    }
}

fn decode_record(headers: &HeaderMap, body: &[u8]) -> Result<(ObjectMeta, u32)> {
    let damaged = |what: &str| Error::Internal(format!("damaged files record: {what}"));
    let manifest = headers
        .get(MANIFEST_HEADER)
        .ok_or_else(|| damaged("no manifest header"))?;
    let mut meta: ObjectMeta =
        serde_json::from_str(manifest.as_str()).map_err(|e| damaged(&e.to_string()))?;
    if body.len() % 32 != 0 {
        return Err(damaged("chunk list is not whole SHA-256s"));
    }
    meta.chunks = body.chunks(32).map(hex::encode).collect();
    let depth = match headers.get(LIST_DEPTH_HEADER) {
        None => 0,
        Some(value) => value
            .as_str()
            .parse::<u32>()
            .ok()
            .filter(|depth| *depth <= MAX_LIST_DEPTH)
            .ok_or_else(|| damaged("bad list depth"))?,
    };
    Ok((meta, depth))
}

fn encode_record(meta: &ObjectMeta) -> Result<(HeaderMap, Bytes)> {
    let mut body = Vec::with_capacity(meta.chunks.len() * 32);
    for chunk in &meta.chunks {
        let bytes =
            hex::decode(chunk).map_err(|_| Error::Internal(format!("bad chunk hash {chunk}")))?;
        body.extend_from_slice(&bytes);
    }
    let summary = serde_json::to_string(&meta.clone().summary()).expect("records serialize");
    let mut headers = HeaderMap::new();
    headers.insert(MANIFEST_HEADER, summary.as_str());
    Ok((headers, body.into()))
}

#[async_trait]
impl ObjectStore for JetStreamStore {
    async fn stat(&self, cluster: &str, remote: &Remote) -> Result<Option<ObjectMeta>> {
        match self.record(&record_subject(cluster, remote)).await? {
            Some((meta, depth)) => self.resolve(cluster, meta, depth).await.map(Some),
            None => Ok(None),
        }
    }

    async fn list(&self, cluster: &str, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let filter = format!("{SUBJECT_PREFIX}.{cluster}.m.>");
        let head = format!("{SUBJECT_PREFIX}.{cluster}.m.");
        let subjects = self
            .stream
            .info_with_subjects(&filter)
            .await
            .map_err(|e| unavailable("list", e))?;
        let subjects: Vec<(String, usize)> = subjects
            .try_collect()
            .await
            .map_err(|e| unavailable("list", e))?;
        // Paths are hex in subjects: the prefix is applied before any record is read.
        let wanted: Vec<String> = subjects
            .into_iter()
            .filter(|(subject, count)| {
                *count > 0
                    && subject
                        .strip_prefix(&head)
                        .and_then(|token| hex::decode(token).ok())
                        .and_then(|path| String::from_utf8(path).ok())
                        .is_some_and(|path| path.starts_with(prefix))
            })
            .map(|(subject, _)| subject)
            .collect();
        let records: Vec<Option<ObjectMeta>> = futures_util::stream::iter(wanted)
            // A list shows no chunk lists: those behind stored chunks are not read.
            .map(|subject| async move {
                let record = self.record(&subject).await?;
                Ok::<_, Error>(record.map(|(meta, _)| meta.summary()))
            })
            .buffer_unordered(PARALLEL)
            .try_collect()
            .await?;
        // A record deleted between the two steps is simply not listed.
        let mut records: Vec<ObjectMeta> = records.into_iter().flatten().collect();
        crate::sort::sort_by(&mut records, |a, b| a.path.cmp(&b.path));
        Ok(records)
    }

    async fn missing_chunks(&self, cluster: &str, chunks: &[String]) -> Result<Vec<usize>> {
        let subjects: Vec<(usize, String)> = chunks
            .iter()
            .enumerate()
            .map(|(index, sha)| (index, chunk_subject(cluster, sha)))
            .collect();
        let present: Vec<(usize, bool)> = futures_util::stream::iter(subjects)
            .map(|(index, subject)| async move {
                Ok::<_, Error>((index, self.has_chunk(subject).await?))
            })
            .buffer_unordered(PARALLEL)
            .try_collect()
            .await?;
        let mut missing: Vec<usize> = present
            .into_iter()
            .filter(|(_, present)| !present)
            .map(|(index, _)| index)
            .collect();
        missing.sort_unstable();
        Ok(missing)
    }

    async fn write_chunk(&self, cluster: &str, sha256: &str, bytes: Bytes) -> Result<()> {
        let ack = self
            .context
            .publish(chunk_subject(cluster, sha256), bytes)
            .await
            .map_err(|e| unavailable("write chunk", e))?;
        ack.await.map_err(|e| unavailable("write chunk", e))?;
        Ok(())
    }

    async fn read_chunk(&self, cluster: &str, sha256: &str) -> Result<Bytes> {
        let subject = chunk_subject(cluster, sha256);
        if let Ok(message) = self.stream.direct_get_last_for_subject(&subject).await {
            return Ok(message.payload);
        }
        use async_nats::jetstream::stream::LastRawMessageErrorKind as Kind;
        match self.stream.get_last_raw_message_by_subject(&subject).await {
            Ok(message) => Ok(message.payload),
            Err(e) if matches!(e.kind(), Kind::NoMessageFound) => Err(Error::NotFound(format!(
                "chunk {sha256} not found in cluster '{cluster}'"
            ))),
            Err(e) => Err(unavailable("read chunk", e)),
        }
    }

    async fn commit(&self, cluster: &str, remote: &Remote, meta: &ObjectMeta) -> Result<()> {
        let (mut headers, mut body) = encode_record(meta)?;
        // Past what one message of this nats-server carries, the list goes into chunks.
        let max_payload = self.max_payload();
        // `NATS/1.0`, the manifest line and the blank line (a depth line is in the `32`).
        let header_len = headers
            .get(MANIFEST_HEADER)
            .map_or(0, |value| MANIFEST_HEADER.len() + value.as_str().len() + 16);
        let fits = |body: &Bytes| {
            max_payload == 0 || header_len + 32 + body.len() + RECORD_SLACK <= max_payload
        };
        let mut depth = 0;
        while !fits(&body) {
            if depth == MAX_LIST_DEPTH {
                return Err(Error::Invalid(format!(
                    "the chunk list of {} does not fit in this NATS's max_payload",
                    meta.path
                )));
            }
            let piece = super::body_capacity(max_payload as u64) as usize;
            let mut next = Vec::new();
            for part in body.chunks(piece) {
                let sha256 = super::sha256_hex(part);
                self.write_chunk(cluster, &sha256, Bytes::copy_from_slice(part))
                    .await?;
                next.extend_from_slice(&hex::decode(&sha256).expect("hex"));
            }
            body = next.into();
            depth += 1;
        }
        if depth > 0 {
            headers.insert(LIST_DEPTH_HEADER, depth.to_string().as_str());
        }
        let ack = self
            .context
            .publish_with_headers(record_subject(cluster, remote), headers, body)
            .await
            .map_err(|e| unavailable("commit", e))?;
        ack.await.map_err(|e| unavailable("commit", e))?;
        Ok(())
    }

    async fn delete(&self, cluster: &str, remote: &Remote) -> Result<bool> {
        let subject = record_subject(cluster, remote);
        if self.record(&subject).await?.is_none() {
            return Ok(false);
        }
        let purged = self
            .stream
            .purge()
            .filter(&subject)
            .await
            .map_err(|e| unavailable("delete", e))?;
        Ok(purged.purged > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::Writer;

    #[test]
    fn records_round_trip_with_raw_chunk_hashes() {
        let meta = ObjectMeta {
            path: "kv://cfg/a b".into(),
            size: 3,
            sha256: "ab".repeat(32),
            chunk_size: 2,
            chunks: vec!["01".repeat(32), "ff".repeat(32)],
            created_at: "2026-01-01T00:00:00Z".into(),
            updated_at: "2026-01-01T00:00:00Z".into(),
            writer: Writer::default(),
        };
        let (headers, body) = encode_record(&meta).unwrap();
        assert_eq!(body.len(), 64);
        assert_eq!(decode_record(&headers, &body).unwrap(), (meta, 0));
        assert_eq!(
            record_subject("ci", &Remote::parse("kv://cfg/a b").unwrap()),
            format!("svc.filestore.ci.m.{}", hex::encode("kv://cfg/a b"))
        );
    }
}
