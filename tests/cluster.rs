//! Cluster mode (docs/cluster.md): several real svc-server members on one PostgreSQL and a
//! NATS cluster with JetStream, driven through svc-cluster, REST and the bus. Skipped with a
//! message where PostgreSQL or nats-server is missing (required under CI).

mod common;

use std::time::{Duration, Instant};

use common::cluster::{self, Members, Setup, FAST};
use common::nats_cluster::NatsCluster;
use common::{run, TestServer};

/// A NATS cluster with JetStream (tests/common/nats_cluster.rs) and the runtime its async
/// start and restart need.
struct Nats {
    cluster: NatsCluster,
    /// Kept for the cluster's lifetime: its start ran on it.
    _runtime: tokio::runtime::Runtime,
}

impl Nats {
    fn start(nodes: usize) -> Option<Nats> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let cluster = runtime.block_on(NatsCluster::start(nodes))?;
        Some(Nats {
            cluster,
            _runtime: runtime,
        })
    }

    /// Every node's URL, starting from node `first` (a member or agent prefers that node).
    fn urls_from(&self, first: usize) -> Vec<String> {
        let mut urls = self.cluster.urls();
        let first = first % urls.len();
        urls.rotate_left(first);
        urls
    }
}

fn three_members(nats: &Nats, timing: &str) -> Option<Members> {
    cluster::start(Setup {
        nats_urls: (0..3).map(|i| nats.urls_from(i)).collect(),
        cluster_yaml: timing,
        extra_yaml: "",
        bus_yaml: "",
        prepared: None,
    })
}

fn ids(members: &serde_json::Value) -> Vec<String> {
    members
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn members_agree_on_one_leader_and_report_quorum() {
    let Some(nats) = Nats::start(3) else {
        return;
    };
    let Some(members) = three_members(&nats, FAST) else {
        return;
    };
    let leader = members.wait_for_leader(0, "", Duration::from_secs(10));
    for i in 0..3 {
        let status = members.cluster_json(i, &["status"]);
        assert_eq!(status["leader"], leader.as_str(), "member {i}: {status}");
        assert_eq!(status["clustered"], true);
        assert_eq!(status["quorum"], true, "{status}");
        assert_eq!(status["postgres"], true);
        assert_eq!(status["nats"], true);
        assert_eq!(status["health"], "healthy", "{status}");
        assert!(status["term"].as_i64().unwrap() >= 1);
        assert_eq!(ids(&status["members"]), ["m1", "m2", "m3"]);
        let roles: Vec<&str> = status["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles.iter().filter(|r| **r == "leader").count(), 1);
        for member in status["members"].as_array().unwrap() {
            let address = member["address"].as_str().unwrap();
            assert!(
                address.starts_with("127.0.0.1:") && !address.ends_with(":0"),
                "{member}"
            );
        }
    }
    let shown = members.cluster_json(1, &["leader"]);
    assert_eq!(shown["id"], leader.as_str());
    let one = members.cluster_json(2, &["members", "m2"]);
    assert_eq!(ids(&one), ["m2"]);
    let missing = members.cluster_cli(0, &["members", "m9"]);
    assert_eq!(missing.code, 5, "{}", missing.stderr);
    let add = members.cluster_cli(0, &["add", "m4", "--address", "127.0.0.1:1"]);
    assert_eq!(add.code, 1);
    assert!(add.stderr.contains("Unimplemented"), "{}", add.stderr);
    let audited = common::audit_rows(&members.servers[0], &["--action", "cluster.add"]);
    assert_eq!(audited.len(), 1, "{audited:?}");
    assert_eq!(
        (&audited[0]["resource_id"], &audited[0]["outcome"]),
        (&"m4".into(), &"denied".into()),
        "{audited:?}"
    );

    // Readonly reads; changing membership is admin.
    let (_, readonly) = members.servers[0].create_key("viewer", "readonly");
    let server = &members.servers[1];
    let status = run(server
        .cli("svc-cluster")
        .args(["--api-key", &readonly, "status"]));
    assert_eq!(status.code, 0, "{}", status.stderr);
    assert!(status.stdout.contains("quorum:   yes"), "{}", status.stdout);
    for args in [&["remove", "m3"][..], &["rebalance"], &["transfer-leader"]] {
        let refused = run(server
            .cli("svc-cluster")
            .args(["--api-key", &readonly])
            .args(args));
        assert_eq!(refused.code, 4, "{args:?}: {}", refused.stderr);
    }
    let none = run(server.cli("svc-cluster").arg("status"));
    assert_ne!(none.code, 0);
}

#[test]
fn transfer_leader_moves_the_lease_and_is_audited() {
    let Some(nats) = Nats::start(3) else {
        return;
    };
    let Some(members) = three_members(&nats, FAST) else {
        return;
    };
    let first = members.wait_for_leader(0, "", Duration::from_secs(10));
    let term = members.cluster_json(0, &["status"])["term"]
        .as_i64()
        .unwrap();
    let target = if first == "m3" { "m2" } else { "m3" };
    let moved = members.cluster_json(0, &["transfer-leader", "--to", target]);
    assert_eq!(moved["id"], target);
    for i in 0..3 {
        // Views refresh every heartbeat interval.
        let deadline = Instant::now() + Duration::from_secs(3);
        while members.leader_seen_by(i) != target && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let status = members.cluster_json(i, &["status"]);
        assert_eq!(status["leader"], target, "member {i}");
        assert!(status["term"].as_i64().unwrap() > term);
    }
    // Without a target: any other live member.
    let next = members.cluster_json(1, &["transfer-leader"]);
    assert_ne!(next["id"], target);
    // A member that is not there is refused.
    let refused = members.cluster_cli(0, &["transfer-leader", "m9"]);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(refused.stderr.contains("not live"), "{}", refused.stderr);
    let rows = common::audit_rows(
        &members.servers[2],
        &["--action", "cluster.transfer_leader"],
    );
    assert!(rows.len() >= 3, "{rows:?}");
}

#[test]
fn a_removed_member_stops_serving_and_leaves_the_table() {
    let Some(nats) = Nats::start(3) else {
        return;
    };
    let Some(mut members) = three_members(&nats, FAST) else {
        return;
    };
    members.wait_for_leader(0, "", Duration::from_secs(10));
    let removed = members.cluster_json(0, &["remove", "m2"]);
    assert_eq!(removed["removed"], "m2");
    // m2 finds its row gone at its next heartbeat and stops by itself.
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = members.servers[1].pid() as i32;
    loop {
        let mut status = 0;
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid;
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "m2 still runs:\n{}",
            members.servers[1].log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(members.servers[1]
        .log()
        .contains("removed from the cluster"));
    let listed = members.cluster_json(0, &["members"]);
    assert_eq!(
        ids(&listed),
        ["m1", "m3"],
        "{listed}\n--- m1:\n{}\n--- m2:\n{}",
        members.servers[0].log(),
        members.servers[1].log()
    );
    let again = members.cluster_cli(2, &["remove", "m2"]);
    assert_eq!(again.code, 5, "{}", again.stderr);
    let rows = common::audit_rows(&members.servers[0], &["--action", "cluster.remove"]);
    assert_eq!(rows.len(), 2, "{rows:?}");
    members.servers.remove(1);
}

#[test]
fn killing_the_leader_elects_another_within_the_lease() {
    let Some(nats) = Nats::start(3) else {
        return;
    };
    // The default timing (1s heartbeats, 5s lease): the figure the docs give.
    let Some(mut members) = three_members(&nats, "") else {
        return;
    };
    let leader = members.wait_for_leader(0, "", Duration::from_secs(15));
    let dead = Members::index_of(&leader);
    let witness = (dead + 1) % 3;
    let killed = Instant::now();
    members.servers[dead].stop_with(libc::SIGKILL);
    let next = members.wait_for_leader(witness, &leader, Duration::from_secs(10));
    let took = killed.elapsed();
    eprintln!("leader {leader} killed: {next} leads after {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let status = members.cluster_json(witness, &["status"]);
    assert_eq!(status["health"], "degraded", "{status}");
    let dead_row = status["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == leader.as_str())
        .unwrap()
        .clone();
    assert_eq!(dead_row["health"], "unreachable", "{status}");
}

#[test]
fn a_key_deleted_on_one_member_fails_at_once_on_another() {
    let Some(nats) = Nats::start(3) else {
        return;
    };
    let Some(members) = three_members(&nats, FAST) else {
        return;
    };
    let (a, b) = (&members.servers[0], &members.servers[2]);
    let (id, key) = a.create_key("short-lived", "operator");
    assert_eq!(
        b.request("GET", "/api/v1/apikeys", Some(&key), None).status,
        403
    );
    assert_eq!(
        b.request("GET", "/health/ready", Some(&key), None).status,
        200
    );
    let listed = run(b
        .cli("svc-events")
        .args(["--api-key", &key, "list", "--limit", "1"]));
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let deleted = a.request(
        "DELETE",
        &format!("/api/v1/apikeys/{id}"),
        Some(&members.admin_key),
        None,
    );
    assert!(
        deleted.status == 200 || deleted.status == 204,
        "{}",
        deleted.status
    );
    let refused = run(b
        .cli("svc-events")
        .args(["--api-key", &key, "list", "--limit", "1"]));
    assert_eq!(refused.code, 4, "{}", refused.stderr);
}

/// (member, agents it owns) for the healthy members, as member `i` reports them.
fn owned(members: &Members, i: usize) -> Vec<(String, u64)> {
    members
        .cluster_json(i, &["members"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["health"] == "healthy")
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_string(),
                m["agents"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn agents_are_owned_by_one_live_member_and_move_when_it_dies() {
    let Some(nats) = Nats::start(3) else {
        return;
    };
    let Some(mut members) = three_members(&nats, FAST) else {
        return;
    };
    members.wait_for_leader(0, "", Duration::from_secs(10));
    let agents: Vec<_> = (0..6)
        .map(|i| {
            common::agent::Agent::start(&members.servers[i % 3], &format!("host-{i}"), "role=web")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while owned(&members, 0).iter().map(|(_, n)| n).sum::<u64>() != 6 {
        assert!(Instant::now() < deadline, "{:?}", owned(&members, 0));
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every member answers for every agent: all six are connected everywhere (each member
    // sees an agent's first heartbeat on its own).
    for i in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let list = run(members.servers[i].cli("svcctl").args([
                "--api-key",
                &members.admin_key,
                "-o",
                "json",
                "agent",
                "list",
            ]));
            let list: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
            let connected = list
                .as_array()
                .unwrap()
                .iter()
                .filter(|a| a["state"] == "connected")
                .count();
            if connected == 6 {
                break;
            }
            assert!(Instant::now() < deadline, "member {i}: {list}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let rebalanced = members.cluster_json(1, &["rebalance"]);
    assert_eq!(rebalanced["rebalanced"], true);
    // Kill a member that owns agents; the others take them within the member timeout.
    let before = owned(&members, 0);
    let (victim, _) = before
        .iter()
        .find(|(id, n)| *n > 0 && id != "m1")
        .unwrap()
        .clone();
    let index = Members::index_of(&victim);
    members.servers[index].stop_with(libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = owned(&members, 0);
        let total: u64 = now.iter().map(|(_, n)| n).sum();
        if now.len() == 2 && total == 6 {
            break;
        }
        assert!(Instant::now() < deadline, "{now:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // One agent_connected per agent, however many members received its heartbeats.
    let events = run(members.servers[0].cli("svc-events").args([
        "--api-key",
        &members.admin_key,
        "-o",
        "json",
        "list",
        "--type",
        "agent_connected",
        "--limit",
        "100",
    ]));
    assert_eq!(events.code, 0, "{}", events.stderr);
    drop(agents);
}

#[test]
fn a_single_server_is_its_own_cluster() {
    let server = TestServer::start();
    let status = run(server.cli("svc-cluster").args([
        "--api-key",
        &server.admin_key,
        "-o",
        "json",
        "status",
    ]));
    assert_eq!(status.code, 0, "{}", status.stderr);
    let status: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(status["clustered"], false);
    assert_eq!(status["health"], "healthy");
    assert_eq!(status["members"].as_array().unwrap().len(), 1);
    assert_eq!(status["leader"], status["members"][0]["id"]);
    let transfer =
        run(server
            .cli("svc-cluster")
            .args(["--api-key", &server.admin_key, "transfer-leader"]));
    assert_eq!(transfer.code, 1);
    assert!(
        transfer.stderr.contains("cluster mode is off"),
        "{}",
        transfer.stderr
    );
    let remove =
        run(server
            .cli("svc-cluster")
            .args(["--api-key", &server.admin_key, "remove", "x"]));
    assert_eq!(remove.code, 1, "{}", remove.stderr);
}

#[test]
fn cluster_settings_are_checked() {
    let temp = tempfile::tempdir().unwrap();
    let config = temp.path().join("server.yaml");
    std::fs::write(
        &config,
        "data_dir: /tmp/x\nhmacsecret: h\nmaster_key: AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\nlisten:\n  grpc: 0.0.0.0:5397\ncluster:\n  enabled: true\n  member_id: \"a b\"\n  lease_ttl: 1s\n",
    )
    .unwrap();
    let names = common::Names::new();
    let checked = run(names.command("svc-server").args([
        "--config",
        config.to_str().unwrap(),
        "--check-config",
    ]));
    assert_ne!(checked.code, 0);
    let text = format!("{}{}", checked.stdout, checked.stderr);
    for needle in [
        "store.driver: postgres",
        "bus.external_urls",
        "cluster.member_id 'a b'",
        "cluster.advertise is required",
        "cluster.lease_ttl must be at least three times",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
}

fn svcctl(members: &Members, i: usize, args: &[&str]) -> common::Run {
    run(members.servers[i]
        .cli("svcctl")
        .args(["--api-key", &members.admin_key])
        .args(args))
}

/// Each exec result line of `svcctl -o json exec`, by agent.
fn exec_results(run: &common::Run) -> std::collections::BTreeMap<String, serde_json::Value> {
    run.stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| Some((v["agent_id"].as_str()?.to_string(), v)))
        .collect()
}

/// Waits (up to `within`) until `exec -- echo hi` through member `i` gets "hi" from both
/// `role=web` agents; `context` is added to the failure message.
fn both_answer_hi(members: &Members, i: usize, within: Duration, context: &str) {
    let deadline = Instant::now() + within;
    loop {
        let sent = svcctl(
            members,
            i,
            &[
                "-o", "json", "exec", "--target", "role=web", "--", "echo", "hi",
            ],
        );
        let results = exec_results(&sent);
        if sent.code == 0 && results.len() == 2 {
            for result in results.values() {
                assert_eq!(result["stdout"], "hi\n", "{result}");
            }
            return;
        }
        assert!(Instant::now() < deadline, "{sent:?}\n{context}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn exec_through_any_member_reaches_agents_and_a_quarantine_is_seen_everywhere() {
    let Some(nats) = Nats::start(3) else {
        return;
    };
    let Some(members) = three_members(&nats, FAST) else {
        return;
    };
    // Each agent on its own NATS node; members reach them through the cluster's routes.
    let _a = common::agent::Agent::start_on(
        &members.servers[0],
        &nats.cluster.url(1),
        "web-1",
        "role=web",
    );
    let _b = common::agent::Agent::start_on(
        &members.servers[2],
        &nats.cluster.url(2),
        "web-2",
        "role=web",
    );
    both_answer_hi(&members, 1, Duration::from_secs(10), "");
    // A job started through m1 with --async is shown, results and all, by m2 and m3: the
    // history is in the shared store.
    let started = svcctl(
        &members,
        0,
        &[
            "-o", "json", "exec", "--async", "--target", "role=web", "--", "echo", "later",
        ],
    );
    assert_eq!(started.code, 0, "{started:?}");
    let job_id = serde_json::from_str::<serde_json::Value>(&started.stdout).unwrap()["job_id"]
        .as_str()
        .unwrap()
        .to_string();
    for i in [1, 2] {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let shown = svcctl(&members, i, &["-o", "json", "job", "show", &job_id]);
            let lines: Vec<serde_json::Value> = shown
                .stdout
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            let finished = lines
                .first()
                .is_some_and(|l| l["job"]["status"] == "finished");
            if shown.code == 0 && finished {
                let results: Vec<_> = lines
                    .iter()
                    .filter(|l| l.get("agent_id").is_some())
                    .collect();
                assert_eq!(results.len(), 2, "member {i}: {shown:?}");
                for result in results {
                    assert_eq!(result["stdout"], "later\n", "member {i}: {result}");
                }
                break;
            }
            assert!(Instant::now() < deadline, "member {i}: {shown:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // A plan past what a command carries: stored in the shared JetStream store by m2, its
    // chunks fetched by each agent from whichever member answers. Checked, not applied: both
    // agents run on this one host.
    let work = tempfile::tempdir().unwrap();
    let text = "cluster-wide content\n".repeat(20_000);
    let state_file = work.path().join("large.yaml");
    let plan = format!(
        "- file: {{path: {}/large, content: {}}}\n",
        work.path().display(),
        serde_json::to_string(&text).unwrap()
    );
    std::fs::write(&state_file, plan).unwrap();
    let checked = svcctl(
        &members,
        1,
        &[
            "-o",
            "json",
            "state",
            "check",
            state_file.to_str().unwrap(),
            "--target",
            "role=web",
        ],
    );
    let results = exec_results(&checked);
    assert_eq!(results.len(), 2, "{checked:?}");
    for result in results.values() {
        assert_eq!(result["status"], "changed", "{result}");
    }
    // Quarantined through m1: m2 and m3 know at once (NOTIFY), not at their next reload.
    let quarantined = svcctl(
        &members,
        0,
        &["agent", "quarantine", "web-2", "--reason", "test"],
    );
    assert_eq!(quarantined.code, 0, "{quarantined:?}");
    for i in [1, 2] {
        let sent = svcctl(
            &members,
            i,
            &[
                "-o", "json", "exec", "--target", "role=web", "--", "echo", "hi",
            ],
        );
        let results = exec_results(&sent);
        assert_eq!(results["web-1"]["status"], "ok", "member {i}: {sent:?}");
        assert_eq!(
            results["web-2"]["status"], "skipped",
            "member {i}: {sent:?}"
        );
    }
}

#[test]
fn the_audit_chain_stays_one_chain_with_every_member_writing() {
    let Some(nats) = Nats::start(3) else {
        return;
    };
    let Some(members) = three_members(&nats, FAST) else {
        return;
    };
    let members = std::sync::Arc::new(members);
    let writers: Vec<_> = (0..6)
        .map(|w| {
            let members = members.clone();
            std::thread::spawn(move || {
                let server = &members.servers[w % 3];
                for n in 0..10 {
                    let body = format!(r#"{{"name":"w{w}-{n}","role":"readonly"}}"#);
                    let created = server.request(
                        "POST",
                        "/api/v1/apikeys",
                        Some(&members.admin_key),
                        Some(&body),
                    );
                    assert_eq!(created.status, 201, "{}", created.body);
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    for i in 0..3 {
        let verified = run(members.servers[i].cli("svc-audit").args([
            "--api-key",
            &members.admin_key,
            "-o",
            "json",
            "verify",
        ]));
        assert_eq!(verified.code, 0, "member {i}: {verified:?}");
        let verified: serde_json::Value = serde_json::from_str(&verified.stdout).unwrap();
        assert_eq!(verified["ok"], true, "{verified}");
        assert!(verified["rows"].as_u64().unwrap() >= 60, "{verified}");
    }
}

#[test]
fn a_paused_leader_steps_down_and_never_leads_beside_the_new_one() {
    let Some(nats) = Nats::start(3) else {
        return;
    };
    let Some(members) = three_members(&nats, FAST) else {
        return;
    };
    let leader = members.wait_for_leader(0, "", Duration::from_secs(10));
    let paused = Members::index_of(&leader);
    let witness = (paused + 1) % 3;
    let pid = members.servers[paused].pid() as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let next = members.wait_for_leader(witness, &leader, Duration::from_secs(10));
    unsafe { libc::kill(pid, libc::SIGCONT) };
    // Back, the old leader finds its lease ran out and follows; the new one keeps leading.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !members.servers[paused].log().contains("stepped down") {
        assert!(
            Instant::now() < deadline,
            "{}",
            members.servers[paused].log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(600));
    for i in 0..3 {
        let status = members.cluster_json(i, &["status"]);
        assert_eq!(status["leader"], next.as_str(), "member {i}: {status}");
        let leaders = status["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "leader")
            .count();
        assert_eq!(leaders, 1, "{status}");
    }
}

fn events_json(members: &Members, i: usize, args: &[&str]) -> serde_json::Value {
    let listed = run(members.servers[i]
        .cli("svc-events")
        .args(["--api-key", &members.admin_key, "-o", "json"])
        .args(args));
    assert_eq!(listed.code, 0, "{listed:?}");
    serde_json::from_str(&listed.stdout).unwrap_or_else(|e| panic!("{e}: {}", listed.stdout))
}

#[test]
fn an_event_emitted_on_one_member_is_listed_replayed_and_live_on_another() {
    let Some(nats) = Nats::start(3) else { return };
    let Some(members) = three_members(&nats, FAST) else {
        return;
    };
    // A live subscriber on m3 before the emit on m1.
    let mut live = members.servers[2]
        .cli("svc-events")
        .args([
            "--api-key",
            &members.admin_key,
            "-o",
            "json",
            "subscribe",
            "--type",
            "command_dispatched",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let emitted = run(members.servers[0].cli("svc-events").args([
        "--api-key",
        &members.admin_key,
        "-o",
        "json",
        "emit",
        "--type",
        "command_dispatched",
        "--payload",
        r#"{"service":"web","version":"1.2.3"}"#,
    ]));
    assert_eq!(emitted.code, 0, "{emitted:?}");
    let event: serde_json::Value = serde_json::from_str(&emitted.stdout).unwrap();
    let id = event["id"].as_str().unwrap().to_string();

    let listed = events_json(&members, 1, &["list", "--type", "command_dispatched"]);
    let items = listed["items"]
        .as_array()
        .or(listed.as_array())
        .cloned()
        .unwrap_or_default();
    assert!(items.iter().any(|e| e["id"] == id.as_str()), "{listed}");
    let got = events_json(&members, 2, &["get", &id]);
    assert_eq!(got["payload"]["version"], "1.2.3", "{got}");

    let stdout = live.stdout.take().unwrap();
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let Ok(line) = received.recv_timeout(Duration::from_secs(10)) else {
        let _ = live.kill();
        let output = live.wait_with_output().unwrap();
        panic!(
            "the live subscriber on m3 did not receive the event emitted on m1: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    assert!(line.contains(&id), "{line}");
    let _ = live.kill();
    let _ = live.wait();
}

#[test]
fn the_service_continues_when_a_nats_node_dies() {
    let Some(mut nats) = Nats::start(3) else {
        return;
    };
    let Some(members) = three_members(&nats, FAST) else {
        return;
    };
    let emit = |i: usize, n: usize| {
        run(members.servers[i].cli("svc-events").args([
            "--api-key",
            &members.admin_key,
            "emit",
            "--type",
            "command_completed",
            "--payload",
            &format!(r#"{{"n":{n}}}"#),
        ]))
    };
    for i in 0..3 {
        assert_eq!(emit(i, i).code, 0);
    }
    nats.cluster.kill(0);
    // Members and JetStream (two of three replicas) carry on; a first call may wait out the
    // stream leader's election, so each is retried for a while.
    for i in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let sent = emit(i, 10 + i);
            if sent.code == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "member {i}: {sent:?}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    // Quorum holds with two of three nodes (a member on the dead node reconnects first).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = members.cluster_cli(1, &["status"]);
        if status.stdout.contains("\"quorum\": true") {
            break;
        }
        assert!(Instant::now() < deadline, "{status:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let listed = events_json(
        &members,
        2,
        &["list", "--type", "command_completed", "--limit", "100"],
    );
    // Every acknowledged emit is listed. A retried emit whose first try was stored but not
    // acknowledged (an election) is listed twice: the client retried, as at-least-once allows.
    let items = listed["items"]
        .as_array()
        .or(listed.as_array())
        .cloned()
        .unwrap_or_default();
    for n in [0, 1, 2, 10, 11, 12] {
        assert!(
            items.iter().any(|e| e["payload"]["n"] == n),
            "emit {n} lost: {listed}"
        );
    }
}

#[test]
fn killing_the_leader_under_write_load_loses_nothing_acknowledged() {
    let Some(nats) = Nats::start(3) else { return };
    let Some(mut members) = three_members(&nats, FAST) else {
        return;
    };
    let leader = members.wait_for_leader(0, "", Duration::from_secs(10));
    let victim = Members::index_of(&leader);
    let survivors: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acknowledged = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let errors = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let addresses: Vec<(std::net::SocketAddr, String)> = members
        .servers
        .iter()
        .map(|s| (s.http, s.admin_key.clone()))
        .collect();
    // Writers over REST: each audited key creation that answers 201 is acknowledged. A
    // writer that gets an error (its member died) retries the same name on the next member.
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (stop, acknowledged, errors, addresses) = (
                stop.clone(),
                acknowledged.clone(),
                errors.clone(),
                addresses.clone(),
            );
            std::thread::spawn(move || {
                let mut target = w % 3;
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let name = format!("w{w}-{n}");
                    let body = format!(r#"{{"name":"{name}","role":"readonly"}}"#);
                    let (address, key) = &addresses[target];
                    let bearer = format!("Bearer {key}");
                    let answer = common::http_request(
                        *address,
                        "POST",
                        "/api/v1/apikeys",
                        &[("Authorization", bearer.as_str())],
                        Some(body.as_bytes()),
                    );
                    match answer {
                        Ok(response) if response.status == 201 => {
                            acknowledged.lock().unwrap().push(name);
                            n += 1;
                        }
                        other => {
                            if errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
                                eprintln!("first error: {:?}", other.map(|r| (r.status, r.body)));
                            }
                            target = (target + 1) % 3;
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(800));
    members.servers[victim].stop_with(libc::SIGKILL);
    let next = members.wait_for_leader(survivors[0], &leader, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(800));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for writer in writers {
        writer.join().unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    let errors = errors.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "{} keys acknowledged, {errors} errors; {next} leads",
        acknowledged.len()
    );
    assert!(acknowledged.len() > 10, "{}", acknowledged.len());
    // A writer sees at most the request in flight at the kill fail (then moves on).
    assert!(errors <= 4 * 2, "{errors} errors");
    // Every acknowledged key is there, and its audit row, on a survivor; the chain verifies.
    let keys = members.servers[survivors[1]].request(
        "GET",
        "/api/v1/apikeys",
        Some(&members.admin_key),
        None,
    );
    for name in &acknowledged {
        assert!(
            keys.body.contains(&format!("\"{name}\"")),
            "key {name} lost"
        );
    }
    // Every page (a quiet machine acknowledges more keys than one page of 1000 holds).
    let mut audited = 0;
    let mut cursor = String::new();
    loop {
        let page = run(members.servers[survivors[0]].cli("svc-audit").args([
            "--api-key",
            &members.admin_key,
            "-o",
            "json",
            "log",
            "--action",
            "apikey.create",
            "--limit",
            "1000",
            "--cursor",
            &cursor,
        ]));
        assert_eq!(page.code, 0, "{page:?}");
        let page = common::json_of(&page);
        audited += page["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["outcome"] == "success")
            .count();
        match page["next_cursor"].as_str() {
            Some(next) if !next.is_empty() => cursor = next.to_string(),
            _ => break,
        }
    }
    assert!(
        audited >= acknowledged.len(),
        "{audited} audit rows for {} keys",
        acknowledged.len()
    );
    let verified = run(members.servers[survivors[1]].cli("svc-audit").args([
        "--api-key",
        &members.admin_key,
        "-o",
        "json",
        "verify",
    ]));
    assert_eq!(verified.code, 0, "{verified:?}");
}

/// A client of the NATS cluster logged in with a user JWT and its nkey (or anonymously when
/// None), and the errors the server sent it.
async fn nats_client(
    url: &str,
    login: Option<(String, String)>,
) -> Result<
    (
        async_nats::Client,
        tokio::sync::mpsc::UnboundedReceiver<String>,
    ),
    String,
> {
    let (errors, received) = tokio::sync::mpsc::unbounded_channel();
    let options = match login {
        Some((jwt, seed)) => {
            let key = std::sync::Arc::new(nkeys::KeyPair::from_seed(&seed).unwrap());
            async_nats::ConnectOptions::with_jwt(jwt, move |nonce| {
                let key = key.clone();
                async move { key.sign(&nonce).map_err(async_nats::AuthError::new) }
            })
        }
        None => async_nats::ConnectOptions::new(),
    }
    .max_reconnects(Some(1))
    .event_callback(move |event| {
        let errors = errors.clone();
        async move {
            if let async_nats::Event::ServerError(error) = event {
                let _ = errors.send(error.to_string());
            }
        }
    });
    let client = tokio::time::timeout(Duration::from_secs(5), options.connect(url))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    Ok((client, received))
}

/// A login with a bearer JWT (the enrolment JWT): any key signs the nonce, nobody checks it.
fn bearer(jwt: &str) -> (String, String) {
    (jwt.to_string(), nkeys::KeyPair::new_user().seed().unwrap())
}

/// Asserts the client's next server error is a permissions violation.
async fn assert_violation(errors: &mut tokio::sync::mpsc::UnboundedReceiver<String>, what: &str) {
    let error = next_error(errors).await;
    assert!(
        error.to_lowercase().contains("permissions violation"),
        "{what}: {error:?}"
    );
}

/// The next server error a client got, within a few seconds.
async fn next_error(errors: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(5), errors.recv())
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

#[test]
fn with_jwt_auth_the_nats_cluster_keeps_each_agent_to_its_own_subjects() {
    let Some(prepared) = cluster::prepare() else {
        return;
    };
    // The NATS nodes' block is made offline, before any member starts, from the store the
    // members will share: the keys are created there, sealed under the master key.
    let names = common::Names::new();
    let setup_dir = tempfile::tempdir().unwrap();
    let offline = cluster::member_yaml(
        &Setup {
            nats_urls: vec![vec!["nats://127.0.0.1:1".into()]],
            cluster_yaml: "",
            extra_yaml: "",
            bus_yaml: "  external_auth: jwt\n",
            prepared: None,
        },
        &prepared.database_url,
        0,
    );
    let offline_config = setup_dir.path().join("server.yaml");
    std::fs::write(
        &offline_config,
        format!(
            "data_dir: {}\nhmacsecret: test-hmac-secret\nmaster_key: {}\n{offline}",
            setup_dir.path().join("data").display(),
            prepared.master_key
        ),
    )
    .unwrap();
    let config_arg = offline_config.to_str().unwrap();
    let printed = run(names.command("svc-cluster").args([
        "-o",
        "json",
        "nats-config",
        "--config",
        config_arg,
    ]));
    assert_eq!(printed.code, 0, "{printed:?}");
    let printed: serde_json::Value = serde_json::from_str(&printed.stdout).unwrap();
    let block = printed["nats_config"].as_str().unwrap().to_string();
    assert!(block.contains("resolver: MEMORY"), "{block}");
    let enrol_jwt = printed["enrol_jwt"].as_str().unwrap().to_string();
    // Offline and idempotent: the second run reads the same keys. (The JWTs themselves carry
    // their issue time, so the keys are compared, not the text.)
    let again = run(names
        .command("svc-cluster")
        .args(["nats-config", "--config", config_arg]));
    assert_eq!(again.code, 0, "{again:?}");
    let account = printed["account"].as_str().unwrap();
    assert!(
        again.stdout.contains(account),
        "same account key: {}",
        again.stdout
    );
    let system_line = |block: &str| {
        block
            .lines()
            .find(|line| line.starts_with("system_account:"))
            .map(str::to_string)
    };
    assert!(system_line(&block).is_some(), "{block}");
    assert_eq!(
        system_line(&again.stdout),
        system_line(&block),
        "same system account"
    );
    let refused = run(names.command("svc-cluster").args([
        "nats-config",
        "--config",
        "/nonexistent/server.yaml",
    ]));
    assert_ne!(refused.code, 0, "{refused:?}");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let Some(nats) = runtime.block_on(NatsCluster::start_with_auth(3, &block)) else {
        return;
    };
    let urls_from = |first: usize| {
        let mut urls = nats.urls();
        urls.rotate_left(first);
        urls
    };
    let Some(members) = cluster::start(Setup {
        nats_urls: (0..3).map(urls_from).collect(),
        cluster_yaml: FAST,
        // Agents renew at half-life: every 3 s here, and nats-server drops a connection whose
        // JWT has expired, so the exec below runs on renewed JWTs.
        extra_yaml: "agents:\n  bus_jwt_ttl: 6s\n",
        bus_yaml: "  external_auth: jwt\n",
        prepared: Some(prepared),
    }) else {
        return;
    };
    let jwt_flag = ["--enrol-jwt", enrol_jwt.as_str()];
    let a = common::agent::Agent::start_on_with(
        &members.servers[0],
        &nats.url(1),
        "web-1",
        "role=web",
        &jwt_flag,
    );
    let _b = common::agent::Agent::start_on_with(
        &members.servers[2],
        &nats.url(2),
        "web-2",
        "role=web",
        &jwt_flag,
    );
    both_answer_hi(&members, 1, Duration::from_secs(15), &a.log());

    let read = |name: &str| std::fs::read_to_string(a.state_dir().join(name)).unwrap();
    let agent_login = (
        read("bus.jwt").trim().to_string(),
        read("bus.nk").trim().to_string(),
    );
    common::assert_private(&a.state_dir().join("bus.nk"));
    runtime.block_on(async {
        // No credential, or a JWT without its key: no connection at all.
        let anonymous = nats_client(&nats.url(0), None).await;
        assert!(anonymous.is_err(), "an anonymous client connected");
        let stolen = (
            agent_login.0.clone(),
            nkeys::KeyPair::new_user().seed().unwrap(),
        );
        assert!(
            nats_client(&nats.url(0), Some(stolen)).await.is_err(),
            "a JWT without its nkey connected"
        );

        // web-1's own credential: its own subjects only.
        let (client, mut errors) = nats_client(&nats.url(0), Some(agent_login.clone()))
            .await
            .unwrap();
        let _others = client.subscribe("svc.agent.web-2.cmd").await.unwrap();
        assert_violation(&mut errors, "subscribe").await;
        let _all = client.subscribe("svc.agent.>").await.unwrap();
        assert_violation(&mut errors, "subscribe").await;
        client
            .publish("svc.agent.web-2.result", "forged".into())
            .await
            .unwrap();
        client.flush().await.unwrap();
        assert_violation(&mut errors, "publish").await;
        let _own = client.subscribe("svc.agent.web-1.cmd").await.unwrap();
        client.flush().await.unwrap();
        assert_eq!(
            tokio::time::timeout(Duration::from_millis(500), errors.recv())
                .await
                .ok()
                .flatten(),
            None,
            "its own subject is allowed"
        );

        // Its own subjects are where a stolen session could still answer for it: a result
        // it did not sign, for a job that is running, is dropped by every member and audited
        // once (by the member whose job it is, the only one that checks it); the job gets
        // the real one.
        let started = svcctl(
            &members,
            1,
            &[
                "-o", "json", "exec", "--async", "--target", "web-1", "--", "sh", "-c",
                "sleep 2; echo real",
            ],
        );
        assert_eq!(started.code, 0, "{started:?}");
        let started: serde_json::Value = serde_json::from_str(&started.stdout).unwrap();
        let job_id = started["job_id"].as_str().unwrap().to_string();
        let forged = format!(
            r#"{{"job_id":"{job_id}","duration_ms":1,"kind":"exec","exit_code":0,"stdout":"forged\n"}}"#
        );
        client
            .publish("svc.agent.web-1.result", forged.into())
            .await
            .unwrap();
        client.flush().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let results = loop {
            let shown = svcctl(&members, 2, &["-o", "json", "job", "show", &job_id]);
            let lines: Vec<serde_json::Value> = shown
                .stdout
                .lines()
                .filter_map(|line| serde_json::from_str(line).ok())
                .collect();
            if lines.iter().any(|line| line["job"]["status"] == "finished") {
                break lines;
            }
            assert!(Instant::now() < deadline, "{shown:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let answer = results.iter().find(|line| line["agent_id"] == "web-1");
        assert_eq!(
            answer.map(|line| line["stdout"].clone()),
            Some(serde_json::json!("real\n")),
            "{results:?}"
        );
        let audit = run(members.servers[0].cli("svc-audit").args([
            "--api-key",
            &members.admin_key,
            "-o",
            "json",
            "log",
            "--action",
            "agent.result_forged",
        ]));
        assert_eq!(audit.code, 0, "{audit:?}");
        let audit: serde_json::Value = serde_json::from_str(&audit.stdout).unwrap();
        let rows = audit["items"].as_array().unwrap();
        assert_eq!(rows.len(), 1, "one row for the cluster: {rows:?}");
        assert_eq!(rows[0]["outcome"], "denied");
        assert_eq!(rows[0]["detail"]["job_id"], job_id.as_str());

        // The enrolment JWT may request enrolment and nothing else.
        let (enrolling, mut errors) = nats_client(&nats.url(0), Some(bearer(&enrol_jwt)))
            .await
            .unwrap();
        let _tokens = enrolling.subscribe("svc.enroll").await.unwrap();
        assert_violation(&mut errors, "enrolment JWT subscribe").await;
    });
    // API-key clients on the bus: a .creds file per role, made offline; the API key still
    // signs each file-service request.
    let creds_for = |role: &str| {
        let made = run(names.command("svc-cluster").args([
            "nats-config",
            "--config",
            config_arg,
            "--creds",
            role,
            "--name",
            "test",
        ]));
        assert_eq!(made.code, 0, "{made:?}");
        let path = setup_dir.path().join(format!("{role}.creds"));
        std::fs::write(&path, &made.stdout).unwrap();
        path
    };
    let operator_creds = creds_for("operator");
    let readonly_creds = creds_for("readonly");
    let payload = setup_dir.path().join("payload");
    std::fs::write(&payload, "through a JWT-mode cluster\n".repeat(1000)).unwrap();
    let files = |creds: &std::path::Path, args: &[&str]| {
        run(members.servers[0]
            .cli("svc-files")
            .env("SVC_NATS_URL", nats.url(2))
            .env("SVC_NATS_CREDS", creds)
            .env("SVC_API_KEY", &members.admin_key)
            .args(args))
    };
    let put = files(
        &operator_creds,
        &["put", payload.to_str().unwrap(), "docs/payload"],
    );
    assert_eq!(put.code, 0, "{put:?}");
    let back = setup_dir.path().join("back");
    let got = files(
        &readonly_creds,
        &["get", "docs/payload", back.to_str().unwrap()],
    );
    assert_eq!(got.code, 0, "{got:?}");
    assert_eq!(
        std::fs::read(&back).unwrap(),
        std::fs::read(&payload).unwrap()
    );
    // A readonly .creds may not even send a write, whatever key signs it.
    let refused = files(
        &readonly_creds,
        &["put", payload.to_str().unwrap(), "docs/other"],
    );
    assert_ne!(refused.code, 0, "{refused:?}");
    let without = run(members.servers[0]
        .cli("svc-files")
        .env("SVC_NATS_URL", nats.url(2))
        .env("SVC_API_KEY", &members.admin_key)
        .args(["stat", "docs/payload"]));
    assert_ne!(without.code, 0, "no .creds, no connection: {without:?}");

    // Past the JWTs' 6 s life: renewed (a later `iat`), and both agents still answer.
    let issued_at = |jwt: &str| {
        use base64::Engine;
        let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(jwt.trim().split('.').nth(1).unwrap())
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&claims).unwrap()["iat"]
            .as_i64()
            .unwrap()
    };
    let issued = issued_at(&agent_login.0);
    std::thread::sleep(Duration::from_secs(7));
    assert!(
        issued_at(&read("bus.jwt")) > issued,
        "bus.jwt not renewed\n{}",
        a.log()
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let sent = svcctl(
            &members,
            2,
            &["-o", "json", "exec", "--target", "role=web", "--", "true"],
        );
        let ok = exec_results(&sent)
            .values()
            .filter(|r| r["status"] == "ok")
            .count();
        if ok == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{sent:?}\n{}", a.log());
        std::thread::sleep(Duration::from_millis(300));
    }
    // A renewal must be signed by the agent's key: its (public) certificate alone gets nothing.
    runtime.block_on(async {
        let (enrolling, _) = nats_client(&nats.url(0), Some(bearer(&enrol_jwt)))
            .await
            .unwrap();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let forged = serde_json::json!({
            "certificate": read("cert.pem"),
            "bus_nkey": nkeys::KeyPair::new_user().public_key(),
            "issued_at_ms": now_ms,
            "signature": "AAAA",
        });
        let inbox = format!("svc.enroll.reply.{}", "x".repeat(22));
        let mut replies = enrolling.subscribe(format!("{inbox}.>")).await.unwrap();
        enrolling
            .publish_with_reply(
                "svc.enroll.renew",
                format!("{inbox}.1"),
                forged.to_string().into(),
            )
            .await
            .unwrap();
        let reply = tokio::time::timeout(
            Duration::from_secs(5),
            futures_util::StreamExt::next(&mut replies),
        )
        .await
        .unwrap()
        .unwrap();
        let reply: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
        assert_eq!(reply["error"]["code"], "unauthenticated", "{reply}");
        assert!(reply.get("bus_jwt").is_none(), "{reply}");
    });

    // The account signing key rotates with the CA: a rotation through a member adds the next
    // key to the block; retiring the previous one (offline) leaves the next alone. (What
    // nats-server makes of each block: the_account_signing_key_rotates_on_a_nats_server_...)
    let signing_keys = |block: &str| {
        let line = block
            .lines()
            .find(|line| line.trim_start().starts_with(account))
            .unwrap();
        let jwt = line.split_once(':').unwrap().1.trim();
        let claims = svc::bus::natsjwt::claims(jwt).unwrap();
        claims["nats"]["signing_keys"].as_array().unwrap().len()
    };
    assert_eq!(signing_keys(&block), 1);
    let rotated = run(members.servers[0].cli("svc-identity").args([
        "--api-key",
        &members.admin_key,
        "ca",
        "rotate-signing",
    ]));
    assert_eq!(rotated.code, 0, "{rotated:?}");
    let nats_config = |extra: &[&str]| {
        let printed = run(names
            .command("svc-cluster")
            .args(["nats-config", "--config", config_arg])
            .args(extra));
        assert_eq!(printed.code, 0, "{printed:?}");
        printed
    };
    assert_eq!(signing_keys(&nats_config(&[]).stdout), 2);
    let retired = nats_config(&["--retire-previous-signing-key"]);
    assert!(
        retired.stderr.contains("restart every member"),
        "{retired:?}"
    );
    assert_eq!(signing_keys(&retired.stdout), 1);
    let nothing = run(names.command("svc-cluster").args([
        "nats-config",
        "--config",
        config_arg,
        "--retire-previous-signing-key",
    ]));
    assert_ne!(nothing.code, 0, "{nothing:?}");
    let rows = run(members.servers[1].cli("svc-audit").args([
        "--api-key",
        &members.admin_key,
        "-o",
        "json",
        "log",
        "--action",
        "ca.rotate_signing",
    ]));
    assert!(rows.stdout.contains("nats_next_signing_key"), "{rows:?}");
}

/// Replaces node `i`'s svc block (its configuration from `previous` on) with `block` and
/// restarts it, as an operator does after `svc-cluster nats-config`.
async fn reload_with(nats: &mut NatsCluster, i: usize, previous: &str, block: &str) {
    let path = nats.dir().join(nats.name(i)).join("nats.conf");
    let config = std::fs::read_to_string(&path).unwrap();
    let start = config
        .find(previous)
        .expect("the svc block is in the configuration");
    std::fs::write(&path, format!("{}{block}\n", &config[..start])).unwrap();
    nats.restart(i).await;
}

#[test]
fn the_account_signing_key_rotates_on_a_nats_server_with_a_memory_resolver() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        use svc::identity::nats;
        let dir = tempfile::tempdir().unwrap();
        let store = svc::store::SqliteStore::open(&dir.path().join("svc.db")).unwrap();
        let keys = svc::identity::Keys::new([9; 32], b"secret".to_vec());
        let user = nkeys::KeyPair::new_user();
        let seed = user.seed().unwrap();
        let login = |keys: &nats::NatsKeys| {
            let jwt = nats::agent_jwt(keys, "a1", &user.public_key()).unwrap();
            (jwt, seed.clone())
        };
        let connects = |url: String, login: (String, String)| async move {
            nats_client(&url, Some(login)).await.is_ok()
        };

        let first = nats::ensure(&store, &keys).await.unwrap();
        let block_1 = nats::server_config(&first).unwrap();
        let Some(mut cluster) = NatsCluster::start_with_auth(1, &block_1).await else {
            return;
        };
        let old_jwt = login(&first);
        assert!(connects(cluster.url(0), old_jwt.clone()).await);

        // 1. The CA rotation's next key: listed in the new block, not signing yet.
        let next = nats::add_next_signing_key(&store, &keys).await.unwrap();
        assert!(next.is_some());
        let during = nats::ensure(&store, &keys).await.unwrap();
        let block_2 = nats::server_config(&during).unwrap();
        reload_with(&mut cluster, 0, "# svc: NATS JWT", &block_2).await;
        assert!(connects(cluster.url(0), old_jwt.clone()).await);
        assert!(connects(cluster.url(0), login(&during)).await);

        // 2. Retired: the next signs, and the nodes (still on block 2) take both.
        let retired = nats::retire_previous_signing_key(&store).await.unwrap();
        assert_eq!(retired.len(), 1);
        let after = nats::ensure(&store, &keys).await.unwrap();
        let new_jwt = login(&after);
        assert_ne!(
            svc::bus::natsjwt::claims(&new_jwt.0).unwrap()["iss"],
            svc::bus::natsjwt::claims(&old_jwt.0).unwrap()["iss"],
        );
        assert!(connects(cluster.url(0), new_jwt.clone()).await);
        assert!(connects(cluster.url(0), old_jwt.clone()).await);

        // 3. The block with the next key alone: what the old key signed no longer connects.
        let block_3 = nats::server_config(&after).unwrap();
        reload_with(&mut cluster, 0, "# svc: NATS JWT", &block_3).await;
        assert!(connects(cluster.url(0), new_jwt).await);
        assert!(!connects(cluster.url(0), old_jwt).await);
    });
}
