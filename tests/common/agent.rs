//! A real `svc-agent` for tests: a temp home with its agent.yaml (heartbeats every 200 ms),
//! enrolment with the agent's PSK through `svc-agent bootstrap`, and the daemon, killed on
//! drop.

use std::path::PathBuf;
use std::process::{Child, Stdio};

use super::{run, Names, Run, TestServer};

pub struct Agent {
    pub id: String,
    pub home: tempfile::TempDir,
    child: Option<Child>,
}

impl Agent {
    /// A home for agent `id`, not enrolled yet.
    pub fn new(id: &str) -> Agent {
        let home = tempfile::tempdir().unwrap();
        let config = format!(
            "agent:\n  heartbeat_interval: 200ms\n  state_dir: {}\n",
            home.path().join("state").display()
        );
        std::fs::write(home.path().join("agent.yaml"), config).unwrap();
        Agent {
            id: id.to_string(),
            home,
            child: None,
        }
    }

    /// Enrols `id` on the server's plain bus with `labels` and starts its daemon.
    pub fn start(server: &TestServer, id: &str, labels: &str) -> Agent {
        let mut agent = Agent::new(id);
        let enrolled = agent.bootstrap(server, &["--server", &server.bus, "--labels", labels]);
        assert_eq!(enrolled.code, 0, "{enrolled:?}");
        agent.spawn(&server.names);
        agent
    }

    /// Enrols `id` through `server` but on the bus at `bus` (a NATS cluster's node) and starts
    /// its daemon there.
    pub fn start_on(server: &TestServer, bus: &str, id: &str, labels: &str) -> Agent {
        Self::start_on_with(server, bus, id, labels, &[])
    }

    /// [`start_on`](Self::start_on) with more bootstrap flags (e.g. `--enrol-jwt`).
    pub fn start_on_with(
        server: &TestServer,
        bus: &str,
        id: &str,
        labels: &str,
        extra: &[&str],
    ) -> Agent {
        let mut agent = Agent::new(id);
        let mut flags = vec!["--server", bus, "--labels", labels];
        flags.extend_from_slice(extra);
        let enrolled = agent.bootstrap(server, &flags);
        assert_eq!(enrolled.code, 0, "{enrolled:?}");
        agent.spawn(&server.names);
        agent
    }

    /// The agent's state directory (key, certificates, bus JWT).
    pub fn state_dir(&self) -> PathBuf {
        self.home.path().join("state")
    }

    pub fn config(&self) -> PathBuf {
        self.home.path().join("agent.yaml")
    }

    /// What the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.home.path().join("agent.log")).unwrap_or_default()
    }

    /// `svc-agent bootstrap --non-interactive` with this agent's PSK and the `extra` flags
    /// (at least `--server`).
    pub fn bootstrap(&self, server: &TestServer, extra: &[&str]) -> Run {
        let psk = run(server.cli("svc-identity").args([
            "--api-key",
            &server.admin_key,
            "-o",
            "json",
            "psk",
            &self.id,
        ]));
        assert_eq!(psk.code, 0, "{psk:?}");
        let psk: serde_json::Value = serde_json::from_str(&psk.stdout).unwrap();
        run(server
            .names
            .command("svc-agent")
            .arg("--config")
            .arg(self.config())
            .args(["bootstrap", "--non-interactive", "--agent-id", &self.id])
            .args(["--psk", psk["psk"].as_str().unwrap()])
            .args(extra))
    }

    /// Starts the daemon, logging to agent.log in its home.
    pub fn spawn(&mut self, names: &Names) {
        let log = std::fs::File::create(self.home.path().join("agent.log")).unwrap();
        let child = names
            .command("svc-agent")
            .arg("--config")
            .arg(self.config())
            .env("SVC_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Kills the daemon (like a crash or a pulled cable: no goodbye).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}
