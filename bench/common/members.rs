//! Cluster members for the benches that run one (bench/cluster.rs, bench/fleet.rs
//! `--cluster`): `count` svc-server members named m1.. on one PostgreSQL database and a NATS
//! cluster, with the same master key and admin key. Included with `#[path]` by benches that
//! also include tests/common/nats_cluster.rs.

use std::time::{Duration, Instant};

use svc::proto::cluster_service_client::ClusterServiceClient;

use crate::common::{authorized, Server};

/// What every member of one cluster shares.
pub struct Cluster<'a> {
    pub database_url: String,
    /// Every NATS node's client URL; member i lists them starting from node i (mod their
    /// number), so members spread over the nodes.
    pub nats_urls: Vec<String>,
    pub master: [u8; 32],
    pub key: String,
    /// Inside the `bus:` flow mapping after `external_urls`, e.g. `, external_auth: jwt`.
    pub bus_extra: &'a str,
    /// YAML after the `cluster:` section: lines under it when indented, top-level otherwise.
    pub extra: &'a str,
}

impl<'a> Cluster<'a> {
    /// Members on `database_url` (a fresh database) with a new master key and admin key.
    pub fn new(database_url: String, nats_urls: Vec<String>) -> Cluster<'a> {
        Cluster {
            database_url,
            nats_urls,
            master: rand::random(),
            key: format!("svc_{}", svc::ids::random_base62(40)),
            bus_extra: "",
            extra: "",
        }
    }

    /// Member `i`'s configuration, less what [`Server::start_member`] adds (data dir,
    /// listeners, keys). Streams are capped at 256 MiB each so both fit the test nodes' 1 GB
    /// `max_file_store`.
    pub fn member_yaml(&self, i: usize) -> String {
        let mut urls: Vec<String> = self.nats_urls.iter().map(|u| format!("\"{u}\"")).collect();
        let first = i % urls.len().max(1);
        urls.rotate_left(first);
        format!(
            "store: {{ driver: postgres, url: \"{}\" }}\nbus: {{ external_urls: [{}]{} }}\nstreams: {{ max_bytes: 268435456 }}\ncluster:\n  enabled: true\n  member_id: m{}\n{}",
            self.database_url,
            urls.join(", "),
            self.bus_extra,
            i + 1,
            self.extra
        )
    }

    /// Starts `count` members and waits until every one sees a leader.
    pub fn start(&self, runtime: &tokio::runtime::Runtime, count: usize) -> Vec<Server> {
        let members: Vec<Server> = (0..count)
            .map(|i| {
                let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
                Server::start_member(root, &self.member_yaml(i), self.master, &self.key)
            })
            .collect();
        runtime.block_on(async {
            for member in &members {
                let deadline = Instant::now() + Duration::from_secs(30);
                while leader(member).await.is_empty() {
                    assert!(Instant::now() < deadline, "no leader");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        members
    }
}

/// The leader's id as `member` sees it ("" when none or unreachable).
pub async fn leader(member: &Server) -> String {
    let Ok(mut client) = ClusterServiceClient::connect(member.grpc.clone()).await else {
        return String::new();
    };
    match client
        .status(authorized(&member.key, svc::proto::Empty {}))
        .await
    {
        Ok(status) => status.into_inner().leader,
        Err(_) => String::new(),
    }
}
