//! The bus side of the fleet: the server listens to every agent's heartbeats and results with
//! its own client, runs the liveness sweep, and answers agents' requests for chunks of stored
//! state plans (`serve_content`, in the members' queue group).
//!
//! Thin: the agent id comes from the subject (the broker lets an agent publish only under its
//! own `svc.agent.<id>.`), the JSON body is parsed here, the agent's signature is checked by
//! `fleet::agent_signature` (what does not verify is dropped), and `fleet::` does the rest. No queue
//! group: in a cluster every member receives every heartbeat (each answers for every agent;
//! the agent's owner acts on it, `cluster`), and every result (only the member that sent the
//! job has someone waiting for it).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use super::Context;
use crate::bus::subjects;
use crate::fleet::agent_signature::{self, Incoming, Kind};
use crate::fleet::{self, protocol};

/// Heartbeat times reach the store at most this often (batched).
const SAVE_EVERY: Duration = Duration::from_secs(5);

/// Starts the heartbeat and result listeners and the sweep; they run until the bus client
/// goes away.
pub async fn start(context: Arc<Context>) -> crate::Result<()> {
    let client = &context.bus.client;
    let subscribe = |subject: &'static str| client.subscribe(subject);
    let unavailable = |e: async_nats::SubscribeError| {
        crate::Error::Unavailable(format!("bus: cannot subscribe for the fleet: {e}"))
    };
    let mut heartbeats = subscribe("svc.agent.*.heartbeat")
        .await
        .map_err(unavailable)?;
    let mut results = subscribe("svc.agent.*.result").await.map_err(unavailable)?;

    // One sink for the fleet's own events, in order, batched.
    let sink = Arc::new(fleet::jobs::EventSink::start(context.domain.events.clone()));
    let heartbeat_context = context.clone();
    let heartbeat_sink = sink.clone();
    tokio::spawn(async move {
        while let Some(message) = heartbeats.next().await {
            let Some(agent_id) = protocol::agent_of(&message.subject) else {
                continue;
            };
            match serde_json::from_slice::<protocol::Heartbeat>(&message.payload) {
                Ok(beat) => {
                    let incoming = Incoming {
                        agent_id,
                        subject: &message.subject,
                        payload: &message.payload,
                        signature: &signature_of(&message),
                        kind: Kind::Heartbeat,
                        job_id: None,
                        sent_at_ms: beat.sent_at_ms,
                    };
                    if agent_signature::admit(&heartbeat_context.domain, incoming).await {
                        let domain = &heartbeat_context.domain;
                        fleet::heartbeat(domain, &heartbeat_sink, agent_id, &beat).await
                    }
                }
                Err(e) => tracing::debug!(agent_id, error = %e, "malformed heartbeat ignored"),
            }
        }
    });

    let result_context = context.clone();
    tokio::spawn(async move {
        while let Some(message) = results.next().await {
            let Some(agent_id) = protocol::agent_of(&message.subject) else {
                continue;
            };
            let span = super::request_span("bus", &message.subject, &super::request_id());
            span.record("key_id", format!("agent:{agent_id}").as_str());
            let _entered = span.enter();
            match serde_json::from_slice::<protocol::Reply>(&message.payload) {
                Ok(reply) => {
                    // Every member receives every result; one for a job that does not wait
                    // here (another member's, or one that has ended) is dropped before its
                    // signature is checked, which it would be dropped after anyway.
                    if !result_context.domain.fleet.jobs.is_waiting(&reply.job_id) {
                        tracing::debug!(agent_id, job_id = %reply.job_id, "result for no waiting job dropped");
                        continue;
                    }
                    let incoming = Incoming {
                        agent_id,
                        subject: &message.subject,
                        payload: &message.payload,
                        signature: &signature_of(&message),
                        kind: Kind::Result,
                        job_id: Some(&reply.job_id),
                        sent_at_ms: None,
                    };
                    if !agent_signature::admit(&result_context.domain, incoming).await {
                        continue;
                    }
                    let job_id = reply.job_id.clone();
                    if !result_context.domain.fleet.jobs.deliver(agent_id, reply) {
                        tracing::debug!(agent_id, job_id, "result for no waiting job dropped");
                    }
                }
                Err(e) => tracing::warn!(agent_id, error = %e, "malformed result ignored"),
            }
        }
    });

    // The sweep runs often enough to report a silent agent within about a second of its
    // timeout; heartbeat times are saved in batches.
    let sweep_context = context;
    tokio::spawn(async move {
        let timeout = sweep_context.domain.fleet.registry.timeout();
        let period = (timeout / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_save = tokio::time::Instant::now();
        loop {
            tick.tick().await;
            fleet::sweep(&sweep_context.domain, &sink);
            if last_save.elapsed() >= SAVE_EVERY {
                fleet::save_heartbeats(&sweep_context.domain).await;
                last_save = tokio::time::Instant::now();
            }
        }
    });
    Ok(())
}

/// The `Svc-Signature` header of an agent's message; empty when it has none.
fn signature_of(message: &async_nats::Message) -> String {
    message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(agent_signature::HEADER))
        .map(|value| value.as_str().to_string())
        .unwrap_or_default()
}

/// Answers agents' requests for chunks of stored state plans (`fleet::content`), in the
/// members' queue group: the plans are in the file service's store, which every member shares.
/// The reply must go to the agent's own `svc.agent.<id>.content.reply.` subjects.
pub async fn serve_content(context: Arc<Context>) -> crate::Result<()> {
    let mut requests = context
        .bus
        .client
        .queue_subscribe(subjects::AGENTS_CONTENT, "svc-server".into())
        .await
        .map_err(|e| {
            crate::Error::Unavailable(format!("bus: cannot subscribe for state content: {e}"))
        })?;
    tokio::spawn(async move {
        while let Some(message) = requests.next().await {
            let Some(agent_id) = protocol::agent_of(&message.subject) else {
                continue;
            };
            let prefix = subjects::agent_content_reply_prefix(agent_id);
            let Some(reply) = super::own_reply(&message, &prefix) else {
                tracing::debug!(agent_id, "content request without an own reply subject");
                continue;
            };
            let agent_id = agent_id.to_string();
            let context = context.clone();
            let span = super::request_span("bus", &message.subject, &super::request_id());
            span.record("key_id", format!("agent:{agent_id}").as_str());
            let task = async move {
                let answer =
                    fleet::content::chunk_for_agent(&context.domain, &agent_id, &message.payload)
                        .await;
                let answer = match answer {
                    Ok(bytes) => (async_nats::HeaderMap::new(), bytes),
                    Err(error) => {
                        tracing::warn!(agent_id, error = %error, "content request refused");
                        super::files::error_reply(&error)
                    }
                };
                super::send_reply(&context, reply, answer, "content").await;
            };
            tokio::spawn(tracing::Instrument::instrument(task, span));
        }
    });
    Ok(())
}
