//! `/.well-known/jwks.json` and `/.well-known/jwt-revocations.json`: the public material JWT-SVID
//! verifiers need (docs/identity.md). Public keys and revoked token ids only, so no API key is
//! asked for (as an OIDC provider serves its JWKS); not rate limited per key for that reason.

use http::{header, Response, StatusCode};

use super::{json_response, Body};
use crate::identity::jwt;
use crate::server::Context;
use crate::Result;

fn fresh(mut response: Response<Body>) -> Response<Body> {
    // Verifiers may cache; a rotation or a revocation should be seen at their next fetch.
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    response
}

pub async fn jwks(context: &Context) -> Result<Response<Body>> {
    let jwks = jwt::jwks(context.domain.store.as_ref()).await?;
    Ok(fresh(json_response(StatusCode::OK, &jwks)))
}

pub async fn revocations(context: &Context) -> Result<Response<Body>> {
    let list = jwt::revocations(context.domain.store.as_ref()).await?;
    Ok(fresh(json_response(StatusCode::OK, &list)))
}
