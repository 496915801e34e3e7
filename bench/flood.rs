//! Connection floods (issue 23): 2,000 silent TCP connections on one port at a time (REST,
//! gRPC, bus), and meanwhile health probes on every port, each over a new connection and over
//! one opened before the flood. Prints p50/p99/max per probe and port, and how many probes
//! failed. Goal: the ports not flooded answer with p99 ≤ 100 ms; the flooded port answers on
//! connections it already had, and new connections again once `limits.handshake_timeout`
//! (here 2 s) has closed the silent ones. The flood comes from 127.0.0.3 and the probes from
//! 127.0.0.1, so on REST and gRPC the flood meets `limits.max_connections_per_address` (a
//! quarter of the listener) first and new probe connections to the flooded port are served
//! too; the bus has no per-address share (agents share NAT addresses), only its overall cap.
//!
//! Usage: cargo bench --bench flood [-- --connections 2000 --probes 100]
//! Loopback only; every connection is closed when the bench ends.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

#[allow(dead_code)] // the shared helpers this bench does not use
mod common;
use common::Server;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn addr(url: &str) -> SocketAddr {
    url.rsplit("//").next().unwrap().parse().unwrap()
}

/// GET /health/ready on `stream` (keep-alive); true on a 200.
fn rest_probe(stream: &mut TcpStream) -> bool {
    if stream
        .write_all(b"GET /health/live HTTP/1.1\r\nhost: bench\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buffer = [0u8; 1024];
    matches!(stream.read(&mut buffer), Ok(n) if buffer[..n].starts_with(b"HTTP/1.1 200"))
}

fn rest_new(address: SocketAddr) -> bool {
    TcpStream::connect_timeout(&address, Duration::from_secs(2))
        .ok()
        .and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            Some(rest_probe(&mut s))
        })
        .unwrap_or(false)
}

/// A bus connection after INFO and CONNECT.
fn bus_connect(address: SocketAddr, key: &str) -> Option<(TcpStream, BufReader<TcpStream>)> {
    let stream = TcpStream::connect_timeout(&address, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut writer = stream;
    let connect = format!("CONNECT {{\"verbose\":false,\"auth_token\":\"{key}\"}}\r\n");
    writer.write_all(connect.as_bytes()).ok()?;
    Some((writer, reader))
}

fn bus_probe(connection: &mut (TcpStream, BufReader<TcpStream>)) -> bool {
    if connection.0.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    loop {
        line.clear();
        match connection.1.read_line(&mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) if line == "PONG\r\n" => return true,
            Ok(_) => {}
        }
    }
}

async fn grpc_channel(url: &str) -> Option<tonic::transport::Channel> {
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_string())
        .ok()?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(2));
    endpoint.connect().await.ok()
}

async fn grpc_probe(channel: tonic::transport::Channel) -> bool {
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
    client
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .is_ok()
}

/// Keeps `count` silent connections open to `target`, reopening those the server closes,
/// until stopped. Returns (connections opened, most open at once).
struct Flood {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(usize, usize)>,
}

impl Flood {
    fn start(target: SocketAddr, count: usize) -> Flood {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            // From an address of its own, as a flood from elsewhere would be.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let connect = || -> std::io::Result<TcpStream> {
                runtime.block_on(async {
                    let socket = tokio::net::TcpSocket::new_v4()?;
                    socket.bind("127.0.0.3:0".parse().unwrap())?;
                    let stream =
                        tokio::time::timeout(Duration::from_millis(500), socket.connect(target))
                            .await
                            .map_err(|_| std::io::ErrorKind::TimedOut)??;
                    stream.into_std()
                })
            };
            let (mut open, mut opened, mut peak) = (Vec::<TcpStream>::new(), 0, 0);
            while !stopping.load(Ordering::Relaxed) {
                // Drop what the server closed (a read of 0 bytes, or an error).
                open.retain(|s| {
                    let mut byte = [0u8; 1];
                    matches!(s.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                });
                while open.len() < count && !stopping.load(Ordering::Relaxed) {
                    match connect() {
                        Ok(s) => {
                            let _ = s.set_nonblocking(true);
                            open.push(s);
                            opened += 1;
                        }
                        Err(_) => break,
                    }
                }
                peak = peak.max(open.len());
                std::thread::sleep(Duration::from_millis(50));
            }
            (opened, peak)
        });
        Flood { stop, thread }
    }

    fn stop(self) -> (usize, usize) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

struct Figures {
    times: Vec<Duration>,
    failed: usize,
}

impl Figures {
    fn new() -> Self {
        Figures {
            times: Vec::new(),
            failed: 0,
        }
    }

    fn record(&mut self, started: Instant, ok: bool) {
        if ok {
            self.times.push(started.elapsed());
        } else {
            self.failed += 1;
        }
    }

    fn line(&mut self, what: &str) -> String {
        self.times.sort();
        let at = |q: f64| {
            self.times
                .get(
                    ((self.times.len() as f64 * q) as usize)
                        .min(self.times.len().saturating_sub(1)),
                )
                .map(|d| format!("{:.1}", d.as_secs_f64() * 1000.0))
                .unwrap_or_else(|| "-".into())
        };
        format!(
            "  {what:<28} p50 {:>7} ms  p99 {:>7} ms  max {:>7} ms  failed {}",
            at(0.5),
            at(0.99),
            at(1.0),
            self.failed
        )
    }
}

fn main() {
    let connections = arg("--connections", 2000);
    let probes = arg("--probes", 100);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let root = tempfile::tempdir().unwrap();
    let server = Server::start(root, "limits: { handshake_timeout: 2s }\n");
    let http = addr(&server.http);
    let grpc_addr: SocketAddr = server.grpc_addr.parse().unwrap();
    let bus = addr(&server.bus);
    println!(
        "flood: {connections} silent connections per port, {probes} probes per port and kind \
         (server {})",
        common::server_binary().display()
    );
    for (flooded, target) in [("REST", http), ("gRPC", grpc_addr), ("bus", bus)] {
        // Connections opened (and used once) before the flood.
        let mut rest_kept = TcpStream::connect(http).unwrap();
        rest_kept
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        assert!(rest_probe(&mut rest_kept));
        let grpc_kept = runtime.block_on(grpc_channel(&server.grpc)).unwrap();
        let mut bus_kept = bus_connect(bus, &server.key).unwrap();

        let flood = Flood::start(target, connections);
        std::thread::sleep(Duration::from_millis(500));
        let mut figures: Vec<(String, Figures)> = [
            "REST, new connection",
            "REST, kept connection",
            "gRPC, new connection",
            "gRPC, kept connection",
            "bus, new connection",
            "bus, kept connection",
        ]
        .iter()
        .map(|name| (name.to_string(), Figures::new()))
        .collect();
        for _ in 0..probes {
            let started = Instant::now();
            figures[0].1.record(started, rest_new(http));
            let started = Instant::now();
            figures[1].1.record(started, rest_probe(&mut rest_kept));
            let started = Instant::now();
            let ok = runtime.block_on(async {
                match grpc_channel(&server.grpc).await {
                    Some(channel) => grpc_probe(channel).await,
                    None => false,
                }
            });
            figures[2].1.record(started, ok);
            let started = Instant::now();
            figures[3]
                .1
                .record(started, runtime.block_on(grpc_probe(grpc_kept.clone())));
            let started = Instant::now();
            let ok = bus_connect(bus, &server.key)
                .map(|mut c| bus_probe(&mut c))
                .unwrap_or(false);
            figures[4].1.record(started, ok);
            let started = Instant::now();
            figures[5].1.record(started, bus_probe(&mut bus_kept));
            std::thread::sleep(Duration::from_millis(20));
        }
        let (opened, peak) = flood.stop();
        println!("{flooded} flooded: {opened} connections opened, at most {peak} open at once");
        for (name, figure) in &mut figures {
            println!("{}", figure.line(name));
        }
        std::thread::sleep(Duration::from_secs(3));
    }
}
