//! /api/v1/agents: list (a page at a time, with a --target selector, e.g. labels `role=web`,
//! and states), show, quarantine and unquarantine. The role (operator to quarantine) is checked by `principal` before the
//! request is read and again by the fleet domain, which writes the same audit rows and events
//! as `svcctl agent quarantine`.

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::query::Query;
use super::{json_body, json_response, only, principal, Body};
use crate::fleet;
use crate::server::Context;
use crate::Result;

/// GET /api/v1/agents?target=SEL&state=S,...&limit=N&cursor=C: `{"agents": [...],
/// "next_cursor": C | null}`, one page by id (docs/fleet.md, "Listing agents").
pub async fn list(context: &Context, request: Request<Incoming>) -> Result<Response<Body>> {
    only(request.method(), &[Method::GET])?;
    let (caller, _admission) = principal(context, &request).await?;
    let query = Query::of(&request, &["target", "state", "limit", "cursor"])?;
    let list = fleet::ListQuery {
        target: query.text("target").to_string(),
        states: fleet::parse_states(&query.list("state").join(","))?,
        cursor: query.text("cursor").to_string(),
        limit: usize::try_from(query.number("limit")?).unwrap_or(usize::MAX),
    };
    let page = fleet::list(&context.domain, &caller, &list).await?;
    Ok(json_response(StatusCode::OK, &page))
}

/// GET /api/v1/agents/{id}.
pub async fn get(
    context: &Context,
    request: Request<Incoming>,
    id: &str,
) -> Result<Response<Body>> {
    only(request.method(), &[Method::GET])?;
    let (caller, _admission) = principal(context, &request).await?;
    let agent = fleet::get(&context.domain, &caller, id).await?;
    Ok(json_response(StatusCode::OK, &agent))
}

/// Other fields are ignored rather than refused, so that a caller without the role learns
/// it from a 403 and not from a complaint about its body.
#[derive(serde::Deserialize, Default)]
struct QuarantineBody {
    #[serde(default)]
    reason: String,
}

/// POST /api/v1/agents/{id}/quarantine with `{"reason": "..."}` or no body (operator).
pub async fn quarantine(
    context: &Context,
    request: Request<Incoming>,
    id: &str,
) -> Result<Response<Body>> {
    only(request.method(), &[Method::POST])?;
    let (caller, _admission) = principal(context, &request).await?;
    let body: QuarantineBody = if has_body(&request) {
        json_body(context, request).await?
    } else {
        QuarantineBody::default()
    };
    let agent = fleet::quarantine(&context.domain, &caller, id, &body.reason).await?;
    Ok(json_response(StatusCode::OK, &agent))
}

/// POST /api/v1/agents/{id}/unquarantine (operator; no body needed).
pub async fn unquarantine(
    context: &Context,
    request: Request<Incoming>,
    id: &str,
) -> Result<Response<Body>> {
    only(request.method(), &[Method::POST])?;
    let (caller, _admission) = principal(context, &request).await?;
    let agent = fleet::unquarantine(&context.domain, &caller, id).await?;
    Ok(json_response(StatusCode::OK, &agent))
}

/// Whether the request says it carries a body (a length above 0, or chunked).
fn has_body(request: &Request<Incoming>) -> bool {
    use hyper::body::Body as _;
    request.body().size_hint().exact() != Some(0)
}
