//! REST over hyper (HTTP/1.1): the router, JSON bodies and error responses (contract §5).
//!
//! Handlers are thin: parse, call one domain function with the caller's `Principal`, map the
//! result. Every response is JSON except /metrics; every error is
//! `{"error":{"code","message"}}` with the status from `Error::http_status`.

mod apikeys;
mod health;
mod openapi;
mod wellknown;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use super::Context;
use crate::auth::Principal;
use crate::{Error, Result};

pub type Body = Full<Bytes>;

/// How long a client may take to send its request headers before the connection is dropped.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections until `stop` flips, then lets in-flight requests finish. With `tls`,
/// only connections that completed a TLS handshake (ALPN http/1.1) are served.
pub async fn serve(
    context: Arc<Context>,
    listener: super::tls::Listener,
    tls: Option<Arc<rustls::ServerConfig>>,
    stop: watch::Receiver<bool>,
) {
    match tls {
        Some(config) => {
            let incoming = super::tls::incoming(listener, config, stop.clone());
            serve_connections(context, incoming, stop).await
        }
        None => serve_connections(context, listener.plain(), stop).await,
    }
}

async fn serve_connections<S, IO>(
    context: Arc<Context>,
    mut incoming: S,
    mut stop: watch::Receiver<bool>,
) where
    S: Stream<Item = std::io::Result<IO>> + Unpin,
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    loop {
        tokio::select! {
            next = incoming.next() => {
                let stream = match next {
                    Some(Ok(stream)) => stream,
                    Some(Err(_)) => continue,
                    None => break,
                };
                let context = context.clone();
                let service = service_fn(move |request| handle(context.clone(), request));
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!(error = %e, "http connection ended with an error");
                    }
                });
            }
            _ = stop.changed() => break,
        }
    }
    // Stops accepting: the listener (or the TLS accept loop) goes with the stream.
    drop(incoming);
    graceful.shutdown().await;
}

async fn handle(
    context: Arc<Context>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    use tracing::Instrument;
    let started = Instant::now();
    // A client's own X-Request-Id (printable, at most 64 bytes) is kept; otherwise one is made.
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(super::request_id);
    let span = super::request_span("rest", request.uri().path(), &id);
    let (route, result) = route(&context, request).instrument(span.clone()).await;
    let mut response = result.unwrap_or_else(error_response);
    let status = response.status().as_u16();
    span.in_scope(|| tracing::debug!(route, status, elapsed = ?started.elapsed(), "request done"));
    if let Ok(value) = http::HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", value);
    }
    context
        .metrics
        .record_http(route, status, started.elapsed());
    Ok(response)
}

/// Finds the handler for a request; returns the route template for metrics with the outcome.
async fn route(
    context: &Context,
    request: Request<Incoming>,
) -> (&'static str, Result<Response<Body>>) {
    let path = request.uri().path().to_string();
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let method = request.method().clone();
    match segments.as_slice() {
        ["health", "live"] => (
            "/health/live",
            only(&method, &[Method::GET]).map(|()| health::live()),
        ),
        ["health", "ready"] => (
            "/health/ready",
            match only(&method, &[Method::GET]) {
                Ok(()) => Ok(health::ready(context).await),
                Err(e) => Err(e),
            },
        ),
        ["metrics"] => (
            "/metrics",
            match only(&method, &[Method::GET]) {
                Ok(()) => Ok(health::metrics(context).await),
                Err(e) => Err(e),
            },
        ),
        ["api", "v1", "openapi.json"] => (
            "/api/v1/openapi.json",
            only(&method, &[Method::GET]).map(|()| openapi::document()),
        ),
        [".well-known", "jwks.json"] => (
            "/.well-known/jwks.json",
            match only(&method, &[Method::GET]) {
                Ok(()) => wellknown::jwks(context).await,
                Err(e) => Err(e),
            },
        ),
        [".well-known", "jwt-revocations.json"] => (
            "/.well-known/jwt-revocations.json",
            match only(&method, &[Method::GET]) {
                Ok(()) => wellknown::revocations(context).await,
                Err(e) => Err(e),
            },
        ),
        ["api", "v1", "apikeys"] => (
            "/api/v1/apikeys",
            apikeys::collection(context, request).await,
        ),
        ["api", "v1", "apikeys", id] => {
            let id = id.to_string();
            (
                "/api/v1/apikeys/{id}",
                apikeys::item(context, request, &id).await,
            )
        }
        _ => (
            "unmatched",
            Err(Error::NotFound(format!("no route for {method} {path}"))),
        ),
    }
}

/// A 405 for methods a route does not serve.
fn only(method: &Method, allowed: &[Method]) -> Result<()> {
    if allowed.contains(method) {
        return Ok(());
    }
    let names: Vec<&str> = allowed.iter().map(Method::as_str).collect();
    Err(Error::MethodNotAllowed(format!(
        "method {method} is not allowed here; use {}",
        names.join(", ")
    )))
}

/// The caller's principal from the Authorization header (key → rate limit; roles are the
/// domain's to check).
async fn principal(context: &Context, request: &Request<Incoming>) -> Result<Principal> {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|value| value.to_str().unwrap_or(""));
    context.domain.authenticate(header).await
}

/// Reads a JSON body of at most `limits.max_request_body` bytes: 413 beyond, 400 if malformed.
async fn json_body<T: DeserializeOwned>(
    context: &Context,
    request: Request<Incoming>,
) -> Result<T> {
    let limit = context.config.limits.max_request_body as usize;
    let too_large = || Error::TooLarge(format!("request body is larger than {limit} bytes"));
    if let Some(length) = request.headers().get(header::CONTENT_LENGTH) {
        let length: u64 = length
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Error::Malformed("invalid Content-Length".into()))?;
        if length > limit as u64 {
            return Err(too_large());
        }
    }
    let bytes = Limited::new(request.into_body(), limit)
        .collect()
        .await
        .map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                too_large()
            } else {
                Error::Malformed(format!("cannot read request body: {e}"))
            }
        })?
        .to_bytes();
    if bytes.is_empty() {
        return Err(Error::Malformed(
            "request body is empty; expected a JSON object".into(),
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| Error::Malformed(format!("malformed JSON: {e}")))
}

pub fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

fn error_response(error: Error) -> Response<Body> {
    if let Error::Internal(cause) = &error {
        tracing::error!(%cause, "internal error");
    }
    let status =
        StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::json!({"error": {"code": error.code(), "message": error.to_string()}});
    let mut response = json_response(status, &body);
    if let Error::RateLimited { retry_after } = error {
        let value = retry_after.as_secs().max(1).to_string();
        if let Ok(value) = value.parse() {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
    }
    response
}
