//! The bus side of enrolment: the server answers `svc.enroll` requests with its own client.
//!
//! Thin: parse the JSON request, call `identity::enrol`, reply with the certificate and CA
//! chain or `{"error": ...}`. A queue group makes one server answer each request when several
//! share an external NATS cluster. The open bus only ever carries public material here.

use std::sync::Arc;

use futures_util::StreamExt;

use super::Context;
use crate::bus::subjects;
use crate::identity::{self, EnrolRequest};

/// The queue group every svc-server joins on `svc.enroll`.
const QUEUE_GROUP: &str = "svc-server";

/// Answers enrolment requests until the server's bus client goes away.
pub async fn serve(context: Arc<Context>) {
    let mut requests = match context
        .bus
        .client
        .queue_subscribe(subjects::ENROLL, QUEUE_GROUP.into())
        .await
    {
        Ok(subscription) => subscription,
        Err(e) => {
            tracing::error!(error = %e, "cannot subscribe to {}", subjects::ENROLL);
            return;
        }
    };
    while let Some(message) = requests.next().await {
        let Some(reply) = message.reply.clone() else {
            continue;
        };
        let context = context.clone();
        let span = super::request_span("bus", subjects::ENROLL, &super::request_id());
        let task = async move {
            let answer = answer(&context, &message.payload).await;
            if let Err(e) = context.bus.client.publish(reply, answer.into()).await {
                tracing::warn!(error = %e, "enrolment reply not sent");
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

fn error_reply(code: &str, message: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"error": {"code": code, "message": message}}))
        .expect("JSON values serialize")
}
