//! Jobs that outlive the CLI, end to end: `svcctl exec --async` and `svcctl state apply
//! --async` against a real server with real agents, `svcctl job list|show` reading what the
//! server collected, the REST views the console uses, the summary printed past 20 targets,
//! and the retention bounds (count, age, stored output).

mod common;

use std::time::{Duration, Instant};

use common::agent::Agent;
use common::{run, Options, Run, TestServer};

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

fn connected(server: &TestServer, agents: &[&Agent]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let listed = svcctl(server, &server.admin_key, &["-o", "json", "agent", "list"]);
        let all: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap_or_default();
        let up = agents.iter().all(|agent| {
            all.as_array()
                .into_iter()
                .flatten()
                .any(|a| a["id"] == agent.id.as_str() && a["state"] == "connected")
        });
        if up {
            return;
        }
        assert!(Instant::now() < deadline, "agents not connected: {all}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `svcctl -o json job show ID`: (exit code, the job, its results, the summary).
fn show(
    server: &TestServer,
    key: &str,
    id: &str,
) -> (i32, serde_json::Value, Vec<serde_json::Value>, Run) {
    let shown = svcctl(server, key, &["-o", "json", "job", "show", id]);
    let lines = if shown.stdout.trim().is_empty() {
        Vec::new()
    } else {
        json_lines(&shown)
    };
    let job = lines.first().map(|l| l["job"].clone()).unwrap_or_default();
    let results = lines
        .iter()
        .filter(|l| l.get("agent_id").is_some())
        .cloned()
        .collect();
    (shown.code, job, results, shown)
}

/// Shows job `id` until the server has collected every result.
fn finished(
    server: &TestServer,
    key: &str,
    id: &str,
) -> (i32, serde_json::Value, Vec<serde_json::Value>, Run) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shown = show(server, key, id);
        if shown.1["status"] == "finished" {
            return shown;
        }
        assert!(
            Instant::now() < deadline,
            "job {id} did not finish: {:?}",
            shown.3
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn start_async(server: &TestServer, key: &str, args: &[&str]) -> String {
    let started = svcctl(server, key, &[&["-o", "json"], args].concat());
    assert_eq!(started.code, 0, "{started:?}");
    let answer: serde_json::Value = serde_json::from_str(&started.stdout).unwrap();
    answer["job_id"].as_str().unwrap().to_string()
}

#[test]
fn async_jobs_outlive_the_cli_and_job_show_reads_them() {
    let server = TestServer::start();
    let web1 = Agent::start(&server, "web-01", "role=web");
    let web2 = Agent::start(&server, "web-02", "role=web");
    connected(&server, &[&web1, &web2]);
    let (_, operator) = server.create_key("ops", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");

    // --async answers before the agents do: the job takes seconds, the CLI does not wait.
    let id = start_async(
        &server,
        &operator,
        &[
            "exec",
            "--async",
            "--",
            "sh",
            "-c",
            "sleep 3; echo hello from $(hostname)",
        ],
    );
    let (code, job, _, shown) = show(&server, &operator, &id);
    assert_eq!(code, 0, "{shown:?}");
    assert_eq!(job["status"], "running", "{shown:?}");
    assert_eq!(job["kind"], "exec");
    assert_eq!(job["agents"], 2);
    assert!(shown.stderr.contains("is running"), "{shown:?}");

    // The server collected both results with no client reading them.
    let (code, job, results, shown) = finished(&server, &operator, &id);
    assert_eq!(code, 0, "{shown:?}");
    assert_eq!(job["counts"], serde_json::json!({"ok": 2}), "{shown:?}");
    assert_eq!(job["created_by"], "ops");
    assert_eq!(results.len(), 2, "{shown:?}");
    for result in &results {
        assert_eq!(result["status"], "ok");
        assert_eq!(result["exit_code"], 0);
        assert!(result["stdout"].as_str().unwrap().starts_with("hello from"));
        assert_eq!(result["job_id"], id.as_str());
    }
    let table = svcctl(&server, &operator, &["job", "show", &id]);
    assert_eq!(table.code, 0, "{table:?}");
    assert!(table.stdout.contains("== web-01  ok  exit 0"), "{table:?}");
    assert!(table.stdout.contains("sh -c sleep 3"), "{table:?}");

    // A failure on one agent: job show exits 1 as exec would have, and says so.
    let failing = start_async(
        &server,
        &operator,
        &[
            "exec",
            "--async",
            "-t",
            "web-02",
            "--",
            "sh",
            "-c",
            "echo broken >&2; exit 3",
        ],
    );
    let (code, job, results, shown) = finished(&server, &operator, &failing);
    assert_eq!(code, 1, "{shown:?}");
    assert_eq!(job["counts"], serde_json::json!({"failed": 1}));
    assert_eq!(results[0]["exit_code"], 3);
    assert_eq!(results[0]["stderr"], "broken\n");
    assert!(
        shown.stderr.contains("1 of 1 agents did not succeed"),
        "{shown:?}"
    );

    // A synchronous exec is kept too.
    let sync = svcctl(
        &server,
        &operator,
        &["-o", "json", "exec", "-t", "web-01", "--", "true"],
    );
    assert_eq!(sync.code, 0, "{sync:?}");
    let sync_id = json_lines(&sync)[0]["job_id"].as_str().unwrap().to_string();
    let (code, job, results, _) = finished(&server, &operator, &sync_id);
    assert_eq!((code, results.len()), (0, 1));
    assert_eq!(job["description"], "true");

    // state apply --async: the plan is applied with no one watching.
    let work = tempfile::tempdir().unwrap();
    let target = work.path().join("motd");
    let state_file = work.path().join("site.yaml");
    std::fs::write(
        &state_file,
        format!(
            "- file: {{path: {}, content: \"hi\\n\"}}\n",
            target.display()
        ),
    )
    .unwrap();
    let applied = start_async(
        &server,
        &operator,
        &[
            "state",
            "apply",
            state_file.to_str().unwrap(),
            "-t",
            "web-01",
            "--async",
        ],
    );
    let (code, job, results, shown) = finished(&server, &operator, &applied);
    assert_eq!(code, 0, "{shown:?}");
    assert_eq!(job["kind"], "state.apply");
    assert_eq!(results[0]["status"], "changed", "{shown:?}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "hi\n");

    // job list: newest first, for any key; job show needs the operator role.
    let listed = svcctl(&server, &readonly, &["-o", "json", "job", "list"]);
    assert_eq!(listed.code, 0, "{listed:?}");
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [&applied, &sync_id, &failing, &id]);
    let table = svcctl(&server, &readonly, &["job", "list", "--limit", "1"]);
    assert!(table.stdout.contains("state.apply") && table.stdout.contains("1 changed"));
    assert!(!table.stdout.contains(&id), "{table:?}");
    let denied = svcctl(&server, &readonly, &["job", "show", &id]);
    assert_eq!(denied.code, 4, "{denied:?}");

    // An unknown id is a clear error, with exit code 5.
    let unknown = svcctl(
        &server,
        &operator,
        &["job", "show", "01JZZZZZZZZZZZZZZZZZZZZZZZ"],
    );
    assert_eq!(unknown.code, 5, "{unknown:?}");
    assert!(unknown.stderr.contains("not found"), "{unknown:?}");
    assert!(unknown.stderr.contains("newest 1000 jobs"), "{unknown:?}");

    // The REST views the console reads.
    let jobs = server
        .request("GET", "/api/v1/jobs?limit=2", Some(&readonly), None)
        .json();
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 2, "{jobs}");
    let one = server
        .request(
            "GET",
            &format!("/api/v1/jobs/{id}?limit=1"),
            Some(&operator),
            None,
        )
        .json();
    assert_eq!(one["job"]["id"], id.as_str());
    assert_eq!(one["results"][0]["agent_id"], "web-01", "{one}");
    assert_eq!(one["next_after"], "web-01");
    let rest = server
        .request(
            "GET",
            &format!("/api/v1/jobs/{id}?after=web-01"),
            Some(&operator),
            None,
        )
        .json();
    assert_eq!(rest["results"][0]["agent_id"], "web-02", "{rest}");
    assert!(rest["next_after"].is_null());
    let missing = server.request("GET", "/api/v1/jobs/nope", Some(&operator), None);
    assert_eq!(missing.status, 404, "{}", missing.body);
}

#[test]
fn past_twenty_targets_exec_prints_a_summary_and_verbose_prints_all() {
    let server = TestServer::start();
    let web1 = Agent::start(&server, "web-01", "role=web");
    let web2 = Agent::start(&server, "web-02", "role=web");
    connected(&server, &[&web1, &web2]);
    // Twenty more enrolled but never started: they count as targets, unreachable.
    let idle: Vec<Agent> = (0..20)
        .map(|i| Agent::new(&format!("idle-{i:02}")))
        .collect();
    for agent in &idle {
        let enrolled =
            agent.bootstrap(&server, &["--server", &server.bus, "--labels", "role=idle"]);
        assert_eq!(enrolled.code, 0, "{enrolled:?}");
    }
    let (_, operator) = server.create_key("ops", "operator");
    let command = [
        "exec",
        "--",
        "sh",
        "-c",
        "echo out; echo first failure >&2; exit 2",
    ];

    let summary = svcctl(&server, &operator, &command);
    assert_eq!(summary.code, 1, "{summary:?}");
    assert!(
        summary.stdout.contains("22 agents: more than 20"),
        "{summary:?}"
    );
    assert!(!summary.stdout.contains("== web-01"), "{summary:?}");
    assert!(
        summary.stdout.contains("exit 2: first failure"),
        "{summary:?}"
    );
    assert!(summary.stdout.contains("idle-07"), "{summary:?}");
    assert!(
        summary.stderr.contains("2 failed, 20 unreachable"),
        "{summary:?}"
    );

    let verbose = svcctl(
        &server,
        &operator,
        &[&command[..1], &["--verbose"], &command[1..]].concat(),
    );
    assert_eq!(verbose.code, 1, "{verbose:?}");
    assert!(
        verbose.stdout.contains("== web-01  failed  exit 2"),
        "{verbose:?}"
    );
    assert!(verbose.stdout.contains("  out"), "{verbose:?}");

    let json = svcctl(
        &server,
        &operator,
        &[&["-o", "json"], &command[..]].concat(),
    );
    assert_eq!(json.code, 1, "{json:?}");
    assert_eq!(json_lines(&json).len(), 23, "{json:?}");

    // Small fan-outs print as before.
    let small = svcctl(
        &server,
        &operator,
        &["exec", "-t", "role=web", "--", "true"],
    );
    assert_eq!(small.code, 0, "{small:?}");
    assert!(small.stdout.contains("== web-02  ok  exit 0"), "{small:?}");

    // job show of the big job summarizes the same way.
    let id = json_lines(&json)[0]["job_id"].as_str().unwrap().to_string();
    let shown = svcctl(&server, &operator, &["job", "show", &id]);
    assert_eq!(shown.code, 1, "{shown:?}");
    assert!(
        shown.stdout.contains("22 agents: more than 20"),
        "{shown:?}"
    );
    assert!(shown.stdout.contains("exit 2: first failure"), "{shown:?}");
}

#[test]
fn retention_keeps_the_newest_jobs_and_cuts_stored_output() {
    let server = TestServer::start_with(Options {
        env: vec![
            ("SVC_JOBS__KEEP".into(), "3".into()),
            ("SVC_JOBS__MAX_OUTPUT_BYTES".into(), "100".into()),
        ],
        ..Options::default()
    });
    let web1 = Agent::start(&server, "web-01", "role=web");
    connected(&server, &[&web1]);
    let (_, operator) = server.create_key("ops", "operator");

    let mut ids = Vec::new();
    for i in 0..5 {
        let ran = svcctl(
            &server,
            &operator,
            &[
                "-o",
                "json",
                "exec",
                "--",
                "sh",
                "-c",
                &format!("head -c 1000 /dev/zero | tr '\\0' x; echo {i}"),
            ],
        );
        assert_eq!(ran.code, 0, "{ran:?}");
        let lines = json_lines(&ran);
        // The live stream is not cut.
        assert_eq!(lines[0]["stdout"].as_str().unwrap().len(), 1002, "{ran:?}");
        ids.push(lines[0]["job_id"].as_str().unwrap().to_string());
    }
    let listed = svcctl(&server, &operator, &["-o", "json", "job", "list"]);
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    let kept: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(kept, [&ids[4], &ids[3], &ids[2]], "{listed}");
    let gone = svcctl(&server, &operator, &["job", "show", &ids[0]]);
    assert_eq!(gone.code, 5, "{gone:?}");

    // The stored copy is cut at jobs.max_output_bytes and says so.
    let (_, _, results, shown) = finished(&server, &operator, &ids[4]);
    assert_eq!(
        results[0]["stdout"].as_str().unwrap().len(),
        100,
        "{shown:?}"
    );
    assert_eq!(results[0]["truncated"], true, "{shown:?}");

    // A bad retention setting stops the server at start.
    let checked = run(server
        .names
        .command("svc-server")
        .args(["--check-config"])
        .env("SVC_JOBS__KEEP", "0"));
    assert_ne!(checked.code, 0, "{checked:?}");
    assert!(checked.stderr.contains("jobs.keep"), "{checked:?}");
}

#[test]
fn jobs_older_than_max_age_are_pruned() {
    let server = TestServer::start_with(Options {
        env: vec![("SVC_JOBS__MAX_AGE".into(), "2s".into())],
        ..Options::default()
    });
    let web1 = Agent::start(&server, "web-01", "role=web");
    connected(&server, &[&web1]);
    let old = start_async(
        &server,
        &server.admin_key,
        &["exec", "--async", "--", "true"],
    );
    finished(&server, &server.admin_key, &old);
    std::thread::sleep(Duration::from_millis(2100));
    let new = start_async(
        &server,
        &server.admin_key,
        &["exec", "--async", "--", "true"],
    );
    assert_eq!(show(&server, &server.admin_key, &old).0, 5);
    assert_eq!(finished(&server, &server.admin_key, &new).0, 0);
}

/// Job `id`'s events once its `job_finished` is stored, oldest first: (type, source,
/// payload).
fn job_events(server: &TestServer, id: &str) -> Vec<(String, String, serde_json::Value)> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let listed = run(server.cli("svc-events").args([
            "--api-key",
            &server.admin_key,
            "-o",
            "json",
            "list",
            "--category",
            "job",
            "--limit",
            "1000",
        ]));
        assert_eq!(listed.code, 0, "{listed:?}");
        let listed: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
        let mut items: Vec<serde_json::Value> = listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["payload"]["job_id"] == id)
            .cloned()
            .collect();
        items.sort_by_key(|e| e["seq"].as_u64());
        if items.iter().any(|e| e["type"] == "job_finished") {
            return items
                .into_iter()
                .map(|e| {
                    (
                        e["type"].as_str().unwrap().to_string(),
                        e["source"].as_str().unwrap().to_string(),
                        e["payload"].clone(),
                    )
                })
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "no job_finished for {id}: {items:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The job id of an exec run with `-o json` (its first result line).
fn job_id_of(ran: &Run) -> String {
    json_lines(ran)[0]["job_id"].as_str().unwrap().to_string()
}

/// (type, source) of each event, in order.
fn kinds(events: &[(String, String, serde_json::Value)]) -> Vec<(&str, &str)> {
    events
        .iter()
        .map(|(t, s, _)| (t.as_str(), s.as_str()))
        .collect()
}

#[test]
fn past_per_agent_events_a_fan_out_emits_its_job_and_the_failures_only() {
    let server = TestServer::start_with(Options {
        env: vec![("SVC_JOBS__PER_AGENT_EVENTS".into(), "2".into())],
        ..Options::default()
    });
    let web1 = Agent::start(&server, "web-01", "role=web");
    let web2 = Agent::start(&server, "web-02", "role=web");
    let web3 = Agent::start(&server, "web-03", "role=web");
    connected(&server, &[&web1, &web2, &web3]);
    let (_, operator) = server.create_key("ops", "operator");

    // Two targets: within the bound, each agent's events as before, between the job's two.
    let small = svcctl(
        &server,
        &operator,
        &["-o", "json", "exec", "-t", "web-01,web-02", "--", "true"],
    );
    assert_eq!(small.code, 0, "{small:?}");
    let small_id = job_id_of(&small);
    let events = job_events(&server, &small_id);
    let of_small = kinds(&events);
    assert_eq!(of_small.len(), 6, "{events:?}");
    assert_eq!(
        of_small[0],
        ("job_started", small_id.as_str()),
        "{events:?}"
    );
    assert_eq!(
        of_small[5],
        ("job_finished", small_id.as_str()),
        "{events:?}"
    );
    for agent in ["web-01", "web-02"] {
        for kind in ["command_dispatched", "command_completed"] {
            assert!(
                of_small.contains(&(kind, agent)),
                "{kind} {agent}: {events:?}"
            );
        }
    }

    // Three targets, one of them failing: past the bound, the job's two events and the one
    // failure; every agent's result is still in the job's history.
    let large = svcctl(
        &server,
        &operator,
        &[
            "-o",
            "json",
            "exec",
            "--",
            "sh",
            "-c",
            "test \"$SVC_AGENT_ID\" != web-03",
        ],
    );
    assert_eq!(large.code, 1, "web-03 fails: {large:?}");
    let large_id = job_id_of(&large);
    let of_large = job_events(&server, &large_id);
    assert_eq!(
        kinds(&of_large),
        [
            ("job_started", large_id.as_str()),
            ("command_failed", "web-03"),
            ("job_finished", large_id.as_str()),
        ],
        "{of_large:?}"
    );
    let started = &of_large[0].2;
    assert_eq!(started["kind"], "exec", "{started}");
    assert_eq!(started["agents"], 3, "{started}");
    assert_eq!(started["per_agent_events"], false, "{started}");
    assert_eq!(started["by"], "ops", "{started}");
    let finished_event = &of_large[2].2;
    assert_eq!(
        finished_event["counts"],
        serde_json::json!({"ok": 2, "failed": 1}),
        "{finished_event}"
    );
    let (_, _, results, shown) = finished(&server, &operator, &large_id);
    assert_eq!(results.len(), 3, "{shown:?}");
}
