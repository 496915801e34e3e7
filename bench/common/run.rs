//! What every bench's `main` may share, whether or not it starts a server: its size flags
//! (`--name VALUE` after cargo's `--`), so that CI runs each bench once at a tiny size
//! (.ci/run), and what a bench does when a peer program it needs is missing.
//!
//! Benches with `mod common;` reach it as `common::run`; the others include this file alone
//! (`#[path = "common/run.rs"] mod run;`).

#![allow(dead_code)] // each bench uses some of it

/// The value after `name` on the command line (`--seconds 3`), or `default` when the flag is
/// absent. A flag given with a value that does not parse is a mistake, not the default.
pub fn flag<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|arg| arg == name) {
        None => default,
        Some(index) => args
            .get(index + 1)
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("{name} needs a value (a number)")),
    }
}

/// Seconds (fractions allowed) as a duration, from `flag`.
pub fn seconds_flag(name: &str, default: f64) -> std::time::Duration {
    std::time::Duration::from_secs_f64(flag(name, default).max(0.0))
}

/// A peer program the bench needs (`what`) is missing. With `CI` set this is a failure, since
/// .ci/run installs every peer a bench uses; otherwise the bench (or `part` of it) is skipped
/// with the reason and how to install it printed.
pub fn missing_peer(what: &str, install: &str, part: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{what} not found, and CI is set (.ci/run installs it: {install})");
    }
    println!("skip: {what} not found ({install}); {part} skipped");
}
