//! The `tree` state kind at scale: a source directory of N small files (default 10,000, in
//! 100 directories) compiled into one plan and applied on a real svc-agent of this build
//! through a real server: the first apply (every file created), a second (nothing to change),
//! and one after 1% of the files were edited on the host. Times are as the agent reports
//! them (command received to reply, fetching a stored plan included) and end to end (gRPC
//! call to the result). At the default size the plan (about 620 KiB) is past what a command
//! carries, so it travels by SHA-256 (`fleet::content`): the first apply fetches it, the
//! later ones find its chunks in the agent's cache.
//!
//! The reference, in the same run on the same disk: `cp -r` of the source followed by `sync`
//! (the copy's own floor, with the durability the tree gives), and `diff -r` of two identical
//! trees (what a "nothing to change" pass must at least read).
//!
//! Usage: cargo bench --bench state_tree [-- --files N]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use svc::proto::fleet_service_client::FleetServiceClient;
use svc::proto::{ExecRequest, StateRequest};

mod common;
use common::{authorized, spawn_real_agent, Server};

fn main() {
    let mut files = 10_000usize;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--files") {
        files = args[i + 1].parse().expect("--files N");
    }
    let work = tempfile::tempdir().unwrap();
    let source = work.path().join("states/site");
    make_source(&source, files);
    let state_file = work.path().join("states/site.yaml");
    let dest = work.path().join("www");
    std::fs::write(
        &state_file,
        format!("- tree: {{path: {}, source: site}}\n", dest.display()),
    )
    .unwrap();

    let started = Instant::now();
    let plan = svc::state::compile(
        &std::fs::read_to_string(&state_file).unwrap(),
        state_file.parent().unwrap(),
    )
    .expect("compile");
    let compiled = started.elapsed();
    let plan_json = serde_json::to_string(&plan).unwrap();
    let travels = if plan_json.len() > svc::fleet::content::INLINE_PLAN_BYTES {
        "stored by the server, fetched by the agent by SHA-256"
    } else {
        "inline in the command"
    };
    println!(
        "state_tree: {files} files, plan {} KiB ({travels}), compiled in {}",
        plan_json.len() / 1024,
        ms(compiled)
    );

    let reference = references(&source, work.path());

    let server = Server::start(tempfile::tempdir().unwrap(), "");
    let mut agent = spawn_real_agent(&server, "bench-agent");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = FleetServiceClient::connect(server.grpc.clone())
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let request = ExecRequest {
                target: "bench-agent".into(),
                argv: vec!["true".into()],
                ..Default::default()
            };
            let mut stream = client
                .exec(authorized(&server.key, request))
                .await
                .unwrap()
                .into_inner();
            let result = stream.message().await.unwrap().unwrap();
            if result.status == "ok" {
                break;
            }
            assert!(Instant::now() < deadline, "agent not connected: {result:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let apply = |label: &'static str, expect: &'static str| {
            let mut client = client.clone();
            let request = StateRequest {
                target: "bench-agent".into(),
                plan: plan_json.clone(),
                ..Default::default()
            };
            let key = server.key.clone();
            async move {
                let started = Instant::now();
                let mut stream = client
                    .state_apply(authorized(&key, request))
                    .await
                    .unwrap()
                    .into_inner();
                let result = stream.message().await.unwrap().unwrap();
                let took = started.elapsed();
                assert_eq!(result.status, expect, "{label}: {result:?}");
                let detail = &result.outcomes[0].detail;
                println!(
                    "  {label:<28} agent {:>9}   end to end {:>9}   ({detail})",
                    ms(Duration::from_millis(result.duration_ms)),
                    ms(took)
                );
                Duration::from_millis(result.duration_ms)
            }
        };
        let profile = if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        };
        println!("on a real agent ({profile} build):");
        let first = apply("first apply", "changed").await;
        let second = apply("second apply (no change)", "ok").await;
        for n in (0..files).step_by(100) {
            let path = dest.join(format!("d{:02}/f{n:05}.txt", n % 100));
            std::fs::write(path, "edited\n").unwrap();
        }
        let third = apply("after 1% edited on the host", "changed").await;
        println!(
            "goals: first ≤ 2 s: {} ({:.2}x of the goal); second ≤ 1 s: {} ({:.2}x)",
            if first <= Duration::from_secs(2) {
                "met"
            } else {
                "missed"
            },
            first.as_secs_f64() / 2.0,
            if second <= Duration::from_secs(1) {
                "met"
            } else {
                "missed"
            },
            second.as_secs_f64()
        );
        println!(
            "against the reference: first / (cp -r + sync) {:.2}x; second / diff -r {:.2}x; \
             repair {}",
            first.as_secs_f64() / reference.copy.as_secs_f64(),
            second.as_secs_f64() / reference.compare.as_secs_f64(),
            ms(third)
        );
    });
    let _ = agent.kill();
    let _ = agent.wait();
}

struct Reference {
    copy: Duration,
    compare: Duration,
}

fn references(source: &Path, work: &Path) -> Reference {
    let copy_dest = work.join("cp-copy");
    let started = Instant::now();
    run(Command::new("cp").arg("-r").arg(source).arg(&copy_dest));
    run(&mut Command::new("sync"));
    let copy = started.elapsed();
    let started = Instant::now();
    run(Command::new("diff").arg("-r").arg(source).arg(&copy_dest));
    let compare = started.elapsed();
    println!(
        "reference on this disk: cp -r + sync {}, diff -r of identical trees {}",
        ms(copy),
        ms(compare)
    );
    Reference { copy, compare }
}

fn run(command: &mut Command) {
    let status = command.status().expect("run");
    assert!(status.success(), "{command:?}: {status}");
}

/// `files` small text files spread over 100 directories.
fn make_source(root: &Path, files: usize) {
    for d in 0..100 {
        std::fs::create_dir_all(root.join(format!("d{d:02}"))).unwrap();
    }
    for n in 0..files {
        let path = root.join(format!("d{:02}/f{n:05}.txt", n % 100));
        std::fs::write(path, format!("file {n}\n")).unwrap();
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}
