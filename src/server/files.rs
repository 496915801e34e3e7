//! The bus side of the file service: requests on `svc.files.<cluster>.<op>` (queue group
//! `svc-server`, so the members of a cluster share them), answered by `files::Files`.
//!
//! Thin: the cluster and operation come from the subject, the caller from
//! - on the embedded broker, the broker-stamped `Svc-Bus-User` header (the API key the
//!   connection authenticated with; a client cannot set it, `BrokerConfig::sender_subjects`);
//! - on an external NATS (`bus.external_urls`), where nothing stamps the sender, the
//!   `Svc-Auth` request signature (`files::signature`): the key that signed it, checked
//!   against the stored hash on every request, within a time window, a nonce used once;
//!
//! plus the declared `Svc-Principal-Id` and `Svc-Principal-Role` headers, which are recorded
//! and may only lower the role. The backend is local disk on a single server and the
//! JetStream stream `SVC_FILES` in cluster mode (`files::jetstream`).
//!
//! Wire format (docs/files.md has the table): JSON bodies, except chunk bytes (`read` replies,
//! `chunk` requests) and manifests (`put`, `commit` requests and `get` replies), whose chunk
//! hashes travel as raw 32-byte SHA-256s, with the rest of the manifest as JSON in a header.
//! Errors carry `Svc-Error: <code>` and `{"error":{"code","message"}}`.

use std::sync::Arc;

use async_nats::HeaderMap;
use bytes::Bytes;
use futures_util::StreamExt;
use serde::Deserialize;

use super::Context;
use crate::auth::Role;
use crate::bus::{subjects, SENDER_HEADER};
use crate::files::signature::{self, KeyIds, Nonces, Signature, AUTH_HEADER, SIGNED_HEADERS};
use crate::files::wire::{
    CHUNK_HEADER, ERROR_HEADER, MANIFEST_HEADER, MORE_HEADER, PRINCIPAL_ID_HEADER,
    PRINCIPAL_ROLE_HEADER,
};
use crate::files::Manifest;
use crate::files::{jetstream::JetStreamStore, local::LocalStore, Caller, Files, ObjectStore};
use crate::{Error, Result};

const QUEUE_GROUP: &str = "svc-server";

/// The backend: local disk under `data_dir/files` on a single server (embedded broker or
/// external NATS); in cluster mode, the JetStream stream `SVC_FILES` with `replicas` replicas
/// (what the events and audit streams get), shared by every member. Made before the domain,
/// which owns it (`Domain::files`).
pub async fn object_store(
    config: &crate::config::ServerConfig,
    data_dir: &std::path::Path,
    client: &async_nats::Client,
    replicas: usize,
) -> Result<Arc<dyn ObjectStore>> {
    let problems = config.files.problems();
    if !problems.is_empty() {
        return Err(Error::Invalid(problems.join("; ")));
    }
    // JetStream only in cluster mode, where the events and audit streams are JetStream too and
    // several members must see one store. A single server on an external NATS keeps its
    // objects on local disk: that NATS need not run JetStream (requests are signed there all
    // the same, below).
    Ok(if config.cluster.enabled {
        Arc::new(JetStreamStore::open(client.clone(), replicas).await?)
    } else {
        Arc::new(LocalStore::new(data_dir.join("files")))
    })
}

/// Starts the file service on the server's bus client; it runs until the client goes away.
pub async fn start(context: Arc<Context>) -> Result<()> {
    let files = context.domain.files.clone();
    // Members share the replay window through the store; one server keeps it in memory.
    let nonces = Arc::new(match context.domain.cluster.is_clustered() {
        true => Nonces::shared(context.domain.store.clone()),
        false => Nonces::default(),
    });
    let key_ids = Arc::new(KeyIds::default());
    let mut requests = context
        .bus
        .client
        .queue_subscribe(subjects::FILES_REQUESTS, QUEUE_GROUP.into())
        .await
        .map_err(|e| Error::Unavailable(format!("bus: cannot subscribe for files: {e}")))?;
    let trusts_sender = context.bus.is_embedded;
    tokio::spawn(async move {
        while let Some(message) = requests.next().await {
            let Some(reply) = message.reply.clone() else {
                continue;
            };
            let context = context.clone();
            let files = files.clone();
            let nonces = nonces.clone();
            let key_ids = key_ids.clone();
            let span = super::request_span("bus", &message.subject, &super::request_id());
            let task = async move {
                let answer = match answer(
                    &context,
                    &files,
                    trusts_sender,
                    (&nonces, &key_ids),
                    &message,
                )
                .await
                {
                    Ok(answer) => answer,
                    Err(error) => {
                        if let Error::Internal(cause) = &error {
                            tracing::error!(%cause, "file request failed");
                        }
                        error_reply(&error)
                    }
                };
                super::send_reply(&context, reply, answer, "file").await;
            };
            tokio::spawn(tracing::Instrument::instrument(task, span));
        }
    });
    Ok(())
}

#[derive(Deserialize)]
struct PathRequest {
    path: String,
}

/// A `get`: the object, and its chunk list from index `from` on (as much as one message
/// carries; a client asks again for the rest).
#[derive(Deserialize)]
struct GetRequest {
    path: String,
    #[serde(default)]
    from: usize,
}

/// A `read`'s optional body: the chunk's bytes from `offset` on. A chunk larger than a
/// message now (put under a larger `bus.max_payload`) is answered in pieces.
#[derive(Deserialize, Default)]
struct ReadRequest {
    #[serde(default)]
    offset: usize,
}

#[derive(Deserialize)]
struct ListRequest {
    #[serde(default)]
    prefix: String,
    /// Only the objects whose paths sort after this one (the next page).
    #[serde(default)]
    after: Option<String>,
}

#[derive(Deserialize)]
struct ManifestHeader {
    path: String,
    size: u64,
    sha256: String,
    chunk_size: u64,
    /// `put`: the body is the chunk list from this index on (a page of a long list).
    #[serde(default)]
    from: u64,
    /// `commit`: how many levels of chunk lists sent as chunks the body's hashes name
    /// (`Files::commit_put`).
    #[serde(default)]
    list_depth: u32,
}

async fn answer(
    context: &Context,
    files: &Files,
    trusts_sender: bool,
    (nonces, key_ids): (&Nonces, &KeyIds),
    message: &async_nats::Message,
) -> Result<(HeaderMap, Bytes)> {
    let mut tokens = message.subject.split('.').skip(2);
    let (Some(cluster), Some(operation)) = (tokens.next(), tokens.next()) else {
        return Err(Error::Invalid(
            "subject is not svc.files.<cluster>.<op>".into(),
        ));
    };
    let headers = message.headers.clone().unwrap_or_default();
    let key = if trusts_sender {
        let user = headers
            .get(SENDER_HEADER)
            .map(|value| value.as_str().to_string())
            .unwrap_or_default();
        crate::files::key_principal(context.domain.store.as_ref(), &user).await?
    } else {
        signer(context, (nonces, key_ids), message, &headers).await?
    };
    let caller = caller(key, &headers)?;
    tracing::Span::current().record("key_id", caller.key.id.as_str());
    let domain = &context.domain;
    let body = &message.payload;
    match operation {
        "limits" => {
            caller_admits_reads(&caller)?;
            json_reply(&files.limits())
        }
        "stat" => {
            let request: PathRequest = parse(body)?;
            json_reply(&files.stat(&caller, cluster, &request.path).await?)
        }
        "list" => {
            let request: ListRequest = parse(body)?;
            let objects = files.list(&caller, cluster, &request.prefix).await?;
            let after = request.after.as_deref();
            let (page, more) = list_page(
                objects
                    .iter()
                    .filter(|object| after.is_none_or(|after| object.path.as_str() > after)),
                files.read_piece(),
            );
            let mut reply = HeaderMap::new();
            if more {
                reply.insert(MORE_HEADER, "true");
            }
            Ok((reply, page.into()))
        }
        "get" => {
            let request: GetRequest = parse(body)?;
            let meta = files.open(&caller, cluster, &request.path).await?;
            let from = request.from.min(meta.chunks.len());
            let to = from
                .saturating_add(files.hashes_per_message())
                .min(meta.chunks.len());
            let hashes = crate::files::pack_hashes(&meta.chunks[from..to])?;
            let mut reply = HeaderMap::new();
            let summary = serde_json::to_string(&meta.summary()).expect("records serialize");
            reply.insert(MANIFEST_HEADER, summary.as_str());
            Ok((reply, hashes.into()))
        }
        "read" => {
            let sha256 = header(&headers, CHUNK_HEADER)?;
            let request: ReadRequest = if body.is_empty() {
                ReadRequest::default()
            } else {
                parse(body)?
            };
            let bytes = files.read_chunk(&caller, cluster, &sha256).await?;
            if request.offset > bytes.len() {
                return Err(Error::Invalid(format!(
                    "offset {} is past the chunk's {} bytes",
                    request.offset,
                    bytes.len()
                )));
            }
            let piece = files.read_piece();
            let end = request.offset.saturating_add(piece).min(bytes.len());
            Ok((HeaderMap::new(), bytes.slice(request.offset..end)))
        }
        "put" | "commit" => {
            let (path, manifest, head) = manifest_of(&headers, body)?;
            if operation == "put" {
                let missing = files
                    .begin_put(domain, &caller, cluster, &path, &manifest, head.from)
                    .await?;
                json_reply(&serde_json::json!({ "missing": missing }))
            } else {
                let meta = files
                    .commit_put(domain, &caller, cluster, &path, &manifest, head.list_depth)
                    .await?;
                json_reply(&meta)
            }
        }
        "chunk" => {
            let sha256 = header(&headers, CHUNK_HEADER)?;
            files
                .write_chunk(&caller, cluster, &sha256, body.clone())
                .await?;
            json_reply(&serde_json::json!({}))
        }
        "delete" => {
            let request: PathRequest = parse(body)?;
            files
                .delete(domain, &caller, cluster, &request.path)
                .await?;
            json_reply(&serde_json::json!({}))
        }
        other => Err(Error::Invalid(format!(
            "unknown file operation '{other}' (one of: {}, {})",
            subjects::FILES_READ_OPERATIONS.join(", "),
            subjects::FILES_WRITE_OPERATIONS.join(", ")
        ))),
    }
}

/// `limits` needs a key of any role, like the other reads.
fn caller_admits_reads(caller: &Caller) -> Result<()> {
    caller.key.require(Role::Readonly)
}

/// The API key that signed the request (external NATS): the header parsed, the time checked,
/// the key looked up and the MAC verified, then the nonce remembered (after verifying, so
/// unsigned junk cannot fill the memory).
async fn signer(
    context: &Context,
    (nonces, key_ids): (&Nonces, &KeyIds),
    message: &async_nats::Message,
    headers: &HeaderMap,
) -> Result<crate::auth::Principal> {
    let value = headers.get(AUTH_HEADER).ok_or_else(|| {
        Error::Unauthenticated(format!(
            "an API key is required: the request has no {AUTH_HEADER} signature (svc-files signs \
             with --api-key)"
        ))
    })?;
    let signature = Signature::parse(value.as_str())?;
    let now = crate::clock::now_millis() / 1000;
    signature.check_time(now)?;
    let values = SIGNED_HEADERS.map(|name| headers.get(name).map_or("", |v| v.as_str()));
    let request = signature::Request {
        subject: message.subject.as_str(),
        reply: message.reply.as_ref().map_or("", |r| r.as_str()),
        headers: values,
        payload: &message.payload,
    };
    let at_rest = crate::secrets::at_rest::key(&context.domain).await?;
    let key = crate::files::signed_principal(
        context.domain.store.as_ref(),
        at_rest,
        key_ids,
        &signature,
        &request,
    )
    .await?;
    nonces.admit(&signature, now).await?;
    Ok(key)
}

/// The caller: the key (looked up for this request: no cache, so a deleted or expired key
/// fails its next request) and the declared principal.
fn caller(key: crate::auth::Principal, headers: &HeaderMap) -> Result<Caller> {
    let declared_id = headers
        .get(PRINCIPAL_ID_HEADER)
        .map(|value| value.as_str().to_string())
        .filter(|id| !id.is_empty());
    let declared_role = match headers.get(PRINCIPAL_ROLE_HEADER) {
        Some(value) if !value.as_str().is_empty() => {
            Some(value.as_str().parse::<Role>().map_err(|_| {
                Error::Invalid(format!(
                    "principal role '{}' is not admin, operator or readonly",
                    value.as_str()
                ))
            })?)
        }
        _ => None,
    };
    Ok(Caller {
        key,
        declared_id,
        declared_role,
    })
}

fn header(headers: &HeaderMap, name: &str) -> Result<String> {
    headers
        .get(name)
        .map(|value| value.as_str().to_string())
        .ok_or_else(|| Error::Invalid(format!("header {name} is missing")))
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T> {
    serde_json::from_slice(body).map_err(|e| Error::Invalid(format!("malformed request: {e}")))
}

fn manifest_of(headers: &HeaderMap, body: &[u8]) -> Result<(String, Manifest, ManifestHeader)> {
    let head: ManifestHeader = serde_json::from_str(&header(headers, MANIFEST_HEADER)?)
        .map_err(|e| Error::Invalid(format!("malformed {MANIFEST_HEADER}: {e}")))?;
    if body.len() % 32 != 0 {
        return Err(Error::Invalid(
            "the chunk list must be whole 32-byte SHA-256s".into(),
        ));
    }
    let manifest = Manifest {
        size: head.size,
        sha256: head.sha256.clone(),
        chunk_size: head.chunk_size,
        chunks: body.chunks(32).map(hex::encode).collect(),
    };
    Ok((head.path.clone(), manifest, head))
}

/// A JSON array of as many of `objects` as fit in `budget` bytes (one at least), and whether
/// some were left for the next page.
fn list_page<'a>(
    objects: impl Iterator<Item = &'a crate::files::ObjectMeta>,
    budget: usize,
) -> (Vec<u8>, bool) {
    let mut page = b"[".to_vec();
    for object in objects {
        let item = serde_json::to_vec(object).expect("records serialize");
        if page.len() > 1 && page.len() + item.len() + 2 > budget {
            page.push(b']');
            return (page, true);
        }
        if page.len() > 1 {
            page.push(b',');
        }
        page.extend_from_slice(&item);
    }
    page.push(b']');
    (page, false)
}

fn json_reply<T: serde::Serialize>(value: &T) -> Result<(HeaderMap, Bytes)> {
    let body = serde_json::to_vec(value).expect("replies serialize");
    Ok((HeaderMap::new(), body.into()))
}

pub(super) fn error_reply(error: &Error) -> (HeaderMap, Bytes) {
    let mut headers = HeaderMap::new();
    headers.insert(ERROR_HEADER, error.code());
    // `Internal` displays as "internal error" only: its cause never leaves the server.
    (
        headers,
        serde_json::to_vec(&error.body())
            .expect("JSON values serialize")
            .into(),
    )
}
