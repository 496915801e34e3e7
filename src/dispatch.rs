//! The table of names → entry functions, and argv[0] dispatch (contract §1).
//!
//! The basename of argv[0] picks the mode (`svc-server`, `svcctl`, `svc-events`, ...). Invoked
//! as `svc`, the next argument does (`svc server`, `svc events`, `svc ctl`), so `cargo run --
//! server` works. `svc --list` prints every name; install.sh makes one symlink per name.

use std::ffi::OsString;

use crate::cli::planned::{svc_help, SVC_WORDS};
use crate::cli::{self, exit};
use crate::program::NAMES;

/// A mode's entry point: program name and arguments in, exit code out.
type Main = fn(&str, Vec<String>) -> i32;

/// The entry function of each name the binary answers to (`program::NAMES`, besides `svc`
/// itself).
fn entry(name: &str) -> Option<Main> {
    Some(match name {
        "svc-server" => crate::server::main,
        "svcctl" => svcctl,
        "svc-migrate" => cli::migrate::main,
        "svc-agent" => crate::agent::main,
        "svc-audit" => cli::audit::main,
        "svc-events" => cli::events::main,
        "svc-identity" => cli::identity::main,
        "svc-secrets" => cli::secrets::main,
        "svc-policy" => cli::policy::main,
        "svc-cluster" => cli::cluster::main,
        "svc-cluster-backup" => cli::cluster::backup_main,
        "svc-files" => cli::files::main,
        "svc-backup" => cli::backup::main,
        "svc-blueprint" => cli::blueprint::main,
        "svc-bootstrap" => cli::bootstrap::main,
        "svc-gitops" => cli::gitops::main,
        "svc-module" => cli::module::main,
        "svc-registry" => cli::registry::main,
        "svc-runbook" => cli::runbook::main,
        "svc-webhook" => cli::webhook::main,
        _ => return None,
    })
}

/// Every name with its entry, in `program::NAMES` order.
fn table() -> Vec<(&'static str, Main)> {
    NAMES
        .iter()
        .map(|&name| (name, entry(name).expect("every name has an entry function")))
        .collect()
}

/// svcctl, which runs the built-in `svc-NAME` modes in-process (`svcctl events list`) with
/// this table.
fn svcctl(program: &str, args: Vec<String>) -> i32 {
    cli::ctl::main(program, args, run_mode)
}

/// All names, in table order (for `svc --list` and install.sh).
pub fn names() -> Vec<&'static str> {
    NAMES.to_vec()
}

/// Whether `name` is a mode of this binary.
pub fn is_mode(name: &str) -> bool {
    table().iter().any(|(known, _)| *known == name)
}

/// Runs the mode `name` with `args` (not including the program name).
pub fn run_mode(name: &str, args: Vec<String>) -> i32 {
    match table().into_iter().find(|(known, _)| *known == name) {
        Some((name, entry)) => entry(name, args),
        None => {
            eprintln!("svc: unknown command '{name}'");
            exit::UNKNOWN_COMMAND
        }
    }
}

/// The process entry point: returns the exit code.
pub fn main(argv: Vec<OsString>) -> i32 {
    let mut strings = Vec::with_capacity(argv.len());
    for arg in argv {
        match arg.into_string() {
            Ok(arg) => strings.push(arg),
            Err(bad) => {
                eprintln!("svc: argument {bad:?} is not valid UTF-8");
                return exit::USAGE;
            }
        }
    }
    let invoked = strings.first().map(String::as_str).unwrap_or("svc");
    let program = std::path::Path::new(invoked)
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or("svc")
        .to_string();
    let args: Vec<String> = strings.into_iter().skip(1).collect();
    let is_daemon = matches!(program.as_str(), "svc-server" | "svc-agent")
        || (program == "svc"
            && matches!(args.first().map(String::as_str), Some("server" | "agent")));
    prepare_process(is_daemon);
    if is_mode(&program) {
        return run_mode(&program, args);
    }
    if program != "svc" {
        eprintln!("svc: unknown program name '{program}' (run 'svc --list' for the names)");
        return exit::UNKNOWN_COMMAND;
    }
    multicall(args)
}

/// Process-wide settings that differ between daemons and CLIs.
fn prepare_process(is_daemon: bool) {
    if is_daemon {
        // Everything a daemon creates (database, keys, logs) is private to its user.
        // SAFETY: umask only changes this process's file-creation mask.
        unsafe {
            libc::umask(0o077);
        }
    } else {
        // A CLI piped into `head` should end quietly, as coreutils do, not panic on EPIPE.
        // But SIGPIPE also comes from a socket whose peer hung up (a plain client talking to
        // a TLS port), and that must be an error with a message, not a silent death. So the
        // handler dies only when stdout is the broken pipe. Daemons keep Rust's default
        // (ignored), so a closed socket is an error there too.
        // SAFETY: installing a handler before any thread starts; the handler only makes
        // async-signal-safe calls.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigpipe as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGPIPE, &action, std::ptr::null_mut());
        }
    }
}

/// SIGPIPE in a CLI: die of it, as before, when stdout's reader went away (a pipe reports
/// POLLERR on its write end once no reader is left); otherwise return, and the write that
/// raised it fails with EPIPE like any other I/O error.
extern "C" fn on_sigpipe(_: libc::c_int) {
    let mut stdout = libc::pollfd {
        fd: libc::STDOUT_FILENO,
        events: 0,
        revents: 0,
    };
    // SAFETY: poll, signal and raise are async-signal-safe; the pollfd lives on this stack.
    // SIGPIPE is blocked while this handler runs, so the raised one is delivered, with the
    // default disposition, as soon as it returns.
    unsafe {
        if libc::poll(&mut stdout, 1, 0) == 1 && stdout.revents & libc::POLLERR != 0 {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::raise(libc::SIGPIPE);
        }
    }
}

/// `svc NAME ...`: the same as `svc-NAME ...`; `svc ctl` is `svcctl`.
fn multicall(args: Vec<String>) -> i32 {
    let Some(first) = args.first() else {
        eprint!("{}", svc_help());
        return exit::USAGE;
    };
    // `svc completion`, `svc man`: the words of svc's help that svc answers itself.
    let own = SVC_WORDS.iter().find(|own| own.word() == first);
    if let Some(run) = own.and_then(|own| own.run) {
        return run("svc", &args[1..]);
    }
    match first.as_str() {
        "-h" | "--help" | "help" => {
            print!("{}", svc_help());
            exit::OK
        }
        "-v" | "--version" => {
            println!("{}", cli::version_line("svc"));
            exit::OK
        }
        "--list" => {
            for name in names() {
                println!("{name}");
            }
            exit::OK
        }
        name => {
            let mode = if name == "ctl" || name == "svcctl" {
                "svcctl".to_string()
            } else if name.starts_with("svc-") {
                name.to_string()
            } else {
                format!("svc-{name}")
            };
            if !is_mode(&mode) {
                eprintln!("svc: unknown command '{name}'");
                eprint!("{}", svc_help());
                return exit::UNKNOWN_COMMAND;
            }
            run_mode(&mode, args[1..].to_vec())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_contract_name_is_a_mode() {
        let expected = [
            "svc-server",
            "svcctl",
            "svc-agent",
            "svc-audit",
            "svc-events",
            "svc-identity",
            "svc-secrets",
            "svc-policy",
            "svc-cluster",
            "svc-cluster-backup",
            "svc-files",
            "svc-backup",
            "svc-blueprint",
            "svc-bootstrap",
            "svc-gitops",
            "svc-migrate",
            "svc-module",
            "svc-registry",
            "svc-runbook",
            "svc-webhook",
        ];
        for name in expected {
            assert!(is_mode(name), "{name}");
        }
        assert_eq!(names().len(), expected.len());
        assert!(!is_mode("svc-nope"));
    }

    #[test]
    fn every_name_has_an_entry() {
        for name in NAMES {
            assert!(entry(name).is_some(), "{name}");
        }
    }
}
