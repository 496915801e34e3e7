//! The crash loop: the real server under concurrent load, killed with SIGKILL at a random
//! moment, restarted on the same data dir, and checked: every acknowledged event, API key,
//! secret version and audit row is there, the audit chain verifies, and the event stream's
//! sequences are dense (1..=N, no gap, no duplicate).
//!
//! Load per iteration, all as the admin: two gRPC emitters, one `svc-events emit` loop (CLI),
//! one gRPC secret writer (each put is audited), one REST API-key creator (each create is
//! audited and emits `apikey_created`). `SVC_CRASH_LOOPS` sets the iterations (default 20);
//! `SVC_CRASH_SEED` replays a run (the seed is printed).

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{run, with_key, TestServer};
use rand::{Rng, SeedableRng};
use svc::proto::event_service_client::EventServiceClient;
use svc::proto::policy_service_client::PolicyServiceClient;
use svc::proto::secrets_service_client::SecretsServiceClient;
use tonic::transport::Channel;

/// What the server acknowledged, across all iterations.
#[derive(Default)]
struct Acknowledged {
    /// Event id → the sequence the server gave it.
    events: HashMap<String, u64>,
    /// (path, version) → the value written.
    secrets: BTreeMap<(String, u32), String>,
    api_keys: HashSet<String>,
}

async fn channel(server: &TestServer) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn iterations() -> usize {
    std::env::var("SVC_CRASH_LOOPS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(20)
}

/// Runs the load until `stop`, recording acknowledgements; returns how many requests failed
/// (the ones in flight when the server died, and any after).
async fn load(
    server: &TestServer,
    iteration: usize,
    acknowledged: Arc<Mutex<Acknowledged>>,
    stop: Arc<AtomicBool>,
) -> usize {
    let channel = channel(server).await;
    let key = server.admin_key.clone();
    let mut tasks = Vec::new();
    for emitter in 0..2 {
        let (channel, key, acknowledged, stop) = (
            channel.clone(),
            key.clone(),
            acknowledged.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut client = EventServiceClient::new(channel);
            let mut failed = 0;
            for n in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let request = svc::proto::EmitEventRequest {
                    r#type: "agent_enrolled".into(),
                    source: format!("crash-{iteration}-{emitter}-{n}"),
                    payload_json: format!(r#"{{"n":{n}}}"#),
                    ..Default::default()
                };
                match client.emit(with_key(request, &key)).await {
                    Ok(event) => {
                        let event = event.into_inner();
                        acknowledged
                            .lock()
                            .unwrap()
                            .events
                            .insert(event.id, event.seq);
                    }
                    Err(_) => {
                        failed += 1;
                        break;
                    }
                }
            }
            failed
        }));
    }
    {
        let (channel, key, acknowledged, stop) = (
            channel.clone(),
            key.clone(),
            acknowledged.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut client = SecretsServiceClient::new(channel);
            let path = format!("crash/p{}", iteration % 4);
            let mut failed = 0;
            for n in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let value = format!("{iteration}-{n}");
                let request = svc::proto::PutSecretRequest {
                    path: path.clone(),
                    data: [("v".to_string(), value.clone())].into(),
                };
                match client.put(with_key(request, &key)).await {
                    Ok(meta) => {
                        let version = meta.into_inner().version;
                        acknowledged
                            .lock()
                            .unwrap()
                            .secrets
                            .insert((path.clone(), version), value);
                    }
                    Err(_) => {
                        failed += 1;
                        break;
                    }
                }
            }
            failed
        }));
    }
    let http = server.http;
    {
        let (key, acknowledged, stop) = (key.clone(), acknowledged.clone(), stop.clone());
        tasks.push(tokio::task::spawn_blocking(move || {
            let auth = format!("Bearer {key}");
            for n in 0.. {
                if stop.load(Ordering::Relaxed) {
                    return 0;
                }
                let body = format!(r#"{{"name":"crash-{iteration}-{n}","role":"readonly"}}"#);
                let response = common::http_request(
                    http,
                    "POST",
                    "/api/v1/apikeys",
                    &[("Authorization", &auth)],
                    Some(body.as_bytes()),
                );
                match response {
                    Ok(response) if response.status == 201 => {
                        let id = response.json()["id"].as_str().unwrap().to_string();
                        acknowledged.lock().unwrap().api_keys.insert(id);
                    }
                    _ => return 1,
                }
            }
            0
        }));
    }
    {
        let mut command = server.cli("svc-events");
        command.args([
            "--api-key",
            &key,
            "-o",
            "json",
            "emit",
            "--type",
            "agent_enrolled",
        ]);
        let program = command.get_program().to_owned();
        let envs: Vec<_> = command
            .get_envs()
            .map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned())))
            .collect();
        let (acknowledged, stop) = (acknowledged.clone(), stop.clone());
        tasks.push(tokio::task::spawn_blocking(move || {
            for n in 0.. {
                if stop.load(Ordering::Relaxed) {
                    return 0;
                }
                let mut command = std::process::Command::new(&program);
                command.env_clear().stdin(std::process::Stdio::null());
                for (k, v) in &envs {
                    if let Some(v) = v {
                        command.env(k, v);
                    }
                }
                let result = run(command.args([
                    "--api-key",
                    &key,
                    "-o",
                    "json",
                    "emit",
                    "--type",
                    "agent_enrolled",
                    "--source",
                    &format!("crash-cli-{iteration}-{n}"),
                ]));
                if result.code != 0 {
                    return 1;
                }
                let event: serde_json::Value = serde_json::from_str(&result.stdout).unwrap();
                acknowledged.lock().unwrap().events.insert(
                    event["id"].as_str().unwrap().to_string(),
                    event["seq"].as_u64().unwrap_or(0),
                );
            }
            0
        }));
    }
    let mut failed = 0;
    for task in tasks {
        failed += task.await.unwrap();
    }
    failed
}

/// Checks the restarted server against what was acknowledged: `all` for the events (the
/// whole stream is listed anyway, to check it is dense), `new` (this iteration's) for the
/// rest, read back one by one and looked up in the audit rows written since `since`.
async fn check(server: &TestServer, all: &Acknowledged, new: &Acknowledged, since: &str) {
    let channel = channel(server).await;
    let key = &server.admin_key;
    let events = common::events_grpc(&channel, key, None).await;
    let seqs: Vec<u64> = events.iter().map(|event| event.seq).collect();
    let dense: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(seqs, dense, "event sequences are not dense");
    let stored: HashMap<&str, u64> = events
        .iter()
        .map(|event| (event.id.as_str(), event.seq))
        .collect();
    for (id, seq) in &all.events {
        let found = stored.get(id.as_str());
        assert!(found.is_some(), "acknowledged event {id} (seq {seq}) lost");
        if *seq != 0 {
            assert_eq!(found, Some(seq), "event {id} changed its sequence");
        }
    }

    let writes = common::audit_rows_grpc(&channel, key, "secret.write", since).await;
    let audited_versions: HashSet<(String, u64)> = writes
        .iter()
        .filter(|row| row.outcome == "success")
        .filter_map(|row| {
            let detail: serde_json::Value = serde_json::from_str(&row.detail_json).ok()?;
            Some((row.resource_id.clone(), detail["version"].as_u64()?))
        })
        .collect();
    for (path, version) in new.secrets.keys() {
        assert!(
            audited_versions.contains(&(path.clone(), u64::from(*version))),
            "secret {path} v{version} acknowledged without its audit row"
        );
    }
    let creates = common::audit_rows_grpc(&channel, key, "apikey.create", since).await;
    let audited_keys: HashSet<&str> = creates.iter().map(|row| row.resource_id.as_str()).collect();
    for id in &new.api_keys {
        assert!(
            audited_keys.contains(id.as_str()),
            "API key {id} acknowledged without its audit row"
        );
    }
    let verify = PolicyServiceClient::new(channel.clone())
        .audit_verify(with_key(svc::proto::Empty::default(), key))
        .await
        .unwrap()
        .into_inner();
    assert!(verify.ok, "audit chain broken: {verify:?}");

    let mut secrets = SecretsServiceClient::new(channel.clone());
    for ((path, version), value) in &new.secrets {
        let request = svc::proto::GetSecretRequest {
            path: path.clone(),
            version: *version,
        };
        let secret = secrets
            .get(with_key(request, key))
            .await
            .unwrap_or_else(|e| panic!("secret {path} v{version}: {e:?}"))
            .into_inner();
        assert_eq!(secret.data.get("v"), Some(value), "{path} v{version}");
    }
    for id in &new.api_keys {
        let response = server.request("GET", &format!("/api/v1/apikeys/{id}"), Some(key), None);
        assert_eq!(response.status, 200, "API key {id}: {}", response.body);
    }
}

fn now_rfc3339() -> String {
    now_rfc3339_minus(Duration::ZERO)
}

fn now_rfc3339_minus(back: Duration) -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .saturating_sub(back)
        .as_millis() as i64;
    svc::clock::format_rfc3339(millis)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_repeated_kill_9() {
    let seed: u64 = std::env::var("SVC_CRASH_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(rand::random);
    let loops = iterations();
    eprintln!("crash loop: {loops} iterations, SVC_CRASH_SEED={seed}");
    let mut random = rand::rngs::StdRng::seed_from_u64(seed);
    let mut server = TestServer::start_with(common::Options {
        config_yaml:
            "rate_limit:\n  requests_per_second: 100000\n  burst: 100000\n  max_in_flight: 64\n"
                .into(),
        ..Default::default()
    });
    let mut total = Acknowledged::default();
    let first_since = now_rfc3339();
    let started = Instant::now();
    let mut restart_times = Vec::new();
    let mut failed_requests = 0;
    for iteration in 0..loops {
        // Audit rows are looked up from a second before the iteration (timestamps are UTC,
        // millisecond precision, from the same clock).
        let since = now_rfc3339_minus(Duration::from_secs(1));
        let acknowledged = Arc::new(Mutex::new(Acknowledged::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let kill_after = Duration::from_millis(random.gen_range(50..600));
        let pid = server.pid() as i32;
        let killer = {
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep(kill_after).await;
                // SAFETY: kill(2) on the server child this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                // Let the clients see the dead server before they are told to stop.
                tokio::time::sleep(Duration::from_millis(50)).await;
                stop.store(true, Ordering::Relaxed);
            })
        };
        failed_requests += load(&server, iteration, acknowledged.clone(), stop).await;
        killer.await.unwrap();
        server.stop_with(libc::SIGKILL);
        let restart = Instant::now();
        server.spawn(&[]);
        restart_times.push(restart.elapsed());
        let new = std::mem::take(&mut *acknowledged.lock().unwrap());
        total
            .events
            .extend(new.events.iter().map(|(k, v)| (k.clone(), *v)));
        check(&server, &total, &new, &since).await;
        total.secrets.extend(new.secrets);
        total.api_keys.extend(new.api_keys);
    }
    // Once over everything: each secret version and key has its audit row.
    let last = Acknowledged::default();
    check(&server, &total, &last, &first_since).await;
    let channel = channel(&server).await;
    let writes =
        common::audit_rows_grpc(&channel, &server.admin_key, "secret.write", &first_since).await;
    let creates =
        common::audit_rows_grpc(&channel, &server.admin_key, "apikey.create", &first_since).await;
    let audited_keys: HashSet<&str> = creates.iter().map(|row| row.resource_id.as_str()).collect();
    assert!(total
        .api_keys
        .iter()
        .all(|id| audited_keys.contains(id.as_str())));
    let successful_writes = writes.iter().filter(|row| row.outcome == "success").count();
    assert!(successful_writes >= total.secrets.len());
    restart_times.sort();
    let audit = run(server
        .cli("svc-audit")
        .args(["--api-key", &server.admin_key, "verify"]));
    assert_eq!(audit.code, 0, "svc-audit verify: {audit:?}");
    eprintln!(
        "crash loop: {loops} kills in {:.1?}; acknowledged {} events, {} secret versions, {} API keys \
         (all found after restart); {failed_requests} requests cut by a kill; restart to ready \
         median {:?}, max {:?}",
        started.elapsed(),
        total.events.len(),
        total.secrets.len(),
        total.api_keys.len(),
        restart_times[restart_times.len() / 2],
        restart_times.last().unwrap(),
    );
}
