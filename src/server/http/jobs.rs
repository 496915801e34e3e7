//! /api/v1/jobs: the job history (docs/fleet.md, "Jobs"), for the console and scripts; the
//! same views as `svcctl job list|show`.

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::query::Query;
use super::{json_response, only, principal, Body};
use crate::fleet::history;
use crate::server::Context;
use crate::Result;

/// `limit` as asked, else `default`.
fn limit(query: &Query, default: usize) -> Result<usize> {
    Ok(match query.number("limit")? {
        0 => default,
        n => n as usize,
    })
}

/// GET /api/v1/jobs?limit=N&before=JOB: `{"jobs": [...]}`, newest first.
pub async fn list(context: &Context, request: Request<Incoming>) -> Result<Response<Body>> {
    only(request.method(), &[Method::GET])?;
    let (caller, _admission) = principal(context, &request).await?;
    let query = Query::of(&request, &["limit", "before"])?;
    let before = Some(query.text("before")).filter(|b| !b.is_empty());
    let jobs = history::list(&context.domain, &caller, before, limit(&query, 50)?).await?;
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "jobs": jobs }),
    ))
}

/// GET /api/v1/jobs/{id}?limit=N&after=AGENT: `{"job": {...}, "results": [...],
/// "next_after": AGENT | null}`, results by agent id (operator: they carry output).
pub async fn get(
    context: &Context,
    request: Request<Incoming>,
    id: &str,
) -> Result<Response<Body>> {
    only(request.method(), &[Method::GET])?;
    let (caller, _admission) = principal(context, &request).await?;
    let query = Query::of(&request, &["limit", "after"])?;
    let limit = limit(&query, 100)?;
    let job = history::get(&context.domain, &caller, id).await?;
    let rows = history::results(&context.domain, id, query.text("after"), limit).await?;
    let next = (rows.len() == limit)
        .then(|| rows.last().map(|row| row.agent_id.clone()))
        .flatten();
    let results: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| serde_json::from_str(&row.result).unwrap_or_default())
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "job": job, "results": results, "next_after": next }),
    ))
}
