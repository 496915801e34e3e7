//! Helpers shared by the bus integration tests: an in-process broker and a raw protocol
//! client that reads replies as they arrive.
//!
//! The raw client exists because the point of several tests is the exact bytes on the wire,
//! which a real client library hides.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use svc::bus::{Authenticator, Broker, BrokerConfig, BrokerHandle, NoAuth};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Generous: tests never assert on timing, this only turns a hang into a failure.
pub const PATIENCE: Duration = Duration::from_secs(10);

pub async fn start_broker(config: BrokerConfig, auth: Arc<dyn Authenticator>) -> BrokerHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    Broker::start(config, auth, listener).await.unwrap()
}

pub async fn start_open_broker() -> BrokerHandle {
    start_broker(BrokerConfig::default(), Arc::new(NoAuth)).await
}

pub fn url(handle: &BrokerHandle) -> String {
    format!("nats://{}", handle.local_addr())
}

/// What a raw connection has received so far, and whether the server closed it.
#[derive(Clone, Debug, Default)]
pub struct Received {
    pub bytes: Vec<u8>,
    pub closed: bool,
}

/// A raw TCP client. A background task reads continuously, so nothing the server sent is
/// lost if it resets the connection later.
pub struct Raw {
    writer: OwnedWriteHalf,
    received: watch::Receiver<Received>,
    /// Bytes already consumed by `expect`.
    consumed: usize,
}

impl Raw {
    pub async fn connect(addr: SocketAddr) -> Raw {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (mut reader, writer) = stream.into_split();
        let (sender, received) = watch::channel(Received::default());
        tokio::spawn(async move {
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                match reader.read(&mut chunk).await {
                    Ok(0) | Err(_) => {
                        sender.send_modify(|received| received.closed = true);
                        return;
                    }
                    Ok(read) => sender
                        .send_modify(|received| received.bytes.extend_from_slice(&chunk[..read])),
                }
            }
        });
        Raw {
            writer,
            received,
            consumed: 0,
        }
    }

    /// Connects and consumes the INFO line, returning it.
    pub async fn connect_after_info(addr: SocketAddr) -> (Raw, String) {
        let mut raw = Raw::connect(addr).await;
        let info = raw.read_line().await;
        assert!(info.starts_with("INFO "), "{info}");
        (raw, info)
    }

    /// Writes; a failed write (server already closed) is not an error here.
    pub async fn send(&mut self, bytes: &[u8]) {
        let _ = self.writer.write_all(bytes).await;
    }

    pub async fn wait_for<F: Fn(&Received) -> bool>(&mut self, condition: F) -> Received {
        let result = tokio::time::timeout(
            PATIENCE,
            self.received.wait_for(|received| condition(received)),
        )
        .await
        .map(|received| received.map(|received| received.clone()));
        match result {
            Ok(Ok(received)) => received,
            _ => {
                let snapshot = self.snapshot();
                panic!(
                    "timed out; received so far: {:?} closed={}",
                    String::from_utf8_lossy(&snapshot.bytes),
                    snapshot.closed
                )
            }
        }
    }

    pub fn snapshot(&self) -> Received {
        let received = self.received.borrow().clone();
        Received {
            bytes: received.bytes[self.consumed.min(received.bytes.len())..].to_vec(),
            closed: received.closed,
        }
    }

    /// Waits for exactly `expected` as the next bytes.
    pub async fn expect(&mut self, expected: &[u8]) {
        let start = self.consumed;
        let received = self
            .wait_for(|received| received.bytes.len() >= start + expected.len() || received.closed)
            .await;
        let end = (start + expected.len()).min(received.bytes.len());
        assert_eq!(
            String::from_utf8_lossy(&received.bytes[start..end]),
            String::from_utf8_lossy(expected)
        );
        self.consumed = end;
    }

    pub async fn read_line(&mut self) -> String {
        let start = self.consumed;
        let received = self
            .wait_for(|received| {
                received.bytes[start.min(received.bytes.len())..]
                    .windows(2)
                    .any(|w| w == b"\r\n")
            })
            .await;
        let rest = &received.bytes[start..];
        let end = rest.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
        self.consumed += end;
        String::from_utf8_lossy(&rest[..end]).into_owned()
    }

    /// Waits until the server closes; returns everything not yet consumed.
    pub async fn expect_closed(&mut self) -> Vec<u8> {
        let received = self.wait_for(|received| received.closed).await;
        let rest = received.bytes[self.consumed..].to_vec();
        self.consumed = received.bytes.len();
        rest
    }

    /// PING, then waits for everything up to and including the PONG; returns it.
    pub async fn flush(&mut self) -> Vec<u8> {
        self.send(b"PING\r\n").await;
        let start = self.consumed;
        let received = self
            .wait_for(|received| {
                received.bytes[start.min(received.bytes.len())..].ends_with(b"PONG\r\n")
                    || received.closed
            })
            .await;
        assert!(
            !received.closed,
            "closed while flushing: {:?}",
            String::from_utf8_lossy(&received.bytes[start..])
        );
        self.consumed = received.bytes.len();
        received.bytes[start..received.bytes.len() - 6].to_vec()
    }
}
