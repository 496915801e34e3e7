//! Several svc-server members in cluster mode on loopback: one PostgreSQL database (the test
//! process's, `postgres::shared`) and the given NATS URLs, the same master key, hmacsecret and
//! bootstrap admin key on every member.

use super::{postgres, random_master_key, Options, TestServer};

pub struct Members {
    pub servers: Vec<TestServer>,
    pub admin_key: String,
    pub database_url: String,
}

/// Timing for tests: a dead leader is replaced within about a second and a half.
pub const FAST: &str = "  heartbeat_interval: 250ms\n  member_timeout: 1s\n  lease_ttl: 1s\n";

/// What each member's `cluster:` section carries besides enabled and member_id.
pub struct Setup<'a> {
    /// One list per member (a member may see a different NATS node first).
    pub nats_urls: Vec<Vec<String>>,
    /// Extra lines under `cluster:` (two-space indented), e.g. [`FAST`].
    pub cluster_yaml: &'a str,
    /// Extra top-level YAML.
    pub extra_yaml: &'a str,
    /// Extra lines under `bus:` (two-space indented), e.g. `  external_auth: jwt\n`.
    pub bus_yaml: &'a str,
    /// The database and master key to use (see [`prepare`]); None: fresh ones.
    pub prepared: Option<Prepared>,
}

/// A fresh database and master key, for a test that must use them before the members start
/// (`svc-cluster nats-config` runs offline on the store the members will share).
pub struct Prepared {
    pub database_url: String,
    pub master_key: String,
}

/// None (with a message) when PostgreSQL is not available outside CI.
pub fn prepare() -> Option<Prepared> {
    let postgres = postgres::shared()?;
    Some(Prepared {
        database_url: postgres.fresh_database(),
        master_key: random_master_key(),
    })
}

/// A member's configuration (without the listeners and keys TestServer adds).
pub fn member_yaml(setup: &Setup, database_url: &str, i: usize) -> String {
    let urls: Vec<String> = setup.nats_urls[i]
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect();
    format!(
        "store:\n  driver: postgres\n  url: \"{database_url}\"\nbus:\n  external_urls: [{}]\n{}streams:\n  max_bytes: 67108864\nrate_limit:\n  requests_per_second: 100000\n  burst: 100000\n  max_in_flight: 1024\ncluster:\n  enabled: true\n  member_id: m{}\n{}{}",
        urls.join(", "),
        setup.bus_yaml,
        i + 1,
        setup.cluster_yaml,
        setup.extra_yaml,
    )
}

/// Streams are capped at 64 MiB each: JetStream refuses a stream whose max_bytes does not fit
/// its nodes' max_file_store (1 GB in tests/common/nats_cluster.rs).
/// Starts `setup.nats_urls.len()` members named m1, m2, ... one after the other; None (with a
/// message) when PostgreSQL is not available outside CI.
pub fn start(mut setup: Setup) -> Option<Members> {
    let Prepared {
        database_url,
        master_key,
    } = match setup.prepared.take() {
        Some(prepared) => prepared,
        None => prepare()?,
    };
    let admin_key = format!("svc_{}", "c".repeat(40));
    let mut servers = Vec::new();
    for i in 0..setup.nats_urls.len() {
        let config_yaml = member_yaml(&setup, &database_url, i);
        servers.push(TestServer::start_with(Options {
            env: vec![("SVC_BOOTSTRAP_API_KEY".into(), admin_key.clone())],
            config_yaml,
            master_key: Some(master_key.clone()),
            ..Options::default()
        }));
    }
    for server in &mut servers {
        server.admin_key = admin_key.clone();
    }
    let members = Members {
        servers,
        admin_key,
        database_url,
    };
    members.wait_until_all_see_all();
    Some(members)
}

impl Members {
    /// `svc-cluster -o json ARGS` through member `i`, parsed (panics on a non-zero exit).
    pub fn cluster_json(&self, i: usize, args: &[&str]) -> serde_json::Value {
        let run = self.cluster_cli(i, args);
        assert_eq!(
            run.code, 0,
            "svc-cluster {args:?}: {}{}",
            run.stdout, run.stderr
        );
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
    }

    pub fn cluster_cli(&self, i: usize, args: &[&str]) -> super::Run {
        let server = &self.servers[i];
        super::run(
            server
                .cli("svc-cluster")
                .args(["--api-key", &self.admin_key, "-o", "json"])
                .args(args),
        )
    }

    /// The leader's id as member `i` sees it ("" when none).
    pub fn leader_seen_by(&self, i: usize) -> String {
        let run = self.cluster_cli(i, &["status"]);
        serde_json::from_str::<serde_json::Value>(&run.stdout)
            .map(|v| v["leader"].as_str().unwrap_or_default().to_string())
            .unwrap_or_default()
    }

    /// Waits until member `i` reports a leader other than `not`, and returns it with the time
    /// it took.
    pub fn wait_for_leader(&self, i: usize, not: &str, within: std::time::Duration) -> String {
        let start = std::time::Instant::now();
        loop {
            let leader = self.leader_seen_by(i);
            if !leader.is_empty() && leader != not {
                return leader;
            }
            assert!(
                start.elapsed() < within,
                "no new leader within {within:?} (last seen: '{leader}')\n{}",
                self.servers[i].log()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Waits until every member lists every member as healthy (views refresh every
    /// heartbeat interval).
    pub fn wait_until_all_see_all(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        for i in 0..self.servers.len() {
            loop {
                let run = self.cluster_cli(i, &["members"]);
                let healthy = serde_json::from_str::<serde_json::Value>(&run.stdout)
                    .ok()
                    .and_then(|v| v.as_array().cloned())
                    .map(|m| m.iter().filter(|m| m["health"] == "healthy").count())
                    .unwrap_or(0);
                if healthy == self.servers.len() {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "member {i} sees {healthy} healthy members: {}{}",
                    run.stdout,
                    run.stderr
                );
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }

    /// The index of member `id` (m1 → 0).
    pub fn index_of(id: &str) -> usize {
        id.trim_start_matches('m').parse::<usize>().unwrap() - 1
    }
}
