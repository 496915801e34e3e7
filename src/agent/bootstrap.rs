//! `svc-agent bootstrap`: enrol this host. Makes the agent's key pair locally, sends a CSR on
//! `svc.enroll` over an anonymous bus connection, and writes what comes back: key.pem (0600),
//! cert.pem and ca.pem under state_dir, the server's command-signing certificate at
//! `agent.command_key` (default state_dir/command-key.pem, 0644), and the agent's settings into
//! its config file (keeping every other key already there, and the file's group and mode, so
//! that an unprivileged daemon's group may still read it). No private key ever leaves the host.
//!
//! On a cluster whose NATS logs clients in with JWTs, nothing connects anonymously: the CSR
//! goes over a connection made with the cluster's enrolment JWT (`--enrol-jwt`), the request
//! also carries the public half of an nkey made here, and the agent's NATS user JWT comes
//! back; it and the nkey seed are written as `bus.jwt` and `bus.nk` under state_dir, with the
//! enrolment JWT as `enrol.jwt`, which renewals (renew.rs) connect with.
//!
//! Over `tls://` (or with `--ca-file`) the join token or PSK travels inside TLS; the CA file
//! that made the handshake succeed is written to `nats.ca_file` so the daemon trusts the same.

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use argh::FromArgs;
use serde_yaml_ng::{Mapping, Value};

use super::{CA_FILE, CERT_FILE, DEFAULT_CONFIG, KEY_FILE};
use crate::bus::subjects;
use crate::identity::{EnrolRequest, Enrolled};
use crate::program::{exit, parse_args, run_async, CliError};

const DEFAULT_STATE_DIR: &str = "/var/lib/svc-agent";
const ENROL_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(FromArgs, argh::ArgsInfo)]
/// Enrol this host with the server: on a terminal a short wizard asks for what is missing;
/// with --non-interactive every value comes from the flags.
#[argh(help_triggers("-h", "--help"))]
pub(super) struct Args {
    /// never prompt; fail on missing values
    #[argh(switch)]
    non_interactive: bool,
    /// the bus URL of the server: nats://HOST:4222, or tls://HOST:4222 when the server sets
    /// bus.tls
    #[argh(option)]
    server: Option<String>,
    /// PEM CA bundle that issued the bus's TLS certificate (default: nats.ca_file in the
    /// config, else the system's CA store); makes TLS required and is written to the config
    #[argh(option)]
    ca_file: Option<PathBuf>,
    /// this agent's id (letters, digits, '-' and '_')
    #[argh(option)]
    agent_id: Option<String>,
    /// a join token from `svc-identity token create`
    #[argh(option)]
    token: Option<String>,
    /// the agent's PSK from `svc-identity psk AGENT_ID`
    #[argh(option)]
    psk: Option<String>,
    /// labels: k=v,k2=v2 (default: agent.labels in the config file; these replace them)
    #[argh(option)]
    labels: Option<String>,
    /// the enrolment JWT of a cluster whose NATS logs clients in with JWTs
    /// (`svc-cluster nats-config --enrol-jwt`), or a file holding it
    #[argh(option)]
    enrol_jwt: Option<String>,
}

/// The values enrolment needs, after flags and prompts.
struct Settings {
    server: String,
    /// From --ca-file or the wizard; None: the config's nats.ca_file, if any.
    ca_file: Option<PathBuf>,
    agent_id: String,
    credential: Credential,
    /// From --labels or the wizard; None: agent.labels of the config file.
    labels: Option<BTreeMap<String, String>>,
    /// --enrol-jwt, read from its file when it names one.
    enrol_jwt: Option<String>,
}

enum Credential {
    Token(String),
    Psk(String),
}

pub fn main(program: &str, config: Option<PathBuf>, args: &[String]) -> i32 {
    let name = format!("{program} bootstrap");
    let args = match parse_args::<Args>(&name, args) {
        Ok(args) => args,
        Err(code) => return code,
    };
    let settings = match settings(args) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("{program}: {error}");
            return error.code;
        }
    };
    let config = config.unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
    run_async(program, bootstrap(config, settings))
}

fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, CliError> {
    crate::fleet::selector::parse_labels(text)
        .map_err(|e| CliError::usage(format!("invalid label {e}")))
}

fn prompt(question: &str) -> Result<String, CliError> {
    eprint!("{question}: ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| CliError::usage(format!("cannot read the answer: {e}")))?;
    Ok(line.trim().to_string())
}

/// Resolves flags, asking on a terminal for what is missing unless --non-interactive.
fn settings(args: Args) -> Result<Settings, CliError> {
    let can_prompt = !args.non_interactive && std::io::stdin().is_terminal();
    if !args.non_interactive && !can_prompt {
        return Err(CliError::usage(
            "stdin is not a terminal: pass --non-interactive with --server, --agent-id and --token or --psk",
        ));
    }
    let ask = |value: Option<String>, flag: &str, question: &str| match value {
        Some(value) => Ok(value),
        None if can_prompt => prompt(question),
        None => Err(CliError::usage(format!("{flag} is required"))),
    };
    let server = ask(args.server, "--server", "Server bus URL (nats://HOST:4222)")?;
    let ca_file = match args.ca_file {
        Some(path) => Some(path),
        None if can_prompt && super::is_tls_url(&server) => {
            let answer =
                prompt("CA file that issued the bus's certificate (empty: the system's CA store)")?;
            (!answer.is_empty()).then(|| PathBuf::from(answer))
        }
        None => None,
    };
    let agent_id = ask(args.agent_id, "--agent-id", "Agent id")?;
    let credential = match (args.token, args.psk) {
        (Some(_), Some(_)) => return Err(CliError::usage("give --token or --psk, not both")),
        (Some(token), None) => Credential::Token(token),
        (None, Some(psk)) => Credential::Psk(psk),
        (None, None) if can_prompt => {
            let answer = prompt("Join token (or leave empty to use a PSK)")?;
            if answer.is_empty() {
                Credential::Psk(prompt("PSK")?)
            } else {
                Credential::Token(answer)
            }
        }
        (None, None) => return Err(CliError::usage("--token or --psk is required")),
    };
    let labels = match args.labels {
        Some(text) => Some(parse_labels(&text)?),
        None if can_prompt => {
            let answer = prompt("Labels (k=v,k2=v2; empty: those in the config file, if any)")?;
            (!answer.trim().is_empty())
                .then(|| parse_labels(&answer))
                .transpose()?
        }
        None => None,
    };
    if server.is_empty() || agent_id.is_empty() {
        return Err(CliError::usage(
            "the server URL and the agent id are required",
        ));
    }
    crate::identity::validate_agent_id(&agent_id).map_err(|e| CliError::usage(e.to_string()))?;
    let enrol_jwt = args
        .enrol_jwt
        .map(|value| read_enrol_jwt(&value))
        .transpose()?;
    Ok(Settings {
        server,
        ca_file,
        agent_id,
        credential,
        labels,
        enrol_jwt,
    })
}

/// --enrol-jwt: the JWT itself (three base64url parts), or a file that holds it.
fn read_enrol_jwt(value: &str) -> Result<String, CliError> {
    let looks_like_jwt = |text: &str| {
        text.split('.').count() == 3
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    if looks_like_jwt(value) {
        return Ok(value.to_string());
    }
    let text = std::fs::read_to_string(value)
        .map_err(|e| CliError::usage(format!("--enrol-jwt: {value}: {e}")))?;
    let text = text.trim();
    if !looks_like_jwt(text) {
        return Err(CliError::usage(format!(
            "--enrol-jwt: {value} does not hold a JWT"
        )));
    }
    Ok(text.to_string())
}

/// Reads the agent config as YAML (empty when the file does not exist yet).
fn read_config(path: &Path) -> Result<Mapping, CliError> {
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => Ok(Mapping::new()),
        Ok(text) => match serde_yaml_ng::from_str::<Value>(&text) {
            Ok(Value::Mapping(mapping)) => Ok(mapping),
            Ok(_) => Err(CliError::failed(format!(
                "{}: expected a YAML mapping",
                path.display()
            ))),
            Err(e) => Err(CliError::failed(format!("{}: {e}", path.display()))),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Mapping::new()),
        Err(e) => Err(CliError::failed(format!(
            "cannot read {}: {e}",
            path.display()
        ))),
    }
}

/// `agent.labels` of the config file (scalars as text), so labels written there before
/// bootstrap are the ones enrolled.
fn config_labels(config: &mut Mapping, path: &Path) -> Result<BTreeMap<String, String>, CliError> {
    let Some(labels) = section(config, "agent").get("labels") else {
        return Ok(BTreeMap::new());
    };
    let invalid =
        |why: String| CliError::failed(format!("{}: agent.labels: {why}", path.display()));
    let scalar = |value: &Value| match value {
        Value::String(text) => Some(text.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    let mapping = match labels {
        Value::Null => return Ok(BTreeMap::new()),
        Value::Mapping(mapping) => mapping,
        _ => return Err(invalid("expected a mapping of k: v".into())),
    };
    let mut parsed = BTreeMap::new();
    for (key, value) in mapping {
        let (Some(key), Some(value)) = (scalar(key), scalar(value)) else {
            return Err(invalid(format!("'{key:?}: {value:?}' is not k: v")));
        };
        crate::fleet::selector::check_label(key.trim(), value.trim()).map_err(invalid)?;
        parsed.insert(key.trim().to_string(), value.trim().to_string());
    }
    Ok(parsed)
}

fn section<'a>(config: &'a mut Mapping, name: &str) -> &'a mut Mapping {
    let entry = config
        .entry(Value::from(name))
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    if !entry.is_mapping() {
        *entry = Value::Mapping(Mapping::new());
    }
    entry.as_mapping_mut().expect("made a mapping above")
}

pub(super) fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), CliError> {
    use std::os::unix::fs::OpenOptionsExt;
    let fail =
        |e: std::io::Error| CliError::failed(format!("cannot write {}: {e}", path.display()));
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&temporary)
        .map_err(fail)?;
    file.write_all(contents).map_err(fail)?;
    file.sync_all().map_err(fail)?;
    // The mode of an existing file is not changed by open; set it explicitly.
    std::fs::set_permissions(
        &temporary,
        std::os::unix::fs::PermissionsExt::from_mode(mode),
    )
    .map_err(fail)?;
    std::fs::rename(&temporary, path).map_err(fail)
}

/// Sends the CSR and waits for the certificate.
async fn request_certificate(
    settings: &Settings,
    csr: String,
    bus_nkey: String,
) -> Result<Enrolled, CliError> {
    let unreachable = |e: &dyn std::fmt::Display| {
        CliError::new(
            exit::UNREACHABLE,
            format!("cannot reach the bus at {}: {e}", settings.server),
        )
    };
    let options = super::enrolment_options(settings.enrol_jwt.clone()).name("svc-agent bootstrap");
    // --server may list a NATS cluster's nodes, comma-separated, as agent.yaml's nats.urls.
    let servers: Vec<String> = settings
        .server
        .split(',')
        .map(|url| url.trim().to_string())
        .filter(|url| !url.is_empty())
        .collect();
    let options = super::with_bus_tls(options, &servers, settings.ca_file.as_deref(), None)
        .map_err(|e| CliError::usage(format!("--ca-file: {e}")))?;
    let addresses: Vec<async_nats::ServerAddr> = servers
        .iter()
        .map(|url| url.parse())
        .collect::<Result<_, _>>()
        .map_err(|e| unreachable(&e))?;
    let client = tokio::time::timeout(ENROL_TIMEOUT, options.connect(addresses))
        .await
        .map_err(|_| unreachable(&"timed out"))?
        .map_err(|e| match super::untrusted_bus_certificate(&e) {
            Some(message) => unreachable(&message),
            None => unreachable(&e),
        })?;
    let (token, psk) = match &settings.credential {
        Credential::Token(token) => (Some(token.clone()), None),
        Credential::Psk(psk) => (None, Some(psk.clone())),
    };
    let request = EnrolRequest {
        agent_id: settings.agent_id.clone(),
        labels: settings.labels.clone().unwrap_or_default(),
        csr,
        token,
        psk,
        bus_nkey: Some(bus_nkey),
        signs_messages: true,
    };
    let payload = serde_json::to_vec(&request).expect("enrolment requests serialize");
    let reply = tokio::time::timeout(
        ENROL_TIMEOUT,
        client.request(subjects::ENROLL, payload.into()),
    )
    .await
    .map_err(|_| unreachable(&"no enrolment answer in time"))?
    .map_err(|e| match e.kind() {
        async_nats::RequestErrorKind::NoResponders => CliError::new(
            exit::UNREACHABLE,
            format!("no svc-server answers enrolment on {}", settings.server),
        ),
        _ => unreachable(&e),
    })?;
    let value: serde_json::Value = serde_json::from_slice(&reply.payload)
        .map_err(|e| CliError::failed(format!("malformed enrolment reply: {e}")))?;
    if let Some(error) = value.get("error") {
        let message = error["message"].as_str().unwrap_or("enrolment refused");
        let code = exit::of_code(error["code"].as_str().unwrap_or_default());
        return Err(CliError::new(code, format!("enrolment refused: {message}")));
    }
    serde_json::from_value(value)
        .map_err(|e| CliError::failed(format!("malformed enrolment reply: {e}")))
}

async fn bootstrap(config_path: PathBuf, mut settings: Settings) -> Result<(), CliError> {
    let mut config = read_config(&config_path)?;
    // What agent.yaml already holds is kept: its labels are enrolled unless --labels is given.
    if settings.labels.is_none() {
        settings.labels = Some(config_labels(&mut config, &config_path)?);
    }
    if settings.ca_file.is_none() {
        settings.ca_file = section(&mut config, "nats")
            .get("ca_file")
            .and_then(Value::as_str)
            .filter(|path| !path.is_empty())
            .map(PathBuf::from);
    }
    // The daemon may run from another directory: record the file by its absolute path.
    if let Some(path) = settings.ca_file.take() {
        let absolute = std::path::absolute(&path)
            .map_err(|e| CliError::usage(format!("--ca-file: {}: {e}", path.display())))?;
        settings.ca_file = Some(absolute);
    }
    let state_dir = section(&mut config, "agent")
        .get("state_dir")
        .and_then(Value::as_str)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));

    // The key pair is made here and only its CSR travels.
    let key = rcgen::KeyPair::generate()
        .map_err(|e| CliError::failed(format!("cannot make a key pair: {e}")))?;
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, settings.agent_id.as_str());
    let csr = params
        .serialize_request(&key)
        .and_then(|csr| csr.pem())
        .map_err(|e| CliError::failed(format!("cannot make the CSR: {e}")))?;

    // The nkey for a cluster whose NATS logs clients in with JWTs: only its public half
    // travels; the seed is written beside key.pem if the server answers with a bus JWT.
    let bus_key = nkeys::KeyPair::new_user();
    let enrolled = request_certificate(&settings, csr, bus_key.public_key()).await?;

    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&state_dir)
            .map_err(|e| CliError::failed(format!("cannot create {}: {e}", state_dir.display())))?;
    }
    write_file(
        &state_dir.join(KEY_FILE),
        key.serialize_pem().as_bytes(),
        0o600,
    )?;
    write_file(
        &state_dir.join(CERT_FILE),
        enrolled.certificate.as_bytes(),
        0o600,
    )?;
    write_file(
        &state_dir.join(CA_FILE),
        enrolled.ca_chain.as_bytes(),
        0o600,
    )?;
    if enrolled.bus_jwt.is_empty() {
        // Enrolled with a server that checks the certificate itself: an older bus login
        // would only be refused.
        for name in [
            super::BUS_JWT_FILE,
            super::BUS_NKEY_FILE,
            super::ENROL_JWT_FILE,
        ] {
            let _ = std::fs::remove_file(state_dir.join(name));
        }
    } else {
        let seed =
            crate::bus::natsjwt::seed(&bus_key).map_err(|e| CliError::failed(e.to_string()))?;
        write_file(
            &state_dir.join(super::BUS_NKEY_FILE),
            seed.as_bytes(),
            0o600,
        )?;
        write_file(
            &state_dir.join(super::BUS_JWT_FILE),
            enrolled.bus_jwt.as_bytes(),
            0o600,
        )?;
        // Renewals (renew.rs) travel on the enrolment connection: kept beside the JWT.
        if let Some(jwt) = &settings.enrol_jwt {
            write_file(
                &state_dir.join(super::ENROL_JWT_FILE),
                jwt.as_bytes(),
                0o600,
            )?;
        }
    }

    let command_key = section(&mut config, "agent")
        .get("command_key")
        .and_then(Value::as_str)
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| state_dir.join("command-key.pem"));
    if enrolled.command_key.is_empty() {
        eprintln!(
            "warning: this server does not sign commands, and the agent runs only signed ones:              upgrade svc-server, then bootstrap again"
        );
    } else {
        if let Some(parent) = command_key.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| {
                CliError::failed(format!("cannot create {}: {e}", parent.display()))
            })?;
        }
        write_file(&command_key, enrolled.command_key.as_bytes(), 0o644)?;
    }

    let agent = section(&mut config, "agent");
    agent.insert("id".into(), settings.agent_id.clone().into());
    let mut labels = Mapping::new();
    for (key, value) in settings.labels.iter().flatten() {
        labels.insert(key.clone().into(), value.clone().into());
    }
    agent.insert("labels".into(), Value::Mapping(labels));
    agent.insert(
        "state_dir".into(),
        state_dir.to_string_lossy().into_owned().into(),
    );
    let urls: Vec<Value> = settings
        .server
        .split(',')
        .map(|url| Value::from(url.trim()))
        .collect();
    let nats = section(&mut config, "nats");
    nats.insert("urls".into(), Value::Sequence(urls));
    if let Some(path) = &settings.ca_file {
        nats.insert("ca_file".into(), path.to_string_lossy().into_owned().into());
    }
    let text = serde_yaml_ng::to_string(&Value::Mapping(config))
        .map_err(|e| CliError::failed(format!("cannot write the config: {e}")))?;
    if let Some(parent) = config_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| CliError::failed(format!("cannot create {}: {e}", parent.display())))?;
    }
    // A config made beforehand (the packages' 0644 template, which a split agent's
    // unprivileged daemon reads; it holds no secret) keeps its group and read bits; a new one
    // is the owner's only.
    let existing = std::fs::metadata(&config_path).ok();
    let mode = existing.as_ref().map_or(0o600, |meta| {
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o644 | 0o600
    });
    write_file(&config_path, text.as_bytes(), mode)?;
    if let Some(meta) = existing {
        use std::os::unix::fs::MetadataExt;
        // Only root may give a file away; for anyone else the group stays theirs.
        let _ = std::os::unix::fs::chown(&config_path, None, Some(meta.gid()));
    }
    eprintln!(
        "enrolled as '{}': certificate in {}, config in {}",
        settings.agent_id,
        state_dir.display(),
        config_path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        let parsed = parse_labels("role=web, env=prod").unwrap();
        assert_eq!(parsed.get("role").map(String::as_str), Some("web"));
        assert_eq!(parsed.get("env").map(String::as_str), Some("prod"));
        assert!(parse_labels("").unwrap().is_empty());
        assert_eq!(parse_labels("novalue").unwrap_err().code, exit::USAGE);
        assert_eq!(parse_labels("=x").unwrap_err().code, exit::USAGE);
    }
}
