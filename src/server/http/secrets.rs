//! /api/v1/secrets: the metadata of the KV secrets under a prefix (path, version, times),
//! never a value: `secrets::kv::list` returns no values to give away.

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::query::Query;
use super::{json_response, only, principal, Body};
use crate::secrets::kv;
use crate::server::Context;
use crate::Result;

/// GET /api/v1/secrets?prefix=P&include_deleted=true: `{"secrets": [...]}` (any key).
pub async fn list(context: &Context, request: Request<Incoming>) -> Result<Response<Body>> {
    only(request.method(), &[Method::GET])?;
    let (caller, _admission) = principal(context, &request).await?;
    let query = Query::of(&request, &["prefix", "include_deleted"])?;
    let include_deleted = query.flag("include_deleted")?;
    let secrets = kv::list(
        &context.domain,
        &caller,
        query.text("prefix"),
        include_deleted,
    )
    .await?;
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "secrets": secrets }),
    ))
}
