//! Accepting connections for the REST and gRPC listeners, with TLS when `tls` is configured.
//!
//! Every accepted connection holds one slot of its listener's cap (`limits.max_connections`)
//! and one of its source address's share of it (`limits.max_connections_per_address`) until
//! it closes ([`Capped`]); past either a connection is closed at once (REST first gets a 503),
//! so a flood can neither queue without bound nor run the process out of file descriptors
//! that the other listeners need, and one address alone cannot fill the listener.
//!
//! Owns the accept loop: each accepted socket gets its own task that waits for the client's
//! first byte (plain) or its whole TLS handshake (`tls`), bounded by `limits.handshake_timeout`,
//! and only such connections reach the HTTP server. So a client that connects and sends
//! nothing (or handshakes slowly) holds one task and one socket for at most that long (10 s by
//! default), never the loop, and never beyond it: HTTP/2 (gRPC) has no deadline of its own for
//! a client that never sends its preface. A failed handshake is logged at
//! debug with the peer and the connection dropped. Certificates are loaded by `crate::tls`.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;

/// Accepts on `listener` until `stop` flips or the returned stream is dropped, and yields each
/// connection whose handshake succeeded. TCP_NODELAY is set on every accepted socket.
pub fn incoming(
    listener: Listener,
    config: Arc<rustls::ServerConfig>,
    mut stop: watch::Receiver<bool>,
) -> impl Stream<Item = io::Result<Capped<TlsStream<TcpStream>>>> + Send + Unpin + 'static {
    let acceptor = TlsAcceptor::from(config);
    // Small: a full channel only means the server is slow to take connections; handshake
    // tasks wait for room rather than accepting more work.
    let (sender, receiver) = mpsc::channel(32);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                (socket, peer, slot) = listener.accept() => {
                    let acceptor = acceptor.clone();
                    let sender = sender.clone();
                    let name = listener.name;
                    let deadline = listener.handshake;
                    tokio::spawn(async move {
                        if let Some(stream) = handshake(&acceptor, socket, peer, name, deadline).await {
                            let _ = sender.send(Ok(Capped::new(stream, slot, peer))).await;
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

/// A REST or gRPC listening socket with its connection cap.
pub struct Listener {
    listener: TcpListener,
    /// `listen.http` or `listen.grpc`, for logs.
    pub name: &'static str,
    slots: Arc<Semaphore>,
    /// Connections open per source address, and how many one address may hold.
    addresses: Addresses,
    per_address: usize,
    /// Written to a connection refused over the cap, and over its address's share, before it
    /// is closed (REST: a 503 naming the limit).
    refusal: Refusal,
    /// How long a new connection has for its first byte or TLS handshake.
    handshake: Duration,
}

/// What a client refused a connection reads before it closes: over the listener's cap, and
/// over its address's share.
pub struct Refusal {
    pub over_cap: &'static [u8],
    pub over_share: &'static [u8],
}

/// REST's refusals: a 503 naming the limit.
pub const HTTP_BUSY: Refusal = Refusal {
    over_cap: b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
connection: close\r\ncontent-length: 90\r\n\r\n\
{\"error\":{\"code\":\"unavailable\",\"message\":\"too many connections (limits.max_connections)\"}}",
    over_share: b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
connection: close\r\ncontent-length: 119\r\n\r\n\
{\"error\":{\"code\":\"unavailable\",\"message\":\"too many connections from one address (limits.max_connections_per_address)\"}}",
};

/// gRPC's: the connection is closed unanswered (a client that has not spoken HTTP/2 yet could
/// not read an answer anyway).
pub const GRPC_BUSY: Refusal = Refusal {
    over_cap: b"",
    over_share: b"",
};

type Addresses = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// A connection's hold on its listener: a slot of the cap and one of its address's share,
/// both given back when it is dropped.
pub struct Slot {
    _cap: OwnedSemaphorePermit,
    addresses: Addresses,
    address: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .addresses
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.address);
            }
        }
    }
}

impl Listener {
    pub fn new(
        listener: TcpListener,
        name: &'static str,
        max_connections: usize,
        per_address: usize,
        refusal: Refusal,
        handshake: Duration,
    ) -> Self {
        Listener {
            listener,
            name,
            slots: Arc::new(Semaphore::new(max_connections)),
            addresses: Arc::default(),
            per_address: per_address.max(1),
            refusal,
            handshake,
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next connection within the cap, with TCP_NODELAY set (a unary call whose frames
    /// span two writes would otherwise wait for the peer's delayed ACK, about 40 ms).
    /// Connections over the cap or their address's share are answered with `refusal` and
    /// closed. Accept errors (usually EMFILE) are logged and retried after a pause instead of
    /// spinning.
    pub async fn accept(&self) -> (TcpStream, SocketAddr, Slot) {
        loop {
            match self.listener.accept().await {
                Ok((socket, peer)) => {
                    let Ok(cap) = self.slots.clone().try_acquire_owned() else {
                        self.refuse(
                            socket,
                            peer,
                            "limits.max_connections",
                            self.refusal.over_cap,
                        );
                        continue;
                    };
                    let Some(slot) = self.share(cap, peer.ip()) else {
                        self.refuse(
                            socket,
                            peer,
                            "limits.max_connections_per_address",
                            self.refusal.over_share,
                        );
                        continue;
                    };
                    let _ = socket.set_nodelay(true);
                    return (socket, peer, slot);
                }
                Err(e) => {
                    tracing::warn!(listener = self.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// One of `address`'s share, with the cap's slot; None when the address holds its share.
    fn share(&self, cap: OwnedSemaphorePermit, address: IpAddr) -> Option<Slot> {
        let mut open = self
            .addresses
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(address).or_insert(0);
        if *count >= self.per_address {
            return None;
        }
        *count += 1;
        Some(Slot {
            _cap: cap,
            addresses: self.addresses.clone(),
            address,
        })
    }

    fn refuse(&self, mut socket: TcpStream, peer: SocketAddr, limit: &str, refusal: &'static [u8]) {
        tracing::debug!(listener = self.name, %peer, limit, "connection refused: limit reached");
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = tokio::time::timeout(Duration::from_secs(1), socket.write_all(refusal)).await;
        });
    }

    /// Accepted plain connections that sent a first byte in time, each holding its slot,
    /// until `stop` flips or the stream is dropped.
    pub fn plain(
        self,
        mut stop: watch::Receiver<bool>,
    ) -> impl Stream<Item = io::Result<Capped<TcpStream>>> + Send + Unpin + 'static {
        let (sender, receiver) = mpsc::channel(32);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    (socket, peer, slot) = self.accept() => {
                        let sender = sender.clone();
                        let (name, deadline) = (self.name, self.handshake);
                        tokio::spawn(async move {
                            if first_byte(&socket, peer, name, deadline).await {
                                let _ = sender.send(Ok(Capped::new(socket, slot, peer))).await;
                            }
                        });
                    }
                    _ = sender.closed() => break,
                    _ = stop.changed() => break,
                }
            }
        });
        ReceiverStream::new(receiver)
    }
}

/// Waits until the client has sent something (without reading it).
async fn first_byte(
    socket: &TcpStream,
    peer: SocketAddr,
    listener_name: &'static str,
    deadline: Duration,
) -> bool {
    let mut byte = [0u8; 1];
    match tokio::time::timeout(deadline, socket.peek(&mut byte)).await {
        Ok(Ok(n)) if n > 0 => true,
        Ok(_) => false,
        Err(_) => {
            tracing::debug!(listener = listener_name, %peer, timeout = ?deadline, "closed: nothing sent in time");
            false
        }
    }
}

/// A connection that holds a slot of its listener's cap until it is dropped, and that can be
/// closed from outside through its [`Connection`] handle.
pub struct Capped<IO> {
    io: IO,
    _slot: Slot,
    connection: Connection,
}

impl<IO> Capped<IO> {
    fn new(io: IO, slot: Slot, peer: SocketAddr) -> Self {
        Capped {
            io,
            _slot: slot,
            connection: Connection {
                peer,
                cut: Arc::default(),
            },
        }
    }

    /// Once cut, every read and write fails, so the HTTP server serving the connection ends
    /// it (and drops every stream on it); the task polling it is woken for that.
    fn check_cut(&self, cx: &Context<'_>) -> io::Result<()> {
        self.connection.cut.waker.register(cx.waker());
        if self.connection.cut.is_cut.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "connection cut off by the server",
            ));
        }
        Ok(())
    }
}

/// What gRPC handlers see of their connection (tonic puts it in every request's extensions):
/// the peer, and a way to close the connection when one of its streams has to be cut off
/// (`server::grpc::relay`). HTTP/2 gives a handler no way to reset its own stream while the
/// connection waits for the client to open its flow-control window, so the connection goes.
#[derive(Clone, Debug)]
pub struct Connection {
    pub peer: SocketAddr,
    cut: Arc<Cut>,
}

#[derive(Debug, Default)]
struct Cut {
    is_cut: AtomicBool,
    /// The task serving the connection, woken by `cut` so that it meets the error now.
    waker: AtomicWaker,
}

impl Connection {
    /// Closes the connection: its next read or write fails.
    pub fn cut(&self) {
        self.cut.is_cut.store(true, Ordering::Release);
        self.cut.waker.wake();
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Capped<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check_cut(cx)?;
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Capped<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check_cut(cx)?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check_cut(cx)?;
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO> tonic::transport::server::Connected for Capped<IO> {
    type ConnectInfo = Connection;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.connection.clone()
    }
}

async fn handshake(
    acceptor: &TlsAcceptor,
    socket: TcpStream,
    peer: SocketAddr,
    listener_name: &'static str,
    deadline: Duration,
) -> Option<TlsStream<TcpStream>> {
    match tokio::time::timeout(deadline, acceptor.accept(socket)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(error)) => {
            tracing::debug!(listener = listener_name, %peer, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(listener = listener_name, %peer, timeout = ?deadline, "TLS handshake timed out");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusals are fixed bytes (written before any request is read), so they are held
    /// here to the one error body (`error::error_body`) and to their own content-length.
    #[test]
    fn busy_answers_carry_the_one_error_body() {
        let cases = [
            (
                HTTP_BUSY.over_cap,
                "too many connections (limits.max_connections)",
            ),
            (
                HTTP_BUSY.over_share,
                "too many connections from one address (limits.max_connections_per_address)",
            ),
        ];
        for (answer, message) in cases {
            let text = std::str::from_utf8(answer).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            let expected = crate::error::Error::Unavailable(message.into()).body();
            assert_eq!(
                serde_json::from_str::<serde_json::Value>(body).unwrap(),
                expected
            );
            assert!(
                head.ends_with(&format!("content-length: {}", body.len())),
                "{head}"
            );
        }
    }
}
