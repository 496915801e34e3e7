//! Disk full: the server's data dir on a 32 MiB tmpfs, filled up. Writes fail with a clear
//! error on every surface (REST 507 or 503, gRPC RESOURCE_EXHAUSTED or UNAVAILABLE, CLIs
//! exit 1 saying "no space left on data_dir"), readiness says which component is not ok,
//! reads keep working, nothing acknowledged is lost, and once space is freed the same server
//! process takes writes again. Mounting needs root (or CAP_SYS_ADMIN): where the mount
//! fails, the test says so and passes without running.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{run, with_key, TestServer};
use svc::proto::event_service_client::EventServiceClient;
use svc::proto::identity_service_client::IdentityServiceClient;
use svc::proto::policy_service_client::PolicyServiceClient;
use svc::proto::secrets_service_client::SecretsServiceClient;
use tonic::Code;

/// A tmpfs mounted for the test, unmounted on drop.
struct Mounted {
    dir: tempfile::TempDir,
}

impl Mounted {
    fn tmpfs(size: &str) -> Option<Mounted> {
        let dir = tempfile::tempdir().unwrap();
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match output {
            Ok(output) if output.status.success() => Some(Mounted { dir }),
            Ok(output) => {
                eprintln!(
                    "skipped: cannot mount a tmpfs for the data dir (needs root): {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount: {e}");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Writes into `path` until the filesystem refuses (ENOSPC), in shrinking chunks so the last
/// bytes are taken too.
fn fill(path: &Path) -> u64 {
    let mut file = std::fs::File::create(path).unwrap();
    let mut written = 0;
    for chunk in [1 << 20, 64 << 10, 4 << 10, 512, 1] {
        let bytes = vec![0xa5u8; chunk];
        loop {
            match file.write(&bytes) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
    }
    file.sync_all().ok();
    written
}

fn is_write_refusal(status: &tonic::Status) -> bool {
    matches!(status.code(), Code::ResourceExhausted | Code::Unavailable)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_data_dir_refuses_writes_clearly_and_recovers_when_freed() {
    let Some(mount) = Mounted::tmpfs("32m") else {
        return;
    };
    let data_dir: PathBuf = mount.path().join("data");
    let server = TestServer::start_with(common::Options {
        sqlite_only: true,
        data_dir: Some(data_dir.clone()),
        config_yaml: "rate_limit:\n  requests_per_second: 100000\n  burst: 100000\n".into(),
        ..Default::default()
    });
    let key = server.admin_key.clone();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut events = EventServiceClient::new(channel.clone());
    let mut secrets = SecretsServiceClient::new(channel.clone());
    let emit = |source: String| svc::proto::EmitEventRequest {
        r#type: "agent_enrolled".into(),
        source,
        ..Default::default()
    };
    let put = |value: String| svc::proto::PutSecretRequest {
        path: "full/a".into(),
        data: [("v".to_string(), value)].into(),
    };

    // Acknowledged before the disk fills.
    let mut acknowledged_events = Vec::new();
    for n in 0..5 {
        let event = events
            .emit(with_key(emit(format!("before-{n}")), &key))
            .await
            .unwrap()
            .into_inner();
        acknowledged_events.push(event.id);
    }
    let before = secrets
        .put(with_key(put("before".into()), &key))
        .await
        .unwrap()
        .into_inner();
    let (key_id, _) = server.create_key("before-full", "readonly");

    let filler = mount.path().join("filler");
    let started = Instant::now();
    let filled = fill(&filler);
    eprintln!("filled the tmpfs with {filled} bytes");

    // gRPC: the events log's last page may still have room for a few records (tmpfs
    // allocates whole pages); emit until refused. What was acknowledged must survive.
    let mut refused = None;
    for n in 0..3000 {
        match events.emit(with_key(emit(format!("full-{n}")), &key)).await {
            Ok(event) => acknowledged_events.push(event.into_inner().id),
            Err(status) => {
                refused = Some(status);
                break;
            }
        }
    }
    let status = refused.expect("emits were never refused on a full disk");
    assert!(is_write_refusal(&status), "{status:?}");
    if !status.message().contains("no space left on data_dir") {
        let log = server.log();
        let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
        panic!("{status:?}\n{}", errors.join("\n"));
    }
    assert!(
        status.message().contains("no space left on data_dir"),
        "{status:?}"
    );
    // SQLite may still reuse room in its WAL for a while: write until it is refused.
    let mut refused = None;
    for n in 0..3000 {
        match secrets.put(with_key(put(format!("full-{n}")), &key)).await {
            Ok(_) => continue,
            Err(status) => {
                refused = Some(status);
                break;
            }
        }
    }
    let status = refused.expect("secret puts were never refused on a full disk");
    assert!(is_write_refusal(&status), "{status:?}");
    assert!(
        status.message().contains("no space left on data_dir"),
        "{status:?}"
    );
    // REST: 507 (or 503 while the audit log is the part that is full).
    let auth = format!("Bearer {key}");
    let mut rest_status = 0;
    for n in 0..3000 {
        let body = format!(r#"{{"name":"full-{n}","role":"readonly"}}"#);
        let response = common::http_request(
            server.http,
            "POST",
            "/api/v1/apikeys",
            &[("Authorization", &auth)],
            Some(body.as_bytes()),
        )
        .unwrap();
        if response.status != 201 {
            rest_status = response.status;
            assert!(
                response.body.contains("no space left on data_dir"),
                "{}",
                response.body
            );
            break;
        }
    }
    assert!(
        matches!(rest_status, 507 | 503),
        "REST answered {rest_status}"
    );
    // CLI: exit 1 with the reason.
    let cli =
        run(server
            .cli("svc-events")
            .args(["--api-key", &key, "emit", "--type", "agent_enrolled"]));
    assert_eq!(cli.code, 1, "{cli:?}");
    assert!(cli.stderr.contains("no space left on data_dir"), "{cli:?}");
    // The audit gate covers the other changes too: a transit key and a join token.
    let transit_key = || svc::proto::TransitKeyRequest {
        name: "while-full".into(),
        r#type: "aes256-gcm".into(),
        ..Default::default()
    };
    let refused = secrets
        .transit_create_key(with_key(transit_key(), &key))
        .await
        .unwrap_err();
    assert!(is_write_refusal(&refused), "{refused:?}");
    let mut identity = IdentityServiceClient::new(channel.clone());
    let refused = identity
        .create_token(with_key(svc::proto::CreateTokenRequest::default(), &key))
        .await
        .unwrap_err();
    assert!(is_write_refusal(&refused), "{refused:?}");
    // Readiness names the component.
    let ready = server.request("GET", "/health/ready", None, None);
    assert_eq!(ready.status, 503, "{}", ready.body);
    // The part that hit the full disk first says so: the audit log (rows in the store) or
    // the events log (stream_store).
    let components = ready.json()["components"].clone();
    let full: Vec<&String> = components
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, component)| {
            component["status"] != "ok"
                && component["detail"]
                    .as_str()
                    .is_some_and(|detail| detail.contains("no space left on data_dir"))
        })
        .map(|(name, _)| name)
        .collect();
    assert!(!full.is_empty(), "{}", ready.body);
    eprintln!("readiness while full: {}", ready.body);
    // Reads keep working.
    let listed = events
        .list(with_key(svc::proto::ListEventsRequest::default(), &key))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.items.len() >= 5);
    let secret = secrets
        .get(with_key(
            svc::proto::GetSecretRequest {
                path: "full/a".into(),
                version: before.version,
            },
            &key,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(secret.data["v"], "before");
    let response = server.request(
        "GET",
        &format!("/api/v1/apikeys/{key_id}"),
        Some(&key),
        None,
    );
    assert_eq!(response.status, 200, "{}", response.body);

    // Space back: the same process recovers, readiness first, then every write.
    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    loop {
        let ready = server.request("GET", "/health/ready", None, None);
        if ready.status == 200 {
            break;
        }
        assert!(
            freed.elapsed() < Duration::from_secs(10),
            "not ready after space was freed: {}",
            ready.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recovered_in = freed.elapsed();
    let event = events
        .emit(with_key(emit("after".into()), &key))
        .await
        .unwrap()
        .into_inner();
    acknowledged_events.push(event.id);
    secrets
        .put(with_key(put("after".into()), &key))
        .await
        .unwrap();
    server.create_key("after-full", "readonly");
    secrets
        .transit_create_key(with_key(transit_key(), &key))
        .await
        .unwrap();
    let cli =
        run(server
            .cli("svc-events")
            .args(["--api-key", &key, "emit", "--type", "agent_enrolled"]));
    assert_eq!(cli.code, 0, "{cli:?}");

    // Nothing acknowledged was lost, the events log is dense, the audit chain verifies.
    let listed = events
        .list(with_key(
            svc::proto::ListEventsRequest {
                filter: None,
                page: Some(svc::proto::PageRequest {
                    limit: 1000,
                    cursor: String::new(),
                }),
            },
            &key,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut seqs: Vec<u64> = listed.items.iter().map(|event| event.seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    for id in &acknowledged_events {
        assert!(
            listed.items.iter().any(|event| &event.id == id),
            "lost {id}"
        );
    }
    let verify = PolicyServiceClient::new(channel)
        .audit_verify(with_key(svc::proto::Empty::default(), &key))
        .await
        .unwrap()
        .into_inner();
    assert!(verify.ok, "{verify:?}");
    eprintln!(
        "disk full: refused and recovered in {:.1?} in all; ready {:?} after the space came back",
        started.elapsed(),
        recovered_in
    );
}

/// The stream log alone on a full filesystem: an append that does not fit is refused with
/// StorageFull, the log stays open (no restart), health says why, and after space is freed
/// appends go on with dense sequences and every acknowledged record intact, also across a
/// reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_log_refuses_appends_on_a_full_disk_and_goes_on_after() {
    use svc::stream::{StreamConfig, StreamLog};
    let Some(mount) = Mounted::tmpfs("4m") else {
        return;
    };
    let dir = mount.path().join("events");
    let config = || StreamConfig {
        max_age: None,
        max_bytes: None,
        // Small segments, so rolls (new files) happen while the disk is full too.
        segment_bytes: 64 * 1024,
    };
    let log = StreamLog::open(&dir, config()).unwrap();
    let payload = |seq: u64| format!("record {seq:08} {}", "x".repeat(1000)).into_bytes();
    let mut acknowledged = Vec::new();
    for _ in 0..100 {
        let seq = log.last_seq() + 1;
        acknowledged.push(log.append(0, payload(seq)).await.unwrap());
    }
    let filler = mount.path().join("filler");
    fill(&filler);
    let mut refusals = 0;
    for _ in 0..200 {
        let seq = log.last_seq() + 1;
        match log.append(0, payload(seq)).await {
            Ok(got) => {
                assert_eq!(got, seq);
                acknowledged.push(got);
            }
            Err(error) => {
                assert!(matches!(error, svc::Error::StorageFull(_)), "{error:?}");
                assert!(error.to_string().contains("no space left on data_dir"));
                refusals += 1;
            }
        }
    }
    assert!(refusals > 0, "no append was refused on a full disk");
    let health = log.health().unwrap_err();
    assert!(matches!(health, svc::Error::StorageFull(_)), "{health:?}");
    std::fs::remove_file(&filler).unwrap();
    log.health().unwrap();
    for _ in 0..100 {
        let seq = log.last_seq() + 1;
        acknowledged.push(log.append(0, payload(seq)).await.unwrap());
    }
    let check = |log: &StreamLog| {
        let records = log.read(1, 100_000).unwrap();
        let seqs: Vec<u64> = records.iter().map(|record| record.seq).collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "dense");
        assert_eq!(
            seqs, acknowledged,
            "every acknowledged record, nothing else"
        );
        for record in &records {
            assert_eq!(record.payload, payload(record.seq));
        }
    };
    check(&log);
    drop(log);
    check(&StreamLog::open(&dir, config()).unwrap());
    eprintln!(
        "stream log: {refusals} appends refused while full, {} acknowledged",
        acknowledged.len()
    );
}
