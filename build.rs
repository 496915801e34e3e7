//! Build script: compiles proto/ with protox (pure Rust, so no system `protoc`), generates the
//! tonic services, and stamps the version line with the git commit and build date.

use std::path::PathBuf;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

const PROTOS: &[&str] = &[
    "proto/svc/v1/common.proto",
    "proto/svc/v1/events.proto",
    "proto/svc/v1/policy.proto",
    "proto/svc/v1/identity.proto",
    "proto/svc/v1/secrets.proto",
    "proto/svc/v1/cluster.proto",
    "proto/svc/v1/fleet.proto",
    "proto/svc/v1/webhooks.proto",
    "proto/svc/v1/runbooks.proto",
    "proto/svc/v1/blueprint.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    // Server reflection serves this descriptor set, so grpcurl works without the protos.
    std::fs::write(
        out_dir.join("svc_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        // RPCs that later work fills in answer Unimplemented until then.
        .generate_default_stubs(true)
        // A message that does not decode is INVALID_ARGUMENT, not INTERNAL (src/codec.rs).
        .codec_path("crate::codec::ProtoCodec")
        .compile_fds(descriptors)?;
    // The generated stubs say "Not yet implemented"; every surface of ours says
    // "not implemented yet", so operators can grep for one phrase.
    let generated = out_dir.join("svc.v1.rs");
    let text = std::fs::read_to_string(&generated)?;
    std::fs::write(
        &generated,
        text.replace("Not yet implemented", "not implemented yet"),
    )?;

    minify_openapi(&out_dir)?;
    stamp_version();
    stamp_rustc_version();
    Ok(())
}

/// Writes src/server/http/openapi.json without the white space between its tokens to
/// OUT_DIR: the file is kept pretty for its readers and diffs, the binary carries 52 KB
/// instead of 86 KB (a third of the file is indentation).
fn minify_openapi(out_dir: &std::path::Path) -> std::io::Result<()> {
    const SOURCE: &str = "src/server/http/openapi.json";
    println!("cargo:rerun-if-changed={SOURCE}");
    let text = std::fs::read_to_string(SOURCE)?;
    let mut compact = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            compact.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
            compact.push(c);
        } else if !c.is_ascii_whitespace() {
            compact.push(c);
        }
    }
    std::fs::write(out_dir.join("openapi.min.json"), compact)
}

/// Sets BUILT_RUSTC_VERSION (`rust1.85.0`) for the bus INFO's `go` field, where nats-server
/// names its runtime (`go1.19.8`).
///
/// Every value this script sets is named BUILT_*, never SVC_*: Cargo also puts `rustc-env`
/// values in the environment of what `cargo run` and `cargo test` start, and the server and
/// the agent read SVC_* variables as configuration and refuse a key they do not know.
fn stamp_rustc_version() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=BUILT_RUSTC_VERSION=rust{version}");
}

/// Sets BUILT_GIT_COMMIT and BUILT_DATE for the `-v/--version` line.
fn stamp_version() {
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    // scripts/dist sets it to the last commit's time: the date must follow it, not the cache.
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let commit = Command::new("git")
        .args(["rev-parse", "--short=7", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    // SOURCE_DATE_EPOCH keeps reproducible builds reproducible.
    let seconds = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0)
        });
    let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
    println!("cargo:rustc-env=BUILT_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=BUILT_DATE={year:04}-{month:02}-{day:02}");
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}
