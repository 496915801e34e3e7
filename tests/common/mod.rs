//! TestServer: the real `svc` binary on ephemeral ports with a temp data dir, driven through
//! its real names (symlinks), raw HTTP and stock clients. Killed on drop.
#![allow(dead_code)]

pub mod agent;
pub mod cluster;
pub mod login;
pub mod moto;
pub mod nats_cluster;
pub mod pki;
pub mod postgres;
pub mod raw_grpc;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;

/// A directory of symlinks, one per name the binary answers to, pointing at the built binary.
pub struct Names {
    pub dir: tempfile::TempDir,
}

impl Names {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let binary = env!("CARGO_BIN_EXE_svc");
        std::os::unix::fs::symlink(binary, dir.path().join("svc")).unwrap();
        for name in svc::dispatch::names() {
            std::os::unix::fs::symlink(binary, dir.path().join(name)).unwrap();
        }
        Names { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A command for `name` with a clean environment (no SVC_* from the developer's shell).
    pub fn command(&self, name: &str) -> Command {
        let mut command = Command::new(self.path(name));
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdin(Stdio::null());
        command
    }
}

/// What a finished command did.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(output: Output) -> Self {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

pub fn run(command: &mut Command) -> Run {
    command.output().expect("command runs").into()
}

pub struct TestServer {
    pub names: Names,
    pub data_dir: PathBuf,
    pub config_file: PathBuf,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    /// `nats://host:port` of the embedded broker (or the external URLs).
    pub bus: String,
    /// The bus monitoring listener (`listen.bus_monitor`), when the server runs one.
    pub bus_monitor: Option<SocketAddr>,
    pub admin_key: String,
    /// Set when the server serves TLS (`tls` in listen-addrs.json): the client configuration
    /// trusting `Options::ca_file`, used by `request` and the readiness probe.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    ca_file: Option<PathBuf>,
    nofile: Option<u64>,
    _temp: tempfile::TempDir,
    child: Option<Child>,
    log_file: PathBuf,
}

#[derive(Default)]
pub struct Options {
    pub env: Vec<(String, String)>,
    pub config_yaml: String,
    /// The CA to trust when `config_yaml` turns TLS on.
    pub ca_file: Option<PathBuf>,
    /// The server's open-file limit (soft and hard), set in the child before it runs.
    pub nofile: Option<u64>,
    /// The test opens, breaks or reads `data_dir/svc.db` itself: the server keeps SQLite
    /// whatever `SVC_TEST_STORE` says.
    pub sqlite_only: bool,
    /// The master key (default: a random one); servers sharing a store need the same.
    pub master_key: Option<String>,
    /// Where the data dir goes (default: `data` in the server's temp dir), e.g. on a small
    /// filesystem the test mounted.
    pub data_dir: Option<PathBuf>,
    /// `listen` names only the contract's three listeners (http, grpc, bus), leaving
    /// `listen.bus_monitor` at its default; otherwise the monitor is on, on an ephemeral port.
    pub contract_listeners_only: bool,
}

/// The store driver test servers use: `SVC_TEST_STORE` (`sqlite`, the default, or
/// `postgres`: a fresh database on the test process's PostgreSQL for every server).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestStore {
    Sqlite,
    Postgres,
}

pub fn test_store() -> TestStore {
    match std::env::var("SVC_TEST_STORE").as_deref() {
        Err(std::env::VarError::NotPresent) | Ok("") | Ok("sqlite") => TestStore::Sqlite,
        Ok("postgres") => TestStore::Postgres,
        // A typo must not quietly run the suite on SQLite again.
        other => panic!("SVC_TEST_STORE={other:?}: expected sqlite or postgres"),
    }
}

/// The `store:` section that puts a server on `SVC_TEST_STORE`'s driver (empty for SQLite).
pub fn store_yaml() -> String {
    match test_store() {
        TestStore::Sqlite => String::new(),
        TestStore::Postgres => {
            let postgres = postgres::shared().expect(
                "SVC_TEST_STORE=postgres needs PostgreSQL (initdb, pg_ctl) or SVC_TEST_PG_URL",
            );
            format!(
                "store:\n  driver: postgres\n  url: \"{}\"\n",
                postgres.fresh_database()
            )
        }
    }
}

pub fn random_master_key() -> String {
    let bytes: [u8; 32] = rand::random();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

impl TestServer {
    pub fn start() -> Self {
        Self::start_with(Options::default())
    }

    /// A server on SQLite whatever `SVC_TEST_STORE` says, for a test that works on `svc.db`.
    pub fn start_sqlite() -> Self {
        Self::start_with(Options {
            sqlite_only: true,
            ..Options::default()
        })
    }

    pub fn start_with(options: Options) -> Self {
        let temp = tempfile::tempdir().unwrap();
        let data_dir = options
            .data_dir
            .clone()
            .unwrap_or_else(|| temp.path().join("data"));
        let config_file = temp.path().join("server.yaml");
        // A test that configures its own store, or works on svc.db, keeps what it chose.
        let own_store = options.sqlite_only
            || options
                .config_yaml
                .lines()
                .any(|line| line.starts_with("store:"));
        let store = if own_store {
            String::new()
        } else {
            store_yaml()
        };
        let monitor = if options.contract_listeners_only {
            ""
        } else {
            "  bus_monitor: 127.0.0.1:0\n"
        };
        let config = format!(
            "data_dir: {}\nlisten:\n  http: 127.0.0.1:0\n  grpc: 127.0.0.1:0\n  bus: 127.0.0.1:0\n{monitor}hmacsecret: test-hmac-secret\nmaster_key: {}\n{store}{}",
            data_dir.display(),
            options.master_key.clone().unwrap_or_else(random_master_key),
            options.config_yaml
        );
        std::fs::write(&config_file, config).unwrap();
        let mut server = TestServer {
            names: Names::new(),
            data_dir,
            config_file,
            http: "127.0.0.1:1".parse().unwrap(),
            grpc: "127.0.0.1:1".parse().unwrap(),
            bus: String::new(),
            bus_monitor: None,
            admin_key: String::new(),
            tls: None,
            ca_file: options.ca_file.clone(),
            nofile: options.nofile,
            log_file: temp.path().join("server.log"),
            _temp: temp,
            child: None,
        };
        server.spawn(&options.env);
        server.admin_key = std::fs::read_to_string(server.data_dir.join("bootstrap-admin.key"))
            .map(|k| k.trim().to_string())
            .unwrap_or_default();
        server
    }

    /// Starts (or restarts) the server process and waits until /health/ready answers 200.
    pub fn spawn(&mut self, env: &[(String, String)]) {
        let _ = std::fs::remove_file(self.data_dir.join("listen-addrs.json"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_file)
            .unwrap();
        let mut command = self.names.command("svc-server");
        command
            .arg("--config")
            .arg(&self.config_file)
            .env("SVC_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        for (key, value) in env {
            command.env(key, value);
        }
        if let Some(nofile) = self.nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: only setrlimit, which is async-signal-safe, runs in the child.
            unsafe {
                command.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: nofile,
                        rlim_max: nofile,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        self.child = Some(command.spawn().expect("svc-server starts"));
        let deadline = Instant::now() + Duration::from_secs(20);
        let addrs_file = self.data_dir.join("listen-addrs.json");
        loop {
            if let Ok(text) = std::fs::read_to_string(&addrs_file) {
                if let Ok(addrs) = serde_json::from_str::<serde_json::Value>(&text) {
                    self.http = addrs["http"].as_str().unwrap().parse().unwrap();
                    self.grpc = addrs["grpc"].as_str().unwrap().parse().unwrap();
                    self.bus = addrs["bus"].as_str().unwrap_or_default().to_string();
                    self.bus_monitor = addrs["bus_monitor"]
                        .as_str()
                        .and_then(|addr| addr.parse().ok());
                    self.tls = addrs["tls"].as_bool().unwrap_or(false).then(|| {
                        tls_client(
                            self.ca_file
                                .as_deref()
                                .expect("Options::ca_file for a TLS server"),
                        )
                    });
                    if http_request_over(
                        self.http,
                        self.tls.as_ref(),
                        "GET",
                        "/health/ready",
                        &[],
                        None,
                    )
                    .map(|r| r.status == 200)
                    .unwrap_or(false)
                    {
                        return;
                    }
                }
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("svc-server exited early ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "svc-server not ready in time:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_file).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Sends a signal and waits for the process to exit; returns its exit code.
    pub fn stop_with(&mut self, signal: i32) -> Option<i32> {
        let mut child = self.child.take()?;
        unsafe {
            libc::kill(child.id() as i32, signal);
        }
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn http_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.http)
    }

    /// The gRPC address as CLIs take it (`--server`): host:port, or https://host:port.
    pub fn grpc_address(&self) -> String {
        match self.tls {
            Some(_) => format!("https://{}", self.grpc),
            None => self.grpc.to_string(),
        }
    }

    /// A CLI command with the server's addresses in its environment (no API key).
    pub fn cli(&self, name: &str) -> Command {
        let mut command = self.names.command(name);
        command
            .env("SVC_HTTP_URL", self.http_url())
            .env("SVC_SERVER", self.grpc_address());
        command
    }

    /// A REST request with an optional bearer key.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> HttpResponse {
        let auth = key.map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        http_request_over(
            self.http,
            self.tls.as_ref(),
            method,
            path,
            &headers,
            body.map(str::as_bytes),
        )
        .expect("HTTP request")
    }

    /// Creates a key through REST as the admin; returns (id, key).
    pub fn create_key(&self, name: &str, role: &str) -> (String, String) {
        let body = format!(r#"{{"name":"{name}","role":"{role}"}}"#);
        let response = self.request(
            "POST",
            "/api/v1/apikeys",
            Some(&self.admin_key),
            Some(&body),
        );
        assert_eq!(response.status, 201, "{}", response.body);
        let json = response.json();
        (
            json["id"].as_str().unwrap().into(),
            json["key"].as_str().unwrap().into(),
        )
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A client configuration (ring) trusting the PEM CA certificates in `ca_file`.
pub fn tls_client(ca_file: &Path) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for certificate in rustls::pki_types::CertificateDer::pem_file_iter(ca_file).unwrap() {
        roots.add(certificate.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// A minimal HTTP/1.1 client (Connection: close) so tests see exactly what goes on the wire.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> std::io::Result<HttpResponse> {
    http_request_over(addr, None, method, path, headers, body)
}

/// `http_request`, over TLS (to the IP address in `addr`) when `tls` is given.
pub fn http_request_over(
    addr: SocketAddr,
    tls: Option<&Arc<rustls::ClientConfig>>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> std::io::Result<HttpResponse> {
    let socket = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    socket.set_read_timeout(Some(Duration::from_secs(30)))?;
    match tls {
        None => exchange(socket, addr, method, path, headers, body),
        Some(config) => {
            let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
            let connection = rustls::ClientConnection::new(config.clone(), name)
                .map_err(std::io::Error::other)?;
            let stream = rustls::StreamOwned::new(connection, socket);
            exchange(stream, addr, method, path, headers, body)
        }
    }
}

fn exchange(
    mut stream: impl Read + Write,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> std::io::Result<HttpResponse> {
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        request.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    if let Some(body) = body {
        // A server may answer (413) and close before reading a large body; that is fine.
        let _ = stream.write_all(body);
    }
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    parse_response(&raw).ok_or_else(|| {
        std::io::Error::other(format!(
            "unparsable response: {:?}",
            String::from_utf8_lossy(&raw)
        ))
    })
}

fn parse_response(raw: &[u8]) -> Option<HttpResponse> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status: u16 = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some(HttpResponse {
        status,
        headers,
        body,
    })
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// The bus address without the scheme (`nats://` or `tls://`), for raw TCP.
pub fn bus_socket(url: &str) -> SocketAddr {
    url.trim_start_matches("nats://")
        .trim_start_matches("tls://")
        .parse()
        .unwrap()
}

/// Starts Debian's nats-server on an ephemeral port, or returns None (printing why) when it
/// is not installed and this is not CI; under CI its absence is a failure.
pub fn start_nats_server() -> Option<NatsServer> {
    let binary = ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let Some(binary) = binary else {
        assert!(
            std::env::var_os("CI").is_none(),
            "nats-server is required under CI (apt-get install nats-server)"
        );
        eprintln!("skipped: nats-server not installed (apt-get install nats-server)");
        return None;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(binary)
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "nats-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(NatsServer {
        child,
        url: format!("nats://{addr}"),
    })
}

pub struct NatsServer {
    child: Child,
    pub url: String,
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A raw protocol session: sends `ops` after CONNECT with `connect_json`, then PING, and
/// returns every line up to the PONG (or the close).
pub fn bus_session(server: &TestServer, connect_json: &str, ops: &str) -> Vec<String> {
    let stream = std::net::TcpStream::connect(bus_socket(&server.bus)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
    let mut info = String::new();
    std::io::BufRead::read_line(&mut reader, &mut info).unwrap();
    assert!(info.starts_with("INFO {"), "{info}");
    let mut writer = stream;
    write!(writer, "CONNECT {connect_json}\r\n{ops}PING\r\n").unwrap();
    lines_until_pong(&mut reader)
}

/// Reads NATS protocol lines up to and including the PONG (or until the socket closes).
pub fn lines_until_pong(reader: &mut impl std::io::BufRead) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let line = line.trim_end().to_string();
                let done = line == "PONG";
                lines.push(line);
                if done {
                    break;
                }
            }
        }
    }
    lines
}

/// Every audit row with this action since `since` (PolicyService.AuditLog, paged).
pub async fn audit_rows_grpc(
    channel: &tonic::transport::Channel,
    key: &str,
    action: &str,
    since: &str,
) -> Vec<svc::proto::AuditEntry> {
    let mut client = svc::proto::policy_service_client::PolicyServiceClient::new(channel.clone());
    let mut rows = Vec::new();
    let mut cursor = String::new();
    loop {
        let request = svc::proto::AuditLogRequest {
            action: action.into(),
            since: since.into(),
            page: Some(svc::proto::PageRequest {
                limit: 1000,
                cursor: cursor.clone(),
            }),
            ..Default::default()
        };
        let page = client
            .audit_log(with_key(request, key))
            .await
            .unwrap()
            .into_inner();
        rows.extend(page.items);
        if page.next_cursor.is_empty() {
            break;
        }
        cursor = page.next_cursor;
    }
    rows
}

/// Every stored event matching `filter`, in sequence order (EventService.List, paged).
pub async fn events_grpc(
    channel: &tonic::transport::Channel,
    key: &str,
    filter: Option<svc::proto::EventFilter>,
) -> Vec<svc::proto::Event> {
    let mut client = svc::proto::event_service_client::EventServiceClient::new(channel.clone());
    let mut events = Vec::new();
    let mut cursor = String::new();
    loop {
        let request = svc::proto::ListEventsRequest {
            filter: filter.clone(),
            page: Some(svc::proto::PageRequest {
                limit: 1000,
                cursor: cursor.clone(),
            }),
        };
        let page = client
            .list(with_key(request, key))
            .await
            .unwrap()
            .into_inner();
        events.extend(page.items);
        if page.next_cursor.is_empty() {
            break;
        }
        cursor = page.next_cursor;
    }
    events
}

/// A gRPC request carrying `authorization: Bearer KEY`.
pub fn with_key<T>(message: T, key: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    request
}

pub fn assert_private(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{} has mode {mode:o}", path.display());
}

/// A raw bus connection logged in as the agent whose files are in `state`: INFO read, its
/// nonce signed, CONNECT sent (headers on, as svc-agent does). Returns the reader and the
/// writer; reads time out after 5 s (`set_read_timeout` on the writer changes that).
pub fn agent_connection(
    server: &TestServer,
    state: &Path,
) -> (std::io::BufReader<TcpStream>, TcpStream) {
    use std::io::BufRead;
    let (cert_pem, signer) = svc::agent::bus_credentials(state).unwrap();
    let stream = TcpStream::connect(bus_socket(&server.bus)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
    let mut info = String::new();
    reader.read_line(&mut info).unwrap();
    let info: serde_json::Value = serde_json::from_str(info.trim_start_matches("INFO ")).unwrap();
    let signature = signer
        .sign(
            &ring::rand::SystemRandom::new(),
            info["nonce"].as_str().unwrap().as_bytes(),
        )
        .unwrap();
    let connect = serde_json::json!({
        "verbose": false, "pedantic": false, "headers": true, "jwt": cert_pem,
        "sig": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signature.as_ref()),
    });
    let mut writer = stream;
    write!(writer, "CONNECT {connect}\r\n").unwrap();
    (reader, writer)
}

/// A raw bus session authenticated as the agent whose files are in `state`: sends `ops` and
/// PING after CONNECT, returns the lines up to PONG or the close.
pub fn agent_session(server: &TestServer, state: &Path, ops: &str) -> Vec<String> {
    let (mut reader, mut writer) = agent_connection(server, state);
    write!(writer, "{ops}PING\r\n").unwrap();
    lines_until_pong(&mut reader)
}

/// `svc-audit log -o json ARGS` as the admin: the rows, newest first.
pub fn audit_rows(server: &TestServer, args: &[&str]) -> Vec<serde_json::Value> {
    let result = run(server
        .cli("svc-audit")
        .args(["--api-key", &server.admin_key, "-o", "json", "log"])
        .args(args));
    assert_eq!(result.code, 0, "{result:?}");
    let page: serde_json::Value = serde_json::from_str(&result.stdout).unwrap();
    page["items"].as_array().unwrap().clone()
}

/// A command's stdout parsed as JSON (panics with the run when it is not).
pub fn json_of(result: &Run) -> serde_json::Value {
    serde_json::from_str(&result.stdout).unwrap_or_else(|e| panic!("{e}: {result:?}"))
}

/// `svc-identity --api-key KEY -o json ARGS...` against `server`.
pub fn identity_json(server: &TestServer, key: &str, args: &[&str]) -> Run {
    run(server
        .cli("svc-identity")
        .args(["--api-key", key, "-o", "json"])
        .args(args))
}

/// What a copy of the server's store holds, as bytes to search: a snapshot taken through
/// `svc-cluster-backup backup` (the whole store as a SQLite file, whatever the driver, and
/// the stream logs), unpacked, and on SQLite the data dir's database files themselves.
pub fn store_dump(server: &TestServer) -> Vec<u8> {
    let file = server.names.path("dump.tar.gz");
    let taken = run(server.cli("svc-cluster-backup").args([
        "--api-key",
        &server.admin_key,
        "backup",
        "--output",
        file.to_str().unwrap(),
    ]));
    assert_eq!(taken.code, 0, "{taken:?}");
    let mut dump = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&file).unwrap())
        .read_to_end(&mut dump)
        .unwrap();
    std::fs::remove_file(&file).unwrap();
    for name in ["svc.db", "svc.db-wal"] {
        dump.extend(std::fs::read(server.data_dir.join(name)).unwrap_or_default());
    }
    dump
}

/// Whether `needle` occurs anywhere in `haystack`.
pub fn contains_bytes(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// Asserts that a store dump shows none of API key `key`'s file-request signing key (its
/// SHA-256, raw or hex: the HMAC key of `Svc-Auth` signatures).
pub fn assert_no_signing_key(dump: &[u8], key: &str) {
    use sha2::{Digest, Sha256};
    let signing = Sha256::digest(key.as_bytes());
    assert!(!contains_bytes(dump, &signing), "raw signing key of {key}");
    assert!(
        !contains_bytes(dump, hex::encode(signing).as_bytes()),
        "hex signing key of {key} in the store"
    );
}
