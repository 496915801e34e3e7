//! TLS to PostgreSQL through rustls (ring), as tokio-postgres's `MakeTlsConnect`.
//!
//! Written here instead of taking tokio-postgres-rustls: that crate brings a second `sha2`
//! and `digest` generation plus `x509-cert` for the channel binding, which x509-parser and
//! ring (already in the binary) do in a few lines.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

/// Makes one rustls connection per PostgreSQL connection, for the host it connects to.
#[derive(Clone)]
pub struct RustlsConnect {
    config: Arc<rustls::ClientConfig>,
}

impl RustlsConnect {
    pub fn new(config: rustls::ClientConfig) -> Self {
        RustlsConnect {
            config: Arc::new(config),
        }
    }
}

impl<S> MakeTlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type TlsConnect = RustlsHost;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, host: &str) -> Result<RustlsHost, Self::Error> {
        Ok(RustlsHost {
            config: self.config.clone(),
            name: ServerName::try_from(host.to_string())?,
        })
    }
}

pub struct RustlsHost {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsHost
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(self.config);
        Box::pin(async move {
            let stream = connector.connect(self.name, stream).await?;
            Ok(TlsStream(stream))
        })
    }
}

pub struct TlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S> tokio_postgres::tls::TlsStream for TlsStream<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    /// `tls-server-end-point` (RFC 5929): the server certificate's hash, so SCRAM-SHA-256-PLUS
    /// binds the login to this TLS session and a man in the middle cannot relay it.
    fn channel_binding(&self) -> ChannelBinding {
        let (_, connection) = self.0.get_ref();
        connection
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| end_point_hash(leaf.as_ref()))
            .map(ChannelBinding::tls_server_end_point)
            .unwrap_or_else(ChannelBinding::none)
    }
}

/// The certificate hashed with its signature's hash (SHA-256 for MD5 and SHA-1, per the
/// RFC); None for algorithms without one (Ed25519), where no binding is offered.
fn end_point_hash(der: &[u8]) -> Option<Vec<u8>> {
    use x509_parser::oid_registry as oids;
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
    let algorithm = &certificate.signature_algorithm.algorithm;
    let digest = if *algorithm == oids::OID_PKCS1_SHA384WITHRSA
        || *algorithm == oids::OID_SIG_ECDSA_WITH_SHA384
    {
        &ring::digest::SHA384
    } else if *algorithm == oids::OID_PKCS1_SHA512WITHRSA
        || *algorithm == oids::OID_SIG_ECDSA_WITH_SHA512
    {
        &ring::digest::SHA512
    } else if *algorithm == oids::OID_SIG_ED25519 || *algorithm == oids::OID_PKCS1_RSASSAPSS {
        return None;
    } else {
        &ring::digest::SHA256
    };
    Some(ring::digest::digest(digest, der).as_ref().to_vec())
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
