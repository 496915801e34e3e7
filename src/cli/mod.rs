//! The command-line clients: one file per CLI. The core they share with the daemons (exit
//! codes, the error that carries one, common flags, argument parsing, output) is
//! `crate::program`, re-exported here; `client.rs` holds the gRPC and HTTP clients, and this
//! file the ways a CLI runs its commands.

pub mod audit;
pub mod backup;
pub mod blueprint;
pub mod bootstrap;
pub mod client;
pub mod cluster;
pub mod completion;
pub mod ctl;
pub mod events;
pub mod files;
pub mod fleet;
pub mod gitops;
pub mod helptext;
pub mod identity;
pub mod manpage;
pub mod membership;
pub mod migrate;
pub mod module;
pub mod planned;
pub mod policy;
pub mod progress;
pub mod registry;
pub mod runbook;
pub mod secrets;
pub mod values;
pub mod webhook;

use argh::FromArgs;

pub use crate::program::{
    exit, output, parse_args, run_async, take_common, version_line, wants_version, CliError,
    Common, Output, COMMON_HELP,
};

/// The argh definition of the command at `path` (`["svc-events", "list"]`), for the CLIs that
/// hand theirs out: help, completions and man pages read it (`helptext.rs`) instead of running
/// the command with `--help`. A CLI not listed here is still read from its printed help.
pub fn args_info(path: &[&str]) -> Option<argh::CommandInfoWithArgs> {
    let [name, command] = path else {
        return None;
    };
    match *name {
        "svcctl" => ctl::command_info(command),
        "svc-audit" => audit::command_info(command),
        "svc-events" => events::command_info(command),
        "svc-identity" => identity::command_info(command),
        "svc-secrets" => secrets::command_info(command),
        "svc-policy" => policy::command_info(command),
        "svc-backup" => backup::command_info(command),
        "svc-cluster" => cluster::command_info(command),
        "svc-cluster-backup" => cluster::backup_command_info(command),
        "svc-files" => files::command_info(command),
        "svc-migrate" => migrate::command_info(command),
        "svc-runbook" => runbook::command_info(command),
        "svc-blueprint" => blueprint::command_info(command),
        "svc-gitops" => gitops::command_info(command),
        "svc-module" => module::command_info(command),
        "svc-registry" => registry::command_info(command),
        "svc-webhook" => webhook::command_info(command),
        _ => None,
    }
}

/// The subcommand `word` of the argh command `A`, with everything under it.
fn subcommand_info<A: argh::ArgsInfo>(word: &str) -> Option<argh::CommandInfoWithArgs> {
    A::get_args_info()
        .commands
        .into_iter()
        .find(|sub| sub.name == word)
        .map(|sub| sub.command)
}

/// Runs a CLI of which some commands are built: a built command goes to `run` with the
/// common flags and its own arguments; everything else (help, version, planned commands)
/// to the planned table.
pub fn run_partly_built(
    name: &str,
    args: Vec<String>,
    run: impl FnOnce(&str, &str, Common, &[String]) -> i32,
) -> i32 {
    let planned = planned::find(name).expect("every partly built CLI has a planned row");
    let mut rest = args.clone();
    let common = match take_common(&mut rest) {
        Ok(common) => common,
        Err(error) => {
            eprintln!("{name}: {error}");
            return error.code;
        }
    };
    match rest.first() {
        Some(command) if planned.built.contains(&command.as_str()) => {
            run(name, command, common, &rest[1..])
        }
        _ => planned::run(planned, &args),
    }
}

/// [`run_partly_built`] for a CLI whose built commands are the subcommands of one argh
/// struct `A`: the command word goes back in front of its arguments, and `body` gets it all.
pub fn run_subcommands<A, F>(
    name: &str,
    args: Vec<String>,
    body: impl FnOnce(Common, A) -> F,
) -> i32
where
    A: FromArgs,
    F: std::future::Future<Output = Result<(), CliError>>,
{
    run_partly_built(name, args, |program, command, common, rest| {
        let mut full = vec![command.to_string()];
        full.extend_from_slice(rest);
        run_command::<A, _>(program, program, &full, common, body)
    })
}

/// Parses one command's arguments and runs its body: the usual shape of a built command.
pub fn run_command<A, F>(
    program: &str,
    name: &str,
    args: &[String],
    common: Common,
    body: impl FnOnce(Common, A) -> F,
) -> i32
where
    A: FromArgs,
    F: std::future::Future<Output = Result<(), CliError>>,
{
    match parse_args::<A>(name, args) {
        Ok(parsed) => run_async(program, body(common, parsed)),
        Err(code) => code,
    }
}
