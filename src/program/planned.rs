//! The table of a program's commands and what is made from it: its help, and the answer to
//! a command not built yet (exit 1, `NAME: 'SUB' is not implemented yet`, never a fake
//! success). svc-agent's is the static row `agent::COMMANDS`; a CLI's is made when its help is
//! asked for, from its row in `cli::planned` and its commands' argh definitions (`cli::run_listed`).

use super::{common_help, exit, version_line};

pub struct Planned<'a> {
    pub name: &'a str,
    pub about: &'a str,
    /// Each command's word and one-line summary, in help order.
    pub commands: &'a [(&'a str, &'a str)],
    /// What runs when no subcommand is given (daemons); None means "usage error".
    pub default: Option<&'a str>,
    /// Whether it talks to the server with the common client flags.
    pub is_client: bool,
    /// Commands that are built (handled by the program's own code); the rest are planned.
    pub built: &'a [&'a str],
}

/// The help text of a planned CLI.
pub fn help(planned: &Planned<'_>) -> String {
    let mut text = if planned.commands.is_empty() {
        format!("Usage: {} [<options>]\n\n{}\n", planned.name, planned.about)
    } else {
        format!(
            "Usage: {} <command> [<args>]\n\n{}\n\nCommands:\n",
            planned.name, planned.about
        )
    };
    let width = planned
        .commands
        .iter()
        .map(|(name, _)| name.len())
        .max()
        .unwrap_or(0);
    for (name, about) in planned.commands {
        let status = if planned.built.is_empty() || planned.built.contains(name) {
            ""
        } else {
            " (not implemented yet)"
        };
        text.push_str(&format!("  {name:width$}  {about}{status}\n"));
    }
    text.push('\n');
    if planned.is_client {
        text.push_str(&common_help());
    } else {
        text.push_str("Options:\n  -h, --help     show help\n  -v, --version  show the version");
    }
    if planned.built.is_empty() {
        text.push_str("\n\nStatus: this command's features are not built yet; each command exits 1 with 'not implemented yet'.\n");
    } else {
        text.push('\n');
    }
    text
}

/// Runs a planned CLI: help and version work; every command says it is not built yet.
pub fn run(planned: &Planned<'_>, args: &[String]) -> i32 {
    let program = planned.name;
    let (error_prefix, command_prefix) = match program.split_once(' ') {
        Some((root, sub)) => (root, format!("{sub} ")),
        None => (program, String::new()),
    };
    if super::wants_version(args) {
        println!("{}", version_line(error_prefix));
        return exit::OK;
    }
    // The common flags take values; remove them so a value is never mistaken for a command.
    let mut args = args.to_vec();
    if let Err(error) = super::take_common(&mut args) {
        eprintln!("{error_prefix}: {error}");
        return error.code;
    }
    let mut command = None;
    for arg in &args {
        match arg.as_str() {
            "-h" | "--help" | "help" => {
                print!("{}", help(planned));
                return exit::OK;
            }
            "--" => break,
            flag if flag.starts_with('-') => {}
            word if command.is_none() => command = Some(word.to_string()),
            _ => {}
        }
    }
    let command = match (command, planned.default) {
        (Some(word), _) if planned.commands.iter().any(|(name, _)| *name == word) => word,
        (Some(word), None) => {
            eprintln!("{error_prefix}: unknown command '{command_prefix}{word}'");
            eprintln!("{error_prefix}: run '{program} --help' for the commands");
            return exit::USAGE;
        }
        (_, Some(default)) => default.to_string(),
        (None, None) => {
            eprintln!("{error_prefix}: missing command");
            eprint!("{}", help(planned));
            return exit::USAGE;
        }
    };
    // A command without subcommands (`svcctl exec`) is named by itself.
    let full = if planned.commands.is_empty() && !command_prefix.is_empty() {
        command_prefix.trim().to_string()
    } else {
        format!("{command_prefix}{command}")
    };
    eprintln!("{error_prefix}: '{full}' is not implemented yet");
    exit::FAILED
}
