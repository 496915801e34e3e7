//! svc-agent: the host daemon. `bootstrap` enrols (bootstrap.rs), `run` (the default) is the
//! daemon (daemon.rs: bus, heartbeats, commands; content.rs fetches state plans too large
//! for a command; renew.rs keeps its NATS user JWT fresh on a JWT-mode cluster), `executor`
//! the privileged half of a split agent (executor.rs: checks each command's server signature,
//! then exec.rs runs programs, `crate::state` applies states and `crate::modules::bundle`
//! runs modules; inline in the daemon by default), `service` manages its two systemd units
//! (service.rs), `jwt` prints the agent's own JWT-SVID (jwt.rs). The bus credentials an
//! enrolled agent connects with are here: its certificate and a signed nonce, or on a
//! JWT-mode cluster its NATS user JWT and nkey.
//!
//! `--config PATH` is global (`svc-agent --config PATH bootstrap ...`, or after the command);
//! it is taken out here before the command's own parser runs.

mod bootstrap;
mod content;
mod daemon;
mod exec;
mod executor;
pub mod jwt;
mod renew;
mod service;

use std::path::{Path, PathBuf};

use crate::program::exit;
use crate::program::planned::{self, Planned};

/// The agent's files under `state_dir`.
pub const KEY_FILE: &str = "key.pem";
pub const CERT_FILE: &str = "cert.pem";
pub const CA_FILE: &str = "ca.pem";
/// The agent's user JWT and nkey seed for an external NATS cluster in JWT mode (written by
/// bootstrap when the server issues one; the daemon then logs in with them).
pub const BUS_JWT_FILE: &str = "bus.jwt";
pub const BUS_NKEY_FILE: &str = "bus.nk";
/// The cluster's enrolment JWT, kept to renew bus.jwt (renew.rs).
pub const ENROL_JWT_FILE: &str = "enrol.jwt";
pub const DEFAULT_CONFIG: &str = "/etc/svc/agent.yaml";

/// One svc-agent command, named once: its word, the summary its help lists it with (with
/// the flags it needs), its argh definition (what help, completions and man pages read:
/// `cli::args_info`) and its entry (program, `--config`, the arguments after the word).
struct Command {
    word: &'static str,
    summary: &'static str,
    info: fn() -> argh::CommandInfoWithArgs,
    run: fn(&str, Option<PathBuf>, &[String]) -> i32,
}

/// svc-agent's commands, in help order. `executor` (the privileged half of a split agent,
/// started by the daemon's unit) is not listed: an operator does not run it.
const COMMANDS: &[Command] = &[
    Command {
        word: "bootstrap",
        summary: "enrol: interactive wizard, or --non-interactive --server URL --agent-id ID (--token T | --psk P) [--labels k=v,...]",
        info: <bootstrap::Args as argh::ArgsInfo>::get_args_info,
        run: bootstrap::main,
    },
    Command {
        word: "service",
        summary: "manage the systemd unit: install | uninstall | status",
        info: <service::Args as argh::ArgsInfo>::get_args_info,
        run: service::main,
    },
    Command {
        word: "run",
        summary: "run the daemon (the default): [--log-level LEVEL]",
        info: <daemon::RunArgs as argh::ArgsInfo>::get_args_info,
        run: run_daemon,
    },
    Command {
        word: "jwt",
        summary: "print this agent's JWT-SVID: --audience A [--ttl D] [-o json]",
        info: <jwt::Args as argh::ArgsInfo>::get_args_info,
        run: jwt::main,
    },
];

/// svc-agent's help row, its commands read from [`COMMANDS`], given to `body`.
pub fn with_planned<R>(body: impl FnOnce(&Planned) -> R) -> R {
    let commands: Vec<(&str, &str)> = COMMANDS
        .iter()
        .map(|command| (command.word, command.summary))
        .collect();
    let built: Vec<&str> = COMMANDS.iter().map(|command| command.word).collect();
    body(&Planned {
        name: "svc-agent",
        about: "Host daemon: enrols with the server, heartbeats, runs commands and applies state.\nWith no command it runs the daemon (--config PATH, default /etc/svc/agent.yaml).",
        commands: &commands,
        default: Some("run"),
        is_client: false,
        built: &built,
    })
}

/// The argh definition of the command `word` (`cli::args_info`).
pub fn command_info(word: &str) -> Option<argh::CommandInfoWithArgs> {
    COMMANDS
        .iter()
        .find(|command| command.word == word)
        .map(|command| (command.info)())
}

pub fn main(program: &str, args: Vec<String>) -> i32 {
    let (config, rest) = match take_config(args) {
        Ok(split) => split,
        Err(message) => {
            eprintln!("{program}: {message}");
            return exit::USAGE;
        }
    };
    let word = rest.first().map(String::as_str);
    if let Some(command) = COMMANDS.iter().find(|command| Some(command.word) == word) {
        return (command.run)(program, config, &rest[1..]);
    }
    match word {
        Some("executor") => executor::main(program, config, &rest[1..]),
        None => run_daemon(program, config, &[]),
        Some(flag) if flag.starts_with("--") && !matches!(flag, "--help" | "--version") => {
            run_daemon(program, config, &rest)
        }
        _ => with_planned(|planned| planned::run(planned, &rest)),
    }
}

fn run_daemon(program: &str, config: Option<PathBuf>, args: &[String]) -> i32 {
    match crate::program::parse_args::<daemon::RunArgs>(&format!("{program} run"), args) {
        Ok(args) => daemon::main(program, config, args),
        Err(code) => code,
    }
}

/// Takes `--config PATH` / `--config=PATH` out of the arguments (before any `--`).
fn take_config(args: Vec<String>) -> Result<(Option<PathBuf>, Vec<String>), String> {
    let mut config = None;
    let mut rest = Vec::with_capacity(args.len());
    let mut iter = args.into_iter();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            rest.push(arg);
            rest.extend(iter.by_ref());
            break;
        }
        if arg == "--config" {
            config = Some(PathBuf::from(iter.next().ok_or("--config needs a value")?));
        } else if let Some(value) = arg.strip_prefix("--config=") {
            config = Some(PathBuf::from(value));
        } else {
            rest.push(arg);
        }
    }
    Ok((config, rest))
}

/// The agent's configuration for a command of `program`; its problems printed as
/// `program: problem`, and the exit code to return, when it does not load.
pub(crate) fn load_config(
    program: &str,
    path: Option<&Path>,
) -> Result<crate::config::AgentConfig, i32> {
    crate::config::load_agent(path, &crate::config::process_env())
        .map(|loaded| loaded.config)
        .map_err(|errors| {
            for problem in &errors.0 {
                eprintln!("{program}: {problem}");
            }
            exit::FAILED
        })
}

/// Bus credentials of an enrolled agent: its certificate (PEM, in CONNECT `jwt`) and a
/// signature of the INFO nonce with its key (base64url, in `sig`'s place: CONNECT `pass`,
/// since async-nats sends `sig` only with its nkeys feature). The server checks the
/// certificate against the current signing CA and the signature against the certificate.
pub fn bus_credentials(state_dir: &Path) -> crate::Result<(String, ring::signature::EcdsaKeyPair)> {
    let read = |name: &str| {
        std::fs::read_to_string(state_dir.join(name)).map_err(|e| {
            crate::Error::Invalid(format!(
                "cannot read {}: {e} (run svc-agent bootstrap)",
                state_dir.join(name).display()
            ))
        })
    };
    let cert_pem = read(CERT_FILE)?;
    let key_pem = read(KEY_FILE)?;
    let (_, key) = x509_parser::pem::parse_x509_pem(key_pem.as_bytes())
        .map_err(|_| crate::Error::Invalid("key.pem is not PEM".into()))?;
    let signer = ring::signature::EcdsaKeyPair::from_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        &key.contents,
        &ring::rand::SystemRandom::new(),
    )
    .map_err(|_| crate::Error::Invalid("key.pem is not a PKCS#8 P-256 key".into()))?;
    Ok((cert_pem, signer))
}

/// Connect options that authenticate as the agent whose files are under `state_dir`, with a
/// private reply-inbox prefix (`_INBOX.<22 random>`), as the broker requires.
///
/// Enrolled with a cluster whose NATS logs clients in with JWTs (bus.jwt and bus.nk exist),
/// the agent presents its user JWT and signs the nonce with its nkey instead.
pub fn connect_options(state_dir: &Path) -> crate::Result<async_nats::ConnectOptions> {
    use base64::Engine;
    if state_dir.join(BUS_JWT_FILE).exists() {
        let seed = std::fs::read_to_string(state_dir.join(BUS_NKEY_FILE)).map_err(|e| {
            crate::Error::Invalid(format!(
                "{} exists but {}: {e} (run svc-agent bootstrap)",
                state_dir.join(BUS_JWT_FILE).display(),
                state_dir.join(BUS_NKEY_FILE).display()
            ))
        })?;
        let key = crate::bus::natsjwt::key_pair(seed.trim())?;
        // Read at every connection: renew.rs replaces the file before the JWT expires.
        let file = state_dir.join(BUS_JWT_FILE);
        let jwt = move || {
            std::fs::read_to_string(&file)
                .map(|jwt| jwt.trim().to_string())
                .map_err(|e| format!("{}: {e}", file.display()))
        };
        return Ok(crate::bus::natsjwt::connect_options_with(jwt, key)
            .custom_inbox_prefix(private_inbox_prefix()));
    }
    let (cert_pem, signer) = bus_credentials(state_dir)?;
    let signer = std::sync::Arc::new(signer);
    let options = async_nats::ConnectOptions::with_auth_callback(move |nonce: Vec<u8>| {
        let cert_pem = cert_pem.clone();
        let signer = signer.clone();
        async move {
            let signature = signer
                .sign(&ring::rand::SystemRandom::new(), &nonce)
                .map_err(|_| async_nats::AuthError::new("cannot sign the nonce"))?;
            let mut auth = async_nats::Auth::new();
            auth.jwt = Some(cert_pem);
            auth.password =
                Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signature.as_ref()));
            Ok(auth)
        }
    });
    Ok(options.custom_inbox_prefix(private_inbox_prefix()))
}

/// The shortest and longest wait before an agent's reconnection attempt.
pub const RECONNECT_MIN: std::time::Duration = std::time::Duration::from_millis(500);
pub const RECONNECT_MAX: std::time::Duration = std::time::Duration::from_secs(20);

/// How long the daemon waits before reconnection attempt `attempts` (async-nats counts from
/// 1 after a loss): uniformly random between [`RECONNECT_MIN`] and a cap that doubles per
/// attempt from 1 s up to [`RECONNECT_MAX`] ("full jitter"). When a server restarts under
/// thousands of agents they come back spread over the window instead of all at once, as
/// async-nats' own backoff (no jitter) would have them.
pub fn reconnect_delay(attempts: usize) -> std::time::Duration {
    use rand::Rng;
    let floor = RECONNECT_MIN.as_millis() as u64;
    let cap = (1000u64 << attempts.saturating_sub(1).min(5)).min(RECONNECT_MAX.as_millis() as u64);
    std::time::Duration::from_millis(rand::thread_rng().gen_range(floor..=cap.max(floor)))
}

/// The connection of an agent that is not logged in as itself: enrolment, and the renewal of
/// its NATS JWT. A JWT-mode cluster admits no anonymous client, so with the cluster's
/// enrolment JWT (bearer) the client presents that, and its replies come under
/// `svc.enroll.reply.<random>`, the one place that JWT may read.
pub fn enrolment_options(enrol_jwt: Option<String>) -> async_nats::ConnectOptions {
    match enrol_jwt {
        None => async_nats::ConnectOptions::new().custom_inbox_prefix(private_inbox_prefix()),
        Some(jwt) => async_nats::ConnectOptions::with_auth_callback(move |_nonce| {
            let jwt = jwt.clone();
            async move {
                let mut auth = async_nats::Auth::new();
                auth.jwt = Some(jwt);
                Ok(auth)
            }
        })
        .custom_inbox_prefix(format!(
            "{}.{}",
            crate::identity::nats::ENROL_REPLY_PREFIX,
            crate::ids::random_base62(22)
        )),
    }
}

/// TLS for an agent's bus connection (bootstrap and daemon alike). Required when a URL is
/// `tls://` or `ca_file` is set; otherwise async-nats upgrades only when the server asks
/// (INFO `tls_required`), with the same configuration. The server's certificate must chain
/// to `ca_file`, or to the system's CA store without one. Only a bad `ca_file` is an error.
///
/// With `state_dir` (the daemon: an enrolled agent) the agent also presents its certificate
/// when the server asks for one (mutual TLS, see [`tls_client_certificate`]); the signed
/// nonce of [`connect_options`] still goes in CONNECT, so servers that do not ask (or an
/// external cluster) accept it as before.
pub fn with_bus_tls(
    options: async_nats::ConnectOptions,
    urls: &[String],
    ca_file: Option<&Path>,
    state_dir: Option<&Path>,
) -> Result<async_nats::ConnectOptions, String> {
    let with_certificate = state_dir
        .and_then(tls_client_certificate)
        .and_then(|(chain, key)| {
            crate::tls::bus_client_config_with_certificate(ca_file, chain, key)
            .inspect_err(|error| {
                tracing::warn!(%error, "no TLS client certificate: the agent signs the nonce only")
            })
            .ok()
        });
    let config = match with_certificate {
        Some(config) => config,
        None => crate::tls::bus_client_config(ca_file)?,
    };
    let is_required = ca_file.is_some() || urls.iter().any(|url| is_tls_url(url));
    Ok(options.require_tls(is_required).tls_client_config(config))
}

/// The TLS client certificate of the agent enrolled under `state_dir`: cert.pem, then the CA
/// chain bootstrap wrote to ca.pem (signing CA, then root), which the server needs to link the
/// certificate to its root CA, and key.pem. None (the agent then signs the nonce only) when
/// any of them cannot be used; the reason is logged.
pub fn tls_client_certificate(
    state_dir: &Path,
) -> Option<(
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
)> {
    let loaded = (|| {
        let mut chain = crate::tls::load_certificates(&state_dir.join(CERT_FILE))?;
        chain.extend(crate::tls::load_certificates(&state_dir.join(CA_FILE))?);
        let key = crate::tls::load_private_key(&state_dir.join(KEY_FILE))?;
        Ok::<_, String>((chain, key))
    })();
    match loaded {
        Ok(identity) => Some(identity),
        Err(error) => {
            tracing::warn!(%error, "no TLS client certificate: the agent signs the nonce only");
            None
        }
    }
}

/// Whether a bus URL asks for TLS by its scheme.
pub fn is_tls_url(url: &str) -> bool {
    url.trim().starts_with("tls://")
}

/// The line for a bus connection error caused by a server certificate the agent does not
/// trust (None for any other error): it names `--ca-file`, the one way to fix it.
pub fn untrusted_bus_certificate(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    crate::tls::untrusted_certificate(error).map(|why| {
        format!(
            "TLS: the bus's certificate is not trusted ({why}); give `svc-agent bootstrap` \
             --ca-file PATH (it sets nats.ca_file in agent.yaml) with the CA that issued it"
        )
    })
}

/// `_INBOX.<22 random base62>`: a reply prefix no other client can guess.
pub fn private_inbox_prefix() -> String {
    format!("_INBOX.{}", crate::ids::random_base62(22))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_delays_are_jittered_within_a_doubling_cap() {
        for attempts in 0..40usize {
            let cap = std::time::Duration::from_millis(
                (1000u64 << attempts.saturating_sub(1).min(5)).min(20_000),
            );
            let delays: Vec<_> = (0..200).map(|_| reconnect_delay(attempts)).collect();
            for delay in &delays {
                assert!(
                    *delay >= RECONNECT_MIN && *delay <= cap,
                    "{attempts}: {delay:?}"
                );
            }
            // Spread, not one value: the whole point.
            let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
            assert!(distinct.len() > 50, "{attempts}: {}", distinct.len());
        }
        assert!((0..500)
            .map(|_| reconnect_delay(100))
            .any(|d| d > std::time::Duration::from_secs(15)));
    }

    #[test]
    fn config_flag_anywhere() {
        let strings = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cases: [(&[&str], Option<&str>, &[&str]); 4] = [
            (
                &["--config", "a.yaml", "bootstrap"],
                Some("a.yaml"),
                &["bootstrap"],
            ),
            (
                &["bootstrap", "--config=b.yaml", "-x"],
                Some("b.yaml"),
                &["bootstrap", "-x"],
            ),
            (&["bootstrap"], None, &["bootstrap"]),
            (&["--", "--config", "c"], None, &["--", "--config", "c"]),
        ];
        for (args, config, rest) in cases {
            let (got_config, got_rest) = take_config(strings(args)).unwrap();
            assert_eq!(got_config, config.map(PathBuf::from), "{args:?}");
            assert_eq!(got_rest, strings(rest), "{args:?}");
        }
        assert!(take_config(strings(&["--config"])).is_err());
    }
}
