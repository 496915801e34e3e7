//! The file service in cluster mode (issue 15, docs/files.md): two svc-server members on one
//! PostgreSQL and a three-node NATS cluster with JetStream, objects in the `SVC_FILES` stream,
//! callers known by their request signatures (`Svc-Auth`). Through the real `svc-files` CLI:
//! a multi-chunk put through one member read back through the other, kv values, a resumed
//! put, delete, the role and cluster rules; with raw and stock (nats-py) clients: requests
//! without a signature, with a wrong key, a stale time, a replayed signature and a deleted key
//! are refused.
//!
//! One cluster for the whole binary (one test): starting three nats-servers and two members
//! is most of its time. Skipped with a message where PostgreSQL or nats-server is missing
//! (required under CI).

mod common;

use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use common::cluster::{self, Setup};
use common::nats_cluster::NatsCluster;
use common::{json_of, run, Run, TestServer};
use sha2::{Digest, Sha256};
use svc::files::signature;

const CHUNK: usize = 256 * 1024;

fn files(server: &TestServer, url: &str, key: &str, args: &[&str]) -> Run {
    let mut command = server.cli("svc-files");
    command
        .env("SVC_NATS_URL", url)
        .env("SVC_API_KEY", key)
        .args(args);
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

/// How a raw request is signed.
#[derive(Clone, Copy)]
enum Sign<'a> {
    None,
    /// With this API key, this many seconds off the clock.
    Key(&'a str, i64),
    /// Signed for another reply subject than the one it is sent with (a replay elsewhere).
    OtherReply(&'a str),
    /// With this HMAC key itself (e.g. one read out of the database).
    Raw([u8; 32]),
}

/// One request on `subject`, signed as `sign` says; the reply's `Svc-Error` (None: success)
/// and body.
async fn raw(
    client: &async_nats::Client,
    sign: Sign<'_>,
    subject: &str,
    mut headers: async_nats::HeaderMap,
    body: Vec<u8>,
) -> (Option<String>, Bytes) {
    let inbox = client.new_inbox();
    let mut replies = {
        use futures_util::StreamExt;
        let subscription = client.subscribe(inbox.clone()).await.unwrap();
        subscription.take(1)
    };
    let values = signature::SIGNED_HEADERS.map(|name| headers.get(name).map_or("", |v| v.as_str()));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let (key, offset, reply) = match sign {
        Sign::None => (None, 0, inbox.clone()),
        Sign::Key(key, offset) => (Some(signature::signing_key(key)), offset, inbox.clone()),
        Sign::OtherReply(key) => (Some(signature::signing_key(key)), 0, format!("{inbox}x")),
        Sign::Raw(key) => (Some(key), 0, inbox.clone()),
    };
    if let Some(key) = key {
        let request = signature::Request {
            subject,
            reply: &reply,
            headers: values,
            payload: &body,
        };
        let value = signature::sign(&key, &request, now + offset, &signature::nonce());
        headers.insert(signature::AUTH_HEADER, value.as_str());
    }
    client
        .publish_with_reply_and_headers(subject.to_string(), inbox, headers, body.into())
        .await
        .unwrap();
    client.flush().await.unwrap();
    let message = tokio::time::timeout(Duration::from_secs(30), async {
        use futures_util::StreamExt;
        replies.next().await
    })
    .await
    .expect("an answer within 30 s")
    .expect("a reply");
    let error = message
        .headers
        .as_ref()
        .and_then(|h| h.get("Svc-Error"))
        .map(|v| v.as_str().to_string());
    (error, message.payload)
}

/// One request signed once with `key` and sent `times` times (the same bytes, the same
/// inbox, as a replay would): each answer's `Svc-Error` (None: success), in order.
async fn replayed(
    client: &async_nats::Client,
    key: &str,
    subject: &str,
    body: Vec<u8>,
    times: usize,
) -> Vec<Option<String>> {
    use futures_util::StreamExt;
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await.unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let request = signature::Request {
        subject,
        reply: &inbox,
        headers: ["", "", "", ""],
        payload: &body,
    };
    let value = signature::sign(
        &signature::signing_key(key),
        &request,
        now,
        &signature::nonce(),
    );
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(signature::AUTH_HEADER, value.as_str());
    let mut errors = Vec::new();
    for _ in 0..times {
        client
            .publish_with_reply_and_headers(
                subject.to_string(),
                inbox.clone(),
                headers.clone(),
                body.clone().into(),
            )
            .await
            .unwrap();
        // One at a time, so the first to arrive is the original.
        let message = tokio::time::timeout(Duration::from_secs(30), replies.next())
            .await
            .expect("an answer within 30 s")
            .expect("a reply");
        errors.push(
            message
                .headers
                .as_ref()
                .and_then(|h| h.get("Svc-Error"))
                .map(|v| v.as_str().to_string()),
        );
    }
    errors
}

fn path_body(path: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "path": path })).unwrap()
}

#[test]
fn files_across_members_with_signed_requests() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let Some(nats) = runtime.block_on(NatsCluster::start(3)) else {
        return;
    };
    let urls = nats.urls();
    let rotated = |first: usize| {
        let mut urls = urls.clone();
        urls.rotate_left(first);
        urls
    };
    let Some(members) = cluster::start(Setup {
        nats_urls: vec![rotated(0), rotated(1)],
        cluster_yaml: "",
        extra_yaml: "files:\n  key_clusters:\n    reader-a: [a]\n",
        bus_yaml: "",
        prepared: None,
    }) else {
        return;
    };
    let (a, b) = (&members.servers[0], &members.servers[1]);
    let (url_a, url_b) = (urls[0].as_str(), urls[1].as_str());
    let (_, operator) = a.create_key("ops", "operator");
    let (_, readonly) = a.create_key("reader", "readonly");
    let (_, reader_a) = a.create_key("reader-a", "readonly");
    let dir = tempfile::tempdir().unwrap();

    // A multi-chunk file through member A, read back through member B.
    let bytes = content(3 * CHUNK + 123, 1);
    let local = dir.path().join("f");
    std::fs::write(&local, &bytes).unwrap();
    let local = local.to_str().unwrap();
    let put = files(a, url_a, &operator, &["put", local, "dir/f", "-o", "json"]);
    assert_eq!(put.code, 0, "{put:?}\n{}", a.log());
    assert_eq!(json_of(&put)["chunks"], 4, "{put:?}");
    let back = dir.path().join("back");
    let back = back.to_str().unwrap();
    let get = files(b, url_b, &readonly, &["get", "dir/f", back]);
    assert_eq!(get.code, 0, "{get:?}\n{}", b.log());
    assert!(std::fs::read(back).unwrap() == bytes, "bytes differ");
    let stat = json_of(&files(
        b,
        url_b,
        &readonly,
        &["stat", "dir/f", "-o", "json"],
    ));
    assert_eq!(stat["size"], bytes.len());
    assert_eq!(stat["sha256"], hex::encode(Sha256::digest(&bytes)));
    assert_eq!(stat["writer"]["key_name"], "ops");
    let listed = json_of(&files(b, url_b, &readonly, &["list", "dir/", "-o", "json"]));
    let paths: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["dir/f"]);

    // A kv value through B, read through A (stdout).
    let value = dir.path().join("v");
    std::fs::write(&value, b"postgres://db/1").unwrap();
    let put = files(
        b,
        url_b,
        &operator,
        &["put", value.to_str().unwrap(), "kv://cfg/db"],
    );
    assert_eq!(put.code, 0, "{put:?}");
    let got = files(a, url_a, &readonly, &["get", "kv://cfg/db", "-"]);
    assert_eq!((got.code, got.stdout.as_str()), (0, "postgres://db/1"));

    // Roles: readonly cannot put or delete; a declared role above the key's is refused.
    let refused = files(a, url_a, &readonly, &["put", local, "nope"]);
    assert_eq!(refused.code, 4, "{refused:?}");
    let refused = files(b, url_b, &readonly, &["delete", "dir/f"]);
    assert_eq!(refused.code, 4, "{refused:?}");
    let refused = files(
        a,
        url_a,
        &operator,
        &["--principal-role", "admin", "stat", "dir/f"],
    );
    assert_eq!(refused.code, 4, "{refused:?}");
    // Clusters: reader-a may use cluster a only.
    let put = files(a, url_a, &operator, &["--cluster", "b", "put", local, "f"]);
    assert_eq!(put.code, 0, "{put:?}");
    let refused = files(b, url_b, &reader_a, &["--cluster", "b", "stat", "f"]);
    assert_eq!(refused.code, 4, "{refused:?}");

    // An interrupted put (raw, signed requests through A) resumes through B with only the
    // missing chunks.
    let resumed = content(4 * CHUNK + 1, 2);
    let hashes: Vec<[u8; 32]> = resumed
        .chunks(CHUNK)
        .map(|chunk| Sha256::digest(chunk).into())
        .collect();
    let client = runtime.block_on(async_nats::connect(url_a)).unwrap();
    runtime.block_on(async {
        let manifest = serde_json::json!({
            "path": "resumed", "size": resumed.len(),
            "sha256": hex::encode(Sha256::digest(&resumed)), "chunk_size": CHUNK,
        })
        .to_string();
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Svc-Manifest", manifest.as_str());
        let sign = Sign::Key(&operator, 0);
        let (error, body) = raw(
            &client,
            sign,
            "svc.files.default.put",
            headers,
            hashes.concat(),
        )
        .await;
        assert_eq!(error, None, "{body:?}");
        let missing: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(missing["missing"], serde_json::json!([0, 1, 2, 3, 4]));
        for index in 0..2 {
            let mut headers = async_nats::HeaderMap::new();
            let hash = hex::encode(hashes[index]);
            headers.insert("Svc-Chunk", hash.as_str());
            let chunk = resumed[index * CHUNK..(index + 1) * CHUNK].to_vec();
            let (error, body) = raw(&client, sign, "svc.files.default.chunk", headers, chunk).await;
            assert_eq!(error, None, "{body:?}");
        }
    });
    let listed = json_of(&files(
        b,
        url_b,
        &readonly,
        &["list", "resumed", "-o", "json"],
    ));
    assert_eq!(
        listed,
        serde_json::json!([]),
        "an interrupted put lists nothing"
    );
    let resumed_file = dir.path().join("r");
    std::fs::write(&resumed_file, &resumed).unwrap();
    let put = files(
        b,
        url_b,
        &operator,
        &[
            "put",
            resumed_file.to_str().unwrap(),
            "resumed",
            "-o",
            "json",
        ],
    );
    assert_eq!(put.code, 0, "{put:?}");
    assert_eq!(json_of(&put)["chunks_sent"], 3, "{put:?}");
    let get = files(a, url_a, &readonly, &["get", "resumed", back]);
    assert_eq!(get.code, 0, "{get:?}");
    assert!(std::fs::read(back).unwrap() == resumed);

    // Delete through A; gone through B.
    assert_eq!(files(a, url_a, &operator, &["delete", "resumed"]).code, 0);
    let gone = files(b, url_b, &readonly, &["stat", "resumed"]);
    assert_eq!(gone.code, 5, "{gone:?}");

    // Requests that are not validly signed are refused.
    let other_key = format!("svc_{}", "Z".repeat(40));
    runtime.block_on(async {
        for (sign, why) in [
            (Sign::None, "no signature"),
            (Sign::Key(&other_key, 0), "a key the store does not know"),
            (Sign::Key(&readonly, -3600), "a stale time"),
            (Sign::Key(&readonly, 3600), "a time in the future"),
            (Sign::OtherReply(&readonly), "signed for another inbox"),
        ] {
            let (error, body) = raw(
                &client,
                sign,
                "svc.files.default.get",
                async_nats::HeaderMap::new(),
                path_body("dir/f"),
            )
            .await;
            assert_eq!(
                error.as_deref(),
                Some("unauthenticated"),
                "{why}: {}",
                String::from_utf8_lossy(&body)
            );
        }
    });

    // A signed request replayed within the window is refused by every member, not only by
    // the one that answered it: the nonces are shared through the store. (Each replay goes
    // to a member the queue group picks; twelve of them reach both.)
    let errors = runtime.block_on(replayed(
        &client,
        &readonly,
        "svc.files.default.get",
        path_body("dir/f"),
        12,
    ));
    assert_eq!(errors[0], None, "the original request is answered");
    assert!(
        errors[1..]
            .iter()
            .all(|e| e.as_deref() == Some("unauthenticated")),
        "a replay was answered: {errors:?}"
    );

    // What the database holds for a key does not sign: its hash is not the HMAC key, and
    // the HMAC key is there only sealed.
    let (stored_hash, sealed): (String, String) = runtime.block_on(async {
        let (db, connection) =
            tokio_postgres::connect(&members.database_url, tokio_postgres::NoTls)
                .await
                .unwrap();
        tokio::spawn(connection);
        let row = db
            .query_one(
                "SELECT key_hash, signing_sealed FROM api_keys WHERE name = 'reader'",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    });
    let signing = signature::signing_key(&readonly);
    assert_ne!(stored_hash, hex::encode(signing));
    assert!(!sealed.contains(&hex::encode(signing)), "{sealed}");
    let stolen: [u8; 32] = hex::decode(&stored_hash).unwrap().try_into().unwrap();
    let (error, body) = runtime.block_on(raw(
        &client,
        Sign::Raw(stolen),
        "svc.files.default.get",
        async_nats::HeaderMap::new(),
        path_body("dir/f"),
    ));
    assert_eq!(
        error.as_deref(),
        Some("unauthenticated"),
        "signed with the stored hash: {}",
        String::from_utf8_lossy(&body)
    );

    // A deleted key fails its next request.
    let (id, doomed) = a.create_key("doomed", "readonly");
    assert_eq!(files(b, url_b, &doomed, &["stat", "dir/f"]).code, 0);
    let deleted = a.request(
        "DELETE",
        &format!("/api/v1/apikeys/{id}"),
        Some(&members.admin_key),
        None,
    );
    assert!(
        deleted.status == 200 || deleted.status == 204,
        "{deleted:?}"
    );
    let refused = files(b, url_b, &doomed, &["stat", "dir/f"]);
    assert_eq!(refused.code, 4, "{refused:?}");

    // A stock client on the NATS cluster cannot read cluster b's object without a valid
    // signature: not by asking for it, nor for one of its chunks by hash.
    let probe = Command::new("python3").args(["-c", "import nats"]).output();
    if !probe.map(|o| o.status.success()).unwrap_or(false) {
        assert!(
            std::env::var("CI").is_err(),
            "python3 with nats-py is required in CI"
        );
        eprintln!("skipped the nats-py part: python3 with nats-py is not installed");
        return;
    }
    let chunk = hex::encode(Sha256::digest(&bytes[..CHUNK]));
    let script = r#"
import asyncio, json, sys
import nats

async def main(url, chunk):
    nc = await nats.connect(url, allow_reconnect=False)
    reply = await nc.request("svc.files.b.get", json.dumps({"path": "f"}).encode(), timeout=20)
    print("get", (reply.headers or {}).get("Svc-Error"), len(reply.data))
    reply = await nc.request("svc.files.b.read", b"", timeout=20, headers={"Svc-Chunk": chunk})
    print("read", (reply.headers or {}).get("Svc-Error"), len(reply.data))
    forged = "v1,000000000000000000000000,%d,abcdefghijklmnopqrstuv,AAAA" % int(__import__("time").time())
    reply = await nc.request("svc.files.b.get", json.dumps({"path": "f"}).encode(), timeout=20, headers={"Svc-Auth": forged})
    print("forged", (reply.headers or {}).get("Svc-Error"), len(reply.data))
    await nc.close()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"#;
    let output = Command::new("python3")
        .args(["-c", script, url_b, &chunk])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for op in ["get", "read", "forged"] {
        assert!(
            stdout.contains(&format!("{op} unauthenticated")),
            "{op}: {stdout}"
        );
    }
}

/// In cluster mode the chunk size comes from the external nats-server's max_payload (its
/// INFO), not from svc's own `bus.max_payload`: on a 1 KiB nats-server (nats.py's test
/// servers) objects are put in 512-byte chunks, and a record whose chunk list is longer than
/// such a message stores the list as chunks; the object reads back whole.
#[test]
fn chunks_fit_the_external_servers_max_payload() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let Some(nats) = runtime.block_on(NatsCluster::start_with(1, "max_payload: 1024\n")) else {
        return;
    };
    let Some(members) = cluster::start(Setup {
        nats_urls: vec![nats.urls()],
        cluster_yaml: "",
        extra_yaml: "",
        bus_yaml: "",
        prepared: None,
    }) else {
        return;
    };
    let server = &members.servers[0];
    let url = nats.url(0);
    let (_, operator) = server.create_key("ops", "operator");
    let dir = tempfile::tempdir().unwrap();
    // 201 chunks: 6432 bytes of chunk list, past what one 1 KiB record message carries.
    let bytes = content(100 * 1024 + 77, 21);
    let local = dir.path().join("hundred");
    std::fs::write(&local, &bytes).unwrap();
    let put = files(
        server,
        &url,
        &operator,
        &["put", local.to_str().unwrap(), "hundred", "-o", "json"],
    );
    assert_eq!(put.code, 0, "{put:?}\n{}", server.log());
    assert_eq!(json_of(&put)["chunks"], 201, "{put:?}");
    let stat = files(server, &url, &operator, &["stat", "hundred", "-o", "json"]);
    assert_eq!(json_of(&stat)["chunk_size"], 512, "{stat:?}");
    let list = files(server, &url, &operator, &["list", "-o", "json"]);
    assert_eq!(json_of(&list)[0]["path"], "hundred", "{list:?}");
    let back = dir.path().join("back");
    let get = files(
        server,
        &url,
        &operator,
        &["get", "hundred", back.to_str().unwrap()],
    );
    assert_eq!(get.code, 0, "{get:?}\n{}", server.log());
    assert!(std::fs::read(&back).unwrap() == bytes, "bytes differ");
}
