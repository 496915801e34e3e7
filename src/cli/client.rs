//! Talking to svc-server: a gRPC channel with the API key attached, and a small JSON-over-HTTP
//! client for the REST routes. Every failure becomes a `CliError` with the contract's code.
//!
//! `https://` addresses use TLS (rustls with ring, `crate::tls::client_config`): one
//! connection per process, made by `crate::tls::connect` rather than a TLS connector crate,
//! since each CLI run sends one request (REST) or opens one channel (gRPC). The server's
//! certificate must chain to `--ca-file`, or to the system's store without it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;

use super::{exit, CliError, Common};
use crate::tls::CONNECT_TIMEOUT;

/// What an untrusted server certificate's error tells to pass.
const CA_HINT: &str = "--ca-file PATH (or set SVC_CA_FILE)";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// `--server` as a URL: `host:port` means plain `http://`.
fn server_url(server: &str) -> String {
    if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    }
}

/// Connects to the gRPC server named by `--server`.
pub async fn grpc_channel(common: &Common) -> Result<tonic::transport::Channel, CliError> {
    let address = server_url(&common.server);
    let endpoint = tonic::transport::Endpoint::from_shared(address.clone())
        .map_err(|e| CliError::usage(format!("invalid --server '{}': {e}", common.server)))?
        .connect_timeout(CONNECT_TIMEOUT);
    if endpoint.uri().scheme_str() == Some("https") {
        let config = Arc::new(tls_config(common, crate::tls::ALPN_GRPC)?);
        let connector = tower::service_fn(move |uri: Uri| {
            let config = config.clone();
            async move {
                crate::tls::connect(&uri, config, CA_HINT)
                    .await
                    .map(TokioIo::new)
            }
        });
        return endpoint
            .connect_with_connector(connector)
            .await
            .map_err(|e| unreachable(&common.server, &e));
    }
    endpoint
        .connect()
        .await
        .map_err(|e| unreachable(&common.server, &e))
}

/// The client TLS configuration for `--ca-file` (or the system's store).
fn tls_config(common: &Common, alpn: &[u8]) -> Result<rustls::ClientConfig, CliError> {
    crate::tls::client_config(common.ca_file.as_deref(), alpn)
        .map_err(|e| CliError::usage(format!("--ca-file: {e}")))
}

/// `cannot reach the server at ADDRESS: CAUSE`, with every cause in the chain.
fn unreachable(address: &str, error: &dyn std::error::Error) -> CliError {
    let mut message = format!("cannot reach the server at {address}");
    let mut last = String::new();
    let mut cause = Some(error);
    while let Some(error) = cause {
        let text = error.to_string();
        // tonic wraps the cause in errors that only say "transport error".
        if text != last && text != "transport error" {
            message.push_str(": ");
            message.push_str(&text);
        }
        last = text;
        cause = error.source();
    }
    CliError::new(exit::UNREACHABLE, message)
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
    let sent = async {
        if request.uri().scheme_str() == Some("https") {
            let config = Arc::new(tls_config(common, crate::tls::ALPN_REST)?);
            crate::tls::send_http1(request, config, CA_HINT)
                .await
                .map_err(|e| unreachable(&common.http_url, e.as_ref()))
        } else {
            let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
            client
                .request(request)
                .await
                .map_err(|e| unreachable(&common.http_url, &e))
        }
    };
    let response = tokio::time::timeout(REQUEST_TIMEOUT, sent)
        .await
        .map_err(|_| {
            CliError::new(
                exit::UNREACHABLE,
                format!("no answer from {url} within {REQUEST_TIMEOUT:?}"),
            )
        })??;
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
    Err(CliError::new(exit::of_http(status.as_u16()), message))
}
