//! One delivery attempt: an HTTP/1.1 POST over a new connection (rustls with ring for
//! https://, the system's roots or `webhooks.ca_file`) to an address the SSRF check passed,
//! bounded as a whole by `webhooks.timeout`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::target::{self, Target};
use crate::{Error, Result};

/// What one attempt got: the status the receiver answered, or why there was none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub status: Option<u16>,
    pub error: Option<String>,
}

impl Outcome {
    pub fn is_success(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// The HTTP client deliveries share (its TLS configuration is made once).
pub struct Client {
    tls: tokio_rustls::TlsConnector,
    timeout: Duration,
    allow_private: bool,
}

impl Client {
    pub fn new(config: &crate::config::WebhooksConfig) -> Result<Client> {
        let ca_file = (!config.ca_file.is_empty()).then(|| std::path::Path::new(&config.ca_file));
        let tls = crate::tls::client_config(ca_file, crate::tls::ALPN_REST)
            .map_err(|e| Error::Invalid(format!("webhooks.ca_file: {e}")))?;
        Ok(Client {
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            timeout: config.timeout.0,
            allow_private: config.allow_private,
        })
    }

    pub fn allow_private(&self) -> bool {
        self.allow_private
    }

    /// POSTs `body` with `headers` to `url`; never fails, the outcome says what happened.
    pub async fn post(&self, url: &str, headers: &[(&str, String)], body: Bytes) -> Outcome {
        match tokio::time::timeout(self.timeout, self.post_inner(url, headers, body)).await {
            Ok(Ok(status)) => Outcome {
                status: Some(status),
                error: (!(200..300).contains(&status))
                    .then(|| format!("the receiver answered {status}")),
            },
            Ok(Err(e)) => Outcome {
                status: None,
                error: Some(e),
            },
            Err(_) => Outcome {
                status: None,
                error: Some(format!(
                    "no answer within {}",
                    crate::clock::format_duration(self.timeout)
                )),
            },
        }
    }

    async fn post_inner(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: Bytes,
    ) -> std::result::Result<u16, String> {
        let target = target::parse(url).map_err(|e| e.to_string())?;
        let addresses = target::resolve(&target, self.allow_private)
            .await
            .map_err(|e| e.to_string())?;
        let mut last_error = String::new();
        for address in addresses {
            match TcpStream::connect(address).await {
                Ok(socket) => {
                    let _ = socket.set_nodelay(true);
                    return self.exchange(socket, &target, headers, body).await;
                }
                Err(e) => last_error = format!("connect to {address}: {e}"),
            }
        }
        Err(last_error)
    }

    async fn exchange(
        &self,
        socket: TcpStream,
        target: &Target,
        headers: &[(&str, String)],
        body: Bytes,
    ) -> std::result::Result<u16, String> {
        let mut request = Request::post(target.path.as_str())
            .header(hyper::header::HOST, target.host_header())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(
                hyper::header::USER_AGENT,
                concat!("svc-webhooks/", env!("CARGO_PKG_VERSION")),
            );
        for (name, value) in headers {
            request = request.header(*name, value.as_str());
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| format!("request: {e}"))?;
        if target.is_https {
            let name = rustls::pki_types::ServerName::try_from(target.host.clone())
                .map_err(|e| format!("'{}': {e}", target.host))?;
            let stream = self.tls.connect(name, socket).await.map_err(|e| {
                match crate::tls::untrusted_certificate(&e) {
                    Some(why) => format!(
                        "TLS: the receiver's certificate is not trusted ({why}); set \
                         webhooks.ca_file to the CA that issued it"
                    ),
                    None => format!("TLS: {e}"),
                }
            })?;
            send(stream, request).await
        } else {
            send(socket, request).await
        }
    }
}

async fn send<S>(stream: S, request: Request<Full<Bytes>>) -> std::result::Result<u16, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    let connection = tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    let status = response.status().as_u16();
    // Read (and drop) a bounded answer so the receiver's write completes; its content is
    // not kept.
    let mut body = response.into_body();
    let mut read = 0usize;
    while let Some(Ok(frame)) = body.frame().await {
        read += frame.data_ref().map_or(0, |d| d.len());
        if read > 64 * 1024 {
            break;
        }
    }
    connection.abort();
    Ok(status)
}
