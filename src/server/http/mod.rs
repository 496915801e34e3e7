//! REST over hyper (HTTP/1.1): the router, JSON bodies and error responses (contract §5).
//!
//! Handlers are thin: `principal` (the key, then the route's row in `auth::access`, before
//! the query or body is read), parse, call one domain function with the caller's `Principal`,
//! map the result. Responses are JSON except /metrics (Prometheus text), the console's files
//! under /ui/, the SSE tail and the audit export's JSONL and CSV; every error is
//! `{"error":{"code","message"}}` with the status from `Error::http_status`.

mod agents;
mod apikeys;
mod audit;
mod events;
mod health;
mod jobs;
mod openapi;
mod query;
mod secrets;
mod ui;
mod wellknown;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Body as _;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use super::Context;
use crate::auth::{Admission, Principal};
use crate::{Error, Result};

/// Every response body: a whole one (`full`) for JSON, or a stream (`streaming`) for the
/// event tail and audit exports.
pub type Body = BoxBody<Bytes, Infallible>;

/// A body of these bytes, sent whole.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// A body sent as the chunks of `chunks` arrive; it ends when the stream does.
pub fn streaming<S>(chunks: S) -> Body
where
    S: Stream<Item = Bytes> + Send + Sync + 'static,
{
    let frames = chunks.map(|chunk| Ok(hyper::body::Frame::data(chunk)));
    BodyExt::boxed(StreamBody::new(frames))
}

/// A request body gets this long before `limits.min_body_rate` starts to count (the whole
/// body is due by this grace plus one second per `min_body_rate` bytes received).
pub const BODY_RATE_GRACE: Duration = Duration::from_secs(5);

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
        None => serve_connections(context, listener.plain(stop.clone()), stop).await,
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
    // hyper (1.x) starts its header-read timer when a connection begins to wait for a request:
    // at accept, and again after each response on a keep-alive connection. So this one limit
    // closes both a client that sends its header too slowly and an idle keep-alive connection
    // (silently, as RFC 9112 §9.8 allows).
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(context.config.limits.idle_timeout.0);
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
        ["ui"] | ["ui", _] => {
            let file = segments.get(1).copied().unwrap_or("");
            (
                "/ui/",
                only(&method, &[Method::GET, Method::HEAD]).and_then(|()| ui::asset(file)),
            )
        }
        ["api", "v1", "whoami"] => ("/api/v1/whoami", whoami(context, request).await),
        ["api", "v1", "events"] => ("/api/v1/events", events::list(context, request).await),
        ["api", "v1", "events", "stream"] => (
            "/api/v1/events/stream",
            events::stream(context, request).await,
        ),
        ["api", "v1", "events", "timeline"] => (
            "/api/v1/events/timeline",
            events::timeline(context, request).await,
        ),
        ["api", "v1", "events", id] => {
            let id = id.to_string();
            (
                "/api/v1/events/{id}",
                events::get(context, request, &id).await,
            )
        }
        ["api", "v1", "audit"] => ("/api/v1/audit", audit::log(context, request).await),
        ["api", "v1", "audit", "verify"] => (
            "/api/v1/audit/verify",
            audit::verify(context, request).await,
        ),
        ["api", "v1", "audit", "export"] => (
            "/api/v1/audit/export",
            audit::export(context, request).await,
        ),
        ["api", "v1", "agents"] => ("/api/v1/agents", agents::list(context, request).await),
        ["api", "v1", "agents", id] => {
            let id = id.to_string();
            (
                "/api/v1/agents/{id}",
                agents::get(context, request, &id).await,
            )
        }
        ["api", "v1", "agents", id, "quarantine"] => {
            let id = id.to_string();
            (
                "/api/v1/agents/{id}/quarantine",
                agents::quarantine(context, request, &id).await,
            )
        }
        ["api", "v1", "agents", id, "unquarantine"] => {
            let id = id.to_string();
            (
                "/api/v1/agents/{id}/unquarantine",
                agents::unquarantine(context, request, &id).await,
            )
        }
        ["api", "v1", "jobs"] => ("/api/v1/jobs", jobs::list(context, request).await),
        ["api", "v1", "jobs", id] => {
            let id = id.to_string();
            ("/api/v1/jobs/{id}", jobs::get(context, request, &id).await)
        }
        ["api", "v1", "secrets"] => ("/api/v1/secrets", secrets::list(context, request).await),
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

/// GET /api/v1/whoami: the caller's key id, name and role (any key), so a client such as the
/// console can show only what the role may do. The server still checks every call.
async fn whoami(context: &Context, request: Request<Incoming>) -> Result<Response<Body>> {
    only(request.method(), &[Method::GET])?;
    let (caller, _admission) = principal(context, &request).await?;
    let body =
        serde_json::json!({"id": caller.id, "name": caller.name, "role": caller.role.as_str()});
    Ok(json_response(StatusCode::OK, &body))
}

/// A 405 for methods a route does not serve; the response carries `Allow` (RFC 9110 §15.5.6).
fn only(method: &Method, allowed: &[Method]) -> Result<()> {
    if allowed.contains(method) {
        return Ok(());
    }
    let names: Vec<&str> = allowed.iter().map(Method::as_str).collect();
    let allow = names.join(", ");
    Err(Error::MethodNotAllowed {
        message: format!("method {method} is not allowed here; use {allow}"),
        allow,
    })
}

/// The caller's principal from the Authorization header (key → rate limit → requests in
/// flight → role), called by every handler that needs a key before it reads the query or
/// body: a key whose role the route's row in `auth::access::REST` does not admit gets 403
/// and, for a route in `access::AUDITED`, a `denied` audit row, whatever the request
/// carries. The domain checks the role again. Keep the returned admission until the response
/// is made: it is the key's slot among `rate_limit.max_in_flight`.
async fn principal(
    context: &Context,
    request: &Request<Incoming>,
) -> Result<(Principal, Admission)> {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|value| value.to_str().unwrap_or(""));
    let (principal, admission) = context.domain.admit(header).await?;
    let method = request.method().as_str();
    let path = request.uri().path();
    // Every route that takes a key has a row (tests/access.rs holds the table to the routes).
    let (route, access, id) = crate::auth::access::rest_access(method, path)
        .ok_or_else(|| Error::internal(format!("no access row for {method} {path}")))?;
    if let Err(refusal) = super::role_check(&principal, access) {
        super::audit_role_refusal(&context.domain, &principal, route, access, &refusal, id).await;
        return Err(refusal);
    }
    Ok((principal, admission))
}

/// Refuses (415) a body that is not sent as `application/json` (a `charset=utf-8` parameter
/// is allowed: JSON is UTF-8, RFC 8259 §8.1).
fn require_json_content_type(request: &Request<Incoming>) -> Result<()> {
    let refuse = || {
        Error::UnsupportedMediaType(
            "the request body must be sent with Content-Type: application/json".into(),
        )
    };
    let mut values = request.headers().get_all(header::CONTENT_TYPE).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(refuse());
    };
    let value = value.to_str().map_err(|_| refuse())?;
    let mut parts = value.split(';');
    let essence = parts.next().unwrap_or("").trim();
    let parameters_ok = parts.all(|parameter| match parameter.split_once('=') {
        Some((name, value)) => {
            name.trim().eq_ignore_ascii_case("charset")
                && value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        None => parameter.trim().is_empty(),
    });
    if essence.eq_ignore_ascii_case("application/json") && parameters_ok {
        Ok(())
    } else {
        Err(refuse())
    }
}

/// Reads a JSON object body of at most `limits.max_request_body` bytes: 415 unless it is
/// `application/json`, 413 beyond the size, 408 when it does not arrive in time
/// (`limits.body_timeout`, `limits.min_body_rate`), 400 if it is not one JSON object.
async fn json_body<T: DeserializeOwned>(
    context: &Context,
    request: Request<Incoming>,
) -> Result<T> {
    require_json_content_type(&request)?;
    let limit = context.config.limits.max_request_body;
    // hyper has parsed and checked Content-Length (a malformed one never gets here); the
    // body's exact size hint is that length.
    if request.body().size_hint().lower() > limit {
        return Err(too_large_body(limit));
    }
    let bytes = read_body(context, request.into_body(), limit).await?;
    let start = bytes.iter().position(|b| !b" \t\r\n".contains(b));
    match start.map(|at| bytes[at]) {
        None => Err(Error::Malformed(
            "request body is empty; expected a JSON object".into(),
        )),
        // serde would take an array as a struct's fields in order (`["name","role"]`); the
        // API takes objects only. Anything after the first value is refused by serde_json.
        Some(b'{') => serde_json::from_slice(&bytes)
            .map_err(|e| Error::Malformed(format!("malformed JSON: {e}"))),
        Some(_) => Err(Error::Malformed(
            "the request body must be a JSON object".into(),
        )),
    }
}

fn too_large_body(limit: u64) -> Error {
    Error::TooLarge(format!("request body is larger than {limit} bytes"))
}

/// Collects a body of at most `limit` bytes before its deadline: the whole body by
/// `limits.body_timeout`, and by `BODY_RATE_GRACE` plus one second per `limits.min_body_rate`
/// bytes received so far, so a client that trickles or stalls is answered 408.
async fn read_body(context: &Context, mut body: Incoming, limit: u64) -> Result<Vec<u8>> {
    let limits = &context.config.limits;
    let started = tokio::time::Instant::now();
    let hard = started + limits.body_timeout.0;
    let mut bytes = Vec::new();
    loop {
        let deadline = match limits.min_body_rate {
            0 => hard,
            rate => {
                let earned = Duration::from_secs_f64(bytes.len() as f64 / rate as f64);
                hard.min(started + BODY_RATE_GRACE + earned)
            }
        };
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(None) => return Ok(bytes),
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(e))) => {
                return Err(Error::Malformed(format!("cannot read request body: {e}")))
            }
            Err(_) if deadline == hard => {
                return Err(Error::Timeout(format!(
                    "the request body did not arrive within {} (limits.body_timeout)",
                    crate::clock::format_duration(limits.body_timeout.0)
                )))
            }
            Err(_) => {
                return Err(Error::Timeout(format!(
                    "the request body arrived slower than {} bytes/s (limits.min_body_rate)",
                    limits.min_body_rate
                )))
            }
        };
        if let Ok(data) = frame.into_data() {
            if (bytes.len() + data.len()) as u64 > limit {
                return Err(too_large_body(limit));
            }
            bytes.extend_from_slice(&data);
        }
    }
}

pub fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(body))
        .expect("static response parts are valid")
}

fn error_response(error: Error) -> Response<Body> {
    if let Error::Internal(cause) = &error {
        tracing::error!(%cause, "internal error");
    }
    let status =
        StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = json_response(status, &error.body());
    let headers = response.headers_mut();
    match error {
        Error::RateLimited { retry_after } => {
            let value = retry_after.as_secs().max(1).to_string();
            if let Ok(value) = value.parse() {
                headers.insert(header::RETRY_AFTER, value);
            }
        }
        Error::TooManyInFlight(_) => {
            headers.insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
        }
        Error::MethodNotAllowed { allow, .. } => {
            if let Ok(value) = http::HeaderValue::from_str(&allow) {
                headers.insert(header::ALLOW, value);
            }
        }
        // The rest of a late body may still be on its way: hyper closes the connection after
        // this response rather than read it.
        Error::Timeout(_) => {
            headers.insert(header::CONNECTION, http::HeaderValue::from_static("close"));
        }
        _ => {}
    }
    response
}
