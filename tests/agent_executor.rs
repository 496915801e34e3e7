//! The split agent end to end: a real server, an agent daemon with `executor: <socket>` and
//! the `svc-agent executor` process behind that socket. Exec and a state apply go through the
//! socket; commands written straight to the socket unsigned, forged, for another agent or
//! replayed are refused; and (as root) a peer of another uid is cut off by SO_PEERCRED.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::{run, Run, TestServer};

fn svcctl(server: &TestServer, key: &str, args: &[&str]) -> Run {
    run(server.cli("svcctl").args(["--api-key", key]).args(args))
}

fn json_lines(result: &Run) -> Vec<serde_json::Value> {
    result
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {result:?}")))
        .collect()
}

/// The result line of agent `id`.
fn result_of(result: &Run, id: &str) -> serde_json::Value {
    json_lines(result)
        .into_iter()
        .find(|line| line["agent_id"] == id)
        .unwrap_or_else(|| panic!("no result for {id}: {result:?}"))
}

fn wait_connected(server: &TestServer, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = svcctl(server, &server.admin_key, &["-o", "json", "agent", "list"]);
        if serde_json::from_str::<serde_json::Value>(&listed.stdout)
            .ok()
            .and_then(|agents| {
                agents
                    .as_array()?
                    .iter()
                    .find(|a| a["id"] == id)
                    .map(|a| a["state"] == "connected")
            })
            .unwrap_or(false)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{id} never connected: {listed:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The executor process, killed on drop.
struct ExecutorProcess {
    child: Child,
    log: PathBuf,
}

impl ExecutorProcess {
    fn start(server: &TestServer, agent: &Agent, socket: &Path, extra: &[&str]) -> Self {
        let log = agent.home.path().join("executor.log");
        let child = server
            .names
            .command("svc-agent")
            .arg("--config")
            .arg(agent.config())
            .arg("executor")
            .arg("--socket")
            .arg(socket)
            .arg("--state-dir")
            .arg(agent.home.path())
            .args(extra)
            .env("SVC_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "the executor never listened: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        ExecutorProcess { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ExecutorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request line to the executor, its answer line back.
fn ask(socket: &Path, command: &str, signature: &str) -> serde_json::Value {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let request = serde_json::json!({"command": command, "signature": signature});
    writeln!(stream, "{request}").unwrap();
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).unwrap();
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Subscribes to the agent's command subject with its own credentials (as a daemon taken over
/// would) and returns the first command's bytes and signature header.
fn capture_command(
    server: &TestServer,
    state: &Path,
    id: &str,
) -> std::sync::mpsc::Receiver<(String, String)> {
    let (mut reader, mut writer) = common::agent_connection(server, state);
    writer
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(writer, "SUB svc.agent.{id}.cmd 1\r\nPING\r\n").unwrap();
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        assert!(!line.starts_with("-ERR"), "{line}");
        if line.trim() == "PONG" {
            break;
        }
    }
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if line.starts_with("PING") {
            let _ = writer.write_all(b"PONG\r\n");
            continue;
        }
        let Some(rest) = line.trim_end().strip_prefix("HMSG ") else {
            continue;
        };
        let parts: Vec<&str> = rest.split(' ').collect();
        let header_len: usize = parts[parts.len() - 2].parse().unwrap();
        let total: usize = parts[parts.len() - 1].parse().unwrap();
        let mut body = vec![0u8; total + 2];
        reader.read_exact(&mut body).unwrap();
        let headers = String::from_utf8_lossy(&body[..header_len]).to_string();
        let payload = String::from_utf8_lossy(&body[header_len..total]).to_string();
        let signature = headers
            .lines()
            .find_map(|h| h.strip_prefix("Svc-Signature:"))
            .unwrap_or_default()
            .trim()
            .to_string();
        let _ = sender.send((payload, signature));
        return;
    });
    receiver
}

#[test]
fn exec_and_state_through_the_executor_and_forgeries_refused() {
    let server = TestServer::start();
    let mut agent = Agent::new("split-01");
    let socket = agent.home.path().join("executor.sock");
    let mut config = std::fs::read_to_string(agent.config()).unwrap();
    config.push_str(&format!("  executor: {}\n", socket.display()));
    std::fs::write(agent.config(), config).unwrap();
    let enrolled = agent.bootstrap(&server, &["--server", &server.bus]);
    assert_eq!(enrolled.code, 0, "{enrolled:?}");
    let executor = ExecutorProcess::start(&server, &agent, &socket, &[]);
    agent.spawn(&server.names);
    wait_connected(&server, "split-01");
    let (_, operator) = server.create_key("ops", "operator");

    // Exec through the socket: the executor's process runs it.
    let state = agent.home.path().join("state");
    let captured = capture_command(&server, &state, "split-01");
    let exec = svcctl(
        &server,
        &operator,
        &[
            "-o",
            "json",
            "exec",
            "-t",
            "split-01",
            "--",
            "sh",
            "-c",
            "echo via-$SVC_AGENT_ID",
        ],
    );
    assert_eq!(
        exec.code,
        0,
        "{exec:?}\n{}\n{}",
        agent.log(),
        executor.log()
    );
    let result = result_of(&exec, "split-01");
    assert_eq!(result["stdout"], "via-split-01\n", "{result}");
    assert!(executor.log().contains("exec"), "{}", executor.log());

    // State apply through the socket.
    let work = tempfile::tempdir().unwrap();
    let target = work.path().join("motd");
    let state_file = work.path().join("site.yaml");
    std::fs::write(
        &state_file,
        format!(
            "- file: {{path: {}, content: \"split\\n\"}}\n",
            target.display()
        ),
    )
    .unwrap();
    let applied = svcctl(
        &server,
        &operator,
        &[
            "-o",
            "json",
            "state",
            "apply",
            state_file.to_str().unwrap(),
            "-t",
            "split-01",
        ],
    );
    assert_eq!(applied.code, 0, "{applied:?}\n{}", executor.log());
    assert_eq!(
        result_of(&applied, "split-01")["status"],
        "changed",
        "{applied:?}"
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "split\n");

    // A plan too large for its command: the daemon fetches it, the executor checks and runs it.
    let large = work.path().join("large");
    let text = "0123456789abcdef\n".repeat(40_000);
    let large_state = work.path().join("large.yaml");
    std::fs::write(
        &large_state,
        format!(
            "- file: {{path: {}, content: {}}}\n",
            large.display(),
            serde_json::to_string(&text).unwrap()
        ),
    )
    .unwrap();
    let applied = svcctl(
        &server,
        &operator,
        &[
            "-o",
            "json",
            "state",
            "apply",
            large_state.to_str().unwrap(),
            "-t",
            "split-01",
        ],
    );
    assert_eq!(
        result_of(&applied, "split-01")["status"],
        "changed",
        "{applied:?}\n{}\n{}",
        agent.log(),
        executor.log()
    );
    assert_eq!(std::fs::read_to_string(&large).unwrap(), text);

    // A replay of the real signed command, straight to the socket: already run.
    let (bytes, signature) = captured
        .recv_timeout(Duration::from_secs(30))
        .expect("the signed command was seen on the bus");
    assert!(!signature.is_empty(), "no signature header: {bytes}");
    let replayed = ask(&socket, &bytes, &signature);
    let error = replayed["reply"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("already run"), "{replayed}");

    // Unsigned, with a forged signature, and a signed one altered: refused, nothing runs.
    let marker = work.path().join("forged");
    let forged = serde_json::json!({
        "job_id": "01FORGED", "timeout_ms": 5000, "agent_id": "split-01",
        "issued_at_ms": now_ms(), "kind": "exec",
        "argv": ["touch", marker.to_str().unwrap()],
    })
    .to_string();
    for signature in ["", "AAAA", signature.as_str()] {
        let answer = ask(&socket, &forged, signature);
        let error = answer["reply"]["error"].as_str().unwrap_or_default();
        assert!(error.contains("command refused"), "{answer}");
        assert_eq!(answer["reply"]["exit_code"], -1, "{answer}");
    }
    let altered = bytes.replace("via-", "xx-");
    assert_ne!(altered, bytes);
    let answer = ask(&socket, &altered, &signature);
    assert!(
        answer["reply"]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not the server's"),
        "{answer}"
    );
    assert!(!marker.exists(), "a forged command ran");
    assert!(ask(&socket, "not json", "")["error"].is_string());

    // A command-key rotation and retirement reach the executor through the daemon: it
    // rewrites the key file and checks later commands with the new key.
    for step in ["rotate", "retire"] {
        let done = common::identity_json(&server, &server.admin_key, &["command-key", step]);
        assert_eq!(
            common::json_of(&done)["agents"]["updated"],
            1,
            "{done:?}\n{}",
            executor.log()
        );
        let exec = svcctl(
            &server,
            &operator,
            &["-o", "json", "exec", "-t", "split-01", "--", "echo", step],
        );
        assert_eq!(result_of(&exec, "split-01")["stdout"], format!("{step}\n"));
    }
    let keys = std::fs::read_to_string(state.join("command-key.pem")).unwrap();
    assert_eq!(keys.matches("BEGIN CERTIFICATE").count(), 1);
    assert!(
        executor.log().contains("command keys updated"),
        "{}",
        executor.log()
    );
    drop(executor);
}

/// SO_PEERCRED: as root, a client running as `nobody` in the socket's group gets through the
/// file mode but is refused by the executor. Skipped (with a message) when not root.
#[test]
fn another_uid_is_refused() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "this test must run as root under CI"
        );
        eprintln!("skipped: needs root to connect as another uid");
        return;
    }
    let have_setpriv = std::process::Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_setpriv {
        eprintln!("skipped: setpriv (util-linux) is not installed");
        return;
    }
    let server = TestServer::start();
    let agent = Agent::new("split-02");
    let enrolled = agent.bootstrap(&server, &["--server", &server.bus]);
    assert_eq!(enrolled.code, 0, "{enrolled:?}");
    // A socket directory anyone may enter; the socket itself is root:daemon 0660.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let socket = dir.path().join("executor.sock");
    // As root the executor trusts only a root-owned key: make the test's copy so.
    let executor = ExecutorProcess::start(&server, &agent, &socket, &["--peer-user", "daemon"]);
    // The executor answers a refused peer at once, before any request.
    let client = format!(
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?}); \
         print(s.makefile().readline())",
        socket.display().to_string()
    );
    let output = std::process::Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=daemon",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            &client,
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("may not use this executor"),
        "{output:?}\n{}",
        executor.log()
    );
    // And one outside the group does not get through the file mode at all.
    let outsider = std::process::Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            &client,
        ])
        .output()
        .unwrap();
    assert!(!outsider.status.success(), "{outsider:?}");
    assert!(
        String::from_utf8_lossy(&outsider.stderr).contains("Permission denied"),
        "{outsider:?}"
    );
}
