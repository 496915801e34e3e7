//! /api/v1/apikeys: create, list, show, update, delete (admin only).

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
    let caller = principal(context, &request).await?;
    let store = context.store.as_ref();
    if method == Method::GET {
        let apikeys = auth::list_keys(store, &caller).await?;
        return Ok(json_response(StatusCode::OK, &KeyList { apikeys }));
    }
    // Authorize before reading the body, so a readonly caller learns nothing from validation.
    caller.require(auth::Role::Admin)?;
    let input: NewKey = json_body(context, request).await?;
    let (record, key) = auth::create_key(store, &caller, input).await?;
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
    let caller = principal(context, &request).await?;
    let store = context.store.as_ref();
    match method {
        Method::GET => Ok(json_response(
            StatusCode::OK,
            &auth::get_key(store, &caller, id).await?,
        )),
        Method::PATCH => {
            caller.require(auth::Role::Admin)?;
            let update: KeyUpdate = json_body(context, request).await?;
            let record = auth::update_key(store, &caller, id, update).await?;
            Ok(json_response(StatusCode::OK, &record))
        }
        _ => {
            auth::delete_key(store, &caller, id).await?;
            context.rate_limiter.forget(id);
            tracing::info!(key_id = %id, by = %caller.id, "API key deleted");
            Ok(Response::builder()
                .status(StatusCode::NO_CONTENT)
                .body(Body::default())
                .expect("static response parts are valid"))
        }
    }
}
