//! `svc-cluster backup|restore|nats-config` (the membership commands are in `membership.rs`) and
//! `svc-cluster-backup backup|restore|list|verify`: snapshot files (docs/backup.md), and the
//! offline NATS JWT configuration of an external cluster (`identity::nats`). `backup` streams
//! `ClusterService/Backup` into a file (through `.partial`, renamed when complete); the other
//! commands are local (`backup::local`) and need no server: `restore` works offline on the data
//! dir of `--config`.

use std::io::Write;
use std::path::{Path, PathBuf};

use argh::FromArgs;

use super::client::{authorized, grpc_channel};
use super::output::{print_json, print_table};
use super::{CliError, Common, Output};
use crate::backup::{local, snapshot};
use crate::proto;
use crate::proto::cluster_service_client::ClusterServiceClient;

/// `svc-cluster`: membership (`membership.rs`) and backup; restore points at the offline
/// restore.
pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_table(program, output_is_a_file(args))
}

/// `svc-cluster-backup`.
pub fn backup_main(program: &str, args: Vec<String>) -> i32 {
    super::run_table(program, output_is_a_file(args))
}

/// The seed names the snapshot file `--output FILE`, which every other CLI uses for the
/// format (`-o, --output table|json`). Here the long form is the file (rewritten to
/// `--output-file` before the common flags are taken) and the format is `-o` only.
fn output_is_a_file(args: Vec<String>) -> Vec<String> {
    let mut rewritten = Vec::with_capacity(args.len());
    let mut rest = args.into_iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            rewritten.push(arg);
            rewritten.extend(rest.by_ref());
            break;
        }
        match arg.strip_prefix("--output") {
            Some("") => rewritten.push("--output-file".into()),
            Some(value) if value.starts_with('=') => {
                rewritten.push(format!("--output-file{value}"))
            }
            _ => rewritten.push(arg),
        }
    }
    rewritten
}

/// svc-cluster's own commands, after the membership ones (`membership::COMMANDS`), in help
/// order: the one place each is named (`cli::tables`).
pub const COMMANDS: &[super::Command] = &[
    command!("backup", BackupArgs, backup),
    command!("restore", OnlineRestoreArgs, online_restore),
    command!("nats-config", NatsConfigArgs, nats_config),
];

/// svc-cluster-backup's commands, in help order.
pub const BACKUP_COMMANDS: &[super::Command] = &[
    command!("backup", BackupArgs, backup),
    command!("restore", RestoreArgs, restore),
    command!("list", ListArgs, list),
    command!("verify", VerifyArgs, verify),
];

#[derive(FromArgs, argh::ArgsInfo)]
/// Print the block every NATS node of the cluster includes when bus.external_auth is jwt:
/// the operator JWT, the system account and a memory resolver preloaded with the system and
/// svc accounts. Runs offline on the store of --config (PostgreSQL in cluster mode), making
/// the keys (sealed under master_key) on first use, so the NATS cluster can be set up before
/// any member starts. The block holds no private key. With --enrol-jwt: print the enrolment
/// JWT instead, which `svc-agent bootstrap --enrol-jwt` needs (it may only request
/// enrolment). With --creds ROLE: print a .creds file (a user JWT and its nkey seed: keep it
/// 0600) for a bus client such as svc-files --creds, with the bus rights of an API key of that
/// role. -o json prints the block, the enrolment JWT and the account's public key.
#[argh(help_triggers("-h", "--help"))]
struct NatsConfigArgs {
    /// the server configuration (default /etc/svc/server.yaml)
    #[argh(option)]
    config: Option<PathBuf>,
    /// print the enrolment JWT instead of the NATS configuration
    #[argh(switch)]
    enrol_jwt: bool,
    /// print a .creds file for a bus client of this role: admin, operator or readonly
    #[argh(option)]
    creds: Option<String>,
    /// the client's name in its JWT (with --creds; default svc-files)
    #[argh(option, default = "String::from(\"svc-files\")")]
    name: String,
    /// how long the .creds file is valid (with --creds; default 90d)
    #[argh(option, default = "String::from(\"90d\")")]
    ttl: String,
    /// after a CA rotation, once every NATS node has the block listing both account signing
    /// keys: retire the previous one (the next signs from each member's restart), then print
    /// the block, which lists the next alone (docs/cluster.md)
    #[argh(switch)]
    retire_previous_signing_key: bool,
}

async fn nats_config(common: Common, args: NatsConfigArgs) -> Result<(), CliError> {
    let loaded = crate::config::load_server(args.config.as_deref(), &crate::config::process_env())
        .map_err(|e| CliError::failed(format!("configuration: {e}")))?;
    if let Some(role) = &args.creds {
        let role: crate::auth::Role = role
            .parse()
            .map_err(|e: crate::Error| CliError::usage(format!("--creds: {e}")))?;
        let ttl = crate::clock::parse_duration(&args.ttl)
            .filter(|ttl| !ttl.is_zero())
            .ok_or_else(|| CliError::usage(format!("--ttl: invalid duration '{}'", args.ttl)))?;
        let creds =
            crate::identity::nats::offline_creds(&loaded.config, &args.name, role, ttl).await?;
        print!("{creds}");
        return Ok(());
    }
    if args.retire_previous_signing_key {
        let retired = crate::identity::nats::offline_retire_previous(&loaded.config).await?;
        if retired.is_empty() {
            return Err(CliError::failed(
                "there is no previous account signing key to retire (rotate the CA first)",
            ));
        }
        eprintln!(
            "retired the account signing key {}: restart every member; reload the NATS nodes \
             with the block below after agents.bus_jwt_ttl",
            retired.join(", ")
        );
    }
    let printed = crate::identity::nats::offline_config(&loaded.config).await?;
    if common.output == Output::Json {
        return print_json(&printed);
    }
    if args.enrol_jwt {
        println!("{}", printed.enrol_jwt);
    } else {
        print!("{}", printed.nats_config);
    }
    Ok(())
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Take a snapshot of the server (admin): the store, the event and audit streams, the policy
/// files and a manifest, streamed into FILE (written as FILE.partial, renamed when complete).
/// Scheduled snapshots are deferred (not built). Here --output FILE names the file (as
/// --output-file does); the output format is -o table|json.
#[argh(help_triggers("-h", "--help"))]
struct BackupArgs {
    /// the file to write, also --output FILE (default ./svc-snapshot-<time>.tar.gz, or
    /// .svcsnap when encrypted)
    #[argh(option)]
    output_file: Option<PathBuf>,
    /// encrypt the file (argon2id + AES-256-GCM) with the passphrase from --passphrase-file
    /// or env SVC_BACKUP_PASSPHRASE
    #[argh(switch)]
    encrypt: bool,
    /// file holding the passphrase (its first line)
    #[argh(option)]
    passphrase_file: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Restore runs offline: use svc-cluster-backup restore.
#[argh(help_triggers("-h", "--help"))]
struct OnlineRestoreArgs {
    /// the snapshot file
    #[argh(option)]
    input: Option<PathBuf>,
    /// replace a populated target
    #[argh(switch)]
    force: bool,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Restore a snapshot into the data dir (and store) of --config, offline. A populated target
/// is refused without --force. A server holding the data dir is stopped through systemd when
/// it runs as the svc-server unit (and started again afterwards); otherwise the restore is
/// refused. The snapshot is checked completely (hashes, audit chain, the configured
/// master_key) before anything is replaced.
#[argh(help_triggers("-h", "--help"))]
struct RestoreArgs {
    /// the snapshot file
    #[argh(option)]
    input: PathBuf,
    /// replace a populated target
    #[argh(switch)]
    force: bool,
    /// the server configuration (default /etc/svc/server.yaml)
    #[argh(option)]
    config: Option<PathBuf>,
    /// file holding the passphrase of an encrypted snapshot (else env SVC_BACKUP_PASSPHRASE)
    #[argh(option)]
    passphrase_file: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// List the snapshot files (*.tar.gz, *.svcsnap) in DIR (default: the current directory), with
/// whether each is valid (hashes and manifest; verify also walks the audit chain). No server.
#[argh(help_triggers("-h", "--help"))]
struct ListArgs {
    /// the directory (default .)
    #[argh(positional)]
    dir: Option<PathBuf>,
    /// file holding the passphrase, to check encrypted files too (else env
    /// SVC_BACKUP_PASSPHRASE)
    #[argh(option)]
    passphrase_file: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Check a snapshot file completely, no server: the tar structure, every entry's size and
/// SHA-256 against the manifest, and the audit chain inside the store (its head must be the
/// manifest's). Exit 1 naming the first problem.
#[argh(help_triggers("-h", "--help"))]
struct VerifyArgs {
    /// the snapshot file
    #[argh(option)]
    input: PathBuf,
    /// file holding the passphrase of an encrypted snapshot (else env SVC_BACKUP_PASSPHRASE)
    #[argh(option)]
    passphrase_file: Option<PathBuf>,
}

/// The passphrase from `--passphrase-file` (first line) or `SVC_BACKUP_PASSPHRASE`; never a
/// flag value, which other users could read in the process list.
pub fn passphrase(file: &Option<PathBuf>) -> Result<Option<String>, CliError> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::usage(format!("cannot read {}: {e}", path.display())))?;
        let line = text.lines().next().unwrap_or_default().to_string();
        if line.is_empty() {
            return Err(CliError::usage(format!("{} is empty", path.display())));
        }
        return Ok(Some(line));
    }
    Ok(std::env::var("SVC_BACKUP_PASSPHRASE")
        .ok()
        .filter(|p| !p.is_empty()))
}

/// Streams a snapshot from the server into `output` (via `output.partial`, mode 0600,
/// renamed once complete and synced), encrypting it with `passphrase` if given. Returns the
/// bytes written.
pub async fn download(
    common: &Common,
    output: &Path,
    passphrase: Option<&str>,
) -> Result<u64, CliError> {
    let mut client = ClusterServiceClient::new(grpc_channel(common).await?)
        .max_decoding_message_size(16 * 1024 * 1024);
    let mut stream = client
        .backup(authorized(common, proto::Empty {})?)
        .await?
        .into_inner();
    let partial = partial_name(output);
    let file = create_private(&partial)?;
    let written = async {
        let counting = Counting {
            inner: std::io::BufWriter::with_capacity(1 << 20, file),
            bytes: 0,
        };
        let mut sink: Sink = match passphrase {
            Some(passphrase) => {
                Sink::Encrypted(Box::new(snapshot::Encrypt::new(counting, passphrase)?))
            }
            None => Sink::Plain(counting),
        };
        let mut bar = Progress::stderr("snapshot");
        let mut received = 0u64;
        while let Some(chunk) = stream.message().await? {
            received += chunk.data.len() as u64;
            sink.write_all(&chunk.data).map_err(|e| {
                CliError::failed(format!("cannot write {}: {e}", partial.display()))
            })?;
            bar.set(received);
        }
        bar.finish();
        let counting = match sink {
            Sink::Plain(counting) => counting,
            Sink::Encrypted(encrypt) => encrypt.finish()?,
        };
        let bytes = counting.bytes;
        let file = counting
            .inner
            .into_inner()
            .map_err(|e| CliError::failed(format!("cannot write {}: {e}", partial.display())))?;
        file.sync_all()
            .map_err(|e| CliError::failed(format!("cannot sync {}: {e}", partial.display())))?;
        // A stream that ended without the manifest (server stopped mid-way) is no snapshot.
        if received == 0 {
            return Err(CliError::failed("the server sent an empty snapshot"));
        }
        Ok::<u64, CliError>(bytes)
    }
    .await;
    match written {
        Ok(bytes) => {
            std::fs::rename(&partial, output).map_err(|e| {
                CliError::failed(format!("cannot rename to {}: {e}", output.display()))
            })?;
            if let Some(parent) = output.parent().filter(|p| !p.as_os_str().is_empty()) {
                if let Ok(dir) = std::fs::File::open(parent) {
                    let _ = dir.sync_all();
                }
            }
            Ok(bytes)
        }
        Err(error) => {
            let _ = std::fs::remove_file(&partial);
            Err(error)
        }
    }
}

/// Bytes so far on stderr, redrawn in place at most ten times a second, on a terminal only.
pub struct Progress {
    label: &'static str,
    is_terminal: bool,
    started: std::time::Instant,
    drawn_at: Option<std::time::Instant>,
}

impl Progress {
    pub fn stderr(label: &'static str) -> Progress {
        use std::io::IsTerminal;
        Progress {
            label,
            is_terminal: std::io::stderr().is_terminal(),
            started: std::time::Instant::now(),
            drawn_at: None,
        }
    }

    pub fn set(&mut self, bytes: u64) {
        let due = self
            .drawn_at
            .is_none_or(|at| at.elapsed() >= std::time::Duration::from_millis(100));
        if !self.is_terminal || !due {
            return;
        }
        self.drawn_at = Some(std::time::Instant::now());
        let seconds = self.started.elapsed().as_secs_f64().max(0.001);
        let megabytes = bytes as f64 / 1e6;
        eprint!(
            "\r{}: {megabytes:.1} MB  {:.1} MB/s\x1b[K",
            self.label,
            megabytes / seconds
        );
        let _ = std::io::stderr().flush();
    }

    pub fn finish(&mut self) {
        if self.is_terminal && self.drawn_at.is_some() {
            eprint!("\r\x1b[K");
            let _ = std::io::stderr().flush();
        }
    }
}

enum Sink {
    Plain(Counting),
    Encrypted(Box<snapshot::Encrypt<Counting>>),
}

impl Write for Sink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        match self {
            Sink::Plain(out) => out.write(data),
            Sink::Encrypted(out) => out.write(data),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::Plain(out) => out.flush(),
            Sink::Encrypted(out) => out.flush(),
        }
    }
}

struct Counting {
    inner: std::io::BufWriter<std::fs::File>,
    bytes: u64,
}

impl Write for Counting {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(data)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn partial_name(output: &Path) -> PathBuf {
    let mut name = output.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

fn create_private(path: &Path) -> Result<std::fs::File, CliError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| CliError::failed(format!("cannot create {}: {e}", path.display())))
}

/// `svc-snapshot-20261125T081502Z.tar.gz` (or `.svcsnap`).
pub fn default_name(encrypted: bool) -> PathBuf {
    let now = crate::clock::now_rfc3339();
    let stamp: String = now
        .chars()
        .take(19)
        .filter(|c| c.is_ascii_digit() || *c == 'T')
        .collect();
    let extension = if encrypted { "svcsnap" } else { "tar.gz" };
    PathBuf::from(format!("svc-snapshot-{stamp}Z.{extension}"))
}

async fn backup(common: Common, args: BackupArgs) -> Result<(), CliError> {
    let passphrase = if args.encrypt {
        Some(passphrase(&args.passphrase_file)?.ok_or_else(|| {
            CliError::usage("--encrypt needs --passphrase-file FILE or SVC_BACKUP_PASSPHRASE")
        })?)
    } else {
        None
    };
    let output = args
        .output_file
        .unwrap_or_else(|| default_name(passphrase.is_some()));
    let bytes = download(&common, &output, passphrase.as_deref()).await?;
    if common.output == Output::Json {
        return print_json(&serde_json::json!({
            "file": output.display().to_string(),
            "bytes": bytes,
            "encrypted": passphrase.is_some(),
        }));
    }
    println!("wrote {} ({bytes} bytes)", output.display());
    Ok(())
}

async fn online_restore(_common: Common, args: OnlineRestoreArgs) -> Result<(), CliError> {
    let input = args
        .input
        .map_or_else(|| "FILE".to_string(), |path| path.display().to_string());
    let force = if args.force { " --force" } else { "" };
    Err(CliError::failed(format!(
        "restore runs offline on the server's host: svc-cluster-backup restore --input {input}{force} [--config server.yaml]"
    )))
}

async fn restore(common: Common, args: RestoreArgs) -> Result<(), CliError> {
    let passphrase = passphrase(&args.passphrase_file)?;
    let loaded = crate::config::load_server(args.config.as_deref(), &crate::config::process_env())
        .map_err(|e| CliError::failed(format!("configuration: {e}")))?;
    let options = local::RestoreOptions {
        input: &args.input,
        passphrase: passphrase.as_deref(),
        force: args.force,
    };
    let systemd = local::Systemd {
        unit: "svc-server".into(),
    };
    let restored = local::restore(&loaded.config, &options, &systemd).await?;
    if common.output == Output::Json {
        return print_json(&restored);
    }
    let streams: Vec<String> = restored
        .streams
        .iter()
        .map(|(name, seq)| format!("{name} to {seq}"))
        .collect();
    println!(
        "restored {} into {} ({}): snapshot of {} taken {}; {} audit rows verified; streams {}; {} policy files{}",
        args.input.display(),
        restored.data_dir,
        restored.store_driver,
        restored.server_id,
        restored.created_at,
        restored.audit_rows,
        streams.join(", "),
        restored.policies,
        if restored.restarted_server {
            "; svc-server stopped and started again"
        } else {
            ""
        }
    );
    Ok(())
}

async fn list(common: Common, args: ListArgs) -> Result<(), CliError> {
    let passphrase = passphrase(&args.passphrase_file)?;
    let dir = args.dir.unwrap_or_else(|| PathBuf::from("."));
    let items = local::list(&dir, passphrase.as_deref())?;
    if common.output == Output::Json {
        return print_json(&items);
    }
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|item| {
            vec![
                item.name.clone(),
                item.created_at.clone().unwrap_or_else(|| "-".into()),
                item.size.to_string(),
                item.svc_version.clone().unwrap_or_else(|| "-".into()),
                if item.valid {
                    "yes".into()
                } else {
                    format!("no: {}", item.problem.clone().unwrap_or_default())
                },
            ]
        })
        .collect();
    print_table(
        &["NAME", "CREATED_AT", "SIZE", "SVC_VERSION", "VALID"],
        &rows,
    );
    Ok(())
}

async fn verify(common: Common, args: VerifyArgs) -> Result<(), CliError> {
    let passphrase = passphrase(&args.passphrase_file)?;
    let verified = local::verify(&args.input, passphrase.as_deref())
        .await
        .map_err(|error| {
            let code = super::exit::of_error(&error);
            CliError::new(code, format!("{}: invalid: {error}", args.input.display()))
        })?;
    print_verified(&common, &args.input, &verified)
}

pub fn print_verified(
    common: &Common,
    input: &Path,
    verified: &local::Verified,
) -> Result<(), CliError> {
    let manifest = &verified.manifest;
    if common.output == Output::Json {
        return print_json(&serde_json::json!({
            "file": input.display().to_string(),
            "valid": true,
            "format_version": manifest.format_version,
            "svc_version": manifest.svc_version,
            "created_at": manifest.created_at,
            "server_id": manifest.server_id,
            "store_driver": manifest.store_driver,
            "schema_version": manifest.schema_version,
            "audit_rows": verified.audit_rows,
            "audit_head": manifest.audit_head,
            "streams": manifest.streams,
            "files": manifest.files.len(),
        }));
    }
    let streams: Vec<String> = manifest
        .streams
        .iter()
        .map(|(name, seq)| format!("{name}={seq}"))
        .collect();
    println!(
        "{}: valid (format {}, svc {}, taken {} on {}, {} files, {} audit rows chained, streams {})",
        input.display(),
        manifest.format_version,
        manifest.svc_version,
        manifest.created_at,
        manifest.server_id,
        manifest.files.len(),
        verified.audit_rows,
        streams.join(" ")
    );
    Ok(())
}
