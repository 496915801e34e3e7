//! The daemon's side of stored state plans (`fleet::content`): a state command too large for
//! one bus message names its plan by SHA-256 and chunks ([`PlanRef`]); the daemon fetches the
//! chunks it does not hold from the server and hands the whole to the executor, which checks
//! it against the signed command. The daemon is not trusted with the content's integrity, only
//! with fetching it.
//!
//! Chunks are kept under `state_dir/content/` (0700, each chunk a file named by its SHA-256),
//! so the same plan applied again, or checked for drift, fetches nothing; the least recently
//! used are removed past [`CACHE_BYTES`].

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use futures_util::{StreamExt, TryStreamExt};

use crate::bus::subjects;
use crate::files::{sha256_hex, wire::ERROR_HEADER};
use crate::fleet::content::MAX_PLAN_BYTES;
use crate::fleet::protocol::{Command, ContentRequest, PlanRef, Work};

/// How long one chunk may take to arrive.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(30);
/// Chunk requests in flight at once.
const IN_FLIGHT: usize = 4;
/// The most the chunk cache keeps; the least recently used go first.
const CACHE_BYTES: u64 = 256 * 1024 * 1024;

/// The plan a command names, when it names a stored one (read from the unverified bytes
/// only to know what to fetch; the executor verifies everything).
pub fn plan_ref(bytes: &[u8]) -> Option<PlanRef> {
    // Most commands carry their plan: skip the parse unless the field is there at all.
    if !bytes.windows(10).any(|w| w == b"\"plan_ref\"") {
        return None;
    }
    match serde_json::from_slice::<Command>(bytes).ok()?.work {
        Work::State { plan_ref, .. } => plan_ref,
        _ => None,
    }
}

/// Fetches the stored plan `plan_ref` for the command in `bytes` (signed `signature`), from
/// the cache in `dir` where it can.
pub async fn fetch(
    client: &async_nats::Client,
    agent_id: &str,
    dir: &Path,
    bytes: &[u8],
    signature: &str,
    plan_ref: &PlanRef,
) -> Result<Vec<u8>, String> {
    if plan_ref.size > MAX_PLAN_BYTES as u64 {
        return Err(format!(
            "the stored plan is {} bytes, more than the {MAX_PLAN_BYTES} an agent takes",
            plan_ref.size
        ));
    }
    if let Err(e) = std::fs::create_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "content cache unavailable");
    }
    let _ = std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700));
    let command = std::str::from_utf8(bytes).map_err(|_| "the command is not UTF-8")?;
    // A chunk list too long for the command is named by the chunks holding it: fetched (and
    // checked, each by its hash from the level above) level by level first.
    let mut chunks = plan_ref.chunks.clone();
    let mut lists = Vec::new();
    for _ in 0..plan_ref.list_depth.min(crate::files::MAX_LIST_DEPTH) {
        let packed = fetch_chunks(client, agent_id, dir, command, signature, &chunks)
            .await?
            .concat();
        if packed.len() % 32 != 0 {
            return Err(format!(
                "the chunk list of stored plan {} is damaged",
                plan_ref.sha256
            ));
        }
        lists.append(&mut chunks);
        chunks = packed.chunks(32).map(hex::encode).collect();
    }
    let plan = fetch_chunks(client, agent_id, dir, command, signature, &chunks)
        .await?
        .concat();
    if plan.len() as u64 != plan_ref.size || sha256_hex(&plan) != plan_ref.sha256 {
        return Err(format!(
            "the fetched plan does not match its SHA-256 {}",
            plan_ref.sha256
        ));
    }
    lists.extend(chunks);
    prune(dir, &lists);
    Ok(plan)
}

/// `chunks`' bytes in order: from the cache in `dir` where it has them, else from the server
/// ([`IN_FLIGHT`] at once, each checked against its hash), then cached.
async fn fetch_chunks(
    client: &async_nats::Client,
    agent_id: &str,
    dir: &Path,
    command: &str,
    signature: &str,
    chunks: &[String],
) -> Result<Vec<Vec<u8>>, String> {
    let mut pieces: Vec<Option<Vec<u8>>> =
        chunks.iter().map(|chunk| read_cached(dir, chunk)).collect();
    // Owned values only: the futures run on the stream, apart from this frame's borrows.
    let requests: Vec<_> = pieces
        .iter()
        .enumerate()
        .filter(|(_, piece)| piece.is_none())
        .map(|(index, _)| {
            let (client, agent_id) = (client.clone(), agent_id.to_string());
            let (command, signature) = (command.to_string(), signature.to_string());
            let chunk = chunks[index].clone();
            async move {
                let bytes = request_chunk(&client, &agent_id, command, signature, &chunk).await?;
                Ok::<_, String>((index, bytes))
            }
        })
        .collect();
    let fetched: Vec<(usize, Vec<u8>)> = futures_util::stream::iter(requests)
        .buffer_unordered(IN_FLIGHT)
        .try_collect()
        .await?;
    for (index, bytes) in fetched {
        write_cached(dir, &chunks[index], &bytes);
        pieces[index] = Some(bytes);
    }
    Ok(pieces.into_iter().flatten().collect())
}

async fn request_chunk(
    client: &async_nats::Client,
    agent_id: &str,
    command: String,
    signature: String,
    chunk: &str,
) -> Result<Vec<u8>, String> {
    let reply = format!(
        "{}{}",
        subjects::agent_content_reply_prefix(agent_id),
        crate::ids::random_base62(22)
    );
    let mut answers = client
        .subscribe(reply.clone())
        .await
        .map_err(|e| format!("bus: cannot subscribe: {e}"))?;
    let body = serde_json::to_vec(&ContentRequest {
        command,
        signature,
        chunk: chunk.to_string(),
    })
    .map_err(|e| e.to_string())?;
    client
        .publish_with_reply(subjects::agent_content(agent_id), reply, body.into())
        .await
        .map_err(|e| format!("bus: cannot publish: {e}"))?;
    let message = tokio::time::timeout(CHUNK_TIMEOUT, answers.next())
        .await
        .map_err(|_| format!("no answer for chunk {chunk} within {CHUNK_TIMEOUT:?}"))?
        .ok_or("the bus connection closed")?;
    let _ = answers.unsubscribe().await;
    if message
        .headers
        .as_ref()
        .is_some_and(|headers| headers.get(ERROR_HEADER).is_some())
    {
        let answer: serde_json::Value =
            serde_json::from_slice(&message.payload).unwrap_or_default();
        let why = answer["error"]["message"].as_str().unwrap_or("refused");
        return Err(format!("the server refused chunk {chunk}: {why}"));
    }
    if sha256_hex(&message.payload) != chunk {
        return Err(format!("chunk {chunk} arrived damaged"));
    }
    Ok(message.payload.to_vec())
}

fn cached_path(dir: &Path, chunk: &str) -> Option<PathBuf> {
    crate::files::is_sha256_hex(chunk).then(|| dir.join(chunk))
}

/// A cached chunk whose bytes still match its name; marks it used now.
fn read_cached(dir: &Path, chunk: &str) -> Option<Vec<u8>> {
    let path = cached_path(dir, chunk)?;
    let bytes = std::fs::read(&path).ok()?;
    if sha256_hex(&bytes) != chunk {
        let _ = std::fs::remove_file(&path);
        return None;
    }
    if let Ok(file) = std::fs::File::options().write(true).open(&path) {
        let _ = file.set_modified(SystemTime::now());
    }
    Some(bytes)
}

/// Best effort: a chunk that cannot be cached is fetched again next time.
fn write_cached(dir: &Path, chunk: &str, bytes: &[u8]) {
    let Some(path) = cached_path(dir, chunk) else {
        return;
    };
    let temporary = dir.join(format!(".{chunk}.tmp"));
    let written =
        std::fs::write(&temporary, bytes).and_then(|()| std::fs::rename(&temporary, &path));
    if let Err(e) = written {
        tracing::debug!(error = %e, "chunk not cached");
        let _ = std::fs::remove_file(&temporary);
    }
}

/// Removes the least recently used chunks past [`CACHE_BYTES`], never those of `keep`.
fn prune(dir: &Path, keep: &[String]) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut chunks: Vec<(SystemTime, u64, PathBuf, String)> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            let meta = entry.metadata().ok()?;
            Some((meta.modified().ok()?, meta.len(), entry.path(), name))
        })
        .collect();
    let mut total: u64 = chunks.iter().map(|(_, len, _, _)| len).sum();
    chunks.sort();
    for (_, len, path, name) in chunks {
        if total <= CACHE_BYTES {
            break;
        }
        if keep.contains(&name) {
            continue;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_chunks_are_checked_and_pruned_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let chunk = sha256_hex(b"hello");
        write_cached(dir.path(), &chunk, b"hello");
        assert_eq!(read_cached(dir.path(), &chunk).unwrap(), b"hello");
        // A damaged chunk is dropped, not used.
        std::fs::write(dir.path().join(&chunk), b"jello").unwrap();
        assert!(read_cached(dir.path(), &chunk).is_none());
        assert!(!dir.path().join(&chunk).exists());
        // Names that are not hashes never become paths.
        assert!(read_cached(dir.path(), "../etc/passwd").is_none());
        prune(dir.path(), &[]);
    }

    #[test]
    fn only_commands_naming_a_stored_plan_are_parsed() {
        assert!(plan_ref(br#"{"job_id":"J","timeout_ms":1,"kind":"exec","argv":["x"]}"#).is_none());
        let text = format!(
            r#"{{"job_id":"J","timeout_ms":1,"kind":"state","mode":"apply","plan_ref":{{"size":1,"sha256":"{0}","chunk_size":262144,"chunks":["{0}"]}}}}"#,
            "a".repeat(64)
        );
        assert_eq!(plan_ref(text.as_bytes()).unwrap().size, 1);
    }
}
