//! /api/v1/apikeys: create, list, show, update, delete (admin only).

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::{json_body, json_response, only, principal, Body};
use crate::auth::{self, ApiKey, KeyUpdate, NewKey};
use crate::server::Context;
use crate::Result;

#[derive(serde::Serialize)]
struct KeyList {
    apikeys: Vec<ApiKey>,
}

#[derive(serde::Serialize)]
struct CreatedKey {
    #[serde(flatten)]
    record: ApiKey,
    /// The cleartext key: in this response only, never again.
    key: String,
}

pub async fn collection(context: &Context, request: Request<Incoming>) -> Result<Response<Body>> {
    let method = request.method().clone();
    only(&method, &[Method::GET, Method::POST])?;
    let (caller, _admission) = principal(context, &request).await?;
    let domain = &context.domain;
    if method == Method::GET {
        let apikeys = auth::list_keys(domain, &caller).await?;
        return Ok(json_response(StatusCode::OK, &KeyList { apikeys }));
    }
    let input: NewKey = json_body(context, request).await?;
    let (record, key) = auth::create_key(domain, &caller, input).await?;
    tracing::info!(key_id = %record.id, role = %record.role, by = %caller.id, "API key created");
    Ok(json_response(
        StatusCode::CREATED,
        &CreatedKey { record, key },
    ))
}

pub async fn item(
    context: &Context,
    request: Request<Incoming>,
    id: &str,
) -> Result<Response<Body>> {
    let method = request.method().clone();
    only(&method, &[Method::GET, Method::PATCH, Method::DELETE])?;
    let (caller, _admission) = principal(context, &request).await?;
    let domain = &context.domain;
    match method {
        Method::GET => Ok(json_response(
            StatusCode::OK,
            &auth::get_key(domain, &caller, id).await?,
        )),
        Method::PATCH => {
            let update: KeyUpdate = json_body(context, request).await?;
            let record = auth::update_key(domain, &caller, id, update).await?;
            Ok(json_response(StatusCode::OK, &record))
        }
        _ => {
            auth::delete_key(domain, &caller, id).await?;
            tracing::info!(key_id = %id, by = %caller.id, "API key deleted");
            Ok(Response::builder()
                .status(StatusCode::NO_CONTENT)
                .body(super::full(Bytes::new()))
                .expect("static response parts are valid"))
        }
    }
}
