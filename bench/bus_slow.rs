//! Hostile-client memory benchmark (issue 23): 500 connections that `SUB > 1` and never
//! read, while one client publishes 50,000 × 64 B and one normal subscriber takes them.
//!
//! `cargo bench --bench bus_slow` (add `--profile dev` to skip the fat-LTO release build:
//! the figures are then a debug build's). Our broker runs in a separate OS process (this
//! binary re-run with `SVC_BUS_SLOW_BROKER=1`, a 2-worker tokio runtime, default
//! `BrokerConfig`, so `max_pending_total` is 64 MiB), beside Debian's nats-server when
//! installed. For each it prints: RSS idle, RSS with the 500 connections (the pre-burst
//! figure), RSS peak during the burst (sampled every 10 ms), RSS 60 s after, how many of
//! the 500 were closed, and the normal subscriber's rate during the burst as a ratio of a
//! quiet run (same publish, no hostile connections). Loopback only; about 2.5 minutes.
//!
//! Smaller runs: `-- --connections N --messages N --after SECONDS` (defaults 500, 50,000,
//! 60); CI runs `--connections 20 --messages 2000 --after 1` on the debug build.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

const PAYLOAD: usize = 64;
/// How long after the burst the connections are still watched for being cut (write deadlines).
const CUT_WITHIN: Duration = Duration::from_secs(12);

mod brokers;
use brokers::{start_nats_server_with, start_ours_with, Server};
#[path = "common/run.rs"]
mod run;

/// The run's sizes: hostile connections, messages in the burst, seconds watched after it.
#[derive(Clone, Copy)]
struct Sizes {
    slow: usize,
    messages: usize,
    after: Duration,
}

fn main() {
    let sizes = Sizes {
        slow: run::flag("--connections", 500usize),
        messages: run::flag("--messages", 50_000usize).max(1),
        after: Duration::from_secs(run::flag("--after", 60u64)),
    };
    let Sizes {
        slow,
        messages,
        after,
    } = sizes;
    brokers::main(async move {
        let mut rows = Vec::new();
        let ours = start_ours_with(None);
        rows.push(run(&ours, sizes).await);
        drop(ours);
        match start_nats_server_with(None) {
            Some(nats) => rows.push(run(&nats, sizes).await),
            None => run::missing_peer("nats-server", "apt-get install nats-server", "its column"),
        }
        println!("\n{slow} non-reading `SUB >` connections, {messages} × {PAYLOAD} B published");
        println!(
            "{:<12} {:>9} {:>11} {:>9} {:>12} {:>8} {:>12} {:>12} {:>7}",
            "server",
            "idle MiB",
            format!("+{slow} MiB"),
            "peak MiB",
            format!("after {} s", after.as_secs()),
            "closed",
            "quiet msg/s",
            "burst msg/s",
            "ratio"
        );
        for row in rows {
            println!("{row}");
        }
    });
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// One hostile connection: `SUB > 1`, a PONG to know it is in, a 4 KiB receive buffer, and
/// no read after that.
fn hostile(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let size: libc::c_int = 4096;
    unsafe {
        use std::os::fd::AsRawFd;
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &size as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut line = String::new();
    reader.read_line(&mut line).expect("INFO");
    let mut writer = stream.try_clone().expect("clone");
    writer
        .write_all(b"CONNECT {\"verbose\":false}\r\nSUB > 1\r\nPING\r\n")
        .expect("write");
    loop {
        line.clear();
        reader.read_line(&mut line).expect("PONG");
        if line.starts_with("PONG") {
            return stream;
        }
    }
}

/// Publishes the burst and returns the normal subscriber's rate (messages/s) and count.
async fn burst(url: &str, messages: usize) -> (f64, usize) {
    let subscriber = async_nats::ConnectOptions::new()
        .subscription_capacity(1 << 20)
        .connect(url)
        .await
        .expect("subscriber");
    let mut subscription = subscriber.subscribe("burst.x").await.expect("subscribe");
    subscriber.flush().await.expect("flush");
    let publisher = async_nats::connect(url).await.expect("publisher");
    let payload = bytes::Bytes::from(vec![b'x'; PAYLOAD]);
    let started = Instant::now();
    let publish = tokio::spawn(async move {
        for _ in 0..messages {
            publisher
                .publish("burst.x", payload.clone())
                .await
                .expect("publish");
        }
        publisher.flush().await.expect("flush");
        publisher
    });
    let mut received = 0;
    while received < messages {
        match tokio::time::timeout(Duration::from_secs(10), subscription.next()).await {
            Ok(Some(_)) => received += 1,
            _ => break,
        }
    }
    let elapsed = started.elapsed();
    drop(publish.await);
    (received as f64 / elapsed.as_secs_f64(), received)
}

async fn run(server: &Server, sizes: Sizes) -> String {
    let Sizes {
        slow,
        messages,
        after,
    } = sizes;
    let url = server.url();
    let pid = server.child.id();
    let (quiet, quiet_received) = burst(&url, messages).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = rss_mib(pid);
    let port = server.port;
    let hostile =
        tokio::task::spawn_blocking(move || (0..slow).map(|_| hostile(port)).collect::<Vec<_>>())
            .await
            .expect("hostile connections");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_mib(pid);
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        std::thread::spawn(move || {
            let mut peak: f64 = 0.0;
            while sampling.load(Ordering::Relaxed) {
                peak = peak.max(rss_mib(pid));
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        })
    };
    let (rate, received) = burst(&url, messages).await;
    // Keep sampling while the connections are cut (write deadlines included).
    let sampled = CUT_WITHIN.min(after);
    tokio::time::sleep(sampled).await;
    sampling.store(false, Ordering::Relaxed);
    let peak = sampler.join().expect("sampler");
    tokio::time::sleep(after - sampled).await;
    let after = rss_mib(pid);
    let closed = tokio::task::spawn_blocking(move || hostile.into_iter().filter(is_closed).count())
        .await
        .expect("closed count");
    if received < messages || quiet_received < messages {
        println!(
            "{}: the normal subscriber got {received} of {messages} (quiet run: {quiet_received})",
            server.name
        );
    }
    format!(
        "{:<12} {:>9.1} {:>11.1} {:>9.1} {:>12.1} {:>8} {:>12.0} {:>12.0} {:>7.2}",
        server.name,
        idle,
        before,
        peak,
        after,
        closed,
        quiet,
        rate,
        rate / quiet
    )
}

/// Reads what the kernel holds for the connection; true when that ends with EOF or an
/// error (the server closed it).
fn is_closed(stream: &TcpStream) -> bool {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut reader = stream;
    let mut buffer = vec![0; 64 * 1024];
    loop {
        match reader.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}
