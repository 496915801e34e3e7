//! `svc-registry`: the module registry's HTTP(S) server (`serve`) and `version`; the routes and
//! the publishing rules are in src/modules/registry.rs and docs/modules.md.

use std::net::SocketAddr;
use std::path::PathBuf;

use argh::FromArgs;

use super::{CliError, Common};
use crate::config::TlsConfig;
use crate::modules::registry::{self, Auth, Registry, Transport};

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_subcommands::<Args, _>(program, args, body)
}

/// The argh definition of `Args`, whose subcommands are the commands `main` runs: what help,
/// completions and man pages read (`cli::args_info`, `cli::top_help`).
pub fn args_info() -> argh::CommandInfoWithArgs {
    <Args as argh::ArgsInfo>::get_args_info()
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Module registry.
#[argh(help_triggers("-h", "--help"))]
struct Args {
    #[argh(subcommand)]
    command: Command,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum Command {
    Serve(ServeArgs),
    Version(VersionArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Serve the registry over HTTPS (--tls-cert and --tls-key) or plain HTTP: list modules and
/// versions (with SHA-256), download ZIPs and signatures, publish with a token; versions are
/// immutable. GET /openapi.json describes it. Clients send plain http:// only to this machine
/// unless given --allow-plain-http, so serve HTTPS for other hosts.
#[argh(subcommand, name = "serve", help_triggers("-h", "--help"))]
struct ServeArgs {
    /// address to listen on (default 127.0.0.1:8095)
    #[argh(option, default = "String::from(\"127.0.0.1:8095\")")]
    listen: String,
    /// where modules are stored (default ./registry)
    #[argh(option, default = "PathBuf::from(\"registry\")")]
    dir: PathBuf,
    /// a file of publish tokens, one a line (env SVC_REGISTRY_TOKEN_FILE)
    #[argh(option)]
    token_file: Option<PathBuf>,
    /// PEM certificate chain to serve HTTPS with (needs --tls-key)
    #[argh(option)]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (PKCS#8, SEC1 or PKCS#1)
    #[argh(option)]
    tls_key: Option<PathBuf>,
    /// an svc-server REST URL: its operator and admin API keys may publish too; for https://
    /// its certificate must chain to --ca-file (env SVC_CA_FILE) or the system's CA store
    #[argh(option)]
    svc_url: Option<String>,
    /// allow --svc-url to be plain http:// to another host (API keys then cross the network
    /// in clear)
    #[argh(switch)]
    allow_plain_http: bool,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Print the registry's version.
#[argh(subcommand, name = "version", help_triggers("-h", "--help"))]
struct VersionArgs {}

async fn body(common: Common, args: Args) -> Result<(), CliError> {
    match args.command {
        Command::Version(_) => {
            let version = super::version_line("svc-registry");
            if common.output == super::Output::Json {
                super::output::print_json(
                    &serde_json::json!({"version": env!("CARGO_PKG_VERSION"), "api": "v1", "line": version}),
                )
            } else {
                println!("{version} (registry API v1)");
                Ok(())
            }
        }
        Command::Serve(a) => {
            let listen: SocketAddr = a
                .listen
                .parse()
                .map_err(|e| CliError::usage(format!("--listen '{}': {e}", a.listen)))?;
            let token_file = a.token_file.or_else(|| {
                std::env::var_os("SVC_REGISTRY_TOKEN_FILE")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            });
            let path = |p: Option<PathBuf>| p.map(|p| p.display().to_string()).unwrap_or_default();
            let tls = crate::tls::http_server_tls(
                &TlsConfig {
                    cert: path(a.tls_cert),
                    key: path(a.tls_key),
                },
                ("--tls-cert", "--tls-key"),
            )
            .map_err(CliError::usage)?;
            let svc = match a.svc_url {
                Some(url) => {
                    let transport = Transport::new(
                        common.ca_file.as_deref(),
                        a.allow_plain_http,
                        ("--ca-file PATH (or set SVC_CA_FILE)", "--allow-plain-http"),
                    )
                    .and_then(|t| t.check(&url).map(|()| t))
                    .map_err(|e| CliError::usage(format!("--svc-url: {e}")))?;
                    Some((url, transport))
                }
                None => None,
            };
            let auth = Auth::load(token_file.as_deref(), svc)?;
            if auth.token_hashes.is_empty() && auth.svc.is_none() {
                eprintln!("svc-registry: no --token-file and no --svc-url: nobody can publish (reads are open)");
            }
            let _ = tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .try_init();
            registry::serve(listen, Registry { dir: a.dir, auth }, tls).await?;
            Ok(())
        }
    }
}
