//! Hostile input against a real server: every REST route that takes a JSON body, and every
//! gRPC method, fed malformed, oversized, deeply nested and random input as the admin. The
//! answer is always a client error (REST 4xx; gRPC anything but INTERNAL, UNKNOWN or
//! DATA_LOSS) and the server keeps serving. Bodies and messages come from proptest's
//! generators with a fixed seed per run; the case counts are bounded to keep the file under
//! half a minute.

mod common;

use common::raw_grpc::RawCodec;
use common::{http_request, TestServer};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use tonic::Code;

/// A server whose admin key is not rate-limited, so every request reaches the handler.
fn server() -> TestServer {
    TestServer::start_with(common::Options {
        config_yaml:
            "rate_limit:\n  requests_per_second: 100000\n  burst: 100000\n  max_in_flight: 64\n"
                .into(),
        ..Default::default()
    })
}

/// (method, path) of every route that takes a body, path parameters filled with `x`.
fn body_routes(server: &TestServer) -> Vec<(String, String)> {
    let document = server
        .request("GET", "/api/v1/openapi.json", Some(&server.admin_key), None)
        .json();
    let mut routes = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        let path: String = path
            .split('/')
            .map(|part| if part.starts_with('{') { "x" } else { part })
            .collect::<Vec<_>>()
            .join("/");
        for method in ["post", "put", "patch"] {
            if item.get(method).is_some() {
                routes.push((method.to_uppercase(), path.clone()));
            }
        }
    }
    assert!(!routes.is_empty(), "{routes:?}");
    routes
}

/// JSON text that is wrong in every way a parser can be hurt.
fn hostile_json() -> impl Strategy<Value = Vec<u8>> {
    let scalar = prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        Just("-0".to_string()),
        Just("1e999".to_string()),
        Just("-99999999999999999999999".to_string()),
        Just("\"\\ud800\"".to_string()),
        Just("\"\\u0000\"".to_string()),
        "\"[ -~]{0,20}\"",
        any::<i64>().prop_map(|n| n.to_string()),
    ];
    let value = scalar.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4)
                .prop_map(|items| format!("[{}]", items.join(","))),
            proptest::collection::vec(
                (
                    proptest::sample::select(vec![
                        "name", "role", "value", "path", "id", "data", "ttl", "labels", "x"
                    ]),
                    inner
                ),
                0..4
            )
            .prop_map(|pairs| {
                let fields: Vec<String> = pairs
                    .into_iter()
                    .map(|(key, value)| format!("\"{key}\":{value}"))
                    .collect();
                format!("{{{}}}", fields.join(","))
            }),
        ]
    });
    prop_oneof![
        value.prop_map(String::into_bytes),
        // Deep nesting: arrays and objects far past any sane depth.
        (1usize..20_000).prop_map(|depth| ("[".repeat(depth) + &"]".repeat(depth)).into_bytes()),
        (1usize..20_000).prop_map(|depth| "{\"a\":".repeat(depth).into_bytes()),
        // Truncated and random bytes.
        proptest::collection::vec(any::<u8>(), 0..256),
        Just(b"{\"name\":\"a\",\"name\":\"b\"}".to_vec()),
        Just(b"{\"name\":\"\xff\xfe\"}".to_vec()),
        // A big string inside the body limit.
        (1usize..900_000)
            .prop_map(|len| format!("{{\"name\":\"{}\"}}", "a".repeat(len)).into_bytes()),
    ]
}

#[test]
fn rest_bodies_never_get_a_server_error() {
    let server = server();
    let routes = body_routes(&server);
    let auth = format!("Bearer {}", server.admin_key);
    let mut runner = TestRunner::deterministic();
    let strategy = hostile_json();
    let mut sent = 0;
    for round in 0..64 {
        for (method, path) in &routes {
            let body = strategy.new_tree(&mut runner).unwrap().current();
            let response = http_request(
                server.http,
                method,
                path,
                &[("Authorization", &auth)],
                Some(&body),
            )
            .unwrap_or_else(|e| panic!("{method} {path} round {round}: {e}"));
            sent += 1;
            assert!(
                (400..500).contains(&response.status) || response.status < 300,
                "{method} {path} with {:?}: {} {}",
                String::from_utf8_lossy(&body[..body.len().min(200)]),
                response.status,
                response.body
            );
        }
    }
    // Oversized: past limits.max_request_body, on every route.
    let big = vec![b' '; 2 * 1024 * 1024];
    for (method, path) in &routes {
        let response = http_request(
            server.http,
            method,
            path,
            &[("Authorization", &auth)],
            Some(&big),
        )
        .unwrap();
        // A route that needs no body answers for its path first: unquarantining an agent that
        // does not exist is 404 whatever the body.
        assert!(
            response.status == 413 || (response.status == 404 && path.ends_with("/unquarantine")),
            "{method} {path}: {}",
            response.status
        );
    }
    eprintln!("{sent} hostile bodies over {} routes", routes.len());
    assert_eq!(
        server.request("GET", "/health/ready", None, None).status,
        200
    );
}

/// Every method of every svc service, from the descriptor the server also serves: (path,
/// whether the client streams, whether the server streams).
fn grpc_methods() -> Vec<(String, bool, bool)> {
    use prost::Message;
    let set = prost_types::FileDescriptorSet::decode(svc::proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut methods = Vec::new();
    for file in &set.file {
        for service in &file.service {
            for method in &service.method {
                methods.push((
                    format!("/{}.{}/{}", file.package(), service.name(), method.name()),
                    method.client_streaming(),
                    method.server_streaming(),
                ));
            }
        }
    }
    assert!(methods.len() > 20, "{methods:?}");
    methods
}

/// Bytes that are not the message the method expects: random, truncated varints, wrong wire
/// types, absurd lengths, and groups nested far past prost's recursion limit.
fn hostile_protobuf() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..128),
        Just(vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]),
        Just(vec![
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01
        ]),
        Just(vec![0x0d, 0x01]),
        Just(vec![0x0b; 4096]),
        (1usize..2000).prop_map(|depth| {
            // Field 1 as a length-delimited submessage, nested `depth` times.
            let mut message = Vec::new();
            for _ in 0..depth {
                let mut outer = vec![0x0a];
                let mut length = message.len();
                loop {
                    let byte = (length & 0x7f) as u8;
                    length >>= 7;
                    if length == 0 {
                        outer.push(byte);
                        break;
                    }
                    outer.push(byte | 0x80);
                }
                outer.extend_from_slice(&message);
                message = outer;
            }
            message
        }),
        (0u32..40, proptest::collection::vec(any::<u8>(), 0..64)).prop_map(|(field, bytes)| {
            let mut message = vec![((field << 3) | 2) as u8, bytes.len() as u8];
            message.extend_from_slice(&bytes);
            message
        }),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_messages_never_get_an_internal_error() {
    let server = server();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut runner = TestRunner::deterministic();
    let strategy = hostile_protobuf();
    let methods = grpc_methods();
    let mut codes = std::collections::BTreeMap::<String, usize>::new();
    for round in 0..6 {
        for (path, client_streaming, server_streaming) in &methods {
            let body = if round == 5 {
                // Past the server's decoding limit (tonic's 4 MiB default).
                vec![0u8; 5 * 1024 * 1024]
            } else {
                strategy.new_tree(&mut runner).unwrap().current()
            };
            let mut grpc = tonic::client::Grpc::new(channel.clone());
            grpc.ready().await.unwrap();
            let path: http::uri::PathAndQuery = path.parse().unwrap();
            let request = |message: Vec<u8>| {
                let mut request = tonic::Request::new(message);
                request.metadata_mut().insert(
                    "authorization",
                    format!("Bearer {}", server.admin_key).parse().unwrap(),
                );
                request
            };
            let status = match (client_streaming, server_streaming) {
                (false, false) => grpc
                    .unary(request(body.clone()), path.clone(), RawCodec)
                    .await
                    .err(),
                (false, true) => match grpc
                    .server_streaming(request(body.clone()), path.clone(), RawCodec)
                    .await
                {
                    Err(status) => Some(status),
                    Ok(response) => {
                        let mut stream = response.into_inner();
                        tokio::time::timeout(
                            std::time::Duration::from_millis(300),
                            stream.message(),
                        )
                        .await
                        .ok()
                        .and_then(|message| message.err())
                    }
                },
                (true, _) => {
                    let messages = tokio_stream::iter(vec![body.clone()]);
                    let mut streaming = tonic::Request::new(messages);
                    *streaming.metadata_mut() = request(Vec::new()).metadata().clone();
                    match tokio::time::timeout(
                        std::time::Duration::from_secs(2),
                        grpc.client_streaming(streaming, path.clone(), RawCodec),
                    )
                    .await
                    {
                        Ok(result) => result.err(),
                        Err(_) => None,
                    }
                }
            };
            let code = status.as_ref().map_or(Code::Ok, |status| status.code());
            *codes.entry(format!("{code:?}")).or_default() += 1;
            assert!(
                !matches!(code, Code::Internal | Code::Unknown | Code::DataLoss),
                "{path} with {} bytes ({:02x?}...): {status:?}",
                body.len(),
                &body[..body.len().min(16)]
            );
        }
    }
    eprintln!("gRPC answers to hostile messages: {codes:?}");
    assert_eq!(
        server.request("GET", "/health/ready", None, None).status,
        200
    );
}
