//! svc-bootstrap end to end, under `--root` in a temporary directory only (never the test
//! host's /etc or /usr): the six phases against a real server with a real agent, the re-run
//! that changes nothing, and the first failure stopping the run.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::{json_of, run, Run, TestServer};

fn bootstrap(server: &TestServer, seed: &Path, root: &Path, extra: &[&str]) -> Run {
    run(server
        .names
        .command("svc-bootstrap")
        .args(["-o", "json", "--seed"])
        .arg(seed)
        .arg("--root")
        .arg(root)
        .args(extra))
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

fn phases(result: &Run) -> Vec<(String, String, String)> {
    json_of(result)
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["phase"].as_str().unwrap().to_string(),
                p["status"].as_str().unwrap().to_string(),
                p["detail"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn six_phases_then_a_rerun_that_changes_nothing() {
    let server = TestServer::start();
    let _agent = Agent::start(&server, "web-01", "role=web");
    wait_connected(&server, "web-01");
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(
        root.join("etc/os-release"),
        "ID=debian\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
    )
    .unwrap();
    let site = work.path().join("site");
    std::fs::create_dir(&site).unwrap();

    // A small blueprint the seed installs and applies on web-01.
    let bp = work.path().join("motd");
    std::fs::create_dir_all(bp.join("states")).unwrap();
    std::fs::write(
        bp.join("blueprint.yaml"),
        "name: motd\nversion: 1.0.0\nparameters:\n  dir: {type: string}\n",
    )
    .unwrap();
    std::fs::write(
        bp.join("states/main.yaml"),
        "- file: {path: \"{{ dir }}/motd\", content: \"hello from {{ dir }}\\n\"}\n",
    )
    .unwrap();
    let key_file = work.path().join("admin.key");
    std::fs::write(&key_file, &server.admin_key).unwrap();
    let seed = work.path().join("seed.yaml");
    let seed_text = format!(
        "server:\n  data_dir: /var/lib/svc\n  listen: {{http: 127.0.0.1:8080, grpc: 127.0.0.1:5397, bus: 127.0.0.1:4222}}\n\
         agent:\n  agent: {{id: web-01, labels: {{role: web}}}}\n  nats: {{urls: [\"{bus}\"]}}\n\
         connect:\n  server: \"{grpc}\"\n  http_url: \"http://{http}\"\n  api_key_file: {key}\n\
         blueprints:\n  - path: motd\n    target: web-01\n    set: {{dir: \"{site}\"}}\n",
        bus = server.bus,
        grpc = server.grpc,
        http = server.http,
        key = key_file.display(),
        site = site.display(),
    );
    std::fs::write(&seed, &seed_text).unwrap();

    let first = bootstrap(&server, &seed, &root, &[]);
    assert_eq!(first.code, 0, "{first:?}");
    let reported = phases(&first);
    let names: Vec<&str> = reported.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "detect",
            "configure",
            "validate",
            "install",
            "blueprints",
            "verify"
        ]
    );
    assert!(reported.iter().all(|(_, s, _)| s == "ok"), "{reported:?}");
    assert!(
        reported[0].2.contains("Debian GNU/Linux 12"),
        "{reported:?}"
    );
    assert!(reported[0].2.contains("svc not installed"), "{reported:?}");
    assert!(
        reported[1].2.contains("generated hmacsecret, master_key"),
        "{reported:?}"
    );
    assert!(
        reported[4].2.contains("motd 1.0.0 installed"),
        "{reported:?}"
    );
    assert!(
        reported[5].2.contains("agent web-01 enrolled"),
        "{reported:?}"
    );

    let server_yaml = root.join("etc/svc/server.yaml");
    let written = std::fs::read_to_string(&server_yaml).unwrap();
    assert!(written.contains("hmacsecret:") && written.contains("master_key:"));
    let mode = std::fs::metadata(&server_yaml)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    assert!(root.join("etc/svc/agent.yaml").exists());
    assert!(root.join("usr/bin/svc").is_file());
    assert_eq!(
        std::fs::read_link(root.join("usr/bin/svcctl")).unwrap(),
        Path::new("svc")
    );
    assert!(root.join("etc/systemd/system/svc-agent.service").exists());
    assert_eq!(
        std::fs::read_to_string(site.join("motd")).unwrap(),
        format!("hello from {}\n", site.display())
    );

    // Again: nothing changes.
    let second = bootstrap(&server, &seed, &root, &[]);
    assert_eq!(second.code, 0, "{second:?}");
    let reported = phases(&second);
    assert!(reported[0].2.contains("svc installed"), "{reported:?}");
    assert!(reported[1].2.contains("unchanged"), "{reported:?}");
    assert!(!reported[1].2.contains("generated"), "{reported:?}");
    assert!(reported[3].2.contains("unchanged"), "{reported:?}");
    assert!(reported[4].2.contains("already installed"), "{reported:?}");
    assert!(reported[4].2.contains("already applied"), "{reported:?}");
    assert_eq!(std::fs::read_to_string(&server_yaml).unwrap(), written);

    // A seed that now differs from server.yaml stops at configure (no --force): later phases
    // do not run.
    std::fs::write(&seed, seed_text.replace("/var/lib/svc", "/srv/svc")).unwrap();
    let refused = bootstrap(&server, &seed, &root, &[]);
    assert_eq!(refused.code, 1, "{refused:?}");
    let reported = phases(&refused);
    assert_eq!(reported.len(), 2, "{reported:?}");
    assert_eq!(reported[1].1, "failed");
    assert!(
        refused.stderr.contains("phase configure failed"),
        "{refused:?}"
    );
    assert!(refused.stderr.contains("--force"), "{refused:?}");
    let forced = bootstrap(&server, &seed, &root, &["--force"]);
    assert_eq!(forced.code, 0, "{forced:?}");
    let after = std::fs::read_to_string(&server_yaml).unwrap();
    assert!(after.contains("/srv/svc"));
    // The secrets generated the first time are kept.
    let secret = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("master_key:"))
            .unwrap()
            .to_string()
    };
    assert_eq!(secret(&after), secret(&written));
}

#[test]
fn an_invalid_configuration_stops_at_validate() {
    let names = common::Names::new();
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let seed = work.path().join("seed.yaml");
    std::fs::write(&seed, "server:\n  listen: {http: nonsense}\n").unwrap();
    let result = run(names
        .command("svc-bootstrap")
        .args(["-o", "json", "--seed"])
        .arg(&seed)
        .arg("--root")
        .arg(&root));
    assert_eq!(result.code, 1, "{result:?}");
    let reported = phases(&result);
    assert_eq!(reported.len(), 3, "{reported:?}");
    assert_eq!(reported[2].0, "validate");
    assert!(reported[2].2.contains("listen.http"), "{reported:?}");
    // Nothing was installed.
    assert!(!root.join("usr/bin/svc").exists());

    // A seed naming neither a server nor an agent is a usage error.
    std::fs::write(&seed, "install: {prefix: /usr}\n").unwrap();
    let empty = run(names
        .command("svc-bootstrap")
        .arg("--seed")
        .arg(&seed)
        .arg("--root")
        .arg(&root));
    assert_eq!(empty.code, 2, "{empty:?}");
}
