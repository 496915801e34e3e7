//! Blueprints end to end: the local commands (init, validate, lint, info, bundle), then the
//! catalogue and apply/applied/update/rollback against a real server with real agents that
//! write under a temporary directory.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::{audit_rows, json_of, run, Run, TestServer};

fn blueprint(server: &TestServer, key: &str, args: &[&str]) -> Run {
    run(server
        .cli("svc-blueprint")
        .args(["--api-key", key])
        .args(args))
}

fn wait_connected(server: &TestServer, ids: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let listed = run(server.cli("svcctl").args([
            "--api-key",
            &server.admin_key,
            "-o",
            "json",
            "agent",
            "list",
        ]));
        let agents = json_of(&listed);
        let connected = agents
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["state"] == "connected")
            .count();
        if connected == ids.len() {
            return;
        }
        assert!(Instant::now() < deadline, "agents not connected: {agents}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A web-like blueprint of `version`: a directory, a config file from a template, a marker
/// command; version 2 adds a second file.
fn write_blueprint(dir: &Path, version: &str, extra_file: bool) {
    std::fs::create_dir_all(dir.join("states")).unwrap();
    std::fs::create_dir_all(dir.join("templates")).unwrap();
    std::fs::write(
        dir.join("blueprint.yaml"),
        format!(
            "name: web\nversion: {version}\ndescription: a web role\ntargets: \"role=web\"\n\
             parameters:\n  root: {{type: string, description: where the site lives}}\n  \
             port: {{type: int, default: 8080}}\n  license: {{type: string, secret: true}}\n"
        ),
    )
    .unwrap();
    let mut state = String::from(
        "- directory: {path: \"{{ root }}/site\", mode: \"0755\"}\n\
         - file: {path: \"{{ root }}/site/site.conf\", source: templates/site.conf, mode: \"0640\"}\n\
         - command: {run: \"touch {{ root }}/site/ready\", creates: \"{{ root }}/site/ready\"}\n",
    );
    if extra_file {
        state.push_str("- file: {path: \"{{ root }}/site/extra.conf\", content: \"v2\\n\"}\n");
    }
    std::fs::write(dir.join("states/main.yaml"), state).unwrap();
    std::fs::write(
        dir.join("templates/site.conf"),
        format!("listen {{{{ port }}}}\nversion {version}\nlicense {{{{ license }}}}\n"),
    )
    .unwrap();
}

#[test]
fn local_commands_bundle_reproducibly_and_lint() {
    let server_less = common::Names::new();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("web");
    write_blueprint(&dir, "1.0.0", false);
    let cmd = |args: &[&str]| run(server_less.command("svc-blueprint").args(args));

    let valid = cmd(&["validate", dir.to_str().unwrap()]);
    assert_eq!(valid.code, 0, "{valid:?}");
    assert!(valid.stdout.contains("web 1.0.0: valid"), "{valid:?}");

    // Two bundles of the same directory: the same bytes and SHA-256.
    let one = work.path().join("one.tar.gz");
    let two = work.path().join("two.tar.gz");
    let mut sums = Vec::new();
    for file in [&one, &two] {
        let made = cmd(&[
            "-o",
            "json",
            "bundle",
            dir.to_str().unwrap(),
            "-O",
            file.to_str().unwrap(),
        ]);
        assert_eq!(made.code, 0, "{made:?}");
        sums.push(json_of(&made)["sha256"].as_str().unwrap().to_string());
    }
    assert_eq!(sums[0], sums[1]);
    assert_eq!(std::fs::read(&one).unwrap(), std::fs::read(&two).unwrap());
    let info = cmd(&["-o", "json", "info", one.to_str().unwrap()]);
    assert_eq!(info.code, 0, "{info:?}");
    assert_eq!(json_of(&info)["version"], "1.0.0");
    let files = json_of(&info)["files"].to_string();
    assert!(files.contains("templates/site.conf"), "{files}");
    assert!(!files.contains("MANIFEST.json"), "{files}");
    // `required` says what apply enforces: a parameter without a default must be given.
    let parameters = &json_of(&info)["parameters"];
    assert_eq!(
        (
            &parameters["root"]["required"],
            &parameters["license"]["required"],
            &parameters["port"]["required"]
        ),
        (&true.into(), &true.into(), &false.into()),
        "{parameters}"
    );

    // The clean blueprint lints clean; a risky one has findings and exits 1.
    let clean = cmd(&["lint", dir.to_str().unwrap()]);
    assert_eq!(clean.code, 0, "{clean:?}");
    std::fs::write(
        dir.join("states/risky.yaml"),
        "- file: {path: /tmp/x, content: x, mode: \"0666\"}\n- command: {run: \"true\"}\n\
         - package: {name: nginx}\n",
    )
    .unwrap();
    let risky = cmd(&["-o", "json", "lint", dir.to_str().unwrap()]);
    assert_eq!(risky.code, 1, "{risky:?}");
    let findings: Vec<String> = json_of(&risky)
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["message"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(findings.len(), 3, "{findings:?}");
    assert!(findings[0].contains("world-writable"), "{findings:?}");
    assert!(
        findings[1].contains("without unless or creates"),
        "{findings:?}"
    );
    assert!(findings[2].contains("not pinned"), "{findings:?}");

    // A template naming an undefined variable fails validation with the file and line.
    std::fs::write(
        dir.join("states/risky.yaml"),
        "- file: {path: \"{{ nope }}\"}\n",
    )
    .unwrap();
    let strict = cmd(&["validate", dir.to_str().unwrap()]);
    assert_eq!(strict.code, 1, "{strict:?}");
    assert!(
        strict.stderr.contains("states/risky.yaml line 1"),
        "{strict:?}"
    );

    // A bad --set is a usage error.
    std::fs::remove_file(dir.join("states/risky.yaml")).unwrap();
    let bad = cmd(&["validate", dir.to_str().unwrap(), "--set", "port=eighty"]);
    assert_eq!(bad.code, 2, "{bad:?}");
    let unknown = cmd(&["validate", dir.to_str().unwrap(), "--set", "nope=1"]);
    assert_eq!(unknown.code, 2, "{unknown:?}");

    // init scaffolds a blueprint that validates.
    let scaffold = work.path().join("new");
    let init = cmd(&["init", "new", "--dir", scaffold.to_str().unwrap()]);
    assert_eq!(init.code, 0, "{init:?}");
    assert_eq!(cmd(&["validate", scaffold.to_str().unwrap()]).code, 0);
}

#[test]
fn install_apply_update_rollback_on_real_agents() {
    let server = TestServer::start();
    let web1 = Agent::start(&server, "web-01", "role=web");
    let web2 = Agent::start(&server, "web-02", "role=web");
    let db = Agent::start(&server, "db-01", "role=db");
    wait_connected(&server, &["web-01", "web-02", "db-01"]);
    let (_, operator) = server.create_key("ops", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    let work = tempfile::tempdir().unwrap();
    let v1 = work.path().join("v1");
    let v2 = work.path().join("v2");
    write_blueprint(&v1, "1.0.0", false);
    write_blueprint(&v2, "2.0.0", true);
    let root = work.path().join("host");
    std::fs::create_dir(&root).unwrap();
    let root_set = format!("root={}", root.display());
    let site = root.join("site");

    // Install: operator yes (and once), readonly no.
    let denied = blueprint(&server, &readonly, &["install", v1.to_str().unwrap()]);
    assert_eq!(denied.code, 4, "{denied:?}");
    let installed = blueprint(
        &server,
        &operator,
        &["-o", "json", "install", v1.to_str().unwrap()],
    );
    assert_eq!(installed.code, 0, "{installed:?}");
    assert_eq!(json_of(&installed)["version"], "1.0.0");
    let again = blueprint(&server, &operator, &["install", v1.to_str().unwrap()]);
    assert_eq!(again.code, 1, "{again:?}");
    assert!(again.stderr.contains("use update"), "{again:?}");
    let listed = blueprint(&server, &readonly, &["-o", "json", "list"]);
    assert_eq!(json_of(&listed)[0]["name"], "web", "{listed:?}");
    let shown = blueprint(&server, &readonly, &["-o", "json", "info", "web"]);
    assert_eq!(shown.code, 0, "{shown:?}");
    let parameters = &json_of(&shown)["parameters"];
    assert_eq!(parameters["license"]["required"], true, "{parameters}");
    assert_eq!(parameters["port"]["required"], false, "{parameters}");
    assert_eq!(parameters["port"]["default"], 8080, "{parameters}");

    // A missing required parameter is a usage error, before anything runs.
    let missing = blueprint(&server, &operator, &["apply", "web", "--set", &root_set]);
    assert_eq!(missing.code, 2, "{missing:?}");
    assert!(
        missing
            .stderr
            .contains("missing required parameter 'license'"),
        "{missing:?}"
    );
    let mistyped = blueprint(
        &server,
        &operator,
        &[
            "apply",
            "web",
            "--set",
            &root_set,
            "--set",
            "license=t",
            "--set",
            "port=eighty",
        ],
    );
    assert_eq!(mistyped.code, 2, "{mistyped:?}");

    // A dry run changes nothing and records nothing.
    let dry = blueprint(
        &server,
        &operator,
        &[
            "-o",
            "json",
            "apply",
            "web",
            "--set",
            &root_set,
            "--set",
            "license=s3cret",
            "--dry-run",
        ],
    );
    assert_eq!(dry.code, 0, "{dry:?}");
    assert!(!site.exists());

    // Apply v1 on the blueprint's own targets (role=web): both web agents, not db.
    let applied = blueprint(
        &server,
        &operator,
        &[
            "-o",
            "json",
            "apply",
            "web",
            "--set",
            &root_set,
            "--set",
            "license=s3cret",
            "--set",
            "port=81",
        ],
    );
    assert_eq!(applied.code, 0, "{applied:?}");
    let lines: Vec<serde_json::Value> = applied
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let agents: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["agent_id"].as_str())
        .collect();
    assert_eq!(agents.len(), 2, "{lines:?}");
    assert!(!agents.contains(&"db-01"));
    assert_eq!(
        std::fs::read_to_string(site.join("site.conf")).unwrap(),
        "listen 81\nversion 1.0.0\nlicense s3cret\n"
    );
    assert!(site.join("ready").exists());

    let where_ = blueprint(
        &server,
        &readonly,
        &["-o", "json", "applied", "--target", "web-01"],
    );
    assert_eq!(where_.code, 0, "{where_:?}");
    let rows = json_of(&where_);
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(rows[0]["version"], "1.0.0");
    assert_eq!(rows[0]["agent_id"], "web-01");

    // Update to v2 (newer only) and apply it: the extra file appears.
    let older = blueprint(&server, &operator, &["update", v1.to_str().unwrap()]);
    assert_eq!(older.code, 1, "{older:?}");
    let updated = blueprint(&server, &operator, &["update", v2.to_str().unwrap()]);
    assert_eq!(updated.code, 0, "{updated:?}");
    let applied2 = blueprint(
        &server,
        &operator,
        &[
            "apply",
            "web@2.0.0",
            "--target",
            "role=web",
            "--set",
            &root_set,
            "--set",
            "license=s3cret",
        ],
    );
    assert_eq!(applied2.code, 0, "{applied2:?}");
    assert!(site.join("extra.conf").exists());
    assert!(std::fs::read_to_string(site.join("site.conf"))
        .unwrap()
        .contains("version 2.0.0"));
    let rows = json_of(&blueprint(&server, &readonly, &["-o", "json", "applied"]));
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .all(|r| r["version"] == "2.0.0"),
        "{rows}"
    );

    // Rollback: v1's plan again, and the file v2 added is removed.
    let rolled = blueprint(
        &server,
        &operator,
        &["rollback", "web", "--target", "role=web"],
    );
    assert_eq!(rolled.code, 0, "{rolled:?}");
    assert!(!site.join("extra.conf").exists());
    assert_eq!(
        std::fs::read_to_string(site.join("site.conf")).unwrap(),
        "listen 81\nversion 1.0.0\nlicense s3cret\n"
    );
    let rows = json_of(&blueprint(&server, &readonly, &["-o", "json", "applied"]));
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .all(|r| r["version"] == "1.0.0"),
        "{rows}"
    );

    // Drift reads the plan each agent last applied (the rollback's) back from the store.
    let drift = run(server.cli("svcctl").args([
        "--api-key",
        &operator,
        "-o",
        "json",
        "state",
        "drift",
        "-t",
        "web-01",
    ]));
    assert_eq!(drift.code, 0, "{drift:?}");
    assert!(drift.stdout.contains("\"status\":\"ok\""), "{drift:?}");

    // A copy of the store holds neither the secret parameter, which the rendered plans carry
    // (they are sealed), nor any key's file-request signing key.
    let dump = common::store_dump(&server);
    assert!(
        !common::contains_bytes(&dump, b"s3cret"),
        "secret parameter at rest"
    );
    assert!(
        common::contains_bytes(&dump, b"blueprint_applies"),
        "not a store dump"
    );
    for key in [&operator, &readonly, &server.admin_key] {
        common::assert_no_signing_key(&dump, key);
    }

    // Audit: every change recorded, the secret parameter redacted.
    let rows = audit_rows(&server, &["--action", "blueprint.apply", "--limit", "10"]);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let text = serde_json::to_string(&rows).unwrap();
    assert!(!text.contains("s3cret"), "{text}");
    assert!(text.contains("[REDACTED]"), "{text}");
    for action in [
        "blueprint.install",
        "blueprint.update",
        "blueprint.rollback",
    ] {
        let rows = audit_rows(&server, &["--action", action, "--limit", "10"]);
        assert!(!rows.is_empty(), "{action}");
    }
    // The state path's own audit row and events are there too.
    let rows = audit_rows(&server, &["--action", "state.apply", "--limit", "10"]);
    assert_eq!(rows.len(), 3, "{rows:?}");
    let events = run(server.cli("svc-events").args([
        "--api-key",
        &server.admin_key,
        "-o",
        "json",
        "list",
        "--type",
        "state_apply_succeeded",
        "--limit",
        "100",
    ]));
    assert_eq!(events.code, 0, "{events:?}");
    // Three runs (apply, apply, rollback) on two agents each.
    assert_eq!(
        json_of(&events)["items"].as_array().unwrap().len(),
        6,
        "{events:?}"
    );

    // Remove: refused while applied, unless --force.
    let refused = blueprint(&server, &operator, &["remove", "web"]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stderr.contains("--force"), "{refused:?}");
    let removed = blueprint(&server, &operator, &["remove", "web", "--force"]);
    assert_eq!(removed.code, 0, "{removed:?}");
    let gone = blueprint(&server, &readonly, &["info", "web"]);
    assert_eq!(gone.code, 5, "{gone:?}");
    drop((web1, web2, db));
}

#[test]
fn local_usage_errors() {
    let names = common::Names::new();
    let bad = run(names.command("svc-blueprint").args(["init", "Bad Name"]));
    assert_eq!(bad.code, 2, "{bad:?}");
}
