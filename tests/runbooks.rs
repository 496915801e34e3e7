//! Runbooks end to end (issue 18): a real server with a runbook_dir, the real svc-runbook.
//! A diamond DAG whose middle steps run in parallel, a failing step with retries and a
//! rollback, an approval that only a second key may give, a cycle named by `test` with no
//! server, an execution resumed after kill -9, and an event trigger that fires once per
//! event.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{json_of, run, Options, TestServer};
use serde_json::Value;

const DIAMOND: &str = "
name: diamond
description: a diamond
parameters: [{name: tag, default: plain}]
steps:
  - {id: start, kind: emit, event: command_dispatched, payload: {tag: '{{tag}}'}}
  - {id: left, kind: sleep, duration: 1s, needs: [start]}
  - {id: right, kind: sleep, duration: 1s, needs: [start]}
  - {id: join, kind: emit, event: command_completed, payload: {tag: '{{tag}}'}, needs: [left, right]}
";

const FAILING: &str = "
name: failing
steps:
  - {id: prepare, kind: emit, event: command_dispatched}
  - {id: wait, kind: wait_event, event: state_drift_detected, timeout: 300ms, retries: 1, needs: [prepare], on_failure: rollback}
  - {id: after, kind: emit, event: command_completed, needs: [wait]}
rollback:
  - {id: undo, kind: emit, event: command_failed, payload: {undo: 'yes'}}
";

const GATED: &str = "
name: gated
steps:
  - {id: ask, kind: approve, message: go ahead?}
  - {id: done, kind: emit, event: command_completed, needs: [ask]}
";

const SLOW: &str = "
name: slow
steps:
  - {id: first, kind: emit, event: command_dispatched}
  - {id: nap, kind: sleep, duration: 4s, needs: [first]}
  - {id: last, kind: emit, event: command_completed, needs: [nap]}
";

const TRIGGERED: &str = "
name: on-disconnect
on: {event: agent_disconnected, filter: {payload.reason: drill}}
steps:
  - {id: diagnose, kind: emit, event: command_completed, payload: {diagnosed: 'yes'}}
";

const FLEET: &str = "
name: fleet-check
parameters: [{name: target, default: 'role=web'}]
steps:
  - {id: hello, kind: exec, target: '{{target}}', command: [echo, hello-from-runbook]}
  - {id: broken, kind: exec, target: '{{target}}', command: 'false', needs: [hello], on_failure: continue}
  - {id: after, kind: emit, event: command_completed, needs: [broken]}
";

const CYCLE: &str = "
name: cycle
steps:
  - {id: a, kind: sleep, duration: 1s, needs: [c]}
  - {id: b, kind: sleep, duration: 1s, needs: [a]}
  - {id: c, kind: sleep, duration: 1s, needs: [b]}
";

fn server_with(dir: &Path) -> TestServer {
    for (name, text) in [
        ("diamond.yaml", DIAMOND),
        ("failing.yaml", FAILING),
        ("gated.yaml", GATED),
        ("slow.yaml", SLOW),
        ("triggered.yaml", TRIGGERED),
        ("fleet.yaml", FLEET),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
    TestServer::start_with(Options {
        config_yaml: format!("runbook_dir: {}\n", dir.display()),
        ..Options::default()
    })
}

fn runbook(server: &TestServer, key: &str, args: &[&str]) -> common::Run {
    run(server
        .cli("svc-runbook")
        .arg("--api-key")
        .arg(key)
        .args(args))
}

fn execute(server: &TestServer, key: &str, name: &str) -> String {
    let started = runbook(server, key, &["execute", name]);
    assert_eq!(started.code, 0, "{started:?}");
    started.stdout.trim().to_string()
}

fn status(server: &TestServer, key: &str, id: &str) -> Value {
    json_of(&runbook(server, key, &["-o", "json", "status", id]))
}

fn wait_until(server: &TestServer, key: &str, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = status(server, key, id);
        if done(&view) {
            return view;
        }
        assert!(Instant::now() < deadline, "timed out: {view:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn finished(view: &Value) -> bool {
    view["status"] != "running"
}

fn step<'a>(view: &'a Value, id: &str) -> &'a Value {
    view["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("no step {id} in {view:#}"))
}

fn events_from(server: &TestServer, key: &str, event_type: &str, source: &str) -> Vec<Value> {
    let listed = run(server.cli("svc-events").args([
        "--api-key",
        key,
        "-o",
        "json",
        "list",
        "--type",
        event_type,
        "--source",
        source,
    ]));
    assert_eq!(listed.code, 0, "{listed:?}");
    json_of(&listed)["items"].as_array().unwrap().clone()
}

#[test]
fn test_names_a_cycle_and_prints_the_plan_without_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let names = common::Names::new();
    let cycle = dir.path().join("cycle.yaml");
    std::fs::write(&cycle, CYCLE).unwrap();
    let tested = run(names.command("svc-runbook").arg("test").arg(&cycle));
    assert_eq!(tested.code, 1, "{tested:?}");
    assert!(
        tested.stderr.contains("cycle: a -> c -> b -> a"),
        "{tested:?}"
    );

    let diamond = dir.path().join("diamond.yaml");
    std::fs::write(&diamond, DIAMOND).unwrap();
    let tested = run(names
        .command("svc-runbook")
        .arg("test")
        .arg(&diamond)
        .args(["--set", "tag=blue"]));
    assert_eq!(tested.code, 0, "{tested:?}");
    assert!(
        tested.stdout.contains("1  start  emit command_dispatched"),
        "{tested:?}"
    );
    assert!(tested.stdout.contains("2  left  sleep 1s"), "{tested:?}");
    assert!(tested.stdout.contains("2  right  sleep 1s"), "{tested:?}");
    assert!(tested.stdout.contains("3  join"), "{tested:?}");
}

#[test]
fn diamond_rollback_approval_and_trigger() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with(dir.path());
    let (alice_id, alice) = server.create_key("alice", "operator");
    let (bob_id, bob) = server.create_key("bob", "operator");
    let (_, reader) = server.create_key("reader", "readonly");

    let listed = json_of(&runbook(&server, &reader, &["-o", "json", "list"]));
    assert_eq!(listed.as_array().unwrap().len(), 6, "{listed:#}");
    let denied = runbook(&server, &reader, &["execute", "diamond"]);
    assert_eq!(denied.code, 4, "{denied:?}");
    let tested = runbook(&server, &reader, &["test", "diamond"]);
    assert_eq!(tested.code, 0, "{tested:?}");

    // The diamond: left and right overlap in time, join starts after both.
    let id = execute(&server, &alice, "diamond");
    let view = wait_until(&server, &reader, &id, finished);
    assert_eq!(view["status"], "succeeded", "{view:#}");
    let time =
        |step_id: &str, field: &str| step(&view, step_id)[field].as_str().unwrap().to_string();
    assert!(
        time("left", "started_at") < time("right", "finished_at"),
        "{view:#}"
    );
    assert!(
        time("right", "started_at") < time("left", "finished_at"),
        "{view:#}"
    );
    assert!(
        time("join", "started_at") >= time("left", "finished_at"),
        "{view:#}"
    );
    assert!(
        time("join", "started_at") >= time("right", "finished_at"),
        "{view:#}"
    );
    let emitted = events_from(
        &server,
        &reader,
        "command_completed",
        &format!("runbook:{id}"),
    );
    assert_eq!(emitted.len(), 1);
    assert_eq!(emitted[0]["payload"]["tag"], "plain");

    // A failing step: retried once, then the rollback runs and the rest is skipped.
    let id = execute(&server, &alice, "failing");
    let view = wait_until(&server, &reader, &id, finished);
    assert_eq!(view["status"], "failed", "{view:#}");
    assert_eq!(step(&view, "wait")["status"], "failed");
    assert_eq!(step(&view, "wait")["attempts"], 2);
    assert_eq!(step(&view, "after")["status"], "skipped");
    assert_eq!(step(&view, "rollback:undo")["status"], "succeeded");
    assert_eq!(
        events_from(&server, &reader, "command_failed", &format!("runbook:{id}")).len(),
        1
    );

    // An approval: not by the key that started it, yes by another.
    let id = execute(&server, &alice, "gated");
    wait_until(&server, &reader, &id, |v| {
        step(v, "ask")["status"] == "waiting"
    });
    let refused = runbook(&server, &alice, &["approve", &id, "ask"]);
    assert_eq!(refused.code, 4, "{refused:?}");
    let approved = runbook(&server, &bob, &["approve", &id, "ask"]);
    assert_eq!(approved.code, 0, "{approved:?}");
    let view = wait_until(&server, &reader, &id, finished);
    assert_eq!(view["status"], "succeeded", "{view:#}");
    assert_eq!(step(&view, "ask")["approved_by"], bob_id.as_str());
    assert_eq!(view["started_by"], alice_id.as_str());
    let audit = json_of(&runbook(&server, &reader, &["-o", "json", "audit", &id]));
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["action"].as_str())
        .collect();
    for action in [
        "runbook.execute",
        "runbook.approve",
        "runbook.step",
        "runbook.finish",
    ] {
        assert!(actions.contains(&action), "{action} in {actions:?}");
    }
    assert!(audit
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["action"] == "runbook.approve" && r["outcome"] == "denied"));

    // A trigger: one execution per matching event, none for another.
    let emit = |reason: &str| {
        let emitted = run(server.cli("svc-events").args([
            "--api-key",
            &alice,
            "emit",
            "--type",
            "agent_disconnected",
            "--payload",
            &format!("{{\"reason\":\"{reason}\"}}"),
        ]));
        assert_eq!(emitted.code, 0, "{emitted:?}");
    };
    let triggered = || {
        json_of(&runbook(
            &server,
            &reader,
            &[
                "-o",
                "json",
                "list-executions",
                "--runbook",
                "on-disconnect",
            ],
        ))
        .as_array()
        .unwrap()
        .clone()
    };
    emit("drill");
    emit("other");
    let deadline = Instant::now() + Duration::from_secs(30);
    while triggered()
        .iter()
        .filter(|e| e["status"] == "succeeded")
        .count()
        < 1
    {
        assert!(Instant::now() < deadline, "trigger did not fire");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(triggered().len(), 1, "once for the matching event only");
    emit("drill");
    let deadline = Instant::now() + Duration::from_secs(30);
    while triggered()
        .iter()
        .filter(|e| e["status"] == "succeeded")
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "second trigger did not fire");
        std::thread::sleep(Duration::from_millis(100));
    }
    let executions = triggered();
    assert_eq!(executions.len(), 2);
    assert_ne!(
        executions[0]["trigger_event_id"],
        executions[1]["trigger_event_id"]
    );
}

#[test]
fn an_execution_resumes_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = server_with(dir.path());
    let (_, operator) = server.create_key("op", "operator");
    let id = execute(&server, &operator, "slow");
    wait_until(&server, &operator, &id, |v| {
        step(v, "nap")["status"] == "running"
    });
    server.stop_with(libc::SIGKILL);
    server.spawn(&[]);
    let view = wait_until(&server, &operator, &id, finished);
    assert_eq!(view["status"], "succeeded", "{view:#}");
    assert_eq!(step(&view, "last")["status"], "succeeded");
    // The finished step before the kill did not run again.
    let source = format!("runbook:{id}");
    assert_eq!(
        events_from(&server, &operator, "command_dispatched", &source).len(),
        1
    );
    assert_eq!(
        events_from(&server, &operator, "command_completed", &source).len(),
        1
    );
}

#[test]
fn exec_steps_reach_real_agents() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with(dir.path());
    let (_, operator) = server.create_key("op", "operator");
    let _agent = common::agent::Agent::start(&server, "web-1", "role=web");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed =
            run(server
                .cli("svcctl")
                .args(["--api-key", &operator, "-o", "json", "agent", "list"]));
        if json_of(&listed)
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["id"] == "web-1" && a["state"] == "connected")
        {
            break;
        }
        assert!(Instant::now() < deadline, "web-1 did not connect");
        std::thread::sleep(Duration::from_millis(100));
    }

    let dry = runbook(&server, &operator, &["execute", "fleet-check", "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
    assert!(dry.stdout.contains("hello reaches: web-1"), "{dry:?}");
    assert_eq!(
        json_of(&runbook(
            &server,
            &operator,
            &["-o", "json", "list-executions"]
        ))
        .as_array()
        .unwrap()
        .len(),
        0,
        "a dry run starts nothing"
    );

    let id = execute(&server, &operator, "fleet-check");
    let view = wait_until(&server, &operator, &id, finished);
    // `broken` failed, but with on_failure: continue the rest ran and the execution passed.
    assert_eq!(view["status"], "succeeded", "{view:#}");
    let hello = step(&view, "hello");
    assert_eq!(hello["status"], "succeeded");
    assert_eq!(hello["output"][0]["agent_id"], "web-1");
    assert!(hello["output"][0]["stdout"]
        .as_str()
        .unwrap()
        .contains("hello-from-runbook"));
    assert_eq!(step(&view, "broken")["status"], "failed");
    assert_eq!(step(&view, "after")["status"], "succeeded");

    // The fleet's own audit rows are the execution's, under its principal.
    let audit = json_of(&runbook(&server, &operator, &["-o", "json", "audit", &id]));
    let runs: Vec<&Value> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "exec.run")
        .collect();
    assert_eq!(runs.len(), 2, "{audit:#}");
    assert!(runs
        .iter()
        .all(|r| r["user"] == format!("runbook:{id}").as_str()));
}

#[test]
fn cancel_stops_an_execution() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with(dir.path());
    let (_, operator) = server.create_key("op", "operator");
    let id = execute(&server, &operator, "slow");
    wait_until(&server, &operator, &id, |v| {
        step(v, "nap")["status"] == "running"
    });
    let cancelled = runbook(&server, &operator, &["cancel", &id]);
    assert_eq!(cancelled.code, 0, "{cancelled:?}");
    let view = wait_until(&server, &operator, &id, |v| {
        step(v, "nap")["status"] == "cancelled"
    });
    assert_eq!(view["status"], "cancelled", "{view:#}");
    assert_eq!(step(&view, "last")["status"], "cancelled");
    let again = runbook(&server, &operator, &["cancel", &id]);
    assert_eq!(again.code, 1, "{again:?}");
    // --follow ends with the execution.
    let followed = runbook(&server, &operator, &["status", &id, "--follow"]);
    assert_eq!(followed.code, 0, "{followed:?}");
    assert!(followed.stdout.contains("cancelled"), "{followed:?}");
    let source = format!("runbook:{id}");
    assert!(events_from(&server, &operator, "command_completed", &source).is_empty());
}

/// The trigger tail reads events only while a runbook has `on:` (issue 21): a server that
/// starts with none still fires a trigger added later and reloaded with SIGHUP, for events
/// from then on, and stops when it is removed again.
#[test]
fn a_trigger_added_on_sighup_fires_and_one_removed_stops() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("slow.yaml"), SLOW).unwrap();
    let server = TestServer::start_with(Options {
        config_yaml: format!("runbook_dir: {}\n", dir.path().display()),
        ..Options::default()
    });
    let key = &server.admin_key;
    let emit = || {
        let emitted = run(server.cli("svc-events").args([
            "--api-key",
            key,
            "emit",
            "--type",
            "agent_disconnected",
            "--payload",
            "{\"reason\":\"drill\"}",
        ]));
        assert_eq!(emitted.code, 0, "{emitted:?}");
    };
    let executions = || {
        let listed = runbook(&server, key, &["-o", "json", "list-executions"]);
        json_of(&listed)
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["runbook"] == "on-disconnect")
            .count()
    };
    let reload = || {
        // SAFETY: signalling the test's own child process.
        unsafe { libc::kill(server.pid() as i32, libc::SIGHUP) };
        let deadline = Instant::now() + Duration::from_secs(10);
        let wanted = dir.path().join("triggered.yaml").exists();
        loop {
            let listed = runbook(&server, key, &["-o", "json", "list"]);
            if listed.stdout.contains("on-disconnect") == wanted {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "SIGHUP did not reload: {listed:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // The tail starts (or stops) a moment after the reload is visible.
        std::thread::sleep(Duration::from_millis(500));
    };
    emit();
    std::fs::write(dir.path().join("triggered.yaml"), TRIGGERED).unwrap();
    reload();
    assert_eq!(executions(), 0, "an event from before the trigger existed");
    emit();
    let deadline = Instant::now() + Duration::from_secs(30);
    while executions() < 1 {
        assert!(
            Instant::now() < deadline,
            "the trigger added on SIGHUP did not fire"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::remove_file(dir.path().join("triggered.yaml")).unwrap();
    reload();
    emit();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(executions(), 1, "a removed trigger fired");
}
