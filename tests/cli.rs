//! The one binary under every name: help, version, dispatch, plugins, exit codes.

mod common;

use common::{run, Names};

#[test]
fn every_name_answers_help_and_version_through_its_symlink() {
    let names = Names::new();
    for name in svc::dispatch::names() {
        for flag in ["-h", "--help"] {
            let result = run(names.command(name).arg(flag));
            assert_eq!(result.code, 0, "{name} {flag}: {result:?}");
            assert!(
                result.stdout.contains("Usage:"),
                "{name} {flag}: {result:?}"
            );
            assert!(
                result.stdout.contains(name.split(' ').next().unwrap()),
                "{name}: {result:?}"
            );
        }
        for flag in ["-v", "--version"] {
            let result = run(names.command(name).arg(flag));
            assert_eq!(result.code, 0, "{name} {flag}: {result:?}");
            let line = result.stdout.trim_end();
            assert_eq!(line.lines().count(), 1, "{name}: {result:?}");
            let expected_start = format!("{name} {} (commit ", env!("CARGO_PKG_VERSION"));
            assert!(line.starts_with(&expected_start), "{name}: {line}");
            assert!(
                line.contains(", built 20") && line.ends_with(')'),
                "{name}: {line}"
            );
        }
    }
}

#[test]
fn svc_dispatches_on_its_first_argument() {
    let names = Names::new();
    let listed = run(names.command("svc").arg("--list"));
    assert_eq!(listed.code, 0);
    assert_eq!(
        listed.stdout.lines().collect::<Vec<_>>(),
        svc::dispatch::names()
    );

    let events = run(names.command("svc").args(["events", "--help"]));
    assert_eq!(events.code, 0);
    assert!(events.stdout.contains("Usage: svc-events"), "{events:?}");

    let ctl = run(names.command("svc").args(["ctl", "--help"]));
    assert_eq!(ctl.code, 0);
    assert!(ctl.stdout.contains("Usage: svcctl"), "{ctl:?}");

    let server = run(names.command("svc").args(["server", "--help"]));
    assert_eq!(server.code, 0);
    assert!(server.stdout.contains("--check-config"), "{server:?}");

    let unknown = run(names.command("svc").arg("frobnicate"));
    assert_eq!(unknown.code, 127, "{unknown:?}");
    assert!(
        unknown
            .stderr
            .starts_with("svc: unknown command 'frobnicate'"),
        "{unknown:?}"
    );
}

#[test]
fn unknown_program_name_is_refused() {
    let names = Names::new();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_svc"), names.path("svc-nope")).unwrap();
    let result = run(&mut names.command("svc-nope"));
    assert_eq!(result.code, 127, "{result:?}");
}

#[test]
fn svcctl_runs_built_in_modes_and_plugins() {
    let names = Names::new();
    // A built-in svc-NAME mode runs in-process.
    let audit = run(names.command("svcctl").args(["audit", "--help"]));
    assert_eq!(audit.code, 0, "{audit:?}");
    assert!(audit.stdout.contains("Usage: svc-audit"), "{audit:?}");

    // A plugin: an executable svc-NAME on PATH gets the remaining arguments.
    let plugins = tempfile::tempdir().unwrap();
    let plugin = plugins.path().join("svc-hello");
    std::fs::write(
        &plugin,
        "#!/bin/sh\necho \"hello from plugin: $*\"\nexit 7\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        plugins.path().display(),
        std::env::var("PATH").unwrap()
    );
    let result = run(names
        .command("svcctl")
        .env("PATH", &path)
        .args(["hello", "a", "--b"]));
    assert_eq!(result.code, 7, "{result:?}");
    assert_eq!(result.stdout, "hello from plugin: a --b\n");

    // Unknown and not on PATH: 127 with the command list.
    let missing = run(names.command("svcctl").env("PATH", &path).arg("nonesuch"));
    assert_eq!(missing.code, 127, "{missing:?}");
    assert!(
        missing
            .stderr
            .starts_with("svcctl: unknown command 'nonesuch'"),
        "{missing:?}"
    );
    assert!(missing.stderr.contains("apikey"), "{missing:?}");
}

#[test]
fn module_run_on_agents_without_a_server_says_so() {
    // Every CLI is built now: `run --target`, the last flag that was not, talks to the server.
    let names = Names::new();
    let home = tempfile::tempdir().unwrap();
    let init = run(names
        .command("svc-module")
        .current_dir(home.path())
        .args(["init", "m"]));
    assert_eq!(init.code, 0, "{init:?}");
    let result = run(names
        .command("svc-module")
        .current_dir(home.path())
        .args(["--server", "127.0.0.1:1", "--api-key", "k"])
        .args(["run", "m", "setup", "--arg", "message=x", "--target", "*"]));
    assert_ne!(result.code, 0, "{result:?}");
    assert!(!result.stderr.contains("not implemented"), "{result:?}");
    assert!(result.stderr.contains("127.0.0.1:1"), "{result:?}");
    assert!(result.stdout.is_empty(), "no fake output: {result:?}");
}

#[test]
fn usage_errors_exit_2() {
    let names = Names::new();
    let cases: &[(&str, &[&str])] = &[
        ("svc-events", &["nonsense"]),
        ("svc-events", &[]),
        ("svcctl", &[]),
        ("svcctl", &["apikey", "create", "--name", "x"]),
        ("svcctl", &["apikey", "frob"]),
        ("svcctl", &["-o", "yaml", "apikey", "list"]),
        ("svc-server", &["--bogus-flag"]),
    ];
    for (name, args) in cases {
        let result = run(names.command(name).args(*args));
        assert_eq!(result.code, 2, "{name} {args:?}: {result:?}");
        assert!(
            result.stderr.starts_with(name.split(' ').next().unwrap()),
            "{result:?}"
        );
    }
}

#[test]
fn bad_flag_values_are_usage_errors_that_list_the_allowed_values() {
    // No server runs: each is refused at parse time (exit 2), before any connection is tried
    // (which would be exit 3), with the allowed values in the message.
    let names = Names::new();
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "svc-events",
            &["list", "--min-severity", "bogus"],
            "expected one of debug, info, warning, error, critical",
        ),
        (
            "svc-events",
            &["watch", "--category", "nope"],
            "expected one of agent, job, bus, policy, security, system",
        ),
        (
            "svc-events",
            &["subscribe", "--type", "agent_connect"],
            "expected one of agent_connected,",
        ),
        (
            "svc-events",
            &["emit", "--type", "bus_healthy", "--severity", "fatal"],
            "expected one of debug, info,",
        ),
        ("svc-events", &["list", "--since", "yesterday"], "RFC 3339"),
        ("svc-events", &["stats", "--until", "soon"], "RFC 3339"),
        (
            "svc-audit",
            &["log", "--min-severity", "info"],
            "expected one of low, medium, high, critical",
        ),
        (
            "svc-audit",
            &["export", "--format", "xml"],
            "expected one of json, jsonl, csv",
        ),
        ("svc-audit", &["stats", "--since", "last week"], "RFC 3339"),
        (
            "svcctl",
            &["apikey", "create", "--name", "x", "--role", "root"],
            "expected one of admin, operator, readonly",
        ),
        (
            "svcctl",
            &["apikey", "update", "K", "--role", "superuser"],
            "expected one of admin, operator, readonly",
        ),
        (
            "svcctl",
            &[
                "apikey", "create", "--name", "x", "--role", "admin", "--ttl", "forever",
            ],
            "expected e.g. 500ms, 30s, 5m, 24h, 7d",
        ),
        (
            "svcctl",
            &[
                "apikey",
                "create",
                "--name",
                "x",
                "--role",
                "admin",
                "--expires-at",
                "2027",
            ],
            "2027-01-01T00:00:00Z",
        ),
        (
            "svcctl",
            &["exec", "--timeout", "soon", "--", "true"],
            "expected e.g. 500ms",
        ),
        (
            "svcctl",
            &["exec", "--target", "role=web,db-01", "--", "true"],
            "labels and ids cannot be mixed",
        ),
        (
            "svcctl",
            &["agent", "list", "-t", "a=b,c"],
            "invalid target",
        ),
        ("svcctl", &["agent", "label", "web-1", "novalue"], "k=v"),
        (
            "svcctl",
            &["state", "drift", "--timeout", "0s"],
            "expected e.g. 500ms",
        ),
        ("svcctl", &["-o", "yaml", "agent", "list"], "table or json"),
        (
            "svc-identity",
            &["token", "create", "--ttl", "1y"],
            "expected e.g. 500ms",
        ),
        (
            "svc-secrets",
            &["transit", "create-key", "k", "--type", "rsa"],
            "expected one of aes256-gcm, ed25519",
        ),
        (
            "svc-secrets",
            &["creds", "mysql"],
            "expected one of postgres",
        ),
        (
            "svc-secrets",
            &["creds", "postgres", "--ttl", "long"],
            "expected e.g. 500ms",
        ),
        (
            "svc-server",
            &["--log-level", "svc=[oops"],
            "expected one of error, warn, info, debug, trace",
        ),
        (
            "svc-agent",
            &["run", "--log-level", "svc=[oops"],
            "expected one of error, warn, info, debug, trace",
        ),
    ];
    for (name, args, allowed) in cases {
        let result = run(names
            .command(name)
            .env("SVC_SERVER", "127.0.0.1:1")
            .env("SVC_HTTP_URL", "http://127.0.0.1:1")
            .env("SVC_API_KEY", "k")
            .args(*args));
        assert_eq!(result.code, 2, "{name} {args:?}: {result:?}");
        assert!(result.stderr.starts_with(name), "{result:?}");
        assert!(
            result.stderr.contains(allowed),
            "{name} {args:?} should list {allowed:?}: {result:?}"
        );
    }
}

/// Issue 35: a day that does not exist was read as a later one (2026-02-31 as March 3rd).
/// Every flag that takes a time refuses it at parse time (exit 2), while a duration ago is
/// still a time: that one passes parsing and fails only on the missing server (exit 3).
#[test]
fn issue_35_days_that_do_not_exist_are_refused() {
    let names = Names::new();
    let cases: &[(&str, &[&str], i32, &str)] = &[
        (
            "svc-audit",
            &["log", "--since", "2026-02-31T00:00:00Z"],
            2,
            "'--since' with value '2026-02-31T00:00:00Z': not a time",
        ),
        (
            "svc-events",
            &["list", "--until", "2025-02-29T12:00:00+01:00"],
            2,
            "not a time",
        ),
        (
            "svcctl",
            &[
                "apikey",
                "create",
                "--name",
                "x",
                "--role",
                "readonly",
                "--expires-at",
                "2027-04-31T00:00:00Z",
            ],
            2,
            "not an RFC 3339 time",
        ),
        ("svc-audit", &["log", "--since", "1h"], 3, ""),
        (
            "svc-events",
            &["list", "--since", "2024-02-29T00:00:00Z"],
            3,
            "",
        ),
    ];
    for (name, args, code, message) in cases {
        let result = run(names
            .command(name)
            .env("SVC_SERVER", "127.0.0.1:1")
            .env("SVC_HTTP_URL", "http://127.0.0.1:1")
            .env("SVC_API_KEY", "k")
            .args(*args));
        assert_eq!(result.code, *code, "{name} {args:?}: {result:?}");
        assert!(
            result.stderr.contains(message),
            "{name} {args:?}: {result:?}"
        );
    }
}

#[test]
fn help_of_nested_commands() {
    let names = Names::new();
    let agent = run(names.command("svcctl").args(["agent", "--help"]));
    assert_eq!(agent.code, 0);
    for word in ["quarantine", "unquarantine", "list", "show", "label"] {
        assert!(agent.stdout.contains(word), "{agent:?}");
    }
    let create = run(names.command("svcctl").args(["apikey", "create", "--help"]));
    assert_eq!(create.code, 0, "{create:?}");
    assert!(create.stdout.contains("--role"), "{create:?}");
    // Each command's help is its own description, with no stray comment glued on.
    let check = run(names.command("svcctl").args(["state", "check", "--help"]));
    assert_eq!(check.code, 0, "{check:?}");
    let description = check.stdout.lines().nth(2).unwrap_or_default();
    assert!(
        description.starts_with("Report what applying the state file would change"),
        "{check:?}"
    );
    assert!(!check.stdout.contains("flatten"), "{check:?}");
}

#[test]
fn cli_reports_unreachable_server_with_exit_3() {
    let names = Names::new();
    // Port 1 on loopback: nothing listens there.
    let result = run(names.command("svcctl").args([
        "--http-url",
        "http://127.0.0.1:1",
        "--api-key",
        "k",
        "apikey",
        "list",
    ]));
    assert_eq!(result.code, 3, "{result:?}");
    assert!(
        result.stderr.starts_with("svcctl: cannot reach the server"),
        "{result:?}"
    );
    let exec = run(names.command("svcctl").args([
        "--server",
        "127.0.0.1:1",
        "--api-key",
        "k",
        "exec",
        "--",
        "uptime",
    ]));
    assert_eq!(exec.code, 3, "{exec:?}");
}

/// `svcctl ... | head` ends the CLI quietly, killed by SIGPIPE as coreutils are, with no
/// panic on stderr; a server that hangs up is a different SIGPIPE (tests/tls.rs).
#[test]
fn a_closed_stdout_ends_the_cli_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    // More than a pipe holds (64 KiB), so the CLI is still writing when the reader goes.
    let content = "x".repeat(300 * 1024);
    let file = dir.path().join("big.yaml");
    std::fs::write(
        &file,
        format!("- file: {{path: /tmp/big, content: {content}}}\n"),
    )
    .unwrap();
    let mut child = names
        .command("svcctl")
        .args(["-o", "json", "state", "compile"])
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut head = [0u8; 10];
    stdout.read_exact(&mut head).unwrap();
    drop(stdout);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGPIPE), "{status:?} {stderr}");
    assert_eq!(stderr, "");
}

/// The master key is never sent in clear to another host by accident: refused before any
/// connection is made (192.0.2.1 is TEST-NET-1, nothing answers there).
#[test]
fn rotate_master_refuses_plain_tcp_to_another_host() {
    let names = Names::new();
    let key = "A".repeat(43) + "=";
    let refused = run(names.command("svc-secrets").args([
        "--server",
        "192.0.2.1:5397",
        "--api-key",
        "k",
        "rotate-master",
        "--new-key",
        &key,
    ]));
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(
        refused
            .stderr
            .contains("refusing to send the master key in clear to 192.0.2.1"),
        "{refused:?}"
    );
    assert!(!refused.stderr.contains(&key), "{refused:?}");
    // Loopback is not refused: it tries, and nothing listens on port 1 (exit 3, not 2).
    let tried = run(names.command("svc-secrets").args([
        "--server",
        "http://127.0.0.1:1",
        "--api-key",
        "k",
        "rotate-master",
        "--new-key",
        &key,
    ]));
    assert_eq!(tried.code, 3, "loopback is allowed: {tried:?}");
}
