//! `svc-identity`: ca info|rotate-signing|export|encrypt, command-key info|rotate|retire,
//! status, psk, token
//! create|list|revoke|cleanup, jwt issue|list|revoke|verify (IdentityService; `jwt verify`
//! also offline, from a JWKS file or `ca export` PEM).

use std::path::PathBuf;

use argh::FromArgs;

use super::client::{authorized, grpc_channel};
use super::output::{print_json, print_table};
use super::values::duration;
use super::{CliError, Common, Output};
use crate::identity::jwt::{self, KeySet};
use crate::proto::identity_service_client::IdentityServiceClient;
use crate::proto::{self, JoinToken, JwtSvid};

pub fn main(program: &str, args: Vec<String>) -> i32 {
    super::run_table(program, args)
}

/// svc-identity's commands, in help order: the one place each is named, read by running it and by
/// help, completions and man pages (`cli::args_info`).
pub const COMMANDS: &[super::Command] = &[
    command!("ca", CaArgs, ca),
    command!("command-key", CommandKeyArgs, command_key),
    command!("status", StatusArgs, status),
    command!("psk", PskArgs, psk),
    command!("token", TokenArgs, token),
    command!("jwt", JwtArgs, jwt_command),
];

#[derive(FromArgs, argh::ArgsInfo)]
/// The embedded CA: show, rotate the signing CA, export the public chain, back up the keys.
#[argh(help_triggers("-h", "--help"))]
struct CaArgs {
    #[argh(subcommand)]
    command: CaCommand,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum CaCommand {
    Info(CaInfoArgs),
    RotateSigning(RotateArgs),
    Export(ExportArgs),
    Encrypt(EncryptArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Root and signing CA: subject, SHA-256 fingerprint, validity.
#[argh(subcommand, name = "info", help_triggers("-h", "--help"))]
struct CaInfoArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// Make a new signing CA under the same root (admin). Agents enrolled under the old one
/// can no longer authenticate and must bootstrap again. On a cluster with
/// bus.external_auth: jwt, also makes the next NATS account signing key (docs/cluster.md).
#[argh(subcommand, name = "rotate-signing", help_triggers("-h", "--help"))]
struct RotateArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// The key the server signs agents' commands with. `rotate` makes a new one (issued by the
/// root CA) and tells the connected agents, in a notice signed with the old key; the old key
/// stays accepted for agents.command_key_grace (default 7d), then the server retires it, or
/// `retire` does it now. Agents away during a rotation learn it when they reconnect, within
/// the grace; after it they must bootstrap again.
#[argh(help_triggers("-h", "--help"))]
struct CommandKeyArgs {
    #[argh(subcommand)]
    command: CommandKeyCommand,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum CommandKeyCommand {
    Info(CommandKeyInfoArgs),
    Rotate(CommandKeyRotateArgs),
    Retire(CommandKeyRetireArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// The command-signing keys in force: the current one and, during a rotation's grace, the
/// previous one and when it is retired.
#[argh(subcommand, name = "info", help_triggers("-h", "--help"))]
struct CommandKeyInfoArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// Make a new command-signing key and send the connected agents its certificate (admin).
/// Refused while a previous key is still in its grace: retire it first.
#[argh(subcommand, name = "rotate", help_triggers("-h", "--help"))]
struct CommandKeyRotateArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// Retire the previous command-signing key now, before its grace ends (admin): agents
/// told so refuse commands signed with it. After a key leak, rotate then retire at once.
#[argh(subcommand, name = "retire", help_triggers("-h", "--help"))]
struct CommandKeyRetireArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// Print the public certificates as PEM (admin): signing CA, root, then the command-signing
/// certificates in force (current first).
#[argh(subcommand, name = "export", help_triggers("-h", "--help"))]
struct ExportArgs {
    /// write to this file instead of stdout
    #[argh(option)]
    output_file: Option<PathBuf>,
}

#[derive(FromArgs, argh::ArgsInfo)]
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

#[derive(FromArgs, argh::ArgsInfo)]
/// Provider health, join token counts by state, and the earliest CA expiry.
#[argh(help_triggers("-h", "--help"))]
struct StatusArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// Print the bootstrap PSK of an agent: hex HMAC-SHA256(hmacsecret, AGENT_ID) (admin).
#[argh(help_triggers("-h", "--help"))]
struct PskArgs {
    /// the agent id
    #[argh(positional)]
    agent_id: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// One-shot join tokens for agent enrolment.
#[argh(help_triggers("-h", "--help"))]
struct TokenArgs {
    #[argh(subcommand)]
    command: TokenCommand,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum TokenCommand {
    Create(CreateArgs),
    List(ListArgs),
    Revoke(RevokeArgs),
    Cleanup(CleanupArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
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

#[derive(FromArgs, argh::ArgsInfo)]
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

#[derive(FromArgs, argh::ArgsInfo)]
/// Revoke a join token (admin).
#[argh(subcommand, name = "revoke", help_triggers("-h", "--help"))]
struct RevokeArgs {
    /// the token id (from token list)
    #[argh(positional)]
    id: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
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
    print_certificates(
        "CA",
        &[("root", &info.root_ca), ("signing", &info.signing_ca)],
    );
    Ok(())
}

fn print_certificates(first: &str, certificates: &[(&str, &Option<proto::Certificate>)]) {
    let rows: Vec<Vec<String>> = certificates
        .iter()
        .filter_map(|(name, certificate)| Some((name, (*certificate).clone()?)))
        .map(|(name, c)| {
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
        &[first, "SUBJECT", "FINGERPRINT", "NOT_BEFORE", "NOT_AFTER"],
        &rows,
    );
}

async fn command_key(common: Common, args: CommandKeyArgs) -> Result<(), CliError> {
    let mut client = client(&common).await?;
    let request = authorized(&common, proto::Empty {})?;
    let info = match args.command {
        CommandKeyCommand::Info(_) => client.command_key_info(request).await?,
        CommandKeyCommand::Rotate(_) => client.rotate_command_key(request).await?,
        CommandKeyCommand::Retire(_) => client.retire_command_key(request).await?,
    }
    .into_inner();
    if common.output == Output::Json {
        let mut json = serde_json::json!({"current": certificate_json(&info.current)});
        if info.previous.is_some() {
            json["previous"] = certificate_json(&info.previous);
            json["retire_after"] = info.retire_after.clone().into();
        }
        if let Some(d) = &info.agents {
            json["agents"] = serde_json::json!({
                "updated": d.updated, "refused": d.refused,
                "no_answer": d.no_answer, "unreachable": d.unreachable,
            });
        }
        return print_json(&json);
    }
    print_certificates(
        "KEY",
        &[("current", &info.current), ("previous", &info.previous)],
    );
    if !info.retire_after.is_empty() {
        println!("\nthe previous key is accepted until {}", info.retire_after);
    }
    if let Some(d) = &info.agents {
        println!(
            "connected agents told: {} updated, {} refused, {} no answer, {} unreachable",
            d.updated, d.refused, d.no_answer, d.unreachable
        );
    }
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

#[derive(FromArgs, argh::ArgsInfo)]
/// Identity tokens: SPIFFE JWT-SVIDs (ES256) signed by the signing CA's key. Their public
/// keys are at /.well-known/jwks.json, revoked ids at /.well-known/jwt-revocations.json
/// (REST, no API key needed); see docs/identity.md.
#[argh(help_triggers("-h", "--help"))]
struct JwtArgs {
    #[argh(subcommand)]
    command: JwtCommand,
}

#[derive(FromArgs, argh::ArgsInfo)]
#[argh(subcommand)]
enum JwtCommand {
    Issue(JwtIssueArgs),
    List(JwtListArgs),
    Revoke(JwtRevokeArgs),
    Verify(JwtVerifyArgs),
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Issue a JWT-SVID (admin) and print it (-o json: id, subject, audience, expires_at, token).
/// The token is shown this once; only its claims are stored.
#[argh(subcommand, name = "issue", help_triggers("-h", "--help"))]
struct JwtIssueArgs {
    /// audience (repeat for several); required
    #[argh(option)]
    audience: Vec<String>,
    /// lifetime (default 1h, at most 24h): 30s, 15m, 1h
    #[argh(option)]
    ttl: Option<String>,
    /// SPIFFE ID under spiffe://svc/ (default spiffe://svc/apikey/<your key id>)
    #[argh(option)]
    subject: Option<String>,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// List JWT-SVIDs not expired yet (admin); STATE is active, revoked, or rotated (signed by a
/// signing CA since rotated out, so no longer verifiable).
#[argh(subcommand, name = "list", help_triggers("-h", "--help"))]
struct JwtListArgs {}

#[derive(FromArgs, argh::ArgsInfo)]
/// Revoke a JWT-SVID by its id (its jti, from issue or list) (admin). The server's own check
/// refuses it at once; offline verifiers see it in /.well-known/jwt-revocations.json.
#[argh(subcommand, name = "revoke", help_triggers("-h", "--help"))]
struct JwtRevokeArgs {
    /// the token id (jti)
    #[argh(positional)]
    id: String,
}

#[derive(FromArgs, argh::ArgsInfo)]
/// Verify a JWT-SVID: exit 0 and print its claims when valid, exit 1 with the reason
/// (expired, wrong audience, bad signature, unknown kid, revoked) when not. Offline with
/// --jwks FILE (saved /.well-known/jwks.json) or --ca-file FILE (`ca export` PEM); add
/// --revocations FILE (saved /.well-known/jwt-revocations.json) to check revocation offline.
/// Without either key source (or with --online) the server checks it, revocation included
/// (any role).
#[argh(subcommand, name = "verify", help_triggers("-h", "--help"))]
struct JwtVerifyArgs {
    /// the token, or - to read it from stdin
    #[argh(positional)]
    token: String,
    /// the audience this verifier is (must be in the token's aud)
    #[argh(option)]
    audience: String,
    /// a JWKS file to take the keys from
    #[argh(option)]
    jwks: Option<PathBuf>,
    /// a revocation list file (offline only)
    #[argh(option)]
    revocations: Option<PathBuf>,
    /// ask the server even when --ca-file is set (--ca-file then only trusts its TLS)
    #[argh(switch)]
    online: bool,
}

fn jwt_json(svid: &JwtSvid) -> serde_json::Value {
    let mut value = serde_json::json!({
        "id": svid.id, "subject": svid.subject, "audience": svid.audience,
        "state": svid.state, "kid": svid.kid, "issued_by": svid.issued_by,
        "issued_at": svid.issued_at, "expires_at": svid.expires_at,
        "revoked_at": optional(&svid.revoked_at),
    });
    if !svid.token.is_empty() {
        value["token"] = serde_json::json!(svid.token);
    }
    value
}

const JWT_HEADERS: &[&str] = &["ID", "STATE", "SUBJECT", "AUDIENCE", "EXPIRES_AT"];

fn jwt_row(svid: &JwtSvid) -> Vec<String> {
    vec![
        svid.id.clone(),
        svid.state.clone(),
        svid.subject.clone(),
        svid.audience.join(","),
        svid.expires_at.clone(),
    ]
}

fn read_file(path: &PathBuf, what: &str) -> Result<String, CliError> {
    std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("cannot read {what} {}: {e}", path.display())))
}

async fn jwt_command(common: Common, args: JwtArgs) -> Result<(), CliError> {
    match args.command {
        JwtCommand::Issue(issue) => {
            if issue.audience.is_empty() {
                return Err(CliError::usage("--audience is required"));
            }
            if let Some(ttl) = &issue.ttl {
                if crate::clock::parse_duration(ttl).is_none() {
                    return Err(CliError::usage(format!(
                        "invalid --ttl '{ttl}' (e.g. 30s, 15m, 1h)"
                    )));
                }
            }
            let request = proto::IssueJwtRequest {
                audience: issue.audience,
                ttl: issue.ttl.unwrap_or_default(),
                subject: issue.subject.unwrap_or_default(),
            };
            let svid = client(&common)
                .await?
                .issue_jwt(authorized(&common, request)?)
                .await?
                .into_inner();
            if common.output == Output::Json {
                return print_json(&serde_json::json!({
                    "id": svid.id, "subject": svid.subject, "audience": svid.audience,
                    "expires_at": svid.expires_at, "token": svid.token,
                }));
            }
            println!("{}", svid.token);
            Ok(())
        }
        JwtCommand::List(_) => {
            let jwts = client(&common)
                .await?
                .list_jwts(authorized(&common, proto::Empty {})?)
                .await?
                .into_inner()
                .jwts;
            if common.output == Output::Json {
                return print_json(&jwts.iter().map(jwt_json).collect::<Vec<_>>());
            }
            print_table(JWT_HEADERS, &jwts.iter().map(jwt_row).collect::<Vec<_>>());
            Ok(())
        }
        JwtCommand::Revoke(revoke) => {
            let svid = client(&common)
                .await?
                .revoke_jwt(authorized(
                    &common,
                    proto::RevokeJwtRequest { id: revoke.id },
                )?)
                .await?
                .into_inner();
            if common.output == Output::Json {
                return print_json(&jwt_json(&svid));
            }
            print_table(JWT_HEADERS, &[jwt_row(&svid)]);
            Ok(())
        }
        JwtCommand::Verify(verify) => jwt_verify(common, verify).await,
    }
}

async fn jwt_verify(common: Common, args: JwtVerifyArgs) -> Result<(), CliError> {
    let token = if args.token == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| CliError::usage(format!("cannot read the token from stdin: {e}")))?;
        text.trim().to_string()
    } else {
        args.token.trim().to_string()
    };
    let offline_keys = match (&args.jwks, &common.ca_file) {
        (Some(path), _) => {
            let jwks: jwt::Jwks = serde_json::from_str(&read_file(path, "JWKS")?)
                .map_err(|e| CliError::usage(format!("{}: not a JWKS: {e}", path.display())))?;
            Some(KeySet::from_jwks(&jwks))
        }
        (None, Some(path)) if !args.online => Some(
            KeySet::from_pem_certificates(&read_file(path, "CA file")?)
                .map_err(|e| CliError::usage(format!("{}: {e}", path.display())))?,
        ),
        _ => None,
    };
    let checked = match offline_keys {
        Some(keys) => {
            let revoked =
                match &args.revocations {
                    Some(path) => serde_json::from_str::<jwt::Revocations>(&read_file(
                        path,
                        "revocation list",
                    )?)
                    .map_err(|e| {
                        CliError::usage(format!("{}: not a revocation list: {e}", path.display()))
                    })?
                    .by_id(),
                    None => Default::default(),
                };
            let now = crate::clock::now_millis() / 1000;
            jwt::verify_token(&token, &keys, &args.audience, &revoked, now)
        }
        None => {
            if args.revocations.is_some() {
                return Err(CliError::usage(
                    "--revocations is for offline checks (with --jwks or --ca-file); the \
                     server checks revocation itself",
                ));
            }
            let request = proto::VerifyJwtRequest {
                token,
                audience: args.audience.clone(),
            };
            let answer = client(&common)
                .await?
                .verify_jwt(authorized(&common, request)?)
                .await?
                .into_inner();
            if answer.valid {
                Ok(jwt::Claims {
                    sub: answer.subject,
                    aud: answer.audience,
                    exp: answer.exp,
                    iat: (answer.iat != 0).then_some(answer.iat),
                    jti: answer.jti,
                })
            } else {
                Err(answer.reason)
            }
        }
    };
    match checked {
        Ok(claims) => {
            if common.output == Output::Json {
                return print_json(&serde_json::json!({"valid": true, "claims": claims}));
            }
            let time = |seconds: i64| crate::clock::format_rfc3339(seconds * 1000);
            let mut rows = vec![
                vec!["sub".into(), claims.sub.clone()],
                vec!["aud".into(), claims.aud.join(",")],
                vec![
                    "exp".into(),
                    format!("{} ({})", claims.exp, time(claims.exp)),
                ],
            ];
            if let Some(iat) = claims.iat {
                rows.push(vec!["iat".into(), format!("{iat} ({})", time(iat))]);
            }
            rows.push(vec!["jti".into(), claims.jti.clone()]);
            print_table(&["CLAIM", "VALUE"], &rows);
            Ok(())
        }
        Err(reason) => {
            if common.output == Output::Json {
                print_json(&serde_json::json!({"valid": false, "reason": reason}))?;
            }
            Err(CliError::failed(format!("invalid token: {reason}")))
        }
    }
}
