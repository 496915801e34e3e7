//! The brokers the bus benchmarks compare: ours, alone in a child process (this bench's own
//! binary run with `BROKER_ENV` set), and Debian's nats-server, on loopback ports.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// Set in the child process that runs our broker.
pub const BROKER_ENV: &str = "SVC_BUS_BENCH_BROKER";

/// Set (to a directory with server.pem and server.key) when both brokers serve TLS.
pub const TLS_ENV: &str = "SVC_BUS_BENCH_TLS";

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
        let config = svc::bus::BrokerConfig {
            tls: std::env::var_os(TLS_ENV).map(|dir| server_tls(dir.as_ref())),
            ..svc::bus::BrokerConfig::default()
        };
        let handle = svc::bus::Broker::start(config, Arc::new(svc::bus::NoAuth), listener)
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

/// rustls with ring serving dir/server.pem with dir/server.key, as the server's bus does.
fn server_tls(dir: &std::path::Path) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .expect("server.pem")
        .collect::<Result<Vec<_>, _>>()
        .expect("server.pem");
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).expect("server.key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .expect("certificate and key");
    Arc::new(config)
}

/// A server under test, killed on drop.
pub struct Server {
    pub name: &'static str,
    pub child: Child,
    pub port: u16,
    pub tls: bool,
}

impl Server {
    pub fn url(&self) -> String {
        let scheme = if self.tls { "tls" } else { "nats" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Our broker; with `tls`, a directory holding server.pem and server.key, it serves TLS.
pub fn start_ours_with(tls: Option<&std::path::Path>) -> Server {
    let mut command = Command::new(std::env::current_exe().expect("own path"));
    if let Some(dir) = tls {
        command.env(TLS_ENV, dir);
    }
    let mut child = command
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
        tls: tls.is_some(),
    }
}

/// Debian's nats-server; with `tls`, serving dir/server.pem with dir/server.key.
pub fn start_nats_server_with(tls: Option<&std::path::Path>) -> Option<Server> {
    let binary = ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
        .into_iter()
        .find(|path| std::path::Path::new(path).is_file())?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let mut command = Command::new(binary);
    command.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(dir) = tls {
        command
            .arg("--tls")
            .arg("--tlscert")
            .arg(dir.join("server.pem"));
        command.arg("--tlskey").arg(dir.join("server.key"));
    }
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let server = Server {
        name: "nats-server",
        port,
        child,
        tls: tls.is_some(),
    };
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(server);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}
