//! The command-line clients: one file per CLI. The core they share with the daemons (exit
//! codes, the error that carries one, common flags, argument parsing, output) is
//! `crate::program`, re-exported here; `client.rs` holds the gRPC and HTTP clients, and this
//! file the ways a CLI runs its commands: most CLIs name each command once, in a table of
//! [`Command`]s next to their argh structs (svcctl and svc-migrate in tables of their own),
//! which both running it and `args_info` read. `top_help` gives every name's own help as data
//! from the same definitions, so completions and man pages (`helptext.rs`) run nothing.

/// A [`Command`] entry: the word, the argh type its arguments parse into, and the body that
/// runs it (`fn(Common, Args) -> impl Future`, or a closure of that shape; after `offline`, a
/// plain `fn(Common, Args) -> Result<(), CliError>` run without a runtime); optionally the
/// one-line summary the CLI's help gives it when its argh description's first sentence does
/// not fit (two words sharing one struct).
macro_rules! command {
    (offline $word:literal, $args:ty, $body:expr) => {
        $crate::cli::Command {
            word: $word,
            summary: None,
            info: <$args as argh::ArgsInfo>::get_args_info,
            run: |program, name, common, args| {
                $crate::cli::run_offline::<$args>(program, name, args, common, $body)
            },
        }
    };
    ($word:literal, $args:ty, $body:expr) => {
        command!(@ $word, $args, $body, None)
    };
    ($word:literal, $args:ty, $body:expr, $summary:literal) => {
        command!(@ $word, $args, $body, Some($summary))
    };
    (@ $word:literal, $args:ty, $body:expr, $summary:expr) => {
        $crate::cli::Command {
            word: $word,
            summary: $summary,
            info: <$args as argh::ArgsInfo>::get_args_info,
            run: |program, name, common, args| {
                $crate::cli::run_command::<$args, _>(program, name, args, common, $body)
            },
        }
    };
}

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
    common_help, common_section, exit, output, parse_args, run_async, take_common, take_output,
    version_line, wants_version, CliError, Common, Output, COMMON_FLAGS,
};

/// One built command of a CLI, named once: what runs it, and what its help, completions and
/// man pages read (`args_info`, and the one-line summary in the CLI's `--help`). Made with the
/// `command!` macro.
#[derive(Clone, Copy)]
pub struct Command {
    pub word: &'static str,
    /// The summary in the CLI's command list when the first sentence of the argh description
    /// does not fit it (a struct shared by two words); None for that first sentence.
    pub summary: Option<&'static str>,
    /// Its argh definition.
    pub info: fn() -> argh::CommandInfoWithArgs,
    /// Parses the arguments after the word and runs the command: program (`svc-audit`), the
    /// name its usage errors carry (`svc-audit log`), the common flags, the arguments.
    pub run: fn(&str, &str, Common, &[String]) -> i32,
}

/// The commands of each CLI that runs from tables, in help order (`svc-cluster` has two
/// tables: membership's and its own).
fn tables(name: &str) -> &'static [&'static [Command]] {
    match name {
        "svc-audit" => &[audit::COMMANDS],
        "svc-events" => &[events::COMMANDS],
        "svc-identity" => &[identity::COMMANDS],
        "svc-secrets" => &[secrets::COMMANDS],
        "svc-policy" => &[policy::COMMANDS],
        "svc-backup" => &[backup::COMMANDS],
        "svc-cluster" => &[membership::COMMANDS, cluster::COMMANDS],
        "svc-cluster-backup" => &[cluster::BACKUP_COMMANDS],
        "svc-files" => &[files::COMMANDS],
        "svc-runbook" => &[runbook::COMMANDS],
        "svc-webhook" => &[webhook::COMMANDS],
        _ => &[],
    }
}

/// The command `word` of the CLI `name`'s tables.
fn find_command(name: &str, word: &str) -> Option<&'static Command> {
    tables(name)
        .iter()
        .flat_map(|table| table.iter())
        .find(|command| command.word == word)
}

/// The argh definition of each CLI whose commands are the subcommands of one argh struct
/// (`run_subcommands`).
fn subcommand_cli(name: &str) -> Option<fn() -> argh::CommandInfoWithArgs> {
    Some(match name {
        "svc-blueprint" => blueprint::args_info,
        "svc-gitops" => gitops::args_info,
        "svc-module" => module::args_info,
        "svc-registry" => registry::args_info,
        _ => return None,
    })
}

/// The argh definition of the command at `path` (`["svc-events", "list"]`): help, completions
/// and man pages read it (`helptext.rs`). None for a word with no definition (`svcctl
/// version`), and for anything but a name and one of its commands.
pub fn args_info(path: &[&str]) -> Option<argh::CommandInfoWithArgs> {
    let [name, command] = path else {
        return None;
    };
    if let Some(found) = find_command(name, command) {
        return Some((found.info)());
    }
    if let Some(info) = subcommand_cli(name) {
        return info()
            .commands
            .into_iter()
            .find(|sub| sub.name == *command)
            .map(|sub| sub.command);
    }
    match *name {
        "svcctl" => ctl::command_info(command),
        "svc-migrate" => migrate::command_info(command),
        "svc-agent" => crate::agent::command_info(command),
        _ => None,
    }
}

/// Every name's own `--help` as data, built from what it is printed from, with nothing run
/// (`helptext.rs`): a CLI with a command list from its `planned.rs` row and its table or argh
/// struct; svcctl, svc-migrate and `svc` from their tables; svc-agent from its table (`agent::with_planned`);
/// svc-server and svc-bootstrap, which have no commands, from their argh definitions. None for
/// a name it does not know.
pub fn top_help(name: &str) -> Option<helptext::Help> {
    use crate::program::planned::doc;
    use helptext::{from_args_info, from_doc};
    Some(match name {
        "svc" => from_doc(&planned::svc_doc()),
        "svcctl" => from_doc(&ctl::doc()),
        "svc-migrate" => from_doc(&migrate::doc()),
        "svc-agent" => crate::agent::with_planned(|planned| from_doc(&doc(planned))),
        "svc-server" => from_args_info(name, &crate::server::args_info()),
        "svc-bootstrap" => from_args_info(name, &bootstrap::args_info()),
        _ => with_planned(name, |planned| from_doc(&doc(planned)))?,
    })
}

/// The commands of a CLI with a command list, each with its one-line summary, in help order:
/// its tables' (the table's summary, or the first sentence of the argh description) or its
/// argh struct's subcommands.
fn listing(name: &str) -> Vec<(&'static str, String)> {
    if let Some(info) = subcommand_cli(name) {
        return info()
            .commands
            .iter()
            .map(|sub| (sub.name, summary(sub.command.description)))
            .collect();
    }
    tables(name)
        .iter()
        .flat_map(|table| table.iter())
        .map(|command| {
            let line = match command.summary {
                Some(line) => line.to_string(),
                None => summary((command.info)().description),
            };
            (command.word, line)
        })
        .collect()
}

/// Calls `then` with the CLI `name`'s command list as `program::planned` takes it: its
/// `planned.rs` row and its [`listing`], every command built. None when it has no row.
fn with_planned<R>(
    name: &str,
    then: impl FnOnce(&crate::program::planned::Planned<'_>) -> R,
) -> Option<R> {
    let tool = planned::find(name)?;
    let listed = listing(name);
    let commands: Vec<(&str, &str)> = listed
        .iter()
        .map(|(word, line)| (*word, line.as_str()))
        .collect();
    let built: Vec<&str> = commands.iter().map(|(word, _)| *word).collect();
    Some(then(&crate::program::planned::Planned {
        name,
        about: tool.about,
        commands: &commands,
        default: None,
        is_client: tool.is_client,
        built: &built,
    }))
}

/// The one-line summary of a command in its CLI's list: the first sentence of its argh
/// description (up to the first `. `), on one line.
pub fn summary(description: &str) -> String {
    let text = description.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut end = text.len();
    for (at, _) in text.match_indices(". ") {
        let word = text[..at].rsplit(' ').next().unwrap_or("");
        // An abbreviation does not end the sentence.
        if !matches!(word, "e.g" | "i.e" | "etc" | "vs") {
            end = at + 1;
            break;
        }
    }
    text[..end].to_string()
}

/// Runs the CLI `name` from its tables: a command word of them runs its entry with the common
/// flags and its own arguments; everything else (help, version, an unknown word) goes to
/// [`run_listed`].
pub fn run_table(name: &str, args: Vec<String>) -> i32 {
    run_listed(
        name,
        args,
        |word| find_command(name, word).is_some(),
        |word, common, rest| {
            let command = find_command(name, word).expect("a listed word");
            (command.run)(name, &format!("{name} {word}"), common, rest)
        },
    )
}

/// Runs a CLI whose commands are the subcommands of one argh struct `A`: the command word goes
/// back in front of its arguments, and `body` gets it all. Its help lists the subcommands,
/// each with the first sentence of its description.
pub fn run_subcommands<A, F>(
    name: &str,
    args: Vec<String>,
    body: impl FnOnce(Common, A) -> F,
) -> i32
where
    A: FromArgs + argh::ArgsInfo,
    F: std::future::Future<Output = Result<(), CliError>>,
{
    run_listed(
        name,
        args,
        |word| {
            A::get_args_info()
                .commands
                .iter()
                .any(|sub| sub.name == word)
        },
        |word, common, rest| {
            let mut full = vec![word.to_string()];
            full.extend_from_slice(rest);
            run_command::<A, _>(name, name, &full, common, body)
        },
    )
}

/// What every CLI with a command list shares: the common flags are taken out; a built command
/// word (`is_built`) goes to `run` with them and its own arguments; everything else — help,
/// version, a missing or unknown word — is answered from the CLI's row in `planned.rs` and
/// its [`listing`]: its commands with their one-line summaries, in help order.
fn run_listed(
    name: &str,
    args: Vec<String>,
    is_built: impl Fn(&str) -> bool,
    run: impl FnOnce(&str, Common, &[String]) -> i32,
) -> i32 {
    let mut rest = args.clone();
    let common = match take_common(&mut rest) {
        Ok(common) => common,
        Err(error) => {
            eprintln!("{name}: {error}");
            return error.code;
        }
    };
    match rest.first() {
        Some(word) if is_built(word) => run(word, common, &rest[1..]),
        _ => with_planned(name, |planned| crate::program::planned::run(planned, &args))
            .expect("every CLI with a command list has a planned row"),
    }
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

/// [`run_command`] for a body that needs no runtime (offline work on local files).
pub fn run_offline<A: FromArgs>(
    program: &str,
    name: &str,
    args: &[String],
    common: Common,
    body: impl FnOnce(Common, A) -> Result<(), CliError>,
) -> i32 {
    match parse_args::<A>(name, args).map(|parsed| body(common, parsed)) {
        Ok(Ok(())) => exit::OK,
        Ok(Err(error)) => {
            eprintln!("{program}: {}", error.message);
            error.code
        }
        Err(code) => code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_is_the_first_sentence_on_one_line() {
        assert_eq!(
            summary("Query the audit log,\nnewest first. Times are RFC 3339."),
            "Query the audit log, newest first."
        );
        assert_eq!(
            summary("Trust a CA, e.g. an internal one. More."),
            "Trust a CA, e.g. an internal one."
        );
        assert_eq!(summary("Delete one object."), "Delete one object.");
    }

    #[test]
    fn every_name_has_its_help_as_data() {
        for name in std::iter::once(&"svc").chain(crate::program::NAMES) {
            let help = top_help(name).unwrap_or_else(|| panic!("{name}"));
            assert!(help.usage.starts_with(name), "{name}: {}", help.usage);
            assert!(!help.summary().is_empty(), "{name}");
        }
        assert!(top_help("svc-nope").is_none());
    }

    #[test]
    fn every_table_names_each_command_once_and_has_a_planned_row() {
        for name in crate::program::NAMES {
            let words: Vec<&str> = tables(name)
                .iter()
                .flat_map(|table| table.iter().map(|command| command.word))
                .collect();
            if words.is_empty() {
                continue;
            }
            assert!(planned::find(name).is_some(), "{name}");
            for word in &words {
                assert_eq!(
                    words.iter().filter(|w| *w == word).count(),
                    1,
                    "{name} {word}"
                );
                assert!(args_info(&[name, word]).is_some(), "{name} {word}");
            }
        }
    }
}
