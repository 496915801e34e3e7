//! /api/v1/audit: the log with svc-audit's filters (paged, newest first), the hash-chain
//! verify result, and the export (CSV, JSON or JSON Lines, admin) streamed from the same
//! `audit::open_export` that `svc-audit export` uses. Thin: parse, call, map.

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::query::Query;
use super::{json_response, only, principal, streaming, Body};
use crate::audit::{self, ExportFormat};
use crate::server::Context;
use crate::Result;

fn optional(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_string())
}

/// GET /api/v1/audit: `{"items": [...], "next_cursor": "C" | null}`.
pub async fn log(context: &Context, request: Request<Incoming>) -> Result<Response<Body>> {
    only(request.method(), &[Method::GET])?;
    let (caller, _admission) = principal(context, &request).await?;
    let query = Query::of(
        &request,
        &[
            "since",
            "until",
            "user",
            "action",
            "resource_type",
            "policy_id",
            "min_severity",
            "outcome",
            "limit",
            "cursor",
            "attempts",
        ],
    )?;
    let limit = u32::try_from(query.number("limit")?).unwrap_or(u32::MAX);
    let wanted = audit::Query {
        since: optional(query.text("since")),
        until: optional(query.text("until")),
        user: optional(query.text("user")),
        action: optional(query.text("action")),
        resource_type: optional(query.text("resource_type")),
        policy_id: optional(query.text("policy_id")),
        min_severity: optional(query.text("min_severity")),
        outcome: optional(query.text("outcome")),
        limit: (limit > 0).then_some(limit),
        cursor: optional(query.text("cursor")),
        attempts: query.flag("attempts")?,
    };
    let page = audit::log(context.domain.store.as_ref(), &caller, &wanted).await?;
    Ok(json_response(StatusCode::OK, &page))
}

/// GET /api/v1/audit/verify: walks the whole chain (`svc-audit verify`).
pub async fn verify(context: &Context, request: Request<Incoming>) -> Result<Response<Body>> {
    only(request.method(), &[Method::GET])?;
    let (caller, _admission) = principal(context, &request).await?;
    let result = audit::verify(context.domain.store.as_ref(), &caller).await?;
    Ok(json_response(StatusCode::OK, &result))
}

/// GET /api/v1/audit/export?format=csv|json|jsonl&since&until (admin), as a download.
pub async fn export(context: &Context, request: Request<Incoming>) -> Result<Response<Body>> {
    only(request.method(), &[Method::GET])?;
    let (caller, _admission) = principal(context, &request).await?;
    let query = Query::of(&request, &["format", "since", "until"])?;
    let format: ExportFormat = query.text("format").parse()?;
    let mut receiver = audit::open_export(
        &context.domain,
        &caller,
        format,
        optional(query.text("since")),
        optional(query.text("until")),
    )?;
    // The first chunk (or error) decides the status; an error after it can only cut the
    // body short, which the client sees as an incomplete chunked response.
    let first = match receiver.recv().await {
        Some(Ok(chunk)) => chunk,
        Some(Err(error)) => return Err(error),
        None => Vec::new(),
    };
    let rest = tokio_stream::wrappers::ReceiverStream::new(receiver);
    use futures_util::StreamExt;
    let chunks = futures_util::stream::once(async move { Ok(first) })
        .chain(rest)
        .take_while(|item| std::future::ready(item.is_ok()))
        .filter_map(|item| std::future::ready(item.ok().map(Bytes::from)));
    let (content_type, extension) = match format {
        ExportFormat::Csv => ("text/csv; charset=utf-8", "csv"),
        ExportFormat::Json => ("application/json", "json"),
        ExportFormat::Jsonl => ("application/jsonl", "jsonl"),
    };
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .header(
            header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"audit.{extension}\""),
        )
        .header(header::CACHE_CONTROL, "no-store")
        .body(streaming(chunks))
        .expect("static response parts are valid"))
}
