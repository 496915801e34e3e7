//! The file service through the real `svc-files` CLI against a real server (issue 15):
//! round trips (multi-chunk, empty, stdin/stdout, kv), list/stat/delete, clusters, the role
//! rules, refusals without credentials, a corrupted chunk caught on get, a put resumed after
//! an interruption, and a stock NATS client (nats-py) that cannot read another cluster.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{audit_rows, json_of, run, Options, Run, TestServer};
use sha2::{Digest, Sha256};

const CHUNK: usize = 256 * 1024;

fn files(server: &TestServer, key: Option<&str>, args: &[&str]) -> Run {
    let mut command = server.cli("svc-files");
    command.env("SVC_NATS_URL", &server.bus).args(args);
    if let Some(key) = key {
        command.env("SVC_API_KEY", key);
    }
    run(&mut command)
}

/// Bytes that differ chunk to chunk (so no chunk is deduplicated by accident).
fn content(length: usize, seed: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(length);
    let mut state = seed as u64 + 1;
    while out.len() < length {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(length);
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn round_trips_list_stat_delete_and_the_audit_rows() {
    let server = TestServer::start();
    let (_, operator) = server.create_key("uploader", "operator");
    let key = Some(operator.as_str());
    let dir = tempfile::tempdir().unwrap();

    // Several chunks and a short last one.
    let big = content(4 * CHUNK + 12345, 1);
    let local = write(dir.path(), "big.bin", &big);
    let put = files(
        &server,
        key,
        &[
            "put",
            s(&local),
            "data/big.bin",
            "-o",
            "json",
            "--principal-id",
            "alice",
        ],
    );
    assert_eq!(put.code, 0, "{put:?}");
    let summary = json_of(&put);
    assert_eq!(summary["chunks"], 5, "{summary}");
    assert_eq!(summary["chunks_sent"], 5, "{summary}");
    assert_eq!(summary["sha256"], hex::encode(Sha256::digest(&big)));
    let back = dir.path().join("back.bin");
    let get = files(&server, key, &["get", "data/big.bin", s(&back)]);
    assert_eq!(get.code, 0, "{get:?}");
    assert!(std::fs::read(&back).unwrap() == big, "bytes differ");

    // Empty file.
    let empty = write(dir.path(), "empty", b"");
    assert_eq!(files(&server, key, &["put", s(&empty), "empty"]).code, 0);
    let empty_back = dir.path().join("empty.back");
    let got = files(&server, key, &["get", "empty", s(&empty_back)]);
    assert_eq!(got.code, 0, "{got:?}");
    assert_eq!(std::fs::read(&empty_back).unwrap().len(), 0);

    // stdin to stdout, and a kv value.
    let small = content(70_000, 2);
    for remote in ["from-stdin", "kv://config/app/url"] {
        let mut child = server
            .cli("svc-files")
            .env("SVC_NATS_URL", &server.bus)
            .env("SVC_API_KEY", &operator)
            .args(["put", "-", remote])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&small).unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{:?}", Run::from(output));
        let out = server
            .cli("svc-files")
            .env("SVC_NATS_URL", &server.bus)
            .env("SVC_API_KEY", &operator)
            .args(["get", remote, "-"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{:?}", Run::from(out.clone()));
        assert!(out.stdout == small, "{remote}: stdout differs");
    }
    // A kv value over 1 MiB names the limit.
    let too_big = write(dir.path(), "too-big", &content(1024 * 1024 + 1, 3));
    let refused = files(&server, key, &["put", s(&too_big), "kv://config/big"]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stderr.contains("kv value limit"), "{refused:?}");

    // list and stat.
    let listed = files(&server, key, &["list", "-o", "json"]);
    assert_eq!(listed.code, 0, "{listed:?}");
    let paths: Vec<String> = json_of(&listed)
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        paths,
        ["data/big.bin", "empty", "from-stdin", "kv://config/app/url"]
    );
    let prefixed = files(&server, key, &["list", "data/", "-o", "json"]);
    assert_eq!(json_of(&prefixed).as_array().unwrap().len(), 1);
    let table = files(&server, key, &["list"]);
    assert!(table.stdout.starts_with("PATH"), "{table:?}");
    let stat = files(&server, key, &["stat", "data/big.bin", "-o", "json"]);
    assert_eq!(stat.code, 0, "{stat:?}");
    let meta = json_of(&stat);
    assert_eq!(meta["size"], big.len() as u64);
    assert_eq!(meta["chunk_size"], CHUNK as u64);
    assert_eq!(meta["writer"]["principal_id"], "alice");
    assert_eq!(meta["writer"]["key_name"], "uploader");
    assert!(
        meta["created_at"].as_str().unwrap().ends_with('Z'),
        "{meta}"
    );

    // delete, then the path is gone (exit 5) and a get leaves no file behind.
    let deleted = files(&server, key, &["delete", "data/big.bin"]);
    assert_eq!(deleted.code, 0, "{deleted:?}");
    assert_eq!(files(&server, key, &["stat", "data/big.bin"]).code, 5);
    let missing = dir.path().join("missing");
    let get = files(&server, key, &["get", "data/big.bin", s(&missing)]);
    assert_eq!(get.code, 5, "{get:?}");
    assert!(get.stderr.starts_with("svc-files: "), "{get:?}");
    assert!(!missing.exists());
    assert_eq!(files(&server, key, &["delete", "data/big.bin"]).code, 5);

    // Every put and delete has its audit row, with the declared principal.
    let rows = audit_rows(&server, &["--action", "file.put"]);
    let big_put = rows
        .iter()
        .find(|r| r["resource_id"] == "default:data/big.bin")
        .unwrap_or_else(|| panic!("{rows:?}"));
    assert_eq!(big_put["outcome"], "success");
    assert_eq!(big_put["detail"]["principal_id"], "alice");
    let rows = audit_rows(&server, &["--action", "file.delete"]);
    assert!(rows.iter().any(|r| r["outcome"] == "success"), "{rows:?}");
}

#[test]
fn clusters_roles_and_credentials() {
    let server = TestServer::start();
    let (_, operator) = server.create_key("ops", "operator");
    let (_, readonly) = server.create_key("viewer", "readonly");
    let dir = tempfile::tempdir().unwrap();
    let local = write(dir.path(), "f", &content(1000, 4));

    // Separate clusters.
    let put_a = files(
        &server,
        Some(&operator),
        &["--cluster", "a", "put", s(&local), "shared/f"],
    );
    assert_eq!(put_a.code, 0, "{put_a:?}");
    let list_b = files(
        &server,
        Some(&operator),
        &["list", "--cluster", "b", "-o", "json"],
    );
    assert_eq!(list_b.code, 0, "{list_b:?}");
    assert_eq!(json_of(&list_b), serde_json::json!([]));
    let mut in_b = server.cli("svc-files");
    in_b.env("SVC_NATS_URL", &server.bus)
        .env("SVC_API_KEY", &operator)
        .env("SVC_CLUSTER", "b")
        .args(["stat", "shared/f"]);
    assert_eq!(run(&mut in_b).code, 5);

    // readonly: get, list, stat; not put or delete (exit 4).
    let back = dir.path().join("back");
    let get = files(
        &server,
        Some(&readonly),
        &["get", "--cluster", "a", "shared/f", s(&back)],
    );
    assert_eq!(get.code, 0, "{get:?}");
    assert_eq!(
        files(
            &server,
            Some(&readonly),
            &["stat", "--cluster", "a", "shared/f"]
        )
        .code,
        0
    );
    for args in [
        &["put", s(&local), "x"][..],
        &["delete", "--cluster", "a", "shared/f"][..],
    ] {
        let refused = files(&server, Some(&readonly), args);
        assert_eq!(refused.code, 4, "{args:?}: {refused:?}");
    }
    // A declared role above the key's is refused; a lower one lowers it.
    let escalate = files(
        &server,
        Some(&readonly),
        &["list", "--principal-role", "admin", "--cluster", "a"],
    );
    assert_eq!(escalate.code, 4, "{escalate:?}");
    assert!(
        escalate.stderr.contains("higher than the API key's"),
        "{escalate:?}"
    );
    let lowered = files(
        &server,
        Some(&operator),
        &["put", s(&local), "y", "--principal-role", "readonly"],
    );
    assert_eq!(lowered.code, 4, "{lowered:?}");
    let denied = audit_rows(&server, &["--action", "file.put"]);
    assert!(
        denied.iter().any(|r| r["outcome"] == "denied"),
        "{denied:?}"
    );

    // No credentials: the CLI will not try, and the broker refuses a bare client.
    let none = files(&server, None, &["list"]);
    assert_eq!(none.code, 4, "{none:?}");
    let lines = common::bus_session(
        &server,
        r#"{"verbose":false,"pedantic":false,"headers":true}"#,
        "PUB svc.files.a.list _INBOX.abcdefghijklmnopqrstuv.1 2\r\n{}\r\n",
    );
    assert!(
        lines.contains(
            &"-ERR 'Permissions Violation for Publish to \"svc.files.a.list\"'".to_string()
        ),
        "{lines:?}"
    );
    // A deleted key fails its next request.
    let (gone_id, gone) = server.create_key("gone", "operator");
    assert_eq!(files(&server, Some(&gone), &["list"]).code, 0);
    let deleted = server.request(
        "DELETE",
        &format!("/api/v1/apikeys/{gone_id}"),
        Some(&server.admin_key),
        None,
    );
    assert_eq!(deleted.status, 204, "{deleted:?}");
    assert_eq!(files(&server, Some(&gone), &["list"]).code, 4);
    // A wrong key, an unreachable bus.
    let wrong = files(
        &server,
        Some("svc_0000000000000000000000000000000000000000"),
        &["list"],
    );
    assert_eq!(wrong.code, 4, "{wrong:?}");
    let mut unreachable = server.cli("svc-files");
    unreachable
        .env("SVC_API_KEY", &operator)
        .args(["list", "--nats-url", "nats://127.0.0.1:1"]);
    assert_eq!(run(&mut unreachable).code, 3);
}

#[test]
fn limits_from_the_config_are_named_when_exceeded() {
    let server = TestServer::start_with(Options {
        config_yaml: "files:\n  max_object_size: 3000\n  cluster_quota: 5000\n".into(),
        ..Options::default()
    });
    let (_, operator) = server.create_key("ops", "operator");
    let key = Some(operator.as_str());
    let dir = tempfile::tempdir().unwrap();
    let too_big = write(dir.path(), "big", &content(3001, 7));
    let refused = files(&server, key, &["put", s(&too_big), "big"]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(
        refused
            .stderr
            .contains("files.max_object_size (3000 bytes)"),
        "{refused:?}"
    );
    let fits = write(dir.path(), "fits", &content(3000, 8));
    assert_eq!(files(&server, key, &["put", s(&fits), "one"]).code, 0);
    let over = files(&server, key, &["put", s(&fits), "two"]);
    assert_eq!(over.code, 1, "{over:?}");
    assert!(
        over.stderr.contains("files.cluster_quota (5000 bytes)"),
        "{over:?}"
    );
    // Replacing an object counts its new size, not both.
    assert_eq!(files(&server, key, &["put", s(&fits), "one"]).code, 0);
    // Another cluster has its own quota.
    assert_eq!(
        files(&server, key, &["put", s(&fits), "two", "--cluster", "c2"]).code,
        0
    );
}

/// Chunks are sized from the bus's max_payload (nats.py's test servers run 1 KiB): on such a
/// bus a multi-chunk file goes and comes back, its chunk list in pages and committed as
/// chunks; and an object put with the default 256 KiB chunks is still read (in pieces) once
/// max_payload is 1 KiB, as the small-chunk one is once it is back to the default.
#[test]
fn chunks_fit_a_small_max_payload_and_stored_objects_outlive_a_change() {
    let mut server = TestServer::start();
    let (_, operator) = server.create_key("ops", "operator");
    let key = Some(operator.as_str());
    let dir = tempfile::tempdir().unwrap();
    let large_chunks = content(CHUNK + 3000, 11);
    let local = write(dir.path(), "large", &large_chunks);
    assert_eq!(files(&server, key, &["put", s(&local), "large"]).code, 0);

    assert_eq!(server.stop_with(libc::SIGTERM), Some(0), "{}", server.log());
    let small_bus = [("SVC_BUS__MAX_PAYLOAD".to_string(), "1024".to_string())];
    server.spawn(&small_bus);
    // 80 chunks of 512 bytes: the list (2560 bytes) is five pages of a 1 KiB message.
    let small_chunks = content(80 * 512 - 100, 12);
    let local = write(dir.path(), "small", &small_chunks);
    let put = files(&server, key, &["put", s(&local), "small", "-o", "json"]);
    assert_eq!(put.code, 0, "{put:?}\n{}", server.log());
    assert_eq!(json_of(&put)["chunks"], 80, "{put:?}");
    let stat = files(&server, key, &["stat", "small", "-o", "json"]);
    assert_eq!(stat.code, 0, "{stat:?}\n{}", server.log());
    assert_eq!(json_of(&stat)["chunk_size"], 512, "{stat:?}");
    // Each object's record is a third of a message: the list comes in pages.
    for n in 0..3 {
        let path = format!("more/{n}");
        assert_eq!(files(&server, key, &["put", s(&local), &path]).code, 0);
    }
    let list = files(&server, key, &["list", "-o", "json"]);
    assert_eq!(list.code, 0, "{list:?}");
    let paths: Vec<String> = json_of(&list)
        .as_array()
        .unwrap()
        .iter()
        .map(|object| object["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(paths, ["large", "more/0", "more/1", "more/2", "small"]);
    for (remote, bytes) in [("small", &small_chunks), ("large", &large_chunks)] {
        let back = dir.path().join(format!("{remote}.back"));
        let get = files(&server, key, &["get", remote, s(&back)]);
        assert_eq!(get.code, 0, "{remote}: {get:?}\n{}", server.log());
        assert!(
            std::fs::read(&back).unwrap() == *bytes,
            "{remote}: bytes differ"
        );
    }
    // Put again, nothing is sent: the chunk list pages find every chunk there.
    let again = files(&server, key, &["put", s(&local), "small", "-o", "json"]);
    assert_eq!(json_of(&again)["chunks_sent"], 0, "{again:?}");

    assert_eq!(server.stop_with(libc::SIGTERM), Some(0), "{}", server.log());
    server.spawn(&[]);
    let back = dir.path().join("small.default");
    let get = files(&server, key, &["get", "small", s(&back)]);
    assert_eq!(get.code, 0, "{get:?}");
    assert!(
        std::fs::read(&back).unwrap() == small_chunks,
        "bytes differ"
    );
}

#[test]
fn a_corrupted_chunk_is_caught_on_get_and_leaves_no_file() {
    let server = TestServer::start();
    let (_, operator) = server.create_key("ops", "operator");
    let dir = tempfile::tempdir().unwrap();
    let bytes = content(3 * CHUNK, 5);
    let local = write(dir.path(), "f", &bytes);
    assert_eq!(
        files(&server, Some(&operator), &["put", s(&local), "f"]).code,
        0
    );

    // Flip one byte of the second chunk on disk.
    let second = hex::encode(Sha256::digest(&bytes[CHUNK..2 * CHUNK]));
    let chunk_file = server
        .data_dir
        .join("files/default/chunks")
        .join(&second[..2])
        .join(&second);
    let mut stored = std::fs::read(&chunk_file).unwrap();
    stored[100] ^= 0xff;
    std::fs::write(&chunk_file, stored).unwrap();

    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("out");
    let get = files(&server, Some(&operator), &["get", "f", s(&target)]);
    assert_eq!(get.code, 1, "{get:?}");
    assert!(get.stderr.contains("SHA-256 mismatch"), "{get:?}");
    let left: Vec<_> = std::fs::read_dir(out_dir.path()).unwrap().collect();
    assert!(left.is_empty(), "no partial file: {left:?}");
}

/// An upload cut off after two of five chunks (the client went away): nothing is listed,
/// and the next put sends only the three chunks the server lacks.
#[test]
fn an_interrupted_put_resumes_with_only_the_missing_chunks() {
    let server = TestServer::start();
    let (_, operator) = server.create_key("ops", "operator");
    let dir = tempfile::tempdir().unwrap();
    let bytes = content(4 * CHUNK + 1, 6);
    let local = write(dir.path(), "f", &bytes);
    let hashes: Vec<[u8; 32]> = bytes
        .chunks(CHUNK)
        .map(|chunk| Sha256::digest(chunk).into())
        .collect();
    assert_eq!(hashes.len(), 5);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = async_nats::ConnectOptions::with_token(operator.clone())
            .connect(server.bus.as_str())
            .await
            .unwrap();
        let manifest = serde_json::json!({
            "path": "resumed", "size": bytes.len(),
            "sha256": hex::encode(Sha256::digest(&bytes)), "chunk_size": CHUNK,
        })
        .to_string();
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Svc-Manifest", manifest.as_str());
        let begun = client
            .request_with_headers("svc.files.default.put", headers, hashes.concat().into())
            .await
            .unwrap();
        let missing: serde_json::Value = serde_json::from_slice(&begun.payload).unwrap();
        assert_eq!(missing["missing"], serde_json::json!([0, 1, 2, 3, 4]));
        for index in 0..2 {
            let mut headers = async_nats::HeaderMap::new();
            let hash = hex::encode(hashes[index]);
            headers.insert("Svc-Chunk", hash.as_str());
            let chunk = bytes[index * CHUNK..(index + 1) * CHUNK].to_vec();
            let reply = client
                .request_with_headers("svc.files.default.chunk", headers, chunk.into())
                .await
                .unwrap();
            assert!(reply.headers.is_none_or(|h| h.get("Svc-Error").is_none()));
        }
        // No commit: the client is gone.
    });

    let listed = files(&server, Some(&operator), &["list", "-o", "json"]);
    assert_eq!(json_of(&listed), serde_json::json!([]), "nothing listed");
    let put = files(
        &server,
        Some(&operator),
        &["put", s(&local), "resumed", "-o", "json"],
    );
    assert_eq!(put.code, 0, "{put:?}");
    let summary = json_of(&put);
    assert_eq!(summary["chunks"], 5, "{summary}");
    assert_eq!(
        summary["chunks_sent"], 3,
        "only the missing chunks: {summary}"
    );
    let back = dir.path().join("back");
    assert_eq!(
        files(&server, Some(&operator), &["get", "resumed", s(&back)]).code,
        0
    );
    assert!(std::fs::read(&back).unwrap() == bytes);
}

/// A readonly key limited to cluster `a` (files.key_clusters) cannot read cluster `b`'s
/// objects with a stock client: not by asking, not by overhearing requests or replies.
#[test]
fn nats_py_readonly_key_cannot_read_another_cluster() {
    let probe = Command::new("python3").args(["-c", "import nats"]).output();
    if !probe.map(|o| o.status.success()).unwrap_or(false) {
        eprintln!("skipped: python3 with nats-py is not installed (pip install nats-py)");
        return;
    }
    let server = TestServer::start_with(Options {
        config_yaml: "files:\n  key_clusters:\n    reader-a: [a]\n".into(),
        ..Options::default()
    });
    let (_, operator) = server.create_key("ops", "operator");
    let (_, reader) = server.create_key("reader-a", "readonly");
    let dir = tempfile::tempdir().unwrap();
    let secret = b"cluster b's secret contents".repeat(100);
    let local = write(dir.path(), "f", &secret);
    for cluster in ["a", "b"] {
        let put = files(
            &server,
            Some(&operator),
            &["put", "--cluster", cluster, s(&local), "f"],
        );
        assert_eq!(put.code, 0, "{put:?}");
    }
    // The CLI: cluster a yes, cluster b no.
    assert_eq!(
        files(&server, Some(&reader), &["stat", "--cluster", "a", "f"]).code,
        0
    );
    let refused = files(&server, Some(&reader), &["stat", "--cluster", "b", "f"]);
    assert_eq!(refused.code, 4, "{refused:?}");

    let script = r#"
import asyncio, json, sys
import nats

async def main(url, reader):
    errors = []
    async def on_error(e):
        errors.append(str(e))
    nc = await nats.connect(url, token=reader, error_cb=on_error, allow_reconnect=False)
    # Asking: refused by the file service.
    reply = await nc.request("svc.files.b.get", json.dumps({"path": "f"}).encode(), timeout=5)
    print("get", (reply.headers or {}).get("Svc-Error"), len(reply.data))
    # Overhearing requests or other clients' replies: refused by the broker.
    seen = []
    async def heard(msg):
        seen.append(msg.subject)
    for subject in ["svc.files.>", "svc.files.b.read", "_INBOX.>"]:
        errors.clear()
        await nc.subscribe(subject, cb=heard)
        await nc.flush()
        for _ in range(30):
            if errors:
                break
            await asyncio.sleep(0.1)
        print("sub", subject, "|".join(errors))
    print("ready", flush=True)
    await asyncio.sleep(float(sys.argv[3]))
    print("seen", len(seen))
    await nc.close()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"#;
    let mut child = Command::new("python3")
        .args(["-c", script, &server.bus, &reader, "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once it listens, the operator reads cluster b.
    let mut reader_out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut head = String::new();
    loop {
        use std::io::BufRead;
        let mut line = String::new();
        if reader_out.read_line(&mut line).unwrap() == 0 || line.starts_with("ready") {
            break;
        }
        head.push_str(&line);
    }
    let back = dir.path().join("back");
    let get = files(
        &server,
        Some(&operator),
        &["get", "--cluster", "b", "f", s(&back)],
    );
    assert_eq!(get.code, 0, "{get:?}");
    let mut tail = String::new();
    std::io::Read::read_to_string(&mut reader_out, &mut tail).unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = format!("{head}{tail}").to_lowercase();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("get permission_denied"), "{stdout}");
    for subject in ["svc.files.>", "svc.files.b.read", "_inbox.>"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("sub {subject} ")))
            .unwrap_or_default();
        assert!(
            line.contains("permissions violation for subscription"),
            "{subject}: {stdout}"
        );
    }
    assert!(stdout.contains("seen 0"), "{stdout}");
}
