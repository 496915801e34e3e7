//! svc-module and svc-registry through the real binary: reproducible build, sign/verify,
//! the step limit, a module test suite failing and passing, publish + resolve a dependency
//! from a running registry, immutable versions, and a tampered dependency refused at
//! install, and `run --target` on real agents (a dependency sent along, resources applied
//! like state and remembered for drift, the agent's signature policy, the step limit there).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::{json_of, run, Names, Run, TestServer};

fn module(names: &Names, home: &Path, args: &[&str]) -> Run {
    run(names
        .command("svc-module")
        .current_dir(home)
        .env("HOME", home)
        .env("SVC_MODULES_DIR", home.join("store"))
        .args(args))
}

fn ok(run: Run) -> Run {
    assert_eq!(run.code, 0, "{run:?}");
    run
}

fn write(dir: &Path, files: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

struct Registry {
    child: Child,
    url: String,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_registry(names: &Names, dir: &Path, token_file: &Path) -> Registry {
    start_registry_with(names, dir, token_file, &["--listen", "127.0.0.1:0"])
}

/// `svc-registry serve` with `args` (which give --listen), once it says where it listens.
fn start_registry_with(names: &Names, dir: &Path, token_file: &Path, args: &[&str]) -> Registry {
    let child = names
        .command("svc-registry")
        .args(["serve", "--dir"])
        .arg(dir)
        .arg("--token-file")
        .arg(token_file)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Owned by the guard at once, so a panic below still kills and reaps it.
    let mut registry = Registry {
        child,
        url: String::new(),
    };
    let mut line = String::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut reader = BufReader::new(registry.child.stdout.take().unwrap());
    while Instant::now() < deadline {
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            panic!("svc-registry exited before listening");
        }
        if let Some(rest) = line.split("listening on ").nth(1) {
            registry.url = rest.split_whitespace().next().unwrap().to_string();
            return registry;
        }
    }
    panic!("svc-registry did not start");
}

#[test]
fn build_sign_verify_test_and_limits() {
    let names = Names::new();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    ok(module(&names, h, &["init", "motd"]));
    let dir = h.join("motd");
    let v = ok(module(&names, h, &["validate", "motd", "-o", "json"]));
    assert!(v.stdout.contains("\"valid\": true"), "{v:?}");

    // Reproducible: two builds, same bytes and SHA-256, even after the files' mtimes change.
    let first = ok(module(&names, h, &["build", "motd", "-o", "json"]));
    let sha = |r: &Run| {
        serde_json::from_str::<serde_json::Value>(&r.stdout).unwrap()["sha256"]
            .as_str()
            .unwrap()
            .to_string()
    };
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(
        dir.join("main.star"),
        std::fs::read(dir.join("main.star")).unwrap(),
    )
    .unwrap();
    let second = ok(module(&names, h, &["build", "motd", "-o", "json"]));
    assert_eq!(sha(&first), sha(&second));
    let zip = dir.join("build/motd-0.1.0.zip");
    assert!(zip.exists());

    // Run: the resources come back, typed arguments checked.
    let r = ok(module(
        &names,
        h,
        &[
            "run",
            "motd",
            "setup",
            "--arg",
            "message=hello",
            "-o",
            "json",
        ],
    ));
    let value: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(value["resources"][0]["file"]["content"], "hello\n", "{r:?}");
    assert_eq!(value["resources"][0]["file"]["path"], "/etc/motd");
    let bad = module(&names, h, &["run", "motd", "setup", "--arg", "nope=1"]);
    assert_eq!(bad.code, 2, "{bad:?}");
    let stray = module(&names, h, &["run", "motd", "setup", "--check"]);
    assert_eq!(stray.code, 2, "{stray:?}");
    assert!(stray.stderr.contains("go with --target"), "{stray:?}");

    // Sign and verify; a changed ZIP or another key is refused.
    ok(module(&names, h, &["keygen", "k1"]));
    ok(module(&names, h, &["keygen", "k2"]));
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(h.join("k1.key")).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let zip_s = zip.to_str().unwrap();
    ok(module(&names, h, &["sign", zip_s, "--key", "k1.key"]));
    ok(module(&names, h, &["verify", zip_s, "--pubkey", "k1.pub"]));
    let other = module(&names, h, &["verify", zip_s, "--pubkey", "k2.pub"]);
    assert_eq!(other.code, 4, "{other:?}");
    let mut bytes = std::fs::read(&zip).unwrap();
    let last = bytes.len() - 30;
    bytes[last] ^= 1;
    let tampered = h.join("tampered.zip");
    std::fs::write(&tampered, &bytes).unwrap();
    std::fs::copy(
        h.join("motd/build/motd-0.1.0.zip.sig"),
        h.join("tampered.zip.sig"),
    )
    .unwrap();
    let t = module(&names, h, &["verify", "tampered.zip", "--pubkey", "k1.pub"]);
    assert_eq!(t.code, 4, "{t:?}");

    // The step limit stops a runaway loop with a clear error.
    write(
        &h.join("spin"),
        &[
            (
                "module.yaml",
                "name: spin\nversion: 1.0.0\nexports:\n  forever: {}\n",
            ),
            (
                "main.star",
                "def forever():\n    for i in range(1000000000):\n        pass\n    return []\n",
            ),
        ],
    );
    let spin = module(
        &names,
        h,
        &["run", "spin", "forever", "--max-steps", "100000"],
    );
    assert_eq!(spin.code, 1, "{spin:?}");
    assert!(
        spin.stderr.contains("step limit of 100000 exceeded"),
        "{spin:?}"
    );

    // The sandbox has no file system: open() does not exist.
    write(
        &h.join("peek"),
        &[
            (
                "module.yaml",
                "name: peek\nversion: 1.0.0\nexports:\n  f: {}\n",
            ),
            ("main.star", "def f():\n    return open('/etc/passwd')\n"),
        ],
    );
    let peek = module(&names, h, &["run", "peek", "f"]);
    assert_eq!(peek.code, 1, "{peek:?}");

    // A test suite: passing, then failing (exit 1, TAP "not ok").
    let pass = ok(module(&names, h, &["test", "motd"]));
    assert!(
        pass.stdout
            .contains("ok 1 - main_test.star: test_setup_writes_motd"),
        "{pass:?}"
    );
    std::fs::write(
        dir.join("broken_test.star"),
        "load(\"main.star\", \"setup\")\n\ndef test_wrong_content():\n    assert_eq(setup(message = \"a\")[0][\"file\"][\"content\"], \"b\")\n",
    )
    .unwrap();
    let fail = module(&names, h, &["test", "motd"]);
    assert_eq!(fail.code, 1, "{fail:?}");
    assert!(
        fail.stdout
            .contains("not ok 1 - broken_test.star: test_wrong_content"),
        "{fail:?}"
    );
    assert!(fail.stdout.contains("ok 2 - main_test.star"), "{fail:?}");

    ok(module(&names, h, &["clean", "motd"]));
    assert!(!dir.join("build").exists());
}

#[test]
fn registry_publish_resolve_install() {
    let names = Names::new();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::write(h.join("tokens"), "secret-token\n").unwrap();
    let registry = start_registry(&names, &h.join("registry"), &h.join("tokens"));
    let url = registry.url.as_str();
    let publish = |zip: &Path, token: &str| {
        let zip = zip.to_str().unwrap();
        module(
            &names,
            h,
            &["publish", zip, "--registry", url, "--token", token],
        )
    };

    // base 1.0.0 and 1.1.0 published; a dependency that app loads.
    for (version, greeting) in [("1.0.0", "hello"), ("1.1.0", "hi")] {
        let dir = h.join(format!("base-{version}"));
        write(
            &dir,
            &[
                ("module.yaml", &format!("name: base\nversion: {version}\n")),
                ("main.star", ""),
                (
                    "lib.star",
                    &format!("def greeting():\n    return \"{greeting}\"\n"),
                ),
            ],
        );
        ok(module(&names, h, &["build", dir.to_str().unwrap()]));
        let zip = dir.join(format!("build/base-{version}.zip"));
        ok(publish(&zip, "secret-token"));
    }
    let zip = h.join("base-1.0.0/build/base-1.0.0.zip");
    // Immutable: publishing 1.0.0 again is refused; a bad token is refused.
    let again = publish(&zip, "secret-token");
    assert_eq!(again.code, 1, "{again:?}");
    assert!(again.stderr.contains("immutable"), "{again:?}");
    let denied = publish(&zip, "wrong");
    assert_eq!(denied.code, 4, "{denied:?}");

    // app depends on base ^1.0: resolve picks 1.1.0 from the registry and locks its hash.
    let app = h.join("app");
    write(&app, &[
        ("module.yaml", "name: app\nversion: 0.1.0\ndependencies: {base: \"^1.0\"}\nexports:\n  motd: {}\n"),
        ("main.star", "load(\"@base//lib.star\", \"greeting\")\n\ndef motd():\n    return [file(\"/etc/motd\", content = greeting())]\n"),
    ]);
    let resolved = ok(module(
        &names,
        h,
        &["resolve", "app", "--registry", url, "-o", "json"],
    ));
    let lock: serde_json::Value = serde_json::from_str(&resolved.stdout).unwrap();
    assert_eq!(
        lock["dependencies"]["base"]["version"], "1.1.0",
        "{resolved:?}"
    );
    assert!(app.join("module.lock").exists());
    let tree = ok(module(&names, h, &["tree", "app"]));
    assert!(tree.stdout.contains("└── base 1.1.0"), "{tree:?}");
    let r = ok(module(&names, h, &["run", "app", "motd", "-o", "json"]));
    assert!(r.stdout.contains("\"content\": \"hi\""), "{r:?}");

    // The listing carries SHA-256; the OpenAPI document is served.
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let listing = common::http_request(addr, "GET", "/v1/modules/base", &[], None).unwrap();
    let listing: serde_json::Value = listing.json();
    assert_eq!(listing["versions"][1]["version"], "1.1.0", "{listing}");
    assert_eq!(listing["versions"][1]["sha256"].as_str().unwrap().len(), 64);
    let openapi = common::http_request(addr, "GET", "/openapi.json", &[], None).unwrap();
    let openapi: serde_json::Value = openapi.json();
    assert!(openapi["paths"]["/v1/modules"]["post"].is_object());

    // Install app's ZIP in a fresh store: base comes from the registry by the lock's hash.
    ok(module(&names, h, &["build", "app"]));
    let app_zip = app.join("build/app-0.1.0.zip");
    let fresh = h.join("fresh");
    std::fs::create_dir_all(&fresh).unwrap();
    let install = ok(run(names
        .command("svc-module")
        .env("SVC_MODULES_DIR", &fresh)
        .args(["install", app_zip.to_str().unwrap(), "--registry", url])));
    assert!(
        install.stdout.contains("installed base 1.1.0"),
        "{install:?}"
    );

    // Tampered: another store where base 1.1.0 has different bytes is refused.
    let evil_dir = h.join("evil");
    write(
        &evil_dir,
        &[
            ("module.yaml", "name: base\nversion: 1.1.0\n"),
            ("main.star", ""),
            ("lib.star", "def greeting():\n    return \"pwned\"\n"),
        ],
    );
    let other = h.join("other");
    std::fs::create_dir_all(&other).unwrap();
    ok(run(names
        .command("svc-module")
        .env("SVC_MODULES_DIR", &other)
        .args(["install", evil_dir.to_str().unwrap()])));
    let refused = run(names
        .command("svc-module")
        .env("SVC_MODULES_DIR", &other)
        .args(["install", app_zip.to_str().unwrap(), "--registry", url]));
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stderr.contains("tampered"), "{refused:?}");

    // Signatures required: unsigned refused, signed by a trusted key accepted.
    ok(module(&names, h, &["keygen", "trusted"]));
    let public = std::fs::read_to_string(h.join("trusted.pub")).unwrap();
    std::fs::write(
        h.join("modules.yaml"),
        format!(
            "modules:\n  require_signature: true\n  trusted_keys: [\"{}\"]\n",
            public.trim()
        ),
    )
    .unwrap();
    let strict = h.join("strict");
    std::fs::create_dir_all(&strict).unwrap();
    let base_zip = h.join("base-1.0.0/build/base-1.0.0.zip");
    let unsigned = run(names
        .command("svc-module")
        .env("SVC_MODULES_DIR", &strict)
        .env("SVC_MODULES_CONFIG", h.join("modules.yaml"))
        .args(["install", base_zip.to_str().unwrap()]));
    assert_eq!(unsigned.code, 4, "{unsigned:?}");
    assert!(unsigned.stderr.contains("not signed"), "{unsigned:?}");
    ok(module(
        &names,
        h,
        &["sign", base_zip.to_str().unwrap(), "--key", "trusted.key"],
    ));
    ok(run(names
        .command("svc-module")
        .env("SVC_MODULES_DIR", &strict)
        .env("SVC_MODULES_CONFIG", h.join("modules.yaml"))
        .args(["install", base_zip.to_str().unwrap()])));
}

/// Builds module NAME at VERSION in HOME/NAME-VERSION; returns its ZIP.
fn build_module(names: &Names, home: &Path, name: &str, version: &str) -> String {
    let dir = home.join(format!("{name}-{version}"));
    write(
        &dir,
        &[
            (
                "module.yaml",
                &format!("name: {name}\nversion: {version}\n"),
            ),
            ("main.star", ""),
        ],
    );
    ok(module(names, home, &["build", dir.to_str().unwrap()]));
    let zip = dir.join(format!("build/{name}-{version}.zip"));
    zip.to_str().unwrap().to_string()
}

#[test]
fn registry_over_https() {
    let names = Names::new();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let pki = common::pki::Pki::new();
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("server.pem"),
        pki.path("server.key"),
    );
    let (ca, cert, key) = (
        ca.to_str().unwrap(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
    );
    std::fs::write(h.join("tokens"), "secret-token\n").unwrap();

    // Half a pair, or a key for another certificate, is refused at start with the flag named.
    for (args, expect) in [
        (vec!["--tls-cert", cert], "--tls-key is missing"),
        (vec!["--tls-key", key], "--tls-cert is missing"),
        (
            vec![
                "--tls-cert",
                cert,
                "--tls-key",
                pki.path("other.key").to_str().unwrap(),
            ],
            "does not match",
        ),
    ] {
        let refused = run(names
            .command("svc-registry")
            .args(["serve", "--listen", "127.0.0.1:0", "--dir"])
            .arg(h.join("unused"))
            .args(&args));
        assert_eq!(refused.code, 2, "{refused:?}");
        assert!(refused.stderr.contains(expect), "{expect}: {refused:?}");
    }

    let registry = start_registry_with(
        &names,
        &h.join("registry"),
        &h.join("tokens"),
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert,
            "--tls-key",
            key,
        ],
    );
    let url = registry.url.as_str();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    std::fs::create_dir_all(h.join("fresh")).unwrap();
    let zip = build_module(&names, h, "base", "1.0.0");
    let publish = |extra: &[&str]| {
        let mut args = vec![
            "publish",
            &zip,
            "--registry",
            url,
            "--token",
            "secret-token",
        ];
        args.extend_from_slice(extra);
        module(&names, h, &args)
    };

    // Without the CA the certificate does not verify: refused before the token is sent, and
    // the error names the host and the flag that fixes it.
    let untrusted = publish(&[]);
    assert_eq!(untrusted.code, 3, "{untrusted:?}");
    for part in ["not trusted", "127.0.0.1", "--registry-ca"] {
        assert!(untrusted.stderr.contains(part), "{part}: {untrusted:?}");
    }
    assert!(!h.join("registry/base").exists());
    // A CA file that holds no certificate is a usage error naming the flag.
    let bad_ca = publish(&["--registry-ca", key]);
    assert_eq!(bad_ca.code, 2, "{bad_ca:?}");
    assert!(bad_ca.stderr.contains("--registry-ca"), "{bad_ca:?}");

    // With the CA: publish, then list and download (install by name) over https.
    let published = ok(publish(&["--registry-ca", ca, "-o", "json"]));
    assert!(
        published.stdout.contains("\"version\": \"1.0.0\""),
        "{published:?}"
    );
    let installed = ok(run(names
        .command("svc-module")
        .env("SVC_MODULES_DIR", h.join("fresh"))
        .env("SVC_REGISTRY_CA", ca)
        .args(["install", "base@^1", "--registry", url])));
    assert!(
        installed.stdout.contains("installed base 1.0.0"),
        "{installed:?}"
    );
    // The certificate's DNS name works as well as its IP address.
    let by_name = url.replace("127.0.0.1", "localhost");
    let again = ok(run(names
        .command("svc-module")
        .env("SVC_MODULES_DIR", h.join("fresh"))
        .args([
            "install",
            "base",
            "--registry",
            &by_name,
            "--registry-ca",
            ca,
        ])));
    assert!(
        again.stdout.contains("already installed base 1.0.0"),
        "{again:?}"
    );

    // The registry speaks nothing but TLS: a plain request on its port gets no answer.
    let addr: std::net::SocketAddr = url.trim_start_matches("https://").parse().unwrap();
    assert!(common::http_request(addr, "GET", "/healthz", &[], None).is_err());
}

/// An address of this machine that is not loopback, if it has one (the interface a route to
/// a documentation address would leave by; no packet is sent).
fn non_loopback_ip() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    Some(socket.local_addr().ok()?.ip()).filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
}

#[test]
fn registry_plain_http_only_to_loopback() {
    let names = Names::new();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::write(h.join("tokens"), "secret-token\n").unwrap();
    let registry = start_registry_with(
        &names,
        &h.join("registry"),
        &h.join("tokens"),
        &["--listen", "0.0.0.0:0"],
    );
    let port = registry.url.rsplit(':').next().unwrap().to_string();
    let zip = build_module(&names, h, "base", "1.0.0");
    // Loopback needs no flag.
    let local = format!("http://127.0.0.1:{port}");
    ok(module(
        &names,
        h,
        &[
            "publish",
            &zip,
            "--registry",
            &local,
            "--token",
            "secret-token",
        ],
    ));

    // The registry itself sends API keys to --svc-url: the same rule, at start.
    let svc_url = run(names.command("svc-registry").args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--svc-url",
        "http://192.0.2.1:8080",
    ]));
    assert_eq!(svc_url.code, 2, "{svc_url:?}");
    for part in ["--svc-url", "refusing plain http://", "--allow-plain-http"] {
        assert!(svc_url.stderr.contains(part), "{part}: {svc_url:?}");
    }

    // A URL that is not http(s) at all is refused as such.
    let ftp = module(
        &names,
        h,
        &["install", "base", "--registry", "ftp://127.0.0.1/"],
    );
    assert_eq!(ftp.code, 2, "{ftp:?}");
    assert!(ftp.stderr.contains("https://"), "{ftp:?}");

    let Some(ip) = non_loopback_ip() else {
        // The URL policy itself is covered by the unit test tls::tests::plaintext_remote_hosts.
        eprintln!("no non-loopback address on this machine: remote http:// not exercised");
        return;
    };
    let remote = format!("http://{ip}:{port}");
    let refused = module(&names, h, &["install", "base", "--registry", &remote]);
    assert_eq!(refused.code, 2, "{refused:?}");
    for part in [
        "refusing plain http://",
        &ip.to_string(),
        "--allow-plain-http",
    ] {
        assert!(refused.stderr.contains(part), "{part}: {refused:?}");
    }
    let publish = module(
        &names,
        h,
        &["publish", &zip, "--registry", &remote, "--token", "x"],
    );
    assert_eq!(publish.code, 2, "{publish:?}");
    assert!(publish.stderr.contains("--allow-plain-http"), "{publish:?}");
    // Allowed explicitly, the same registry answers.
    let allowed = ok(module(
        &names,
        h,
        &[
            "install",
            "base",
            "--registry",
            &remote,
            "--allow-plain-http",
        ],
    ));
    assert!(
        allowed.stdout.contains("installed base 1.0.0"),
        "{allowed:?}"
    );
}

/// `svc-module` with the server's address and `key`, in `home` (its store).
fn module_on(server: &TestServer, key: &str, home: &Path, args: &[&str]) -> Run {
    run(server
        .cli("svc-module")
        .current_dir(home)
        .env("HOME", home)
        .env("SVC_MODULES_DIR", home.join("store"))
        .args(["--api-key", key, "-o", "json"])
        .args(args))
}

/// The one agent's JSON result line of a `run --target -o json`.
fn agent_result(run: &Run) -> serde_json::Value {
    let line = run
        .stdout
        .lines()
        .find(|l| l.contains("\"agent_id\""))
        .unwrap_or_else(|| panic!("no agent result: {run:?}"));
    serde_json::from_str(line).unwrap()
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
        assert_eq!(listed.code, 0, "{listed:?}");
        let agents = json_of(&listed);
        let connected = |id: &&str| {
            agents
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["id"] == *id && a["state"] == "connected")
        };
        if ids.iter().all(connected) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "agents not connected: {listed:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn run_on_real_agents_applies_like_state() {
    let server = TestServer::start();
    let names = &server.names;
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    ok(module(names, h, &["keygen", "k1"]));
    ok(module(names, h, &["keygen", "k2"]));

    // web-01 runs any module; web-02 only modules signed by k1.
    let web1 = Agent::start(&server, "web-01", "role=web");
    let mut web2 = Agent::new("web-02");
    let config = std::fs::read_to_string(web2.config()).unwrap();
    let trusted = h.join("k1.pub");
    std::fs::write(
        web2.config(),
        format!(
            "{config}modules:\n  require_signature: true\n  trusted_keys: [{}]\n",
            trusted.display()
        ),
    )
    .unwrap();
    let enrolled = web2.bootstrap(&server, &["--server", &server.bus, "--labels", "role=db"]);
    assert_eq!(enrolled.code, 0, "{enrolled:?}");
    web2.spawn(names);
    let (_, operator) = server.create_key("ops", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    wait_connected(&server, &["web-01", "web-02"]);

    // A dependency, installed here, that travels with the module.
    write(
        &h.join("paths"),
        &[
            ("module.yaml", "name: paths\nversion: 1.2.0\n"),
            (
                "lib.star",
                "def under(root, name):\n    return root + \"/\" + name\n",
            ),
        ],
    );
    ok(module(names, h, &["install", "paths"]));
    write(
        &h.join("site"),
        &[
            (
                "module.yaml",
                "name: site\nversion: 1.0.0\ndependencies:\n  paths: \"^1.0\"\n\
                 exports:\n  setup:\n    parameters:\n      root: {type: string}\n      message: {type: string, default: hello}\n",
            ),
            (
                "main.star",
                "load(\"@paths//lib.star\", \"under\")\n\n\
                 def setup(root, message):\n    log(\"on \" + facts()[\"hostname\"])\n    \
                 return [directory(under(root, \"app\")), file(under(root, \"app/motd\"), content = message + \" from \" + facts()[\"os\"] + \"\\n\")]\n",
            ),
        ],
    );
    let out = tempfile::tempdir().unwrap();
    let root1 = out.path().join("one");
    std::fs::create_dir(&root1).unwrap();
    let root1_arg = format!("root={}", root1.display());
    // `run site setup` with these arguments, as `key`, on `target`.
    let site = |key: &str, zip: &str, args: &[&str], target: &str| {
        let mut all = vec!["run", zip, "setup"];
        for arg in args {
            all.extend(["--arg", arg]);
        }
        all.extend(["-t", target]);
        module_on(&server, key, h, &all)
    };

    // check: what would change; nothing changes.
    let checked = module_on(
        &server,
        &operator,
        h,
        &[
            "run", "site", "setup", "--arg", &root1_arg, "--target", "web-01", "--check",
        ],
    );
    assert_eq!(checked.code, 0, "{checked:?}\n{}", web1.log());
    let result = agent_result(&checked);
    assert_eq!(result["status"], "changed", "{result}");
    assert!(
        result["logs"][0].as_str().unwrap().starts_with("on "),
        "{result}"
    );
    assert!(!root1.join("app").exists(), "check changed the host");

    // A readonly key may not run modules.
    let denied = site(&readonly, "site", &[&root1_arg], "web-01");
    assert_eq!(denied.code, 4, "{denied:?}");

    // apply: the file is there with the agent's facts; again, nothing changes.
    let applied = site(&operator, "site", &[&root1_arg, "message=hi"], "web-01");
    assert_eq!(applied.code, 0, "{applied:?}\n{}", web1.log());
    let result = agent_result(&applied);
    assert_eq!(result["status"], "changed", "{result}");
    assert_eq!(result["outcomes"].as_array().unwrap().len(), 2, "{result}");
    // facts()["os"] is the agent's os-release ID (`debian`), the fact `--target os=...` selects.
    let os = svc::facts::collect()["os"].as_str().unwrap().to_string();
    assert_eq!(
        std::fs::read_to_string(root1.join("app/motd")).unwrap(),
        format!("hi from {os}\n")
    );
    let again = site(&operator, "site", &[&root1_arg, "message=hi"], "web-01");
    assert_eq!(agent_result(&again)["status"], "ok", "{again:?}");

    // What the module applied is the agent's last applied state: drift sees a change.
    std::fs::write(root1.join("app/motd"), "edited\n").unwrap();
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
    assert_eq!(drift.code, 1, "{drift:?}");
    assert!(
        drift
            .stdout
            .contains(&format!("file:{}/app/motd", root1.display())),
        "{drift:?}"
    );

    // Audited once per apply, with the module's hash.
    let rows = common::audit_rows(&server, &["--action", "module.run"]);
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(
        rows.iter().any(|r| r.to_string().contains("site-1.0.0")),
        "{rows:?}"
    );

    // web-02 refuses the unsigned module, and one signed by a key it does not trust.
    let root2 = out.path().join("two");
    std::fs::create_dir(&root2).unwrap();
    let root2_arg = format!("root={}", root2.display());
    ok(module(names, h, &["build", "site", "-O", "site.zip"]));
    let unsigned = site(&operator, "site.zip", &[&root2_arg], "web-02");
    assert_eq!(unsigned.code, 1, "{unsigned:?}");
    let result = agent_result(&unsigned);
    assert_eq!(result["status"], "failed", "{result}");
    assert!(
        result["error"].as_str().unwrap().contains("not signed"),
        "{result}"
    );
    ok(module(names, h, &["sign", "site.zip", "--key", "k2.key"]));
    let untrusted = site(&operator, "site.zip", &[&root2_arg], "web-02");
    assert_eq!(untrusted.code, 1, "{untrusted:?}");
    assert!(
        agent_result(&untrusted)["error"]
            .as_str()
            .unwrap()
            .contains("not by a trusted key"),
        "{untrusted:?}"
    );
    assert!(!root2.join("app").exists());
    // The dependency is unsigned too: web-02 refuses until it is signed as installed.
    ok(module(names, h, &["sign", "site.zip", "--key", "k1.key"]));
    let dep_unsigned = site(&operator, "site.zip", &[&root2_arg], "web-02");
    assert!(
        agent_result(&dep_unsigned)["error"]
            .as_str()
            .unwrap()
            .contains("paths-1.2.0 is not signed"),
        "{dep_unsigned:?}"
    );
    let dep_zip = h.join("store/paths/1.2.0/module.zip");
    assert!(dep_zip.exists(), "store layout changed");
    ok(module(
        names,
        h,
        &[
            "sign",
            dep_zip.to_str().unwrap(),
            "--key",
            "k1.key",
            "-O",
            h.join("store/paths/1.2.0/module.zip.sig").to_str().unwrap(),
        ],
    ));
    let signed = site(&operator, "site.zip", &[&root2_arg], "web-02");
    assert_eq!(signed.code, 0, "{signed:?}\n{}", web2.log());
    assert_eq!(
        std::fs::read_to_string(root2.join("app/motd")).unwrap(),
        format!("hello from {os}\n")
    );

    // A runaway module is stopped on the agent by the step limit; nothing is applied.
    write(
        &h.join("spin"),
        &[
            (
                "module.yaml",
                "name: spin\nversion: 1.0.0\nexports:\n  forever: {}\n",
            ),
            (
                "main.star",
                "def forever():\n    for i in range(1000000000):\n        pass\n    return []\n",
            ),
        ],
    );
    let spin = module_on(
        &server,
        &operator,
        h,
        &[
            "run",
            "spin",
            "forever",
            "--max-steps",
            "100000",
            "-t",
            "web-01",
        ],
    );
    assert_eq!(spin.code, 1, "{spin:?}");
    assert!(
        agent_result(&spin)["error"]
            .as_str()
            .unwrap()
            .contains("step limit of 100000 exceeded"),
        "{spin:?}"
    );

    // Bad input is refused by the server before any agent sees it.
    let missing = module_on(
        &server,
        &operator,
        h,
        &["run", "site", "nope", "-t", "web-01"],
    );
    assert_eq!(missing.code, 5, "{missing:?}");
    assert!(
        missing.stderr.contains("exports no function 'nope'"),
        "{missing:?}"
    );
    let mistyped = module_on(
        &server,
        &operator,
        h,
        &["run", "site", "setup", "--arg", "bogus=1", "-t", "web-01"],
    );
    assert_ne!(mistyped.code, 0, "{mistyped:?}");
    assert!(
        mistyped.stderr.contains("no parameter 'bogus'"),
        "{mistyped:?}"
    );
}
