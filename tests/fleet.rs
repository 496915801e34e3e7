//! The fleet end to end: real `svc-agent` daemons enrolled over the bus and running on
//! loopback, driven through `svcctl agent|exec|state` against a real server. Covers
//! selectors, streaming results and exit codes, quarantine, disconnect detection, events and
//! audit rows, forged results over raw NATS, and the agent's own command line.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::{agent_session, audit_rows, bus_socket, run, Options, Run, TestServer};

fn json(result: &Run) -> serde_json::Value {
    serde_json::from_str(&result.stdout).unwrap_or_else(|e| panic!("{e}: {result:?}"))
}

/// JSON Lines output: every line parsed.
fn json_lines(result: &Run) -> Vec<serde_json::Value> {
    result
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {result:?}")))
        .collect()
}

fn svcctl(server: &TestServer, key: &str, args: &[&str]) -> Run {
    run(server.cli("svcctl").args(["--api-key", key]).args(args))
}

/// The agents' states, by id, from `svcctl agent list -o json`.
fn states(server: &TestServer) -> std::collections::BTreeMap<String, String> {
    let listed = svcctl(server, &server.admin_key, &["-o", "json", "agent", "list"]);
    assert_eq!(listed.code, 0, "{listed:?}");
    json(&listed)
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["id"].as_str().unwrap().to_string(),
                a["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn wait_for_state(server: &TestServer, id: &str, state: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = states(server);
        if now.get(id).map(String::as_str) == Some(state) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{id} not {state} within {within:?}: {now:?}\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until at least one event of `types` is stored: events are emitted off the
/// path that changes state, so the state can be visible a moment before its event.
fn wait_for_events(
    server: &TestServer,
    types: &[&str],
    within: Duration,
) -> Vec<(String, String, serde_json::Value)> {
    let deadline = Instant::now() + within;
    loop {
        let found = events(server, types);
        if !found.is_empty() {
            return found;
        }
        assert!(Instant::now() < deadline, "no {types:?} within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Events of `types` (comma list) as (type, source, payload).
fn events(server: &TestServer, types: &[&str]) -> Vec<(String, String, serde_json::Value)> {
    let mut args = vec!["-o", "json", "list", "--limit", "1000"];
    for t in types {
        args.extend(["--type", t]);
    }
    let listed = run(server
        .cli("svc-events")
        .args(["--api-key", &server.admin_key])
        .args(&args));
    assert_eq!(listed.code, 0, "{listed:?}");
    json(&listed)["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_string(),
                e["source"].as_str().unwrap().to_string(),
                e["payload"].clone(),
            )
        })
        .collect()
}

fn by_agent(
    results: &[serde_json::Value],
) -> std::collections::BTreeMap<String, serde_json::Value> {
    results
        .iter()
        .filter(|r| r.get("agent_id").is_some())
        .map(|r| (r["agent_id"].as_str().unwrap().to_string(), r.clone()))
        .collect()
}

#[test]
fn exec_across_three_agents_with_selectors_events_and_audit() {
    let server = TestServer::start();
    let agents = [
        Agent::start(&server, "web-01", "role=web,env=prod"),
        Agent::start(&server, "web-02", "role=web,env=test"),
        Agent::start(&server, "db-01", "role=db,env=prod"),
    ];
    for agent in &agents {
        wait_for_state(&server, &agent.id, "connected", Duration::from_secs(10));
    }
    let (_, operator) = server.create_key("ops", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");

    // Labels: only the web agents, each with its own output.
    let web = svcctl(
        &server,
        &operator,
        &[
            "-o",
            "json",
            "exec",
            "--target",
            "role=web",
            "--",
            "sh",
            "-c",
            "echo $0-ok",
            "x",
        ],
    );
    assert_eq!(web.code, 0, "{web:?}");
    let lines = json_lines(&web);
    let results = by_agent(&lines);
    assert_eq!(
        results.keys().collect::<Vec<_>>(),
        ["web-01", "web-02"],
        "{web:?}"
    );
    for result in results.values() {
        assert_eq!(result["status"], "ok", "{result}");
        assert_eq!(result["exit_code"], 0);
        assert_eq!(result["stdout"], "x-ok\n");
    }
    let summary = &lines.last().unwrap()["summary"];
    assert_eq!(summary["agents"], 2, "{summary}");
    assert_eq!(summary["ok"], 2, "{summary}");

    // A glob and a comma list; one agent fails, so the exit code is 1 and the table says so.
    let mixed = svcctl(
        &server,
        &operator,
        &[
            "exec",
            "--target",
            "db-*,web-02",
            "--",
            "sh",
            "-c",
            "exit 4",
        ],
    );
    assert_eq!(mixed.code, 1, "{mixed:?}");
    assert!(
        mixed.stdout.contains("== db-01  failed  exit 4"),
        "{mixed:?}"
    );
    assert!(
        mixed.stdout.contains("== web-02  failed  exit 4"),
        "{mixed:?}"
    );
    assert!(!mixed.stdout.contains("web-01"), "{mixed:?}");
    assert!(mixed.stderr.contains("2 agents: 2 failed"), "{mixed:?}");

    // Every agent, stderr captured, a program that does not exist, and a timeout.
    let all = svcctl(
        &server,
        &operator,
        &["-o", "json", "exec", "--", "sh", "-c", "echo oops >&2"],
    );
    assert_eq!(all.code, 0, "{all:?}");
    let results = by_agent(&json_lines(&all));
    assert_eq!(results.len(), 3, "{all:?}");
    assert!(results.values().all(|r| r["stderr"] == "oops\n"));
    let missing = svcctl(
        &server,
        &operator,
        &[
            "-o",
            "json",
            "exec",
            "-t",
            "web-01",
            "--",
            "/no/such/program",
        ],
    );
    assert_eq!(missing.code, 1, "{missing:?}");
    let result = &json_lines(&missing)[0];
    assert_eq!(result["exit_code"], 127, "{result}");
    assert!(result["error"]
        .as_str()
        .unwrap()
        .contains("/no/such/program"));
    let started = Instant::now();
    let slow = svcctl(
        &server,
        &operator,
        &[
            "-o",
            "json",
            "exec",
            "-t",
            "web-01",
            "--timeout",
            "500ms",
            "--",
            "sleep",
            "30",
        ],
    );
    assert_eq!(slow.code, 1, "{slow:?}");
    assert_eq!(json_lines(&slow)[0]["status"], "timed_out", "{slow:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    // Concurrency 1 still reaches everyone.
    let serial = svcctl(
        &server,
        &operator,
        &["-o", "json", "exec", "--concurrency", "1", "--", "true"],
    );
    assert_eq!(serial.code, 0, "{serial:?}");
    assert_eq!(by_agent(&json_lines(&serial)).len(), 3);

    // Refusals: readonly, no command, a selector that matches nothing, a malformed one.
    let refused = svcctl(&server, &readonly, &["exec", "--", "true"]);
    assert_eq!(refused.code, 4, "{refused:?}");
    assert_eq!(svcctl(&server, &operator, &["exec"]).code, 2);
    let nothing = svcctl(&server, &operator, &["exec", "-t", "mail-*", "--", "true"]);
    assert_eq!(nothing.code, 5, "{nothing:?}");
    assert!(
        nothing
            .stderr
            .contains("no enrolled agent matches 'mail-*'"),
        "{nothing:?}"
    );
    let malformed = svcctl(
        &server,
        &operator,
        &["exec", "-t", "role=web,db-01", "--", "true"],
    );
    assert_eq!(malformed.code, 2, "a usage error: {malformed:?}");
    assert!(malformed.stderr.contains("invalid target"), "{malformed:?}");

    // Events carry the agent as source; one audit row per exec, refused ones included (the
    // malformed selector never reached the server: a usage error).
    let job_events = events(
        &server,
        &["command_dispatched", "command_completed", "command_failed"],
    );
    let count = |kind: &str, source: &str| {
        job_events
            .iter()
            .filter(|(t, s, _)| t == kind && s == source)
            .count()
    };
    assert_eq!(count("command_dispatched", "web-01"), 5, "{job_events:?}");
    assert_eq!(count("command_completed", "web-01"), 3, "{job_events:?}");
    assert_eq!(count("command_failed", "web-01"), 2, "{job_events:?}");
    assert_eq!(count("command_failed", "db-01"), 1, "{job_events:?}");
    let rows = audit_rows(&server, &["--action", "exec.run", "--limit", "100"]);
    let outcome = |o: &str| rows.iter().filter(|r| r["outcome"] == o).count();
    assert_eq!(
        (outcome("success"), outcome("denied"), outcome("error")),
        (6, 1, 1),
        "{rows:?}"
    );
    assert!(rows
        .iter()
        .any(|r| r["detail"]["argv"][0] == "/no/such/program"));
}

#[test]
fn quarantine_blocks_commands_and_heartbeats_until_lifted() {
    let server = TestServer::start();
    let web1 = Agent::start(&server, "web-01", "role=web");
    let web2 = Agent::start(&server, "web-02", "role=web");
    for agent in [&web1, &web2] {
        wait_for_state(&server, &agent.id, "connected", Duration::from_secs(10));
    }
    let (_, operator) = server.create_key("ops", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");

    assert_eq!(
        svcctl(&server, &readonly, &["agent", "quarantine", "web-02"]).code,
        4
    );
    assert_eq!(
        svcctl(&server, &operator, &["agent", "quarantine", "nope"]).code,
        5
    );
    let quarantined = svcctl(
        &server,
        &operator,
        &[
            "-o",
            "json",
            "agent",
            "quarantine",
            "web-02",
            "--reason",
            "disk image tampered",
        ],
    );
    assert_eq!(quarantined.code, 0, "{quarantined:?}");
    let record = json(&quarantined);
    assert_eq!(record["state"], "quarantined", "{record}");
    assert_eq!(record["quarantine_reason"], "disk image tampered");

    // No command reaches it; the other agent still runs.
    let marks = tempfile::tempdir().unwrap();
    let marker = marks.path().join("web-02");
    let touched = format!("touch {}/$SVC_AGENT_ID", marks.path().display());
    let exec = svcctl(
        &server,
        &operator,
        &["-o", "json", "exec", "--", "sh", "-c", &touched],
    );
    // A targeted agent that did not run the command fails the run, and the summary says why.
    assert_eq!(exec.code, 1, "a skipped agent did not run it: {exec:?}");
    assert!(
        exec.stderr.contains("not run on web-02 (quarantined)"),
        "{exec:?}"
    );
    let lines = json_lines(&exec);
    let results = by_agent(&lines);
    assert_eq!(results["web-02"]["status"], "skipped", "{exec:?}");
    assert_eq!(results["web-01"]["status"], "ok", "{exec:?}");
    let summary = &lines.last().unwrap()["summary"];
    assert_eq!(summary["skipped"], 1, "{summary}");
    assert_eq!(summary["not_run"][0], "web-02 (quarantined)", "{summary}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!marker.exists(), "a quarantined agent ran a command");

    // Every target skipped: nothing ran, which is not a success (exec and state alike).
    let only = svcctl(&server, &operator, &["exec", "-t", "web-02", "--", "true"]);
    assert_eq!(only.code, 1, "{only:?}");
    assert!(only.stderr.contains("1 agent: 1 skipped"), "{only:?}");
    assert!(
        only.stderr
            .contains("nothing ran; not run on web-02 (quarantined)"),
        "{only:?}"
    );
    let state_file = marks.path().join("state.yaml");
    std::fs::write(
        &state_file,
        format!("- directory: {{path: {}/d}}\n", marks.path().display()),
    )
    .unwrap();
    for operation in ["check", "apply"] {
        let state = svcctl(
            &server,
            &operator,
            &[
                "state",
                operation,
                state_file.to_str().unwrap(),
                "-t",
                "web-02",
            ],
        );
        assert_eq!(state.code, 1, "{operation}: {state:?}");
        assert!(
            state
                .stderr
                .contains("nothing ran; not run on web-02 (quarantined)"),
            "{operation}: {state:?}"
        );
    }
    assert!(!marks.path().join("d").exists());

    // Its heartbeats are rejected, and say so in events.
    wait_for_events(
        &server,
        &["agent_heartbeat_rejected"],
        Duration::from_secs(5),
    );
    let show = json(&svcctl(
        &server,
        &readonly,
        &["-o", "json", "agent", "show", "web-02"],
    ));
    assert_eq!(show["state"], "quarantined", "{show}");
    assert_eq!(states(&server)["web-01"], "connected");

    // Lifted: commands reach it again.
    let lifted = svcctl(
        &server,
        &operator,
        &["-o", "json", "agent", "unquarantine", "web-02"],
    );
    assert_eq!(lifted.code, 0, "{lifted:?}");
    assert_eq!(json(&lifted)["quarantine_reason"], serde_json::Value::Null);
    wait_for_state(&server, "web-02", "connected", Duration::from_secs(5));
    let exec = svcctl(
        &server,
        &operator,
        &["exec", "-t", "web-02", "--", "sh", "-c", &touched],
    );
    assert_eq!(exec.code, 0, "{exec:?}");
    assert!(marker.exists(), "{exec:?}\n{}", web2.log());

    // The reconnection is announced by its next heartbeat (every 200 ms).
    let deadline = Instant::now() + Duration::from_secs(5);
    let sequence = loop {
        let sequence: Vec<String> = events(
            &server,
            &[
                "agent_quarantined",
                "agent_unquarantined",
                "agent_connected",
            ],
        )
        .into_iter()
        .filter(|(_, source, _)| source == "web-02")
        .map(|(t, _, _)| t)
        .collect();
        if sequence.len() >= 4 || Instant::now() > deadline {
            break sequence;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        sequence,
        [
            "agent_connected",
            "agent_quarantined",
            "agent_unquarantined",
            "agent_connected"
        ]
    );
    let rows = audit_rows(
        &server,
        &["--action", "agent.*", "--resource-type", "agent"],
    );
    let actions: Vec<(&str, &str)> = rows
        .iter()
        .filter(|r| r["action"] != "agent.enroll" && r["action"] != "agent.psk")
        .map(|r| {
            (
                r["action"].as_str().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("agent.unquarantine", "success"),
            ("agent.quarantine", "success"),
            ("agent.quarantine", "error"),
            ("agent.quarantine", "denied"),
        ],
        "{rows:?}"
    );
}

#[test]
fn an_unquarantined_agent_that_kept_heartbeating_takes_commands_at_once() {
    let server = TestServer::start_with(Options {
        config_yaml: "agents:\n  heartbeat_timeout: 1s\n".into(),
        ..Options::default()
    });
    let web2 = Agent::start(&server, "web-2", "role=web");
    wait_for_state(&server, "web-2", "connected", Duration::from_secs(10));
    let (_, operator) = server.create_key("ops", "operator");

    let quarantined = svcctl(&server, &operator, &["agent", "quarantine", "web-2"]);
    assert_eq!(quarantined.code, 0, "{quarantined:?}");
    // Well past the heartbeat timeout: its heartbeats are rejected, but it is still alive.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(states(&server)["web-2"], "quarantined");

    let lifted = svcctl(
        &server,
        &operator,
        &["-o", "json", "agent", "unquarantine", "web-2"],
    );
    assert_eq!(lifted.code, 0, "{lifted:?}");
    assert_eq!(json(&lifted)["state"], "connected", "{lifted:?}");
    let exec = svcctl(
        &server,
        &operator,
        &["-o", "json", "exec", "--target", "web-2", "--", "true"],
    );
    assert_eq!(exec.code, 0, "{exec:?}");
    assert_eq!(json_lines(&exec)[0]["status"], "ok", "{exec:?}");
    // Never reported as disconnected while it was quarantined.
    assert!(events(&server, &["agent_disconnected"]).is_empty());
    // Logs written to files carry no colour codes (neither the server's nor the agent's).
    assert!(web2.log().contains("INFO"), "{}", web2.log());
    assert!(!web2.log().contains("\x1b["), "{:?}", web2.log());
    assert!(!server.log().contains("\x1b["), "{:?}", server.log());
}

/// The agents' labels, by id, from `svcctl agent list -o json`.
fn labels(server: &TestServer) -> std::collections::BTreeMap<String, serde_json::Value> {
    let listed = svcctl(server, &server.admin_key, &["-o", "json", "agent", "list"]);
    assert_eq!(listed.code, 0, "{listed:?}");
    json(&listed)
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["id"].as_str().unwrap().to_string(), a["labels"].clone()))
        .collect()
}

/// The agent ids a `--target` runs on (exec of `true`).
fn exec_targets(server: &TestServer, key: &str, target: &str) -> (i32, Vec<String>) {
    let result = svcctl(
        server,
        key,
        &["-o", "json", "exec", "--target", target, "--", "true"],
    );
    let ids = result
        .stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|line| line["agent_id"].as_str().map(String::from))
        .collect();
    (result.code, ids)
}

#[test]
fn labels_from_agent_yaml_are_enrolled_and_can_be_changed_later() {
    let server = TestServer::start();
    // Labels written in agent.yaml before bootstrap are enrolled (no --labels) ...
    let mut web = Agent::new("web-1");
    let config = std::fs::read_to_string(web.config()).unwrap();
    std::fs::write(
        web.config(),
        format!("{config}  labels:\n    role: web\n    tier: 1\n"),
    )
    .unwrap();
    let enrolled = web.bootstrap(&server, &["--server", &server.bus]);
    assert_eq!(enrolled.code, 0, "{enrolled:?}");
    let written = std::fs::read_to_string(web.config()).unwrap();
    assert!(written.contains("role: web"), "{written}");
    web.spawn(&server.names);
    // ... and --labels replaces them, in the file too.
    let mut db = Agent::new("db-1");
    let config = std::fs::read_to_string(db.config()).unwrap();
    std::fs::write(db.config(), format!("{config}  labels:\n    role: web\n")).unwrap();
    let enrolled = db.bootstrap(&server, &["--server", &server.bus, "--labels", "role=db"]);
    assert_eq!(enrolled.code, 0, "{enrolled:?}");
    let written = std::fs::read_to_string(db.config()).unwrap();
    assert!(
        written.contains("role: db") && !written.contains("role: web"),
        "{written}"
    );
    db.spawn(&server.names);
    for id in ["web-1", "db-1"] {
        wait_for_state(&server, id, "connected", Duration::from_secs(10));
    }
    let now = labels(&server);
    assert_eq!(
        now["web-1"],
        serde_json::json!({"role": "web", "tier": "1"})
    );
    assert_eq!(now["db-1"], serde_json::json!({"role": "db"}));
    let (_, operator) = server.create_key("ops", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    assert_eq!(
        exec_targets(&server, &operator, "role=web"),
        (0, vec!["web-1".to_string()])
    );

    // svcctl agent label: set, replace and remove; the target matches at once.
    let labelled = svcctl(
        &server,
        &operator,
        &[
            "-o", "json", "agent", "label", "db-1", "role=web", "env=prod",
        ],
    );
    assert_eq!(labelled.code, 0, "{labelled:?}");
    assert_eq!(
        json(&labelled)["labels"],
        serde_json::json!({"role": "web", "env": "prod"})
    );
    let (code, mut ids) = exec_targets(&server, &operator, "role=web");
    ids.sort();
    assert_eq!(
        (code, ids),
        (0, vec!["db-1".to_string(), "web-1".to_string()])
    );
    let removed = svcctl(
        &server,
        &operator,
        &[
            "-o", "json", "agent", "label", "web-1", "tier-", "--remove", "role",
        ],
    );
    assert_eq!(removed.code, 0, "{removed:?}");
    assert_eq!(json(&removed)["labels"], serde_json::json!({}));
    assert_eq!(
        exec_targets(&server, &operator, "role=web"),
        (0, vec!["db-1".to_string()])
    );

    // Refusals: readonly (4), unknown agent (5), malformed changes (2, before connecting).
    let denied = svcctl(&server, &readonly, &["agent", "label", "db-1", "x=y"]);
    assert_eq!(denied.code, 4, "{denied:?}");
    let unknown = svcctl(&server, &operator, &["agent", "label", "nope", "x=y"]);
    assert_eq!(unknown.code, 5, "{unknown:?}");
    for bad in [&["db-1"][..], &["db-1", "novalue"], &["db-1", "a,b=c"]] {
        let mut args = vec!["agent", "label"];
        args.extend(bad);
        let refused = svcctl(&server, &operator, &args);
        assert_eq!(refused.code, 2, "{bad:?}: {refused:?}");
    }
    assert_eq!(
        labels(&server)["db-1"],
        serde_json::json!({"role": "web", "env": "prod"})
    );

    // Audited, refused ones too.
    let rows = audit_rows(&server, &["--action", "agent.label"]);
    let outcomes: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["resource_id"].as_str().unwrap_or_default(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("nope", "error"),
            ("db-1", "denied"),
            ("web-1", "success"),
            ("db-1", "success"),
        ],
        "{rows:?}"
    );
    assert_eq!(
        rows[3]["detail"]["after"],
        serde_json::json!({"role": "web", "env": "prod"})
    );
    assert_eq!(
        rows[3]["detail"]["before"],
        serde_json::json!({"role": "db"})
    );
}

/// The agent ids `svcctl agent list --target` shows.
fn listed_ids(server: &TestServer, target: &str) -> Vec<String> {
    let listed = svcctl(
        server,
        &server.admin_key,
        &["-o", "json", "agent", "list", "--target", target],
    );
    assert_eq!(listed.code, 0, "{listed:?}");
    json(&listed)
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn agents_report_facts_shown_selected_and_kept_across_a_restart() {
    let mut server = TestServer::start();
    // A label named like a fact: `os` selects the fact, `label.os` the label.
    let mut web = Agent::start(&server, "web-01", "role=web,os=custom");
    wait_for_state(&server, "web-01", "connected", Duration::from_secs(10));
    let host = svc::facts::collect();
    let family = host["os_family"].as_str().unwrap();

    // The first heartbeat carried the facts: connected means they are in.
    let shown = svcctl(
        &server,
        &server.admin_key,
        &["-o", "json", "agent", "show", "web-01"],
    );
    assert_eq!(shown.code, 0, "{shown:?}");
    let facts = json(&shown)["facts"].clone();
    for name in svc::facts::NAMES {
        assert!(facts.get(name).is_some(), "no {name}: {facts}");
    }
    for name in [
        "os",
        "os_family",
        "os_release",
        "arch",
        "kernel",
        "hostname",
        "cpus",
    ] {
        assert_eq!(facts[name], host[name], "{name}: {facts}");
    }
    assert!(facts["ip_addresses"].is_array(), "{facts}");
    assert!(facts["memory_mb"].as_u64().unwrap() > 0, "{facts}");
    let table = svcctl(&server, &server.admin_key, &["agent", "show", "web-01"]);
    assert_eq!(table.code, 0, "{table:?}");
    assert!(table.stdout.contains("FACT"), "{table:?}");
    assert!(
        table
            .stdout
            .lines()
            .any(|line| line.starts_with("os_family ") && line.trim_end().ends_with(family)),
        "{table:?}"
    );
    // REST shows them too.
    let rest = server.request(
        "GET",
        "/api/v1/agents/web-01",
        Some(&server.admin_key),
        None,
    );
    assert_eq!(rest.status, 200, "{}", rest.body);
    let rest: serde_json::Value = serde_json::from_str(&rest.body).unwrap();
    assert_eq!(rest["facts"]["os_family"], family, "{rest}");

    // Selectors on facts, beside labels and alone.
    let (_, operator) = server.create_key("ops", "operator");
    let own = format!("os_family={family}");
    assert_eq!(
        exec_targets(&server, &operator, &own),
        (0, vec!["web-01".to_string()])
    );
    let arch = format!("role=web,arch={}", host["arch"].as_str().unwrap());
    assert_eq!(
        exec_targets(&server, &operator, &arch),
        (0, vec!["web-01".to_string()])
    );
    let nothing = svcctl(
        &server,
        &operator,
        &["exec", "--target", "os_family=nonexistent", "--", "true"],
    );
    assert_eq!(nothing.code, 5, "{nothing:?}");
    assert!(listed_ids(&server, "os_family=nonexistent").is_empty());
    assert_eq!(listed_ids(&server, &own), ["web-01"]);
    assert_eq!(listed_ids(&server, "label.os=custom"), ["web-01"]);
    assert!(listed_ids(&server, "os=custom").is_empty());
    assert_eq!(listed_ids(&server, "fact.os_family=nonexistent").len(), 0);

    // Stored: with the agent gone, a restarted server still shows and selects them.
    web.stop();
    assert_eq!(server.stop_with(libc::SIGTERM), Some(0), "{}", server.log());
    server.spawn(&[]);
    let shown = svcctl(
        &server,
        &server.admin_key,
        &["-o", "json", "agent", "show", "web-01"],
    );
    assert_eq!(shown.code, 0, "{shown:?}");
    assert_eq!(json(&shown)["facts"], facts, "{shown:?}");
    assert_eq!(listed_ids(&server, &own), ["web-01"]);
}

#[test]
fn silent_agents_are_reported_disconnected_after_the_timeout() {
    let server = TestServer::start_with(Options {
        config_yaml: "agents:\n  heartbeat_timeout: 1s\n".into(),
        ..Options::default()
    });
    let mut agent = Agent::start(&server, "web-01", "role=web");
    wait_for_state(&server, "web-01", "connected", Duration::from_secs(10));
    let (_, operator) = server.create_key("ops", "operator");

    agent.stop();
    let stopped = Instant::now();
    wait_for_state(&server, "web-01", "disconnected", Duration::from_secs(5));
    let took = stopped.elapsed();
    assert!(took >= Duration::from_millis(700), "too early: {took:?}");
    let gone = wait_for_events(&server, &["agent_disconnected"], Duration::from_secs(5));
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert_eq!(gone[0].1, "web-01");
    assert!(gone[0].2["last_heartbeat_at"].is_string(), "{gone:?}");

    // A disconnected agent is reported unreachable at once, not after the timeout.
    let started = Instant::now();
    let exec = svcctl(&server, &operator, &["-o", "json", "exec", "--", "true"]);
    assert_eq!(exec.code, 1, "{exec:?}");
    assert_eq!(json_lines(&exec)[0]["status"], "unreachable", "{exec:?}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // It comes back by itself when it heartbeats again.
    agent.spawn(&server.names);
    wait_for_state(&server, "web-01", "connected", Duration::from_secs(10));
    let metrics = server.request("GET", "/metrics", None, None).body;
    assert!(
        metrics.contains("svc_agents{state=\"connected\"} 1"),
        "{metrics}"
    );
}

#[test]
fn agents_cannot_answer_for_each_other_or_take_commands_meant_for_others() {
    let server = TestServer::start();
    let web1 = Agent::start(&server, "web-01", "role=web");
    let web2 = Agent::start(&server, "web-02", "role=web");
    for agent in [&web1, &web2] {
        wait_for_state(&server, &agent.id, "connected", Duration::from_secs(10));
    }
    let forged = r#"{"job_id":"x","duration_ms":1,"kind":"exec","exit_code":0,"stdout":"forged"}"#;
    let ops = format!(
        "PUB svc.agent.web-02.result {len}\r\n{forged}\r\nPUB svc.agent.web-02.heartbeat 2\r\n{{}}\r\n\
         SUB svc.agent.web-02.cmd 1\r\nSUB svc.agent.*.cmd 2\r\nPUB _INBOX.abcdefghijklmnopqrstuv 1\r\nx\r\n",
        len = forged.len()
    );
    let refused = agent_session(&server, &web1.home.path().join("state"), &ops);
    assert_eq!(
        refused,
        [
            "-ERR 'Permissions Violation for Publish to \"svc.agent.web-02.result\"'",
            "-ERR 'Permissions Violation for Publish to \"svc.agent.web-02.heartbeat\"'",
            "-ERR 'Permissions Violation for Subscription to \"svc.agent.web-02.cmd\"'",
            "-ERR 'Permissions Violation for Subscription to \"svc.agent.*.cmd\"'",
            "-ERR 'Permissions Violation for Publish to \"_INBOX.abcdefghijklmnopqrstuv\"'",
            "PONG",
        ]
    );
    // An operator key may not command agents directly on the bus either (only through the
    // server, which audits).
    let (_, operator) = server.create_key("ops", "operator");
    let stream = TcpStream::connect(bus_socket(&server.bus)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut info = String::new();
    reader.read_line(&mut info).unwrap();
    let mut writer = stream;
    let connect = serde_json::json!({"verbose": false, "auth_token": operator});
    write!(
        writer,
        "CONNECT {connect}\r\nPUB svc.agent.web-01.cmd 2\r\n{{}}\r\nPING\r\n"
    )
    .unwrap();
    assert_eq!(
        common::lines_until_pong(&mut reader),
        [
            "-ERR 'Permissions Violation for Publish to \"svc.agent.web-01.cmd\"'",
            "PONG"
        ]
    );
    // Garbage on an agent's own result subject is ignored; the agents keep working.
    let garbage = agent_session(
        &server,
        &web1.home.path().join("state"),
        "PUB svc.agent.web-01.result 9\r\nnot json!\r\n",
    );
    assert_eq!(garbage, ["PONG"]);
    let exec = svcctl(
        &server,
        &operator,
        &["-o", "json", "exec", "--", "echo", "fine"],
    );
    assert_eq!(exec.code, 0, "{exec:?}");
    assert!(by_agent(&json_lines(&exec))
        .values()
        .all(|r| r["stdout"] == "fine\n"));
}

/// `svcctl exec --async` of `argv`: the job id.
fn exec_async(server: &TestServer, key: &str, argv: &[&str]) -> String {
    let started = svcctl(
        server,
        key,
        &[&["-o", "json", "exec", "--async", "--"], argv].concat(),
    );
    assert_eq!(started.code, 0, "{started:?}");
    json(&started)["job_id"].as_str().unwrap().to_string()
}

/// `svcctl job show ID` until the job is finished: its results.
fn job_results(server: &TestServer, key: &str, id: &str) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shown = svcctl(server, key, &["-o", "json", "job", "show", id]);
        let lines = if shown.stdout.trim().is_empty() {
            Vec::new()
        } else {
            json_lines(&shown)
        };
        if lines.iter().any(|line| line["job"]["status"] == "finished") {
            return lines
                .into_iter()
                .filter(|line| line["agent_id"].is_string())
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "job {id} did not finish: {shown:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn results_and_heartbeats_that_the_agent_did_not_sign_are_dropped_and_audited() {
    let server = TestServer::start();
    let web1 = Agent::start(&server, "web-01", "role=web");
    wait_for_state(&server, "web-01", "connected", Duration::from_secs(10));
    let (_, operator) = server.create_key("ops", "operator");

    // While a real job runs, whoever holds the agent's bus session but not its key (a
    // taken-over daemon, a stolen session) answers for it: unsigned, then with a signature
    // that is not the agent's, then a heartbeat.
    let id = exec_async(&server, &operator, &["sh", "-c", "sleep 2; echo real"]);
    let forged = format!(
        r#"{{"job_id":"{id}","duration_ms":1,"kind":"exec","exit_code":0,"stdout":"forged\n"}}"#
    );
    let headers = "NATS/1.0\r\nSvc-Signature: AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\r\n\r\n";
    let beat = format!(
        r#"{{"version":"0","hostname":"forged","running_jobs":0,"sent_at_ms":{}}}"#,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    // And an answer for a job that no one waits for: dropped unread, like every result of
    // another member's job in a cluster (its signature is not even checked).
    let stray = r#"{"job_id":"01NOSUCHJOB","duration_ms":1,"kind":"exec","exit_code":0}"#;
    let ops = format!(
        "PUB svc.agent.web-01.result {len}\r\n{forged}\r\n\
         HPUB svc.agent.web-01.result {header_len} {total}\r\n{headers}{forged}\r\n\
         PUB svc.agent.web-01.heartbeat {beat_len}\r\n{beat}\r\n\
         PUB svc.agent.web-01.result {stray_len}\r\n{stray}\r\n",
        len = forged.len(),
        header_len = headers.len(),
        total = headers.len() + forged.len(),
        beat_len = beat.len(),
        stray_len = stray.len(),
    );
    let published = agent_session(&server, &web1.home.path().join("state"), &ops);
    assert_eq!(published, ["PONG"]);

    // The job gets the agent's own, signed answer.
    let results = job_results(&server, &operator, &id);
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0]["status"], "ok", "{results:?}");
    assert_eq!(results[0]["stdout"], "real\n", "{results:?}");

    // One row per agent and kind: the second forged result is counted, not written again.
    let rows = audit_rows(&server, &["--action", "agent.result_forged"]);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["outcome"], "denied");
    assert_eq!(rows[0]["resource_id"], "web-01");
    assert_eq!(rows[0]["detail"]["job_id"], id.as_str());
    assert_eq!(rows[0]["detail"]["reason"], "not signed");
    let rows = audit_rows(&server, &["--action", "agent.heartbeat_forged"]);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["outcome"], "denied");
    let metrics = server.request("GET", "/metrics", None, None).body;
    for line in [
        "svc_agent_messages_forged_total{kind=\"result\"} 2",
        "svc_agent_messages_forged_total{kind=\"heartbeat\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    // The forged heartbeat changed nothing the agent reported.
    let shown = svcctl(
        &server,
        &operator,
        &["-o", "json", "agent", "show", "web-01"],
    );
    assert_ne!(json(&shown)["hostname"], "forged", "{shown:?}");
    wait_for_state(&server, "web-01", "connected", Duration::from_secs(5));
}

#[test]
fn agent_command_line_and_service_unit() {
    let server = TestServer::start();
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("agent.yaml");

    // The daemon without enrolment, or with a config naming another agent, says what to do.
    std::fs::write(&config, "agent:\n  heartbeat_interval: 1s\n").unwrap();
    let unenrolled = run(server
        .names
        .command("svc-agent")
        .arg("--config")
        .arg(&config));
    assert_eq!(unenrolled.code, 1, "{unenrolled:?}");
    assert!(
        unenrolled.stderr.contains("agent.id is not set"),
        "{unenrolled:?}"
    );
    let agent = Agent::start(&server, "web-01", "role=web");
    let mut text = std::fs::read_to_string(agent.config()).unwrap();
    text = text.replace("id: web-01", "id: web-99");
    std::fs::write(&config, text).unwrap();
    let mismatch = run(server
        .names
        .command("svc-agent")
        .arg("--config")
        .arg(&config));
    assert_eq!(mismatch.code, 1, "{mismatch:?}");
    assert!(
        mismatch.stderr.contains("is for agent \"web-01\""),
        "{mismatch:?}"
    );
    let unknown_key = home.path().join("bad.yaml");
    std::fs::write(&unknown_key, "agent:\n  id: a\n  colour: blue\n").unwrap();
    let bad = run(server
        .names
        .command("svc-agent")
        .arg("--config")
        .arg(&unknown_key));
    assert_eq!(bad.code, 1, "{bad:?}");
    assert!(bad.stderr.contains("colour"), "{bad:?}");
    let help = run(server.names.command("svc-agent").arg("--help"));
    assert_eq!(help.code, 0);
    assert!(help.stdout.contains("service"), "{help:?}");

    // service install --no-start writes a unit that runs this agent with its config.
    let units = home.path().join("units");
    let install = run(server
        .names
        .command("svc-agent")
        .arg("--config")
        .arg(agent.config())
        .args(["service", "install", "--no-start", "--unit-dir"])
        .arg(&units));
    assert_eq!(install.code, 0, "{install:?}");
    let unit = std::fs::read_to_string(units.join("svc-agent.service")).unwrap();
    let exec_start = format!("--config {}", agent.config().display());
    assert!(unit.contains(&exec_start), "{unit}");
    assert!(unit.contains("[Install]"), "{unit}");
    // And the split agent's executor, from the same config; `executor: inline` is warned about.
    let executor = std::fs::read_to_string(units.join("svc-agent-executor.service")).unwrap();
    assert!(
        executor.contains(&format!("{exec_start} executor --socket")),
        "{executor}"
    );
    assert!(install.stderr.contains("executor: inline"), "{install:?}");
    let status = run(server
        .names
        .command("svc-agent")
        .args(["service", "status", "-o", "json", "--unit-dir"])
        .arg(&units));
    assert_eq!(json(&status)["installed"], true, "{status:?}");
    let removed = run(server
        .names
        .command("svc-agent")
        .args(["service", "uninstall", "--no-stop", "--unit-dir"])
        .arg(&units));
    assert_eq!(removed.code, 0, "{removed:?}");
    assert!(!units.join("svc-agent.service").exists());
    assert!(!units.join("svc-agent-executor.service").exists());
}

/// `svcctl state ...` with the server's addresses and a key, JSON output.
fn state(server: &TestServer, key: &str, args: &[&str]) -> Run {
    svcctl(server, key, &[&["-o", "json", "state"], args].concat())
}

/// Templates with the host's facts and the plan's vars, `--set`/`--set-secret`, `--diff`,
/// and a trigger that runs only when the file it watches changed, through a real agent.
#[test]
fn state_templates_triggers_and_diffs_on_a_real_agent() {
    let server = TestServer::start();
    let web1 = Agent::start(&server, "web-01", "role=web");
    wait_for_state(&server, &web1.id, "connected", Duration::from_secs(10));
    let (_, operator) = server.create_key("ops", "operator");
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("host");
    std::fs::create_dir(&root).unwrap();
    let files = work.path().join("states");
    std::fs::create_dir(&files).unwrap();
    std::fs::write(
        files.join("app.conf.j2"),
        "# {{ facts.hostname }}\nport = {{ port }}\ntoken = {{ token }}\n",
    )
    .unwrap();
    let yaml = format!(
        "vars: {{port: 80}}\n\
         resources:\n\
         - command: {{run: \"echo reload >> {r}/reloads\", onchanges: conf}}\n\
         - file: {{id: conf, path: {r}/app.conf, template: app.conf.j2, mode: \"0600\"}}\n",
        r = root.display()
    );
    let state_file = files.join("app.yaml");
    std::fs::write(&state_file, yaml).unwrap();
    let file = state_file.to_str().unwrap();
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let reloads = || std::fs::read_to_string(root.join("reloads")).unwrap_or_default();

    // A name the template uses and nothing defines: refused before anything is sent.
    let undefined = state(&server, &operator, &["check", file]);
    assert_eq!(undefined.code, 1, "{undefined:?}");
    assert!(
        undefined
            .stderr
            .contains("line 4: file: app.conf.j2 line 3: template: undefined name 'token'"),
        "{undefined:?}"
    );

    let with_token = ["--set-secret", "token=s3cret", "-t", "web-01"];
    let checked = state(
        &server,
        &operator,
        &[&["check", file, "--diff"], &with_token[..]].concat(),
    );
    assert_eq!(checked.code, 0, "{checked:?}");
    let result = &by_agent(&json_lines(&checked))["web-01"];
    let outcomes = result["outcomes"].as_array().unwrap();
    // The file comes first (the command waits for it) and shows its diff; the secret does not.
    let diff = outcomes[0]["diff"].as_str().unwrap();
    assert!(
        diff.contains(&format!("+# {}", hostname.trim())) && diff.contains("+port = 80\n"),
        "{result}"
    );
    assert!(
        diff.contains("+token = <redacted>") && !checked.stdout.contains("s3cret"),
        "{result}"
    );
    assert_eq!(outcomes[1]["detail"], "would run", "{result}");
    assert!(!root.join("app.conf").exists(), "check changed the host");
    // The table form prints the diff under the results.
    let table = svcctl(
        &server,
        &operator,
        &[&["state", "check", file, "--diff"], &with_token[..]].concat(),
    );
    assert!(table.stdout.contains("  diff file:"), "{table:?}");

    let applied = state(
        &server,
        &operator,
        &[&["apply", file], &with_token[..]].concat(),
    );
    assert_eq!(applied.code, 0, "{applied:?}\n{}", web1.log());
    assert_eq!(
        std::fs::read_to_string(root.join("app.conf")).unwrap(),
        format!("# {}\nport = 80\ntoken = s3cret\n", hostname.trim())
    );
    assert_eq!(reloads(), "reload\n");
    // Unchanged: the trigger stays quiet, and nothing counts as drift.
    let again = state(
        &server,
        &operator,
        &[&["apply", file], &with_token[..]].concat(),
    );
    let result = &by_agent(&json_lines(&again))["web-01"];
    assert_eq!(result["status"], "ok", "{result}");
    assert_eq!(
        result["outcomes"][1]["detail"], "not run: no change in conf",
        "{result}"
    );
    assert_eq!(reloads(), "reload\n");
    let drift = state(&server, &operator, &["drift", "-t", "web-01"]);
    assert_eq!(drift.code, 0, "{drift:?}");
    assert_eq!(by_agent(&json_lines(&drift))["web-01"]["status"], "ok");
    // The applied plan, which drift just read back, is sealed at rest: a copy of the store
    // does not show the secret value.
    let dump = common::store_dump(&server);
    assert!(
        common::contains_bytes(&dump, b"agent_states"),
        "not a store dump"
    );
    assert!(
        !common::contains_bytes(&dump, b"s3cret"),
        "secret value at rest"
    );
    // --set changes the rendered file, so the trigger runs once more.
    let moved = state(
        &server,
        &operator,
        &[&["apply", file, "--set", "port=8080"], &with_token[..]].concat(),
    );
    assert_eq!(moved.code, 0, "{moved:?}");
    assert!(std::fs::read_to_string(root.join("app.conf"))
        .unwrap()
        .contains("port = 8080\n"));
    assert_eq!(reloads(), "reload\nreload\n");
}

#[test]
fn state_compile_check_apply_drift_on_real_agents() {
    let server = TestServer::start();
    let web1 = Agent::start(&server, "web-01", "role=web");
    let web2 = Agent::start(&server, "web-02", "role=web");
    for agent in [&web1, &web2] {
        wait_for_state(&server, &agent.id, "connected", Duration::from_secs(10));
    }
    let (_, operator) = server.create_key("ops", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("host");
    std::fs::create_dir(&root).unwrap();
    let files = work.path().join("states");
    std::fs::create_dir_all(files.join("files")).unwrap();
    std::fs::write(files.join("files/app.conf"), "port = 8080\n").unwrap();
    let root_text = root.display().to_string();
    let yaml = format!(
        "- directory: {{path: {r}/app, mode: \"0750\"}}\n\
         - file: {{path: {r}/app/motd, content: \"hello\\n\", mode: \"0640\"}}\n\
         - file: {{path: {r}/app/app.conf, source: files/app.conf}}\n\
         - symlink: {{path: {r}/current, target: {r}/app}}\n\
         - command: {{run: \"echo built >> {r}/build.log\", creates: {r}/app/built}}\n\
         - command: {{run: \"touch {r}/app/built\", unless: \"test -e {r}/app/built\"}}\n",
        r = root_text
    );
    let state_file = files.join("site.yaml");
    std::fs::write(&state_file, yaml).unwrap();
    let file = state_file.to_str().unwrap();

    // compile needs no server (nor key): the source file is inlined.
    let compiled = run(server
        .names
        .command("svcctl")
        .args(["-o", "json", "state", "compile", file]));
    assert_eq!(compiled.code, 0, "{compiled:?}");
    let plan = json(&compiled);
    assert_eq!(plan["resources"].as_array().unwrap().len(), 6, "{plan}");
    assert!(compiled.stdout.contains("port = 8080"), "{compiled:?}");
    let broken = files.join("broken.yaml");
    std::fs::write(&broken, "- file: {path: /tmp/x}\n- bogus: {path: /tmp/y}\n").unwrap();
    let refused =
        run(server
            .names
            .command("svcctl")
            .args(["state", "compile", broken.to_str().unwrap()]));
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stderr.contains("line 2"), "{refused:?}");

    // check: what would change, and nothing changes.
    let checked = state(&server, &operator, &["check", file, "--target", "web-01"]);
    assert_eq!(checked.code, 0, "{checked:?}");
    let results = by_agent(&json_lines(&checked));
    assert_eq!(results.keys().collect::<Vec<_>>(), ["web-01"]);
    assert_eq!(results["web-01"]["status"], "changed", "{checked:?}");
    assert!(!root.join("app").exists(), "check changed the host");

    // apply: every resource changes once; the second apply changes nothing.
    assert_eq!(
        state(&server, &readonly, &["apply", file, "-t", "web-01"]).code,
        4
    );
    let applied = state(&server, &operator, &["apply", file, "-t", "web-01"]);
    assert_eq!(applied.code, 0, "{applied:?}\n{}", web1.log());
    let result = &by_agent(&json_lines(&applied))["web-01"];
    assert_eq!(result["status"], "changed", "{result}");
    let outcomes = result["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 6, "{result}");
    assert!(outcomes.iter().all(|o| o["error"].is_null()), "{result}");
    use std::os::unix::fs::PermissionsExt;
    let motd = root.join("app/motd");
    assert_eq!(std::fs::read_to_string(&motd).unwrap(), "hello\n");
    assert_eq!(
        std::fs::metadata(&motd).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_eq!(
        std::fs::metadata(root.join("app"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o750
    );
    assert_eq!(
        std::fs::read_to_string(root.join("app/app.conf")).unwrap(),
        "port = 8080\n"
    );
    assert_eq!(
        std::fs::read_link(root.join("current")).unwrap(),
        root.join("app")
    );
    assert_eq!(
        std::fs::read_to_string(root.join("build.log")).unwrap(),
        "built\n"
    );
    let again = state(&server, &operator, &["apply", file, "-t", "web-01"]);
    assert_eq!(again.code, 0, "{again:?}");
    let result = &by_agent(&json_lines(&again))["web-01"];
    assert_eq!(
        result["status"], "ok",
        "second apply changed something: {result}"
    );
    assert!(result["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|o| o["changed"] == false));
    assert_eq!(
        std::fs::read_to_string(root.join("build.log")).unwrap(),
        "built\n"
    );

    // drift: nothing yet; then the host moves away from the state.
    let calm = state(&server, &operator, &["drift", "-t", "web-01"]);
    assert_eq!(calm.code, 0, "{calm:?}");
    std::fs::write(&motd, "tampered\n").unwrap();
    std::fs::set_permissions(&motd, std::fs::Permissions::from_mode(0o666)).unwrap();
    let drift = state(&server, &operator, &["drift"]);
    assert_eq!(drift.code, 1, "{drift:?}");
    let results = by_agent(&json_lines(&drift));
    assert_eq!(results["web-01"]["status"], "drift", "{drift:?}");
    let motd_label = format!("file:{}", motd.display());
    assert_eq!(
        results["web-01"]["drift"],
        serde_json::json!([motd_label]),
        "{drift:?}"
    );
    assert_eq!(results["web-02"]["status"], "no_state", "{drift:?}");
    assert_eq!(
        std::fs::read_to_string(&motd).unwrap(),
        "tampered\n",
        "drift changed the host"
    );

    // A resource that fails: exit 1 and state_apply_failed; the others still run.
    let failing = files.join("failing.yaml");
    std::fs::write(
        &failing,
        format!(
            "- file: {{path: {r}/missing-dir/x, content: x}}\n- file: {{path: {r}/ok, content: y}}\n",
            r = root_text
        ),
    )
    .unwrap();
    let failed = state(
        &server,
        &operator,
        &["apply", failing.to_str().unwrap(), "-t", "web-01"],
    );
    assert_eq!(failed.code, 1, "{failed:?}");
    let result = &by_agent(&json_lines(&failed))["web-01"];
    assert_eq!(result["status"], "failed", "{result}");
    assert!(result["outcomes"][0]["error"].is_string(), "{result}");
    assert_eq!(std::fs::read_to_string(root.join("ok")).unwrap(), "y");

    let kinds: Vec<(String, String)> = events(
        &server,
        &[
            "state_apply_started",
            "state_apply_succeeded",
            "state_apply_failed",
            "state_drift_detected",
        ],
    )
    .into_iter()
    .map(|(t, source, _)| (t, source))
    .collect();
    let expected: Vec<(String, String)> = [
        "state_apply_started",
        "state_apply_succeeded",
        "state_apply_started",
        "state_apply_succeeded",
        "state_drift_detected",
        "state_apply_started",
        "state_apply_failed",
    ]
    .iter()
    .map(|t| (t.to_string(), "web-01".to_string()))
    .collect();
    assert_eq!(kinds, expected);
    let rows = audit_rows(&server, &["--action", "state.apply"]);
    let outcomes: Vec<&str> = rows
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        ["success", "success", "success", "denied"],
        "{rows:?}"
    );
}

#[test]
fn the_server_refuses_plans_that_were_not_compiled() {
    let server = TestServer::start();
    let agent = Agent::start(&server, "web-01", "role=web");
    wait_for_state(&server, &agent.id, "connected", Duration::from_secs(10));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client = svc::proto::fleet_service_client::FleetServiceClient::connect(format!(
            "http://{}",
            server.grpc
        ))
        .await
        .unwrap();
        for plan in [
            "- file: {path: /tmp/x}",
            r#"{"resources":[{"file":{"path":"/tmp/x","source":"/etc/shadow"}}]}"#,
            r#"{"resources":[{"file":{"path":"relative","content":"x"}}]}"#,
        ] {
            let request = svc::proto::StateRequest {
                target: "web-01".into(),
                plan: plan.into(),
                ..Default::default()
            };
            let status = client
                .state_apply(common::with_key(request, &server.admin_key))
                .await
                .err()
                .unwrap_or_else(|| panic!("accepted: {plan}"));
            assert_eq!(
                status.code(),
                tonic::Code::InvalidArgument,
                "{plan}: {status:?}"
            );
        }
    });
}

#[test]
fn agents_stay_connected_across_a_server_restart() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let env = vec![("SVC_LISTEN__BUS".to_string(), format!("127.0.0.1:{port}"))];
    let mut server = TestServer::start_with(Options {
        env: env.clone(),
        ..Options::default()
    });
    let agent = Agent::start(&server, "web-01", "role=web");
    wait_for_state(&server, "web-01", "connected", Duration::from_secs(10));

    assert_eq!(server.stop_with(libc::SIGTERM), Some(0), "{}", server.log());
    server.spawn(&env);
    // The last heartbeat was saved at the stop: no flap to disconnected and back.
    assert_eq!(states(&server)["web-01"], "connected");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let exec = svcctl(
            &server,
            &server.admin_key,
            &["-o", "json", "exec", "--timeout", "2s", "--", "true"],
        );
        if exec.code == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no exec after restart: {exec:?}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(events(&server, &["agent_connected"]).len(), 1);
    assert!(events(&server, &["agent_disconnected"]).is_empty());
}

/// A request on an agent's content subject, as that agent, with a reply subject of its own:
/// the answer's body (the server's error JSON for a refusal).
fn content_request(server: &TestServer, agent: &Agent, body: &str) -> String {
    use std::io::Read;
    let reply = format!("svc.agent.{}.content.reply.test", agent.id);
    let ops = format!(
        "SUB {reply} 1\r\nPUB svc.agent.{id}.content {reply} {len}\r\n{body}\r\n",
        id = agent.id,
        len = body.len()
    );
    let (mut reader, mut writer) =
        common::agent_connection(server, &agent.home.path().join("state"));
    write!(writer, "{ops}").unwrap();
    // HMSG subject sid header_len total_len, then the headers and the body.
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if let Some(rest) = line.strip_prefix("HMSG ") {
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let total: usize = fields[fields.len() - 1].parse().unwrap();
            let headers: usize = fields[fields.len() - 2].parse().unwrap();
            let mut bytes = vec![0; total + 2];
            reader.read_exact(&mut bytes).unwrap();
            return String::from_utf8_lossy(&bytes[headers..total]).into_owned();
        }
        assert!(!line.starts_with("-ERR"), "{line}");
    }
}

/// A plan larger than a bus message (a tree of 2,000 files and a 2 MiB binary): the server
/// stores it once by SHA-256, the agent fetches its chunks and keeps them, so a second apply
/// and a drift check fetch nothing; an agent cannot read chunks without a command naming them.
#[test]
fn large_plans_travel_by_sha256_and_agents_fetch_only_what_they_lack() {
    let server = TestServer::start();
    let web1 = Agent::start(&server, "web-01", "role=web");
    let web2 = Agent::start(&server, "web-02", "role=web");
    for agent in [&web1, &web2] {
        wait_for_state(&server, &agent.id, "connected", Duration::from_secs(10));
    }
    let (_, operator) = server.create_key("ops", "operator");
    let work = tempfile::tempdir().unwrap();
    let states = work.path().join("states");
    for d in 0..20 {
        std::fs::create_dir_all(states.join(format!("site/d{d:02}"))).unwrap();
    }
    for n in 0..2000 {
        let text = format!("file {n}\n{}\n", "x".repeat(200));
        std::fs::write(
            states.join(format!("site/d{:02}/f{n:04}.txt", n % 20)),
            text,
        )
        .unwrap();
    }
    // Not UTF-8, so it travels base64: 2.7 MB of the plan.
    let big: Vec<u8> = (0..2 * 1024 * 1024u32)
        .map(|i| (i * 7 % 251) as u8 | 0x80)
        .collect();
    std::fs::write(states.join("big.bin"), &big).unwrap();
    let root = work.path().join("host");
    std::fs::create_dir(&root).unwrap();
    let state_file = states.join("site.yaml");
    std::fs::write(
        &state_file,
        format!(
            "- tree: {{path: {r}/www, source: site}}\n- file: {{path: {r}/big.bin, source: big.bin}}\n",
            r = root.display()
        ),
    )
    .unwrap();
    let file = state_file.to_str().unwrap();

    let applied = state(&server, &operator, &["apply", file, "-t", "web-01"]);
    assert_eq!(applied.code, 0, "{applied:?}\n{}", web1.log());
    let result = &by_agent(&json_lines(&applied))["web-01"];
    assert_eq!(result["status"], "changed", "{result}");
    assert_eq!(std::fs::read(root.join("big.bin")).unwrap(), big);
    assert_eq!(
        std::fs::read_to_string(root.join("www/d07/f1987.txt")).unwrap(),
        format!("file 1987\n{}\n", "x".repeat(200))
    );
    // Stored once, in the file service's reserved cluster; the agent kept the chunks.
    let stored = server.data_dir.join("files/svc-state/chunks");
    let stored_chunks: Vec<std::path::PathBuf> = std::fs::read_dir(&stored)
        .unwrap()
        .flat_map(|dir| std::fs::read_dir(dir.unwrap().path()).unwrap())
        .map(|entry| entry.unwrap().path())
        .collect();
    // More than 3 MiB of plan, three times what one bus message takes.
    assert!(stored_chunks.len() >= 12, "{stored_chunks:?}");
    let cached = std::fs::read_dir(web1.home.path().join("state/content"))
        .unwrap()
        .count();
    assert_eq!(cached, stored_chunks.len());

    // Drift checks the stored plan again (the agent's row keeps only its reference).
    std::fs::remove_file(root.join("www/d03/f0003.txt")).unwrap();
    let drift = state(&server, &operator, &["drift", "-t", "web-01"]);
    let result = &by_agent(&json_lines(&drift))["web-01"];
    assert_eq!(result["status"], "drift", "{result}");
    assert_eq!(
        result["drift"],
        serde_json::json!([format!("tree:{}/www", root.display())])
    );
    // With the server's copies damaged, the agent still has everything: it fetches nothing.
    for chunk in &stored_chunks {
        std::fs::write(chunk, b"damaged").unwrap();
    }
    let again = state(&server, &operator, &["apply", file, "-t", "web-01"]);
    let result = &by_agent(&json_lines(&again))["web-01"];
    assert_eq!(result["status"], "changed", "{result}\n{}", web1.log());
    assert!(root.join("www/d03/f0003.txt").exists());

    // Another agent has no chunks and the server only damaged ones: the run fails and says
    // why, changing nothing.
    let other = state(&server, &operator, &["apply", file, "-t", "web-02"]);
    let result = &by_agent(&json_lines(&other))["web-02"];
    assert_eq!(result["status"], "failed", "{result}");
    assert!(
        result["error"]
            .as_str()
            .unwrap()
            .contains("stored plan not fetched"),
        "{result}"
    );

    // Without a command signed for it, an agent gets nothing, whatever it claims.
    let chunk = stored_chunks[0].file_name().unwrap().to_str().unwrap();
    let forged = serde_json::json!({
        "command": format!(r#"{{"job_id":"J","timeout_ms":1,"agent_id":"web-02","issued_at_ms":1,"kind":"state","mode":"check","plan_ref":{{"size":1,"sha256":"{chunk}","chunk_size":262144,"chunks":["{chunk}"]}}}}"#),
        "signature": "AAAA",
        "chunk": chunk,
    });
    let answer = content_request(&server, &web2, &forged.to_string());
    assert!(
        answer.contains("permission_denied") && answer.contains("not signed by this server"),
        "{answer}"
    );
    let answer = content_request(&server, &web2, "not json");
    assert!(answer.contains("malformed content request"), "{answer}");

    // The stored plans are the server's: an operator key may not even list them.
    let files = |key: &str| {
        let mut command = server.cli("svc-files");
        command
            .env("SVC_NATS_URL", &server.bus)
            .env("SVC_API_KEY", key);
        command.args(["-o", "json", "--cluster", "svc-state", "list", "plans/"]);
        run(&mut command)
    };
    let listed = files(&operator);
    assert_eq!(listed.code, 4, "{listed:?}");
    assert!(listed.stderr.contains("admin keys only"), "{listed:?}");
    let listed = files(&server.admin_key);
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(listed.stdout.contains("plans/"), "{listed:?}");
}

/// On a bus with a small max_payload the plan's chunks are sized to fit: a plan past what a
/// command carries is stored in small chunks and fetched by the agent, and one whose chunk
/// list would not fit in a command has that list stored too, which the agent fetches first.
/// (4 KiB: an agent's enrolment answer, its certificates, needs more than nats.py's 1 KiB.)
#[test]
fn stored_plans_travel_on_a_small_max_payload() {
    let server = TestServer::start_with(Options {
        config_yaml: "bus:\n  max_payload: 4096\n".into(),
        ..Options::default()
    });
    let web1 = Agent::start(&server, "web-01", "role=web");
    wait_for_state(&server, &web1.id, "connected", Duration::from_secs(10));
    let (_, operator) = server.create_key("ops", "operator");
    let work = tempfile::tempdir().unwrap();
    let states = work.path().join("states");
    std::fs::create_dir(&states).unwrap();
    let root = work.path().join("host");
    std::fs::create_dir(&root).unwrap();
    let state_file = |name: &str, text: &str| {
        std::fs::write(states.join(name), text).unwrap();
        let state_file = states.join(format!("{name}.yaml"));
        std::fs::write(
            &state_file,
            format!(
                "- file: {{path: {}/{name}, source: {name}}}\n",
                root.display()
            ),
        )
        .unwrap();
        state_file.to_str().unwrap().to_string()
    };
    let stored_chunks = || {
        std::fs::read_dir(server.data_dir.join("files/svc-state/chunks"))
            .unwrap()
            .flat_map(|dir| std::fs::read_dir(dir.unwrap().path()).unwrap())
            .count()
    };

    // Past a quarter of the bus's max_payload, the plan is stored, in 2 KiB chunks.
    let text = "stored plan\n".repeat(400);
    let file = state_file("small.txt", &text);
    let applied = state(&server, &operator, &["apply", &file, "-t", "web-01"]);
    assert_eq!(applied.code, 0, "{applied:?}\n{}", web1.log());
    let result = &by_agent(&json_lines(&applied))["web-01"];
    assert_eq!(result["status"], "changed", "{result}\n{}", web1.log());
    assert_eq!(
        std::fs::read_to_string(root.join("small.txt")).unwrap(),
        text
    );
    assert!(stored_chunks() >= 2, "{}", stored_chunks());
    let cached = || {
        std::fs::read_dir(web1.home.path().join("state/content"))
            .unwrap()
            .count()
    };
    assert_eq!(cached(), stored_chunks());

    // Text that does not compress, in about 50 chunks: their list would not fit in a
    // command, so it is stored as well.
    use sha2::Digest;
    let mut large = String::new();
    let mut line = [7u8; 32];
    for _ in 0..3000 {
        line = sha2::Sha256::digest(line).into();
        large.push_str(&hex::encode(line));
        large.push('\n');
    }
    let file = state_file("large.txt", &large);
    let applied = state(&server, &operator, &["apply", &file, "-t", "web-01"]);
    assert_eq!(applied.code, 0, "{applied:?}\n{}", web1.log());
    let result = &by_agent(&json_lines(&applied))["web-01"];
    assert_eq!(result["status"], "changed", "{result}\n{}", web1.log());
    assert!(std::fs::read_to_string(root.join("large.txt")).unwrap() == large);
    assert!(stored_chunks() > 40, "{}", stored_chunks());
    assert_eq!(cached(), stored_chunks());
    let mut listing = server.cli("svc-files");
    listing
        .env("SVC_NATS_URL", &server.bus)
        .env("SVC_API_KEY", &server.admin_key)
        .args(["-o", "json", "--cluster", "svc-state", "list", "plans/"]);
    let listed = run(&mut listing);
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(listed.stdout.contains(".list1"), "{listed:?}");

    // Drift reads the stored plan back through its stored list.
    std::fs::remove_file(root.join("large.txt")).unwrap();
    let drift = state(&server, &operator, &["drift", "-t", "web-01"]);
    let result = &by_agent(&json_lines(&drift))["web-01"];
    assert_eq!(result["status"], "drift", "{result}\n{}", web1.log());
}

/// The command-signing private keys (PEM, current first) in a `ca encrypt` document, opened
/// with its passphrase as an operator restoring it would.
fn command_keys_in_backup(server: &TestServer) -> Vec<String> {
    use base64::Engine;
    let home = tempfile::tempdir().unwrap();
    let passphrase = home.path().join("passphrase");
    std::fs::write(&passphrase, "correct horse battery staple\n").unwrap();
    let encrypted = run(server.cli("svc-identity").args([
        "--api-key",
        &server.admin_key,
        "ca",
        "encrypt",
        "--passphrase-file",
        passphrase.to_str().unwrap(),
    ]));
    assert_eq!(encrypted.code, 0, "{encrypted:?}");
    let document: serde_json::Value = serde_json::from_str(&encrypted.stdout).unwrap();
    let salt = base64::engine::general_purpose::STANDARD
        .decode(document["kdf"]["salt"].as_str().unwrap())
        .unwrap();
    let mut key = [0u8; 32];
    ring::pbkdf2::derive(
        ring::pbkdf2::PBKDF2_HMAC_SHA256,
        std::num::NonZeroU32::new(document["kdf"]["rounds"].as_u64().unwrap() as u32).unwrap(),
        &salt,
        b"correct horse battery staple",
        &mut key,
    );
    let format = document["format"].as_str().unwrap();
    let plain =
        svc::identity::ca::open(&key, format, document["ciphertext"].as_str().unwrap()).unwrap();
    let contents: serde_json::Value = serde_json::from_slice(&plain).unwrap();
    assert!(contents["root_ca"]["private_key"].is_string(), "{contents}");
    contents["command_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| pair["private_key"].as_str().unwrap().to_string())
        .collect()
}

/// Signs an exec of `echo forged` for `agent` with `key_pem`, publishes it on the agent's own
/// command subject with the agent's credentials (as a daemon taken over, or anyone holding
/// that key, could) and returns the agent's answer.
fn deliver_signed(server: &TestServer, agent: &Agent, key_pem: &str) -> serde_json::Value {
    use svc::fleet::protocol::{Command, Work};
    let signer = svc::fleet::signature::Signer::from_pkcs8_pem(key_pem).unwrap();
    let command = Command {
        job_id: format!("forged-{}", rand::random::<u32>()),
        timeout_ms: 5000,
        agent_id: String::new(),
        issued_at_ms: 0,
        work: Work::Exec {
            argv: vec!["echo".into(), "forged".into()],
        },
    };
    let (bytes, signature) = signer.sign(&command, &agent.id).unwrap();
    let (mut reader, mut writer) = common::agent_connection(server, &agent.state_dir());
    let headers = format!("NATS/1.0\r\nSvc-Signature: {signature}\r\n\r\n");
    write!(
        writer,
        "SUB svc.agent.{id}.result 1\r\nPING\r\n",
        id = agent.id
    )
    .unwrap();
    assert_eq!(common::lines_until_pong(&mut reader), ["PONG"]);
    write!(
        writer,
        "HPUB svc.agent.{id}.cmd {} {}\r\n{headers}",
        headers.len(),
        headers.len() + bytes.len(),
        id = agent.id
    )
    .unwrap();
    writer.write_all(&bytes).unwrap();
    writer.write_all(b"\r\n").unwrap();
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        if line.starts_with("PING") {
            writer.write_all(b"PONG\r\n").unwrap();
        }
        // Results come signed by the agent, with their headers (HMSG ... HEADERS TOTAL).
        let Some(rest) = line.trim_end().strip_prefix("HMSG ") else {
            continue;
        };
        let mut sizes = rest.rsplit(' ');
        let total: usize = sizes.next().unwrap().parse().unwrap();
        let headers: usize = sizes.next().unwrap().parse().unwrap();
        let mut body = vec![0u8; total + 2];
        std::io::Read::read_exact(&mut reader, &mut body).unwrap();
        let reply: serde_json::Value = serde_json::from_slice(&body[headers..total]).unwrap();
        if reply["job_id"] == command.job_id {
            return reply;
        }
    }
}

fn command_key_pems(agent: &Agent) -> usize {
    std::fs::read_to_string(agent.state_dir().join("command-key.pem"))
        .unwrap()
        .matches("BEGIN CERTIFICATE")
        .count()
}

fn wait_for_command_keys(agent: &Agent, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while command_key_pems(agent) != count {
        assert!(
            Instant::now() < deadline,
            "{} never trusted {count} command keys:\n{}",
            agent.id,
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn exec_ok(server: &TestServer, target: &str) {
    let exec = svcctl(
        server,
        &server.admin_key,
        &["-o", "json", "exec", "-t", target, "--", "echo", "fine"],
    );
    assert_eq!(exec.code, 0, "{exec:?}");
    let results = by_agent(&json_lines(&exec));
    assert!(
        !results.is_empty() && results.values().all(|r| r["stdout"] == "fine\n"),
        "{exec:?}"
    );
}

#[test]
fn command_key_rotation_reaches_agents_online_and_offline_and_retired_keys_are_refused() {
    let server = TestServer::start();
    let online = Agent::start(&server, "ck-01", "role=web");
    let mut offline = Agent::start(&server, "ck-02", "role=web");
    for agent in [&online, &offline] {
        wait_for_state(&server, &agent.id, "connected", Duration::from_secs(10));
    }
    let (_, operator) = server.create_key("ops", "operator");
    let identity = |key: &str, args: &[&str]| common::identity_json(&server, key, args);
    let before = json(&identity(&operator, &["command-key", "info"]));
    assert!(before.get("previous").is_none(), "{before}");
    let old_key = command_keys_in_backup(&server).remove(0);

    offline.stop();
    wait_for_state(&server, "ck-02", "disconnected", Duration::from_secs(40));

    // Only an admin rotates; the connected agent is told at once, and trusts both keys.
    let denied = identity(&operator, &["command-key", "rotate"]);
    assert_eq!(denied.code, 4, "{denied:?}");
    let rotated = identity(&server.admin_key, &["command-key", "rotate"]);
    assert_eq!(rotated.code, 0, "{rotated:?}");
    let rotated = json(&rotated);
    assert_eq!(rotated["previous"], before["current"], "{rotated}");
    assert_ne!(rotated["current"], before["current"], "{rotated}");
    assert!(rotated["retire_after"].as_str().unwrap() > "2", "{rotated}");
    assert_eq!(rotated["agents"]["updated"], 1, "{rotated}");
    assert_eq!(command_key_pems(&online), 2);
    // Written atomically (no temporary left) with the mode bootstrap gave it.
    let file = online.state_dir().join("command-key.pem");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o644
    );
    assert!(!online.state_dir().join("command-key.tmp").exists());
    // One rotation at a time.
    let again = identity(&server.admin_key, &["command-key", "rotate"]);
    assert_eq!(again.code, 1, "{again:?}");
    assert!(again.stderr.contains("retire it first"), "{again:?}");

    // New commands are signed with the new key; the old one is still accepted (the grace).
    exec_ok(&server, "ck-01");
    let graced = deliver_signed(&server, &online, &old_key);
    assert_eq!(graced["exit_code"], 0, "{graced}");

    // The agent that was away learns the new key when it reconnects, and works.
    offline.spawn(&server.names);
    wait_for_state(&server, "ck-02", "connected", Duration::from_secs(10));
    wait_for_command_keys(&offline, 2);
    exec_ok(&server, "ck-02");

    // Retired: both agents are told, and refuse what the old key signs.
    let retired = identity(&server.admin_key, &["command-key", "retire"]);
    assert_eq!(retired.code, 0, "{retired:?}");
    let retired = json(&retired);
    assert!(retired.get("previous").is_none(), "{retired}");
    assert_eq!(retired["current"], rotated["current"], "{retired}");
    assert_eq!(retired["agents"]["updated"], 2, "{retired}");
    for agent in [&online, &offline] {
        assert_eq!(command_key_pems(agent), 1);
        let refused = deliver_signed(&server, agent, &old_key);
        assert_eq!(refused["exit_code"], -1, "{refused}");
        assert_eq!(
            refused["error"], "command refused: the signature is not the server's",
            "{refused}"
        );
    }
    exec_ok(&server, "role=web");
    let nothing = identity(&server.admin_key, &["command-key", "retire"]);
    assert_eq!(nothing.code, 1, "{nothing:?}");
    assert!(
        nothing.stderr.contains("no previous command key"),
        "{nothing:?}"
    );

    // ca export carries the command key's certificate after the chain; audit rows.
    let export = identity(&server.admin_key, &["ca", "export"]);
    let pem = json(&export)["pem"].as_str().unwrap().to_string();
    assert_eq!(pem.matches("BEGIN CERTIFICATE").count(), 3, "{pem}");
    let outcomes: Vec<(String, String)> = audit_rows(&server, &["--action", "command_key.*"])
        .iter()
        .map(|row| {
            (
                row["action"].as_str().unwrap().to_string(),
                row["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected = [
        ("command_key.retire", "denied"),
        ("command_key.retire", "success"),
        ("command_key.rotate", "denied"),
        ("command_key.rotate", "success"),
        ("command_key.rotate", "denied"),
    ];
    assert_eq!(
        outcomes,
        expected.map(|(a, o)| (a.to_string(), o.to_string())),
        "{outcomes:?}"
    );
}

#[test]
fn the_previous_command_key_is_retired_when_its_grace_runs_out() {
    let server = TestServer::start_with(Options {
        config_yaml: "agents:\n  command_key_grace: 2s\n".into(),
        ..Options::default()
    });
    let agent = Agent::start(&server, "ck-03", "role=web");
    wait_for_state(&server, "ck-03", "connected", Duration::from_secs(10));
    let rotated = common::identity_json(&server, &server.admin_key, &["command-key", "rotate"]);
    assert_eq!(json(&rotated)["agents"]["updated"], 1, "{rotated:?}");
    assert_eq!(command_key_pems(&agent), 2);
    wait_for_command_keys(&agent, 1);
    let info = json(&common::identity_json(
        &server,
        &server.admin_key,
        &["command-key", "info"],
    ));
    assert!(info.get("previous").is_none(), "{info}");
    let rows = audit_rows(&server, &["--action", "command_key.retire"]);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["user"], "server", "{rows:?}");
    assert_eq!(rows[0]["detail"]["scheduled"], true, "{rows:?}");
    exec_ok(&server, "ck-03");
}
