//! `svc-identity`: ca info|rotate-signing|export|encrypt, status, psk, token
//! create|list|revoke|cleanup (IdentityService).

use std::path::PathBuf;

use argh::FromArgs;

use super::client::{authorized, grpc_channel};
use super::output::{print_json, print_table};
use super::values::duration;
use super::{CliError, Common, Output};
use crate::proto::identity_service_client::IdentityServiceClient;
use crate::proto::{self, JoinToken};

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_partly_built(program, args, run)
}

fn run(program: &str, command: &str, common: Common, args: &[String]) -> i32 {
    let name = format!("{program} {command}");
    match command {
        "ca" => super::run_command::<CaArgs, _>(program, &name, args, common, ca),
        "status" => super::run_command::<StatusArgs, _>(program, &name, args, common, status),
        "psk" => super::run_command::<PskArgs, _>(program, &name, args, common, psk),
        _ => super::run_command::<TokenArgs, _>(program, &name, args, common, token),
    }
}

#[derive(FromArgs)]
/// The embedded CA: show, rotate the signing CA, export the public chain, back up the keys.
#[argh(help_triggers("-h", "--help"))]
struct CaArgs {
    #[argh(subcommand)]
    command: CaCommand,
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum CaCommand {
    Info(CaInfoArgs),
    RotateSigning(RotateArgs),
    Export(ExportArgs),
    Encrypt(EncryptArgs),
}

#[derive(FromArgs)]
/// Root and signing CA: subject, SHA-256 fingerprint, validity.
#[argh(subcommand, name = "info", help_triggers("-h", "--help"))]
struct CaInfoArgs {}

#[derive(FromArgs)]
/// Make a new signing CA under the same root (admin). Agents enrolled under the old one
/// can no longer authenticate and must bootstrap again.
#[argh(subcommand, name = "rotate-signing", help_triggers("-h", "--help"))]
struct RotateArgs {}

#[derive(FromArgs)]
/// Print the public CA chain, signing CA then root, as PEM (admin).
#[argh(subcommand, name = "export", help_triggers("-h", "--help"))]
struct ExportArgs {
    /// write to this file instead of stdout
    #[argh(option)]
    output_file: Option<PathBuf>,
}

#[derive(FromArgs)]
/// Write the CA keys encrypted with a passphrase (PBKDF2-HMAC-SHA256 + AES-256-GCM), for
/// offline keeping (admin).
#[argh(subcommand, name = "encrypt", help_triggers("-h", "--help"))]
struct EncryptArgs {
    /// file holding the passphrase (first line; at least 12 characters); else env
    /// SVC_CA_PASSPHRASE
    #[argh(option)]
    passphrase_file: Option<PathBuf>,
    /// write here (mode 0600) instead of stdout
    #[argh(option)]
    output_file: Option<PathBuf>,
}

#[derive(FromArgs)]
/// Provider health, join token counts by state, and the earliest CA expiry.
#[argh(help_triggers("-h", "--help"))]
struct StatusArgs {}

#[derive(FromArgs)]
/// Print the bootstrap PSK of an agent: hex HMAC-SHA256(hmacsecret, AGENT_ID) (admin).
#[argh(help_triggers("-h", "--help"))]
struct PskArgs {
    /// the agent id
    #[argh(positional)]
    agent_id: String,
}

#[derive(FromArgs)]
/// One-shot join tokens for agent enrolment.
#[argh(help_triggers("-h", "--help"))]
struct TokenArgs {
    #[argh(subcommand)]
    command: TokenCommand,
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum TokenCommand {
    Create(CreateArgs),
    List(ListArgs),
    Revoke(RevokeArgs),
    Cleanup(CleanupArgs),
}

#[derive(FromArgs)]
/// Create a join token (operator); it is shown this once.
#[argh(subcommand, name = "create", help_triggers("-h", "--help"))]
struct CreateArgs {
    /// lifetime (default 24h): 30m, 24h, 7d
    #[argh(option, from_str_fn(duration))]
    ttl: Option<String>,
    /// only this agent id may use the token
    #[argh(option)]
    agent_id: Option<String>,
}

#[derive(FromArgs)]
/// List join tokens (never their values).
#[argh(subcommand, name = "list", help_triggers("-h", "--help"))]
struct ListArgs {
    /// only tokens not used and not revoked
    #[argh(switch)]
    unused: bool,
    /// only tokens not expired
    #[argh(switch)]
    unexpired: bool,
}

#[derive(FromArgs)]
/// Revoke a join token (admin).
#[argh(subcommand, name = "revoke", help_triggers("-h", "--help"))]
struct RevokeArgs {
    /// the token id (from token list)
    #[argh(positional)]
    id: String,
}

#[derive(FromArgs)]
/// Delete revoked and expired join tokens (admin).
#[argh(subcommand, name = "cleanup", help_triggers("-h", "--help"))]
struct CleanupArgs {}

async fn client(
    common: &Common,
) -> Result<IdentityServiceClient<tonic::transport::Channel>, CliError> {
    Ok(IdentityServiceClient::new(grpc_channel(common).await?))
}

fn certificate_json(certificate: &Option<proto::Certificate>) -> serde_json::Value {
    let c = certificate.clone().unwrap_or_default();
    serde_json::json!({
        "subject": c.subject, "fingerprint": c.fingerprint,
        "not_before": c.not_before, "not_after": c.not_after,
    })
}

fn print_ca_info(common: &Common, info: &proto::CaInfoResponse) -> Result<(), CliError> {
    if common.output == Output::Json {
        return print_json(&serde_json::json!({
            "root_ca": certificate_json(&info.root_ca),
            "signing_ca": certificate_json(&info.signing_ca),
        }));
    }
    let rows: Vec<Vec<String>> = [("root", &info.root_ca), ("signing", &info.signing_ca)]
        .into_iter()
        .map(|(name, certificate)| {
            let c = certificate.clone().unwrap_or_default();
            vec![
                name.to_string(),
                c.subject,
                c.fingerprint,
                c.not_before,
                c.not_after,
            ]
        })
        .collect();
    print_table(
        &["CA", "SUBJECT", "FINGERPRINT", "NOT_BEFORE", "NOT_AFTER"],
        &rows,
    );
    Ok(())
}

/// Writes `data` to `path` (mode 0600) or stdout.
fn write_output(path: &Option<PathBuf>, data: &[u8]) -> Result<(), CliError> {
    use std::io::Write;
    match path {
        Some(path) => crate::auth::write_private_file(path, data)
            .map_err(|e| CliError::failed(format!("cannot write {}: {e}", path.display()))),
        None => std::io::stdout()
            .write_all(data)
            .map_err(|e| CliError::failed(format!("cannot write to stdout: {e}"))),
    }
}

async fn ca(common: Common, args: CaArgs) -> Result<(), CliError> {
    let mut client = client(&common).await?;
    match args.command {
        CaCommand::Info(_) => {
            let info = client
                .ca_info(authorized(&common, proto::Empty {})?)
                .await?
                .into_inner();
            print_ca_info(&common, &info)
        }
        CaCommand::RotateSigning(_) => {
            let info = client
                .rotate_signing(authorized(&common, proto::Empty {})?)
                .await?
                .into_inner();
            print_ca_info(&common, &info)
        }
        CaCommand::Export(export) => {
            let pem = client
                .export_ca(authorized(&common, proto::Empty {})?)
                .await?
                .into_inner()
                .pem;
            if common.output == Output::Json && export.output_file.is_none() {
                return print_json(&serde_json::json!({ "pem": pem }));
            }
            write_output(&export.output_file, pem.as_bytes())
        }
        CaCommand::Encrypt(encrypt) => {
            let passphrase = match &encrypt.passphrase_file {
                Some(path) => std::fs::read_to_string(path)
                    .map_err(|e| CliError::usage(format!("cannot read {}: {e}", path.display())))?
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string(),
                None => std::env::var("SVC_CA_PASSPHRASE").map_err(|_| {
                    CliError::usage("give --passphrase-file FILE or set SVC_CA_PASSPHRASE")
                })?,
            };
            let data = client
                .encrypt_ca(authorized(&common, proto::EncryptCaRequest { passphrase })?)
                .await?
                .into_inner()
                .data;
            write_output(&encrypt.output_file, &data)?;
            if let Some(path) = &encrypt.output_file {
                eprintln!("wrote the encrypted CA keys to {}", path.display());
            }
            Ok(())
        }
    }
}

async fn status(common: Common, _: StatusArgs) -> Result<(), CliError> {
    let status = client(&common)
        .await?
        .status(authorized(&common, proto::Empty {})?)
        .await?
        .into_inner();
    if common.output == Output::Json {
        return print_json(&serde_json::json!({
            "provider": status.provider, "health": status.health, "detail": status.detail,
            "tokens": {
                "unused": status.tokens_unused, "used": status.tokens_used,
                "revoked": status.tokens_revoked, "expired": status.tokens_expired,
            },
            "ca_not_after": status.ca_not_after,
        }));
    }
    let mut rows = vec![
        vec!["provider".into(), status.provider],
        vec!["health".into(), status.health],
    ];
    if !status.detail.is_empty() {
        rows.push(vec!["detail".into(), status.detail]);
    }
    rows.extend([
        vec!["tokens unused".into(), status.tokens_unused.to_string()],
        vec!["tokens used".into(), status.tokens_used.to_string()],
        vec!["tokens revoked".into(), status.tokens_revoked.to_string()],
        vec!["tokens expired".into(), status.tokens_expired.to_string()],
        vec!["ca not after".into(), status.ca_not_after],
    ]);
    print_table(&["FIELD", "VALUE"], &rows);
    Ok(())
}

async fn psk(common: Common, args: PskArgs) -> Result<(), CliError> {
    let psk = client(&common)
        .await?
        .psk(authorized(
            &common,
            proto::PskRequest {
                agent_id: args.agent_id.clone(),
            },
        )?)
        .await?
        .into_inner()
        .psk;
    if common.output == Output::Json {
        return print_json(&serde_json::json!({"agent_id": args.agent_id, "psk": psk}));
    }
    println!("{psk}");
    Ok(())
}

fn optional(text: &str) -> serde_json::Value {
    if text.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::json!(text)
    }
}

fn token_json(token: &JoinToken) -> serde_json::Value {
    let mut value = serde_json::json!({
        "id": token.id, "state": token.state, "agent_id": optional(&token.agent_id),
        "created_by": token.created_by, "created_at": token.created_at,
        "expires_at": token.expires_at, "used_at": optional(&token.used_at),
        "used_by": optional(&token.used_by), "revoked_at": optional(&token.revoked_at),
    });
    if !token.token.is_empty() {
        value["token"] = serde_json::json!(token.token);
    }
    value
}

const TOKEN_HEADERS: &[&str] = &["ID", "STATE", "AGENT_ID", "EXPIRES_AT", "USED_BY"];

fn token_row(token: &JoinToken) -> Vec<String> {
    vec![
        token.id.clone(),
        token.state.clone(),
        token.agent_id.clone(),
        token.expires_at.clone(),
        token.used_by.clone(),
    ]
}

async fn token(common: Common, args: TokenArgs) -> Result<(), CliError> {
    let mut client = client(&common).await?;
    match args.command {
        TokenCommand::Create(create) => {
            let request = proto::CreateTokenRequest {
                ttl: create.ttl.unwrap_or_default(),
                agent_id: create.agent_id.unwrap_or_default(),
            };
            let token = client
                .create_token(authorized(&common, request)?)
                .await?
                .into_inner();
            if common.output == Output::Json {
                return print_json(&token_json(&token));
            }
            print_table(TOKEN_HEADERS, &[token_row(&token)]);
            println!(
                "\ntoken: {}\n(shown once; it is stored only as a hash)",
                token.token
            );
            Ok(())
        }
        TokenCommand::List(list) => {
            let request = proto::ListTokensRequest {
                unused: list.unused,
                unexpired: list.unexpired,
            };
            let tokens = client
                .list_tokens(authorized(&common, request)?)
                .await?
                .into_inner()
                .tokens;
            if common.output == Output::Json {
                return print_json(&tokens.iter().map(token_json).collect::<Vec<_>>());
            }
            print_table(
                TOKEN_HEADERS,
                &tokens.iter().map(token_row).collect::<Vec<_>>(),
            );
            Ok(())
        }
        TokenCommand::Revoke(revoke) => {
            let token = client
                .revoke_token(authorized(
                    &common,
                    proto::RevokeTokenRequest { id: revoke.id },
                )?)
                .await?
                .into_inner();
            if common.output == Output::Json {
                return print_json(&token_json(&token));
            }
            print_table(TOKEN_HEADERS, &[token_row(&token)]);
            Ok(())
        }
        TokenCommand::Cleanup(_) => {
            let removed = client
                .cleanup_tokens(authorized(&common, proto::Empty {})?)
                .await?
                .into_inner()
                .removed;
            if common.output == Output::Json {
                return print_json(&serde_json::json!({ "removed": removed }));
            }
            println!("removed {removed} revoked or expired join tokens");
            Ok(())
        }
    }
}
