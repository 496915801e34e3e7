//! gRPC over tonic: the svc.v1 services, standard health, and server reflection.
//!
//! Authentication is one tower layer in front of every `svc.v1.*` method (`auth_layer.rs`):
//! it resolves the `authorization: Bearer KEY` metadata to a `Principal` (and applies the
//! key's rate limit), checks its role against the method's row in `auth::access` before tonic
//! decodes the message, and hands the `Principal` to the handler through request extensions;
//! the domain functions the handlers call check the role again. Health and reflection stay
//! open, as /health does on REST.

mod auth_layer;
mod blueprint;
mod cluster;
mod events;
mod fleet;
mod identity;
mod policy;
mod runbooks;
mod secrets;
mod webhooks;

use std::sync::Arc;

use tokio::sync::watch;

use super::Context;
use crate::auth::Principal;
use crate::proto;

/// Serves until `stop` flips, then stops accepting and lets in-flight calls and streams finish
/// (the caller bounds that with the 30 s grace). With `tls`, only connections that completed
/// a TLS handshake (ALPN h2) are served.
pub async fn serve(
    context: Arc<Context>,
    listener: super::tls::Listener,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut stop: watch::Receiver<bool>,
) {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    for name in SERVICE_NAMES {
        health_reporter
            .set_service_status(*name, tonic_health::ServingStatus::Serving)
            .await;
    }
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1();
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha();

    use proto::{
        blueprint_service_server::BlueprintServiceServer,
        cluster_service_server::ClusterServiceServer, event_service_server::EventServiceServer,
        fleet_service_server::FleetServiceServer, identity_service_server::IdentityServiceServer,
        policy_service_server::PolicyServiceServer, runbook_service_server::RunbookServiceServer,
        secrets_service_server::SecretsServiceServer, webhook_service_server::WebhookServiceServer,
    };
    // Keepalive pings find peers that went away; the stream cap bounds what one connection
    // can make the server hold (limits.*, docs/reliability.md).
    let limits = &context.config.limits;
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(limits.grpc_keepalive.0))
        .http2_keepalive_timeout(Some(limits.grpc_keepalive_timeout.0))
        .max_concurrent_streams(Some(limits.max_grpc_streams))
        .layer(auth_layer::AuthLayer::new(context.clone()))
        .add_service(health_service)
        .add_service(EventServiceServer::new(events::Events {
            context: context.clone(),
        }))
        .add_service(PolicyServiceServer::new(policy::Policy {
            context: context.clone(),
        }))
        .add_service(IdentityServiceServer::new(identity::Identity {
            context: context.clone(),
        }))
        .add_service(SecretsServiceServer::new(secrets::Secrets {
            context: context.clone(),
        }))
        .add_service(ClusterServiceServer::new(cluster::Cluster {
            context: context.clone(),
        }))
        // A state request carries a whole compiled plan (up to fleet::content's limit), past
        // tonic's default of 4 MiB; the key was checked (AuthLayer) before the body is read.
        .add_service(
            FleetServiceServer::new(fleet::Fleet {
                context: context.clone(),
            })
            .max_decoding_message_size(crate::fleet::content::MAX_PLAN_BYTES + 1024 * 1024),
        )
        .add_service(WebhookServiceServer::new(webhooks::Webhooks {
            context: context.clone(),
        }))
        .add_service(RunbookServiceServer::new(runbooks::Runbooks {
            context: context.clone(),
        }))
        .add_service(BlueprintServiceServer::new(blueprint::Blueprints {
            context: context.clone(),
        }));
    let router = match (reflection_v1, reflection_v1alpha) {
        (Ok(v1), Ok(v1alpha)) => router.add_service(v1).add_service(v1alpha),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(error = %e, "gRPC reflection unavailable");
            router
        }
    };
    let stop_accepting = stop.clone();
    let shutdown = async move {
        let _ = stop.changed().await;
        for name in SERVICE_NAMES {
            health_reporter
                .set_service_status(*name, tonic_health::ServingStatus::NotServing)
                .await;
        }
    };
    // Nagle off on both paths, as `Server::serve` would do (it ignores the builder's
    // tcp_nodelay with an incoming stream): with it on, a unary call whose frames span two
    // writes waits for the peer's delayed ACK, about 40 ms. `server::tls::incoming` sets it
    // on every socket it accepts.
    let served = match tls {
        Some(config) => {
            let incoming = super::tls::incoming(listener, config, stop_accepting);
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
        }
        None => {
            let incoming = listener.plain(stop_accepting);
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
        }
    };
    if let Err(e) = served {
        tracing::error!(error = %e, "gRPC server failed");
    }
}

/// Fully qualified names, as the health service and grpcurl know them.
const SERVICE_NAMES: &[&str] = &[
    "svc.v1.EventService",
    "svc.v1.PolicyService",
    "svc.v1.IdentityService",
    "svc.v1.SecretsService",
    "svc.v1.ClusterService",
    "svc.v1.FleetService",
    "svc.v1.WebhookService",
    "svc.v1.RunbookService",
    "svc.v1.BlueprintService",
];

/// The messages a handler's task produces, relayed to a server stream's response, ending it
/// when the client stops reading: a message that finds no room in the relay's small buffer for
/// `limits.grpc_stream_stall` (30 s by default) means tonic has not taken one since, because
/// HTTP/2 flow control says the client has not read. Then the stream is cut off: logged,
/// counted (`svc_grpc_streams_cut_total`), and its connection closed, which frees the stream's
/// buffers and ends the producing task (its channel closes); other connections go on. A client
/// that reads slowly is never cut: each message it takes starts the wait over. Take
/// `connection` from the request before `into_inner`.
pub(super) fn relay<T: Send + 'static>(
    context: &Arc<Context>,
    connection: Option<super::tls::Connection>,
    method: &'static str,
    mut from: tokio::sync::mpsc::Receiver<T>,
) -> tokio_stream::wrappers::ReceiverStream<T> {
    use tokio::sync::mpsc::error::SendTimeoutError;
    let (to, receiver) = tokio::sync::mpsc::channel(RELAY_BUFFER);
    let stall = context.config.limits.grpc_stream_stall.0;
    let context = context.clone();
    tokio::spawn(async move {
        loop {
            let item = tokio::select! {
                item = from.recv() => item,
                // The client hung up while nothing was being produced.
                () = to.closed() => return,
            };
            let Some(item) = item else { return };
            match to.send_timeout(item, stall).await {
                Ok(()) => {}
                Err(SendTimeoutError::Closed(_)) => return,
                Err(SendTimeoutError::Timeout(_)) => {
                    context.metrics.record_grpc_stream_cut();
                    let peer = connection.as_ref().map(|c| c.peer.to_string());
                    tracing::warn!(
                        method,
                        peer = peer.as_deref().unwrap_or("?"),
                        stall = ?stall,
                        "gRPC stream cut off: its client read nothing for \
                         limits.grpc_stream_stall; its connection is closed"
                    );
                    if let Some(connection) = connection {
                        connection.cut();
                    }
                    return;
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

/// Messages between a producing task and tonic's encoder: a few, so that a stalled client
/// is noticed after a few messages and holds little memory.
const RELAY_BUFFER: usize = 8;

/// The connection a request came on (the listener's accept loop puts it there).
pub(super) fn connection<T>(request: &tonic::Request<T>) -> Option<super::tls::Connection> {
    request
        .extensions()
        .get::<super::tls::Connection>()
        .cloned()
}

/// The principal the auth layer attached to a request.
pub fn principal<T>(request: &tonic::Request<T>) -> Result<Principal, tonic::Status> {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| crate::Error::Unauthenticated("missing API key".into()).into())
}
