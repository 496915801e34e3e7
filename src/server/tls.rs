//! Accepting connections for the REST and gRPC listeners, with TLS when `tls` is configured.
//!
//! Owns the accept loop when `tls` is configured: each accepted socket gets its own task for
//! the handshake, bounded by `HANDSHAKE_TIMEOUT`, and only finished streams reach the HTTP
//! server. So a client that connects and sends nothing (or handshakes slowly) holds one task
//! and one socket for at most ten seconds, never the loop. A failed handshake is logged at
//! debug with the peer and the connection dropped. Certificates are loaded by `crate::tls`.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;

/// How long a client has to finish its TLS handshake after connecting.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts on `listener` until `stop` flips or the returned stream is dropped, and yields each
/// connection whose handshake succeeded. TCP_NODELAY is set on every accepted socket.
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    listener_name: &'static str,
    mut stop: watch::Receiver<bool>,
) -> impl Stream<Item = io::Result<TlsStream<TcpStream>>> + Send + Unpin + 'static {
    let acceptor = TlsAcceptor::from(config);
    // Small: a full channel only means the server is slow to take connections; handshake
    // tasks wait for room rather than accepting more work.
    let (sender, receiver) = mpsc::channel(32);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                (socket, peer) = accept(&listener, listener_name) => {
                    let acceptor = acceptor.clone();
                    let sender = sender.clone();
                    tokio::spawn(async move {
                        if let Some(stream) = handshake(&acceptor, socket, peer, listener_name).await {
                            let _ = sender.send(Ok(stream)).await;
                        }
                    });
                }
                _ = sender.closed() => break,
                _ = stop.changed() => break,
            }
        }
        // Dropping the listener here closes the port.
    });
    ReceiverStream::new(receiver)
}

/// The next connection, with TCP_NODELAY set (a unary call whose frames span two writes
/// would otherwise wait for the peer's delayed ACK, about 40 ms). Accept errors (usually
/// EMFILE) are logged and retried after a pause instead of spinning.
pub async fn accept(
    listener: &TcpListener,
    listener_name: &'static str,
) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((socket, peer)) => {
                let _ = socket.set_nodelay(true);
                return (socket, peer);
            }
            Err(e) => {
                tracing::warn!(listener = listener_name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn handshake(
    acceptor: &TlsAcceptor,
    socket: TcpStream,
    peer: SocketAddr,
    listener_name: &'static str,
) -> Option<TlsStream<TcpStream>> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(error)) => {
            tracing::debug!(listener = listener_name, %peer, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(listener = listener_name, %peer, timeout = ?HANDSHAKE_TIMEOUT, "TLS handshake timed out");
            None
        }
    }
}
