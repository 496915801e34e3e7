//! `--cluster`: the fleet on a cluster, all on this machine (issue 36): three members on
//! PostgreSQL and a three-node nats-server JetStream cluster that checks JWTs
//! (`bus.external_auth: jwt`: every agent logs in with a user JWT of its own, issued at
//! enrolment). The simulated agents spread evenly over the three NATS nodes (agent n starts on
//! node n mod 3; each node under its 20,000 open files, `max_connections` 19,000) and, when
//! their node is lost or full, go on to the next node of the list, as svc-agent with several
//! `nats.urls` does.
//!
//! 1. the NATS nodes' auth block and the enrolment JWT: `svc-cluster nats-config`, offline, on
//!    the store the members will share; the members issue agents' JWTs for a day
//!    (`agents.bus_jwt_ttl: 24h`, the shipped default said out loud), so none is renewed
//!    during a run: the simulator does not renew;
//! 2. enrolment over `svc.enroll` (whichever member answers the queue group), then logins:
//!    the time until the simulators have every agent in, and until every member counts them
//!    connected (`/metrics` `svc_agents{state="connected"}` and gRPC `ListAgents` with state
//!    `connected`, paged: what `svcctl agent list` reads);
//! 3. heartbeats at the agent's default interval over --seconds: CPU of each member and of
//!    each nats-server, heartbeats each member counted, and the agents each member owns
//!    (`ClusterService.Members`: the owner, rendezvous-hashed over the live members, writes
//!    an agent's heartbeat times and events; every member keeps every agent's liveness);
//! 4. exec `true` to every agent through member 1 (gRPC `FleetService.Exec`, what `svcctl
//!    exec` calls), a warm-up and --rounds rounds: first and last result;
//! 5. storms: a NATS node killed with SIGKILL and started again at once (as its service
//!    manager would: at 50,000 agents the two others cannot hold all of them under their open
//!    files), its agents coming back through the other nodes or it; then a member killed
//!    with SIGKILL and started again. Each time the time until every agent is connected (a
//!    simulated agent heartbeats as soon as it is in, so connected is heartbeating) and every
//!    member counts them all, and `/health/live` and `ListAgents` on member 1 meanwhile; after
//!    the member's restart, also the time until it has heard as many heartbeats as there are
//!    agents (its counter starts at 0). Members count an agent connected until its heartbeat
//!    timeout, so an agent that moves to another node within it is never counted out.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine;
use svc::proto::cluster_service_client::ClusterServiceClient;
use svc::proto::fleet_service_client::FleetServiceClient;

use crate::common::{self, authorized, run, Server};
use crate::members::Cluster;
use crate::nats_cluster::{self, NatsCluster};
use crate::{
    bus_address, exec_round, heartbeat_interval, median, met, metric, ms, postgres, Fleet, Options,
    Plan, Watch,
};

/// NATS nodes and members.
const NODES: usize = 3;
const MEMBERS: usize = 3;

/// Each nats-server's client cap (`--node-max-connections`): under the 20,000 open files a
/// process may hold here, with room for routes, JetStream's files and the members. A full
/// node refuses a login (`-ERR 'maximum connections exceeded'`) and the agent tries the next.
const NODE_MAX_CONNECTIONS: usize = 19_000;

pub fn main(options: &Options) {
    let agents = options.agents;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if nats_cluster::find_nats_server().is_none() {
        run::missing_peer(
            "nats-server",
            "apt-get install nats-server",
            "the cluster fleet bench",
        );
        return;
    }
    let Some(pg) = postgres::for_bench() else {
        println!("skip: no PostgreSQL (initdb) on this machine; the cluster fleet bench skipped");
        return;
    };
    let mut cluster = Cluster::new(pg.fresh_database(), vec!["nats://127.0.0.1:1".into()]);
    cluster.bus_extra = ", external_auth: jwt";
    cluster.extra = "agents: { bus_jwt_ttl: 24h }\n";
    let (block, enrol_jwt) = nats_config(&cluster);
    let node_max_connections = run::flag("--node-max-connections", NODE_MAX_CONNECTIONS);
    let Some(mut nats) = runtime.block_on(NatsCluster::start_with_auth_and(
        NODES,
        &format!("max_connections: {node_max_connections}\n"),
        &block,
    )) else {
        return;
    };
    cluster.nats_urls = nats.urls();
    let mut members = cluster.start(&runtime, MEMBERS);
    let saved = tempfile::tempdir().unwrap();
    println!(
        "fleet bench, cluster mode: {agents} agents in {} simulator processes on {NODES} NATS nodes (JWT auth, at most {node_max_connections} clients each) and {MEMBERS} members on PostgreSQL, {} s CPU window, {} rounds (load: {})",
        options.processes,
        options.seconds,
        options.rounds,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let mut summary = Vec::new();
    runtime.block_on(async {
        // 1 and 2. enrolment, then logins.
        let plan = Plan {
            buses: nats.urls().iter().map(|u| bus_address(u)).collect(),
            enrol_jwt: Some(enrol_jwt),
            first: 0,
            count: 0,
            group: "fleet".into(),
            saved: saved.path().join("unused"),
            command_key: None,
            heartbeat_ms: heartbeat_interval().as_millis() as u64,
            source_offset: 0,
        };
        let started = Instant::now();
        let mut fleet = Fleet::start("cluster", &plan, saved.path(), agents, options.processes);
        fleet
            .wait("enrolments", Duration::from_secs(900), |s| s.enrolled == agents)
            .await;
        let took = started.elapsed().as_secs_f64();
        summary.push(format!(
            "enrolment: {agents} agents (CSR + user nkey → certificate + user JWT) in {took:.1} s: {:.0}/s",
            agents as f64 / took
        ));
        println!("{}", summary.last().unwrap());
        let started = Instant::now();
        fleet.subscribe();
        fleet.go();
        fleet
            .wait("every agent connected", Duration::from_secs(600), |s| {
                s.connected == agents && s.subscribed == agents
            })
            .await;
        let in_at = started.elapsed();
        wait_members(&members, agents, Duration::from_secs(300)).await;
        let listed_at = started.elapsed();
        summary.push(format!(
            "logins: every agent in (user JWT + nkey-signed nonce, subscribed) after {:.1} s ({:.0}/s); every member counts {agents} connected after {:.1} s",
            in_at.as_secs_f64(),
            agents as f64 / in_at.as_secs_f64(),
            listed_at.as_secs_f64()
        ));
        println!("{}", summary.last().unwrap());
        summary.push(format!("  {}", node_spread(&nats)));
        println!("{}", summary.last().unwrap());
        summary.push(format!("  {}", counts(&members).await));
        println!("{}", summary.last().unwrap());

        // 3. heartbeats: CPU per member and per node.
        tokio::time::sleep(heartbeat_interval().min(Duration::from_secs(options.seconds))).await;
        let pids: Vec<(String, u32)> = members
            .iter()
            .enumerate()
            .map(|(i, m)| (format!("m{}", i + 1), m.child.id()))
            .chain((0..NODES).map(|i| (nats.name(i).to_string(), nats.pid(i).unwrap())))
            .collect();
        let beats0: Vec<f64> = members
            .iter()
            .map(|m| metric(&m.http, "svc_agent_heartbeats_total"))
            .collect();
        let cpu0: Vec<Duration> = pids.iter().map(|(_, pid)| common::cpu_time(*pid)).collect();
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(options.seconds)).await;
        let window = t0.elapsed().as_secs_f64();
        let percents: Vec<f64> = pids
            .iter()
            .zip(&cpu0)
            .map(|((_, pid), before)| {
                (common::cpu_time(*pid) - *before).as_secs_f64() / window * 100.0
            })
            .collect();
        let used: Vec<String> = pids
            .iter()
            .zip(&percents)
            .map(|((name, _), percent)| format!("{name} {percent:.2}%"))
            .collect();
        // The single server's goal, per member: each member checks every heartbeat.
        let busiest = percents[..MEMBERS].iter().cloned().fold(0.0, f64::max);
        let per_thousand = busiest / (agents as f64 / 1000.0);
        let beats: Vec<String> = members
            .iter()
            .zip(&beats0)
            .map(|(m, before)| {
                format!(
                    "{:.0}/s",
                    (metric(&m.http, "svc_agent_heartbeats_total") - before) / window
                )
            })
            .collect();
        let forged: f64 = members
            .iter()
            .map(|m| metric(&m.http, "svc_agent_messages_forged_total"))
            .sum();
        assert_eq!(forged, 0.0, "members dropped {forged} signed messages as forged");
        summary.push(format!(
            "heartbeats: {agents} agents every {} s = {:.0}/s; CPU of one core over {} s: {}; heartbeats counted per member: {}",
            heartbeat_interval().as_secs(),
            agents as f64 / heartbeat_interval().as_secs_f64(),
            options.seconds,
            used.join(", "),
            beats.join(", ")
        ));
        println!("\n{}", summary.last().unwrap());
        summary.push(format!(
            "  busiest member {busiest:.2}% = {per_thousand:.3}% of a core per 1,000 agents   single-server goal <= 1% per 1,000: {}",
            met(per_thousand <= 1.0)
        ));
        println!("{}", summary.last().unwrap());
        if agents < 1000 {
            // Agent n's phase is n mod 1,000 thousandths of the interval.
            summary.push(
                "  (under 1,000 agents their phases bunch at the start of the interval: the window's counts are uneven)".into(),
            );
            println!("{}", summary.last().unwrap());
        }
        summary.push(format!("  heartbeat work shared by owner: {}", owners(&members[0]).await));
        println!("{}", summary.last().unwrap());

        // 4. exec to every agent through member 1.
        let _ = exec_round(&members[0], agents).await; // warm-up
        let (mut firsts, mut alls) = (Vec::new(), Vec::new());
        let cpu0: Vec<Duration> = pids.iter().map(|(_, pid)| common::cpu_time(*pid)).collect();
        let fleet_cpu0 = fleet.cpu();
        let t0 = Instant::now();
        for _ in 0..options.rounds {
            let (first, all) = exec_round(&members[0], agents).await;
            firsts.push(first);
            alls.push(all);
        }
        // What the rounds cost each process, in CPU seconds per round, against the machine's
        // capacity over the same wall time (every core of it).
        let rounds = options.rounds as f64;
        let wall = t0.elapsed().as_secs_f64() / rounds;
        let spent: Vec<(String, f64)> = pids
            .iter()
            .zip(&cpu0)
            .map(|((name, pid), before)| {
                let seconds = (common::cpu_time(*pid) - *before).as_secs_f64() / rounds;
                (name.clone(), seconds)
            })
            .chain(std::iter::once((
                "simulators".to_string(),
                (fleet.cpu() - fleet_cpu0).as_secs_f64() / rounds,
            )))
            .collect();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let total: f64 = spent.iter().map(|(_, s)| s).sum();
        let best = *alls.iter().min().unwrap();
        let (first, all) = (median(firsts), median(alls));
        let exec_all = all;
        summary.push(format!(
            "exec `true` to {agents} agents through m1 (gRPC Exec, median of {}): first result {}, all results {} (best {}) = {:.2} of the goal   goal all <= 3 s: {}",
            options.rounds,
            ms(first),
            ms(all),
            ms(best),
            all.as_secs_f64() / 3.0,
            met(all <= Duration::from_secs(3))
        ));
        println!("\n{}", summary.last().unwrap());
        summary.push(format!(
            "  CPU per round (s): {}; in all {total:.1} s of the {:.1} s the machine's {cores} cores had in {wall:.1} s",
            spent
                .iter()
                .map(|(name, seconds)| format!("{name} {seconds:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
            wall * cores
        ));
        println!("{}", summary.last().unwrap());

        // 5. storms: a NATS node, then a member.
        let node = 1;
        let on_node = (0..agents).filter(|n| n % NODES == node).count();
        let lost_before = fleet.total().lost;
        let watch = Watch::start(&members[0]);
        let killed = Instant::now();
        nats.kill(node);
        fleet
            .wait("the killed node's agents lost", Duration::from_secs(120), |s| {
                s.lost >= lost_before + on_node
            })
            .await;
        // The node starts again while its agents come back through the others. Under tens
        // of thousands of reconnecting agents on two cores its JetStream can take longer
        // than a test's 30 s to find the meta leader (it did once at 50,000).
        nats.ready_within = Duration::from_secs(300);
        let (restarted, (back, listed)) = tokio::join!(
            async {
                nats.restart(node).await;
                killed.elapsed()
            },
            async {
                fleet
                    .wait("every agent back", Duration::from_secs(300), |s| {
                        s.connected == agents
                    })
                    .await;
                let back = killed.elapsed();
                wait_members(&members, agents, Duration::from_secs(300)).await;
                (back, killed.elapsed())
            }
        );
        let seen = watch.finish().await;
        summary.push(format!(
            "storm: NATS node {} killed (SIGKILL) under {on_node} agents, started again (serving after {:.1} s): every agent connected after {:.1} s, every member counts {agents} connected after {:.1} s   goal <= 60 s: {}",
            nats.name(node),
            restarted.as_secs_f64(),
            back.as_secs_f64(),
            listed.as_secs_f64(),
            met(listed <= Duration::from_secs(60))
        ));
        println!("\n{}", summary.last().unwrap());
        for line in [node_spread(&nats), format!("m1 meanwhile: {}", seen.line())] {
            summary.push(format!("  {line}"));
            println!("{}", summary.last().unwrap());
        }

        let member = 1;
        let lost_before = fleet.total().lost;
        let watch = Watch::start(&members[0]);
        let killed = Instant::now();
        members[member].kill_and_restart();
        let restarted = killed.elapsed();
        wait_members(&members, agents, Duration::from_secs(300)).await;
        let listed = killed.elapsed();
        // The restarted member's own count of heartbeats starts at 0: it has heard every
        // agent (at least as many heartbeats as agents) about one interval later.
        let heard = loop {
            let beats = metric(&members[member].http, "svc_agent_heartbeats_total");
            if beats >= agents as f64 {
                break killed.elapsed();
            }
            assert!(
                killed.elapsed() < Duration::from_secs(300),
                "the restarted member heard {beats} heartbeats of {agents} agents"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let seen = watch.finish().await;
        let total = fleet.total();
        summary.push(format!(
            "storm: member m{} killed (SIGKILL) and started again (listening after {:.1} s): every member counts {agents} connected after {:.1} s, m{} has heard as many heartbeats after {:.1} s   goal <= 60 s: {}; agents meanwhile: {} connected, {} connections lost",
            member + 1,
            restarted.as_secs_f64(),
            listed.as_secs_f64(),
            member + 1,
            heard.as_secs_f64(),
            met(listed.max(heard) <= Duration::from_secs(60)),
            total.connected,
            total.lost - lost_before
        ));
        println!("\n{}", summary.last().unwrap());
        for line in [
            counts(&members).await,
            format!("heartbeat work shared by owner: {}", owners(&members[0]).await),
            format!("m1 meanwhile: {}", seen.line()),
        ] {
            summary.push(format!("  {line}"));
            println!("{}", summary.last().unwrap());
        }
        // Every exec answered, none refused; one more exec after the storms.
        let (_, all) = exec_round(&members[0], agents).await;
        summary.push(format!("exec after the storms: all {agents} results in {}", ms(all)));
        let total = fleet.total();
        assert_eq!(total.refused, 0, "the simulated agents refused {} commands", total.refused);
        summary.push(format!(
            "simulators: {} logins, {} connections lost, {} commands answered, none refused",
            total.logins, total.lost, total.answered
        ));

        // 6. the floor: the same agents on the same three nodes (the fleet above gone, the
        // same saved enrolments logged in again), with the members' heartbeat load as before,
        // commanded by a bare client with a member's NATS rights that signs with a key of its
        // own: what the cluster's transport and the agents cost, without the member's work.
        drop(fleet);
        let client = floor_client(&cluster, &nats.url(0)).await;
        let mut floor = crate::Floor::on(None, &plan, saved.path(), options, client).await;
        let _ = floor.round().await; // warm-up
        let (mut floor_firsts, mut floor_alls) = (Vec::new(), Vec::new());
        for _ in 0..options.rounds {
            let (first, all) = floor.round().await;
            floor_firsts.push(first);
            floor_alls.push(all);
        }
        let (floor_first, floor_all) = (median(floor_firsts), median(floor_alls));
        let ratio = exec_all.as_secs_f64() / floor_all.as_secs_f64();
        summary.push(format!(
            "floor: the same {agents} agents on the same nodes commanded by a bare client (a member's NATS rights, its own command key; median of {}): first result {}, all results {}; exec through m1 / floor = {ratio:.2}x",
            options.rounds,
            ms(floor_first),
            ms(floor_all)
        ));
        println!("\n{}", summary.last().unwrap());
        assert_eq!(floor.fleet.total().refused, 0, "floor commands refused");
    });
    println!(
        "\n=== cluster fleet summary ({agents} agents, {NODES} NATS nodes, {MEMBERS} members) ==="
    );
    for line in &summary {
        println!("{line}");
    }
}

/// A configuration of the members' store and master key, for what runs offline on it.
fn offline_config(cluster: &Cluster) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("server.yaml");
    std::fs::write(
        &config,
        format!(
            "data_dir: {}\nhmacsecret: {}\nmaster_key: {}\n{}",
            dir.path().join("data").display(),
            common::HMAC_SECRET,
            base64::engine::general_purpose::STANDARD.encode(cluster.master),
            cluster.member_yaml(0)
        ),
    )
    .unwrap();
    (dir, config)
}

/// A bare NATS client with a member's rights (a user JWT of the svc account, as each member
/// makes its own at start), for the floor: read from the members' store.
async fn floor_client(cluster: &Cluster<'_>, url: &str) -> async_nats::Client {
    let (_dir, config) = offline_config(cluster);
    let loaded = svc::config::load_server(Some(&config), &[]).unwrap();
    let config = loaded.config;
    let store = svc::store::open(&config.store, &config.data_dir)
        .await
        .unwrap();
    let keys = svc::identity::Keys::from_config(&config).unwrap();
    let nats_keys = svc::identity::nats::ensure(store.as_ref(), &keys)
        .await
        .unwrap();
    let (jwt, user) = svc::identity::nats::member_login(&nats_keys, "bench-floor").unwrap();
    svc::bus::natsjwt::connect_options_with(move || Ok(jwt.clone()), user)
        .connect(url)
        .await
        .unwrap()
}

/// The auth block for the NATS nodes and the enrolment JWT: `svc-cluster -o json nats-config`
/// on a configuration of the members' store and master key, before any member starts.
fn nats_config(cluster: &Cluster) -> (String, String) {
    let (_dir, config) = offline_config(cluster);
    let printed = Command::new(common::server_binary())
        .env_clear()
        .args(["cluster", "-o", "json", "nats-config", "--config"])
        .arg(Path::new(&config))
        .output()
        .unwrap();
    assert!(
        printed.status.success(),
        "svc-cluster nats-config: {printed:?}"
    );
    let printed: serde_json::Value = serde_json::from_slice(&printed.stdout).unwrap();
    (
        printed["nats_config"].as_str().unwrap().to_string(),
        printed["enrol_jwt"].as_str().unwrap().to_string(),
    )
}

/// Agents member `member` lists as connected (gRPC `ListAgents`, state `connected`, every
/// page), or None when it does not answer.
async fn listed_connected(member: &Server) -> Option<usize> {
    let channel = tonic::transport::Channel::from_shared(member.grpc.clone())
        .ok()?
        .connect()
        .await
        .ok()?;
    let mut client = FleetServiceClient::new(channel);
    let (mut count, mut cursor) = (0, String::new());
    loop {
        let request = svc::proto::ListAgentsRequest {
            state: "connected".into(),
            limit: svc::fleet::MAX_PAGE as u32,
            cursor,
            ..Default::default()
        };
        let page = client
            .list_agents(authorized(&member.key, request))
            .await
            .ok()?
            .into_inner();
        count += page.agents.len();
        if page.next_cursor.is_empty() {
            return Some(count);
        }
        cursor = page.next_cursor;
    }
}

/// Waits until every member counts `agents` connected, in `/metrics` and in `ListAgents`.
async fn wait_members(members: &[Server], agents: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    for (i, member) in members.iter().enumerate() {
        loop {
            let gauge = metric(&member.http, "svc_agents{state=\"connected\"}") as usize;
            if gauge == agents && listed_connected(member).await == Some(agents) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "member m{} counts {gauge} of {agents} agents connected after {limit:?}",
                i + 1
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Every member's count of connected agents: `/metrics` and `ListAgents`.
async fn counts(members: &[Server]) -> String {
    let mut parts = Vec::new();
    for (i, member) in members.iter().enumerate() {
        let gauge = metric(&member.http, "svc_agents{state=\"connected\"}");
        let listed = listed_connected(member).await.unwrap_or(0);
        parts.push(format!("m{} {gauge:.0} / {listed}", i + 1));
    }
    format!(
        "connected agents per member (/metrics gauge / ListAgents): {}",
        parts.join(", ")
    )
}

/// The agents each member owns, as member `member` lists them.
async fn owners(member: &Server) -> String {
    let Ok(mut client) = ClusterServiceClient::connect(member.grpc.clone()).await else {
        return "members not listed".into();
    };
    let request = svc::proto::MemberRequest::default();
    match client.members(authorized(&member.key, request)).await {
        Ok(list) => list
            .into_inner()
            .members
            .iter()
            .map(|m| format!("{} {} agents ({})", m.id, m.agents, m.health))
            .collect::<Vec<_>>()
            .join(", "),
        Err(e) => format!("members not listed: {e}"),
    }
}

/// Client connections per NATS node (agents and members).
fn node_spread(nats: &NatsCluster) -> String {
    let nodes: Vec<String> = (0..nats.len())
        .map(|i| match nats.connections(i) {
            Some(n) => format!("{} {n}", nats.name(i)),
            None => format!("{} ?", nats.name(i)),
        })
        .collect();
    format!("connections per NATS node: {}", nodes.join(", "))
}
