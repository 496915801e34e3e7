//! `svcctl`: the operator CLI. Own commands: agent, exec, state, job, apikey, completion, version;
//! any other `svcctl NAME ARGS` runs the `svc-NAME` mode, or an `svc-NAME` plugin found on
//! PATH.

use argh::FromArgs;
use http::Method;
use serde_json::{json, Value};

use super::client::http_json;
use super::output::{print_json, print_table};
use super::values::{duration, rfc3339, role};
use super::{
    common_section, exit, run_async, take_common, version_line, CliError, Common, Output,
    COMMON_FLAGS,
};
use crate::auth::ApiKey;
use crate::percent;
use crate::program::planned::{Doc, DocSection};

/// The paragraph svcctl's help opens with.
pub const ABOUT: &str = "Operator CLI for svc-server.";

/// One of svcctl's own commands, named once: the word `main` runs it by, the summary its help
/// lists it with (shorter than the argh descriptions, which are written for the command's own
/// help), its argh definition where it has one (`cli::args_info`), and its entry.
pub struct Command {
    pub word: &'static str,
    pub summary: &'static str,
    pub info: Option<fn() -> argh::CommandInfoWithArgs>,
    run: fn(&str, Common, &[String]) -> i32,
}

/// svcctl's own commands, in help order.
pub const COMMANDS: &[Command] = &[
    Command {
        word: "agent",
        summary: "inspect registered agents; label, quarantine and unquarantine them",
        info: Some(<super::fleet::AgentArgs as argh::ArgsInfo>::get_args_info),
        run: super::fleet::agent,
    },
    Command {
        word: "exec",
        summary: "run a command on agents",
        info: Some(<super::fleet::ExecArgs as argh::ArgsInfo>::get_args_info),
        run: super::fleet::exec,
    },
    Command {
        word: "state",
        summary: "declarative state: compile, check, apply, drift",
        info: Some(<super::fleet::StateArgs as argh::ArgsInfo>::get_args_info),
        run: super::fleet::state,
    },
    Command {
        word: "job",
        summary: "jobs kept on the server (exec, state): list, show",
        info: Some(<super::fleet::JobArgs as argh::ArgsInfo>::get_args_info),
        run: super::fleet::job,
    },
    Command {
        word: "apikey",
        summary: "manage API keys: create, list, show, update, delete",
        info: Some(<ApikeyArgs as argh::ArgsInfo>::get_args_info),
        run: apikey,
    },
    Command {
        word: "version",
        summary: "print the version",
        info: None,
        run: |program, _, _| {
            println!("{}", version_line(program));
            exit::OK
        },
    },
    Command {
        word: "completion",
        summary: "print the shell completion script: bash, zsh or fish",
        info: None,
        run: |program, _, args| super::completion::main(program, args),
    },
];

/// The last entry of svcctl's command list: every other word runs a mode or a plugin.
pub const OTHER: (&str, &str) = (
    "NAME",
    "run svc-NAME (audit, events, identity, secrets, policy, cluster, ...)\n\
     or an executable svc-NAME found on PATH (plugins)",
);

/// svcctl's help, as data: its commands from the table, then the common options.
pub fn doc() -> Doc {
    let mut rows: Vec<(String, String)> = COMMANDS
        .iter()
        .map(|command| (command.word.to_string(), command.summary.to_string()))
        .collect();
    rows.push((OTHER.0.to_string(), OTHER.1.to_string()));
    Doc {
        usage: "svcctl <command> [<args>]".to_string(),
        about: ABOUT,
        sections: vec![
            DocSection {
                rows,
                ..DocSection::new("Commands", &[])
            },
            common_section(),
        ],
        notes: "",
    }
}

/// svcctl's help without the common options: what a usage error prints.
fn usage() -> String {
    let mut doc = doc();
    doc.sections.pop();
    doc.render()
}

/// svcctl's `--help`.
pub fn help() -> String {
    doc().render()
}

/// svcctl. `run_mode` runs a built-in `svc-NAME` mode in-process (`svcctl NAME ...`): the
/// table of modes is `dispatch`'s, above the CLIs, which hands it in.
pub fn main(program: &str, mut args: Vec<String>, run_mode: fn(&str, Vec<String>) -> i32) -> i32 {
    let common = match take_common(&mut args) {
        Ok(common) => common,
        Err(error) => {
            eprintln!("{program}: {error}");
            return error.code;
        }
    };
    let Some(command) = args.first().cloned() else {
        eprint!("{program}: missing command\n{}", help());
        return exit::USAGE;
    };
    let rest = args[1..].to_vec();
    if let Some(own) = COMMANDS.iter().find(|own| own.word == command) {
        return (own.run)(program, common, &rest);
    }
    match command.as_str() {
        "-h" | "--help" | "help" => {
            print!("{}", help());
            exit::OK
        }
        "-v" | "--version" => {
            println!("{}", version_line(program));
            exit::OK
        }
        "ctl" | "server" | "agent-daemon" => unknown(program, &command),
        name => {
            // Built-in svc-NAME modes run in-process with the common flags passed on.
            let mode = format!("svc-{name}");
            if crate::program::NAMES.contains(&mode.as_str()) {
                let mut forwarded = common_flags(&common);
                forwarded.extend(rest);
                return run_mode(&mode, forwarded);
            }
            run_plugin(program, name, &rest)
        }
    }
}

/// The common flags, given explicitly to a mode that runs in-process (those left unset, and
/// the default table output, are left out).
fn common_flags(common: &Common) -> Vec<String> {
    COMMON_FLAGS
        .iter()
        .filter_map(|flag| {
            let value = common.value(flag.field)?;
            Some([flag.short.unwrap_or(flag.long).to_string(), value])
        })
        .flatten()
        .collect()
}

/// Runs `svc-NAME` from PATH as git and kubectl run their plugins: exec, so the plugin owns
/// the terminal, signals and exit code.
fn run_plugin(program: &str, name: &str, args: &[String]) -> i32 {
    let executable = format!("svc-{name}");
    let is_plain_name = !name.is_empty() && !name.contains('/') && !name.starts_with('-');
    let found = is_plain_name.then(|| find_on_path(&executable)).flatten();
    let Some(path) = found else {
        return unknown(program, name);
    };
    use std::os::unix::process::CommandExt;
    let error = std::process::Command::new(&path).args(args).exec();
    eprintln!("{program}: cannot run {}: {error}", path.display());
    126
}

fn find_on_path(executable: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(executable))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

fn unknown(program: &str, name: &str) -> i32 {
    eprintln!("{program}: unknown command '{name}'");
    eprint!("{}", usage());
    exit::UNKNOWN_COMMAND
}

/// The argh definition of svcctl's own command `word`, where it has one (`cli::args_info`).
pub fn command_info(word: &str) -> Option<argh::CommandInfoWithArgs> {
    let command = COMMANDS.iter().find(|command| command.word == word)?;
    command.info.map(|info| info())
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Manage API keys over the REST API (admin). The key is shown once, at creation.
#[argh(help_triggers("-h", "--help"))]
struct ApikeyArgs {
    #[argh(subcommand)]
    command: ApikeyCommand,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum ApikeyCommand {
    Create(CreateArgs),
    List(ListArgs),
    Show(ShowArgs),
    Update(UpdateArgs),
    Delete(DeleteArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Create an API key and print it (the only time it is shown).
#[argh(subcommand, name = "create", help_triggers("-h", "--help"))]
struct CreateArgs {
    /// a label for the key
    #[argh(option)]
    name: String,
    /// admin, operator or readonly
    #[argh(option, from_str_fn(role))]
    role: String,
    /// expiry as RFC 3339 (2027-01-01T00:00:00Z)
    #[argh(option, from_str_fn(rfc3339))]
    expires_at: Option<String>,
    /// expiry as a duration from now (30d, 24h)
    #[argh(option, from_str_fn(duration))]
    ttl: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// List API keys.
#[argh(subcommand, name = "list", help_triggers("-h", "--help"))]
struct ListArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// Show one API key.
#[argh(subcommand, name = "show", help_triggers("-h", "--help"))]
struct ShowArgs {
    /// key id
    #[argh(positional)]
    id: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Rename a key, change its role or give it an expiry (the last active admin key may not be
/// demoted or given an expiry).
#[argh(subcommand, name = "update", help_triggers("-h", "--help"))]
struct UpdateArgs {
    /// key id
    #[argh(positional)]
    id: String,
    /// new name
    #[argh(option)]
    name: Option<String>,
    /// new role: admin, operator or readonly
    #[argh(option, from_str_fn(role))]
    role: Option<String>,
    /// new expiry as RFC 3339 (2027-01-01T00:00:00Z)
    #[argh(option, from_str_fn(rfc3339))]
    expires_at: Option<String>,
    /// new expiry as a duration from now (30d, 24h)
    #[argh(option, from_str_fn(duration))]
    ttl: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Delete a key; its next request fails with 401.
#[argh(subcommand, name = "delete", help_triggers("-h", "--help"))]
struct DeleteArgs {
    /// key id
    #[argh(positional)]
    id: String,
}

fn apikey(program: &str, common: Common, args: &[String]) -> i32 {
    let parsed = match super::parse_args::<ApikeyArgs>(&format!("{program} apikey"), args) {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    run_async(program, apikey_command(common, parsed.command))
}

async fn apikey_command(common: Common, command: ApikeyCommand) -> Result<(), CliError> {
    match command {
        ApikeyCommand::Create(args) => {
            let expires_at = expiry(args.expires_at, args.ttl)?;
            let mut body = json!({"name": args.name, "role": args.role});
            if let Some(at) = expires_at {
                body["expires_at"] = json!(at);
            }
            let created = http_json(&common, Method::POST, "/api/v1/apikeys", Some(&body)).await?;
            match common.output {
                Output::Json => print_json(&created)?,
                Output::Table => {
                    print_keys(&[record(&created)?]);
                    println!("\nkey: {}", created["key"].as_str().unwrap_or(""));
                    eprintln!("Store this key now: it cannot be shown again.");
                }
            }
        }
        ApikeyCommand::List(_) => {
            let list = http_json(&common, Method::GET, "/api/v1/apikeys", None).await?;
            let keys: Vec<ApiKey> = serde_json::from_value(list["apikeys"].clone())
                .map_err(|e| CliError::failed(format!("unexpected answer from the server: {e}")))?;
            match common.output {
                Output::Json => print_json(&keys)?,
                Output::Table => print_keys(&keys),
            }
        }
        ApikeyCommand::Show(args) => {
            let key = http_json(&common, Method::GET, &key_path(&args.id), None).await?;
            show(&common, &key)?;
        }
        ApikeyCommand::Update(args) => {
            let expires_at = expiry(args.expires_at, args.ttl)?;
            if args.name.is_none() && args.role.is_none() && expires_at.is_none() {
                return Err(CliError::usage(
                    "nothing to change: give --name, --role, --expires-at or --ttl",
                ));
            }
            let mut body = json!({});
            if let Some(at) = expires_at {
                body["expires_at"] = json!(at);
            }
            if let Some(name) = args.name {
                body["name"] = json!(name);
            }
            if let Some(role) = args.role {
                body["role"] = json!(role);
            }
            let key = http_json(&common, Method::PATCH, &key_path(&args.id), Some(&body)).await?;
            show(&common, &key)?;
        }
        ApikeyCommand::Delete(args) => {
            http_json(&common, Method::DELETE, &key_path(&args.id), None).await?;
            match common.output {
                Output::Json => print_json(&json!({"id": args.id, "deleted": true}))?,
                Output::Table => println!("deleted API key {}", args.id),
            }
        }
    }
    Ok(())
}

/// The expiry from `--expires-at` or `--ttl` (not both).
fn expiry(expires_at: Option<String>, ttl: Option<String>) -> Result<Option<String>, CliError> {
    match (expires_at, ttl) {
        (Some(_), Some(_)) => Err(CliError::usage("give --expires-at or --ttl, not both")),
        (Some(at), None) => Ok(Some(at)),
        (None, Some(ttl)) => {
            let ttl = crate::clock::parse_duration(&ttl)
                .ok_or_else(|| CliError::usage(format!("invalid --ttl '{ttl}' (e.g. 30d, 24h)")))?;
            Ok(Some(crate::clock::format_rfc3339(
                crate::clock::now_millis() + ttl.as_millis() as i64,
            )))
        }
        (None, None) => Ok(None),
    }
}

fn key_path(id: &str) -> String {
    // Ids are ULIDs; anything else is passed through percent-encoded so it cannot change the
    // path (`.` too: `..` would climb out of it).
    let encoded = percent::encode(id.as_bytes(), |byte| {
        byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_'
    });
    format!("/api/v1/apikeys/{encoded}")
}

fn record(value: &Value) -> Result<ApiKey, CliError> {
    serde_json::from_value(value.clone())
        .map_err(|e| CliError::failed(format!("unexpected answer from the server: {e}")))
}

fn show(common: &Common, value: &Value) -> Result<(), CliError> {
    match common.output {
        Output::Json => print_json(value),
        Output::Table => {
            print_keys(&[record(value)?]);
            Ok(())
        }
    }
}

fn print_keys(keys: &[ApiKey]) {
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|k| {
            vec![
                k.id.clone(),
                k.name.clone(),
                k.role.clone(),
                k.created_at.clone(),
                k.last_used_at.clone().unwrap_or_else(|| "-".into()),
                k.expires_at.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    print_table(
        &["ID", "NAME", "ROLE", "CREATED", "LAST USED", "EXPIRES"],
        &rows,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::common_help;

    /// svcctl's help as it was written by hand before its table: scripts and users read it.
    const WRITTEN_USAGE: &str = "\
Usage: svcctl <command> [<args>]

Operator CLI for svc-server.

Commands:
  agent       inspect registered agents; label, quarantine and unquarantine them
  exec        run a command on agents
  state       declarative state: compile, check, apply, drift
  job         jobs kept on the server (exec, state): list, show
  apikey      manage API keys: create, list, show, update, delete
  version     print the version
  completion  print the shell completion script: bash, zsh or fish
  NAME        run svc-NAME (audit, events, identity, secrets, policy, cluster, ...)
              or an executable svc-NAME found on PATH (plugins)
";

    #[test]
    fn the_help_is_rendered_from_the_table_as_written() {
        assert_eq!(usage(), WRITTEN_USAGE);
        assert_eq!(help(), format!("{WRITTEN_USAGE}\n{}\n", common_help()));
        let words: Vec<&str> = COMMANDS.iter().map(|command| command.word).collect();
        for word in ["agent", "exec", "state", "job", "apikey"] {
            assert!(command_info(word).is_some(), "{word}");
        }
        assert!(command_info("version").is_none());
        assert_eq!(words.len(), 7);
    }
}
