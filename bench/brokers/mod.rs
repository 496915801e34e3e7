//! The brokers the bus benchmarks compare: ours, alone in a child process (this bench's own
//! binary run with `BROKER_ENV` set), and Debian's nats-server, on loopback ports.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// Set in the child process that runs our broker.
pub const BROKER_ENV: &str = "SVC_BUS_BENCH_BROKER";

/// A bus bench's `main`: in the child process (`BROKER_ENV` set) serve our broker; otherwise
/// run `bench` on a two-thread runtime (the machine's two cores, shared with the brokers).
pub fn main(bench: impl std::future::Future<Output = ()>) {
    if std::env::var_os(BROKER_ENV).is_some() {
        run_broker_process();
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("client runtime")
        .block_on(bench);
}

/// The child: serve on an ephemeral port, print it, exit when stdin closes.
fn run_broker_process() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("broker runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let handle = svc::bus::Broker::start(
            svc::bus::BrokerConfig::default(),
            Arc::new(svc::bus::NoAuth),
            listener,
        )
        .await
        .expect("broker starts");
        println!("{}", handle.local_addr().port());
        std::io::stdout().flush().expect("stdout");
        tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            while std::io::stdin()
                .read_line(&mut line)
                .map(|read| read > 0)
                .unwrap_or(false)
            {}
        })
        .await
        .expect("stdin watcher");
        drop(handle);
    });
}

/// A server under test, killed on drop.
pub struct Server {
    pub name: &'static str,
    pub child: Child,
    pub port: u16,
}

impl Server {
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start_ours() -> Server {
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .env(BROKER_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn broker process");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout piped"))
        .read_line(&mut line)
        .expect("port line");
    Server {
        name: "ours",
        port: line.trim().parse().expect("port line"),
        child,
    }
}

pub fn start_nats_server() -> Option<Server> {
    let binary = ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
        .into_iter()
        .find(|path| std::path::Path::new(path).is_file())?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let child = Command::new(binary)
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let server = Server {
        name: "nats-server",
        port,
        child,
    };
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(server);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}
