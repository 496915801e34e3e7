//! gRPC end to end: health, reflection, authentication, rate limiting, Unimplemented stubs,
//! and a streaming RPC held open across SIGTERM.

mod common;

use common::{with_key, Options, TestServer};
use svc::proto::cluster_service_client::ClusterServiceClient;
use svc::proto::policy_service_client::PolicyServiceClient;
use tonic::Code;

async fn channel(server: &TestServer) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn health_service_answers_without_a_key() {
    let server = TestServer::start();
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel(&server).await);
    for service in ["", "svc.v1.EventService", "svc.v1.FleetService"] {
        let response = client
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            response.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service}"
        );
    }
}

#[tokio::test]
async fn reflection_lists_the_six_services() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let server = TestServer::start();
    let mut client = ServerReflectionClient::new(channel(&server).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let response = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for service in [
        "EventService",
        "PolicyService",
        "IdentityService",
        "SecretsService",
        "ClusterService",
        "FleetService",
    ] {
        assert!(
            names.contains(&format!("svc.v1.{service}")),
            "{service} not in {names:?}"
        );
    }
    assert!(
        names.contains(&"grpc.health.v1.Health".to_string()),
        "{names:?}"
    );
}

#[tokio::test]
async fn svc_services_require_a_valid_key_then_answer_unimplemented() {
    let server = TestServer::start();
    let mut client = PolicyServiceClient::new(channel(&server).await);

    let status = client
        .create_policy(svc::proto::Policy::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    let unknown = format!("svc_{}", "Z".repeat(40));
    let status = client
        .create_policy(with_key(svc::proto::Policy::default(), &unknown))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    let status = client
        .create_policy(with_key(svc::proto::Policy::default(), &server.admin_key))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    assert!(
        status.message().ends_with("not implemented yet"),
        "{status:?}"
    );

    // A deleted key fails its next gRPC call too.
    let (id, key) = server.create_key("grpc", "readonly");
    let status = client
        .create_policy(with_key(svc::proto::Policy::default(), &key))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);
    server.request(
        "DELETE",
        &format!("/api/v1/apikeys/{id}"),
        Some(&server.admin_key),
        None,
    );
    let status = client
        .create_policy(with_key(svc::proto::Policy::default(), &key))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
}

#[tokio::test]
async fn rate_limit_is_resource_exhausted() {
    let server = TestServer::start_with(Options {
        config_yaml: "rate_limit: { requests_per_second: 1, burst: 2 }\n".into(),
        ..Options::default()
    });
    let mut client = PolicyServiceClient::new(channel(&server).await);
    let mut codes = Vec::new();
    for _ in 0..5 {
        codes.push(
            client
                .create_policy(with_key(svc::proto::Policy::default(), &server.admin_key))
                .await
                .unwrap_err()
                .code(),
        );
    }
    assert_eq!(
        &codes[..2],
        &[Code::Unimplemented, Code::Unimplemented],
        "{codes:?}"
    );
    assert!(codes[2..].contains(&Code::ResourceExhausted), "{codes:?}");
}

#[tokio::test]
async fn grpc_calls_show_in_metrics() {
    let server = TestServer::start();
    let mut client = ClusterServiceClient::new(channel(&server).await);
    let _ = client.status(svc::proto::Empty {}).await;
    let metrics = server.request("GET", "/metrics", None, None).body;
    assert!(
        metrics.contains("svc_grpc_requests_total{method=\"/svc.v1.ClusterService/Status\",code=\"unauthenticated\"} 1"),
        "{metrics}"
    );
}

#[test]
fn sigterm_ends_an_open_event_stream_cleanly_and_stops_promptly() {
    use std::io::BufRead;
    use std::time::{Duration, Instant};

    let mut server = TestServer::start();
    // A live `svc-events subscribe` stream, open before the signal.
    let mut subscriber = server
        .cli("svc-events")
        .args(["--api-key", &server.admin_key, "subscribe"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = subscriber.stdout.take().unwrap();
    let (lines, received) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    // Emit until the subscriber prints one: then the stream is certainly established.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let emitted = common::run(server.cli("svc-events").args([
            "--api-key",
            &server.admin_key,
            "emit",
            "--type",
            "bus_healthy",
            "--payload",
            r#"{"probe":true}"#,
        ]));
        assert_eq!(emitted.code, 0, "{emitted:?}");
        if let Ok(line) = received.recv_timeout(Duration::from_millis(500)) {
            assert!(line.contains("bus_healthy"), "{line}");
            break;
        }
        assert!(Instant::now() < deadline, "the subscriber printed nothing");
    }

    let stopped = Instant::now();
    assert_eq!(server.stop_with(libc::SIGTERM), Some(0), "{}", server.log());
    // The server ended the stream (no 30 s wait for the grace to run out) ...
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "{:?}\n{}",
        stopped.elapsed(),
        server.log()
    );
    assert!(server.log().contains("stop requested"), "{}", server.log());
    // ... and cleanly: the CLI saw the end of the stream, not a broken connection.
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = subscriber.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = subscriber.kill();
            panic!("svc-events subscribe still running after the server stopped");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut subscriber.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    reader.join().unwrap();
    let rest: Vec<String> = received.try_iter().collect();
    assert!(
        rest.iter()
            .all(|line| serde_json::from_str::<serde_json::Value>(line).is_ok()),
        "{rest:?}"
    );
}

#[test]
fn calls_past_the_in_flight_cap_get_resource_exhausted_and_other_keys_are_served() {
    use std::time::{Duration, Instant};
    let server = TestServer::start_with(Options {
        config_yaml: "rate_limit: { max_in_flight: 1 }\n".into(),
        ..Options::default()
    });
    let (_, greedy) = server.create_key("greedy", "operator");
    let svcctl = |key: &str, args: &[&str]| {
        common::run(server.cli("svcctl").args(["--api-key", key]).args(args))
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // One call holds the key's only slot: a unary call whose message never comes (the
    // server waits for it; the slot is held until the answer). Refused while one of the
    // probes below holds the slot, it tries again.
    let address = format!("http://{}", server.grpc);
    let held_key = greedy.clone();
    let held = runtime.spawn(async move {
        let channel = tonic::transport::Channel::from_shared(address)
            .unwrap()
            .connect()
            .await
            .unwrap();
        loop {
            let mut grpc = tonic::client::Grpc::new(channel.clone());
            grpc.ready().await.unwrap();
            let never = futures_util::stream::pending::<Vec<u8>>();
            let request = with_key(never, &held_key);
            let path = http::uri::PathAndQuery::from_static("/svc.v1.FleetService/ListAgents");
            let ended = grpc
                .client_streaming(request, path, common::raw_grpc::RawCodec)
                .await
                .map(drop);
            match ended {
                Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                ended => return ended,
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let listed = svcctl(&greedy, &["agent", "list"]);
        if listed.code != 0 {
            break listed;
        }
        // A held call that ended (refused, connection lost) holds no slot: say so.
        if held.is_finished() {
            let ended = runtime.block_on(held).unwrap();
            panic!("the held call ended instead of waiting: {ended:?}");
        }
        assert!(Instant::now() < deadline, "never refused: {listed:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(refused.stderr.contains("max_in_flight"), "{refused:?}");
    // Other keys are served meanwhile.
    let admin = svcctl(&server.admin_key, &["agent", "list"]);
    assert_eq!(admin.code, 0, "{admin:?}");
    // The client gives up: its slot comes back.
    held.abort();
    drop(runtime);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listed = svcctl(&greedy, &["agent", "list"]);
        if listed.code == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "slot not given back: {listed:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
