//! State plans too large to travel in their command (a tree of thousands of files, large
//! files): the server stores the plan's JSON once in the file service, in the reserved
//! cluster `svc-state` at `plans/<sha256>`, and the command names it by size and SHA-256 and
//! its chunks' ([`PlanRef`]). Each agent's daemon fetches the chunks it does not already hold
//! (`agent::content` keeps the last ones it fetched), and the executor checks the whole
//! against the signed command before it runs anything.
//!
//! The same content sent again (a second apply, the same plan to a thousand agents) is stored
//! once, and an agent that holds the chunks fetches nothing. In cluster mode the file
//! service's store is JetStream, shared by every member, so any member answers.
//!
//! An agent may read a chunk only by showing the signed command that named it, addressed to
//! that agent and still fresh (`signature::MAX_AGE`): the command is its capability, so one
//! agent cannot read the plan sent to another, even knowing the chunk's hash.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::protocol::{ContentRequest, PlanRef, Work};
use super::signature::MAX_AGE;
use crate::domain::Domain;
use crate::files::Files;
use crate::state::Plan;
use crate::{clock, Error, Result};

/// The file-service cluster the server keeps stored plans in: `svc-files --cluster svc-state
/// ls plans/` lists them, for admin keys only (a plan can carry secret template values).
pub const CLUSTER: &str = crate::files::STATE_CLUSTER;
/// Plans whose JSON is larger than this are stored rather than sent in the command, so that
/// a command always fits in one bus message (`bus.max_payload`, 1 MiB by default) with room
/// to spare; a quarter of a smaller `max_payload` ([`inline_limit`]).
pub const INLINE_PLAN_BYTES: usize = 256 * 1024;

/// The largest plan JSON sent in its command on a bus with `max_payload` (None: unknown).
pub fn inline_limit(max_payload: Option<usize>) -> usize {
    match max_payload {
        Some(max) => INLINE_PLAN_BYTES.min(max / 4),
        None => INLINE_PLAN_BYTES,
    }
}

/// Checks that a stored plan's reference travels: the command carries it, and the agent's
/// content request carries the signed command again (escaped, with its signature), so the
/// reference may take half of what a message leaves beside its headers. [`store_plan`] names
/// a long chunk list by the chunks holding it, so this fails only on a bus too small for a
/// reference of one chunk; it is refused here, saying so, rather than failing to send.
pub fn check_reference(plan_ref: &PlanRef, max_payload: Option<usize>) -> Result<()> {
    let Some(max) = max_payload else {
        return Ok(());
    };
    let size = serde_json::to_vec(plan_ref).map_err(Error::internal)?.len();
    let room = crate::files::body_capacity(max as u64) as usize / 2;
    if size > room {
        return Err(Error::TooLarge(format!(
            "the compiled plan is {} bytes in {} stored chunks, whose list ({size} bytes) does \
             not fit in a command on a bus with max_payload {max} (at most {room} bytes); \
             raise bus.max_payload",
            plan_ref.size,
            plan_ref.chunks.len()
        )));
    }
    Ok(())
}
/// The largest compiled plan (its JSON) a state run takes.
pub const MAX_PLAN_BYTES: usize = 64 * 1024 * 1024;

fn object_path(sha256: &str) -> String {
    format!("plans/{sha256}")
}

/// Stores a plan's JSON (when it is already stored, nothing is written) and returns what the
/// command carries instead of it. On a bus whose `max_payload` (None: unknown) leaves too
/// little room for the plan's chunk list in a command, the list is stored too, as the object
/// `plans/<sha256>.list1` (and that one's list as `.list2`, ...; objects, so that garbage
/// collection keeps them), and the command names the top list's chunks (`list_depth`).
pub async fn store_plan(files: &Files, json: &[u8], max_payload: Option<usize>) -> Result<PlanRef> {
    if json.len() > MAX_PLAN_BYTES {
        return Err(Error::Invalid(format!(
            "the compiled plan is {} KiB, more than the {} MiB a state run takes",
            json.len() / 1024,
            MAX_PLAN_BYTES / (1024 * 1024)
        )));
    }
    let sha256 = crate::files::sha256_hex(json);
    let meta = files.put_own(CLUSTER, &object_path(&sha256), json).await?;
    let mut plan_ref = PlanRef {
        size: meta.size,
        sha256: meta.sha256,
        chunk_size: meta.chunk_size,
        chunks: meta.chunks,
        list_depth: 0,
    };
    while check_reference(&plan_ref, max_payload).is_err()
        && plan_ref.list_depth < crate::files::MAX_LIST_DEPTH
        && plan_ref.chunks.len() > 1
    {
        let packed = crate::files::pack_hashes(&plan_ref.chunks)?;
        let depth = plan_ref.list_depth + 1;
        let path = format!("{}.list{depth}", object_path(&sha256));
        let list = files.put_own(CLUSTER, &path, &packed).await?;
        plan_ref.chunks = list.chunks;
        plan_ref.list_depth = depth;
    }
    Ok(plan_ref)
}

/// The chunks of a stored plan, in order, and (`all`) every chunk of the lists above them:
/// the lists `plan_ref` names are read from the store, their hashes checked.
async fn plan_chunks(files: &Files, plan_ref: &PlanRef) -> Result<(Vec<String>, Vec<String>)> {
    let mut all = Vec::new();
    let mut chunks = plan_ref.chunks.clone();
    for _ in 0..plan_ref.list_depth.min(crate::files::MAX_LIST_DEPTH) {
        let mut packed = Vec::new();
        for chunk in &chunks {
            packed.extend_from_slice(&files.read_own_chunk(CLUSTER, chunk).await?);
        }
        if packed.len() % 32 != 0 {
            return Err(Error::Internal(format!(
                "the chunk list of stored plan {} is damaged",
                plan_ref.sha256
            )));
        }
        all.append(&mut chunks);
        chunks = packed.chunks(32).map(hex::encode).collect();
    }
    all.extend(chunks.iter().cloned());
    Ok((chunks, all))
}

/// Whether `chunk` is one the agent may fetch for `plan_ref`: one of its chunks, or of the
/// lists above them. Those lists are read once per plan reference and kept (a few), since an
/// agent asks for every chunk of a plan in turn.
async fn names_chunk(files: &Files, plan_ref: &PlanRef, chunk: &str) -> Result<bool> {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    type Known = Vec<(String, Arc<HashSet<String>>)>;
    static KNOWN: Mutex<Known> = Mutex::new(Vec::new());
    const KEEP: usize = 8;
    if plan_ref.list_depth == 0 {
        return Ok(plan_ref.chunks.iter().any(|c| c == chunk));
    }
    let key = crate::files::sha256_hex(&serde_json::to_vec(plan_ref).map_err(Error::internal)?);
    let cached = KNOWN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(known, _)| *known == key)
        .map(|(_, chunks)| chunks.clone());
    let chunks = match cached {
        Some(chunks) => chunks,
        None => {
            let (_, all) = plan_chunks(files, plan_ref).await?;
            let chunks: Arc<HashSet<String>> = Arc::new(all.into_iter().collect());
            let mut known = KNOWN.lock().unwrap_or_else(|p| p.into_inner());
            if known.len() >= KEEP {
                known.remove(0);
            }
            known.push((key, chunks.clone()));
            chunks
        }
    };
    Ok(chunks.contains(chunk))
}

/// Reads a stored plan back (drift: what the server compares the agent's answer with).
pub async fn load_plan(files: &Files, plan_ref: &PlanRef) -> Result<Plan> {
    let mut json = Vec::with_capacity(plan_ref.size as usize);
    let (chunks, _) = plan_chunks(files, plan_ref).await?;
    for chunk in &chunks {
        json.extend_from_slice(&files.read_own_chunk(CLUSTER, chunk).await?);
    }
    if crate::files::sha256_hex(&json) != plan_ref.sha256 {
        return Err(Error::Internal(format!(
            "stored plan {} does not match its SHA-256",
            plan_ref.sha256
        )));
    }
    serde_json::from_slice(&json)
        .map_err(|e| Error::Internal(format!("stored plan {}: {e}", plan_ref.sha256)))
}

/// What the store keeps as an agent's last applied state: the plan itself, or, for a stored
/// one, only its reference (so ten thousand agents do not each keep a copy).
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
pub enum Applied {
    Stored { plan_ref: PlanRef },
    Inline(Plan),
}

/// Answers an agent's request for one chunk: `agent_id` is the one the subject names (the
/// broker lets an agent publish only on its own subjects).
pub async fn chunk_for_agent(domain: &Domain, agent_id: &str, body: &[u8]) -> Result<Bytes> {
    let request: ContentRequest = serde_json::from_slice(body)
        .map_err(|e| Error::Invalid(format!("malformed content request: {e}")))?;
    // The public certificate is enough to know our own signature: nothing is unsealed.
    let certificate = crate::identity::command_key_pem(domain.store.as_ref()).await?;
    let command = super::signature::Verifier::from_certificate_pem(&certificate, agent_id)?
        .signed(request.command.as_bytes(), &request.signature)
        .map_err(|refused| {
            Error::Forbidden(format!(
                "the command was not signed by this server ({})",
                refused.0
            ))
        })?;
    if command.agent_id != agent_id {
        return Err(Error::Forbidden(format!(
            "the command is addressed to agent '{}', not '{agent_id}'",
            command.agent_id
        )));
    }
    let age = (clock::now_millis().max(0) as u64).saturating_sub(command.issued_at_ms);
    if age > MAX_AGE.as_millis() as u64 {
        return Err(Error::Forbidden(format!(
            "the command was issued {} s ago, more than the {} s its content stays available",
            age / 1000,
            MAX_AGE.as_secs()
        )));
    }
    let Work::State {
        plan_ref: Some(plan_ref),
        ..
    } = &command.work
    else {
        return Err(Error::Invalid("the command names no stored plan".into()));
    };
    if !names_chunk(&domain.files, plan_ref, &request.chunk).await? {
        return Err(Error::Forbidden(format!(
            "chunk {} is not part of the command's plan",
            request.chunk
        )));
    }
    domain.files.read_own_chunk(CLUSTER, &request.chunk).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applied_rows_read_both_shapes() {
        let plan_ref = PlanRef {
            size: 3,
            sha256: "a".repeat(64),
            chunk_size: 262144,
            chunks: vec!["a".repeat(64)],
            list_depth: 0,
        };
        let stored = serde_json::to_string(&Applied::Stored {
            plan_ref: plan_ref.clone(),
        })
        .unwrap();
        assert!(matches!(
            serde_json::from_str::<Applied>(&stored).unwrap(),
            Applied::Stored { plan_ref: r } if r == plan_ref
        ));
        let inline = serde_json::to_string(&Plan::default()).unwrap();
        assert!(matches!(
            serde_json::from_str::<Applied>(&inline).unwrap(),
            Applied::Inline(plan) if plan == Plan::default()
        ));
    }
}
