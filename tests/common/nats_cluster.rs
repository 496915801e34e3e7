//! NatsCluster: real nats-server processes (Debian's 2.9.10) with JetStream on loopback, one
//! node or a cluster of several with routes between all, each on ephemeral ports with its own
//! temp store dir. Nodes can be killed with SIGKILL and restarted on the same ports and store.
//! Everything is killed on drop.
//!
//! ```ignore
//! let Some(mut nats) = NatsCluster::start(3).await else { return }; // skipped: printed why
//! let client = async_nats::connect(nats.urls()).await?; // any node, reconnects to the others
//! nats.kill(1);
//! nats.restart(1).await;
//! ```

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CANDIDATES: [&str; 2] = ["/usr/sbin/nats-server", "/usr/bin/nats-server"];
/// How long a node (or the cluster) may take to serve JetStream.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// nats-server's path: on PATH, or where Debian puts it.
pub fn find_nats_server() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("nats-server"))
            .find(|candidate| candidate.is_file())
    });
    on_path.or_else(|| CANDIDATES.iter().map(PathBuf::from).find(|p| p.is_file()))
}

/// nats-server's path, or None after printing why the calling test is skipped (a failure
/// when `CI` is set).
pub fn nats_server_or_skip(test: &str) -> Option<PathBuf> {
    let binary = find_nats_server();
    if binary.is_none() {
        if std::env::var_os("CI").is_some() {
            panic!("nats-server not found (needed in CI for {test})");
        }
        println!(
            "skip: nats-server not found on PATH or in /usr/sbin (apt-get install nats-server); \
             {test} skipped"
        );
    }
    binary
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Node {
    name: String,
    port: u16,
    /// The monitoring port, in JWT mode only: there readiness is `/healthz` (no anonymous
    /// client may ask JetStream).
    http_port: Option<u16>,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// A running set of nats-server nodes with JetStream.
pub struct NatsCluster {
    binary: PathBuf,
    nodes: Vec<Node>,
    dir: tempfile::TempDir,
    /// How long a node that starts (or starts again) may take to serve JetStream: 30 s;
    /// a bench that restarts a node under tens of thousands of reconnecting clients sets more.
    pub ready_within: Duration,
}

impl NatsCluster {
    /// Starts `nodes` nats-servers (1: a lone server with `-js`-like config; more: a cluster
    /// named `svc-test` with every node routing to every other), and waits until JetStream
    /// answers on every node (in a cluster: a meta leader is elected). None when nats-server
    /// is not installed (the skip is printed).
    pub async fn start(nodes: usize) -> Option<NatsCluster> {
        Self::start_configured(nodes, "", None, false).await
    }

    /// As [`NatsCluster::start`], with `no_advertise` in every node's cluster block: clients
    /// learn no other node's address from INFO, so a client reaches exactly the URLs it was
    /// given (a test that puts a proxy in front of the nodes needs that).
    pub async fn start_unadvertised(nodes: usize) -> Option<NatsCluster> {
        Self::start_configured(nodes, "", None, true).await
    }

    /// As [`NatsCluster::start`], with `extra` (nats-server configuration lines, e.g.
    /// `max_payload: 8192`) in every node's configuration.
    pub async fn start_with(nodes: usize, extra: &str) -> Option<NatsCluster> {
        Self::start_configured(nodes, extra, None, false).await
    }

    /// [`start`](Self::start), every node's configuration ending with `auth` (the block
    /// `svc-cluster nats-config` prints: operator mode, where every client needs a user JWT).
    pub async fn start_with_auth(nodes: usize, auth: &str) -> Option<NatsCluster> {
        Self::start_configured(nodes, "", Some(auth), false).await
    }

    /// [`start_with_auth`](Self::start_with_auth) with `extra` configuration lines too (e.g.
    /// `max_connections: 19000`).
    pub async fn start_with_auth_and(nodes: usize, extra: &str, auth: &str) -> Option<NatsCluster> {
        Self::start_configured(nodes, extra, Some(auth), false).await
    }

    async fn start_configured(
        nodes: usize,
        extra: &str,
        auth: Option<&str>,
        no_advertise: bool,
    ) -> Option<NatsCluster> {
        assert!(nodes >= 1);
        let binary = nats_server_or_skip("this NATS cluster test")?;
        let dir = tempfile::tempdir().unwrap();
        // Each node's file store cap: small for tests, `SVC_TEST_NATS_MAX_FILE_STORE` (e.g.
        // 4GB) for a benchmark that stores more.
        let max_file_store =
            std::env::var("SVC_TEST_NATS_MAX_FILE_STORE").unwrap_or_else(|_| "1GB".into());
        let ports: Vec<(u16, u16)> = (0..nodes).map(|_| (free_port(), free_port())).collect();
        let mut list = Vec::new();
        for (i, (port, cluster_port)) in ports.iter().enumerate() {
            let name = format!("n{i}");
            let store = dir.path().join(&name).join("jetstream");
            std::fs::create_dir_all(&store).unwrap();
            let log = dir.path().join(&name).join("nats.log");
            let mut config = format!(
                "server_name: {name}\nlisten: \"127.0.0.1:{port}\"\nlog_file: \"{}\"\n\
                 jetstream {{\n  store_dir: \"{}\"\n  max_memory_store: 64MB\n  max_file_store: {max_file_store}\n}}\n",
                log.display(),
                store.display()
            );
            config.push_str(extra);
            if nodes > 1 {
                let routes: Vec<String> = ports
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, (_, cluster))| format!("\"nats-route://127.0.0.1:{cluster}\""))
                    .collect();
                config.push_str(&format!(
                    "cluster {{\n  name: svc-test\n  listen: \"127.0.0.1:{cluster_port}\"\n  routes: [{}]\n{}}}\n",
                    routes.join(", "),
                    if no_advertise { "  no_advertise: true\n" } else { "" }
                ));
            }
            let http_port = auth.map(|auth| {
                let http_port = free_port();
                config.push_str(&format!("http: \"127.0.0.1:{http_port}\"\n{auth}\n"));
                http_port
            });
            let path = dir.path().join(&name).join("nats.conf");
            std::fs::write(&path, config).unwrap();
            list.push(Node {
                name,
                port: *port,
                http_port,
                config: path,
                log,
                child: None,
            });
        }
        let mut cluster = NatsCluster {
            binary,
            nodes: list,
            dir,
            ready_within: READY_WITHIN,
        };
        for i in 0..nodes {
            cluster.spawn(i);
        }
        for i in 0..nodes {
            cluster.wait_ready(i).await;
        }
        Some(cluster)
    }

    fn spawn(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        assert!(node.child.is_none(), "node {i} is already running");
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&node.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts");
        node.child = Some(child);
    }

    /// Waits until node `i` accepts connections and answers `$JS.API.INFO` without an error.
    pub async fn wait_ready(&self, i: usize) {
        let deadline = Instant::now() + self.ready_within;
        let url = self.url(i);
        let mut last = String::from("not tried");
        let http_port = self.nodes[i].http_port;
        while Instant::now() < deadline {
            let probe = match http_port {
                Some(port) => healthz(port),
                None => js_info(&url).await,
            };
            match probe {
                Ok(()) => return,
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "nats node {i} ({url}) did not serve JetStream within {:?}: {last}\n{}",
            self.ready_within,
            self.log(i)
        );
    }

    /// How many nodes the cluster has (running or not).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// `nats://127.0.0.1:PORT` of node `i`.
    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[i].port)
    }

    /// Every node's client URL, in node order.
    pub fn urls(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|i| self.url(i)).collect()
    }

    /// The `server_name` of node `i` (`n0`, `n1`, ...), as stream info names leaders.
    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// The node index of a `server_name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Node `i`'s log so far (for failure messages).
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.nodes[i].log).unwrap_or_default()
    }

    /// The directory holding every node's config, store and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills node `i` with SIGKILL and reaps it (no-op when it is not running).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `i` again on the same ports and store, and waits until it serves JetStream.
    pub async fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        self.wait_ready(i).await;
    }

    /// Node `i`'s process id, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().map(Child::id)
    }

    /// Node `i`'s client connections (`/varz` `connections`), in JWT mode (the only one with
    /// a monitoring port); None when it does not answer.
    pub fn connections(&self, i: usize) -> Option<u64> {
        let body = monitor_get(self.nodes[i].http_port?, "/varz").ok()?;
        let json = &body[body.find('{')?..];
        serde_json::from_str::<serde_json::Value>(json).ok()?["connections"].as_u64()
    }

    /// Whether node `i` is running (started and not killed).
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].child.is_some()
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// nats-server's `/healthz` on the monitoring port: 200 once JetStream is current. (A bare
/// HTTP/1.0 GET: benches include this file without the tests' HTTP client.)
fn healthz(port: u16) -> Result<(), String> {
    let response = monitor_get(port, "/healthz")?;
    match response.lines().next() {
        Some(status) if status.contains(" 200") => Ok(()),
        _ => Err(format!("/healthz: {response}")),
    }
}

/// The whole HTTP response to a bare HTTP/1.0 GET of `path` on the monitoring port.
fn monitor_get(port: u16, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut socket =
        std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    socket
        .write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    socket
        .read_to_string(&mut response)
        .map_err(|e| e.to_string())?;
    Ok(response)
}

/// One `$JS.API.INFO` round trip through `url`.
async fn js_info(url: &str) -> Result<(), String> {
    let client = tokio::time::timeout(Duration::from_secs(2), async_nats::connect(url))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let reply = tokio::time::timeout(
        Duration::from_secs(2),
        client.request("$JS.API.INFO", bytes::Bytes::new()),
    )
    .await
    .map_err(|_| "$JS.API.INFO timed out".to_string())?
    .map_err(|e| e.to_string())?;
    let info: serde_json::Value =
        serde_json::from_slice(&reply.payload).map_err(|e| e.to_string())?;
    match info.get("error") {
        Some(error) => Err(error.to_string()),
        None => Ok(()),
    }
}
