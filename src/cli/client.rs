//! Talking to svc-server: a gRPC channel with the API key attached, and a small JSON-over-HTTP
//! client for the REST routes. Every failure becomes a `CliError` with the contract's code.
//!
//! `https://` addresses use TLS (rustls with ring, `crate::tls::client_config`): one
//! connection per process, made here with tokio-rustls rather than a TLS connector crate,
//! since each CLI run sends one request (REST) or opens one channel (gRPC). The server's
//! certificate must chain to `--ca-file`, or to the system's store without it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::{exit, CliError, Common};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// `--server` as a URL: `host:port` means plain `http://`.
fn server_url(server: &str) -> String {
    if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    }
}

/// The host `--server` names when the connection to it would be plain TCP to another machine
/// (not https://, not a loopback address): what travels then can be read on the network.
pub fn plaintext_remote_host(server: &str) -> Option<String> {
    let uri: Uri = server_url(server).parse().ok()?;
    if uri.scheme_str() == Some("https") {
        return None;
    }
    let host = uri.host()?;
    let bare = without_brackets(host);
    let is_loopback = bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    (!is_loopback).then(|| host.to_string())
}

/// An IPv6 literal keeps its brackets in a URI's host; name checks and connects want the
/// address itself.
fn without_brackets(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
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
            async move { connect_tls(&uri, config).await.map(TokioIo::new) }
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

/// Connects to `uri`'s host and port and completes a TLS handshake, verifying the server's
/// certificate for that host name (or IP address).
async fn connect_tls(
    uri: &Uri,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    use std::io::{Error, ErrorKind};
    let host = uri
        .host()
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "the address has no host"))?;
    let port = uri.port_u16().unwrap_or(443);
    let bare = without_brackets(host);
    let name = rustls::pki_types::ServerName::try_from(bare.to_string())
        .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("'{host}': {e}")))?;
    let socket = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((bare, port)))
        .await
        .map_err(|_| Error::new(ErrorKind::TimedOut, "connect timed out"))??;
    let _ = socket.set_nodelay(true);
    let connector = tokio_rustls::TlsConnector::from(config);
    connector.connect(name, socket).await.map_err(|e| {
        if let Some(why) = crate::tls::untrusted_certificate(&e) {
            return Error::other(format!(
                "TLS: the server's certificate is not trusted ({why}); pass --ca-file \
                 PATH (or set SVC_CA_FILE) with the CA that issued it"
            ));
        }
        match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
            Some(other) => Error::other(format!("TLS: {other}")),
            None => e,
        }
    })
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
            send_over_tls(request, config)
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
    let code = match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => exit::DENIED,
        StatusCode::NOT_FOUND => exit::NOT_FOUND,
        StatusCode::SERVICE_UNAVAILABLE => exit::UNREACHABLE,
        _ => exit::FAILED,
    };
    Err(CliError::new(code, message))
}

/// Sends one request over its own TLS connection (HTTP/1.1), in origin form with `Host`, as
/// the pooled client does for plain HTTP.
async fn send_over_tls(
    mut request: Request<Full<Bytes>>,
    config: Arc<rustls::ClientConfig>,
) -> Result<Response<Incoming>, Box<dyn std::error::Error + Send + Sync>> {
    let stream = connect_tls(request.uri(), config).await?;
    if let Some(authority) = request.uri().authority() {
        let host = header::HeaderValue::from_str(authority.as_str())?;
        request.headers_mut().insert(header::HOST, host);
    }
    let origin_form = request
        .uri()
        .path_and_query()
        .map_or("/", |path| path.as_str())
        .parse()?;
    *request.uri_mut() = origin_form;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "https connection ended with an error");
        }
    });
    Ok(sender.send_request(request).await?)
}

#[cfg(test)]
mod tests {
    use super::plaintext_remote_host;

    #[test]
    fn plaintext_remote_hosts() {
        for local in [
            "127.0.0.1:5397",
            "localhost:5397",
            "http://127.0.0.2:5397",
            "http://[::1]:5397",
            "https://svc.example:5397",
            "https://10.0.0.5:5397",
        ] {
            assert_eq!(plaintext_remote_host(local), None, "{local}");
        }
        for (remote, host) in [
            ("10.0.0.5:5397", "10.0.0.5"),
            ("http://svc.example:5397", "svc.example"),
            ("http://[2001:db8::1]:5397", "[2001:db8::1]"),
        ] {
            assert_eq!(
                plaintext_remote_host(remote).as_deref(),
                Some(host),
                "{remote}"
            );
        }
    }
}
