//! Differential tests: the same raw protocol sessions against Debian's nats-server 2.9.10
//! and against our broker, compared op by op, plus whether each socket was closed.
//!
//! Each session is a list of (client, bytes) steps with a short pause after each, so split
//! frames arrive as separate reads. At the end every open client sends PING and waits for
//! its PONG, which orders everything the server sent it before. INFO is compared only on
//! proto, headers, max_payload, auth_required and tls_required; `_INBOX.` ids are masked.
//! Without nats-server the test prints a skip line, unless `CI` is set, where it fails.
//!
//! `info_matches_nats_server` compares the first INFO's key set and value types (not values:
//! ids, ports and names differ) on an open, a password and a TLS server, so a field that
//! nats-server sends and we do not fails the build.
//!
//! `monitoring_matches_nats_server` runs nats-server with `-m` next to a real svc-server,
//! drives the same traffic through both with async-nats, and compares the key sets and value
//! types of /varz, /connz (plain, `subs=1`, `subs=detail`, `auth=1`), /subsz (plain and
//! `subs=1`), /healthz, /routez and /jsz; counters must move by exactly the traffic sent.

mod bus_support;
mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bus_support::{start_broker, Raw};
use svc::bus::{AllowDeny, BrokerConfig, NoAuth, Permissions, StaticAuth};

const NATS_SERVER_CANDIDATES: [&str; 2] = ["/usr/sbin/nats-server", "/usr/bin/nats-server"];

/// The nats-server configuration mirrored by [`mirrored_auth`].
const AUTH_CONFIG: &str = r#"
authorization {
  users = [
    {user: alice, password: secret, permissions: {
      publish: {allow: ["svc.>", "_INBOX.>"], deny: ["svc.secret"]},
      subscribe: {allow: ["svc.>", "_INBOX.>"], deny: ["svc.hidden.>"]}}}
    {user: bob, password: pw}
  ]
}
"#;

fn mirrored_auth() -> StaticAuth {
    StaticAuth::new()
        .with_user(
            "alice",
            "secret",
            Permissions {
                user: "alice".into(),
                publish: AllowDeny::only(["svc.>", "_INBOX.>"]).deny(["svc.secret"]),
                subscribe: AllowDeny::only(["svc.>", "_INBOX.>"]).deny(["svc.hidden.>"]),
                internal: false,
                quota: false,
            },
        )
        .with_user("bob", "pw", Permissions::allow_all("bob"))
}

/// The nats-server side of the monitoring comparison: token auth like svc's API keys, and no
/// system account (svc serves no `$SYS` requests).
const MONITORED_CONFIG: &str = "no_sys_acc: true\nauthorization { token: \"s3cret-token\" }\n";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn find_nats_server() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("nats-server"))
            .find(|candidate| candidate.is_file())
    });
    on_path.or_else(|| {
        NATS_SERVER_CANDIDATES
            .iter()
            .map(PathBuf::from)
            .find(|path| path.is_file())
    })
}

/// A nats-server child process, killed on drop.
struct NatsServer {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    async fn start(binary: &Path, config: Option<&str>) -> NatsServer {
        Self::start_with(binary, config, &[]).await
    }

    async fn start_with(binary: &Path, config: Option<&str>, extra: &[&str]) -> NatsServer {
        let dir = tempfile::tempdir().unwrap();
        // Pick a free port, release it, and hand it to nats-server.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut command = Command::new(binary);
        command.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
        command.args(extra);
        if let Some(config) = config {
            let path = dir.path().join("nats.conf");
            std::fs::write(&path, config).unwrap();
            command.arg("-c").arg(path);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        // Owned by the guard at once, so every path below kills and reaps it.
        let server = NatsServer {
            child,
            addr,
            _dir: dir,
        };
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("nats-server did not start on {addr}");
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Session {
    name: &'static str,
    with_auth: bool,
    clients: usize,
    steps: Vec<(usize, Vec<u8>)>,
}

fn session(name: &'static str, steps: &[&[u8]]) -> Session {
    Session {
        name,
        with_auth: false,
        clients: 1,
        steps: steps.iter().map(|step| (0, step.to_vec())).collect(),
    }
}

fn multi(name: &'static str, clients: usize, steps: &[(usize, &[u8])]) -> Session {
    Session {
        name,
        with_auth: false,
        clients,
        steps: steps
            .iter()
            .map(|(client, step)| (*client, step.to_vec()))
            .collect(),
    }
}

fn with_auth(mut session: Session) -> Session {
    session.with_auth = true;
    session
}

const QUIET: &[u8] = b"CONNECT {\"verbose\":false}\r\n";
const QUIET_HEADERS: &[u8] =
    b"CONNECT {\"verbose\":false,\"headers\":true,\"no_responders\":true}\r\n";

fn sessions() -> Vec<Session> {
    let long_subject = format!("PUB {} 0\r\n\r\n", "a".repeat(4094));
    let too_long_subject = format!("PUB {} 0\r\n\r\n", "a".repeat(4095));
    let long_unterminated = format!("SUB {}", "a".repeat(5000));
    let leak = |text: String| -> &'static [u8] { Box::leak(text.into_bytes().into_boxed_slice()) };
    vec![
        session("verbose defaults", &[b"CONNECT {}\r\n", b"SUB a 1\r\nPUB a 1\r\nx\r\nUNSUB 1\r\nUNSUB 7\r\n"]),
        session("ops before connect", &[b"SUB a 1\r\npub a 2\r\nhi\r\n"]),
        session("lower case and tabs", &[QUIET, b"sub\ta\t 9\r\npUb  a  2\r\nhi\r\nping\r\n"]),
        session(
            "split frames",
            &[QUIET, b"SU", b"B a.b 1\r", b"\nPUB a", b".b 5\r\nhe", b"l", b"lo\r", b"\n"],
        ),
        session("coalesced frames", &[b"CONNECT {\"verbose\":false}\r\nSUB a 1\r\nPUB a 0\r\n\r\nPUB a 2\r\n\r\n\r\nPING\r\nPUB a 1\r\nz\r\n"]),
        session("payload with crlf", &[QUIET, b"SUB a 1\r\nPUB a 6\r\n\r\nab\r\n\r\n"]),
        session("wrong byte count", &[QUIET, b"SUB a 1\r\nPUB a 2\r\nabc\r\n"]),
        session("short byte count", &[QUIET, b"PUB a 5\r\nab\r\n\r\nPING\r\n"]),
        session("non-numeric size", &[QUIET, b"PUB a x\r\n"]),
        session("pub missing args", &[QUIET, b"PUB a\r\n"]),
        session("pub too many args", &[QUIET, b"PUB a b c 1\r\n"]),
        session("sub missing args", &[QUIET, b"SUB a\r\n"]),
        session("sub too many args", &[QUIET, b"SUB a b c d\r\n"]),
        session("unsub no args", &[QUIET, b"UNSUB\r\n"]),
        session("unsub bad max", &[QUIET, b"SUB a 1\r\nUNSUB 1 x\r\nPUB a 1\r\nx\r\n"]),
        session("unknown verb", &[QUIET, b"FOO bar\r\n"]),
        session("msg from client", &[QUIET, b"MSG a 1 1\r\nx\r\n"]),
        session("err from client", &[QUIET, b"-ERR 'x'\r\n"]),
        session("ok and info from client", &[QUIET, b"+OK\r\nINFO {}\r\nPONG\r\n"]),
        session("ping with junk", &[QUIET, b"PINGX\r\nPING 1 2\r\n"]),
        session("bad subjects pedantic", &[
            b"CONNECT {\"verbose\":false,\"pedantic\":true}\r\n",
            b"SUB a..b 1\r\nSUB .a 2\r\nSUB a. 3\r\nSUB a.>.b 4\r\nSUB a.* 5\r\nPUB a.* 1\r\nx\r\nPUB a..b 0\r\n\r\n",
        ]),
        session("bad subjects not pedantic", &[
            b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\n",
            b"SUB a..b 1\r\nSUB a.* 5\r\nPUB a.* 1\r\nx\r\nPUB a..b 0\r\n\r\n",
        ]),
        session("bad publish subject verbose", &[b"CONNECT {\"pedantic\":true}\r\n", b"PUB a.> 0\r\n\r\n"]),
        session("wildcards", &[QUIET, b"SUB a.* 1\r\nSUB a.> 2\r\nSUB > 3\r\nSUB a.b 4\r\nSUB a* 5\r\nPUB a.b 0\r\n\r\nPUB a.b.c 0\r\n\r\nPUB a 0\r\n\r\nPUB a* 0\r\n\r\n"]),
        session("repeated sid", &[QUIET, b"SUB a 1\r\nSUB b 1\r\nPUB a 0\r\n\r\nPUB b 0\r\n\r\n"]),
        session("unsub max", &[QUIET, b"SUB a 1\r\nUNSUB 1 2\r\nPUB a 1\r\nx\r\nPUB a 1\r\ny\r\nPUB a 1\r\nz\r\n"]),
        session("unsub max already reached", &[QUIET, b"SUB a 1\r\nPUB a 1\r\nx\r\nPUB a 1\r\ny\r\nUNSUB 1 2\r\nPUB a 1\r\nz\r\n"]),
        session("unsub then resubscribe sid", &[QUIET, b"SUB a 1\r\nUNSUB 1\r\nSUB b 1\r\nPUB a 0\r\n\r\nPUB b 0\r\n\r\n"]),
        session("headers", &[QUIET_HEADERS, b"SUB a 1\r\nHPUB a r 22 33\r\nNATS/1.0\r\nBar: Baz\r\n\r\nHello NATS!\r\nHPUB a 5 5\r\nhello\r\n"]),
        session("hpub header larger than total", &[QUIET_HEADERS, b"HPUB a 6 5\r\nhello\r\n"]),
        session("hpub without headers", &[QUIET, b"HPUB a 12 12\r\nNATS/1.0\r\n\r\n\r\n"]),
        session("no responders", &[QUIET_HEADERS, b"SUB _INBOX.abc.* 1\r\nPUB svc.nobody _INBOX.abc.1 0\r\n\r\n"]),
        session("no responders literal sub wins", &[QUIET_HEADERS, b"SUB _INBOX.abc.* 1\r\nSUB _INBOX.abc.1 2\r\nPUB svc.nobody _INBOX.abc.1 0\r\n\r\n"]),
        session("no responders without inbox sub", &[QUIET_HEADERS, b"PUB svc.nobody _INBOX.abc.1 0\r\n\r\n"]),
        session("no responders with echo off", &[b"CONNECT {\"verbose\":false,\"headers\":true,\"no_responders\":true,\"echo\":false}\r\n", b"SUB _INBOX.abc.* 1\r\nSUB foo 2\r\nPUB foo _INBOX.abc.1 0\r\n\r\n"]),
        session("no responders not asked", &[b"CONNECT {\"verbose\":false,\"headers\":true}\r\n", b"SUB _INBOX.abc.* 1\r\nPUB svc.nobody _INBOX.abc.1 0\r\n\r\n"]),
        session("echo off", &[b"CONNECT {\"verbose\":false,\"echo\":false}\r\n", b"SUB a 1\r\nPUB a 0\r\n\r\n"]),
        session("null options", &[b"CONNECT {\"verbose\":null,\"pedantic\":null,\"echo\":null,\"user\":null,\"unknown\":5}\r\n", b"SUB a 1\r\nPUB a 0\r\n\r\n"]),
        session("bad protocol", &[b"CONNECT {\"protocol\":2}\r\n"]),
        session("no responders needs headers", &[b"CONNECT {\"no_responders\":true}\r\n"]),
        session("bad json", &[b"CONNECT {nope\r\n"]),
        session("connect without json", &[b"CONNECT\r\n"]),
        session("payload too large", &[QUIET, b"PUB a 1048577\r\n"]),
        session("payload at limit", &[QUIET, b"SUB a 1\r\nPUB a 1048576\r\n", leak(format!("{}\r\n", "p".repeat(1048576)))]),
        session("control line at limit", &[QUIET, leak(long_subject)]),
        session("control line over limit", &[QUIET, leak(too_long_subject)]),
        session("control line unterminated", &[QUIET, leak(long_unterminated)]),
        multi("fan out and queue", 3, &[
            (0, QUIET), (1, QUIET), (2, QUIET),
            // One member per group: which member of a larger group gets a message is random
            // on both servers (bus_broker.rs checks the distribution).
            (0, b"SUB job 1\r\nSUB job q 2\r\n"),
            (1, b"SUB job r 1\r\nSUB jo* 2\r\nSUB job.> 3\r\n"),
            (2, b"PING\r\n"),
            (2, b"PUB job 1\r\nA\r\nPUB job 1\r\nB\r\n"),
        ]),
        multi("request reply", 2, &[
            (0, QUIET_HEADERS), (1, QUIET_HEADERS),
            (0, b"SUB svc.enroll 1\r\n"),
            (1, b"SUB _INBOX.0123456789abcdefghij.* 7\r\n"),
            (1, b"PUB svc.enroll _INBOX.0123456789abcdefghij.1 3\r\ncsr\r\n"),
            (0, b"PUB _INBOX.0123456789abcdefghij.1 4\r\ncert\r\n"),
        ]),
        multi("ordering per publisher", 2, &[
            (0, QUIET), (1, QUIET),
            (0, b"SUB o.* 1\r\n"),
            (1, b"PING\r\n"),
            (1, b"PUB o.1 1\r\n1\r\nPUB o.2 1\r\n2\r\nPUB o.3 1\r\n3\r\nPUB o.4 1\r\n4\r\n"),
        ]),
        with_auth(session("auth required before connect", &[b"PING\r\n"])),
        with_auth(session("auth sub before connect", &[b"SUB a 1\r\n"])),
        with_auth(session("auth no credentials", &[b"CONNECT {\"verbose\":false}\r\nPING\r\n"])),
        with_auth(session("auth wrong password", &[b"CONNECT {\"user\":\"alice\",\"pass\":\"nope\"}\r\n"])),
        with_auth(session("auth unknown user", &[b"CONNECT {\"user\":\"carol\",\"pass\":\"secret\"}\r\n"])),
        with_auth(session("auth ok verbose", &[b"CONNECT {\"user\":\"bob\",\"pass\":\"pw\"}\r\n", b"SUB a 1\r\nPUB a 0\r\n\r\n"])),
        with_auth(session("auth timeout", &[b"CONN"])),
        with_auth(session("permissions", &[
            b"CONNECT {\"verbose\":false,\"user\":\"alice\",\"pass\":\"secret\"}\r\n",
            b"PUB svc.secret 0\r\n\r\nPUB x 0\r\n\r\nSUB x 1\r\nSUB x q 2\r\nSUB svc.hidden.a 3\r\nSUB svc.* 4\r\nSUB svc.hidden.* 5\r\nSUB svc.> 6\r\nSUB > 7\r\nSUB * 8\r\n",
            b"PUB svc.hidden.a 1\r\nz\r\nPUB svc.ok 1\r\nk\r\nPUB svc.ok.deeper 1\r\nd\r\n",
        ])),
        with_auth(session("permissions verbose", &[
            b"CONNECT {\"user\":\"alice\",\"pass\":\"secret\"}\r\n",
            b"PUB svc.secret 0\r\n\r\nSUB x 1\r\nPUB svc.ok 0\r\n\r\n",
        ])),
    ]
}

#[derive(Debug, PartialEq, Eq)]
struct Transcript {
    ops: Vec<String>,
    closed: bool,
}

async fn run_session(addr: SocketAddr, session: &Session) -> Vec<Transcript> {
    let mut clients = Vec::new();
    for _ in 0..session.clients {
        clients.push(Raw::connect(addr).await);
    }
    for (client, bytes) in &session.steps {
        clients[*client].send(bytes).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // Give servers a moment to close connections on errors before the final PING, so a reset
    // caused by that PING cannot race with bytes still in flight.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut transcripts = Vec::new();
    for (index, raw) in clients.iter_mut().enumerate() {
        let pings_sent = session
            .steps
            .iter()
            .filter(|(client, _)| *client == index)
            .map(|(_, bytes)| count_pings(bytes))
            .sum::<usize>();
        let snapshot = raw.snapshot();
        let received = if snapshot.closed {
            snapshot
        } else {
            raw.send(b"PING\r\n").await;
            let wanted = pings_sent + 1;
            let bytes_bound = tokio::time::timeout(Duration::from_secs(5), async {
                raw.wait_for(|received| received.closed || count_pongs(&received.bytes) >= wanted)
                    .await
            })
            .await;
            match bytes_bound {
                Ok(received) => received,
                Err(_) => raw.snapshot(),
            }
        };
        transcripts.push(Transcript {
            ops: split_ops(&received.bytes),
            closed: received.closed,
        });
    }
    transcripts
}

fn count_pings(bytes: &[u8]) -> usize {
    bytes
        .split(|&byte| byte == b'\n')
        .filter(|line| line.len() >= 4 && line[..4].eq_ignore_ascii_case(b"PING"))
        .count()
}

fn count_pongs(bytes: &[u8]) -> usize {
    split_ops(bytes)
        .iter()
        .filter(|op| op.as_str() == "PONG")
        .count()
}

/// Splits server output into ops; MSG and HMSG keep their payload. INFO is reduced to the
/// compared fields, and inbox ids are masked.
fn split_ops(bytes: &[u8]) -> Vec<String> {
    let mut ops = Vec::new();
    let mut rest = bytes;
    while let Some(end) = rest.windows(2).position(|pair| pair == b"\r\n") {
        let line = String::from_utf8_lossy(&rest[..end]).into_owned();
        rest = &rest[end + 2..];
        let words: Vec<&str> = line.split_whitespace().collect();
        let payload_len = match words.first().copied() {
            Some("MSG") => words.last().and_then(|size| size.parse::<usize>().ok()),
            Some("HMSG") => words.last().and_then(|size| size.parse::<usize>().ok()),
            _ => None,
        };
        if let Some(length) = payload_len {
            let take = (length + 2).min(rest.len());
            let payload = String::from_utf8_lossy(&rest[..take]).into_owned();
            rest = &rest[take..];
            ops.push(mask_inboxes(&format!("{line}\r\n{payload}")));
        } else if let Some(json) = line.strip_prefix("INFO ") {
            ops.push(reduce_info(json));
        } else {
            ops.push(mask_inboxes(&line));
        }
    }
    if !rest.is_empty() {
        ops.push(format!("<partial {:?}>", String::from_utf8_lossy(rest)));
    }
    ops
}

fn reduce_info(json: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap_or_default();
    let field = |name: &str| value.get(name).cloned().unwrap_or(serde_json::Value::Null);
    let flag = |name: &str| value.get(name).and_then(|v| v.as_bool()).unwrap_or(false);
    format!(
        "INFO proto={} headers={} max_payload={} auth_required={} tls_required={}",
        field("proto"),
        field("headers"),
        field("max_payload"),
        flag("auth_required"),
        flag("tls_required"),
    )
}

fn mask_inboxes(text: &str) -> String {
    let mut masked = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("_INBOX.") {
        masked.push_str(&rest[..at + 7]);
        rest = &rest[at + 7..];
        let id_len = rest
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        masked.push_str("<id>");
        rest = &rest[id_len..];
    }
    masked.push_str(rest);
    masked
}

/// nats-server's path, or None after printing why the test is skipped (a failure in CI).
fn nats_server_or_skip() -> Option<PathBuf> {
    let binary = find_nats_server();
    if binary.is_none() {
        if std::env::var_os("CI").is_some() {
            panic!("nats-server not found (needed in CI for the differential test)");
        }
        println!(
            "skip: nats-server not found on PATH or in /usr/sbin (apt-get install nats-server); \
             differential test skipped"
        );
    }
    binary
}

/// The JSON type of every key, recursively (`a.b` for nested objects, `a[]` for the elements
/// of an array): what two servers must agree on when their values differ.
pub fn shape(value: &serde_json::Value) -> std::collections::BTreeMap<String, &'static str> {
    fn walk(
        value: &serde_json::Value,
        path: String,
        out: &mut std::collections::BTreeMap<String, &'static str>,
    ) {
        use serde_json::Value;
        let kind = match value {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            // Every element, merged: the union of their keys (order varies by server).
            Value::Array(items) => {
                for item in items {
                    walk(item, format!("{path}[]"), out);
                }
                "array"
            }
            Value::Object(map) => {
                for (key, child) in map {
                    let child_path = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{path}.{key}")
                    };
                    walk(child, child_path, out);
                }
                "object"
            }
        };
        if !path.is_empty() {
            out.insert(path, kind);
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(value, String::new(), &mut out);
    out
}

/// A JSON document's keys and their JSON types (see [`shape`]).
type Shape = std::collections::BTreeMap<String, &'static str>;

/// Keys of ours that nats-server does not send, each for a reason.
const OUR_EXTRA_INFO_KEYS: &[&str] = &[
    // Our own version, next to the NATS version we match.
    "svc_version",
];

async fn first_info(addr: SocketAddr) -> serde_json::Value {
    let (_raw, line) = Raw::connect_after_info(addr).await;
    serde_json::from_str(line.trim_start_matches("INFO ").trim_end()).unwrap()
}

/// A self-signed certificate for 127.0.0.1 made with the openssl CLI, or `None` without it.
fn self_signed_certificate(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?;
    status.success().then_some((cert, key))
}

fn rustls_config(cert: &Path, key: &Path) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    Arc::new(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_matches_nats_server() {
    let Some(binary) = nats_server_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut cases: Vec<(&str, NatsServer, svc::bus::BrokerHandle)> = vec![
        (
            "open",
            NatsServer::start(&binary, None).await,
            start_broker(BrokerConfig::default(), Arc::new(NoAuth)).await,
        ),
        (
            "user and password",
            NatsServer::start(&binary, Some(AUTH_CONFIG)).await,
            start_broker(BrokerConfig::default(), Arc::new(mirrored_auth())).await,
        ),
    ];
    match self_signed_certificate(dir.path()) {
        Some((cert, key)) => {
            let config = format!(
                "tls {{ cert_file: {:?}, key_file: {:?} }}\n",
                cert.display().to_string(),
                key.display().to_string()
            );
            let tls = BrokerConfig {
                tls: Some(rustls_config(&cert, &key)),
                ..BrokerConfig::default()
            };
            cases.push((
                "tls",
                NatsServer::start(&binary, Some(&config)).await,
                start_broker(tls, Arc::new(NoAuth)).await,
            ));
        }
        None => println!("note: no openssl CLI; the TLS INFO is not compared"),
    }
    let mut problems = Vec::new();
    for (name, reference, ours) in &cases {
        let expected = shape(&first_info(reference.addr).await);
        assert!(
            expected.contains_key("go") && expected.contains_key("client_ip"),
            "{name}: nats-server's INFO not read: {expected:?}"
        );
        let mut actual = shape(&first_info(ours.local_addr()).await);
        for extra in OUR_EXTRA_INFO_KEYS {
            actual.remove(*extra);
        }
        if expected != actual {
            problems.push(format!(
                "{name}:\n  nats-server: {expected:?}\n  ours:        {actual:?}"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "INFO differs:\n{}",
        problems.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_sessions_match_nats_server() {
    let Some(binary) = nats_server_or_skip() else {
        return;
    };
    let reference_open = NatsServer::start(&binary, None).await;
    let reference_auth = NatsServer::start(&binary, Some(AUTH_CONFIG)).await;
    let ours_open = start_broker(BrokerConfig::default(), Arc::new(NoAuth)).await;
    let ours_auth = start_broker(BrokerConfig::default(), Arc::new(mirrored_auth())).await;

    let mut mismatches = Vec::new();
    let sessions = sessions();
    for session in &sessions {
        let (reference_addr, our_addr) = if session.with_auth {
            (reference_auth.addr, ours_auth.local_addr())
        } else {
            (reference_open.addr, ours_open.local_addr())
        };
        let (expected, actual) = tokio::join!(
            run_session(reference_addr, session),
            run_session(our_addr, session)
        );
        if expected != actual {
            mismatches.push(format!(
                "session {:?}:\n  nats-server: {expected:?}\n  ours:        {actual:?}",
                session.name
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} sessions differ:\n{}",
        mismatches.len(),
        sessions.len(),
        mismatches.join("\n")
    );
}

/// GET `path` (blocking, on the blocking pool); the status and the JSON body.
async fn get_json(addr: SocketAddr, path: &str, key: Option<&str>) -> (u16, serde_json::Value) {
    let path = path.to_string();
    let header = key.map(|key| format!("Bearer {key}"));
    tokio::task::spawn_blocking(move || {
        let headers: Vec<(&str, &str)> = header
            .iter()
            .map(|value| ("Authorization", value.as_str()))
            .collect();
        let response = common::http_request(addr, "GET", &path, &headers, None).unwrap();
        let json = serde_json::from_str(&response.body)
            .unwrap_or_else(|e| panic!("GET {path}: {e}: {}", response.body));
        (response.status, json)
    })
    .await
    .unwrap()
}

/// One side of the monitoring comparison: where its bus and monitoring listen, the token a
/// client presents, and the traffic client.
struct Side {
    name: &'static str,
    monitor: SocketAddr,
    client: async_nats::Client,
}

impl Side {
    async fn connect(name: &'static str, bus: &str, monitor: SocketAddr, token: &str) -> Side {
        let client = async_nats::ConnectOptions::with_token(token.to_string())
            .name("differential")
            .connect(bus)
            .await
            .unwrap_or_else(|e| panic!("{name}: connect to {bus}: {e}"));
        Side {
            name,
            monitor,
            client,
        }
    }

    async fn varz(&self) -> serde_json::Value {
        get_json(self.monitor, "/varz", None).await.1
    }

    /// Subscribes (a wildcard and a queue group), publishes `count` messages of `size`
    /// bytes that reach the wildcard only, and receives them all: both servers count a
    /// message before delivering it, so the counters are then current (async-nats' flush
    /// only writes the socket; it does not wait for the server).
    async fn traffic(&self, count: usize, size: usize) -> [async_nats::Subscriber; 2] {
        use futures_util::StreamExt;
        let wildcard = self.client.subscribe("diff.>").await.unwrap();
        let queue = self
            .client
            .queue_subscribe("diff.q", "workers".into())
            .await
            .unwrap();
        self.client.flush().await.unwrap();
        for _ in 0..count {
            self.client
                .publish("diff.a", vec![b'x'; size].into())
                .await
                .unwrap();
        }
        self.client.flush().await.unwrap();
        let mut wildcard = wildcard;
        for _ in 0..count {
            tokio::time::timeout(bus_support::PATIENCE, wildcard.next())
                .await
                .expect("published messages arrive")
                .expect("subscription open");
        }
        [wildcard, queue]
    }
}

fn counter(value: &serde_json::Value, key: &str) -> u64 {
    value[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing or not a count: {value}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitoring_matches_nats_server() {
    let Some(binary) = nats_server_or_skip() else {
        return;
    };
    let monitor_port = free_port();
    let reference = NatsServer::start_with(
        &binary,
        Some(MONITORED_CONFIG),
        &["-m", &monitor_port.to_string()],
    )
    .await;
    let reference_monitor: SocketAddr = format!("127.0.0.1:{monitor_port}").parse().unwrap();
    let ours = tokio::task::spawn_blocking(common::TestServer::start)
        .await
        .unwrap();
    let our_monitor = ours
        .bus_monitor
        .expect("listen-addrs.json names bus_monitor");
    let sides = [
        Side::connect(
            "nats-server",
            &format!("nats://{}", reference.addr),
            reference_monitor,
            "s3cret-token",
        )
        .await,
        Side::connect("svc", &ours.bus, our_monitor, &ours.admin_key).await,
    ];

    // Counters: exact deltas for the same traffic on both.
    const COUNT: usize = 25;
    const SIZE: usize = 100;
    let mut subscribers = Vec::new();
    for side in &sides {
        let before = side.varz().await;
        subscribers.push(side.traffic(COUNT, SIZE).await);
        let after = side.varz().await;
        for (key, expected) in [
            ("in_msgs", COUNT),
            ("out_msgs", COUNT),
            ("in_bytes", COUNT * SIZE),
            ("out_bytes", COUNT * SIZE),
        ] {
            assert_eq!(
                counter(&after, key) - counter(&before, key),
                expected as u64,
                "{}: /varz {key}",
                side.name
            );
        }
        let cid = side.client.server_info().client_id;
        let (_, connz) = get_json(side.monitor, &format!("/connz?cid={cid}"), None).await;
        let connection = &connz["connections"][0];
        for (key, expected) in [
            ("in_msgs", COUNT),
            ("out_msgs", COUNT),
            ("in_bytes", COUNT * SIZE),
            ("out_bytes", COUNT * SIZE),
            ("subscriptions", 2),
        ] {
            assert_eq!(
                counter(connection, key),
                expected as u64,
                "{}: /connz {key}: {connz}",
                side.name
            );
        }
        assert_eq!(connection["name"], "differential", "{}", side.name);
    }

    // Shapes: every endpoint, the connection entries filtered to the traffic client.
    let mut problems = Vec::new();
    let mut shapes: Vec<Vec<(String, u16, Shape)>> = Vec::new();
    for side in &sides {
        let cid = side.client.server_info().client_id;
        let paths = [
            "/varz".to_string(),
            format!("/connz?cid={cid}"),
            format!("/connz?cid={cid}&subs=1"),
            format!("/connz?cid={cid}&subs=detail"),
            format!("/connz?cid={cid}&auth=1"),
            "/connz?sort=msgs_from&limit=1".to_string(),
            "/subsz".to_string(),
            "/subsz?subs=1&test=diff.q".to_string(),
            "/healthz".to_string(),
            "/routez".to_string(),
            "/jsz".to_string(),
        ];
        let mut side_shapes = Vec::new();
        for path in paths {
            let (status, json) = get_json(side.monitor, &path, None).await;
            let path = path.replace(&format!("cid={cid}"), "cid=<ours>");
            side_shapes.push((path, status, shape(&json)));
        }
        shapes.push(side_shapes);
    }
    assert!(shapes[0][0].2.len() > 40, "/varz read: {:?}", shapes[0][0]);
    for (expected, actual) in shapes[0].iter().zip(&shapes[1]) {
        if expected != actual {
            let (path, _, _) = expected;
            problems.push(format!(
                "{path}:\n  nats-server: {:?}\n  svc:         {:?}",
                (expected.1, &expected.2),
                (actual.1, &actual.2)
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "monitoring differs from nats-server:\n{}",
        problems.join("\n")
    );
    drop(subscribers);
}
