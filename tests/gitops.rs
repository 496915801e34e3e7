//! svc-gitops end to end: a real git repository with several commits (system `git`), a real
//! server and agent. verify finds a drifted file on the host and a commit that changed a
//! state file; rollback applies the tree at an older commit.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::{json_of, run, Run, TestServer};

fn git(repo: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .current_dir(repo)
        .args([
            "-c",
            "user.name=svc test",
            "-c",
            "user.email=test@example.invalid",
        ])
        .args([
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(output.status.success(), "git {args:?}: {output:?}");
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

fn gitops(server: &TestServer, args: &[&str]) -> Run {
    run(server
        .cli("svc-gitops")
        .args(["--api-key", &server.admin_key])
        .args(args))
}

fn wait_connected(server: &TestServer, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let shown = run(server.cli("svcctl").args([
            "--api-key",
            &server.admin_key,
            "-o",
            "json",
            "agent",
            "show",
            id,
        ]));
        if shown.code == 0 && json_of(&shown)["state"] == "connected" {
            return;
        }
        assert!(Instant::now() < deadline, "{id} not connected: {shown:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn verify_finds_drift_and_changed_commits_and_rollback_applies_an_older_tree() {
    let server = TestServer::start();
    let _agent = Agent::start(&server, "web-01", "role=web");
    wait_connected(&server, "web-01");
    let work = tempfile::tempdir().unwrap();
    let host = work.path().join("host");
    std::fs::create_dir(&host).unwrap();
    let repo = work.path().join("repo");
    std::fs::create_dir_all(repo.join("ops/states")).unwrap();
    git(&repo, &["init", "--quiet"]);
    let write_state = |content: &str| {
        std::fs::write(
            repo.join("ops/states/web.yaml"),
            format!(
                "- file: {{path: {}/app.conf, content: \"{content}\\n\"}}\n\
                 - command: {{run: \"true\"}}\n",
                host.display()
            ),
        )
        .unwrap();
    };
    std::fs::write(
        repo.join("ops/gitops.yaml"),
        "- target: role=web\n  state: states/web.yaml\n",
    )
    .unwrap();
    write_state("v1");
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "--quiet", "-m", "v1"]);
    let first = git(&repo, &["rev-parse", "HEAD"]);
    write_state("v2");
    git(&repo, &["commit", "--quiet", "-am", "v2"]);
    let second = git(&repo, &["rev-parse", "HEAD"]);
    let repo_text = repo.display().to_string();
    let repo_args = ["--repo", repo_text.as_str(), "--path", "ops"];

    // Nothing applied yet: the file the repository wants is missing.
    let before = gitops(
        &server,
        &[&["-o", "json", "verify"], &repo_args[..]].concat(),
    );
    assert_eq!(before.code, 1, "{before:?}");
    let report = json_of(&before);
    assert_eq!(report["commit"], second.as_str());
    assert_eq!(
        report["differences"].as_array().unwrap().len(),
        1,
        "{report}"
    );

    // Apply the head commit's tree; now nothing differs (the unguarded command never counts).
    let applied = gitops(
        &server,
        &[&["rollback", "--to", "HEAD"], &repo_args[..]].concat(),
    );
    assert_eq!(applied.code, 0, "{applied:?}");
    assert_eq!(
        std::fs::read_to_string(host.join("app.conf")).unwrap(),
        "v2\n"
    );
    let clean = gitops(&server, &[&["verify"], &repo_args[..]].concat());
    assert_eq!(clean.code, 0, "{clean:?}");
    assert!(clean.stdout.contains("no differences"), "{clean:?}");

    // A drifted file on the host is a difference, named in the table.
    std::fs::write(host.join("app.conf"), "edited by hand\n").unwrap();
    let drifted = gitops(&server, &[&["verify"], &repo_args[..]].concat());
    assert_eq!(drifted.code, 1, "{drifted:?}");
    assert!(drifted.stdout.contains("web-01"), "{drifted:?}");
    assert!(
        drifted
            .stdout
            .contains(&format!("file:{}/app.conf", host.display())),
        "{drifted:?}"
    );
    assert!(drifted.stdout.contains("content differs"), "{drifted:?}");

    // Roll back to the first commit: the host has v1; the head commit (which changed the
    // state file) now differs from the host, the first commit does not.
    let rolled = gitops(
        &server,
        &[&["rollback", "--to", first.as_str()], &repo_args[..]].concat(),
    );
    assert_eq!(rolled.code, 0, "{rolled:?}");
    assert_eq!(
        std::fs::read_to_string(host.join("app.conf")).unwrap(),
        "v1\n"
    );
    let head = gitops(&server, &[&["verify"], &repo_args[..]].concat());
    assert_eq!(head.code, 1, "{head:?}");
    assert!(head.stdout.contains(&second), "{head:?}");
    let at_first = gitops(
        &server,
        &[&["verify", "--ref", first.as_str()], &repo_args[..]].concat(),
    );
    assert_eq!(at_first.code, 0, "{at_first:?}");

    // An unknown commit is a clear failure.
    let unknown = gitops(
        &server,
        &[&["verify", "--ref", "no-such-ref"], &repo_args[..]].concat(),
    );
    assert_eq!(unknown.code, 1, "{unknown:?}");
    assert!(unknown.stderr.contains("git checkout"), "{unknown:?}");
}
