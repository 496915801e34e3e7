//! A gRPC client that subscribes to the event stream and never reads it: the server's memory
//! stays bounded (a subscriber reads the log, it is not sent a private queue), and a second
//! subscriber that does read gets every event, with emits going on meanwhile; after
//! `limits.grpc_stream_stall` the stalled stream is cut off (logged, counted in /metrics, its
//! connection closed) while the reader goes on (issue 20, item 5; the REST, bus and
//! connection-flood cases are in tests/rest.rs, tests/bus_*.rs and bench/flood.rs).

mod common;

use std::time::{Duration, Instant};

use common::{with_key, TestServer};
use svc::proto::event_service_client::EventServiceClient;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_subscriber_that_never_reads_costs_bounded_memory() {
    const EVENTS: usize = 1500;
    const PAYLOAD: usize = 32 * 1024;
    let server = TestServer::start_with(common::Options {
        config_yaml: "rate_limit:\n  requests_per_second: 100000\n  burst: 100000\n".into(),
        ..Default::default()
    });
    let key = server.admin_key.clone();
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc)).unwrap();
    let subscribe = svc::proto::SubscribeEventsRequest {
        filter: Some(svc::proto::EventFilter {
            since: svc::clock::format_rfc3339(svc::clock::now_millis() - 3_600_000),
            ..Default::default()
        }),
    };
    // The stalled subscriber: its own connection, the stream opened and never polled again.
    let stalled_channel = endpoint.connect().await.unwrap();
    let mut stalled = EventServiceClient::new(stalled_channel)
        .subscribe(with_key(subscribe.clone(), &key))
        .await
        .unwrap()
        .into_inner();
    let first = stalled.message().await.unwrap_or(None);
    // The reading subscriber counts what it gets, until it has every event.
    let reader_channel = endpoint.connect().await.unwrap();
    let mut reading = EventServiceClient::new(reader_channel)
        .subscribe(with_key(subscribe, &key))
        .await
        .unwrap()
        .into_inner();
    let reader = tokio::spawn(async move {
        let mut seen = 0;
        while seen < EVENTS {
            match tokio::time::timeout(Duration::from_secs(60), reading.message()).await {
                Ok(Ok(Some(event))) if event.source.starts_with("load-") => seen += 1,
                Ok(Ok(Some(_))) => {}
                other => panic!("reading subscriber stopped after {seen}: {other:?}"),
            }
        }
        seen
    });
    let before = rss_kib(server.pid());
    let mut emitter = EventServiceClient::new(endpoint.connect().await.unwrap());
    let padding = "x".repeat(PAYLOAD);
    let started = Instant::now();
    for n in 0..EVENTS {
        let request = svc::proto::EmitEventRequest {
            r#type: "agent_enrolled".into(),
            source: format!("load-{n}"),
            payload_json: format!(r#"{{"padding":"{padding}"}}"#),
            ..Default::default()
        };
        emitter.emit(with_key(request, &key)).await.unwrap();
    }
    let emitted_in = started.elapsed();
    let seen = reader.await.unwrap();
    let after = rss_kib(server.pid());
    let grown_mib = after.saturating_sub(before) / 1024;
    let streamed_mib = (EVENTS * PAYLOAD) as u64 / (1024 * 1024);
    eprintln!(
        "never-reading subscriber: {streamed_mib} MiB of events emitted in {emitted_in:.1?}, \
         the reading subscriber got all {seen}; server RSS {} -> {} MiB (+{grown_mib})",
        before / 1024,
        after / 1024
    );
    // Bounded: the stalled stream holds its channel (256 events) and HTTP/2 windows, not a
    // copy of everything emitted since it stopped reading.
    assert!(
        grown_mib < streamed_mib / 2,
        "server RSS grew {grown_mib} MiB for {streamed_mib} MiB streamed"
    );
    drop(first);
    drop(stalled);
}

fn streams_cut(server: &TestServer) -> u64 {
    let metrics = server.request("GET", "/metrics", None, None);
    metrics
        .body
        .lines()
        .find_map(|line| line.strip_prefix("svc_grpc_streams_cut_total "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no svc_grpc_streams_cut_total in /metrics")) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_subscriber_that_never_reads_is_cut_off() {
    // Enough to fill what the stalled stream's path can hold: the client's HTTP/2 stream
    // window (2 MiB in hyper's client), the socket buffers, the relay and the domain channel.
    const EVENTS: usize = 600;
    const PAYLOAD: usize = 32 * 1024;
    // Short, so the test runs in seconds; long enough that the reading subscriber, starved
    // for a moment on a loaded machine, is not taken for a stalled one.
    let server = TestServer::start_with(common::Options {
        config_yaml: "rate_limit:\n  requests_per_second: 100000\n  burst: 100000\n\
                      limits:\n  grpc_stream_stall: 5s\n"
            .into(),
        ..Default::default()
    });
    let key = server.admin_key.clone();
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc)).unwrap();
    let subscribe = svc::proto::SubscribeEventsRequest {
        filter: Some(svc::proto::EventFilter {
            since: svc::clock::format_rfc3339(svc::clock::now_millis() - 3_600_000),
            ..Default::default()
        }),
    };
    assert_eq!(streams_cut(&server), 0);
    let mut stalled = EventServiceClient::new(endpoint.connect().await.unwrap())
        .subscribe(with_key(subscribe.clone(), &key))
        .await
        .unwrap()
        .into_inner();
    let mut reading = EventServiceClient::new(endpoint.connect().await.unwrap())
        .subscribe(with_key(subscribe, &key))
        .await
        .unwrap()
        .into_inner();
    let reader = tokio::spawn(async move {
        let mut seen = 0;
        while seen < EVENTS {
            match tokio::time::timeout(Duration::from_secs(60), reading.message()).await {
                Ok(Ok(Some(event))) if event.source.starts_with("load-") => seen += 1,
                Ok(Ok(Some(_))) => {}
                other => panic!("reading subscriber stopped after {seen}: {other:?}"),
            }
        }
        (seen, reading)
    });
    let mut emitter = EventServiceClient::new(endpoint.connect().await.unwrap());
    let padding = "x".repeat(PAYLOAD);
    let emit = |n: usize| svc::proto::EmitEventRequest {
        r#type: "agent_enrolled".into(),
        source: format!("load-{n}"),
        payload_json: format!(r#"{{"padding":"{padding}"}}"#),
        ..Default::default()
    };
    for n in 0..EVENTS {
        emitter.emit(with_key(emit(n), &key)).await.unwrap();
    }
    let (seen, mut reading) = reader.await.unwrap();
    // The stalled stream is cut once it has waited limits.grpc_stream_stall.
    let deadline = Instant::now() + Duration::from_secs(120);
    while streams_cut(&server) == 0 {
        assert!(
            Instant::now() < deadline,
            "the stalled stream was never cut off"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(streams_cut(&server), 1, "only the stalled stream is cut");
    assert!(
        server.log().contains("gRPC stream cut off"),
        "no log line for the cut"
    );
    // Its client, reading at last, gets what was already on its side, then the end.
    let mut buffered = 0;
    let ending = loop {
        match tokio::time::timeout(Duration::from_secs(60), stalled.message()).await {
            Ok(Ok(Some(_))) => buffered += 1,
            Ok(other) => break other,
            Err(_) => panic!("the cut stream did not end after {buffered} messages"),
        }
    };
    assert!(buffered < EVENTS, "the cut stream delivered everything");
    eprintln!(
        "stalled subscriber cut off; it then read {buffered} buffered events and {ending:?}; \
         the reading subscriber got all {seen}"
    );
    assert!(ending.is_err(), "{ending:?}");
    // The reader's stream is unaffected: it gets the next event too.
    emitter.emit(with_key(emit(EVENTS), &key)).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(60), reading.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(next.source, format!("load-{EVENTS}"));
}
