//! The web console in a real browser: Debian's `chromium`, headless, driven by `chromedriver`
//! over the W3C WebDriver protocol against a real server with real agents.
//!
//! The WebDriver client is the few JSON-over-HTTP calls below over a plain blocking socket:
//! no WebDriver crate (fantoccini or thirtyfour would add
//! an async client stack and some dozens of crates to the test build for what is here about
//! a hundred lines), no Python.
//!
//! Without chromium or chromedriver the test says so and passes, unless `CI` is set (.ci/run
//! installs both): then it fails. On a failure it saves a screenshot under
//! target/console-browser/. With `SVC_CONSOLE_SCREENSHOTS=DIR` it also saves one PNG per page
//! there (`docs/` is where docs/console.md expects them).

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::agent::Agent;
use common::{run, TestServer};
use serde_json::{json, Value};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// W3C WebDriver's key for an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Payloads that would run script or add an element if any text were parsed as HTML.
const SCRIPT_PAYLOAD: &str = "<script>window.__xss=1</script>";
const IMG_PAYLOAD: &str = "\"><img src=x onerror=window.__xss=2>";

fn find(path: &str, name: &str) -> Option<PathBuf> {
    let fixed = Path::new(path);
    if fixed.exists() {
        return Some(fixed.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.exists())
    })
}

/// chromedriver on a free loopback port, killed on drop.
struct Driver {
    child: Child,
    addr: SocketAddr,
}

impl Driver {
    fn start(binary: &Path) -> Driver {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, _)) = exchange(addr, "GET", "/status", "") {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        Driver { child, addr }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One browser session. Saves a screenshot if the test panics while it is open.
struct Browser<'a> {
    driver: &'a Driver,
    session: String,
    base: String,
    shots: Option<PathBuf>,
}

impl<'a> Browser<'a> {
    fn open(driver: &'a Driver, chromium: &Path, base: String) -> Browser<'a> {
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.to_string_lossy(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1360,900", "--no-first-run", "--no-default-browser-check"]
            }
        }}});
        let response = call(driver.addr, "POST", "/session", Some(capabilities));
        let session = response["sessionId"].as_str().unwrap().to_string();
        Browser {
            driver,
            session,
            base,
            shots: std::env::var_os("SVC_CONSOLE_SCREENSHOTS").map(PathBuf::from),
        }
    }

    fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        call(self.driver.addr, method, &path, body)
    }

    fn goto(&self, path: &str) {
        self.command(
            "POST",
            "/url",
            Some(json!({"url": format!("{}{path}", self.base)})),
        );
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    fn script(&self, script: &str, args: Value) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
    }

    /// Runs `script`, whose last argument is a callback to call with the result.
    fn script_async(&self, script: &str, args: Value) -> Value {
        self.command(
            "POST",
            "/execute/async",
            Some(json!({"script": script, "args": args})),
        )
    }

    fn element(&self, css: &str) -> String {
        let found = self.command(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        );
        found[ELEMENT].as_str().unwrap().to_string()
    }

    fn click(&self, css: &str) {
        let id = self.element(css);
        self.command("POST", &format!("/element/{id}/click"), Some(json!({})));
    }

    fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css);
        self.command("POST", &format!("/element/{id}/clear"), Some(json!({})));
        self.command(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({"text": text})),
        );
    }

    fn text(&self, css: &str) -> String {
        let value = self.script(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
            json!([css]),
        );
        value.as_str().unwrap_or_default().to_string()
    }

    /// Polls `expression` (JavaScript) until it is truthy.
    fn wait(&self, expression: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let script = format!("return !!({expression});");
        while self.script(&script, json!([])) != json!(true) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} ({expression}); message: {:?}",
                self.text("#message")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn screenshot(&self, path: &Path) {
        let data = self.command("GET", "/screenshot", None);
        if let Some(text) = data.as_str() {
            if let Ok(png) = base64::engine::general_purpose::STANDARD.decode(text) {
                let _ = std::fs::create_dir_all(path.parent().unwrap());
                let _ = std::fs::write(path, png);
            }
        }
    }

    /// Saves the page as console-NAME.png when screenshots were asked for.
    fn page_shot(&self, name: &str) {
        if let Some(dir) = &self.shots {
            self.screenshot(&dir.join(format!("console-{name}.png")));
        }
    }

    /// What a page must never show: an element or a script that came from data.
    fn assert_nothing_injected(&self) {
        let found = self.script(
            "return {xss: window.__xss === undefined ? null : window.__xss, \
              images: document.querySelectorAll('img').length, \
              scripts: document.querySelectorAll('script').length, \
              csp: document.body.dataset.cspViolations || '0'};",
            json!([]),
        );
        assert_eq!(
            found,
            json!({"xss": null, "images": 0, "scripts": 1, "csp": "0"}),
            "markup from data was parsed"
        );
    }
}

impl Drop for Browser<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let path =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console-browser/failure.png");
            self.screenshot(&path);
            eprintln!(
                "console_browser: screenshot of the failure in {}",
                path.display()
            );
        }
        let _ = exchange(
            self.driver.addr,
            "DELETE",
            &format!("/session/{}", self.session),
            "",
        );
    }
}

/// One WebDriver command; returns its `value`, failing on a WebDriver error.
fn call(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> Value {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let (status, text) = exchange(addr, method, path, &body)
        .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"));
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    assert_eq!(status, 200, "WebDriver {method} {path}: {text}");
    value["value"].clone()
}

/// An HTTP/1.1 exchange that reads the body by its Content-Length: chromedriver keeps the
/// connection open after answering, so reading to the end would wait for a timeout.
fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut socket = std::net::TcpStream::connect(addr)?;
    socket.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        socket,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut reader = BufReader::new(socket);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut length = None;
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse::<usize>().ok();
            }
        }
    }
    let mut bytes = Vec::new();
    match length {
        Some(length) => {
            bytes.resize(length, 0);
            reader.read_exact(&mut bytes)?;
        }
        None => {
            reader.read_to_end(&mut bytes)?;
        }
    }
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

fn emit(server: &TestServer, key: &str, event_type: &str, payload: &str) {
    let emitted = run(server.cli("svc-events").args([
        "--api-key",
        key,
        "emit",
        "--type",
        event_type,
        "--source",
        "web-01",
        "--payload",
        payload,
    ]));
    assert_eq!(emitted.code, 0, "{emitted:?}");
}

#[test]
fn an_operator_watches_quarantines_and_audits_and_a_readonly_key_cannot() {
    let (Some(chromium), Some(chromedriver)) = (
        find(CHROMIUM, "chromium"),
        find(CHROMEDRIVER, "chromedriver"),
    ) else {
        let message =
            "chromium or chromedriver is missing (apt-get install -y chromium chromium-driver)";
        if std::env::var_os("CI").is_some() {
            panic!("{message}, and CI is set");
        }
        eprintln!("console_browser: SKIPPED: {message}");
        return;
    };
    let server = TestServer::start();
    let (_, operator) = server.create_key("oncall", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    let driver = Driver::start(&chromedriver);
    let browser = Browser::open(&driver, &chromium, server.http_url());

    // Sign in: the key goes to sessionStorage and nowhere else.
    browser.goto("/ui/");
    browser.wait("document.querySelector('#signin-key')", "the sign-in form");
    browser.page_shot("signin");
    browser.type_into("#signin-key", &operator);
    browser.click("#signin-form button");
    browser.wait(
        "document.querySelector('#who').textContent.includes('oncall')",
        "sign-in",
    );
    browser.script("window.__marker = 'same page';", json!([]));
    assert_eq!(
        browser.script("return document.cookie;", json!([])),
        json!("")
    );
    assert_eq!(
        browser.script("return localStorage.length;", json!([])),
        json!(0)
    );
    assert!(!browser
        .script("return location.href;", json!([]))
        .as_str()
        .unwrap()
        .contains("svc_"));

    // An agent appears on the fleet page by itself, labels with markup shown as text.
    browser.wait(
        "document.querySelector('#fleet-count').textContent === '0 agent(s)'",
        "the empty fleet",
    );
    let labels = format!("role=web,note={SCRIPT_PAYLOAD},img={IMG_PAYLOAD}");
    let _agent = Agent::start(&server, "web-01", &labels);
    browser.wait(
        "document.querySelector('#fleet-table tr[data-agent=\"web-01\"] .state-connected')",
        "web-01 connected on the fleet page",
    );
    let row = browser.text("#fleet-table tr[data-agent=\"web-01\"]");
    assert!(row.contains(&format!("note={SCRIPT_PAYLOAD}")), "{row}");
    assert!(row.contains(&format!("img={IMG_PAYLOAD}")), "{row}");
    browser.assert_nothing_injected();
    browser.type_into("#fleet-target", "role=db");
    browser.click("#fleet-form button");
    browser.wait(
        "document.querySelector('#fleet-count').textContent === '0 agent(s)'",
        "label filter",
    );
    browser.type_into("#fleet-target", "role=web");
    browser.click("#fleet-form button");
    browser.wait(
        "document.querySelector('#fleet-count').textContent === '1 agent(s)'",
        "label filter",
    );
    browser.page_shot("fleet");

    // A job run from the CLI is on the jobs page; an operator opens it, its output as text.
    let ran = run(server.cli("svcctl").args([
        "--api-key",
        &operator,
        "exec",
        "-t",
        "web-01",
        "--",
        "echo",
        SCRIPT_PAYLOAD,
    ]));
    assert_eq!(ran.code, 0, "{ran:?}");
    browser.click("#nav a[data-page=jobs]");
    browser.wait(
        "document.querySelector('#jobs-table tbody button')",
        "the job on the jobs page",
    );
    browser.click("#jobs-table tbody button");
    browser.wait(
        "document.querySelector('#job-results tbody tr')",
        "the job's results",
    );
    let result_row = browser.text("#job-results tbody tr");
    assert!(
        result_row.contains("web-01") && result_row.contains(SCRIPT_PAYLOAD),
        "{result_row}"
    );
    browser.assert_nothing_injected();
    browser.page_shot("jobs");

    // The live tail opens; it keeps running while the operator goes back to the fleet.
    browser.click("#nav a[data-page=events]");
    browser.wait(
        "document.querySelector('#tail-status').textContent === 'live'",
        "the live tail",
    );
    browser.click("#nav a[data-page=fleet]");
    browser.wait(
        "document.querySelector('#fleet-table tr[data-agent=\"web-01\"] button[data-action=quarantine]')",
        "the quarantine button",
    );
    browser.click("#fleet-table tr[data-agent=\"web-01\"] button[data-action=quarantine]");
    browser.wait(
        "document.querySelector('#fleet-table tr[data-agent=\"web-01\"] .state-quarantined')",
        "web-01 quarantined",
    );
    browser.click("#nav a[data-page=events]");
    browser.wait(
        "document.querySelector('#tail-table tr[data-type=agent_quarantined]')",
        "agent_quarantined in the live tail",
    );

    // An event whose payload carries markup arrives live and shows as text.
    let payload = json!({"message": SCRIPT_PAYLOAD, "html": IMG_PAYLOAD}).to_string();
    emit(&server, &operator, "command_failed", &payload);
    browser.wait(
        "document.querySelector('#tail-table tr[data-type=command_failed]')",
        "the command_failed event in the live tail",
    );
    let tail_row = browser.text("#tail-table tr[data-type=command_failed]");
    assert!(
        tail_row.contains("<script>window.__xss=1</script>"),
        "{tail_row}"
    );
    assert!(
        tail_row.contains("<img src=x onerror=window.__xss=2>"),
        "{tail_row}"
    );
    browser.assert_nothing_injected();
    assert_eq!(
        browser.script("return window.__marker;", json!([])),
        json!("same page"),
        "the page was reloaded"
    );
    browser.page_shot("events");

    // The audit log, filtered to the quarantine, and the chain verified.
    browser.click("#nav a[data-page=audit]");
    browser.wait(
        "document.querySelectorAll('#audit-table tbody tr').length > 0",
        "the audit log",
    );
    browser.type_into("#audit-action", "agent.quarantine");
    browser.click("#audit-form button");
    browser.wait(
        "[...document.querySelectorAll('#audit-table tbody tr')].length === 1 && \
         document.querySelector('#audit-table tbody tr').dataset.action === 'agent.quarantine'",
        "the filtered audit log",
    );
    let audit_row = browser.text("#audit-table tbody tr");
    assert!(
        audit_row.contains("oncall") && audit_row.contains("success"),
        "{audit_row}"
    );
    browser.click("#audit-verify");
    browser.wait(
        "document.querySelector('#audit-verify-result').textContent.startsWith('chain intact')",
        "the verify result",
    );
    // Export is an admin's: the operator sees no export buttons.
    assert_eq!(
        browser.script(
            "return document.querySelector('.admin-only').hidden;",
            json!([])
        ),
        json!(true)
    );
    browser.page_shot("audit");

    // Secrets: metadata only.
    let put = run(server.cli("svc-secrets").args([
        "--api-key",
        &operator,
        "put",
        "db/prod",
        "password=never-shown-in-the-console",
    ]));
    assert_eq!(put.code, 0, "{put:?}");
    browser.click("#nav a[data-page=secrets]");
    browser.click("#secrets-form button");
    browser.wait(
        "document.querySelector('#secrets-table tbody tr')",
        "the secrets list",
    );
    assert!(browser.text("#secrets-table").contains("db/prod"));
    assert!(!browser
        .script("return document.body.textContent;", json!([]))
        .as_str()
        .unwrap()
        .contains("never-shown"));
    browser.page_shot("secrets");

    // Health: readiness, metrics and the chart.
    browser.click("#nav a[data-page=health]");
    browser.wait(
        "document.querySelector('#chart svg rect')",
        "the events chart",
    );
    assert_eq!(browser.text("#ready-badge"), "ready");
    assert!(browser.text("#metrics-table").contains("Agents connected"));
    browser.page_shot("health");

    // Sign out forgets the key.
    browser.click("#sign-out");
    browser.wait(
        "!document.querySelector('#page-signin').hidden",
        "the sign-in page",
    );
    assert_eq!(
        browser.script("return sessionStorage.length;", json!([])),
        json!(0)
    );

    // A readonly key sees no quarantine button, and the server refuses the route anyway.
    browser.type_into("#signin-key", &readonly);
    browser.click("#signin-form button");
    browser.wait(
        "document.querySelector('#who').textContent.includes('viewer')",
        "readonly sign-in",
    );
    browser.click("#nav a[data-page=fleet]");
    browser.wait(
        "document.querySelector('#fleet-table tr[data-agent=\"web-01\"]')",
        "the fleet as readonly",
    );
    assert_eq!(
        browser.script(
            "return document.querySelectorAll('#fleet-table button').length;",
            json!([])
        ),
        json!(0)
    );
    let status = browser.script_async(
        "const done = arguments[arguments.length - 1];
         fetch('/api/v1/agents/web-01/unquarantine', {method: 'POST',
             headers: {Authorization: 'Bearer ' + sessionStorage.getItem('svc.apiKey')}})
           .then((r) => done(r.status), (e) => done(String(e)));",
        json!([]),
    );
    assert_eq!(status, json!(403));
    browser.page_shot("fleet-readonly");
    browser.assert_nothing_injected();
}

/// Benchmark (docs/performance.md), run only with `SVC_CONSOLE_BENCH=1`: first page load on
/// loopback, then emitters at 1,000 events/s for `SVC_CONSOLE_BENCH_SECONDS` (10) while the
/// events page tails; the page must receive every event (its count against the sequence
/// numbers). Prints the figures; asserts no event was dropped, never a time.
#[test]
fn bench_the_live_tail_keeps_up_and_the_page_loads_fast() {
    if std::env::var_os("SVC_CONSOLE_BENCH").is_none() {
        eprintln!("console_browser: benchmark not run (set SVC_CONSOLE_BENCH=1)");
        return;
    }
    let (Some(chromium), Some(chromedriver)) = (
        find(CHROMIUM, "chromium"),
        find(CHROMEDRIVER, "chromedriver"),
    ) else {
        eprintln!("console_browser: SKIPPED: chromium or chromedriver is missing");
        return;
    };
    let seconds: u64 = std::env::var("SVC_CONSOLE_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let server = TestServer::start_with(common::Options {
        config_yaml:
            "rate_limit: { requests_per_second: 100000, burst: 100000, max_in_flight: 256 }\n"
                .into(),
        ..Default::default()
    });
    let (_, operator) = server.create_key("load", "operator");
    let driver = Driver::start(&chromedriver);
    let browser = Browser::open(&driver, &chromium, server.http_url());

    // First load: a cold navigation, then five warm ones (the browser's own timing).
    let mut loads = Vec::new();
    for _ in 0..6 {
        browser.goto("/ui/");
        browser.wait("document.readyState === 'complete'", "the page load");
        let timing = browser.script(
            "const n = performance.getEntriesByType('navigation')[0]; \
             return [n.responseStart - n.startTime, n.domContentLoadedEventEnd - n.startTime, n.loadEventEnd - n.startTime];",
            json!([]),
        );
        let rounded: Vec<u64> = timing
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap().round() as u64)
            .collect();
        loads.push(rounded);
    }
    println!("page load (ms) [first byte, DOMContentLoaded, load], cold then warm: {loads:?}");
    browser.type_into("#signin-key", &operator);
    browser.click("#signin-form button");
    browser.wait(
        "document.querySelector('#fleet-count').textContent !== ''",
        "sign-in",
    );
    // Signed in (key in sessionStorage): a reload until the fleet table is drawn.
    browser.script(
        "sessionStorage.setItem('bench.start', String(Date.now()));",
        json!([]),
    );
    // A query makes it a real navigation (the same URL with a fragment would not reload).
    browser.goto("/ui/?reload#fleet");
    browser.wait("document.querySelector('#fleet-count') && document.querySelector('#fleet-count').textContent !== ''", "the fleet after reload");
    let fleet_ms = browser.script(
        "return Date.now() - Number(sessionStorage.getItem('bench.start'));",
        json!([]),
    );
    println!("reload to the fleet table drawn (signed in): {fleet_ms} ms (includes WebDriver's wait for the load and polling)");

    browser.click("#nav a[data-page=events]");
    browser.wait(
        "document.querySelector('#tail-status').textContent === 'live'",
        "the live tail",
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (emitted, elapsed, last_seq) = runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let mut emitted = 0u64;
        let mut last_seq = 0u64;
        let mut pending = futures_util::stream::FuturesUnordered::new();
        use futures_util::StreamExt as _;
        for index in 0..seconds * 100 {
            tick.tick().await;
            // Ten events every 10 ms: 1,000/s, each emit in flight on its own.
            for n in 0..10 {
                let mut client =
                    svc::proto::event_service_client::EventServiceClient::new(channel.clone());
                let request = svc::proto::EmitEventRequest {
                    r#type: "command_completed".into(),
                    severity: String::new(),
                    source: format!("load-{n}"),
                    payload_json: format!("{{\"i\":{}}}", index * 10 + n),
                };
                let key = operator.clone();
                pending.push(async move { client.emit(common::with_key(request, &key)).await });
            }
            while let Some(Some(done)) = futures_util::FutureExt::now_or_never(pending.next()) {
                last_seq = last_seq.max(done.unwrap().into_inner().seq);
                emitted += 1;
            }
        }
        while let Some(done) = pending.next().await {
            last_seq = last_seq.max(done.unwrap().into_inner().seq);
            emitted += 1;
        }
        (emitted, started.elapsed(), last_seq)
    });
    let caught_up = Instant::now();
    browser.wait(
        &format!("Number(document.querySelector('#tail-stats').dataset.lastSeq) >= {last_seq}"),
        "the tail to reach the last event",
    );
    let lag = caught_up.elapsed();
    let stats = browser.script(
        "const d = document.querySelector('#tail-stats').dataset; return [Number(d.received), Number(d.gaps)];",
        json!([]),
    );
    println!(
        "emitted {emitted} events in {:.2} s ({:.0}/s); the page received {} with {} gaps; \
         caught up {} ms after the last emit returned",
        elapsed.as_secs_f64(),
        emitted as f64 / elapsed.as_secs_f64(),
        stats[0],
        stats[1],
        lag.as_millis()
    );
    assert_eq!(stats[1], json!(0), "the tail dropped events");
    assert!(stats[0].as_u64().unwrap() >= emitted, "{stats}");
}

/// The fleet page with a few thousand agents (`SVC_CONSOLE_BENCH_AGENTS`, default 3000,
/// enrolled on the wire as tests/common/login.rs does): how long a signed-in reload takes to
/// draw its first page, a "Load more", and a refresh. Prints; asserts only what was drawn.
#[test]
fn bench_the_fleet_page_with_thousands_of_agents() {
    if std::env::var_os("SVC_CONSOLE_BENCH").is_none() {
        eprintln!("console_browser: benchmark not run (set SVC_CONSOLE_BENCH=1)");
        return;
    }
    let (Some(chromium), Some(chromedriver)) = (
        find(CHROMIUM, "chromium"),
        find(CHROMEDRIVER, "chromedriver"),
    ) else {
        eprintln!("console_browser: SKIPPED: chromium or chromedriver is missing");
        return;
    };
    let agents: usize = std::env::var("SVC_CONSOLE_BENCH_AGENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let server = TestServer::start();
    let (_, operator) = server.create_key("fleet", "operator");
    let psk = |agent_id: &str| {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"test-hmac-secret");
        hex::encode(ring::hmac::sign(&key, agent_id.as_bytes()).as_ref())
    };
    let started = Instant::now();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(common::login::enrol(&server.bus, 0..agents, "bench", psk));
    println!(
        "{agents} agents enrolled in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let driver = Driver::start(&chromedriver);
    let browser = Browser::open(&driver, &chromium, server.http_url());
    browser.goto("/ui/");
    browser.wait("document.querySelector('#signin-key')", "the sign-in form");
    browser.type_into("#signin-key", &operator);
    browser.click("#signin-form button");
    browser.wait(
        "document.body.dataset.fleetLoaded === '200'",
        "the first page",
    );
    let mut reloads = Vec::new();
    for _ in 0..5 {
        browser.script(
            "sessionStorage.setItem('bench.start', String(Date.now()));",
            json!([]),
        );
        browser.goto("/ui/?reload#fleet");
        browser.wait(
            "document.body.dataset.fleetLoaded === '200'",
            "the first page after reload",
        );
        let ms = browser.script(
            "return Date.now() - Number(sessionStorage.getItem('bench.start'));",
            json!([]),
        );
        reloads.push(ms.as_u64().unwrap());
    }
    let rows = browser.script(
        "return document.querySelectorAll('#fleet-table tbody tr').length;",
        json!([]),
    );
    assert_eq!(rows, json!(200));
    assert!(browser.text("#fleet-count").contains("more to load"));
    // Load more, timed in the page: click to the rows appended.
    let more = browser.script_async(
        "const done = arguments[arguments.length - 1]; const t = performance.now(); \
         document.querySelector('#fleet-more').click(); \
         const poll = () => document.body.dataset.fleetLoaded === '400' \
           ? done(performance.now() - t) : setTimeout(poll, 5); poll();",
        json!([]),
    );
    // A refresh of what is shown (400 rows), as the 2 s timer runs it, timed in the page.
    let refresh = browser.script_async(
        "const done = arguments[arguments.length - 1]; const t = performance.now(); \
         document.querySelector('#fleet-form button').click(); \
         const poll = () => document.body.dataset.fleetLoaded === '200' \
           ? done(performance.now() - t) : setTimeout(poll, 5); poll();",
        json!([]),
    );
    let rows = browser.script(
        "return document.querySelectorAll('#fleet-table tbody tr').length;",
        json!([]),
    );
    assert_eq!(rows, json!(200));
    println!(
        "fleet page, {agents} agents: signed-in reload to the first 200 drawn {reloads:?} ms \
         (includes WebDriver's wait for the load and polling); Load more (200 more) {:.0} ms; \
         filter submit (back to the first 200) {:.0} ms",
        more.as_f64().unwrap(),
        refresh.as_f64().unwrap()
    );
}
