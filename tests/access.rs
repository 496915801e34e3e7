//! Who may do what, on every surface, against the one table in `svc::auth::access`:
//! every gRPC method and REST route is called with each role and with no key, and every
//! representative bus subject is published and subscribed to; the answers must match the
//! table, and a method or route without a row fails the test. Then, with stock NATS clients
//! (async-nats and nats-py), the attacks contract §7 closes: an admin key commanding an agent
//! directly, a forged result, an operator publishing a fake event.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::raw_grpc::RawCodec;
use common::{run, Run, TestServer};
use futures_util::StreamExt;
use prost::Message;
use svc::auth::access::{self, Access};
use svc::auth::Role;

/// (label, role, key) for no key and each role, lowest first: a denied call must never have
/// changed anything the higher roles' calls then see.
fn callers(server: &TestServer) -> Vec<(&'static str, Option<Role>, Option<String>)> {
    let (_, readonly) = server.create_key("matrix-readonly", "readonly");
    let (_, operator) = server.create_key("matrix-operator", "operator");
    vec![
        ("no key", None, None),
        ("readonly", Some(Role::Readonly), Some(readonly)),
        ("operator", Some(Role::Operator), Some(operator)),
        ("admin", Some(Role::Admin), Some(server.admin_key.clone())),
    ]
}

/// Every `svc.v1` method with its streaming shape, from the compiled descriptor set.
fn grpc_methods() -> Vec<(String, bool, bool)> {
    let set = prost_types::FileDescriptorSet::decode(svc::proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut methods = Vec::new();
    for file in set.file {
        for service in &file.service {
            for method in &service.method {
                methods.push((
                    format!("{}.{}/{}", file.package(), service.name(), method.name()),
                    method.client_streaming(),
                    method.server_streaming(),
                ));
            }
        }
    }
    methods
}

/// Calls `path` with an empty request message; returns the status code it ended with (Ok
/// when the call or its first message succeeded).
async fn call(
    channel: tonic::transport::Channel,
    path: &str,
    client_streaming: bool,
    server_streaming: bool,
    key: Option<&str>,
) -> tonic::Code {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let name = path;
    let path: http::uri::PathAndQuery = format!("/{path}").parse().unwrap();
    let codec = tonic_prost::ProstCodec::<svc::proto::Empty, svc::proto::Empty>::default();
    let code = |result: Result<(), tonic::Status>| match result {
        Ok(()) => tonic::Code::Ok,
        Err(status) => status.code(),
    };
    let call = async {
        match (client_streaming, server_streaming) {
            (false, false) => code(
                grpc.unary(
                    with_key(key, tonic::Request::new(svc::proto::Empty {})),
                    path,
                    codec,
                )
                .await
                .map(drop),
            ),
            (false, true) => {
                let request = with_key(key, tonic::Request::new(svc::proto::Empty {}));
                match grpc.server_streaming(request, path, codec).await {
                    Err(status) => status.code(),
                    Ok(response) => {
                        let mut stream = response.into_inner();
                        // A live stream may send nothing for a while: that is past the check.
                        match tokio::time::timeout(Duration::from_millis(500), stream.message())
                            .await
                        {
                            Ok(result) => code(result.map(drop)),
                            Err(_) => tonic::Code::Ok,
                        }
                    }
                }
            }
            (true, _) => {
                let messages = tokio_stream::iter(Vec::<svc::proto::Empty>::new());
                let request = with_key(key, tonic::Request::new(messages));
                if server_streaming {
                    code(grpc.streaming(request, path, codec).await.map(drop))
                } else {
                    code(grpc.client_streaming(request, path, codec).await.map(drop))
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .unwrap_or_else(|_| panic!("{name} did not answer"))
}

fn with_key<T>(key: Option<&str>, mut request: tonic::Request<T>) -> tonic::Request<T> {
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    request
}

fn is_denied(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_grpc_method_answers_each_role_as_the_table_says() {
    let server = TestServer::start();
    let methods = grpc_methods();

    // A method without a row, or a row without a method, fails here.
    let listed: Vec<&str> = access::GRPC.iter().map(|(name, _)| *name).collect();
    for (name, _, _) in &methods {
        assert!(
            listed.contains(&name.as_str()),
            "gRPC method {name} has no row in auth::access::GRPC"
        );
    }
    for name in &listed {
        assert!(
            methods.iter().any(|(m, _, _)| m == name),
            "auth::access::GRPC names {name}, which no service has"
        );
    }

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut failures = Vec::new();
    for (label, role, key) in callers(&server) {
        for (name, client_streaming, server_streaming) in &methods {
            let access = access::grpc_access(name).unwrap();
            let got = call(
                channel.clone(),
                name,
                *client_streaming,
                *server_streaming,
                key.as_deref(),
            )
            .await;
            let expected_allowed = access.allows(role);
            let wrong = if expected_allowed {
                is_denied(got)
                    || (access == Access::RefusedByDesign && got != tonic::Code::Unimplemented)
            } else if role.is_none() {
                got != tonic::Code::Unauthenticated
            } else {
                got != tonic::Code::PermissionDenied
            };
            if wrong {
                failures.push(format!(
                    "{name} as {label}: got {got:?}, table says {access:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_rest_route_answers_each_role_as_the_table_says() {
    let server = TestServer::start();
    // The routes the server documents are the routes it has: each needs a row.
    let document = server
        .request("GET", "/api/v1/openapi.json", None, None)
        .json();
    let mut documented = Vec::new();
    for (path, operations) in document["paths"].as_object().unwrap() {
        for method in operations.as_object().unwrap().keys() {
            if method == "parameters" {
                continue;
            }
            documented.push(format!("{} {path}", method.to_uppercase()));
        }
    }
    for route in &documented {
        assert!(
            access::REST.iter().any(|(r, _)| r == route),
            "REST route {route} has no row in auth::access::REST"
        );
    }
    for (route, _) in access::REST {
        assert!(
            documented.iter().any(|r| r == route),
            "auth::access::REST names {route}, which openapi.json does not document"
        );
    }

    let mut failures = Vec::new();
    for (label, role, key) in callers(&server) {
        for (route, access) in access::REST {
            let (method, path) = route.split_once(' ').unwrap();
            let mut path = path.replace("{id}", "01JZZZZZZZZZZZZZZZZZZZZZZZ");
            if path.ends_with("/events/stream") {
                // The live tail never ends on its own; history only does.
                path.push_str("?follow=false");
            }
            let body = match method {
                "POST" => Some(format!(r#"{{"name":"matrix-{label}","role":"readonly"}}"#)),
                "PATCH" => Some(r#"{"name":"renamed"}"#.to_string()),
                _ => None,
            };
            let response = server.request(method, &path, key.as_deref(), body.as_deref());
            let denied = matches!(response.status, 401 | 403);
            let wrong = if access.allows(role) {
                denied
            } else if role.is_none() {
                response.status != 401
            } else {
                response.status != 403
            };
            if wrong {
                failures.push(format!(
                    "{route} as {label}: got {} {}, table says {access:?}",
                    response.status, response.body
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A raw bus session logged in with `token` (or anonymous): the lines up to the PONG.
fn bus_session(server: &TestServer, token: Option<&str>, ops: &str) -> Vec<String> {
    let mut connect = serde_json::json!({"verbose": false, "pedantic": false});
    if let Some(token) = token {
        connect["auth_token"] = token.into();
    }
    common::bus_session(server, &connect.to_string(), ops)
}

#[test]
fn every_bus_subject_answers_each_role_as_the_table_says() {
    let server = TestServer::start();
    let mut failures = Vec::new();
    for (label, role, key) in callers(&server) {
        let permissions = match role {
            Some(role) => access::bus_permissions(role, String::new()),
            None => svc::bus::Permissions::enrolment(),
        };
        for subject in access::BUS_SUBJECTS {
            let lines = bus_session(
                &server,
                key.as_deref(),
                &format!("SUB {subject} 1\r\nPUB {subject} 1\r\nx\r\n"),
            );
            let sub_refused = lines.contains(&format!(
                "-ERR 'Permissions Violation for Subscription to \"{subject}\"'"
            ));
            let pub_refused = lines.contains(&format!(
                "-ERR 'Permissions Violation for Publish to \"{subject}\"'"
            ));
            if sub_refused == permissions.subscribe.allows(subject)
                || pub_refused == permissions.publish.allows(subject)
            {
                failures.push(format!("{subject} as {label}: {lines:?}"));
            }
            // A message a client may both send and receive comes back to it.
            let delivered = lines.iter().any(|l| l.starts_with("MSG "));
            if delivered != (!sub_refused && !pub_refused) {
                failures.push(format!("{subject} as {label}: delivery {lines:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // The table in the docs is the one in the code.
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ARCHITECTURE.md"),
    )
    .unwrap();
    assert!(
        docs.contains(&access::role_table_markdown()),
        "docs/ARCHITECTURE.md's role table differs from auth::access; paste this:\n{}",
        access::role_table_markdown()
    );
}

fn wait_connected(server: &TestServer, id: &str) {
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
        let agents: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap_or_default();
        let connected = agents
            .as_array()
            .into_iter()
            .flatten()
            .any(|agent| agent["id"] == id && agent["state"] == "connected");
        if connected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{id} never connected: {listed:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A stock async-nats client logged in with `key`, and the errors the server sent it.
async fn stock_client(
    server: &TestServer,
    key: &str,
) -> (
    async_nats::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (errors, received) = tokio::sync::mpsc::unbounded_channel();
    let client = async_nats::ConnectOptions::with_token(key.to_string())
        .event_callback(move |event| {
            let errors = errors.clone();
            async move {
                if let async_nats::Event::ServerError(error) = event {
                    let _ = errors.send(error.to_string());
                }
            }
        })
        .connect(server.bus.as_str())
        .await
        .unwrap();
    (client, received)
}

async fn next_error(errors: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(5), errors.recv())
        .await
        .expect("no error from the server within 5 s")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_api_key_commands_an_agent_forges_a_result_or_fakes_an_event() {
    let server = TestServer::start();
    let agent = Agent::start(&server, "web-01", "role=web");
    let wait_server = &server;
    tokio::task::block_in_place(|| wait_connected(wait_server, "web-01"));
    let (_, operator) = server.create_key("ops", "operator");
    let (_, readonly) = server.create_key("watcher", "readonly");
    let marker = agent.home.path().join("commanded-by-an-api-key");

    // An admin key publishing a well-formed exec command to the agent: refused by the broker.
    let (admin, mut admin_errors) = stock_client(&server, &server.admin_key).await;
    let command = serde_json::json!({
        "job_id": "01JFORGEDFORGEDFORGEDFORGE", "timeout_ms": 5000, "kind": "exec",
        "argv": ["touch", marker.to_str().unwrap()],
    });
    admin
        .publish("svc.agent.web-01.cmd", command.to_string().into())
        .await
        .unwrap();
    admin.flush().await.unwrap();
    let error = next_error(&mut admin_errors).await;
    assert!(
        error.contains("Permissions Violation for Publish to \"svc.agent.web-01.cmd\""),
        "{error}"
    );
    // Nor may it listen in on what agents are sent or answer.
    assert!(admin.subscribe("svc.agent.>").await.is_ok()); // the SUB is sent; the server refuses
    admin.flush().await.unwrap();
    let error = next_error(&mut admin_errors).await;
    assert!(
        error.contains("Permissions Violation for Subscription to \"svc.agent.>\""),
        "{error}"
    );

    // A forged result published while a real job waits never reaches the job.
    let forged = serde_json::json!({
        "job_id": "any", "duration_ms": 1, "kind": "exec", "exit_code": 0, "stdout": "forged\n",
    });
    let exec = {
        let mut command = server.cli("svcctl");
        command.args([
            "--api-key",
            &operator,
            "-o",
            "json",
            "exec",
            "--",
            "sh",
            "-c",
            "sleep 1; echo real",
        ]);
        tokio::task::spawn_blocking(move || run(&mut command))
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    admin
        .publish("svc.agent.web-01.result", forged.to_string().into())
        .await
        .unwrap();
    admin.flush().await.unwrap();
    let error = next_error(&mut admin_errors).await;
    assert!(
        error.contains("Permissions Violation for Publish to \"svc.agent.web-01.result\""),
        "{error}"
    );
    let exec: Run = exec.await.unwrap();
    assert_eq!(exec.code, 0, "{exec:?}");
    assert!(exec.stdout.contains("real\\n"), "{exec:?}");
    assert!(!exec.stdout.contains("forged"), "{exec:?}");

    // The agent ran nothing it was sent by a key.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!marker.exists(), "an API key commanded the agent");

    // An operator publishing on svc.events.> is refused; the live feed shows nothing.
    let (watcher, _) = stock_client(&server, &readonly).await;
    let mut feed = watcher.subscribe("svc.events.>").await.unwrap();
    watcher.flush().await.unwrap();
    let (operator_client, mut operator_errors) = stock_client(&server, &operator).await;
    operator_client
        .publish(
            "svc.events.state_drift_detected",
            r#"{"type":"state_drift_detected","payload":{"fake":true}}"#.into(),
        )
        .await
        .unwrap();
    operator_client.flush().await.unwrap();
    let error = next_error(&mut operator_errors).await;
    assert!(
        error.contains("Permissions Violation for Publish to \"svc.events.state_drift_detected\""),
        "{error}"
    );
    // An event emitted the proper way arrives, and it is the first thing the feed sees.
    let emitted = tokio::task::spawn_blocking({
        let mut command = server.cli("svc-events");
        command.args([
            "--api-key",
            &operator,
            "emit",
            "--type",
            "state_drift_detected",
            "--payload",
            r#"{"real":true}"#,
        ]);
        move || run(&mut command)
    })
    .await
    .unwrap();
    assert_eq!(emitted.code, 0, "{emitted:?}");
    let first = tokio::time::timeout(Duration::from_secs(5), feed.next())
        .await
        .expect("the emitted event reaches the live feed")
        .unwrap();
    let event: serde_json::Value = serde_json::from_slice(&first.payload).unwrap();
    assert_eq!(event["payload"]["real"], true, "{event}");
    drop(agent);
}

/// The same refusals through a second stock client, nats-py (skipped when not installed).
#[test]
fn nats_py_admin_key_cannot_command_agents() {
    let probe = Command::new("python3").args(["-c", "import nats"]).output();
    if !probe.map(|o| o.status.success()).unwrap_or(false) {
        eprintln!("skipped: python3 with nats-py is not installed (pip install nats-py)");
        return;
    }
    let server = TestServer::start();
    let (_, operator) = server.create_key("ops", "operator");
    let script = r#"
import asyncio, sys
import nats

async def main(url, admin, operator):
    errors = []
    async def on_error(e):
        errors.append(str(e))
    results = {}
    for name, token, subject in [("admin", admin, "svc.agent.web-01.cmd"),
                                 ("operator", operator, "svc.events.fake")]:
        errors.clear()
        nc = await nats.connect(url, token=token, error_cb=on_error,
                                allow_reconnect=False)
        await nc.publish(subject, b'{"job_id":"x","timeout_ms":1,"kind":"exec","argv":["true"]}')
        await nc.flush()
        for _ in range(50):
            if errors:
                break
            await asyncio.sleep(0.1)
        results[name] = list(errors)
        await nc.close()
    for name, errs in results.items():
        print(name, "|".join(errs))

asyncio.run(main(*sys.argv[1:]))
"#;
    let output = Command::new("python3")
        .args(["-c", script, &server.bus, &server.admin_key, &operator])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default()
            .to_lowercase()
    };
    assert!(
        line("admin").contains("permissions violation for publish to \"svc.agent.web-01.cmd\""),
        "{stdout}"
    );
    assert!(
        line("operator").contains("permissions violation for publish to \"svc.events.fake\""),
        "{stdout}"
    );
}

/// Calls `path` with `body` as the request message (every message of a client stream);
/// returns the code the call ended with.
async fn call_raw(
    channel: tonic::transport::Channel,
    path: &str,
    (client_streaming, server_streaming): (bool, bool),
    key: &str,
    body: Vec<u8>,
) -> tonic::Code {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let name = path;
    let path: http::uri::PathAndQuery = format!("/{path}").parse().unwrap();
    let code = |result: Result<(), tonic::Status>| match result {
        Ok(()) => tonic::Code::Ok,
        Err(status) => status.code(),
    };
    let call = async {
        if client_streaming {
            let request = with_key(
                Some(key),
                tonic::Request::new(tokio_stream::iter(vec![body])),
            );
            return if server_streaming {
                code(grpc.streaming(request, path, RawCodec).await.map(drop))
            } else {
                code(
                    grpc.client_streaming(request, path, RawCodec)
                        .await
                        .map(drop),
                )
            };
        }
        let request = with_key(Some(key), tonic::Request::new(body));
        if server_streaming {
            code(
                grpc.server_streaming(request, path, RawCodec)
                    .await
                    .map(drop),
            )
        } else {
            code(grpc.unary(request, path, RawCodec).await.map(drop))
        }
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .unwrap_or_else(|_| panic!("{name} did not answer"))
}

/// The number of string field `field` in the request message of `method`.
fn request_field_number(method: &str, field: &str) -> u64 {
    let set = prost_types::FileDescriptorSet::decode(svc::proto::FILE_DESCRIPTOR_SET).unwrap();
    let (service, method) = method.split_once('/').unwrap();
    let input = set
        .file
        .iter()
        .flat_map(|file| file.service.iter().map(move |s| (file, s)))
        .find(|(file, s)| format!("{}.{}", file.package(), s.name()) == service)
        .and_then(|(_, s)| s.method.iter().find(|m| m.name() == method))
        .map(|m| m.input_type().to_string())
        .unwrap();
    let message = set
        .file
        .iter()
        .flat_map(|file| file.message_type.iter().map(move |m| (file, m)))
        .find(|(file, m)| format!(".{}.{}", file.package(), m.name()) == input)
        .map(|(_, m)| m)
        .unwrap();
    let field = message.field.iter().find(|f| f.name() == field).unwrap();
    u64::try_from(field.number()).unwrap()
}

/// The resource id the refusal's audit row must carry, given what the request named.
fn expected_id(audited: &access::Audited, named: &str) -> String {
    match audited.id {
        access::ResourceId::Empty => String::new(),
        access::ResourceId::Fixed(id) => id.to_string(),
        access::ResourceId::Field(_) | access::ResourceId::Path => named.to_string(),
    }
}

/// The role check comes before any input is read, on every surface: every gRPC method and
/// REST route a key's role may not use is called with a body that does not parse (and, for
/// REST, a query that does not either), as readonly and as operator. Each must answer
/// PERMISSION_DENIED / 403, never INVALID_ARGUMENT / 400 / 422, and leave exactly the
/// `denied` audit row `access::AUDITED` names (the resource id read from the request where
/// it says so), or none for the reads in `access::NOT_AUDITED`. The methods come from the
/// compiled descriptors and the routes from the table the other tests hold to openapi.json,
/// so a new one is driven here, and fails unless the tables say what its refusal writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_refused_gets_403_and_a_denied_row_whatever_its_input() {
    let server = TestServer::start();
    let (_, readonly) = server.create_key("refused-readonly", "readonly");
    let (_, operator) = server.create_key("refused-operator", "operator");
    let callers = [
        ("refused-readonly", Role::Readonly, readonly),
        ("refused-operator", Role::Operator, operator),
    ];
    // Wire type 7 exists in no protobuf message; `{` opens JSON that never closes.
    let garbage = [0x0f, 0xff, 0xff, 0xff];
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();

    let mut failures = Vec::new();
    let mut expected = Vec::new();
    let mut driven = 0;
    for (name, client_streaming, server_streaming) in grpc_methods() {
        let access = access::grpc_access(&name).unwrap();
        let audited = access::audited(&name);
        for (user, role, key) in &callers {
            if access.allows(Some(*role)) {
                continue;
            }
            driven += 1;
            // The id the row should name comes first, then what breaks the message.
            let named = format!("probe-{driven}");
            let mut body = Vec::new();
            if let Some(access::ResourceId::Field(field)) = audited.map(|a| a.id) {
                let number = request_field_number(&name, field);
                body.push(u8::try_from(number << 3 | 2).unwrap());
                body.push(u8::try_from(named.len()).unwrap());
                body.extend_from_slice(named.as_bytes());
            }
            body.extend_from_slice(&garbage);
            let code = call_raw(
                channel.clone(),
                &name,
                (client_streaming, server_streaming),
                key,
                body,
            )
            .await;
            if code != tonic::Code::PermissionDenied {
                failures.push(format!("{name} as {user}: got {code:?}"));
            }
            match audited {
                Some(audited) => expected.push((
                    user.to_string(),
                    audited.action.to_string(),
                    expected_id(&audited, &named),
                )),
                None if access::NOT_AUDITED.contains(&name.as_str()) => {}
                None => failures.push(format!(
                    "{name}: neither access::AUDITED nor access::NOT_AUDITED says what its refusal writes"
                )),
            }
        }
    }

    let rest_callers: Vec<_> = callers
        .iter()
        .map(|(u, r, k)| (*u, *r, k.clone()))
        .collect();
    let rest = tokio::task::block_in_place(|| {
        let mut failures = Vec::new();
        let mut expected = Vec::new();
        for (route, access) in access::REST {
            let audited = access::audited(route);
            let (method, template) = route.split_once(' ').unwrap();
            for (user, role, key) in &rest_callers {
                if access.allows(Some(*role)) {
                    continue;
                }
                let named = format!("probe-{user}");
                let path = format!("{}?limit=many&%zz", template.replace("{id}", &named));
                let body =
                    matches!(method, "POST" | "PATCH" | "PUT" | "DELETE").then_some("{\"name\":");
                let response = server.request(method, &path, Some(key), body);
                if response.status != 403 {
                    failures.push(format!(
                        "{route} as {user}: got {} {}",
                        response.status, response.body
                    ));
                }
                match audited {
                    Some(audited) => expected.push((
                        user.to_string(),
                        audited.action.to_string(),
                        expected_id(&audited, &named),
                    )),
                    None if access::NOT_AUDITED.contains(route) => {}
                    None => failures.push(format!(
                        "{route}: neither access::AUDITED nor access::NOT_AUDITED says what its refusal writes"
                    )),
                }
            }
        }
        (failures, expected)
    });
    failures.extend(rest.0);
    expected.extend(rest.1);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        driven >= 40,
        "only {driven} gRPC refusals driven: the descriptors or the table lost methods"
    );

    // Exactly one denied row per audited refusal: written by the check, not also by a
    // domain function behind it.
    let admin = server.admin_key.clone();
    let page = tokio::task::block_in_place(|| {
        server
            .request(
                "GET",
                "/api/v1/audit?outcome=denied&limit=1000",
                Some(&admin),
                None,
            )
            .json()
    });
    let mut got: Vec<(String, String, String)> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| callers.iter().any(|(user, _, _)| row["user"] == *user))
        .map(|row| {
            (
                row["user"].as_str().unwrap().to_string(),
                row["action"].as_str().unwrap().to_string(),
                row["resource_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    expected.sort();
    assert_eq!(got, expected);
}
