//! What checking an agent's signature costs the server per result or heartbeat
//! (`fleet::agent_signature`), and signing costs the agent: a heartbeat-sized message signed
//! and verified --count times (default 2000) with a fresh P-256 key.
//!
//! Usage: cargo bench --bench agent_signature [-- --count 2000]; on the debug build,
//! `cargo bench --profile dev --bench agent_signature`.

#[path = "common/run.rs"]
mod run;

use std::time::Instant;

use svc::fleet::agent_signature::{verify, AgentSigner};

fn main() {
    let count: u32 = run::flag("--count", 2000);
    let key = rcgen::KeyPair::generate().expect("a P-256 key");
    let signer = AgentSigner::from_pkcs8_pem(&key.serialize_pem()).expect("its PKCS#8");
    let public_key = key.public_key_raw().to_vec();
    let subject = "svc.agent.web-01.heartbeat";
    let payload =
        br#"{"version":"0.1.0","hostname":"web-01","running_jobs":0,"sent_at_ms":1764300000000}"#;

    let started = Instant::now();
    let mut signatures = Vec::with_capacity(count as usize);
    for _ in 0..count {
        signatures.push(signer.sign(subject, payload).expect("signed"));
    }
    let signing = started.elapsed() / count.max(1);

    let started = Instant::now();
    for signature in &signatures {
        assert!(verify(&public_key, subject, payload, signature));
    }
    let verifying = started.elapsed() / count.max(1);
    println!(
        "{count} heartbeats of {} bytes: sign {:.1} µs, verify {:.1} µs each",
        payload.len(),
        signing.as_secs_f64() * 1e6,
        verifying.as_secs_f64() * 1e6
    );
}
