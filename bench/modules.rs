//! Module benchmark, in-process: a trivial exported function (one file resource built from
//! its argument) called 10,000 times on a module whose main.star is evaluated once, through
//! the same sandbox as `svc-module run` (step limiter, builtins, resource checks). Prints
//! calls/s and the mean time of one call; also the cost of a cold call (load + call).
//!
//! Usage: cargo bench --bench modules [-- --calls N]
//! The cold start of a module run on an agent is not measured: `run --target` is not built.

use std::collections::BTreeMap;
use std::time::Instant;

use svc::modules::sandbox::{self, Facts, Limits, Loaded};
use svc::modules::Module;

fn main() {
    let mut calls = 10_000usize;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--calls") {
        calls = args[i + 1].parse().expect("--calls N");
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
    let facts = Facts::of_this_host();
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
}
