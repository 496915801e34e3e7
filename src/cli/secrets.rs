//! `svc-secrets`: versioned KV, transit, leases and master-key rotation (SecretsService).
//!
//! Values travel to and from the server over gRPC only; this file never logs them. Reading a
//! value from a file (`KEY=@FILE`, `--from-file`, transit `--file`) keeps it out of shell
//! history and `ps`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use argh::FromArgs;
use base64::Engine;

use super::client::{authorized, grpc_channel};
use super::output::{print_json, print_table};
use super::values::{creds_backend, duration, transit_key_type};
use super::{exit, CliError, Common, Output};
use crate::proto::secrets_service_client::SecretsServiceClient;
use crate::proto::{self};

type Client = SecretsServiceClient<tonic::transport::Channel>;

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_table(program, args)
}

/// svc-secrets's commands, in help order: the one place each is named, read by running it and by
/// help, completions and man pages (`cli::args_info`).
pub const COMMANDS: &[super::Command] = &[
    command!("get", GetArgs, get),
    command!("put", PutArgs, put),
    command!("delete", DeleteArgs, delete),
    command!("list", ListArgs, list),
    command!("leases", LeasesArgs, leases),
    command!("transit", TransitArgs, transit),
    command!("rotate-master", RotateMasterArgs, rotate_master),
    command!("creds", CredsArgs, creds),
];

async fn client(common: &Common) -> Result<Client, CliError> {
    Ok(SecretsServiceClient::new(grpc_channel(common).await?))
}

fn read_file(path: &Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|e| CliError::usage(format!("cannot read {}: {e}", path.display())))
}

fn read_text(path: &Path) -> Result<String, CliError> {
    String::from_utf8(read_file(path)?)
        .map_err(|_| CliError::usage(format!("{} is not UTF-8 text", path.display())))
}

fn write_stdout(bytes: &[u8]) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|_| stdout.flush())
        .map_err(|e| CliError::failed(format!("cannot write to stdout: {e}")))
}

// ---- KV ----

#[derive(FromArgs, argh::ArgsInfo)]
/// Read a secret: every field, or one with --field.
#[argh(help_triggers("-h", "--help"))]
struct GetArgs {
    /// secret path, e.g. db/prod
    #[argh(positional)]
    path: String,
    /// print only this field's value
    #[argh(option)]
    field: Option<String>,
    /// read this version (default: the latest)
    #[argh(option)]
    version: Option<u32>,
}

async fn get(common: Common, args: GetArgs) -> Result<(), CliError> {
    let request = proto::GetSecretRequest {
        path: args.path.clone(),
        version: args.version.unwrap_or(0),
    };
    let secret = client(&common)
        .await?
        .get(authorized(&common, request)?)
        .await?
        .into_inner();
    if let Some(field) = args.field {
        let value = secret.data.get(&field).ok_or_else(|| {
            CliError::new(
                exit::NOT_FOUND,
                format!("secret '{}' has no field '{field}'", args.path),
            )
        })?;
        return match common.output {
            Output::Json => print_json(value),
            Output::Table => {
                println!("{value}");
                Ok(())
            }
        };
    }
    let data: BTreeMap<String, String> = secret.data.into_iter().collect();
    match common.output {
        Output::Json => print_json(&serde_json::json!({
            "path": secret.path, "version": secret.version,
            "created_at": secret.created_at, "data": data,
        })),
        Output::Table => {
            let rows: Vec<Vec<String>> = data.into_iter().map(|(k, v)| vec![k, v]).collect();
            print_table(&["KEY", "VALUE"], &rows);
            Ok(())
        }
    }
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Write a new version of a secret from KEY=VALUE pairs and/or a JSON or YAML file of fields.
/// KEY=@FILE reads that value from a file (keeps it out of shell history). A put replaces
/// every field: the new version holds exactly what is given.
#[argh(help_triggers("-h", "--help"))]
struct PutArgs {
    /// secret path, e.g. db/prod
    #[argh(positional)]
    path: String,
    /// KEY=VALUE (or KEY=@FILE) pairs; they override fields from --from-file
    #[argh(positional)]
    pairs: Vec<String>,
    /// a JSON or YAML mapping of fields to values
    #[argh(option)]
    from_file: Option<PathBuf>,
}

/// A scalar from a fields file as the string stored; nested values as JSON text.
fn field_text(value: serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text,
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn put_data(args: &PutArgs) -> Result<BTreeMap<String, String>, CliError> {
    let mut data = BTreeMap::new();
    if let Some(file) = &args.from_file {
        let text = read_text(file)?;
        // YAML is a superset of JSON, so one parser reads both.
        let fields: BTreeMap<String, serde_json::Value> = crate::config::parse_yaml(&text)
            .map_err(|e| {
                CliError::usage(format!("{}: not a mapping of fields: {e}", file.display()))
            })?;
        data.extend(fields.into_iter().map(|(k, v)| (k, field_text(v))));
    }
    for pair in &args.pairs {
        let (key, value) = pair
            .split_once('=')
            .filter(|(key, _)| !key.is_empty())
            .ok_or_else(|| CliError::usage(format!("'{pair}' is not KEY=VALUE")))?;
        let value = match value.strip_prefix('@') {
            Some(file) => read_text(Path::new(file))?,
            None => value.to_string(),
        };
        data.insert(key.to_string(), value);
    }
    if data.is_empty() {
        return Err(CliError::usage(
            "nothing to write: give KEY=VALUE pairs or --from-file",
        ));
    }
    Ok(data)
}

async fn put(common: Common, args: PutArgs) -> Result<(), CliError> {
    let request = proto::PutSecretRequest {
        path: args.path.clone(),
        data: put_data(&args)?.into_iter().collect(),
    };
    let meta = client(&common)
        .await?
        .put(authorized(&common, request)?)
        .await?
        .into_inner();
    print_metadata(&common, &[meta])
}

fn print_metadata(common: &Common, secrets: &[proto::SecretMetadata]) -> Result<(), CliError> {
    let json = |m: &proto::SecretMetadata| {
        serde_json::json!({"path": m.path, "version": m.version,
            "created_at": m.created_at, "updated_at": m.updated_at})
    };
    match common.output {
        Output::Json if secrets.len() == 1 => print_json(&json(&secrets[0])),
        Output::Json => print_json(&secrets.iter().map(json).collect::<Vec<_>>()),
        Output::Table => {
            let rows: Vec<Vec<String>> = secrets
                .iter()
                .map(|m| {
                    vec![
                        m.path.clone(),
                        m.version.to_string(),
                        m.created_at.clone(),
                        m.updated_at.clone(),
                    ]
                })
                .collect();
            print_table(&["PATH", "VERSION", "CREATED", "UPDATED"], &rows);
            Ok(())
        }
    }
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Delete a secret's latest version (soft: older versions stay readable). --versions picks
/// versions; --destroy erases them for good, and with no --versions erases the whole secret.
#[argh(help_triggers("-h", "--help"))]
struct DeleteArgs {
    /// secret path
    #[argh(positional)]
    path: String,
    /// comma-separated versions, e.g. 1,2
    #[argh(option)]
    versions: Option<String>,
    /// erase for good instead of a soft delete
    #[argh(switch)]
    destroy: bool,
}

async fn delete(common: Common, args: DeleteArgs) -> Result<(), CliError> {
    let versions = match &args.versions {
        None => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|v| v.trim().parse::<u32>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| CliError::usage(format!("--versions '{list}' is not like 1,2,3")))?,
    };
    let request = proto::DeleteSecretRequest {
        path: args.path.clone(),
        versions,
        destroy: args.destroy,
    };
    let changed = client(&common)
        .await?
        .delete(authorized(&common, request)?)
        .await?
        .into_inner()
        .changed;
    let verb = if args.destroy { "destroyed" } else { "deleted" };
    match common.output {
        Output::Json => print_json(&serde_json::json!({"path": args.path, verb: changed})),
        Output::Table => {
            println!("{verb} {changed} version(s) of '{}'", args.path);
            Ok(())
        }
    }
}

#[derive(FromArgs, argh::ArgsInfo)]
/// List secrets under a prefix: path, current version, times (never values). Paths whose
/// latest version was deleted are left out unless --include-deleted.
#[argh(help_triggers("-h", "--help"))]
struct ListArgs {
    /// path prefix (default: everything)
    #[argh(positional)]
    prefix: Option<String>,
    /// also list paths whose latest version is deleted, marked as deleted
    #[argh(switch)]
    include_deleted: bool,
}

async fn list(common: Common, args: ListArgs) -> Result<(), CliError> {
    let request = proto::ListSecretsRequest {
        prefix: args.prefix.unwrap_or_default(),
        include_deleted: args.include_deleted,
    };
    let secrets = client(&common)
        .await?
        .list(authorized(&common, request)?)
        .await?
        .into_inner()
        .secrets;
    match common.output {
        // A list is always an array, even of one.
        Output::Json => print_json(
            &secrets
                .iter()
                .map(|m| {
                    serde_json::json!({"path": m.path, "version": m.version,
                        "created_at": m.created_at, "updated_at": m.updated_at,
                        "deleted": m.deleted,
                        "deleted_at": (!m.deleted_at.is_empty()).then_some(&m.deleted_at)})
                })
                .collect::<Vec<_>>(),
        ),
        Output::Table if args.include_deleted => {
            let rows: Vec<Vec<String>> = secrets
                .iter()
                .map(|m| {
                    vec![
                        m.path.clone(),
                        m.version.to_string(),
                        m.created_at.clone(),
                        m.updated_at.clone(),
                        if m.deleted {
                            m.deleted_at.clone()
                        } else {
                            "-".into()
                        },
                    ]
                })
                .collect();
            print_table(&["PATH", "VERSION", "CREATED", "UPDATED", "DELETED"], &rows);
            Ok(())
        }
        Output::Table => print_metadata(&common, &secrets),
    }
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Re-wrap every data key and transit key under a new master key, with no downtime (admin).
///
/// Procedure: 1. make a key: openssl rand -base64 32 > new.key (mode 0600);
/// 2. svc-secrets rotate-master --new-key-file new.key — the running server switches to it;
/// 3. set master_key in server.yaml (or SVC_MASTER_KEY) to the new key before the next
/// restart: a server started with the old key refuses to start and says so.
#[argh(help_triggers("-h", "--help"))]
struct RotateMasterArgs {
    /// file holding the new master key (base64 of 32 bytes)
    #[argh(option)]
    new_key_file: Option<PathBuf>,
    /// the new master key itself (base64 of 32 bytes); prefer --new-key-file
    #[argh(option)]
    new_key: Option<String>,
    /// send the key even over plain TCP to another host (by default refused: use an
    /// https:// --server, or run this on the server's host)
    #[argh(switch)]
    allow_plaintext: bool,
}

async fn rotate_master(common: Common, args: RotateMasterArgs) -> Result<(), CliError> {
    let key = match (args.new_key_file, args.new_key) {
        (Some(file), None) => read_text(&file)?.trim().to_string(),
        (None, Some(key)) => key,
        _ => {
            return Err(CliError::usage(
                "give exactly one of --new-key-file or --new-key",
            ))
        }
    };
    // The master key opens every secret: it must not cross a network in clear by accident.
    if let Some(host) = crate::tls::plaintext_remote_host(&common.server) {
        if !args.allow_plaintext {
            return Err(CliError::usage(format!(
                "refusing to send the master key in clear to {host}: give --server as \
                 https://... (tls in server.yaml), run this on the server's host, or pass \
                 --allow-plaintext"
            )));
        }
    }
    let request = proto::RotateMasterRequest {
        new_master_key: key,
    };
    let rewrapped = client(&common)
        .await?
        .rotate_master(authorized(&common, request)?)
        .await?
        .into_inner()
        .rewrapped;
    match common.output {
        Output::Json => print_json(&serde_json::json!({ "rewrapped": rewrapped })),
        Output::Table => {
            println!("re-wrapped {rewrapped} key(s) under the new master key");
            eprintln!("now set master_key in server.yaml to the new key before the next restart");
            Ok(())
        }
    }
}

// ---- transit ----

#[derive(FromArgs, argh::ArgsInfo)]
/// Transit: encrypt, decrypt, sign and verify with named keys that never leave the server.
#[argh(help_triggers("-h", "--help"))]
struct TransitArgs {
    #[argh(subcommand)]
    command: TransitCommand,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum TransitCommand {
    CreateKey(CreateKeyArgs),
    ListKeys(ListKeysArgs),
    Encrypt(EncryptArgs),
    Decrypt(DecryptArgs),
    Sign(SignArgs),
    Verify(VerifyArgs),
    Rotate(RotateArgs),
    Config(ConfigArgs),
    Rewrap(RewrapArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Create a transit key.
#[argh(subcommand, name = "create-key", help_triggers("-h", "--help"))]
struct CreateKeyArgs {
    /// key name
    #[argh(positional)]
    name: String,
    /// aes256-gcm (default; encrypt/decrypt) or ed25519 (sign/verify)
    #[argh(
        option,
        long = "type",
        default = "String::from(\"aes256-gcm\")",
        from_str_fn(transit_key_type)
    )]
    key_type: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// List transit keys (metadata only).
#[argh(subcommand, name = "list-keys", help_triggers("-h", "--help"))]
struct ListKeysArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// Encrypt PLAINTEXT (or --file) with the key's latest version; prints svc:v<N>:<base64>.
#[argh(subcommand, name = "encrypt", help_triggers("-h", "--help"))]
struct EncryptArgs {
    /// key name
    #[argh(positional)]
    name: String,
    /// text to encrypt (or use --file)
    #[argh(positional)]
    plaintext: Option<String>,
    /// read the plaintext from this file (any bytes)
    #[argh(option)]
    file: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Decrypt a ciphertext; writes the plaintext bytes to stdout (-o json: base64).
#[argh(subcommand, name = "decrypt", help_triggers("-h", "--help"))]
struct DecryptArgs {
    /// key name
    #[argh(positional)]
    name: String,
    /// svc:v<N>:<base64> (or use --file)
    #[argh(positional)]
    ciphertext: Option<String>,
    /// read the ciphertext from this file
    #[argh(option)]
    file: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Sign DATA (or --file) with an ed25519 key; prints svc:v<N>:<base64>.
#[argh(subcommand, name = "sign", help_triggers("-h", "--help"))]
struct SignArgs {
    /// key name
    #[argh(positional)]
    name: String,
    /// data to sign (or use --file)
    #[argh(positional)]
    data: Option<String>,
    /// read the data from this file
    #[argh(option)]
    file: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Verify a signature: NAME DATA SIGNATURE, or NAME SIGNATURE --file F. Exits 1 if invalid.
#[argh(subcommand, name = "verify", help_triggers("-h", "--help"))]
struct VerifyArgs {
    /// key name
    #[argh(positional)]
    name: String,
    /// DATA SIGNATURE (or only SIGNATURE with --file)
    #[argh(positional)]
    rest: Vec<String>,
    /// read the data from this file
    #[argh(option)]
    file: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Add a key version that encrypts and signs from now on; old versions still decrypt/verify.
#[argh(subcommand, name = "rotate", help_triggers("-h", "--help"))]
struct RotateArgs {
    /// key name
    #[argh(positional)]
    name: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Configure a key: versions below --min-decryption-version no longer decrypt or verify.
#[argh(subcommand, name = "config", help_triggers("-h", "--help"))]
struct ConfigArgs {
    /// key name
    #[argh(positional)]
    name: String,
    /// the oldest version that may still decrypt or verify
    #[argh(option)]
    min_decryption_version: u32,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Re-encrypt a ciphertext with the key's latest version (the plaintext stays on the server).
#[argh(subcommand, name = "rewrap", help_triggers("-h", "--help"))]
struct RewrapArgs {
    /// key name
    #[argh(positional)]
    name: String,
    /// svc:v<N>:<base64>
    #[argh(positional)]
    ciphertext: String,
}

/// A positional value or the contents of --file, exactly one of them.
fn text_or_file(
    text: Option<String>,
    file: Option<PathBuf>,
    what: &str,
) -> Result<Vec<u8>, CliError> {
    match (text, file) {
        (Some(text), None) => Ok(text.into_bytes()),
        (None, Some(file)) => read_file(&file),
        _ => Err(CliError::usage(format!(
            "give {what} or --file, not both or neither"
        ))),
    }
}

fn print_keys(common: &Common, keys: &[proto::TransitKey]) -> Result<(), CliError> {
    let json = |k: &proto::TransitKey| {
        serde_json::json!({"name": k.name, "type": k.r#type, "latest_version": k.latest_version,
            "min_decryption_version": k.min_decryption_version, "created_at": k.created_at})
    };
    match common.output {
        Output::Json if keys.len() == 1 => print_json(&json(&keys[0])),
        Output::Json => print_json(&keys.iter().map(json).collect::<Vec<_>>()),
        Output::Table => {
            let rows: Vec<Vec<String>> = keys
                .iter()
                .map(|k| {
                    vec![
                        k.name.clone(),
                        k.r#type.clone(),
                        k.latest_version.to_string(),
                        k.min_decryption_version.to_string(),
                        k.created_at.clone(),
                    ]
                })
                .collect();
            print_table(&["NAME", "TYPE", "LATEST", "MIN_DECRYPT", "CREATED"], &rows);
            Ok(())
        }
    }
}

fn print_ciphertext(
    common: &Common,
    field: &str,
    response: proto::TransitResponse,
) -> Result<(), CliError> {
    let text = if field == "signature" {
        response.signature
    } else {
        response.ciphertext
    };
    match common.output {
        Output::Json => {
            print_json(&serde_json::json!({ field: text, "key_version": response.key_version }))
        }
        Output::Table => {
            println!("{text}");
            Ok(())
        }
    }
}

async fn transit(common: Common, args: TransitArgs) -> Result<(), CliError> {
    let mut client = client(&common).await?;
    let key_request = |name: String| proto::TransitKeyRequest {
        name,
        ..Default::default()
    };
    match args.command {
        TransitCommand::CreateKey(a) => {
            let request = proto::TransitKeyRequest {
                name: a.name,
                r#type: a.key_type,
                min_decryption_version: 0,
            };
            let key = client
                .transit_create_key(authorized(&common, request)?)
                .await?
                .into_inner();
            print_keys(&common, &[key])
        }
        TransitCommand::ListKeys(_) => {
            let keys = client
                .transit_list_keys(authorized(&common, proto::Empty {})?)
                .await?
                .into_inner()
                .keys;
            match common.output {
                Output::Json => print_json(
                    &keys
                        .iter()
                        .map(|k| {
                            serde_json::json!({"name": k.name, "type": k.r#type,
                            "latest_version": k.latest_version,
                            "min_decryption_version": k.min_decryption_version,
                            "created_at": k.created_at})
                        })
                        .collect::<Vec<_>>(),
                ),
                Output::Table => print_keys(&common, &keys),
            }
        }
        TransitCommand::Encrypt(a) => {
            let request = proto::TransitRequest {
                name: a.name,
                plaintext: text_or_file(a.plaintext, a.file, "PLAINTEXT")?,
                ..Default::default()
            };
            let response = client
                .transit_encrypt(authorized(&common, request)?)
                .await?
                .into_inner();
            print_ciphertext(&common, "ciphertext", response)
        }
        TransitCommand::Decrypt(a) => {
            let ciphertext = String::from_utf8(text_or_file(a.ciphertext, a.file, "CIPHERTEXT")?)
                .map_err(|_| CliError::usage("the ciphertext is not text"))?;
            let request = proto::TransitRequest {
                name: a.name,
                ciphertext: ciphertext.trim().to_string(),
                ..Default::default()
            };
            let plaintext = client
                .transit_decrypt(authorized(&common, request)?)
                .await?
                .into_inner()
                .plaintext;
            match common.output {
                Output::Json => print_json(&serde_json::json!({
                    "plaintext": base64::engine::general_purpose::STANDARD.encode(&plaintext)
                })),
                Output::Table => write_stdout(&plaintext),
            }
        }
        TransitCommand::Sign(a) => {
            let request = proto::TransitRequest {
                name: a.name,
                data: text_or_file(a.data, a.file, "DATA")?,
                ..Default::default()
            };
            let response = client
                .transit_sign(authorized(&common, request)?)
                .await?
                .into_inner();
            print_ciphertext(&common, "signature", response)
        }
        TransitCommand::Verify(a) => {
            let (data, signature) = match (a.rest.as_slice(), a.file) {
                ([data, signature], None) => (data.clone().into_bytes(), signature.clone()),
                ([signature], Some(file)) => (read_file(&file)?, signature.clone()),
                _ => {
                    return Err(CliError::usage(
                        "give DATA SIGNATURE, or SIGNATURE with --file",
                    ))
                }
            };
            let request = proto::TransitRequest {
                name: a.name,
                data,
                signature,
                ..Default::default()
            };
            let valid = client
                .transit_verify(authorized(&common, request)?)
                .await?
                .into_inner()
                .valid;
            match common.output {
                Output::Json => print_json(&serde_json::json!({ "valid": valid }))?,
                Output::Table if valid => println!("valid"),
                Output::Table => {}
            }
            if valid {
                Ok(())
            } else {
                Err(CliError::failed("signature is not valid"))
            }
        }
        TransitCommand::Rotate(a) => {
            let key = client
                .transit_rotate(authorized(&common, key_request(a.name))?)
                .await?
                .into_inner();
            print_keys(&common, &[key])
        }
        TransitCommand::Config(a) => {
            let request = proto::TransitKeyRequest {
                name: a.name,
                r#type: String::new(),
                min_decryption_version: a.min_decryption_version,
            };
            let key = client
                .transit_config_key(authorized(&common, request)?)
                .await?
                .into_inner();
            print_keys(&common, &[key])
        }
        TransitCommand::Rewrap(a) => {
            let request = proto::TransitRequest {
                name: a.name,
                ciphertext: a.ciphertext,
                ..Default::default()
            };
            let response = client
                .transit_rewrap(authorized(&common, request)?)
                .await?
                .into_inner();
            print_ciphertext(&common, "ciphertext", response)
        }
    }
}

// ---- leases and dynamic credentials ----

#[derive(FromArgs, argh::ArgsInfo)]
/// Leases of dynamic secrets: list, show, renew, revoke. Expired leases are revoked by the
/// server on its own.
#[argh(help_triggers("-h", "--help"))]
struct LeasesArgs {
    #[argh(subcommand)]
    command: LeasesCommand,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum LeasesCommand {
    List(LeaseListArgs),
    Show(LeaseShowArgs),
    Renew(LeaseRenewArgs),
    Revoke(LeaseRevokeArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// List unrevoked leases, optionally under an id prefix.
#[argh(subcommand, name = "list", help_triggers("-h", "--help"))]
struct LeaseListArgs {
    /// lease id prefix, e.g. postgres/creds/
    #[argh(positional)]
    prefix: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Show one lease.
#[argh(subcommand, name = "show", help_triggers("-h", "--help"))]
struct LeaseShowArgs {
    /// lease id
    #[argh(positional)]
    id: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Extend a lease to now + increment, capped by its max TTL.
#[argh(subcommand, name = "renew", help_triggers("-h", "--help"))]
struct LeaseRenewArgs {
    /// lease id
    #[argh(positional)]
    id: String,
    /// e.g. 30m, 1h (default: the backend's default_ttl)
    #[argh(option)]
    increment: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Revoke a lease now (its credentials stop working), or every lease under --prefix.
#[argh(subcommand, name = "revoke", help_triggers("-h", "--help"))]
struct LeaseRevokeArgs {
    /// lease id
    #[argh(positional)]
    id: Option<String>,
    /// revoke every lease whose id starts with this
    #[argh(option)]
    prefix: Option<String>,
}

fn lease_json(lease: &proto::Lease) -> serde_json::Value {
    let data: serde_json::Value =
        serde_json::from_str(&lease.data_json).unwrap_or(serde_json::Value::Null);
    serde_json::json!({"id": lease.id, "path": lease.path, "backend": lease.backend,
        "created_at": lease.created_at, "expires_at": lease.expires_at,
        "max_expires_at": lease.max_expires_at, "renewable": lease.renewable, "data": data,
        "last_error": if lease.last_error.is_empty() { None } else { Some(&lease.last_error) }})
}

fn print_leases(common: &Common, leases: &[proto::Lease], as_list: bool) -> Result<(), CliError> {
    match common.output {
        Output::Json if !as_list && leases.len() == 1 => print_json(&lease_json(&leases[0])),
        Output::Json => print_json(&leases.iter().map(lease_json).collect::<Vec<_>>()),
        Output::Table => {
            let rows: Vec<Vec<String>> = leases
                .iter()
                .map(|l| {
                    vec![
                        l.id.clone(),
                        l.backend.clone(),
                        l.expires_at.clone(),
                        l.max_expires_at.clone(),
                        if l.last_error.is_empty() {
                            "-".into()
                        } else {
                            l.last_error.clone()
                        },
                    ]
                })
                .collect();
            print_table(
                &["ID", "BACKEND", "EXPIRES", "MAX_EXPIRES", "LAST_ERROR"],
                &rows,
            );
            Ok(())
        }
    }
}

async fn leases(common: Common, args: LeasesArgs) -> Result<(), CliError> {
    let mut client = client(&common).await?;
    match args.command {
        LeasesCommand::List(a) => {
            let request = proto::ListLeasesRequest {
                prefix: a.prefix.unwrap_or_default(),
            };
            let leases = client
                .list_leases(authorized(&common, request)?)
                .await?
                .into_inner()
                .leases;
            print_leases(&common, &leases, true)
        }
        LeasesCommand::Show(a) => {
            let request = proto::LeaseRequest {
                id: a.id,
                ..Default::default()
            };
            let lease = client
                .get_lease(authorized(&common, request)?)
                .await?
                .into_inner();
            print_leases(&common, &[lease], false)
        }
        LeasesCommand::Renew(a) => {
            if let Some(increment) = &a.increment {
                if crate::clock::parse_duration(increment).is_none() {
                    return Err(CliError::usage(format!(
                        "--increment '{increment}' is not a duration like 30m or 1h"
                    )));
                }
            }
            let request = proto::LeaseRequest {
                id: a.id,
                increment: a.increment.unwrap_or_default(),
                prefix: String::new(),
            };
            let lease = client
                .renew_lease(authorized(&common, request)?)
                .await?
                .into_inner();
            print_leases(&common, &[lease], false)
        }
        LeasesCommand::Revoke(a) => {
            let request = match (a.id, a.prefix) {
                (Some(id), None) => proto::LeaseRequest {
                    id,
                    ..Default::default()
                },
                (None, Some(prefix)) if !prefix.is_empty() => proto::LeaseRequest {
                    prefix,
                    ..Default::default()
                },
                _ => return Err(CliError::usage("give a lease ID or --prefix P (not both)")),
            };
            let revoked = client
                .revoke_lease(authorized(&common, request)?)
                .await?
                .into_inner()
                .revoked;
            match common.output {
                Output::Json => print_json(&serde_json::json!({ "revoked": revoked })),
                Output::Table => {
                    println!("revoked {revoked} lease(s)");
                    Ok(())
                }
            }
        }
    }
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Create dynamic credentials with a lease. `creds postgres [--ttl D]` makes a PostgreSQL
/// LOGIN role with a random password, valid until the lease expires (server config
/// secrets.postgres: url, default_ttl, max_ttl); revoking or expiry drops the role. The
/// password is shown only here, once.
#[argh(help_triggers("-h", "--help"))]
struct CredsArgs {
    /// backend: postgres
    #[argh(positional, from_str_fn(creds_backend))]
    backend: String,
    /// lease length, e.g. 15m (default: the backend's default_ttl; capped by max_ttl)
    #[argh(option, from_str_fn(duration))]
    ttl: Option<String>,
}

async fn creds(common: Common, args: CredsArgs) -> Result<(), CliError> {
    if let Some(ttl) = &args.ttl {
        if crate::clock::parse_duration(ttl).is_none() {
            return Err(CliError::usage(format!(
                "--ttl '{ttl}' is not a duration like 15m"
            )));
        }
    }
    let request = proto::CredentialsRequest {
        backend: args.backend,
        ttl: args.ttl.unwrap_or_default(),
    };
    let credentials = client(&common)
        .await?
        .create_credentials(authorized(&common, request)?)
        .await?
        .into_inner();
    let lease = credentials.lease.unwrap_or_default();
    match common.output {
        Output::Json => print_json(&serde_json::json!({
            "lease": lease_json(&lease), "username": credentials.username,
            "password": credentials.password,
        })),
        Output::Table => {
            print_table(
                &["KEY", "VALUE"],
                &[
                    vec!["lease_id".into(), lease.id],
                    vec!["expires_at".into(), lease.expires_at],
                    vec!["username".into(), credentials.username],
                    vec!["password".into(), credentials.password],
                ],
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_pairs_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fields.yaml");
        std::fs::write(&file, "user: app\nport: 5432\nnested: {a: 1}\n").unwrap();
        let value_file = dir.path().join("pw");
        std::fs::write(&value_file, "from-file").unwrap();
        let args = PutArgs {
            path: "db".into(),
            pairs: vec![
                "user=override".into(),
                format!("password=@{}", value_file.display()),
            ],
            from_file: Some(file),
        };
        let data = put_data(&args).unwrap();
        assert_eq!(data["user"], "override");
        assert_eq!(data["port"], "5432");
        assert_eq!(data["nested"], r#"{"a":1}"#);
        assert_eq!(data["password"], "from-file");
        let bad = PutArgs {
            path: "db".into(),
            pairs: vec!["novalue".into()],
            from_file: None,
        };
        assert_eq!(put_data(&bad).unwrap_err().code, exit::USAGE);
    }
}
