//! `svc-files`: put, get, list, stat, delete over the bus (`svc.files.<cluster>.<op>`,
//! docs/files.md).
//!
//! It connects to the bus with the API key as the token (contract §12) and sends the declared
//! principal as headers. Every request is also signed (`Svc-Auth`, `files::signature`) with a
//! key derived from the API key, binding its subject, reply inbox, headers and payload: on an
//! external NATS, where no broker of ours knows the connection's key, that signature is how
//! the server learns the caller, and the key itself never crosses the bus. Replies come to
//! one session inbox subscription (`_INBOX.<nuid>.*`), so each request's reply subject is
//! known before it is signed. Transfers are chunked with a bounded window of requests in flight
//! (`WINDOW`), not one round trip per chunk. A put hashes its input first (chunks and whole
//! file), asks the server which chunks it lacks and sends only those, so a retried put resumes.
//! A get checks every chunk's SHA-256 and the whole file's before the file appears: it is
//! written beside LOCAL and renamed over it only once complete, so a failure leaves no partial
//! LOCAL (with `-` chunks go to stdout as they are verified; the final check can then only
//! fail the exit code).
//!
//! Every message fits the bus's `max_payload` (from INFO): a chunk list too long for one
//! message is asked about in pages (`put`, `get`) and committed as chunks (`list_depth`), and
//! a chunk larger than a message (put under a larger `max_payload`) is read in pieces.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argh::FromArgs;
use async_nats::HeaderMap;
use bytes::Bytes;
use futures_util::{stream, StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};

use super::output::{print_json, print_table};
use super::progress::Bar;
use super::values::{log_filter, role};
use super::{exit, CliError, Common, Output};
use crate::bus::subjects;
use crate::files::signature::{self, AUTH_HEADER, SIGNED_HEADERS};
use crate::files::wire::{
    CHUNK_HEADER, ERROR_HEADER, MANIFEST_HEADER, MORE_HEADER, PRINCIPAL_ID_HEADER,
    PRINCIPAL_ROLE_HEADER,
};
use crate::files::{Limits, ObjectMeta};

/// Chunk requests in flight at once, per transfer: enough to keep a loopback or LAN link
/// busy while the server writes, small enough to bound memory (WINDOW × chunk size).
const WINDOW: usize = 16;
const DEFAULT_TIMEOUT: &str = "1m0s";

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_table(program, arrange(args))
}

/// svc-files' commands, in help order: the one place each is named, read by running it and by
/// help, completions and man pages (`cli::args_info`).
pub const COMMANDS: &[super::Command] = &[
    command!("put", PutArgs, |c, a| {
        let flags = a.flags();
        put(c, flags, a.local, a.remote)
    }),
    command!("get", GetArgs, |c, a| {
        let flags = a.flags();
        get(c, flags, a.remote, a.local)
    }),
    command!("list", ListArgs, |c, a| {
        let flags = a.flags();
        list(c, flags, a.prefix.unwrap_or_default())
    }),
    command!("stat", StatArgs, |c, a| {
        let flags = a.flags();
        stat(c, flags, a.remote)
    }),
    command!("delete", DeleteArgs, |c, a| {
        let flags = a.flags();
        delete(c, flags, a.remote)
    }),
];

/// The flags that take a value, which may also come before the command.
const VALUE_FLAGS: &[&str] = &[
    "--nats-url",
    "--cluster",
    "--principal-id",
    "--principal-role",
    "--timeout",
    "--log-level",
    "--api-key",
    "-o",
    "--output",
];

/// argh reads a bare `-` as an unknown flag, so it travels as `STDIO` until the command
/// body sees it.
const STDIO: &str = "\u{1}stdio";

/// Moves the flags given before the command (`svc-files --cluster a put ...`) after it, where
/// the command's parser finds them, and protects `-`.
fn arrange(args: Vec<String>) -> Vec<String> {
    let mut leading = Vec::new();
    let mut iter = args.into_iter();
    let mut rest = Vec::new();
    while let Some(arg) = iter.next() {
        let flag = arg.split_once('=').map_or(arg.as_str(), |(flag, _)| flag);
        if VALUE_FLAGS.contains(&flag) {
            let has_inline = arg.contains('=');
            leading.push(arg);
            if !has_inline {
                leading.extend(iter.next());
            }
        } else {
            rest.push(arg);
            rest.extend(iter.by_ref());
        }
    }
    // Help and version stay first so the planned table still answers them.
    let command = rest.first().cloned();
    let mut arranged = Vec::new();
    if let Some(command) = command {
        arranged.push(command);
        arranged.extend(rest.into_iter().skip(1).map(|arg| {
            if arg == "-" {
                STDIO.to_string()
            } else {
                arg
            }
        }));
    }
    arranged.extend(leading);
    arranged
}

fn is_stdio(arg: &str) -> bool {
    arg == STDIO || arg == "-"
}

/// The flags every command shares (argh has no flattening, so each struct repeats them).
struct Flags {
    nats_url: Option<String>,
    creds: Option<PathBuf>,
    cluster: Option<String>,
    principal_id: Option<String>,
    principal_role: Option<String>,
    timeout: Option<Duration>,
    log_level: Option<String>,
}

macro_rules! files_command {
    ($(#[$meta:meta])* struct $name:ident { $($body:tt)* }) => {
        #[derive(FromArgs, argh::ArgsInfo)]
        $(#[$meta])*
        #[argh(help_triggers("-h", "--help"))]
        struct $name {
            $($body)*
            /// bus URL (env SVC_NATS_URL, default nats://localhost:4222)
            #[argh(option)]
            nats_url: Option<String>,
            /// NATS .creds file for a cluster whose NATS logs clients in with JWTs (from
            /// `svc-cluster nats-config --creds ROLE`; env SVC_NATS_CREDS)
            #[argh(option)]
            creds: Option<PathBuf>,
            /// file-service cluster (env SVC_CLUSTER, default `default`)
            #[argh(option)]
            cluster: Option<String>,
            /// principal id, sent in the bus headers and recorded (env SVC_PRINCIPAL_ID)
            #[argh(option)]
            principal_id: Option<String>,
            /// principal role, sent in the bus headers: admin, operator or readonly; never
            /// above the API key's (env SVC_PRINCIPAL_ROLE)
            #[argh(option, from_str_fn(role))]
            principal_role: Option<String>,
            /// per-request timeout (default 1m0s)
            #[argh(option, from_str_fn(timeout_value))]
            timeout: Option<Duration>,
            /// log level or filter: error, warn (default), info, debug, trace
            #[argh(option, from_str_fn(log_filter))]
            log_level: Option<String>,
            /// API key, the bus credential (env SVC_API_KEY)
            #[argh(option)]
            #[allow(dead_code)]
            api_key: Option<String>,
            /// output format: table (default) or json
            #[argh(option, short = 'o')]
            #[allow(dead_code)]
            output: Option<String>,
        }

        impl $name {
            fn flags(&self) -> Flags {
                Flags {
                    nats_url: self.nats_url.clone(),
                    creds: self.creds.clone(),
                    cluster: self.cluster.clone(),
                    principal_id: self.principal_id.clone(),
                    principal_role: self.principal_role.clone(),
                    timeout: self.timeout,
                    log_level: self.log_level.clone(),
                }
            }
        }
    };
}

files_command! {
    /// Upload LOCAL (`-` for stdin) to REMOTE (a path, or kv://BUCKET/KEY), in chunks; a
    /// retried upload sends only the chunks the server lacks.
    struct PutArgs {
        /// local file, or - for stdin
        #[argh(positional)]
        local: String,
        /// remote path or kv://BUCKET/KEY
        #[argh(positional)]
        remote: String,
    }
}

files_command! {
    /// Download REMOTE to LOCAL (`-` for stdout), checking every chunk's SHA-256 and the
    /// file's; on a mismatch LOCAL is left as it was and the exit code is 1.
    struct GetArgs {
        /// remote path or kv://BUCKET/KEY
        #[argh(positional)]
        remote: String,
        /// local file, or - for stdout
        #[argh(positional)]
        local: String,
    }
}

files_command! {
    /// List objects whose path starts with PREFIX (all when empty).
    struct ListArgs {
        /// path prefix (kv://BUCKET/ for a bucket's keys)
        #[argh(positional)]
        prefix: Option<String>,
    }
}

files_command! {
    /// Show one object's metadata: size, SHA-256, chunk size, times, writer.
    struct StatArgs {
        /// remote path or kv://BUCKET/KEY
        #[argh(positional)]
        remote: String,
    }
}

files_command! {
    /// Delete one object.
    struct DeleteArgs {
        /// remote path or kv://BUCKET/KEY
        #[argh(positional)]
        remote: String,
    }
}

/// A duration as `--timeout` takes it: Go's form (`1m0s`, `1m30s`) or svc's (`500ms`, `30s`).
fn timeout_value(value: &str) -> Result<Duration, String> {
    let bad = || format!("'{value}' is not a positive duration; expected e.g. 1m0s, 30s, 500ms");
    let mut total = Duration::ZERO;
    let mut rest = value.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let after = &rest[digits..];
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let part = &rest[..digits + unit_len];
        total += crate::clock::parse_duration(part).ok_or_else(bad)?;
        rest = &rest[digits + unit_len..];
    }
    if total.is_zero() {
        return Err(bad());
    }
    Ok(total)
}

/// A connected client with what every request carries.
struct Session {
    client: async_nats::Client,
    /// The signing key (SHA-256 of the API key).
    signing_key: [u8; 32],
    /// `_INBOX.<nuid>`: replies arrive on `<inbox>.<n>`.
    inbox: String,
    next_reply: std::sync::atomic::AtomicU64,
    /// Requests waiting for their reply, by reply subject.
    waiting: Waiting,
    cluster: String,
    principal: HeaderMap,
    timeout: Duration,
    /// `-ERR` lines from the bus (a permissions violation), which otherwise only show as a
    /// request that times out.
    refusals: Arc<Mutex<Vec<String>>>,
    output: Output,
}

type Waiting = Arc<
    Mutex<std::collections::HashMap<String, tokio::sync::oneshot::Sender<async_nats::Message>>>,
>;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

async fn connect(common: &Common, flags: Flags) -> Result<Session, CliError> {
    let level = flags.log_level.clone().unwrap_or_else(|| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&level)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let url = flags
        .nats_url
        .or_else(|| env("SVC_NATS_URL"))
        .unwrap_or_else(|| "nats://localhost:4222".into());
    let cluster = flags
        .cluster
        .or_else(|| env("SVC_CLUSTER"))
        .unwrap_or_else(|| "default".into());
    crate::files::check_name("cluster", &cluster).map_err(|e| CliError::usage(e.to_string()))?;
    let timeout = match flags.timeout {
        Some(timeout) => timeout,
        None => timeout_value(DEFAULT_TIMEOUT).expect("the default parses"),
    };
    let mut principal = HeaderMap::new();
    if let Some(id) = flags.principal_id.or_else(|| env("SVC_PRINCIPAL_ID")) {
        principal.insert(PRINCIPAL_ID_HEADER, id.as_str());
    }
    if let Some(declared) = flags.principal_role.or_else(|| env("SVC_PRINCIPAL_ROLE")) {
        role(&declared).map_err(CliError::usage)?;
        principal.insert(PRINCIPAL_ROLE_HEADER, declared.as_str());
    }
    let Some(key) = common.api_key.clone() else {
        return Err(CliError::new(
            exit::DENIED,
            "an API key is required: --api-key or SVC_API_KEY",
        ));
    };
    let refusals: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = refusals.clone();
    // On a JWT-mode cluster the .creds file logs in (the API key still signs each request);
    // elsewhere the API key is the bus credential, as on the embedded broker.
    let creds = flags
        .creds
        .or_else(|| env("SVC_NATS_CREDS").map(PathBuf::from));
    let options = match creds {
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| CliError::usage(format!("--creds: {}: {e}", path.display())))?;
            let (jwt, seed) = crate::bus::natsjwt::parse_creds(&text)
                .map_err(|e| CliError::usage(format!("--creds: {}: {e}", path.display())))?;
            let user = crate::bus::natsjwt::key_pair(&seed)
                .map_err(|e| CliError::usage(format!("--creds: {}: {e}", path.display())))?;
            let inbox = crate::identity::nats::client_inbox(&user.public_key());
            crate::bus::natsjwt::connect_options(jwt, user).custom_inbox_prefix(inbox)
        }
        None => async_nats::ConnectOptions::with_token(key.clone()),
    };
    let options = options
        .name("svc-files")
        .connection_timeout(timeout.min(Duration::from_secs(10)))
        .request_timeout(Some(timeout))
        .max_reconnects(Some(3))
        .event_callback(move |event| {
            let seen = seen.clone();
            async move {
                if let async_nats::Event::ServerError(error) = event {
                    seen.lock().expect("refusals lock").push(error.to_string());
                }
            }
        });
    let client = options.connect(url.as_str()).await.map_err(|e| {
        use async_nats::ConnectErrorKind;
        match e.kind() {
            ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                CliError::new(
                    exit::DENIED,
                    format!("the bus at {url} refused the API key"),
                )
            }
            _ => CliError::new(
                exit::UNREACHABLE,
                format!("cannot reach the bus at {url}: {e}"),
            ),
        }
    })?;
    let inbox = client.new_inbox();
    let mut replies = client
        .subscribe(format!("{inbox}.*"))
        .await
        .map_err(|e| CliError::new(exit::UNREACHABLE, format!("bus: cannot subscribe: {e}")))?;
    let waiting: Waiting = Arc::default();
    let routes = waiting.clone();
    tokio::spawn(async move {
        while let Some(message) = replies.next().await {
            let sender = routes
                .lock()
                .expect("waiting lock")
                .remove(message.subject.as_str());
            if let Some(sender) = sender {
                let _ = sender.send(message);
            }
        }
    });
    Ok(Session {
        client,
        signing_key: crate::files::signature::signing_key(&key),
        inbox,
        next_reply: std::sync::atomic::AtomicU64::new(0),
        waiting,
        cluster,
        principal,
        timeout,
        refusals,
        output: common.output,
    })
}

impl Session {
    /// How many chunk hashes one request or answer carries on this bus.
    fn hashes_per_message(&self) -> usize {
        match self.client.server_info().max_payload as u64 {
            0 => usize::MAX,
            max_payload => crate::files::hashes_per_message(max_payload),
        }
    }

    /// One request; a reply with `Svc-Error` becomes the matching exit code.
    async fn request(
        &self,
        operation: &str,
        extra: &[(&str, &str)],
        body: Bytes,
    ) -> Result<async_nats::Message, CliError> {
        let subject = subjects::files(&self.cluster, operation);
        let mut headers = self.principal.clone();
        for (name, value) in extra {
            headers.insert(*name, *value);
        }
        let reply = format!(
            "{}.{}",
            self.inbox,
            self.next_reply
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let values = SIGNED_HEADERS.map(|name| headers.get(name).map_or("", |v| v.as_str()));
        let request = signature::Request {
            subject: &subject,
            reply: &reply,
            headers: values,
            payload: &body,
        };
        let now = crate::clock::now_millis() / 1000;
        let signed = signature::sign(&self.signing_key, &request, now, &signature::nonce());
        headers.insert(AUTH_HEADER, signed.as_str());
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.waiting
            .lock()
            .expect("waiting lock")
            .insert(reply.clone(), sender);
        let exchange = async {
            self.client
                .publish_with_reply_and_headers(subject.clone(), reply.clone(), headers, body)
                .await
                .map_err(|e| {
                    CliError::new(exit::UNREACHABLE, format!("bus request failed: {e}"))
                })?;
            tokio::time::timeout(self.timeout, receiver)
                .await
                .map_err(|_| {
                    CliError::new(
                        exit::UNREACHABLE,
                        format!(
                            "no answer on {subject} within {}",
                            crate::clock::format_duration(self.timeout)
                        ),
                    )
                })?
                .map_err(|_| CliError::new(exit::UNREACHABLE, "the bus connection closed"))
        };
        let answer = tokio::select! {
            answer = exchange => answer,
            refusal = self.refused() => Err(CliError::new(exit::DENIED, format!("the bus refused: {refusal}"))),
        };
        self.waiting.lock().expect("waiting lock").remove(&reply);
        let message = answer?;
        if message.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            return Err(CliError::new(
                exit::UNREACHABLE,
                format!("no file service answers on {subject} (is svc-server running?)"),
            ));
        }
        if let Some(code) = message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(ERROR_HEADER))
        {
            let text = serde_json::from_slice::<serde_json::Value>(&message.payload)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(String::from))
                .unwrap_or_else(|| code.as_str().to_string());
            return Err(CliError::new(exit::of_code(code.as_str()), text));
        }
        Ok(message)
    }

    /// Resolves when the bus reports a refusal (polled: the event callback runs elsewhere).
    async fn refused(&self) -> String {
        loop {
            if let Some(refusal) = self.refusals.lock().expect("refusals lock").first() {
                return refusal.clone();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn json_request<T: serde::de::DeserializeOwned>(
        &self,
        operation: &str,
        body: serde_json::Value,
    ) -> Result<T, CliError> {
        let message = self
            .request(
                operation,
                &[],
                serde_json::to_vec(&body).expect("JSON").into(),
            )
            .await?;
        serde_json::from_slice(&message.payload)
            .map_err(|e| CliError::failed(format!("malformed answer to {operation}: {e}")))
    }
}

fn io_failed(what: &str, path: &str, e: std::io::Error) -> CliError {
    CliError::failed(format!("{what} {path}: {e}"))
}

/// stdin copied into an unlinked temporary file, so it can be hashed, then read by chunk.
fn spool_stdin() -> Result<File, CliError> {
    let path = std::env::temp_dir().join(format!("svc-files-{}", crate::ids::random_base62(16)));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| io_failed("cannot create", &path.display().to_string(), e))?;
    let _ = std::fs::remove_file(&path);
    std::io::copy(&mut std::io::stdin().lock(), &mut file)
        .and_then(|_| std::io::Seek::rewind(&mut file))
        .map_err(|e| io_failed("cannot read", "stdin", e))?;
    Ok(file)
}

/// Every chunk's SHA-256 and the whole file's.
/// The file's size and SHA-256 and each chunk's, in one read: the chunks are hashed on a
/// second thread beside the whole, so two cores share the work.
fn hash_file(file: &File, chunk_size: u64) -> Result<(u64, String, Vec<[u8; 32]>), CliError> {
    let (to_hasher, from_reader) = std::sync::mpsc::sync_channel::<Arc<Vec<u8>>>(4);
    std::thread::scope(|scope| {
        let chunk_hasher = scope.spawn(move || {
            from_reader
                .iter()
                .map(|buffer| <[u8; 32]>::from(Sha256::digest(&buffer[..])))
                .collect::<Vec<_>>()
        });
        let mut whole = Sha256::new();
        let mut size = 0u64;
        let mut reader = file;
        loop {
            let mut buffer = vec![0u8; chunk_size as usize];
            let mut filled = 0;
            while filled < buffer.len() {
                let read = reader
                    .read(&mut buffer[filled..])
                    .map_err(|e| io_failed("cannot read", "LOCAL", e))?;
                if read == 0 {
                    break;
                }
                filled += read;
            }
            if filled == 0 {
                break;
            }
            buffer.truncate(filled);
            let buffer = Arc::new(buffer);
            whole.update(&buffer[..]);
            size += filled as u64;
            if to_hasher.send(buffer).is_err() || (filled as u64) < chunk_size {
                break;
            }
        }
        drop(to_hasher);
        let chunks = chunk_hasher
            .join()
            .expect("the chunk hasher does not panic");
        Ok((size, hex::encode(whole.finalize()), chunks))
    })
}

async fn put(common: Common, flags: Flags, local: String, remote: String) -> Result<(), CliError> {
    let file = if is_stdio(&local) {
        spool_stdin()?
    } else {
        File::open(&local).map_err(|e| io_failed("cannot open", &local, e))?
    };
    let session = connect(&common, flags).await?;
    let limits: Limits = session
        .json_request("limits", serde_json::json!({}))
        .await?;
    // Refuse what the server would refuse before spending the time to hash it.
    let (max, limit) = if remote.starts_with("kv://") {
        (limits.max_kv_size, "the kv value limit")
    } else {
        (limits.max_object_size, "files.max_object_size")
    };
    let length = file.metadata().map(|m| m.len()).unwrap_or(0);
    if length > max {
        return Err(CliError::failed(format!(
            "{remote} would be {length} bytes, over {limit} ({max} bytes)"
        )));
    }
    let (size, sha256, chunks) = hash_file(&file, limits.chunk_size)?;
    let manifest = serde_json::json!({
        "path": remote,
        "size": size,
        "sha256": sha256,
        "chunk_size": limits.chunk_size,
    });
    let per_message = session.hashes_per_message();
    // The chunk list in pages of what one message carries (one page on a default bus).
    let pages: Vec<&[[u8; 32]]> = if chunks.is_empty() {
        vec![&[]]
    } else {
        chunks.chunks(per_message).collect()
    };
    let mut missing = Vec::new();
    for (page, hashes) in pages.into_iter().enumerate() {
        let mut head = manifest.clone();
        head["from"] = serde_json::json!(page * per_message);
        let head = head.to_string();
        let begun = session
            .request(
                "put",
                &[(MANIFEST_HEADER, head.as_str())],
                hashes.concat().into(),
            )
            .await?;
        #[derive(serde::Deserialize)]
        struct Missing {
            missing: Vec<usize>,
        }
        let answer: Missing = serde_json::from_slice(&begun.payload)
            .map_err(|e| CliError::failed(format!("malformed answer to put: {e}")))?;
        missing.extend(answer.missing);
    }

    let mut bar = Bar::stderr().bytes();
    let to_send: u64 = missing
        .iter()
        .map(|&index| chunk_len(index, size, limits.chunk_size))
        .sum();
    bar.start(&format!("put {remote}"), 0, to_send);
    let file = Arc::new(file);
    let mut sent = 0u64;
    let mut transfers = stream::iter(missing.iter().copied())
        .map(|index| {
            let file = file.clone();
            let session = &session;
            let chunks = &chunks;
            async move {
                let length = chunk_len(index, size, limits.chunk_size);
                let mut buffer = vec![0u8; length as usize];
                file.read_exact_at(&mut buffer, index as u64 * limits.chunk_size)
                    .map_err(|e| io_failed("cannot read", "LOCAL", e))?;
                // Not hashed again here: the server checks every chunk against the hash the
                // manifest declared, so a file that changed since is refused there.
                let hash = hex::encode(chunks[index]);
                session
                    .request("chunk", &[(CHUNK_HEADER, hash.as_str())], buffer.into())
                    .await
                    .map_err(|error| match error.message.contains("SHA-256 mismatch") {
                        true => CliError::failed(format!(
                            "LOCAL changed while it was being uploaded (chunk {index})"
                        )),
                        false => error,
                    })?;
                Ok::<u64, CliError>(length)
            }
        })
        .buffer_unordered(WINDOW);
    while let Some(length) = transfers.try_next().await? {
        sent += length;
        bar.set(sent);
    }
    drop(transfers);
    bar.finish_step();
    bar.clear();
    let committed = commit(&session, manifest, &chunks, limits.chunk_size).await?;
    let meta: ObjectMeta = serde_json::from_slice(&committed.payload)
        .map_err(|e| CliError::failed(format!("malformed answer to commit: {e}")))?;
    let summary = serde_json::json!({
        "path": meta.path,
        "size": meta.size,
        "sha256": meta.sha256,
        "chunks": chunks.len(),
        "chunks_sent": missing.len(),
    });
    match session.output {
        Output::Json => print_json(&summary)?,
        Output::Table => println!(
            "put {} ({} bytes, sha256 {}; sent {} of {} chunks)",
            meta.path,
            meta.size,
            meta.sha256,
            missing.len(),
            chunks.len()
        ),
    }
    Ok(())
}

/// The commit: the chunk list in its body, or, when it is longer than one message carries,
/// sent as chunks itself (and those listed the same way, `list_depth` levels up) so that the
/// commit's body fits. Any member can then read the list back from the store.
async fn commit(
    session: &Session,
    mut manifest: serde_json::Value,
    chunks: &[[u8; 32]],
    chunk_size: u64,
) -> Result<async_nats::Message, CliError> {
    let per_message = session.hashes_per_message();
    let mut level: Vec<u8> = chunks.concat();
    let mut depth = 0u32;
    while level.len() / 32 > per_message {
        if depth == crate::files::MAX_LIST_DEPTH {
            return Err(CliError::failed(
                "the chunk list does not fit in a commit at this bus's max_payload",
            ));
        }
        let pieces: Vec<&[u8]> = level.chunks(chunk_size as usize).collect();
        let hashes: Vec<[u8; 32]> = pieces
            .iter()
            .map(|piece| Sha256::digest(piece).into())
            .collect();
        stream::iter(pieces.iter().zip(&hashes))
            .map(|(piece, hash)| async move {
                let hash = hex::encode(hash);
                session
                    .request(
                        "chunk",
                        &[(CHUNK_HEADER, hash.as_str())],
                        Bytes::copy_from_slice(piece),
                    )
                    .await
            })
            .buffer_unordered(WINDOW)
            .try_collect::<Vec<_>>()
            .await?;
        level = hashes.concat();
        depth += 1;
    }
    if depth > 0 {
        manifest["list_depth"] = serde_json::json!(depth);
    }
    let head = manifest.to_string();
    session
        .request("commit", &[(MANIFEST_HEADER, head.as_str())], level.into())
        .await
}

fn chunk_len(index: usize, size: u64, chunk_size: u64) -> u64 {
    let start = index as u64 * chunk_size;
    chunk_size.min(size.saturating_sub(start))
}

/// Where a get writes: a temporary file beside LOCAL, renamed over it at the end, or stdout.
enum Sink {
    File { temp: PathBuf, file: File },
    Stdout(std::io::Stdout),
}

impl Sink {
    fn open(local: &str) -> Result<Sink, CliError> {
        if is_stdio(local) {
            return Ok(Sink::Stdout(std::io::stdout()));
        }
        let target = Path::new(local);
        let dir = match target.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| CliError::usage(format!("'{local}' is not a file path")))?;
        let temp = dir.join(format!(
            ".{name}.svc-files-{}.partial",
            crate::ids::random_base62(8)
        ));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(|e| io_failed("cannot create", &temp.display().to_string(), e))?;
        Ok(Sink::File { temp, file })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), CliError> {
        match self {
            Sink::File { file, temp } => file
                .write_all(bytes)
                .map_err(|e| io_failed("cannot write", &temp.display().to_string(), e)),
            Sink::Stdout(out) => out
                .write_all(bytes)
                .map_err(|e| io_failed("cannot write", "stdout", e)),
        }
    }

    /// Makes the file LOCAL (fsync, rename), or flushes stdout.
    fn finish(self, local: &str) -> Result<(), CliError> {
        match self {
            Sink::File { temp, file } => {
                let done = file.sync_all().and_then(|()| std::fs::rename(&temp, local));
                if let Err(e) = done {
                    let _ = std::fs::remove_file(&temp);
                    return Err(io_failed("cannot write", local, e));
                }
                Ok(())
            }
            Sink::Stdout(mut out) => out
                .flush()
                .map_err(|e| io_failed("cannot write", "stdout", e)),
        }
    }

    fn abandon(self) {
        if let Sink::File { temp, .. } = self {
            let _ = std::fs::remove_file(temp);
        }
    }
}

async fn get(common: Common, flags: Flags, remote: String, local: String) -> Result<(), CliError> {
    let session = connect(&common, flags).await?;
    // The chunk list comes in pages when it is longer than one message carries; every page
    // must be of the same object (a replacement in between fails the get, never mixes two).
    let mut first: Option<ObjectMeta> = None;
    let mut hashes: Vec<String> = Vec::new();
    loop {
        let request = serde_json::json!({ "path": remote, "from": hashes.len() });
        let opened = session
            .request(
                "get",
                &[],
                serde_json::to_vec(&request).expect("JSON").into(),
            )
            .await?;
        let meta: ObjectMeta = opened
            .headers
            .as_ref()
            .and_then(|headers| headers.get(MANIFEST_HEADER))
            .and_then(|value| serde_json::from_str(value.as_str()).ok())
            .ok_or_else(|| CliError::failed("the answer to get has no manifest"))?;
        if opened.payload.len() % 32 != 0 {
            return Err(CliError::failed(
                "the answer to get has a damaged chunk list",
            ));
        }
        let meta = match first.take() {
            None => meta,
            Some(earlier)
                if earlier.sha256 == meta.sha256 && earlier.chunk_size == meta.chunk_size =>
            {
                earlier
            }
            Some(_) => {
                return Err(CliError::failed(format!(
                    "{remote} was replaced while its chunk list was read; get it again"
                )))
            }
        };
        let expected = meta.size.div_ceil(meta.chunk_size.max(1)) as usize;
        hashes.extend(opened.payload.chunks(32).map(hex::encode));
        let done = hashes.len() >= expected || opened.payload.is_empty();
        first = Some(meta);
        if done {
            break;
        }
    }
    let meta = first.expect("one answer at least");
    let mut sink = Sink::open(&local)?;
    match fetch(&session, &meta, &hashes, &mut sink).await {
        Ok(()) => sink.finish(&local),
        Err(error) => {
            sink.abandon();
            Err(error)
        }
    }
}

async fn fetch(
    session: &Session,
    meta: &ObjectMeta,
    hashes: &[String],
    sink: &mut Sink,
) -> Result<(), CliError> {
    let mut bar = Bar::stderr().bytes();
    bar.start(&format!("get {}", meta.path), 0, meta.size);
    let mut whole = Sha256::new();
    let mut received = 0u64;
    let mut chunks = stream::iter(hashes.iter().enumerate())
        .map(|(index, hash)| async move {
            let message = session
                .request("read", &[(CHUNK_HEADER, hash.as_str())], Bytes::new())
                .await?;
            // A chunk larger than what a message now carries comes in pieces.
            let length = chunk_len(index, meta.size, meta.chunk_size) as usize;
            let mut bytes = message.payload;
            if bytes.len() < length && !bytes.is_empty() {
                let mut whole = bytes.to_vec();
                while whole.len() < length {
                    let offset = serde_json::json!({ "offset": whole.len() });
                    let piece = session
                        .request(
                            "read",
                            &[(CHUNK_HEADER, hash.as_str())],
                            serde_json::to_vec(&offset).expect("JSON").into(),
                        )
                        .await?
                        .payload;
                    if piece.is_empty() {
                        break;
                    }
                    whole.extend_from_slice(&piece);
                }
                bytes = whole.into();
            }
            // Each chunk's hash on the blocking pool, beside the whole file's below.
            let (bytes, actual) = tokio::task::spawn_blocking(move || {
                let actual = crate::files::sha256_hex(&bytes);
                (bytes, actual)
            })
            .await
            .map_err(|e| CliError::failed(format!("hashing failed: {e}")))?;
            Ok::<_, CliError>((index, hash, bytes, actual))
        })
        .buffered(WINDOW);
    while let Some((index, hash, bytes, actual)) = chunks.try_next().await? {
        if &actual != hash {
            return Err(CliError::failed(format!(
                "chunk {index} of {}: SHA-256 mismatch (expected {hash}, got {actual}); nothing written",
                meta.path
            )));
        }
        whole.update(&bytes);
        received += bytes.len() as u64;
        sink.write(&bytes)?;
        bar.set(received);
    }
    bar.finish_step();
    bar.clear();
    let actual = hex::encode(whole.finalize());
    if received != meta.size || actual != meta.sha256 {
        return Err(CliError::failed(format!(
            "{}: SHA-256 mismatch for the whole file (expected {} bytes {}, got {received} bytes {actual})",
            meta.path, meta.size, meta.sha256
        )));
    }
    Ok(())
}

fn row(meta: &ObjectMeta) -> Vec<String> {
    let writer = match &meta.writer.principal_id {
        Some(id) => format!("{} ({})", meta.writer.key_name, id),
        None => meta.writer.key_name.clone(),
    };
    vec![
        meta.path.clone(),
        meta.size.to_string(),
        meta.sha256.clone(),
        meta.updated_at.clone(),
        writer,
    ]
}

const HEADERS: [&str; 5] = ["PATH", "SIZE", "SHA256", "UPDATED", "WRITER"];

async fn list(common: Common, flags: Flags, prefix: String) -> Result<(), CliError> {
    let session = connect(&common, flags).await?;
    // In pages when the list is longer than one message carries (`Svc-More`).
    let mut objects: Vec<ObjectMeta> = Vec::new();
    loop {
        let mut request = serde_json::json!({ "prefix": prefix });
        if let Some(last) = objects.last() {
            request["after"] = serde_json::json!(last.path);
        }
        let answer = session
            .request(
                "list",
                &[],
                serde_json::to_vec(&request).expect("JSON").into(),
            )
            .await?;
        let page: Vec<ObjectMeta> = serde_json::from_slice(&answer.payload)
            .map_err(|e| CliError::failed(format!("malformed answer to list: {e}")))?;
        let more = answer
            .headers
            .as_ref()
            .is_some_and(|headers| headers.get(MORE_HEADER).is_some());
        let empty = page.is_empty();
        objects.extend(page);
        if !more || empty {
            break;
        }
    }
    match session.output {
        Output::Json => print_json(&objects)?,
        Output::Table => print_table(&HEADERS, &objects.iter().map(row).collect::<Vec<_>>()),
    }
    Ok(())
}

async fn stat(common: Common, flags: Flags, remote: String) -> Result<(), CliError> {
    let session = connect(&common, flags).await?;
    let meta: ObjectMeta = session
        .json_request("stat", serde_json::json!({ "path": remote }))
        .await?;
    match session.output {
        Output::Json => print_json(&meta)?,
        Output::Table => print_table(&HEADERS, &[row(&meta)]),
    }
    Ok(())
}

async fn delete(common: Common, flags: Flags, remote: String) -> Result<(), CliError> {
    let session = connect(&common, flags).await?;
    let _: serde_json::Value = session
        .json_request("delete", serde_json::json!({ "path": remote }))
        .await?;
    match session.output {
        Output::Json => print_json(&serde_json::json!({ "deleted": remote }))?,
        Output::Table => println!("deleted {remote}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts() {
        let cases = [
            ("1m0s", Some(60_000)),
            ("1m30s", Some(90_000)),
            ("500ms", Some(500)),
            ("30s", Some(30_000)),
            ("0s", None),
            ("", None),
            ("1x", None),
        ];
        for (text, expected) in cases {
            let parsed = timeout_value(text).ok().map(|d| d.as_millis() as u64);
            assert_eq!(parsed, expected, "{text}");
        }
    }

    #[test]
    fn flags_before_the_command_move_after_it() {
        let strings = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let cases: &[(&[&str], &[&str])] = &[
            (
                &["--cluster", "a", "put", "-", "x"],
                &["put", STDIO, "x", "--cluster", "a"],
            ),
            (&["--timeout=5s", "list"], &["list", "--timeout=5s"]),
            (
                &["get", "r", "-", "-o", "json"],
                &["get", "r", STDIO, "-o", "json"],
            ),
            (&["--help"], &["--help"]),
        ];
        for (input, expected) in cases {
            assert_eq!(arrange(strings(input)), strings(expected), "{input:?}");
        }
    }

    #[test]
    fn chunk_lengths() {
        assert_eq!(chunk_len(0, 10, 4), 4);
        assert_eq!(chunk_len(2, 10, 4), 2);
        assert_eq!(chunk_len(0, 0, 4), 0);
    }
}
