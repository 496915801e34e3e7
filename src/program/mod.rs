//! What every program under svc's names shares, the daemons and the CLIs alike: exit codes
//! (contract §1), the one map from errors to them (`exit::of_code`), and the error that
//! carries one, argument parsing with `--help` and
//! `--version`, the common client flags, the runtime a command's body runs on, output formats
//! (`output.rs`), the log-filter flag, a table of commands and its help, and the `Doc` every
//! hand-made help is rendered from (`planned.rs`), the
//! list of names the binary answers to, and the daemons' release of code pages they no longer
//! run (`trim.rs`). A leaf: it knows no domain, daemon or CLI, so the
//! daemons use it without depending on the CLIs.
//!
//! Common flags (`--server`, `--http-url`, `--api-key`, `--ca-file`, `-o`) are taken out of the
//! arguments here, before a CLI's own parser sees them, so they work at any position
//! (`svcctl -o json apikey list` and `svcctl apikey list -o json`) without every subcommand
//! declaring them again. Each is one row of `COMMON_FLAGS` (its names, value, environment
//! variable, default and help), which the scanner, the `Common options:` help and svcctl's
//! passing them on to a mode all read, so a flag's variable or default is written once.

use std::fmt;
use std::path::PathBuf;

use argh::FromArgs;

pub mod output;
pub mod planned;
pub mod trim;

pub use output::Output;

/// Every name the binary answers to besides `svc` itself, in `svc --list` order: what
/// install.sh and svc-bootstrap link, and what completions and man pages cover. `dispatch`
/// maps each to its entry function, and its tests hold the two together.
pub const NAMES: &[&str] = &[
    "svc-server",
    "svcctl",
    "svc-migrate",
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
    "svc-module",
    "svc-registry",
    "svc-runbook",
    "svc-webhook",
];

/// Exit codes of every program (contract §1).
pub mod exit {
    pub const OK: i32 = 0;
    pub const FAILED: i32 = 1;
    pub const USAGE: i32 = 2;
    pub const UNREACHABLE: i32 = 3;
    pub const DENIED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const UNKNOWN_COMMAND: i32 = 127;

    /// The exit code of a failure, by its REST error code (`Error::code`: what REST bodies
    /// and the bus replies carry too). The one map from errors to exit codes: a domain
    /// `Error`, a gRPC status and an HTTP status are each named by that code first
    /// (`of_error`, `of_grpc`, `of_http`), so every CLI exits alike for the same failure.
    pub fn of_code(code: &str) -> i32 {
        match code {
            "not_found" => NOT_FOUND,
            "unauthenticated" | "permission_denied" => DENIED,
            "unavailable" => UNREACHABLE,
            _ => FAILED,
        }
    }

    /// The exit code of a domain error run in the CLI's own process.
    pub fn of_error(error: &crate::error::Error) -> i32 {
        of_code(error.code())
    }

    /// The exit code of a gRPC status: the codes `From<Error> for Status` gives the errors
    /// `of_code` singles out.
    pub fn of_grpc(code: tonic::Code) -> i32 {
        use tonic::Code;
        of_code(match code {
            Code::NotFound => "not_found",
            Code::Unauthenticated => "unauthenticated",
            Code::PermissionDenied => "permission_denied",
            Code::Unavailable => "unavailable",
            _ => "",
        })
    }

    /// The exit code of an HTTP error status: the statuses `Error::http_status` gives the
    /// errors `of_code` singles out.
    pub fn of_http(status: u16) -> i32 {
        of_code(match status {
            404 => "not_found",
            401 => "unauthenticated",
            403 => "permission_denied",
            503 => "unavailable",
            _ => "",
        })
    }
}

/// A CLI failure: the exit code and the one-line message for stderr.
#[derive(Debug)]
pub struct CliError {
    pub code: i32,
    pub message: String,
}

impl CliError {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        CliError {
            code,
            message: message.into(),
        }
    }
    pub fn usage(message: impl Into<String>) -> Self {
        CliError::new(exit::USAGE, message)
    }
    pub fn failed(message: impl Into<String>) -> Self {
        CliError::new(exit::FAILED, message)
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<tonic::Status> for CliError {
    fn from(status: tonic::Status) -> Self {
        use tonic::Code;
        let message = status.message().to_string();
        let code = exit::of_grpc(status.code());
        match status.code() {
            Code::Unavailable => CliError::new(code, format!("cannot reach the server: {message}")),
            Code::Unimplemented => CliError::new(code, format!("Unimplemented: {message}")),
            Code::Unauthenticated | Code::PermissionDenied | Code::NotFound => {
                CliError::new(code, message)
            }
            // Made here, not by the server (only a local transport failure carries a source):
            // the connection itself broke, typically a plain client talking to a TLS port,
            // whose server hangs up on the first bytes.
            _ if std::error::Error::source(&status).is_some() => CliError::new(
                exit::UNREACHABLE,
                format!(
                    "the connection to the server failed ({message}); if the server uses TLS, \
                     give --server as https://HOST:PORT"
                ),
            ),
            _ => CliError::new(code, message),
        }
    }
}

/// A domain error from code a CLI runs in its own process (svc-migrate's engine, the offline
/// backup commands, svc-agent's requests over the bus).
impl From<crate::error::Error> for CliError {
    fn from(error: crate::error::Error) -> Self {
        CliError::new(exit::of_error(&error), error.to_string())
    }
}

/// The flags every client CLI shares, after environment defaults.
#[derive(Clone, Debug)]
pub struct Common {
    /// gRPC address: host:port (plain), or `http://` / `https://` with host:port.
    pub server: String,
    /// REST base URL, `http://` or `https://`.
    pub http_url: String,
    pub api_key: Option<String>,
    /// PEM CA bundle to trust for `https://` instead of the system's store.
    pub ca_file: Option<PathBuf>,
    pub output: Output,
}

/// Which field of [`Common`] a common flag sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommonField {
    Server,
    HttpUrl,
    ApiKey,
    CaFile,
    Output,
}

/// One common client flag, defined once: `take_common` scans for it, `common_help` describes
/// it, svcctl passes it on to the modes it runs in-process, and completions and man pages read
/// it through `cli::helptext`.
#[derive(Debug)]
pub struct CommonFlag {
    /// `-o`; most have no short form.
    pub short: Option<&'static str>,
    pub long: &'static str,
    /// The placeholder the help shows after the flag.
    pub value: &'static str,
    pub field: CommonField,
    /// The environment variable read when the flag is not given.
    pub env: Option<&'static str>,
    /// The value when neither the flag nor its variable is given.
    pub default: Option<&'static str>,
    /// The help text, lines split by `\n`; `{env}` stands for `env VAR, default VALUE` so
    /// the two are written only in `env` and `default`.
    pub help: &'static str,
}

/// Every common client flag, in help order.
pub const COMMON_FLAGS: &[CommonFlag] = &[
    CommonFlag {
        short: None,
        long: "--server",
        value: "HOST:PORT",
        field: CommonField::Server,
        env: Some("SVC_SERVER"),
        default: Some("localhost:5397"),
        help: "gRPC address of svc-server ({env});\nhttps://HOST:PORT when the server has TLS",
    },
    CommonFlag {
        short: None,
        long: "--http-url",
        value: "URL",
        field: CommonField::HttpUrl,
        env: Some("SVC_HTTP_URL"),
        default: Some("http://localhost:8080"),
        help: "REST address of svc-server ({env});\nhttps://HOST:PORT when the server has TLS",
    },
    CommonFlag {
        short: None,
        long: "--api-key",
        value: "KEY",
        field: CommonField::ApiKey,
        env: Some("SVC_API_KEY"),
        default: None,
        help: "API key ({env})",
    },
    CommonFlag {
        short: None,
        long: "--ca-file",
        value: "PATH",
        field: CommonField::CaFile,
        env: Some("SVC_CA_FILE"),
        // The system's CA store, which is no value of the flag: the help says so in words.
        default: None,
        help: "PEM CA bundle to trust for https:// ({env}; default: the\nsystem's CA store), e.g. \
               for a self-signed or internal CA",
    },
    CommonFlag {
        short: Some("-o"),
        long: "--output",
        value: "FORMAT",
        field: CommonField::Output,
        env: None,
        default: Some("table"),
        help: "table (default) or json",
    },
];

/// The help and version flags, which every name takes: the last line of the common options.
const COMMON_HELP_TAIL: (&str, &str) =
    ("-h, --help", "show help;  -v, --version  show the version");

impl CommonFlag {
    /// The term its help line starts with: `-o, --output FORMAT`.
    pub fn term(&self) -> String {
        match self.short {
            Some(short) => format!("{short}, {} {}", self.long, self.value),
            None => format!("{} {}", self.long, self.value),
        }
    }

    /// Its help text with `{env}` filled in, lines split by `\n`.
    pub fn about(&self) -> String {
        let env = match (self.env, self.default) {
            (Some(env), Some(default)) => format!("env {env}, default {default}"),
            (Some(env), None) => format!("env {env}"),
            (None, _) => String::new(),
        };
        self.help.replace("{env}", &env)
    }

    /// Whether `arg` (without any `=value`) names this flag.
    fn is(&self, arg: &str) -> bool {
        arg == self.long || self.short == Some(arg)
    }
}

impl Common {
    /// Sets `field` to a value given on the command line (or a default).
    fn set(&mut self, field: CommonField, value: String) -> Result<(), CliError> {
        match field {
            CommonField::Server => self.server = value,
            CommonField::HttpUrl => self.http_url = value,
            CommonField::ApiKey => self.api_key = Some(value),
            CommonField::CaFile => self.ca_file = Some(PathBuf::from(value)),
            CommonField::Output => self.output = value.parse()?,
        }
        Ok(())
    }

    /// Sets `field` from its environment variable. An empty API key or CA path counts as
    /// unset (`SVC_API_KEY=` turns the key off); a path need not be UTF-8, and any other
    /// value that is not is ignored.
    fn set_from_env(&mut self, field: CommonField, value: std::ffi::OsString) {
        match field {
            CommonField::CaFile => {
                if !value.is_empty() {
                    self.ca_file = Some(PathBuf::from(value));
                }
            }
            _ => {
                let Ok(value) = value.into_string() else {
                    return;
                };
                if field == CommonField::ApiKey && value.is_empty() {
                    return;
                }
                // Every field but the output format, which has no variable, takes any string.
                let _ = self.set(field, value);
            }
        }
    }

    /// The value of `field` as the flag would give it; None when it is unset or the output
    /// format is the default table.
    pub fn value(&self, field: CommonField) -> Option<String> {
        match field {
            CommonField::Server => Some(self.server.clone()),
            CommonField::HttpUrl => Some(self.http_url.clone()),
            CommonField::ApiKey => self.api_key.clone(),
            CommonField::CaFile => self.ca_file.as_ref().map(|p| p.display().to_string()),
            CommonField::Output => (self.output == Output::Json).then(|| "json".to_string()),
        }
    }
}

/// The `Common options:` section of a client CLI's help, made from [`COMMON_FLAGS`].
pub fn common_section() -> planned::DocSection {
    let mut rows: Vec<(String, String)> = COMMON_FLAGS
        .iter()
        .map(|flag| (flag.term(), flag.about()))
        .collect();
    rows.push((
        COMMON_HELP_TAIL.0.to_string(),
        COMMON_HELP_TAIL.1.to_string(),
    ));
    planned::DocSection {
        rows,
        more_flags: &[(COMMON_HELP_TAIL.0, &["-v", "--version"])],
        ..planned::DocSection::new("Common options", &[])
    }
}

/// [`common_section`] as text, without a final newline.
pub fn common_help() -> String {
    common_section().render().trim_end_matches('\n').to_string()
}

/// The common flag that sets `field`.
pub fn common_flag(field: CommonField) -> &'static CommonFlag {
    COMMON_FLAGS
        .iter()
        .find(|flag| flag.field == field)
        .expect("every field has its flag")
}

/// Takes only `-o/--output FORMAT` out of `args`, as [`take_common`] takes it: for a program
/// that talks to no server (svc-migrate) but prints tables or JSON like the clients.
pub fn take_output(args: &mut Vec<String>) -> Result<Output, CliError> {
    let mut output = Output::Table;
    take_flags(
        args,
        &[common_flag(CommonField::Output)],
        &mut |_, value| {
            output = value.parse()?;
            Ok(())
        },
    )?;
    Ok(output)
}

/// Takes the common flags out of `args` (stopping at `--`), falling back to the environment.
pub fn take_common(args: &mut Vec<String>) -> Result<Common, CliError> {
    let mut common = Common {
        server: String::new(),
        http_url: String::new(),
        api_key: None,
        ca_file: None,
        output: Output::Table,
    };
    for flag in COMMON_FLAGS {
        if let Some(default) = flag.default {
            common.set(flag.field, default.to_string())?;
        }
        if let Some(value) = flag.env.and_then(std::env::var_os) {
            common.set_from_env(flag.field, value);
        }
    }
    let every: Vec<&CommonFlag> = COMMON_FLAGS.iter().collect();
    take_flags(args, &every, &mut |field, value| common.set(field, value))?;
    Ok(common)
}

/// Takes `flags` out of `args` (stopping at `--`): `--flag VALUE`, `--flag=VALUE` or `-o VALUE`,
/// each value handed to `set`; everything else stays, in order.
fn take_flags(
    args: &mut Vec<String>,
    flags: &[&CommonFlag],
    set: &mut dyn FnMut(CommonField, String) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let mut kept = Vec::with_capacity(args.len());
    let mut iter = std::mem::take(args).into_iter();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            kept.push(arg);
            kept.extend(iter.by_ref());
            break;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        let Some(flag) = flags.iter().find(|flag| flag.is(name)) else {
            kept.push(arg);
            continue;
        };
        let value = match inline.or_else(|| iter.next()) {
            Some(value) => value,
            None => return Err(CliError::usage(format!("{name} needs a value"))),
        };
        set(flag.field, value)?;
    }
    *args = kept;
    Ok(())
}

/// The version line every name prints for `-v/--version`.
pub fn version_line(program: &str) -> String {
    format!(
        "{program} {} (commit {}, built {})",
        env!("CARGO_PKG_VERSION"),
        env!("BUILT_GIT_COMMIT"),
        env!("BUILT_DATE")
    )
}

/// Whether the first argument asks for the version.
pub fn wants_version(args: &[String]) -> bool {
    matches!(args.first().map(String::as_str), Some("-v" | "--version"))
}

/// Parses `args` with argh: help goes to stdout (exit 0), usage errors to stderr (exit 2).
/// `-v/--version` as the first argument prints the version (exit 0).
pub fn parse_args<T: FromArgs>(program: &str, args: &[String]) -> Result<T, i32> {
    if wants_version(args) {
        println!("{}", version_line(program));
        return Err(exit::OK);
    }
    let strs: Vec<&str> = args.iter().map(String::as_str).collect();
    T::from_args(&[program], &strs).map_err(|early| early_exit(program, early))
}

/// What argh's early exit means: help (printed, exit 0) or a usage error (its first line and
/// a pointer to `--help` on stderr, exit 2). Kept out of [`parse_args`], which is instantiated
/// once per command's argument type, so that this is compiled once.
fn early_exit(program: &str, early: argh::EarlyExit) -> i32 {
    match early.status {
        Ok(()) => {
            print!("{}", early.output);
            exit::OK
        }
        Err(()) => {
            let first = early.output.lines().next().unwrap_or("invalid arguments");
            eprintln!("{program}: {first}");
            eprintln!("{program}: run '{program} --help' for usage");
            exit::USAGE
        }
    }
}

/// The current-thread runtime a command runs on; when it cannot be made, says so as
/// `program: ...` and gives the exit code.
pub fn runtime(program: &str) -> Result<tokio::runtime::Runtime, i32> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("{program}: cannot start the async runtime: {e}");
            exit::FAILED
        })
}

/// Runs a CLI body on a current-thread runtime; prints its error as `program: message`.
pub fn run_async<'a>(
    program: &str,
    body: impl std::future::Future<Output = Result<(), CliError>> + 'a,
) -> i32 {
    run_boxed(program, Box::pin(body))
}

/// [`run_async`]'s work, compiled once: every command's future is boxed into the same type, so
/// the runtime's `block_on` loop is not copied for each of them (it was 21 copies, 81 KB of the
/// binary: docs/release.md).
fn run_boxed(
    program: &str,
    body: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), CliError>> + '_>>,
) -> i32 {
    let runtime = match runtime(program) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(body) {
        Ok(()) => exit::OK,
        Err(error) => {
            eprintln!("{program}: {}", error.message);
            error.code
        }
    }
}

/// A log level or filter (`info`, `debug`, `svc=debug,info`): the `--log-level` value of the
/// daemons and svc-bootstrap.
pub fn log_filter(value: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(value)
        .map(|_| value.to_string())
        .map_err(|e| {
            format!(
                "not a log level or filter ({e}); expected one of error, warn, info, debug, \
                 trace, or a filter like svc=debug,info"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn common_flags_anywhere_before_double_dash() {
        let mut args = strings(&[
            "apikey",
            "-o",
            "json",
            "list",
            "--api-key=k",
            "--server",
            "h:1",
            "--ca-file=/etc/ca.pem",
            "--",
            "-o",
            "x",
        ]);
        let common = take_common(&mut args).unwrap();
        assert_eq!(args, strings(&["apikey", "list", "--", "-o", "x"]));
        assert_eq!(common.output, Output::Json);
        assert_eq!(common.api_key.as_deref(), Some("k"));
        assert_eq!(common.server, "h:1");
        assert_eq!(common.ca_file, Some(PathBuf::from("/etc/ca.pem")));
    }

    #[test]
    fn every_kind_of_error_maps_to_the_same_exit_code() {
        use crate::error::Error;
        use tonic::Code;
        // (domain error, the gRPC code and HTTP status the server gives it, exit code)
        let cases = [
            (
                Error::NotFound("x".into()),
                Code::NotFound,
                404,
                exit::NOT_FOUND,
            ),
            (
                Error::Unauthenticated("x".into()),
                Code::Unauthenticated,
                401,
                exit::DENIED,
            ),
            (
                Error::Forbidden("x".into()),
                Code::PermissionDenied,
                403,
                exit::DENIED,
            ),
            (
                Error::Unavailable("x".into()),
                Code::Unavailable,
                503,
                exit::UNREACHABLE,
            ),
            (
                Error::Invalid("x".into()),
                Code::InvalidArgument,
                422,
                exit::FAILED,
            ),
            (
                Error::Conflict("x".into()),
                Code::AlreadyExists,
                409,
                exit::FAILED,
            ),
            (
                Error::Unimplemented("x".into()),
                Code::Unimplemented,
                501,
                exit::FAILED,
            ),
            (
                Error::Internal("x".into()),
                Code::Internal,
                500,
                exit::FAILED,
            ),
        ];
        for (error, grpc, http, expected) in cases {
            assert_eq!(error.http_status(), http, "{error:?}");
            assert_eq!(exit::of_error(&error), expected, "{error:?}");
            assert_eq!(exit::of_code(error.code()), expected, "{error:?}");
            assert_eq!(exit::of_http(http), expected, "{error:?}");
            assert_eq!(exit::of_grpc(grpc), expected, "{error:?}");
            let status = tonic::Status::from(error);
            assert_eq!(status.code(), grpc);
            assert_eq!(CliError::from(status).code, expected);
        }
    }

    /// The common options as they were written by hand before they became data: every CLI's
    /// help shows them, and tests and scripts compare that help byte for byte.
    const WRITTEN_COMMON_HELP: &str = "\
Common options:
  --server HOST:PORT   gRPC address of svc-server (env SVC_SERVER, default localhost:5397);
                       https://HOST:PORT when the server has TLS
  --http-url URL       REST address of svc-server (env SVC_HTTP_URL, default http://localhost:8080);
                       https://HOST:PORT when the server has TLS
  --api-key KEY        API key (env SVC_API_KEY)
  --ca-file PATH       PEM CA bundle to trust for https:// (env SVC_CA_FILE; default: the
                       system's CA store), e.g. for a self-signed or internal CA
  -o, --output FORMAT  table (default) or json
  -h, --help           show help;  -v, --version  show the version";

    #[test]
    fn the_common_help_is_rendered_from_the_flags_as_written() {
        assert_eq!(common_help(), WRITTEN_COMMON_HELP);
    }

    #[test]
    fn common_flags_give_their_values_back_as_flags() {
        let mut args = strings(&["--server=h:1", "--api-key", "k", "-o", "json"]);
        let common = take_common(&mut args).unwrap();
        assert!(args.is_empty());
        let values: Vec<Option<String>> = COMMON_FLAGS
            .iter()
            .map(|flag| common.value(flag.field))
            .collect();
        assert_eq!(values[0].as_deref(), Some("h:1"));
        assert_eq!(values[2].as_deref(), Some("k"));
        assert_eq!(values[4].as_deref(), Some("json"));
    }

    #[test]
    fn common_flag_errors() {
        assert_eq!(
            take_common(&mut strings(&["--api-key"])).unwrap_err().code,
            exit::USAGE
        );
        assert_eq!(
            take_common(&mut strings(&["-o", "yaml"])).unwrap_err().code,
            exit::USAGE
        );
        assert_eq!(
            take_common(&mut strings(&["--server"]))
                .unwrap_err()
                .message,
            "--server needs a value"
        );
        assert_eq!(
            take_common(&mut strings(&["--output=yaml"]))
                .unwrap_err()
                .message,
            "unknown output format 'yaml' (expected table or json)"
        );
    }
}
