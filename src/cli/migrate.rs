//! `svc-migrate`: copy the store from SQLite to PostgreSQL (`run`), check a copy
//! (`validate`), and show schema versions (`version`).
//!
//! A local tool, not a server client: it opens the databases itself through
//! `store::copy`, which does the work; this file parses flags and prints.

use argh::FromArgs;

use super::output::{format_table, print_json};
use super::progress::Bar;
use super::{
    exit, parse_args, run_async, take_output, version_line, wants_version, CliError, Output,
};
use crate::percent;
use crate::program::planned::{Doc, DocSection};
use crate::store::copy::{
    self, message_of, Comparison, CopyOptions, CopySummary, Progress, Source,
};
use crate::store::postgres::Target;

/// The paragraphs svc-migrate's help opens with.
const ABOUT: &str = "\
Copy the svc store from SQLite to PostgreSQL, check the copy, and show schema versions.

Stop the server first; afterwards point it at PostgreSQL (store: { driver: postgres, url: ... })
with the same master_key and hmacsecret.";

/// What svc-migrate's help ends with: how a URL names a database.
const NOTES: &str = "\
PostgreSQL URLs: postgres://user:password@host:port/database?sslmode=verify-full&sslrootcert=ca.pem
(sslmode disable | prefer (default) | require | verify-full). Leave the password out of the URL
and set PGPASSWORD to keep it out of the process list. The password is never printed.";

/// svc-migrate's own lines of its `Options:` (its `-o` is the clients' common one).
const OPTIONS: &[(&str, &str)] = &[
    (
        "-h, --help",
        "show help (COMMAND --help: a command's flags and edge cases)",
    ),
    ("-v, --version", "show the version"),
];

/// One command, named once: its word, the summary its help lists it with (the flags it
/// needs, which the argh description leaves to the command's own help), its argh definition
/// (`cli::args_info`), and its entry (program, the name its usage errors carry, `-o`, its
/// arguments).
pub struct Command {
    pub word: &'static str,
    pub summary: &'static str,
    pub info: fn() -> argh::CommandInfoWithArgs,
    run: fn(&str, &str, Output, &[String]) -> i32,
}

/// svc-migrate's commands, in help order.
pub const COMMANDS: &[Command] = &[
    Command {
        word: "run",
        summary:
            "copy every row: --from sqlite:PATH --to postgres://... [--force] [--batch-rows N]\n\
                  resumable: run it again after an interruption and it continues where it stopped",
        info: <RunArgs as argh::ArgsInfo>::get_args_info,
        run: |program, name, output, args| parse_then_run(program, name, args, |a| run(output, a)),
    },
    Command {
        word: "validate",
        summary: "compare row counts table by table and the audit chain's head:\n\
                  --from sqlite:PATH --to postgres://...; exit 0 when they match, 1 when not",
        info: <ValidateArgs as argh::ArgsInfo>::get_args_info,
        run: |program, name, output, args| {
            parse_then_run(program, name, args, |a| validate(output, a))
        },
    },
    Command {
        word: "version",
        summary:
            "this binary's schema version, and with --store sqlite:PATH|postgres://... a store's",
        info: <VersionArgs as argh::ArgsInfo>::get_args_info,
        run: |program, name, output, args| {
            parse_then_run(program, name, args, |a| version(output, a))
        },
    },
];

/// Parses one command's arguments and runs its body with them: each entry's whole entry (its
/// output format goes in through the body's closure).
fn parse_then_run<A, F>(
    program: &str,
    name: &str,
    args: &[String],
    body: impl FnOnce(A) -> F,
) -> i32
where
    A: FromArgs,
    F: std::future::Future<Output = Result<(), CliError>>,
{
    match parse_args::<A>(name, args) {
        Ok(parsed) => run_async(program, body(parsed)),
        Err(code) => code,
    }
}

/// svc-migrate's help, as data: its commands from the table; of the common options only
/// `-o`, as the clients have it.
pub fn doc() -> Doc {
    let commands = COMMANDS
        .iter()
        .map(|command| (command.word.to_string(), command.summary.to_string()))
        .collect();
    let output = crate::program::common_flag(crate::program::CommonField::Output);
    let mut options = DocSection::new("Options", OPTIONS);
    options.rows.insert(0, (output.term(), output.about()));
    Doc {
        usage: "svc-migrate <command> [<args>]".to_string(),
        about: ABOUT,
        sections: vec![
            DocSection {
                rows: commands,
                ..DocSection::new("Commands", &[])
            },
            options,
        ],
        notes: NOTES,
    }
}

/// svc-migrate's `--help`.
pub fn help() -> String {
    doc().render()
}

pub fn main(program: &str, args: Vec<String>) -> i32 {
    if wants_version(&args) {
        println!("{}", version_line(program));
        return exit::OK;
    }
    let mut args = args;
    let output = match take_output(&mut args) {
        Ok(output) => output,
        Err(error) => {
            eprintln!("{program}: {error}");
            return error.code;
        }
    };
    let Some(command) = args.first().cloned() else {
        eprintln!("{program}: missing command");
        eprint!("{}", help());
        return exit::USAGE;
    };
    let rest = &args[1..];
    if let Some(found) = COMMANDS.iter().find(|found| found.word == command) {
        return (found.run)(program, &format!("{program} {command}"), output, rest);
    }
    match command.as_str() {
        "-h" | "--help" | "help" => {
            print!("{}", help());
            exit::OK
        }
        other => {
            eprintln!("{program}: unknown command '{other}'");
            eprintln!("{program}: run '{program} --help' for the commands");
            exit::USAGE
        }
    }
}

/// The argh definition of the command `word` (`cli::args_info`).
pub fn command_info(word: &str) -> Option<argh::CommandInfoWithArgs> {
    let command = COMMANDS.iter().find(|command| command.word == word)?;
    Some((command.info)())
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Copy every row of a SQLite store into a PostgreSQL database, table by table (parents
/// first), in primary-key order, in batches of one transaction each. Ids, timestamps and the
/// audit hash chain are copied byte for byte. The target's migrations are applied first.
#[argh(
    help_triggers("-h", "--help"),
    note = "refuses     exit 1, changing nothing, when: a server runs on the source's data dir (its
            server.lock is held; while the copy runs, a server started there fails to take
            that lock); the source's schema version is not this binary's (the message says
            which is newer); the target's is newer than this binary's; an svc server is
            connected to the target database (application_name 'svc'); the target holds rows
            that are not this tool's unfinished copy of this source (another store, a finished
            copy, a copy from another file, or one whose source has changed since)
resume      an interrupted run (killed, connection lost) leaves whole batches behind: run the
            same command again and each table continues after the last row the target has
--force     empties the target first, in one transaction: every row of every svc table, the
            audit log included (its append-only trigger is disabled inside that transaction
            only). Take a pg_dump first if those rows matter. An unfinished copy of the same,
            unchanged source resumes instead
svc_migrate a one-row table the target keeps: the source, its fingerprint and the state
            (copying, done); dropping it after the move is harmless
exit codes  0 copied, 1 refused or failed, 2 usage, 3 PostgreSQL unreachable, 5 no source"
)]
struct RunArgs {
    /// the SQLite store: sqlite:PATH, the server's data_dir/svc.db (or the data dir)
    #[argh(option)]
    from: String,
    /// the PostgreSQL database: postgres://user:password@host:port/database[?sslmode=...]
    #[argh(option)]
    to: String,
    /// empty a target that holds other rows first (see below)
    #[argh(switch)]
    force: bool,
    /// rows per transaction (default 10000)
    #[argh(option, default = "copy::DEFAULT_BATCH_ROWS")]
    batch_rows: u64,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Compare a SQLite store and a PostgreSQL copy: row counts table by table, the audit chain's
/// head (last seq and hash) and the schema versions. Changes nothing on either side.
#[argh(
    help_triggers("-h", "--help"),
    note = "differences a table with other counts, or missing from the target, the audit head, the
            schema versions; printed as a table (-o json: the same document, \"match\": false)
unfinished  said so when the target holds an interrupted copy: run the copy again to finish it
exit codes  0 match, 1 differ, 2 usage, 3 PostgreSQL unreachable, 5 no source"
)]
struct ValidateArgs {
    /// the SQLite store: sqlite:PATH
    #[argh(option)]
    from: String,
    /// the PostgreSQL database: postgres://...
    #[argh(option)]
    to: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Print this binary's schema version (the last migration it carries) and, with --store, the
/// version of that store, with a note when they differ. Reads only; migrates nothing.
#[argh(
    help_triggers("-h", "--help"),
    note = "older       svc-server brings the store up to date at its next start
newer       the store needs a newer svc
empty       a PostgreSQL database without svc tables is version 0"
)]
struct VersionArgs {
    /// a store: sqlite:PATH or postgres://user:password@host:port/database
    #[argh(option)]
    store: Option<String>,
}

/// `sqlite:PATH` → PATH.
fn sqlite_path(flag: &str, value: &str) -> Result<std::path::PathBuf, CliError> {
    match value.strip_prefix("sqlite:") {
        Some("") => Err(CliError::usage(format!("{flag}: sqlite: needs a path"))),
        Some(path) => Ok(path.into()),
        None if is_postgres_url(value) => Err(CliError::usage(format!(
            "{flag} must be a SQLite store (sqlite:PATH): svc-migrate copies from SQLite to \
             PostgreSQL"
        ))),
        None => Err(CliError::usage(format!(
            "{flag} must be sqlite:PATH (e.g. sqlite:/var/lib/svc/svc.db)"
        ))),
    }
}

fn is_postgres_url(value: &str) -> bool {
    value.starts_with("postgres://") || value.starts_with("postgresql://")
}

/// A `postgres://` URL → the target; the password may come from PGPASSWORD. Messages never
/// repeat the URL (it may hold the password).
fn postgres_target(flag: &str, value: &str) -> Result<Target, CliError> {
    if !is_postgres_url(value) {
        return Err(CliError::usage(format!(
            "{flag} must be a PostgreSQL URL: postgres://user:password@host:port/database"
        )));
    }
    let password = std::env::var("PGPASSWORD").unwrap_or_default();
    let url = with_password(value, &password);
    copy::target_from_url(&url).map_err(|error| {
        CliError::usage(format!(
            "{flag}: {}",
            message_of(&error)
                .replace("store.url", "the URL")
                .replace("store.sslmode", "sslmode")
                .replace("store.ca_file", "sslrootcert")
        ))
    })
}

/// Puts `password` into the URL when it names a user without one (libpq reads PGPASSWORD the
/// same way), percent-encoded.
fn with_password(url: &str, password: &str) -> String {
    if password.is_empty() {
        return url.to_string();
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let Some((user_info, host)) = authority.rsplit_once('@') else {
        return url.to_string();
    };
    if user_info.contains(':') || user_info.is_empty() {
        return url.to_string();
    }
    let encoded = percent::encode(password.as_bytes(), percent::unreserved);
    format!("{scheme}://{user_info}:{encoded}@{host}{tail}")
}

/// Exit codes for the engine's errors (contract §1).
fn engine_error(error: crate::Error) -> CliError {
    CliError::new(exit::of_error(&error), message_of(&error))
}

async fn run(output: Output, args: RunArgs) -> Result<(), CliError> {
    let path = sqlite_path("--from", &args.from)?;
    let target = postgres_target("--to", &args.to)?;
    if args.batch_rows == 0 {
        return Err(CliError::usage("--batch-rows must be at least 1"));
    }
    let source = Source::open(&path, true).map_err(engine_error)?;
    let options = CopyOptions {
        force: args.force,
        batch_rows: args.batch_rows,
    };
    let mut bar = Bar::stderr();
    let mut tables_done = 0;
    let tables = crate::store::tables::TABLES.len();
    let summary = copy::run(source, &target, &options, &mut |event| match event {
        Progress::Table {
            table,
            present,
            total,
        } => bar.start(
            &format!("{table} ({}/{tables})", tables_done + 1),
            present,
            total,
        ),
        Progress::Rows { copied, .. } => bar.set(copied),
        Progress::TableDone {
            table,
            copied,
            seconds,
        } => {
            tables_done += 1;
            bar.finish_step();
            // Off a terminal the bar is not drawn: a line per table tells a log how far it got.
            if !bar.is_terminal() {
                bar.line(&format!(
                    "svc-migrate: {table}: {copied} rows in {seconds:.2} s"
                ));
            }
        }
    })
    .await;
    drop(bar);
    let summary = summary.map_err(engine_error)?;
    match output {
        Output::Json => print_json(&summary),
        Output::Table => {
            print!("{}", summary_table(&summary));
            Ok(())
        }
    }
}

fn summary_table(summary: &CopySummary) -> String {
    let mut rows: Vec<Vec<String>> = summary
        .tables
        .iter()
        .map(|table| {
            vec![
                table.table.clone(),
                table.rows.to_string(),
                table.resumed_rows.to_string(),
                format!("{:.2}", table.seconds),
                format!("{:.0}", table.rows_per_second),
            ]
        })
        .collect();
    rows.push(vec![
        "total".into(),
        summary.rows.to_string(),
        summary
            .tables
            .iter()
            .map(|t| t.resumed_rows)
            .sum::<u64>()
            .to_string(),
        format!("{:.2}", summary.seconds),
        format!("{:.0}", summary.rows_per_second),
    ]);
    let mut text = format_table(
        &["TABLE", "COPIED", "ALREADY THERE", "SECONDS", "ROWS/S"],
        &rows,
    );
    text.push('\n');
    if summary.emptied_target {
        text.push_str("The target was emptied first (--force).\n");
    }
    if summary.resumed {
        text.push_str("Resumed an interrupted copy (ALREADY THERE: rows it had copied).\n");
    }
    text.push_str(&format!(
        "Copied {} into {} (schema version {}); row counts and the audit head match.\n\
         Next: point svc-server at it (store: {{ driver: postgres, url: ... }}) with the same \
         master_key and hmacsecret.\n",
        summary.source, summary.target, summary.schema_version
    ));
    text
}

async fn validate(output: Output, args: ValidateArgs) -> Result<(), CliError> {
    let path = sqlite_path("--from", &args.from)?;
    let target = postgres_target("--to", &args.to)?;
    let source = Source::open(&path, false).map_err(engine_error)?;
    let comparison = copy::validate(source, &target)
        .await
        .map_err(engine_error)?;
    match output {
        Output::Json => print_json(&comparison)?,
        Output::Table => print!("{}", comparison_table(&comparison)),
    }
    if comparison.matches {
        return Ok(());
    }
    let differences = differences(&comparison);
    Err(CliError::failed(format!(
        "the target differs from the source: {}",
        differences.join(", ")
    )))
}

fn differences(comparison: &Comparison) -> Vec<String> {
    let mut differences: Vec<String> = comparison
        .tables
        .iter()
        .filter(|table| !table.matches)
        .map(|table| table.table.clone())
        .collect();
    if !comparison.audit_head_match {
        differences.push("audit head".into());
    }
    if comparison.source_schema_version != comparison.target_schema_version {
        differences.push("schema version".into());
    }
    differences
}

fn comparison_table(comparison: &Comparison) -> String {
    let status = |matches: bool| if matches { "ok" } else { "DIFFERS" }.to_string();
    let head = |head: &Option<copy::AuditHead>| match head {
        Some(head) => format!("seq {} {}", head.seq, &head.hash[..head.hash.len().min(12)]),
        None => "none".into(),
    };
    let mut rows: Vec<Vec<String>> = comparison
        .tables
        .iter()
        .map(|table| {
            vec![
                table.table.clone(),
                table.source.to_string(),
                table
                    .target
                    .map(|count| count.to_string())
                    .unwrap_or_else(|| "missing".into()),
                status(table.matches),
            ]
        })
        .collect();
    rows.push(vec![
        "(audit head)".into(),
        head(&comparison.source_audit_head),
        head(&comparison.target_audit_head),
        status(comparison.audit_head_match),
    ]);
    rows.push(vec![
        "(schema version)".into(),
        comparison.source_schema_version.to_string(),
        comparison.target_schema_version.to_string(),
        status(comparison.source_schema_version == comparison.target_schema_version),
    ]);
    let mut text = format_table(&["TABLE", "SOURCE", "TARGET", "STATUS"], &rows);
    text.push('\n');
    text.push_str(&format!(
        "source: {}\ntarget: {}\n",
        comparison.source, comparison.target
    ));
    match comparison.copy_state.as_deref() {
        Some("copying") => text.push_str(
            "The target holds an unfinished copy: run 'svc-migrate run' again to finish it.\n",
        ),
        Some("done") => text.push_str("The target holds a finished svc-migrate copy.\n"),
        _ => {}
    }
    if comparison.matches {
        let rows: i64 = comparison.tables.iter().map(|table| table.source).sum();
        text.push_str(&format!(
            "They match: {} tables, {rows} rows, the same audit head.\n",
            comparison.tables.len()
        ));
    }
    text
}

async fn version(output: Output, args: VersionArgs) -> Result<(), CliError> {
    let binary = copy::binary_schema_version();
    let store = match &args.store {
        None => None,
        Some(store) if is_postgres_url(store) => {
            let target = postgres_target("--store", store)?;
            let version = copy::postgres_schema_version(&target)
                .await
                .map_err(engine_error)?;
            Some((format!("postgres {}", target.shown()), version))
        }
        Some(store) => {
            let path = sqlite_path("--store", store).map_err(|_| {
                CliError::usage(
                    "--store must be sqlite:PATH or postgres://user:password@host:port/database",
                )
            })?;
            let source = Source::open(&path, false).map_err(engine_error)?;
            let version = source.schema_version().map_err(engine_error)?;
            Some((format!("sqlite {}", source.path.display()), version))
        }
    };
    let note = store.as_ref().and_then(|(_, version)| {
        use std::cmp::Ordering;
        match version.cmp(&binary) {
            Ordering::Equal => None,
            Ordering::Less => Some(format!(
                "the store is older than this binary: svc-server applies migrations {}..{binary} \
                 at its next start (svc-migrate run needs a source at {binary})",
                version + 1
            )),
            Ordering::Greater => Some(format!(
                "the store is newer than this binary ({version} > {binary}): use the svc \
                 release that wrote it"
            )),
        }
    });
    match output {
        Output::Json => {
            let mut document = serde_json::json!({ "binary": binary });
            if let Some((name, version)) = &store {
                document["store"] = serde_json::json!({ "name": name, "schema_version": version });
                document["match"] = serde_json::json!(*version == binary);
                document["note"] = serde_json::json!(note);
            }
            print_json(&document)
        }
        Output::Table => {
            println!("this binary: schema version {binary}");
            if let Some((name, version)) = &store {
                println!("{name}: schema version {version}");
            }
            if let Some(note) = note {
                println!("note: {note}");
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// svc-migrate's help as it was written by hand before its table.
    const WRITTEN_HELP: &str = "\
Usage: svc-migrate <command> [<args>]

Copy the svc store from SQLite to PostgreSQL, check the copy, and show schema versions.

Stop the server first; afterwards point it at PostgreSQL (store: { driver: postgres, url: ... })
with the same master_key and hmacsecret.

Commands:
  run       copy every row: --from sqlite:PATH --to postgres://... [--force] [--batch-rows N]
            resumable: run it again after an interruption and it continues where it stopped
  validate  compare row counts table by table and the audit chain's head:
            --from sqlite:PATH --to postgres://...; exit 0 when they match, 1 when not
  version   this binary's schema version, and with --store sqlite:PATH|postgres://... a store's

Options:
  -o, --output FORMAT  table (default) or json
  -h, --help           show help (COMMAND --help: a command's flags and edge cases)
  -v, --version        show the version

PostgreSQL URLs: postgres://user:password@host:port/database?sslmode=verify-full&sslrootcert=ca.pem
(sslmode disable | prefer (default) | require | verify-full). Leave the password out of the URL
and set PGPASSWORD to keep it out of the process list. The password is never printed.
";

    #[test]
    fn the_help_is_rendered_from_the_table_as_written() {
        assert_eq!(help(), WRITTEN_HELP);
        for command in COMMANDS {
            assert!(command_info(command.word).is_some(), "{}", command.word);
        }
    }

    #[test]
    fn store_arguments() {
        assert_eq!(
            sqlite_path("--from", "sqlite:/var/lib/svc/svc.db").unwrap(),
            std::path::PathBuf::from("/var/lib/svc/svc.db")
        );
        let cases = [
            ("sqlite:", "needs a path"),
            ("/var/lib/svc/svc.db", "must be sqlite:PATH"),
            ("postgres://u@h/db", "copies from SQLite to PostgreSQL"),
        ];
        for (value, expected) in cases {
            let error = sqlite_path("--from", value).unwrap_err();
            assert_eq!(error.code, exit::USAGE, "{value}");
            assert!(
                error.message.contains(expected),
                "{value}: {}",
                error.message
            );
        }
        let error = postgres_target("--to", "mysql://u:secret@h/db").unwrap_err();
        assert_eq!(error.code, exit::USAGE);
        assert!(!error.message.contains("secret"), "{}", error.message);
        let error =
            postgres_target("--to", "postgres://u:secret@h/db?sslmode=sometimes").unwrap_err();
        assert!(error.message.contains("sslmode"), "{}", error.message);
        assert!(!error.message.contains("secret"), "{}", error.message);
    }

    #[test]
    fn password_from_the_environment() {
        let cases = [
            ("postgres://u@h:5/db", "p w", "postgres://u:p%20w@h:5/db"),
            (
                "postgres://u@h/db?sslmode=disable",
                "x",
                "postgres://u:x@h/db?sslmode=disable",
            ),
            ("postgres://u:given@h/db", "x", "postgres://u:given@h/db"),
            ("postgres://h/db", "x", "postgres://h/db"),
            ("postgres://u@h/db", "", "postgres://u@h/db"),
            ("postgres://a@b@h/db", "p@", "postgres://a@b:p%40@h/db"),
        ];
        for (url, password, expected) in cases {
            assert_eq!(with_password(url, password), expected, "{url}");
        }
    }

    #[test]
    fn output_flag_anywhere() {
        let mut args: Vec<String> = [
            "-o",
            "json",
            "run",
            "--output=table",
            "--to",
            "x",
            "--",
            "-o",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(take_output(&mut args).unwrap(), Output::Table);
        assert_eq!(args, ["run", "--to", "x", "--", "-o"]);
        assert_eq!(
            take_output(&mut vec!["-o".to_string()]).unwrap_err().code,
            exit::USAGE
        );
    }
}
