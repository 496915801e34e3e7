//! Configuration through the real binary: --check-config, the SVC_ overlay, refusals, --dev.

mod common;

use common::{run, Names};

/// `svc-server --config FILE --check-config` with `env` set.
fn check_config(names: &Names, file: &std::path::Path, env: &[(&str, &str)]) -> common::Run {
    let mut command = names.command("svc-server");
    command.arg("--config").arg(file).arg("--check-config");
    for (key, value) in env {
        command.env(key, value);
    }
    run(&mut command)
}

#[test]
fn check_config_accepts_a_valid_file_and_environment() {
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.yaml");
    std::fs::write(
        &file,
        format!(
            "hmacsecret: abc\nmaster_key: {}\n",
            common::random_master_key()
        ),
    )
    .unwrap();
    let result = check_config(&names, &file, &[("SVC_LISTEN__HTTP", "127.0.0.1:18080")]);
    assert_eq!(result.code, 0, "{result:?}");
}

#[test]
fn check_config_lists_every_problem() {
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.yaml");
    std::fs::write(
        &file,
        "listen:\n  htp: 1.2.3.4:80\nbogus: true\nmaster_key: short\n",
    )
    .unwrap();
    let result = check_config(&names, &file, &[("SVC_LISTEN__NOPE", "x")]);
    assert_eq!(result.code, 1, "{result:?}");
    let name = file.display().to_string();
    assert!(
        result
            .stderr
            .contains(&format!("svc-server: {name}: unknown key 'listen.htp'")),
        "{result:?}"
    );
    assert!(
        result
            .stderr
            .contains(&format!("svc-server: {name}: unknown key 'bogus'")),
        "{result:?}"
    );
    assert!(
        result
            .stderr
            .contains("environment SVC_LISTEN__NOPE: unknown key 'listen.nope'"),
        "{result:?}"
    );

    std::fs::write(&file, "master_key: short\nlisten: { http: nowhere }\n").unwrap();
    let result = check_config(&names, &file, &[]);
    assert_eq!(result.code, 1, "{result:?}");
    for expected in [
        "hmacsecret is missing",
        "master_key must be base64 of exactly 32 bytes",
        "listen.http: 'nowhere'",
    ] {
        assert!(result.stderr.contains(expected), "{expected}: {result:?}");
    }
}

#[test]
fn environment_overrides_the_file() {
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.yaml");
    std::fs::write(
        &file,
        format!(
            "hmacsecret: abc\nmaster_key: {}\nlisten: {{ http: 'bad' }}\n",
            common::random_master_key()
        ),
    )
    .unwrap();
    let bad = check_config(&names, &file, &[]);
    assert_eq!(bad.code, 1, "{bad:?}");
    let fixed = check_config(&names, &file, &[("SVC_LISTEN__HTTP", "127.0.0.1:18080")]);
    assert_eq!(fixed.code, 0, "{fixed:?}");
}

#[test]
fn a_missing_named_config_file_is_an_error() {
    let names = Names::new();
    let result = run(names.command("svc-server").args([
        "--config",
        "/nonexistent/server.yaml",
        "--check-config",
    ]));
    assert_eq!(result.code, 1, "{result:?}");
    assert!(
        result.stderr.contains("/nonexistent/server.yaml"),
        "{result:?}"
    );
}

#[test]
fn server_refuses_to_start_without_required_keys() {
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.yaml");
    std::fs::write(&file, format!("data_dir: {}/data\n", dir.path().display())).unwrap();
    let result = run(names.command("svc-server").arg("--config").arg(&file));
    assert_eq!(result.code, 1, "{result:?}");
    assert!(
        result.stderr.contains("hmacsecret is missing"),
        "{result:?}"
    );
    assert!(
        result.stderr.contains("master_key is missing"),
        "{result:?}"
    );
}

#[test]
fn dev_mode_generates_private_secrets_and_a_bootstrap_key() {
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let child = names
        .command("svc-server")
        .arg("--dev")
        .current_dir(dir.path())
        .env("SVC_LISTEN__HTTP", "127.0.0.1:0")
        .env("SVC_LISTEN__GRPC", "127.0.0.1:0")
        .env("SVC_LISTEN__BUS", "127.0.0.1:0")
        .env("SVC_CONFIG", "unused")
        .args(["--config", "/dev/null"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let data = dir.path().join(".svc-dev");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !data.join("listen-addrs.json").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "dev server did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    common::assert_private(&data.join("dev-secrets.yaml"));
    common::assert_private(&data.join("bootstrap-admin.key"));
    common::assert_private(&data.join("svc.db"));
    let secrets = std::fs::read_to_string(data.join("dev-secrets.yaml")).unwrap();
    assert!(secrets.contains("hmacsecret:") && secrets.contains("master_key:"));
    let key = std::fs::read_to_string(data.join("bootstrap-admin.key")).unwrap();
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("dev mode: generated hmacsecret and master_key"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(key.trim()),
        "the bootstrap key must never be logged"
    );
    // stderr is a pipe, not a terminal: no colour codes in the log.
    assert!(stderr.contains("svc-server started"), "{stderr}");
    assert!(
        !stderr.contains("\x1b["),
        "ANSI colours on a pipe: {stderr:?}"
    );
}

/// Every line on stderr parsed as JSON (panics naming the first line that is not).
fn json_lines(stderr: &str) -> Vec<serde_json::Value> {
    stderr
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}\n{stderr}"))
        })
        .collect()
}

#[test]
fn with_json_logs_every_line_the_server_writes_is_json() {
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let child = names
        .command("svc-server")
        .arg("--dev")
        .current_dir(dir.path())
        .env("SVC_LISTEN__HTTP", "127.0.0.1:0")
        .env("SVC_LISTEN__GRPC", "127.0.0.1:0")
        .env("SVC_LISTEN__BUS", "127.0.0.1:0")
        .env("SVC_LOG_FORMAT", "json")
        .args(["--config", "/dev/null"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let data = dir.path().join(".svc-dev");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !data.join("listen-addrs.json").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "dev server did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines = json_lines(&stderr);
    let messages: Vec<&str> = lines
        .iter()
        .filter_map(|line| line["fields"]["message"].as_str())
        .collect();
    for wanted in [
        "dev mode: generated hmacsecret and master_key in",
        "bootstrap admin API key written to",
        "svc-server started",
        "svc-server stopped",
    ] {
        assert!(
            messages.iter().any(|m| m.contains(wanted)),
            "no {wanted:?} record: {stderr}"
        );
    }

    // A start-up failure is a JSON record too, not a bare line.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = dir.path().join("server.yaml");
    std::fs::write(
        &config,
        format!(
            "data_dir: {}\nlog_format: json\nlisten:\n  http: {}\n  grpc: 127.0.0.1:0\n  bus: 127.0.0.1:0\nhmacsecret: h\nmaster_key: {}\n",
            dir.path().join("busy").display(),
            busy.local_addr().unwrap(),
            common::random_master_key()
        ),
    )
    .unwrap();
    let failed = run(names.command("svc-server").arg("--config").arg(&config));
    assert_eq!(failed.code, 1, "{failed:?}");
    let lines = json_lines(&failed.stderr);
    assert!(
        lines.iter().any(|line| line["level"] == "ERROR"
            && line["fields"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("cannot listen"))),
        "{failed:?}"
    );
}

#[test]
fn bus_monitoring_and_keepalive_settings_are_checked() {
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.yaml");
    std::fs::write(
        &file,
        format!(
            "hmacsecret: abc\nmaster_key: {}\nlisten: {{ bus_monitor: nope }}\nbus: {{ ping_interval: 0s, ping_max: 0, lame_duck_duration: 5s, lame_duck_grace_period: 10s, max_pending_total: 1000 }}\n",
            common::random_master_key()
        ),
    )
    .unwrap();
    let bad = check_config(&names, &file, &[]);
    assert_eq!(bad.code, 1, "{bad:?}");
    for key in [
        "listen.bus_monitor",
        "bus.ping_interval",
        "bus.ping_max",
        "bus.lame_duck_grace_period",
        "bus.max_pending_total",
    ] {
        assert!(bad.stderr.contains(key), "{key}: {bad:?}");
    }
    let fixed = check_config(
        &names,
        &file,
        &[
            ("SVC_LISTEN__BUS_MONITOR", ""),
            ("SVC_BUS__PING_INTERVAL", "30s"),
            ("SVC_BUS__PING_MAX", "3"),
            ("SVC_BUS__LAME_DUCK_GRACE_PERIOD", "1s"),
            ("SVC_BUS__MAX_PENDING_TOTAL", "16777216"),
        ],
    );
    assert_eq!(fixed.code, 0, "{fixed:?}");
}

#[test]
fn request_limits_are_checked() {
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.yaml");
    let write = |limits: &str| {
        std::fs::write(
            &file,
            format!(
                "hmacsecret: abc\nmaster_key: {}\n{limits}",
                common::random_master_key()
            ),
        )
        .unwrap();
    };
    write("limits: { body_timeout: 0s, idle_timeout: 0s }\nrate_limit: { max_in_flight: 0 }\n");
    let bad = check_config(&names, &file, &[]);
    assert_eq!(bad.code, 1, "{bad:?}");
    for key in [
        "limits.body_timeout",
        "limits.idle_timeout",
        "rate_limit.max_in_flight",
    ] {
        assert!(bad.stderr.contains(key), "{key}: {bad:?}");
    }
    write("limits: { body_timeout: 5s, min_body_rate: 0, idle_timeout: 2m }\nrate_limit: { max_in_flight: 4 }\n");
    let good = check_config(&names, &file, &[]);
    assert_eq!(good.code, 0, "{good:?}");
    write("limits: { body_deadline: 5s }\n");
    let unknown = check_config(&names, &file, &[]);
    assert!(
        unknown.stderr.contains("limits.body_deadline"),
        "{unknown:?}"
    );
}
