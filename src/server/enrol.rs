//! The bus side of identity: the server answers `svc.enroll` requests, renewals of agents'
//! NATS user JWTs on `svc.enroll.renew` (JWT mode), and enrolled agents' JWT-SVID requests on
//! `svc.agent.<id>.jwt`, with its own client.
//!
//! Thin: parse the JSON request, call `identity::enrol` (or `identity::nats::renew`, or
//! `identity::jwt::issue_agent_jwt`), reply with the certificate and CA chain (or the JWT) or
//! `{"error": ...}`. A queue group
//! makes one server answer each request when several share an external NATS cluster. The open
//! bus only carries public material on `svc.enroll`; a JWT-SVID is answered only under the
//! asking agent's own subjects, which no other agent and no operator key may read.

use std::sync::Arc;

use futures_util::StreamExt;

use super::Context;
use crate::bus::subjects;
use crate::identity::{self, EnrolRequest};

/// The queue group every svc-server joins on `svc.enroll`.
const QUEUE_GROUP: &str = "svc-server";

/// Answers enrolment requests (and, in a task of its own, agents' JWT-SVID requests) until
/// the server's bus client goes away.
pub async fn serve(context: Arc<Context>) {
    tokio::spawn(serve_jwt(context.clone()));
    if context.domain.identity_keys().issues_bus_jwts() {
        tokio::spawn(serve_renew(context.clone()));
    }
    answer_each(context, subjects::ENROLL, |context, payload| async move {
        answer(&context, &payload).await
    })
    .await;
}

/// Answers each request on `subject` (queue group: one member each) with `respond`, to its
/// reply subject, one task per request, until the server's bus client goes away. For the
/// requests of hosts not logged in as an agent (enrolment, renewal): their replies carry only
/// public material, so any reply subject will do.
async fn answer_each<F, R>(context: Arc<Context>, subject: &'static str, respond: F)
where
    F: Fn(Arc<Context>, bytes::Bytes) -> R + Send + Sync + 'static,
    R: std::future::Future<Output = Vec<u8>> + Send + 'static,
{
    let mut requests = match context
        .bus
        .client
        .queue_subscribe(subject, QUEUE_GROUP.into())
        .await
    {
        Ok(subscription) => subscription,
        Err(e) => {
            tracing::error!(error = %e, "cannot subscribe to {subject}");
            return;
        }
    };
    while let Some(message) = requests.next().await {
        let Some(reply) = message.reply.clone() else {
            continue;
        };
        let span = super::request_span("bus", subject, &super::request_id());
        let answer = respond(context.clone(), message.payload);
        let client = context.bus.client.clone();
        let task = async move {
            if let Err(e) = client.publish(reply, answer.await.into()).await {
                tracing::warn!(error = %e, subject, "reply not sent");
            }
        };
        tokio::spawn(tracing::Instrument::instrument(task, span));
    }
}

async fn answer(context: &Context, payload: &[u8]) -> Vec<u8> {
    let request: EnrolRequest = match serde_json::from_slice(payload) {
        Ok(request) => request,
        Err(e) => return error_reply("bad_request", &format!("malformed enrolment request: {e}")),
    };
    let agent_id = request.agent_id.clone();
    match identity::enrol(&context.domain, request).await {
        Ok(enrolled) => {
            tracing::info!(agent_id, "agent enrolled");
            if let Err(e) = crate::fleet::refresh(&context.domain, &agent_id).await {
                tracing::warn!(agent_id, error = %e, "registry not refreshed after enrolment");
            }
            serde_json::to_vec(&enrolled).expect("enrolment replies serialize")
        }
        Err(error) => {
            if let crate::Error::Internal(cause) = &error {
                tracing::error!(agent_id, %cause, "enrolment failed");
            }
            tracing::info!(agent_id, %error, "enrolment refused");
            error_reply(error.code(), &error.to_string())
        }
    }
}

/// Answers `svc.enroll.renew` (JWT mode only): an agent's signed request for a new NATS user
/// JWT. The reply holds only that JWT, useless without the agent's nkey.
async fn serve_renew(context: Arc<Context>) {
    answer_each(
        context,
        subjects::ENROLL_RENEW,
        |context, payload| async move {
            match serde_json::from_slice(&payload) {
                Ok(request) => match identity::nats::renew(&context.domain, request).await {
                    Ok(renewed) => serde_json::to_vec(&renewed).expect("renewals serialize"),
                    Err(error) => {
                        tracing::info!(%error, "NATS JWT renewal refused");
                        error_reply(error.code(), &error.to_string())
                    }
                },
                Err(e) => error_reply("bad_request", &format!("malformed renewal: {e}")),
            }
        },
    )
    .await;
}

fn error_reply(code: &str, message: &str) -> Vec<u8> {
    serde_json::to_vec(&crate::error::error_body(code, message)).expect("JSON values serialize")
}

/// Answers `svc.agent.<id>.jwt`: the broker lets only agent `<id>` (and the server) publish
/// there, so the subject names who asks. The answer goes to the request's reply subject only
/// when it is under that agent's own `svc.agent.<id>.jwt.reply.`; any other is ignored.
async fn serve_jwt(context: Arc<Context>) {
    let mut requests = match context
        .bus
        .client
        .queue_subscribe(subjects::AGENTS_JWT, QUEUE_GROUP.into())
        .await
    {
        Ok(subscription) => subscription,
        Err(e) => {
            tracing::error!(error = %e, "cannot subscribe to {}", subjects::AGENTS_JWT);
            return;
        }
    };
    while let Some(message) = requests.next().await {
        let Some(agent_id) = crate::fleet::protocol::agent_of(&message.subject) else {
            continue;
        };
        let agent_id = agent_id.to_string();
        let Some(reply) = super::own_reply(&message, &subjects::agent_jwt_reply_prefix(&agent_id))
        else {
            tracing::debug!(
                agent_id,
                "JWT-SVID request without an own reply subject ignored"
            );
            continue;
        };
        let context = context.clone();
        let span = super::request_span("bus", &message.subject, &super::request_id());
        span.record("key_id", format!("agent:{agent_id}").as_str());
        let task = async move {
            let answer = jwt_answer(&context, &agent_id, &message.payload).await;
            if let Err(e) = context.bus.client.publish(reply, answer.into()).await {
                tracing::warn!(error = %e, "JWT-SVID reply not sent");
            }
        };
        tokio::spawn(tracing::Instrument::instrument(task, span));
    }
}

async fn jwt_answer(context: &Context, agent_id: &str, payload: &[u8]) -> Vec<u8> {
    let request: identity::jwt::AgentRequest = match serde_json::from_slice(payload) {
        Ok(request) => request,
        Err(e) => return error_reply("bad_request", &format!("malformed JWT-SVID request: {e}")),
    };
    match identity::jwt::issue_agent_jwt(&context.domain, agent_id, request).await {
        Ok(issued) => {
            tracing::info!(agent_id, jti = %issued.svid.id, "JWT-SVID issued to an agent");
            serde_json::to_vec(&issued).expect("JWT-SVID replies serialize")
        }
        Err(error) => {
            if let crate::Error::Internal(cause) = &error {
                tracing::error!(agent_id, %cause, "JWT-SVID issue failed");
            }
            tracing::info!(agent_id, %error, "JWT-SVID refused");
            error_reply(error.code(), &error.to_string())
        }
    }
}
