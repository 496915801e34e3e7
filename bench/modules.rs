//! Module benchmark, in-process: a trivial exported function (one file resource built from
//! its argument) called 10,000 times on a module whose main.star is evaluated once, through
//! the same sandbox as `svc-module run` (step limiter, builtins, resource checks). Prints
//! calls/s and the mean time of one call; also the cost of a cold call (load + call).
//!
//! Then on a real server and a real svc-agent (this build, enrolled with its PSK): the cold
//! start of a module run on an agent, `FleetService.ModuleRun` of the same function writing
//! one file (the agent decodes and checks the ZIP, evaluates main.star, calls, applies),
//! side by side with `StateApply` of the same one-file plan and `Exec` of `true` through the
//! same server and agent: the fleet's own round trip, the floor a module run stands on.
//! Rounds alternate; medians, end to end (gRPC call to the agent's result) and as the agent
//! reports it (command received to reply).
//!
//! Usage: cargo bench --bench modules [-- --calls N --rounds R]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use svc::modules::sandbox::{self, Limits, Loaded};
use svc::modules::Module;
use svc::proto::fleet_service_client::FleetServiceClient;
use svc::proto::{self, ExecRequest, ModuleRunRequest, ModuleZip, StateRequest};

mod common;
use common::{authorized, spawn_real_agent, Server};

fn main() {
    let mut calls = 10_000usize;
    let mut rounds = 20usize;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--calls") {
        calls = args[i + 1].parse().expect("--calls N");
    }
    if let Some(i) = args.iter().position(|a| a == "--rounds") {
        rounds = args[i + 1].parse().expect("--rounds R");
    }
    let mut files = BTreeMap::new();
    files.insert(
        "module.yaml".to_string(),
        b"name: bench\nversion: 1.0.0\nexports:\n  motd:\n    parameters:\n      message: {type: string}\n".to_vec(),
    );
    files.insert(
        "main.star".to_string(),
        b"def motd(message):\n    return [file(\"/etc/motd\", content = message)]\n".to_vec(),
    );
    let module = Module::from_files(files).expect("module");
    let deps = BTreeMap::new();
    let facts = svc::facts::collect();
    let mut args = BTreeMap::new();
    args.insert("message".to_string(), serde_json::Value::from("hello"));

    let cold = Instant::now();
    let run =
        sandbox::call(&module, &deps, "motd", &args, &facts, Limits::default()).expect("call");
    let cold = cold.elapsed();
    assert_eq!(run.resources.len(), 1);

    let loaded = Loaded::new(&module, &deps, &facts, Limits::default()).expect("load");
    let start = Instant::now();
    for _ in 0..calls {
        let run = loaded.call("motd", &args).expect("call");
        assert_eq!(run.resources.len(), 1);
    }
    let elapsed = start.elapsed();
    let per_second = calls as f64 / elapsed.as_secs_f64();
    println!("modules: {calls} calls of a trivial exported function in {elapsed:.2?}: {per_second:.0} calls/s, {:.1} µs/call", elapsed.as_secs_f64() * 1e6 / calls as f64);
    println!("modules: cold call (evaluate main.star + call): {cold:.2?}");

    on_agent(&module, rounds);
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// A real svc-agent of this build, enrolled on `server`, killed on drop.
struct Agent(std::process::Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_agent(server: &Server, id: &str) -> Agent {
    Agent(spawn_real_agent(server, id))
}

/// The cold start of a module run on a real agent, beside a state apply and an exec.
fn on_agent(module: &Module, rounds: usize) {
    let server = Server::start(tempfile::tempdir().unwrap(), "");
    let _agent = start_agent(&server, "bench-agent");
    let out = server.root.path().join("motd");
    let zip = module.to_zip().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = FleetServiceClient::connect(server.grpc.clone()).await.unwrap();
        // Connected: an exec answers.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let request = ExecRequest { target: "bench-agent".into(), argv: vec!["true".into()], ..Default::default() };
            let mut stream = client.exec(authorized(&server.key, request)).await.unwrap().into_inner();
            let result = stream.message().await.unwrap().unwrap();
            if result.status == "ok" {
                break;
            }
            assert!(Instant::now() < deadline, "agent not connected: {result:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let plan = serde_json::json!({"resources": [{"file": {"path": out.display().to_string(), "content": "hello"}}]}).to_string();
        let (mut modules, mut states, mut execs) = (Vec::new(), Vec::new(), Vec::new());
        let (mut module_agent, mut state_agent, mut exec_agent) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..=rounds {
            let started = Instant::now();
            let request = ModuleRunRequest {
                target: "bench-agent".into(),
                module: Some(ModuleZip { zip: zip.clone(), signature: String::new() }),
                function: "motd".into(),
                args: vec!["message=hello".into()],
                ..Default::default()
            };
            let mut stream = client.module_run(authorized(&server.key, request)).await.unwrap().into_inner();
            let result: proto::StateResult = stream.message().await.unwrap().unwrap();
            let module_took = started.elapsed();
            assert!(matches!(result.status.as_str(), "ok" | "changed"), "{result:?}");
            let module_reported = Duration::from_millis(result.duration_ms);

            let started = Instant::now();
            let request = StateRequest { target: "bench-agent".into(), plan: plan.clone(), ..Default::default() };
            let mut stream = client.state_apply(authorized(&server.key, request)).await.unwrap().into_inner();
            let result = stream.message().await.unwrap().unwrap();
            let state_took = started.elapsed();
            assert!(matches!(result.status.as_str(), "ok" | "changed"), "{result:?}");
            let state_reported = Duration::from_millis(result.duration_ms);

            let started = Instant::now();
            let request = ExecRequest { target: "bench-agent".into(), argv: vec!["true".into()], ..Default::default() };
            let mut stream = client.exec(authorized(&server.key, request)).await.unwrap().into_inner();
            let result = stream.message().await.unwrap().unwrap();
            let exec_took = started.elapsed();
            assert_eq!(result.status, "ok", "{result:?}");
            if round == 0 {
                continue; // warm-up: first connections, the page cache
            }
            modules.push(module_took);
            module_agent.push(module_reported);
            states.push(state_took);
            state_agent.push(state_reported);
            execs.push(exec_took);
            exec_agent.push(Duration::from_millis(result.duration_ms));
        }
        let (module, state, exec) = (median(modules), median(states), median(execs));
        println!("\nmodule run on a real agent, median of {rounds} (end to end; as the agent reports it):");
        println!("  ModuleRun (cold: decode, check, evaluate, call, apply): {}; {}", ms(module), ms(median(module_agent)));
        println!("  StateApply of the same one-file plan:                  {}; {}", ms(state), ms(median(state_agent)));
        println!("  Exec of `true` (the fleet's round trip):               {}; {}", ms(exec), ms(median(exec_agent)));
        println!(
            "  module/state: {:.2}x   module/exec: {:.2}x   cost of the module itself: {}",
            module.as_secs_f64() / state.as_secs_f64(),
            module.as_secs_f64() / exec.as_secs_f64(),
            ms(module.saturating_sub(state))
        );
    });
}
