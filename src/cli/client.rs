//! Talking to svc-server: a gRPC channel with the API key attached, and a small JSON-over-HTTP
//! client for the REST routes. Every failure becomes a `CliError` with the contract's code.

use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use super::{exit, CliError, Common};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Connects to the gRPC server named by `--server`.
pub async fn grpc_channel(common: &Common) -> Result<tonic::transport::Channel, CliError> {
    let address = if common.server.contains("://") {
        common.server.clone()
    } else {
        format!("http://{}", common.server)
    };
    let endpoint = tonic::transport::Endpoint::from_shared(address.clone())
        .map_err(|e| CliError::usage(format!("invalid --server '{}': {e}", common.server)))?
        .connect_timeout(CONNECT_TIMEOUT);
    endpoint.connect().await.map_err(|e| {
        CliError::new(
            exit::UNREACHABLE,
            format!("cannot reach the server at {}: {e}", common.server),
        )
    })
}

/// Wraps a message in a request carrying `authorization: Bearer KEY`.
pub fn authorized<T>(common: &Common, message: T) -> Result<tonic::Request<T>, CliError> {
    let mut request = tonic::Request::new(message);
    let key = require_key(common)?;
    let value = format!("Bearer {key}")
        .parse()
        .map_err(|_| CliError::usage("the API key contains characters not allowed in a header"))?;
    request.metadata_mut().insert("authorization", value);
    Ok(request)
}

fn require_key(common: &Common) -> Result<&str, CliError> {
    common.api_key.as_deref().ok_or_else(|| {
        CliError::new(
            exit::DENIED,
            "no API key: pass --api-key or set SVC_API_KEY",
        )
    })
}

/// Sends a JSON request to the REST API; returns the decoded body of a 2xx answer
/// (`Value::Null` for 204) or a `CliError` carrying the server's message.
pub async fn http_json(
    common: &Common,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, CliError> {
    let key = require_key(common)?;
    let url = format!("{}{}", common.http_url.trim_end_matches('/'), path);
    let payload = match body {
        Some(value) => Bytes::from(serde_json::to_vec(value).expect("JSON values serialize")),
        None => Bytes::new(),
    };
    let request = Request::builder()
        .method(method)
        .uri(&url)
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(payload))
        .map_err(|e| CliError::usage(format!("invalid --http-url '{}': {e}", common.http_url)))?;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let response = tokio::time::timeout(REQUEST_TIMEOUT, client.request(request))
        .await
        .map_err(|_| {
            CliError::new(
                exit::UNREACHABLE,
                format!("no answer from {url} within {REQUEST_TIMEOUT:?}"),
            )
        })?
        .map_err(|e| {
            CliError::new(
                exit::UNREACHABLE,
                format!("cannot reach the server at {}: {e}", common.http_url),
            )
        })?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| CliError::new(exit::UNREACHABLE, format!("connection lost: {e}")))?
        .to_bytes();
    if status == StatusCode::NO_CONTENT {
        return Ok(Value::Null);
    }
    let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if status.is_success() {
        return Ok(value);
    }
    let message = value["error"]["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("server answered {status}"));
    let code = match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => exit::DENIED,
        StatusCode::NOT_FOUND => exit::NOT_FOUND,
        StatusCode::SERVICE_UNAVAILABLE => exit::UNREACHABLE,
        _ => exit::FAILED,
    };
    Err(CliError::new(code, message))
}
