//! A stream kept in a JetStream stream of a NATS cluster: what the events and audit streams
//! are in cluster mode, behind the same [`Stream`] interface as the local log.
//!
//! The mapping (docs/stream-jetstream.md has the reasoning and figures):
//! - one JetStream stream per svc stream, `SVC_EVENTS` / `SVC_AUDIT`, file storage, one
//!   subject each (`svc.js.events` / `svc.js.audit`, not the live fan-out `svc.events.*` any
//!   client may publish on), `max_age`/`max_bytes` from the stream's retention settings with
//!   discard-old, replicas as the caller says (min(3, cluster size));
//! - a record is one message: the payload as is, its timestamp in the `Svc-Ts` header
//!   (milliseconds), a `Nats-Msg-Id` so a publish retried after a lost acknowledgement is not
//!   stored twice. Its sequence is the stream sequence from the PubAck, and JetStream's
//!   sequences are what the local log's are: from 1, dense, the oldest dropped by retention;
//! - a read starting at most 32 records behind the last sequence seen (or past it) is
//!   `STREAM.MSG.GET`s by sequence, sent together (answered by the stream leader, so a read
//!   never misses an acknowledged record); longer reads go through an ephemeral pull consumer
//!   (deliver by start sequence, no acks) that is deleted after the read, or by gets when no
//!   consumer can be created (no meta leader during an election);
//! - `subscribe` is fed by one ordered push consumer per open stream (headers only, from the
//!   last sequence at open), so it moves on every append by any server, in order.
//!
//! Retention is JetStream's (`enforce_retention` does nothing).

use std::future::IntoFuture;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream as js};
use async_nats::HeaderMap;
use futures_util::StreamExt;
use tokio::sync::watch;

use super::{Record, Stream, StreamConfig};
use crate::{Error, Result};

/// The header a record's timestamp (Unix milliseconds) travels in.
pub const TIMESTAMP_HEADER: &str = "Svc-Ts";
/// How long a publish is retried (same message id) before an append fails: covers a stream
/// leader election after a NATS node dies.
const PUBLISH_RETRY_FOR: Duration = Duration::from_secs(15);
/// What a JetStream API request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Reads of at most this many records just behind the last one use gets by sequence.
const SMALL_READ: u64 = 32;
/// How long `open` keeps trying to create or update the stream.
const OPEN_RETRY_FOR: Duration = Duration::from_secs(30);
/// How long a time lookup keeps trying to create its consumer.
const CONSUMER_RETRY_FOR: Duration = Duration::from_secs(10);
/// The most records a read takes by gets when it cannot create a consumer.
const GET_FALLBACK_MAX: usize = 256;
/// How long one publish waits for its acknowledgement before it is sent again (same message
/// id): short, so that a publish lost with a dying stream leader is retried soon after the
/// election rather than after the client's whole request timeout.
const ACK_WAIT: Duration = Duration::from_secs(2);
/// How long `health` waits for the stream's info.
const HEALTH_LIMIT: Duration = Duration::from_secs(2);
/// Timestamps of records are the writers' clocks, `seq_for_time` starts from JetStream's
/// own receive times: it starts this much earlier to allow for skew between the two.
const CLOCK_SKEW: Duration = Duration::from_secs(2);

/// The JetStream stream name for an svc stream (`events` → `SVC_EVENTS`).
pub fn stream_name(name: &str) -> String {
    format!("SVC_{}", name.to_ascii_uppercase())
}

/// The one subject an svc stream's records are published on (`events` → `svc.js.events`).
pub fn subject(name: &str) -> String {
    format!("svc.js.{name}")
}

/// The JetStream configuration `open` creates or updates the stream with.
pub fn stream_config(name: &str, config: &StreamConfig, replicas: usize) -> js::Config {
    js::Config {
        name: stream_name(name),
        description: Some(format!("svc {name} stream")),
        subjects: vec![subject(name)],
        storage: js::StorageType::File,
        num_replicas: replicas.max(1),
        retention: js::RetentionPolicy::Limits,
        discard: js::DiscardPolicy::Old,
        max_age: config.max_age.unwrap_or_default(),
        max_bytes: config
            .max_bytes
            .map_or(-1, |bytes| i64::try_from(bytes).unwrap_or(i64::MAX)),
        max_messages: -1,
        max_messages_per_subject: -1,
        max_message_size: -1,
        max_consumers: -1,
        // Records are only ever added; nothing may punch holes in the sequence.
        deny_delete: true,
        allow_direct: true,
        ..Default::default()
    }
}

/// An svc stream in JetStream.
pub struct JetStreamLog {
    name: String,
    stream_name: String,
    subject: String,
    context: jetstream::Context,
    stream: js::Stream<()>,
    durable: watch::Receiver<u64>,
    follower: Arc<Follower>,
    task: tokio::task::JoinHandle<()>,
    /// When a failed publish was last logged at warn (ms since the Unix epoch): a node that
    /// went away fails every record in flight, thousands at once in a large fleet, and one
    /// warning a second says as much as all of them.
    warned_at_ms: std::sync::atomic::AtomicI64,
}

/// What the task following the stream shares with the handle.
struct Follower {
    durable: watch::Sender<u64>,
    failure: Mutex<Option<String>>,
}

impl Follower {
    fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_failure(&self, failure: Option<String>) {
        *self.failure.lock().unwrap_or_else(PoisonError::into_inner) = failure;
    }
}

impl Drop for JetStreamLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl JetStreamLog {
    /// Creates (or brings to `config` and `replicas`) the JetStream stream for `name`
    /// (`events` or `audit`) and starts following it.
    pub async fn open(
        client: async_nats::Client,
        name: &str,
        config: &StreamConfig,
        replicas: usize,
    ) -> Result<Arc<JetStreamLog>> {
        let mut context = jetstream::new(client.clone());
        context.set_timeout(REQUEST_TIMEOUT);
        let stream_name = stream_name(name);
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            Error::Unavailable(format!(
                "stream {name} (JetStream {stream_name}): {what}: {e}"
            ))
        };
        // A NATS cluster that is starting with us has no JetStream meta leader for a few
        // seconds: keep trying for a while rather than fail the server's start.
        let deadline = tokio::time::Instant::now() + OPEN_RETRY_FOR;
        let started = tokio::time::Instant::now();
        let info = loop {
            match context
                .create_or_update_stream(stream_config(name, config, replicas))
                .await
            {
                Ok(info) => break info,
                // "No suitable peers" is also what a cluster answers while its nodes are still
                // joining the meta group, so it gets a short grace; asking for more replicas
                // than there are nodes still fails within seconds, naming the stream.
                Err(e) if is_no_peers(&e) && started.elapsed() < NO_PEERS_GRACE => {
                    tracing::warn!(stream = %name, jetstream = %stream_name, error = %e, "JetStream peers not all known yet; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) if !is_transient(&e) || tokio::time::Instant::now() >= deadline => {
                    return Err(failed("create or update", &e))
                }
                Err(e) => {
                    tracing::warn!(stream = %name, jetstream = %stream_name, error = %e, "JetStream not ready; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        };
        let stream = context
            .get_stream_no_info(&stream_name)
            .await
            .map_err(|e| failed("open", &e))?;
        let last = info.state.last_sequence;
        let (sender, durable) = watch::channel(last);
        let follower = Arc::new(Follower {
            durable: sender,
            failure: Mutex::new(None),
        });
        let task = tokio::spawn(follow(
            client,
            stream.clone(),
            format!("{name} (JetStream {stream_name})"),
            follower.clone(),
        ));
        tracing::info!(stream = %name, jetstream = %stream_name, replicas, last_seq = last, "JetStream stream open");
        Ok(Arc::new(JetStreamLog {
            name: name.to_string(),
            subject: subject(name),
            stream_name,
            context,
            stream,
            durable,
            follower,
            task,
            warned_at_ms: std::sync::atomic::AtomicI64::new(0),
        }))
    }

    fn failed(&self, what: &str, error: impl std::fmt::Display) -> Error {
        Error::Unavailable(format!(
            "stream {} (JetStream {}): {what}: {error}",
            self.name, self.stream_name
        ))
    }

    /// The stream's state as its leader has it now.
    pub async fn info(&self) -> Result<js::Info> {
        self.stream
            .get_info()
            .await
            .map_err(|e| self.failed("stream info", e))
    }

    /// Publishes one record and waits for its acknowledgement, retrying with the same message
    /// id (so a record stored before its acknowledgement was lost is not stored twice).
    async fn publish(&self, timestamp_ms: i64, payload: bytes::Bytes) -> Result<u64> {
        let headers = self.headers(timestamp_ms);
        self.publish_with(headers, payload, None).await
    }

    fn headers(&self, timestamp_ms: i64) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(TIMESTAMP_HEADER, timestamp_ms.to_string().as_str());
        headers.insert("Nats-Msg-Id", crate::ids::ulid().as_str());
        headers
    }

    /// Waits for `first` (an acknowledgement already on its way), else publishes, retrying
    /// until [`PUBLISH_RETRY_FOR`] has passed.
    async fn publish_with(
        &self,
        headers: HeaderMap,
        payload: bytes::Bytes,
        first: Option<jetstream::context::PublishAckFuture>,
    ) -> Result<u64> {
        let deadline = tokio::time::Instant::now() + PUBLISH_RETRY_FOR;
        let mut pending = first;
        let mut attempt = 0u32;
        loop {
            let ack = match pending.take() {
                Some(ack) => Ok(ack),
                None => self
                    .context
                    .publish_with_headers(self.subject.clone(), headers.clone(), payload.clone())
                    .await
                    .map_err(|e| e.to_string()),
            };
            let result = match ack {
                Ok(ack) => match tokio::time::timeout(ACK_WAIT, ack.into_future()).await {
                    Ok(acked) => acked.map_err(|e| e.to_string()),
                    Err(_) => Err(format!("no acknowledgement within {ACK_WAIT:?}")),
                },
                Err(e) => Err(e),
            };
            attempt += 1;
            match result {
                Ok(ack) if ack.duplicate && attempt == 1 => {
                    return Err(Error::internal(format!(
                        "stream {}: JetStream {} took a first publish for a duplicate (message id reused?)",
                        self.name, self.stream_name
                    )));
                }
                // A duplicate on a retry is the earlier attempt's record: its sequence.
                Ok(ack) => return Ok(ack.sequence),
                Err(error) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(self.failed("publish", error));
                    }
                    let now = crate::clock::now_millis();
                    let last = self.warned_at_ms.load(std::sync::atomic::Ordering::Relaxed);
                    if now - last >= 1000
                        && self
                            .warned_at_ms
                            .compare_exchange(
                                last,
                                now,
                                std::sync::atomic::Ordering::Relaxed,
                                std::sync::atomic::Ordering::Relaxed,
                            )
                            .is_ok()
                    {
                        tracing::warn!(stream = %self.name, attempt, %error, "JetStream publish failed; retrying (more such failures within a second are logged at debug)");
                    } else {
                        tracing::debug!(stream = %self.name, attempt, %error, "JetStream publish failed; retrying");
                    }
                    let pause = Duration::from_millis(100 * u64::from(attempt.min(10)));
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// An ephemeral consumer delivering from `policy` (deleted when the cursor drops).
    async fn cursor(&self, policy: consumer::DeliverPolicy, headers_only: bool) -> Result<Cursor> {
        let consumer = self
            .stream
            .create_consumer(consumer::pull::Config {
                deliver_policy: policy,
                ack_policy: consumer::AckPolicy::None,
                headers_only,
                num_replicas: 1,
                // Only a backstop: the cursor deletes it when done.
                inactive_threshold: Duration::from_secs(30),
                ..Default::default()
            })
            .await
            .map_err(|e| self.failed("create read consumer", e))?;
        Ok(Cursor {
            consumer: Some(consumer),
            stream: self.stream.clone(),
        })
    }

    /// Up to `max` messages from the cursor (fewer only at the end of the stream).
    async fn fetch(&self, cursor: &Cursor, max: usize) -> Result<Vec<jetstream::Message>> {
        let consumer = cursor.consumer.as_ref().expect("cursor has its consumer");
        let mut messages = Vec::new();
        while messages.len() < max {
            let want = (max - messages.len()).min(1024);
            let mut batch = consumer
                .fetch()
                .max_messages(want)
                .messages()
                .await
                .map_err(|e| self.failed("fetch", e))?;
            let before = messages.len();
            while let Some(message) = batch.next().await {
                messages.push(message.map_err(|e| self.failed("fetch", e))?);
            }
            if messages.len() - before < want {
                break;
            }
        }
        Ok(messages)
    }

    fn record_of(&self, message: &jetstream::Message) -> Result<Record> {
        let info = message
            .info()
            .map_err(|e| Error::internal(format!("stream {}: {e}", self.name)))?;
        let timestamp_ms = timestamp_of(message.message.headers.as_ref())
            .unwrap_or_else(|| millis(info.published));
        Ok(Record {
            seq: info.stream_sequence,
            timestamp_ms,
            payload: message.message.payload.to_vec(),
        })
    }

    /// Records `from..` through an ephemeral consumer.
    async fn read_by_consumer(&self, from: u64, max: usize) -> Result<Vec<Record>> {
        let cursor = self
            .cursor(
                consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: from,
                },
                false,
            )
            .await?;
        let messages = self.fetch(&cursor, max).await?;
        messages.iter().map(|m| self.record_of(m)).collect()
    }

    /// Records `from..` by gets of single sequences, stopping at the first missing one.
    /// `None` when `from` itself is missing and is not past the end (retention dropped it).
    async fn read_by_gets(&self, from: u64, max: usize) -> Result<Option<Vec<Record>>> {
        let mut records = Vec::new();
        let mut seq = from;
        while records.len() < max {
            // The sequences the follower has seen are all there: ask for them at once (the
            // answers come back in order); past them, one at a time until one is missing.
            let known = *self.durable.borrow();
            let at_once = if seq > known {
                1
            } else {
                (known - seq + 1).min((max - records.len()) as u64) as usize
            };
            let gets = (0..at_once as u64).map(|i| self.stream.get_raw_message(seq + i));
            for got in futures_util::future::join_all(gets).await {
                match got {
                    Ok(message) => records.push(Record {
                        seq: message.sequence,
                        timestamp_ms: timestamp_of(Some(&message.headers))
                            .unwrap_or_else(|| millis(message.time)),
                        payload: message.payload.to_vec(),
                    }),
                    Err(e) if e.kind() == js::RawMessageErrorKind::NoMessageFound => {
                        if records.is_empty() {
                            let state = self.info().await?.state;
                            if seq > state.last_sequence {
                                return Ok(Some(records));
                            }
                            return Ok(None);
                        }
                        return Ok(Some(records));
                    }
                    Err(e) => return Err(self.failed("get message", e)),
                }
            }
            seq += at_once as u64;
        }
        Ok(Some(records))
    }
}

/// An ephemeral read consumer, deleted in the background when dropped.
struct Cursor {
    consumer: Option<consumer::Consumer<consumer::pull::Config>>,
    stream: js::Stream<()>,
}

impl Drop for Cursor {
    fn drop(&mut self) {
        let Some(consumer) = self.consumer.take() else {
            return;
        };
        let name = consumer.cached_info().name.clone();
        let stream = self.stream.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = stream.delete_consumer(&name).await {
                    tracing::debug!(consumer = %name, error = %e, "read consumer not deleted (it expires by itself)");
                }
            });
        }
    }
}

fn timestamp_of(headers: Option<&HeaderMap>) -> Option<i64> {
    headers?.get(TIMESTAMP_HEADER)?.as_str().parse().ok()
}

fn millis(time: async_nats::datetime::DateTime) -> i64 {
    (time.unix_timestamp_nanos() / 1_000_000) as i64
}

/// Follows the stream from the last sequence at open, moving `durable` on each message, and
/// starts over (from where it got to) after any failure.
async fn follow(
    client: async_nats::Client,
    stream: js::Stream<()>,
    label: String,
    follower: Arc<Follower>,
) {
    loop {
        let start = *follower.durable.borrow() + 1;
        let error = match follow_from(&client, &stream, start, &follower).await {
            Ok(()) => "the ordered consumer ended".to_string(),
            Err(e) => e,
        };
        tracing::warn!(stream = %label, %error, "following the JetStream stream failed; starting over");
        follower.set_failure(Some(format!(
            "stream {label}: following it failed: {error}"
        )));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn follow_from(
    client: &async_nats::Client,
    stream: &js::Stream<()>,
    start: u64,
    follower: &Follower,
) -> std::result::Result<(), String> {
    let consumer = stream
        .create_consumer(consumer::push::OrderedConfig {
            deliver_subject: client.new_inbox(),
            deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                start_sequence: start,
            },
            headers_only: true,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
    follower.set_failure(None);
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| e.to_string())?;
        let seq = message.info().map_err(|e| e.to_string())?.stream_sequence;
        follower.durable.send_if_modified(|durable| {
            let moved = seq > *durable;
            if moved {
                *durable = seq;
            }
            moved
        });
    }
    Ok(())
}

#[async_trait::async_trait]
impl Stream for JetStreamLog {
    fn name(&self) -> &str {
        &self.name
    }

    async fn append(&self, timestamp_ms: i64, payload: Vec<u8>) -> Result<u64> {
        check_size(&payload)?;
        self.publish(timestamp_ms, payload.into()).await
    }

    /// Pipelined: every record is published before the first acknowledgement is awaited.
    /// Other servers' records may land in between, so the sequences are increasing but not
    /// necessarily consecutive.
    async fn append_batch(&self, items: Vec<(i64, Vec<u8>)>) -> Result<Vec<u64>> {
        for (_, payload) in &items {
            check_size(payload)?;
        }
        let mut sent = Vec::with_capacity(items.len());
        for (timestamp_ms, payload) in items {
            let headers = self.headers(timestamp_ms);
            let payload = bytes::Bytes::from(payload);
            // A publish that fails to go out is retried in order below.
            let ack = self
                .context
                .publish_with_headers(self.subject.clone(), headers.clone(), payload.clone())
                .await
                .ok();
            sent.push((headers, payload, ack));
        }
        let mut seqs = Vec::with_capacity(sent.len());
        for (headers, payload, ack) in sent {
            let seq = self.publish_with(headers, payload, ack).await?;
            if seqs.last().is_some_and(|last| *last >= seq) {
                tracing::error!(stream = %self.name, seq, "a retried publish landed out of order in its batch");
            }
            seqs.push(seq);
        }
        Ok(seqs)
    }

    async fn read(&self, from_seq: u64, max: usize) -> Result<Vec<Record>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let from = from_seq.max(1);
        let known = *self.durable.borrow();
        let mut records = Vec::new();
        // A follower's few new records (or an empty read past the end): gets by sequence.
        if from > known || known - from < SMALL_READ {
            if let Some(got) = self
                .read_by_gets(from, max.min(SMALL_READ as usize))
                .await?
            {
                if got.len() < SMALL_READ as usize || got.len() == max {
                    return Ok(got);
                }
                records = got;
            }
        }
        let next = records.last().map_or(from, |r| r.seq + 1);
        let want = max - records.len();
        match self.read_by_consumer(next, want).await {
            Ok(more) => records.extend(more),
            Err(error) => {
                // Consumers need the meta leader, gets only the stream leader: a read still
                // works while the cluster elects a new meta leader.
                tracing::warn!(stream = %self.name, %error, "read consumer failed; reading by gets");
                let next = next.max(self.first_seq().await?);
                let gets = want.min(GET_FALLBACK_MAX);
                records.extend(self.read_by_gets(next, gets).await?.unwrap_or_default());
            }
        }
        Ok(records)
    }

    async fn seq_for_time(&self, timestamp_ms: i64) -> Result<u64> {
        let start = timestamp_ms.saturating_sub(CLOCK_SKEW.as_millis() as i64);
        let start_time = async_nats::datetime::from_nanos(i128::from(start) * 1_000_000)
            .map_err(|e| Error::Invalid(format!("time {timestamp_ms}: {e}")))?;
        // A consumer needs the meta leader: while the cluster elects one, try again (there
        // is no other way to look up a time on 2.9).
        let deadline = tokio::time::Instant::now() + CONSUMER_RETRY_FOR;
        let cursor = loop {
            match self
                .cursor(consumer::DeliverPolicy::ByStartTime { start_time }, true)
                .await
            {
                Ok(cursor) => break cursor,
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(e) => {
                    tracing::warn!(stream = %self.name, error = %e, "time lookup consumer failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        };
        loop {
            let batch = self.fetch(&cursor, 1024).await?;
            for message in &batch {
                let record = self.record_of(message)?;
                if record.timestamp_ms >= timestamp_ms {
                    return Ok(record.seq);
                }
            }
            if batch.len() < 1024 {
                // Nothing that recent: the next sequence to be written.
                return Ok(self.info().await?.state.last_sequence + 1);
            }
        }
    }

    async fn first_seq(&self) -> Result<u64> {
        let state = self.info().await?.state;
        Ok(if state.messages == 0 {
            state.last_sequence + 1
        } else {
            state.first_sequence
        })
    }

    async fn last_seq(&self) -> Result<u64> {
        Ok(self.info().await?.state.last_sequence)
    }

    async fn bytes(&self) -> Result<u64> {
        Ok(self.info().await?.state.bytes)
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.durable.clone()
    }

    async fn enforce_retention(&self) -> Result<u64> {
        Ok(0)
    }

    async fn health(&self) -> Result<()> {
        match tokio::time::timeout(HEALTH_LIMIT, self.stream.get_info()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(self.failed("stream info", e)),
            Err(_) => {
                return Err(self.failed("stream info", format!("no answer within {HEALTH_LIMIT:?}")))
            }
        }
        match self.follower.failure() {
            Some(failure) => Err(Error::Unavailable(failure)),
            None => Ok(()),
        }
    }
}

/// Whether a create/update failed for a reason that goes away by itself (no meta leader yet,
/// no answer), rather than for the request (bad config, not enough servers for the replicas).
/// How long "no suitable peers" is retried at open (a forming cluster).
pub(crate) const NO_PEERS_GRACE: Duration = Duration::from_secs(3);

pub(crate) fn is_no_peers(error: &jetstream::context::CreateStreamError) -> bool {
    use async_nats::jetstream::{context::CreateStreamErrorKind as Kind, ErrorCode};
    matches!(error.kind(), Kind::JetStream(e) if e.error_code() == ErrorCode::CLUSTER_NO_PEERS)
}

pub(crate) fn is_transient(error: &jetstream::context::CreateStreamError) -> bool {
    use async_nats::jetstream::{context::CreateStreamErrorKind as Kind, ErrorCode};
    match error.kind() {
        Kind::TimedOut | Kind::JetStreamUnavailable | Kind::Response => true,
        Kind::JetStream(e) => matches!(
            e.error_code(),
            ErrorCode::CLUSTER_NOT_AVAILABLE
                | ErrorCode::CLUSTER_NOT_LEADER
                | ErrorCode::CLUSTER_INCOMPLETE
                | ErrorCode::CLUSTER_NOT_ASSIGNED
        ),
        _ => false,
    }
}

fn check_size(payload: &[u8]) -> Result<()> {
    if payload.len() > super::MAX_PAYLOAD {
        return Err(Error::TooLarge(format!(
            "stream record of {} bytes is above the {}-byte limit",
            payload.len(),
            super::MAX_PAYLOAD
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_config_follows_the_retention_settings() {
        let config = StreamConfig {
            max_age: Some(Duration::from_secs(3600)),
            max_bytes: Some(1 << 20),
            ..StreamConfig::default()
        };
        let js = stream_config("audit", &config, 3);
        assert_eq!(js.name, "SVC_AUDIT");
        assert_eq!(js.subjects, vec!["svc.js.audit".to_string()]);
        assert_eq!(js.num_replicas, 3);
        assert_eq!(js.storage, js::StorageType::File);
        assert_eq!(js.discard, js::DiscardPolicy::Old);
        assert_eq!(js.max_age, Duration::from_secs(3600));
        assert_eq!(js.max_bytes, 1 << 20);
        let unlimited = stream_config("events", &StreamConfig::default(), 0);
        assert_eq!(unlimited.max_bytes, -1);
        assert_eq!(unlimited.max_age, Duration::ZERO);
        assert_eq!(unlimited.num_replicas, 1);
        assert_eq!(unlimited.subjects, vec!["svc.js.events".to_string()]);
    }

    #[test]
    fn timestamps_come_from_the_header() {
        let mut headers = HeaderMap::new();
        headers.insert(TIMESTAMP_HEADER, "1700000000123");
        assert_eq!(timestamp_of(Some(&headers)), Some(1_700_000_000_123));
        assert_eq!(timestamp_of(Some(&HeaderMap::new())), None);
        assert_eq!(timestamp_of(None), None);
    }
}
