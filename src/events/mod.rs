//! The event stream (contract §8): one emit function for every subsystem, the durable log,
//! and reads (list, get, subscribe, replay, stats).
//!
//! An event is appended to the `events` stream log and acknowledged only once it is durable;
//! then it is fanned out live on the bus (`svc.events.<type>`). Readers always read the log,
//! the live notification only wakes them, so a subscriber that replays history and then follows
//! live events sees every event once, with no gap or duplicate at the seam.

pub mod timeline;
pub mod types;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::auth::{Principal, Role};
use crate::stream::{Record, Stream};
use crate::{clock, ids, Error, Result};

pub use types::{EventKind, EventType, Severity, SEVERITIES, TYPES};

/// Largest payload an event may carry (JSON text), so one event never dominates a read.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
const READ_BATCH: usize = 512;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: String,
    /// The stream sequence; not stored in the record (the log numbers it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub seq: u64,
    #[serde(rename = "type")]
    pub event_type: EventKind,
    pub category: String,
    pub severity: Severity,
    pub source: String,
    pub timestamp: String,
    pub payload: Value,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// What a caller wants emitted.
#[derive(Clone, Debug, Default)]
pub struct NewEvent {
    pub event_type: String,
    pub severity: Option<String>,
    pub source: Option<String>,
    pub payload: Option<Value>,
}

/// Which events a read wants. Times are Unix milliseconds.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub types: Vec<EventKind>,
    pub category: Option<String>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    pub min_severity: Option<Severity>,
    pub source: Option<String>,
}

impl Filter {
    /// Builds a filter from the text forms the CLIs and RPCs use.
    pub fn parse(
        types: Vec<String>,
        category: &str,
        since: &str,
        until: &str,
        min_severity: &str,
        source: &str,
    ) -> Result<Filter> {
        let time = |text: &str, name: &str| -> Result<Option<i64>> {
            if text.is_empty() {
                return Ok(None);
            }
            clock::parse_time_or_ago(text).map(Some).ok_or_else(|| {
                Error::Invalid(format!(
                    "{name} '{text}' is neither RFC 3339 nor a duration like 24h"
                ))
            })
        };
        let types = types
            .iter()
            .map(|name| kind_of(name))
            .collect::<Result<Vec<_>>>()?;
        let min_severity = match min_severity {
            "" => None,
            text => Some(severity_of(text)?),
        };
        Ok(Filter {
            types,
            category: (!category.is_empty()).then(|| category.to_string()),
            since_ms: time(since, "since")?,
            until_ms: time(until, "until")?,
            min_severity,
            source: (!source.is_empty()).then(|| source.to_string()),
        })
    }

    fn matches(&self, event: &Event, timestamp_ms: i64) -> bool {
        (self.types.is_empty() || self.types.contains(&event.event_type))
            && self.category.as_ref().is_none_or(|c| *c == event.category)
            && self.since_ms.is_none_or(|s| timestamp_ms >= s)
            && self.until_ms.is_none_or(|u| timestamp_ms < u)
            && self.min_severity.is_none_or(|min| event.severity >= min)
            && self.source.as_ref().is_none_or(|s| *s == event.source)
    }
}

/// The kind a type name names, or the error that lists where the names are.
fn kind_of(name: &str) -> Result<EventKind> {
    types::find(name)
        .map(|t| t.kind)
        .ok_or_else(|| unknown_type(name))
}

fn severity_of(text: &str) -> Result<Severity> {
    Severity::parse(text).ok_or_else(|| {
        Error::Invalid(format!(
            "severity '{text}' is not one of {}",
            SEVERITIES.join(", ")
        ))
    })
}

fn unknown_type(name: &str) -> Error {
    Error::Invalid(format!(
        "unknown event type '{name}' (svc-events types lists the {} types)",
        TYPES.len()
    ))
}

/// The live form of a stored event: the stored JSON with `"seq":N` spliced in after the id,
/// which is the text `serde_json` gives for the event with its sequence set (fields in
/// declaration order: id, seq, type, ...; a test holds the two equal). Saves the second
/// serialization of every emit (issue 21). Anything unexpected is serialized again.
fn live_copy(stored: &[u8], event: &Event) -> Vec<u8> {
    let id = event.id.as_bytes();
    // `{"id":"` + id (a ULID: nothing to escape) + `",`
    let head = 7 + id.len() + 2;
    let spliceable = stored.len() > head
        && stored.starts_with(b"{\"id\":\"")
        && &stored[7..7 + id.len()] == id
        && &stored[7 + id.len()..head] == b"\","
        && id.iter().all(u8::is_ascii_alphanumeric);
    if !spliceable {
        return serde_json::to_vec(event).unwrap_or_default();
    }
    let mut out = Vec::with_capacity(stored.len() + 28);
    out.extend_from_slice(&stored[..head]);
    out.extend_from_slice(b"\"seq\":");
    out.extend_from_slice(event.seq.to_string().as_bytes());
    out.push(b',');
    out.extend_from_slice(&stored[head..]);
    out
}

/// Events waiting to be published live; beyond it an event is stored but not fanned out.
const LIVE_QUEUE: usize = 4096;

/// Where stored events are fanned out live.
enum Live {
    /// A bus client (an external NATS cluster): one task publishes in emit order.
    Client(mpsc::Sender<(String, Vec<u8>)>),
    /// The embedded broker, published into in process (no client connection in between).
    Broker(crate::bus::broker::LocalPublisher),
}

pub struct Events {
    log: Arc<dyn Stream>,
    /// The live fan-out (None without a bus).
    live: Option<Live>,
    counts: std::sync::Mutex<std::collections::BTreeMap<EventKind, u64>>,
    /// Flips when the server stops, so live subscriptions end instead of holding shutdown.
    stopping: watch::Receiver<bool>,
}

fn decode(record: &Record) -> Option<Event> {
    let mut event: Event = serde_json::from_slice(&record.payload).ok()?;
    event.seq = record.seq;
    Some(event)
}

impl Events {
    /// With `bus`, every stored event is also published on `svc.events.<type>`: one task
    /// publishes in emit order, and a full queue drops the live copy (logged) rather than
    /// slowing emitters, since the durable log already has every event.
    pub fn new(
        log: Arc<dyn Stream>,
        stopping: watch::Receiver<bool>,
        bus: Option<async_nats::Client>,
    ) -> Self {
        let live = bus.map(|client| {
            let (sender, mut queue) = mpsc::channel::<(String, Vec<u8>)>(LIVE_QUEUE);
            tokio::spawn(async move {
                while let Some((subject, bytes)) = queue.recv().await {
                    if let Err(e) = client.publish(subject, bytes.into()).await {
                        tracing::warn!(error = %e, "live event publish failed");
                    }
                }
            });
            Live::Client(sender)
        });
        Events {
            log,
            live,
            counts: Default::default(),
            stopping,
        }
    }

    /// Fans out live through the embedded broker in process instead of a bus client: the
    /// same subscribers get the same messages without the loopback hop (issue 21).
    pub fn with_broker(mut self, publisher: crate::bus::broker::LocalPublisher) -> Self {
        self.live = Some(Live::Broker(publisher));
        self
    }

    pub fn log(&self) -> &Arc<dyn Stream> {
        &self.log
    }

    /// Events emitted since start, by type (for `svc_events_total{type}`).
    pub fn counts(&self) -> Vec<(String, u64)> {
        let counts = self.counts.lock().expect("counts lock poisoned");
        counts.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// The one emit function: validates, appends durably, then fans out live.
    pub async fn emit(&self, new: NewEvent, default_source: &str) -> Result<Event> {
        let kind = kind_of(&new.event_type)?.info();
        let severity = match new.severity.filter(|s| !s.is_empty()) {
            Some(text) => severity_of(&text)?,
            None => kind.severity,
        };
        let payload = new
            .payload
            .unwrap_or_else(|| Value::Object(Default::default()));
        if !payload.is_object() {
            return Err(Error::Invalid("payload must be a JSON object".into()));
        }
        let now = clock::now_millis();
        let mut event = Event {
            id: ids::ulid(),
            seq: 0,
            event_type: kind.kind,
            category: kind.category.to_string(),
            severity,
            source: new
                .source
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| default_source.to_string()),
            timestamp: clock::format_rfc3339(now),
            payload,
        };
        let bytes = serde_json::to_vec(&event).map_err(Error::internal)?;
        if bytes.len() > MAX_PAYLOAD_BYTES {
            return Err(Error::TooLarge(format!(
                "event is larger than {MAX_PAYLOAD_BYTES} bytes"
            )));
        }
        // Kept for the live copy (`live_copy`), so the event is serialized once.
        let stored = self.live.as_ref().map(|_| bytes.clone());
        event.seq = self.log.append(now, bytes).await?;
        *self
            .counts
            .lock()
            .expect("counts lock poisoned")
            .entry(event.event_type)
            .or_default() += 1;
        // The live copy carries the sequence number, which the stored one cannot know yet.
        if let (Some(live), Some(stored)) = (&self.live, stored) {
            let bytes = live_copy(&stored, &event);
            let subject = crate::bus::subjects::event(event.event_type.as_str());
            match live {
                Live::Broker(broker) => {
                    broker.publish(&subject, &bytes);
                }
                Live::Client(queue) => {
                    if queue.try_send((subject, bytes)).is_err() {
                        tracing::warn!(
                            "live event queue full: event stored but not fanned out live"
                        );
                    }
                }
            }
        }
        Ok(event)
    }

    /// Emits on behalf of the server; a failure is logged, never returned, because the
    /// operation that caused the event already happened.
    pub async fn emit_system(&self, event_type: EventKind, source: &str, payload: Value) {
        let new = NewEvent {
            event_type: event_type.as_str().to_string(),
            payload: Some(payload),
            ..NewEvent::default()
        };
        if let Err(e) = self.emit(new, source).await {
            tracing::error!(error = %e, %event_type, "event could not be emitted");
        }
    }

    async fn start_seq(&self, filter: &Filter) -> Result<u64> {
        match filter.since_ms {
            Some(since) => self.log.seq_for_time(since).await,
            None => self.log.first_seq().await,
        }
    }

    /// A page of events in stream order, from the cursor (a sequence) or `since`.
    pub async fn list(
        &self,
        filter: &Filter,
        limit: usize,
        cursor: Option<u64>,
    ) -> Result<(Vec<Event>, Option<u64>)> {
        let mut next = match cursor {
            Some(seq) => seq,
            None => self.start_seq(filter).await?,
        };
        let mut items = Vec::new();
        loop {
            let batch = self.log.read(next, READ_BATCH).await?;
            let Some(last) = batch.last() else {
                return Ok((items, None));
            };
            let last_seq = last.seq;
            for record in &batch {
                if filter.until_ms.is_some_and(|u| record.timestamp_ms >= u) {
                    return Ok((items, None));
                }
                if let Some(event) =
                    decode(record).filter(|e| filter.matches(e, record.timestamp_ms))
                {
                    items.push(event);
                    if items.len() == limit {
                        let more = record.seq < self.log.last_seq().await?;
                        return Ok((items, more.then_some(record.seq + 1)));
                    }
                }
            }
            next = last_seq + 1;
        }
    }

    /// Finds an event by id (a ULID, whose time says where to look) or by sequence number.
    pub async fn get(&self, id: &str) -> Result<Event> {
        let not_found = || Error::NotFound(format!("event '{id}' not found"));
        if let Ok(seq) = id.parse::<u64>() {
            return self
                .log
                .read(seq, 1)
                .await?
                .first()
                .filter(|r| r.seq == seq)
                .and_then(decode)
                .ok_or_else(not_found);
        }
        let millis = ids::ulid_millis(id).ok_or_else(not_found)?;
        // The id is made just before the append, so its record sits within moments of it.
        let mut next = self.log.seq_for_time(millis - 5_000).await?;
        loop {
            let batch = self.log.read(next, READ_BATCH).await?;
            let Some(last) = batch.last() else {
                return Err(not_found());
            };
            for record in &batch {
                if record.timestamp_ms > millis + 5_000 {
                    return Err(not_found());
                }
                if let Some(event) = decode(record).filter(|e| e.id == id) {
                    return Ok(event);
                }
            }
            next = last.seq + 1;
        }
    }

    /// Streams matching events into `out`: history from `since`, then (when `follow`) live
    /// events as they become durable, until the receiver goes away or the server stops.
    /// Without `follow` it ends at the last event that was durable when it started.
    pub async fn stream(&self, filter: Filter, follow: bool, out: mpsc::Sender<Result<Event>>) {
        let start = match self.start_seq(&filter).await {
            Ok(seq) => seq,
            Err(e) => {
                let _ = out.send(Err(e)).await;
                return;
            }
        };
        self.stream_from(start, filter, follow, out).await
    }

    /// `stream`, from sequence `start` on (a resumed tail: the one after the last event the
    /// reader saw) instead of from `filter.since_ms`.
    pub async fn stream_from(
        &self,
        start: u64,
        filter: Filter,
        follow: bool,
        out: mpsc::Sender<Result<Event>>,
    ) {
        let mut durable = self.log.subscribe();
        let mut stopping = self.stopping.clone();
        let bounds =
            async { Ok::<_, Error>((self.log.last_seq().await?, self.log.first_seq().await?)) };
        let (end, first) = match bounds.await {
            Ok(bounds) => bounds,
            Err(e) => {
                let _ = out.send(Err(e)).await;
                return;
            }
        };
        // Retention may have dropped what the reader last saw; it resumes at the oldest kept.
        let mut next = start.max(first);
        loop {
            // Mark the current durable point seen *before* reading, so an append that lands
            // after this read still wakes us below.
            let seen = *durable.borrow_and_update();
            let batch = match self.log.read(next, READ_BATCH).await {
                Ok(batch) => batch,
                Err(e) => {
                    let _ = out.send(Err(e)).await;
                    return;
                }
            };
            for record in &batch {
                if !follow && record.seq > end {
                    return;
                }
                if filter.until_ms.is_some_and(|u| record.timestamp_ms >= u) {
                    return;
                }
                next = record.seq + 1;
                if let Some(event) =
                    decode(record).filter(|e| filter.matches(e, record.timestamp_ms))
                {
                    if out.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
            }
            if !batch.is_empty() {
                continue;
            }
            if !follow || *stopping.borrow() {
                return;
            }
            if seen >= next {
                // The stream says records up to `seen` are durable but the read did not see
                // them yet (a shared stream's read may be served a moment behind its
                // notification): read again shortly rather than wait for the next append.
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_millis(5)) => continue,
                    _ = stopping.changed() => return,
                    _ = out.closed() => return,
                }
            }
            tokio::select! {
                changed = durable.changed() => if changed.is_err() { return },
                _ = stopping.changed() => return,
                _ = out.closed() => return,
            }
        }
    }

    /// Counts by type and by severity over a window.
    pub async fn stats(&self, filter: &Filter) -> Result<Stats> {
        let mut stats = Stats::default();
        let mut next = self.start_seq(filter).await?;
        loop {
            let batch = self.log.read(next, READ_BATCH * 4).await?;
            let Some(last) = batch.last() else { break };
            next = last.seq + 1;
            for record in &batch {
                if filter.until_ms.is_some_and(|u| record.timestamp_ms >= u) {
                    return Ok(stats);
                }
                if let Some(event) =
                    decode(record).filter(|e| filter.matches(e, record.timestamp_ms))
                {
                    stats.total += 1;
                    *stats
                        .by_type
                        .entry(event.event_type.to_string())
                        .or_default() += 1;
                    *stats
                        .by_severity
                        .entry(event.severity.to_string())
                        .or_default() += 1;
                }
            }
        }
        Ok(stats)
    }
}

#[derive(Debug, Default, Serialize)]
pub struct Stats {
    pub total: u64,
    pub by_type: std::collections::BTreeMap<String, u64>,
    pub by_severity: std::collections::BTreeMap<String, u64>,
}

/// `svc-events emit` through any transport: operator or admin, audited.
pub async fn emit(
    domain: &crate::domain::Domain,
    principal: &Principal,
    new: NewEvent,
) -> Result<Event> {
    let action = crate::audit::Action::new("event.emit", "event", "").detail(
        serde_json::json!({"type": new.event_type, "severity": new.severity, "source": new.source}),
    );
    let result = domain
        .auditor
        .gate(principal, action.clone(), async {
            principal.require(Role::Operator)?;
            domain.events.emit(new, &principal.name).await
        })
        .await;
    let action = match &result {
        Ok(event) => crate::audit::Action {
            resource_id: event.id.clone(),
            ..action
        },
        Err(_) => action,
    };
    domain.auditor.record(principal, action, &result).await;
    result
}

/// The most events one `list` page returns.
pub const MAX_PAGE: usize = 1000;

/// `svc-events list`: a page of stored events (any key). `cursor` is the previous page's
/// `next_cursor`; a limit of 0 means 100.
pub async fn list(
    domain: &crate::domain::Domain,
    principal: &Principal,
    filter: &Filter,
    limit: usize,
    cursor: &str,
) -> Result<(Vec<Event>, Option<u64>)> {
    principal.require(Role::Readonly)?;
    let limit = if limit == 0 { 100 } else { limit.min(MAX_PAGE) };
    let cursor = match cursor {
        "" => None,
        text => Some(
            text.parse::<u64>()
                .map_err(|_| Error::Invalid(format!("invalid cursor '{text}'")))?,
        ),
    };
    domain.events.list(filter, limit, cursor).await
}

/// `svc-events get ID` (any key).
pub async fn get(domain: &crate::domain::Domain, principal: &Principal, id: &str) -> Result<Event> {
    principal.require(Role::Readonly)?;
    domain.events.get(id).await
}

/// `svc-events stats` (any key).
pub async fn stats(
    domain: &crate::domain::Domain,
    principal: &Principal,
    filter: &Filter,
) -> Result<Stats> {
    principal.require(Role::Readonly)?;
    domain.events.stats(filter).await
}

/// `svc-events types` (any key).
pub fn types(principal: &Principal) -> Result<&'static [types::EventType]> {
    principal.require(Role::Readonly)?;
    Ok(TYPES)
}

/// `svc-events subscribe|replay` (any key): matching events from the log into the returned
/// channel, history first and then (with `follow`) live ones, until the receiver is dropped
/// or the server stops. A subscription without `since` starts now.
pub fn open_stream(
    domain: &std::sync::Arc<crate::domain::Domain>,
    principal: &Principal,
    mut filter: Filter,
    follow: bool,
) -> Result<mpsc::Receiver<Result<Event>>> {
    principal.require(Role::Readonly)?;
    if follow && filter.since_ms.is_none() {
        filter.since_ms = Some(clock::now_millis());
    }
    let (sender, receiver) = mpsc::channel(256);
    let domain = domain.clone();
    tokio::spawn(async move { domain.events.stream(filter, follow, sender).await });
    Ok(receiver)
}

/// A stream resumed after sequence `after` (the last one the reader saw; 0 for the whole
/// kept history), then (with `follow`) live events: what the console's tail reconnects with
/// (`Last-Event-ID`). Any key.
pub fn open_stream_after(
    domain: &std::sync::Arc<crate::domain::Domain>,
    principal: &Principal,
    filter: Filter,
    after: u64,
    follow: bool,
) -> Result<mpsc::Receiver<Result<Event>>> {
    principal.require(Role::Readonly)?;
    let (sender, receiver) = mpsc::channel(256);
    let domain = domain.clone();
    tokio::spawn(async move {
        let start = after.saturating_add(1);
        domain
            .events
            .stream_from(start, filter, follow, sender)
            .await
    });
    Ok(receiver)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spliced live copy is byte for byte what serializing the event with its sequence
    /// gives, for payloads with escapes, nesting and non-ASCII text.
    #[test]
    fn live_copy_is_the_serialized_event_with_its_seq() {
        let payloads = [
            serde_json::json!({}),
            serde_json::json!({"a": "x\"y\\z\n", "nested": {"seq": 1, "id": "q"}, "n": [1, 2.5]}),
            serde_json::json!({"text": "é — 日本"}),
        ];
        for (i, payload) in payloads.into_iter().enumerate() {
            for seq in [1, 9, 10, 12_345_678_901, u64::MAX] {
                let mut event = Event {
                    id: ids::ulid(),
                    seq: 0,
                    event_type: EventKind::AgentConnected,
                    category: "custom".into(),
                    severity: Severity::Info,
                    source: format!("src-{i}\t\"q\""),
                    timestamp: clock::format_rfc3339(clock::now_millis()),
                    payload: payload.clone(),
                };
                let stored = serde_json::to_vec(&event).unwrap();
                event.seq = seq;
                let expected = serde_json::to_vec(&event).unwrap();
                assert_eq!(
                    String::from_utf8(live_copy(&stored, &event)).unwrap(),
                    String::from_utf8(expected).unwrap()
                );
            }
        }
    }

    #[test]
    fn live_copy_of_an_unexpected_shape_serializes_again() {
        let event = Event {
            id: "not a ulid".into(),
            seq: 3,
            event_type: EventKind::AgentConnected,
            category: "custom".into(),
            severity: Severity::Info,
            source: "s".into(),
            timestamp: "t".into(),
            payload: serde_json::json!({}),
        };
        assert_eq!(
            live_copy(b"{\"id\":\"other\"}", &event),
            serde_json::to_vec(&event).unwrap()
        );
    }
}
