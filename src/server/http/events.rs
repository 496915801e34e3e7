//! /api/v1/events: list (paged), get, the live tail as server-sent events, and the
//! per-minute timeline. Thin: parse the query, call the events domain, map the result.
//!
//! The tail is `text/event-stream`: one `id: SEQ` / `event: event` / `data: JSON` frame per
//! event, read from the server's own stream log (history after the resume point, then live),
//! so a client that reconnects with `Last-Event-ID: SEQ` (or `?after=SEQ`) gets every event
//! after the last one it saw, once. Comments (`: keep-alive`) every 15 s let a proxy and the
//! server notice a client that went away.

use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::sync::mpsc;

use super::query::Query;
use super::{json_response, only, principal, streaming, Body};
use crate::events::{self, Event, Filter};
use crate::server::Context;
use crate::{Error, Result};

/// Filters every event route takes, as `svc-events list` names them.
const FILTERS: &[&str] = &["type", "category", "severity", "source", "since", "until"];

/// How often an idle tail sends a comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

fn filter_of(query: &Query) -> Result<Filter> {
    Filter::parse(
        query.list("type"),
        query.text("category"),
        query.text("since"),
        query.text("until"),
        query.text("severity"),
        query.text("source"),
    )
}

fn known(extra: &[&'static str]) -> Vec<&'static str> {
    FILTERS.iter().chain(extra).copied().collect()
}

/// GET /api/v1/events: `{"items": [...], "next_cursor": "SEQ" | null}`, oldest first.
pub async fn list(context: &Context, request: Request<Incoming>) -> Result<Response<Body>> {
    only(request.method(), &[Method::GET])?;
    let (caller, _admission) = principal(context, &request).await?;
    let query = Query::of(&request, &known(&["limit", "cursor"]))?;
    let filter = filter_of(&query)?;
    let limit = query.number("limit")? as usize;
    let (items, next) = events::list(
        &context.domain,
        &caller,
        &filter,
        limit,
        query.text("cursor"),
    )
    .await?;
    let body = serde_json::json!({"items": items, "next_cursor": next.map(|n| n.to_string())});
    Ok(json_response(StatusCode::OK, &body))
}

/// GET /api/v1/events/{id}: by ULID or sequence number.
pub async fn get(
    context: &Context,
    request: Request<Incoming>,
    id: &str,
) -> Result<Response<Body>> {
    only(request.method(), &[Method::GET])?;
    let (caller, _admission) = principal(context, &request).await?;
    let event = events::get(&context.domain, &caller, id).await?;
    Ok(json_response(StatusCode::OK, &event))
}

/// GET /api/v1/events/timeline?minutes=N: events per minute, oldest first.
pub async fn timeline(context: &Context, request: Request<Incoming>) -> Result<Response<Body>> {
    only(request.method(), &[Method::GET])?;
    let (caller, _admission) = principal(context, &request).await?;
    let query = Query::of(&request, &["minutes"])?;
    let minutes = u32::try_from(query.number("minutes")?).unwrap_or(u32::MAX);
    let timeline = events::timeline::per_minute(&context.domain, &caller, minutes).await?;
    Ok(json_response(StatusCode::OK, &timeline))
}

/// The resume point: `?after=SEQ`, else the `Last-Event-ID` header, else none (start now).
fn resume_after(request: &Request<Incoming>, query: &Query) -> Result<Option<u64>> {
    if !query.text("after").is_empty() {
        return query.number("after").map(Some);
    }
    let Some(value) = request.headers().get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("").trim();
    text.parse().map(Some).map_err(|_| {
        Error::Invalid(format!(
            "Last-Event-ID '{text}' is not an event sequence number"
        ))
    })
}

/// GET /api/v1/events/stream: the live tail (server-sent events). With `follow=false` it
/// sends the history after the resume point (all kept events without one) and ends.
pub async fn stream(context: &Context, request: Request<Incoming>) -> Result<Response<Body>> {
    only(request.method(), &[Method::GET])?;
    let (caller, _admission) = principal(context, &request).await?;
    let query = Query::of(&request, &known(&["after", "follow"]))?;
    let filter = filter_of(&query)?;
    let follow = query.text("follow").is_empty() || query.flag("follow")?;
    let after = resume_after(&request, &query)?;
    let domain = &context.domain;
    let receiver = match after {
        Some(after) => events::open_stream_after(domain, &caller, filter, after, follow)?,
        // A new tail starts now; a history-only read without a resume point is all of it.
        None if follow => events::open_stream(domain, &caller, filter, true)?,
        None => events::open_stream_after(domain, &caller, filter, 0, false)?,
    };
    let (sender, chunks) = mpsc::channel::<Bytes>(64);
    tokio::spawn(forward(receiver, sender));
    let body = streaming(tokio_stream::wrappers::ReceiverStream::new(chunks));
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-store")
        .header("x-accel-buffering", "no")
        .body(body)
        .expect("static response parts are valid"))
}

/// One SSE frame for an event: its sequence as the id, the event as JSON data (one line:
/// serde_json escapes newlines inside strings).
fn frame(event: &Event) -> Bytes {
    let data = serde_json::to_string(event).unwrap_or_else(|_| "{}".into());
    Bytes::from(format!("id: {}\nevent: event\ndata: {data}\n\n", event.seq))
}

/// Feeds SSE frames to the response until the events end or the client goes away (the body
/// is dropped, so a send fails; dropping `events` then ends the domain's reader).
async fn forward(mut events: mpsc::Receiver<Result<Event>>, out: mpsc::Sender<Bytes>) {
    if out
        .send(Bytes::from_static(b"retry: 2000\n: tail open\n\n"))
        .await
        .is_err()
    {
        return;
    }
    let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
    keep_alive.tick().await;
    loop {
        let chunk = tokio::select! {
            item = events.recv() => match item {
                Some(Ok(event)) => frame(&event),
                Some(Err(error)) => {
                    let body = error.body();
                    let _ = out.send(Bytes::from(format!("event: error\ndata: {body}\n\n"))).await;
                    return;
                }
                None => return,
            },
            _ = keep_alive.tick() => Bytes::from_static(b": keep-alive\n\n"),
            _ = out.closed() => return,
        };
        if out.send(chunk).await.is_err() {
            return;
        }
    }
}
